#include "qvg/config.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "qvg/code_format.h"
#include "qvg/error.h"
#include "qvg/settings.h"

namespace qvg {

int max_threads() { return std::max(16, 4 * omp_get_num_procs()); }

void check_threads(std::string_view what, int64_t threads) {
  if (threads < 0 || threads > max_threads())
    throw InvalidArgument(fmt::format("{} must be in 0..{} (0 = all cores; at most 4 x the {} processors, and at "
                                      "least 16, are accepted), got {}",
                                      what, max_threads(), omp_get_num_procs(), threads));
}

int resolve_threads(int threads) { return threads > 0 ? threads : std::min(omp_get_max_threads(), max_threads()); }

namespace {

const CodeFormat& check_bits(int bits) {
  const CodeFormat* f = find_code_format(bits);
  if (!f)
    throw InvalidArgument(
        fmt::format("bits must be {} (or none to disable quantization), got {}", known_code_widths(), bits));
  return *f;
}

// The codec fields of spec 2 that do not depend on bits (checked with quantization
// off too, so that a bad flag never waits silently for the day it is switched on).
void check_sizes(int centroids, int block_size, int stages, int iters) {
  if (centroids <= 0 || centroids > 256)
    throw InvalidArgument(fmt::format("centroids must be in 1..256, got {}", centroids));
  if (block_size <= 0) throw InvalidArgument(fmt::format("block_size must be > 0, got {}", block_size));
  if (stages <= 0 || stages > kMaxStages)
    throw InvalidArgument(fmt::format("stages must be in 1..{}, got {}", kMaxStages, stages));
  if (iters <= 0) throw InvalidArgument(fmt::format("kmeans_iters must be > 0, got {}", iters));
}

// Shared by CodecConfig and QuantArgs: the codec fields of spec 2.
void check_codec_fields(int bits, int centroids, int block_size, int stages, int iters) {
  const CodeFormat& f = check_bits(bits);
  check_sizes(centroids, block_size, stages, iters);
  if (block_size % f.group_codes != 0)
    throw InvalidArgument(fmt::format(
        "block_size must be a multiple of {} (the {}-bit code group, so codes fill whole bytes) at bits={}, got {}",
        f.group_codes, bits, bits, block_size));
}

void check_head_dim(int block_size, int64_t head_dim) {
  if (head_dim <= 0) throw InvalidArgument(fmt::format("head_dim must be > 0, got {}", head_dim));
  if (head_dim % block_size != 0)
    throw InvalidArgument(
        fmt::format("block_size must divide head_dim ({}), got block_size={}", head_dim, block_size));
}

// Levenshtein distance between a and b (the flags are short: O(|a| |b|) is nothing).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The known engine flag nearest to `key`: an unknown flag's error names it, so that a
// misspelt setting is refused, never silently ignored.
std::string nearest_flag(std::string_view key) {
  std::string best = "kv_cache_quant_profile";
  size_t best_d = edit_distance(key, best);
  for (const Setting& s : quant_settings()) {
    if (s.flag.empty()) continue;
    std::string flag = "kv_cache_quant" + std::string(s.flag);
    const size_t d = edit_distance(key, flag);
    if (d < best_d) best_d = d, best = std::move(flag);
  }
  return best;
}

// The per-role fields as k_config and the role flags name them: "bits, centroids, ...".
std::string role_fields() {
  std::string o;
  for (const Setting& s : role_settings(CacheRole::Key))
    o += fmt::format("{}{}", o.empty() ? "" : ", ", s.flag.substr(3));  // "_k_iters" -> "iters"
  return o;
}

// The engine flags from_flags reads, for its message on an unknown one.
std::string accepted_flags() {
  std::string o = "kv_cache_quant";
  for (const Setting& s : quant_settings())
    if (!s.role && !s.flag.empty()) o += fmt::format(", {}{}", o == "kv_cache_quant" ? "kv_cache_quant" : "", s.flag);
  return o + fmt::format(", _profile, and per role _k_<f> / _v_<f> for f in {}", role_fields());
}

}  // namespace

void CodecConfig::validate() const {
  check_codec_fields(bits, centroids, block_size, stages, kmeans_iters);
  check_threads("threads", threads);
  if (head_offset < 0 || head_offset > (int64_t(1) << 40))
    throw InvalidArgument(fmt::format("head_offset must be in [0, 2^40], got {}", head_offset));
}

void CodecConfig::validate_for_head_dim(int64_t head_dim) const {
  validate();
  check_head_dim(block_size, head_dim);
}

std::string CodecConfig::describe() const {
  return fmt::format(
             "bits={} centroids={} stages={} kmeans_iters={} block_size={} asymmetric={} scale_dtype={} scaling={} "
             "init={} seed={}",
             bits, centroids, stages, kmeans_iters, block_size, asymmetric, name(scale_dtype), name(scaling),
             name(init), seed) +
         (scale_search == ScaleSearch::Off ? std::string() : fmt::format(" scale_search={}", name(scale_search)));
}

CodecConfig RoleCodec::over(CodecConfig shared) const {
  for (const Setting& s : role_settings(CacheRole::Key))
    if (overridden & field_bit(s.field)) copy_codec_field(s, values, shared);
  return shared;
}

bool RoleCodec::operator==(const RoleCodec& o) const {
  if (overridden != o.overridden) return false;
  for (const Setting& s : role_settings(CacheRole::Key))
    if ((overridden & field_bit(s.field)) && get_codec_field(s, values) != get_codec_field(s, o.values)) return false;
  return true;
}

std::string RoleCodec::describe(std::string_view p) const {
  // The role's rows of the settings table ("k_bits=4 k_asymmetric=true").
  std::string out;
  for (const Setting& s : role_settings(CacheRole::Key)) {
    if (!(overridden & field_bit(s.field))) continue;
    out +=
        fmt::format("{}{}{}={}", out.empty() ? "" : " ", p, s.name.substr(2), setting_text(get_codec_field(s, values)));
  }
  return out;
}

void QuantArgs::validate() const {
  // Each shared setting's own range: the settings table (one rule, one message per
  // field, the same the CLI and the binding use); then the rules across fields.
  for (const Setting& s : quant_settings())
    if (!s.role) check_setting(s, s.get(*this), s.name);
  if (quantize) check_codec_fields(codec.bits, codec.centroids, codec.block_size, codec.stages, codec.kmeans_iters);
  // Per-role overrides: each role's merged fields, the message naming the role's key.
  for (const CacheRole role : {CacheRole::Key, CacheRole::Value}) {
    const RoleCodec& r = role == CacheRole::Key ? k : v;
    if (r.empty()) continue;
    try {
      const CodecConfig c = r.over(codec);
      if (quantize || r.has(&CodecConfig::bits))
        check_codec_fields(c.bits, c.centroids, c.block_size, c.stages, c.kmeans_iters);
      else
        check_sizes(c.centroids, c.block_size, c.stages, c.kmeans_iters);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("{} settings ({}): {}", role == CacheRole::Key ? "K" : "V",
                                        r.describe(role == CacheRole::Key ? "k_" : "v_"), e.what()));
    }
  }
  check_policy_settings(*this);
  check_threads("threads", codec.threads);
}

void QuantArgs::validate_for_head_dim(int64_t head_dim) const {
  validate();
  if (quantize) {
    check_head_dim(codec.block_size, head_dim);
    for (const RoleCodec* r : {&k, &v})
      if (r->has(&CodecConfig::block_size)) check_head_dim(r->values.block_size, head_dim);
  }
}

std::string QuantArgs::describe() const {
  if (!quantize) return "kv_cache_quant=off";
  // The settings of format 1.0 always, later ones and per-role overrides when set.
  std::string out = fmt::format("kv_cache_quant=int{}", codec.bits);
  for (const Setting& s : quant_settings()) {
    if (s.kind == SettingKind::Bits) continue;
    const SettingValue x = s.get(*this);
    if (s.role ? std::holds_alternative<std::monostate>(x) : s.snapshot_minor > 0 && is_default(s, *this)) continue;
    out += fmt::format(" {}={}", s.name, setting_text(x));
  }
  return out;
}

CodecConfig QuantArgs::codec_for(CacheRole role) const {
  return (role == CacheRole::Key ? k : v).over(codec);
}

void QuantArgs::apply_profile(std::string_view profile) {
  // An unknown name leaves the settings unchanged.
  if (profile != "reference" && profile != "hq" && profile != "recommended")
    throw InvalidArgument(fmt::format("profile must be one of reference, hq, recommended, got '{}'", profile));
  // Every profile starts from the engine's defaults of every codec setting (spec 2)
  // but the width and the seed, with the reference's `compat` scaling (the QVG Triton
  // layout); no per-role override.
  for (const Setting& s : quant_settings())
    if (s.codec_row() && !s.role && s.kind != SettingKind::Bits && s.kind != SettingKind::Seed)
      copy_codec_field(s, CodecConfig{}, codec);
  if (!quantize) enable(2);
  k = RoleCodec{};
  v = RoleCodec{};
  if (profile == "reference") {
    codec.scaling = Scaling::Compat;
    codec.scale_search = ScaleSearch::Off;
  } else if (profile == "hq") {
    // Chosen from the rate-distortion frontier of docs/quality.md.
    codec.scaling = Scaling::TwoLevel;
    codec.scale_search = ScaleSearch::Mse;
    codec.asymmetric = true;
  } else {  // "recommended"
    // hq's codec (more k-means) in a cache policy, chosen from `qvg simulate` on the four
    // presets against the engine's default (docs/quality.md, "The recommended profile"). Random
    // seeds, not kmeans++: kmeans++ measured 0.39x against random's 0.40x of the engine's error on
    // self-forcing, and its seeding is k - 1 rounds over a group's points, each waiting for the
    // last (on the device an estimated ~2-2.5 ms per stage at self-forcing's chunk,
    // src/kernels/cuda/kmeanspp_kernels.cu), for ~1 % less error.
    //
    // For the time per step (docs/simulate.md): 2 k-means iterations (the default) and V's
    // scale search off.
    // On `qvg simulate --model self-forcing-1.3b --chunks 14 --layers 1 --engine-baseline`
    // the search cost ~3.7 ms per role and chunk when this was chosen (~1.4 ms on K since
    // its errors run in lanes over tiles of blocks) and 8 iterations ~4.5 ms more than 2;
    // time per step 2.1x the engine default's -> 1.30x (1.31x with the later search and
    // view buffer; 1.02x / 1.10x / 1.09x on the main job's medians after the encode's
    // scalar loops went SIMD, docs/quality.md), attention error (scale 0.25, 40 chunks, 2 layers)
    // 0.40/0.42/0.44x -> 0.38/0.45/0.46x on self-forcing, lingbot-world, hy-worldplay,
    // peaks unchanged.
    codec.scaling = Scaling::TwoLevel;
    codec.scale_search = ScaleSearch::Mse;
    codec.asymmetric = true;
    v.set(&CodecConfig::scale_search, ScaleSearch::Off);
    set_recommended_policy(*this);
  }
}

RoleCodec parse_role_codec(std::string_view spec, std::string_view what) {
  // "field=value,..." with the fields as the per-role flag suffixes; each value read
  // by the settings table's one parser. Empty items (a leading, trailing or double
  // comma) and a field given twice are refused, on every surface alike.
  QuantArgs q;
  std::vector<std::string> seen;
  const std::string sp(spec);
  if (sp.empty()) return {};
  size_t i = 0;
  while (true) {
    size_t j = sp.find(',', i);
    if (j == std::string::npos) j = sp.size();
    const std::string item = sp.substr(i, j - i);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InvalidArgument(
          fmt::format("{} must be a list of field=value separated by commas (no empty items), got '{}'", what, sp));
    const std::string field = item.substr(0, eq), value = item.substr(eq + 1);
    const Setting* s = find_setting_by_flag("_k_" + field);
    if (!s) throw InvalidArgument(fmt::format("{}: unknown field '{}'; accepted: {}", what, field, role_fields()));
    if (std::find(seen.begin(), seen.end(), field) != seen.end())
      throw InvalidArgument(fmt::format("{}: field '{}' is given twice, got '{}'", what, field, sp));
    seen.push_back(field);
    s->set(q, parse_setting(*s, value, fmt::format("{} field '{}'", what, field)));
    if (j == sp.size()) break;
    i = j + 1;
  }
  return q.k;
}

QuantArgs QuantArgs::from_flags(const std::map<std::string, std::string>& flags) {
  QuantArgs a;
  auto it = flags.find("kv_cache_quant");
  // Spec 2 (and the engine): without kv_cache_quant everything is default (off);
  // sub-flags are then not read.
  if (it == flags.end()) return a;
  {
    // off (and the engine's spellings of it) or a width's mode: int2, int4, qvg's int3
    // (qvg/code_format.h).
    const std::string& m = it->second;
    const CodeFormat* mode = nullptr;
    for (const CodeFormat& f : kCodeFormats)
      if (m == f.mode) mode = &f;
    if (mode != nullptr)
      a.enable(mode->bits);
    else if (m != "off" && m != "none" && m != "bf16" && m != "None")
      throw InvalidArgument(
          fmt::format("kv_cache_quant must be one of off, none, bf16, {}, got '{}'", known_code_widths(true), m));
  }
  // The profile first, whatever the keys' order: explicit keys override it.
  if (auto pf = flags.find("kv_cache_quant_profile"); pf != flags.end()) {
    // kv_cache_quant decides whether (and at which width) quantization runs.
    const bool on = a.quantize;
    const int width = a.codec.bits;
    a.apply_profile(pf->second);
    a.quantize = on;
    a.codec.bits = width;
  }
  constexpr std::string_view kPrefix = "kv_cache_quant";
  for (const auto& [key, value] : flags) {
    if (key == "kv_cache_quant") continue;
    if (key == "kv_cache_quant_profile") continue;      // applied above
    if (key.rfind(kPrefix, 0) != 0) continue;           // not ours
    if (key == "kv_cache_quant_config") continue;  // the engine's own key: no cache setting in it
    const Setting* s = find_setting_by_flag(std::string_view(key).substr(kPrefix.size()));
    if (!s)
      throw InvalidArgument(fmt::format("unknown flag '{}' (nearest known setting: {}); accepted: {}", key,
                                        nearest_flag(key), accepted_flags()));
    s->set(a, parse_setting(*s, value, key));
  }
  a.validate();
  return a;
}

}  // namespace qvg
