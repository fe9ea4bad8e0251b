// The settings table (qvg/settings.h).
#include "qvg/settings.h"

#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <limits>

#include <fmt/core.h>

#include "core/enum_names.h"
#include "qvg/code_format.h"
#include "qvg/error.h"

namespace qvg {

namespace {

constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();

// ---- the policy rows' accessors, one template per kind (member pointers of QuantArgs) ---
template <auto M>
SettingValue get_int(const QuantArgs& q) {
  return int64_t(q.*M);
}
template <auto M>
void set_int(QuantArgs& q, const SettingValue& v) {
  q.*M = int(std::get<int64_t>(v));
}
template <auto M>
SettingValue get_bool(const QuantArgs& q) {
  return bool(q.*M);
}
template <auto M>
void set_bool(QuantArgs& q, const SettingValue& v) {
  q.*M = std::get<bool>(v);
}
template <auto M>
SettingValue get_name(const QuantArgs& q) {
  return std::string(name(q.*M));
}
template <auto M, auto Parse>
void set_name(QuantArgs& q, const SettingValue& v) {
  q.*M = Parse(std::get<std::string>(v));
}
template <auto Parse>
SettingValue parse_name(std::string_view s) {
  return std::string(name(Parse(s)));  // the canonical name of an alias
}
SettingValue get_ratio(const QuantArgs& q) {
  return q.span_break_ratio;
}
void set_ratio(QuantArgs& q, const SettingValue& v) {
  q.span_break_ratio = std::get<double>(v);
}

// ---- the codec rows: a member of CodecConfig, by its type ------------------------------
// The enumerations' parsers by type (the one place a codec enum meets its parser).
template <class T>
T parse_as(std::string_view s) {
  if constexpr (std::is_same_v<T, ScaleDType>)
    return parse_scale_dtype(s);
  else if constexpr (std::is_same_v<T, Scaling>)
    return parse_scaling(s);
  else if constexpr (std::is_same_v<T, Init>)
    return parse_init(s);
  else
    return parse_scale_search(s);
}
// The canonical name of a Name row's text, for parse_setting.
template <class T>
SettingValue parse_codec_name(std::string_view s) {
  return std::string(name(parse_as<T>(s)));
}
using NameParser = SettingValue (*)(std::string_view);
template <class T, class C>  // C: CodecConfig or its base StoredCodec
constexpr NameParser codec_name_parser(T C::*) {
  if constexpr (std::is_enum_v<T>)
    return parse_codec_name<T>;
  else
    return nullptr;
}

// ---- the widths of qvg/code_format.h, as the rows' messages and CLI help give them ----
// Built at compile time, so that the table stays constant-initialized (usable from any
// static initializer).
struct Text {
  char s[400] = {};
  size_t n = 0;
  constexpr Text& operator+=(std::string_view t) {
    for (const char c : t) s[n++] = c;
    return *this;
  }
  constexpr Text& operator+=(int x) {  // a small non-negative integer
    if (x >= 10) *this += x / 10;
    s[n++] = char('0' + x % 10);
    return *this;
  }
  constexpr operator std::string_view() const { return {s, n}; }
};
// "2, 3 or 4" (modes: "int2, int3 or int4"), as known_code_widths().
constexpr Text widths(bool modes) {
  Text t;
  for (int i = 0; i < kCodeFormatCount; ++i) {
    if (i > 0) t += i + 1 == kCodeFormatCount ? " or " : ", ";
    if (modes) t += "int";
    t += kCodeFormats[i].bits;
  }
  return t;
}
constexpr Text kWidths = widths(false);
constexpr Text kBitsAllowed = [] {
  Text t = kWidths;
  t += " (or none to disable quantization)";
  return t;
}();
constexpr Text kRoleBitsAllowed = [] {
  Text t = kWidths;
  t += " (or ";
  t += widths(true);
  t += ")";
  return t;
}();
constexpr Text kBitsHelp = [] {
  Text t;
  t += "residual code width: ";
  t += kWidths;
  t += " (";
  bool first = true;
  for (const CodeFormat& f : kCodeFormats)
    if (f.engine) {
      t += first ? "" : " and ";
      t += std::string_view(f.mode);
      first = false;
    }
  t += ": the engine's kv_cache_quant modes; the others are qvg's)";
  return t;
}();
constexpr Text kBlockHelp = [] {
  Text t;
  t += "channels sharing one residual scale; divides head_dim, and a multiple of the width's code group (so that "
       "codes fill whole bytes): ";
  for (int i = 0; i < kCodeFormatCount; ++i) {
    t += i == 0 ? "" : ", ";
    t += kCodeFormats[i].group_codes;
    t += " at ";
    t += kCodeFormats[i].bits;
    t += " bits";
  }
  return t;
}();
constexpr Text kRefineHelp = [] {
  Text t;
  t += "the refinement layer's code width: ";
  t += kWidths;
  return t;
}();

constexpr std::string_view kScaleDTypes = "fp8_e4m3 (or fp8), bf16";
constexpr std::string_view kScalings = "two_level, compat";
constexpr std::string_view kScaleSearches = "off, mse";
constexpr std::string_view kBools = "true, false, 1 or 0";

// A shared codec row: NAME and FLAG, KIND, range, first snapshot minor, allowed text,
// the CodecConfig member M, the CLI flag and its help (and, for a name, a value that needs a cache).
#define QVG_CODEC_ROW(NAME, FLAG, KIND, LO, HI, MINOR, ALLOWED, M, CLI, HELP, ...)                                 \
  Setting {                                                                                                        \
    NAME, FLAG, SettingKind::KIND, false, LO, HI, MINOR, ALLOWED, CodecField(M), CacheRole::Key, nullptr, nullptr, \
        codec_name_parser(M), CLI, HELP, __VA_ARGS__                                                               \
  }
// clang-format off
// The per-role rows of one role (prefix "k_"/"v_", flag "_k_"/"_v_", role R):
// optional overrides of the shared codec settings, first stored by format 1.3. Their
// order is RoleCodec::overridden's bits.
#define QVG_ROLE_ROW(P, R, NAME, FLAG, KIND, LO, HI, ALLOWED, M) \
  Setting{P NAME, "_" P FLAG, SettingKind::KIND, true, LO, HI, 3, ALLOWED, CodecField(M), R, nullptr, nullptr, \
          codec_name_parser(M)}
#define QVG_ROLE_ROWS(P, R)                                                                                   \
  QVG_ROLE_ROW(P, R, "bits", "bits", Width, kCodeFormats[0].bits, kCodeFormats[kCodeFormatCount - 1].bits,  \
               kRoleBitsAllowed, &CodecConfig::bits),                                                         \
  QVG_ROLE_ROW(P, R, "centroids", "centroids", Int, 1, 256, "in 1..256", &CodecConfig::centroids),            \
  QVG_ROLE_ROW(P, R, "block_size", "block_size", Int, 1, kI32, "> 0", &CodecConfig::block_size),              \
  QVG_ROLE_ROW(P, R, "stages", "stages", Int, 1, kMaxStages, "in 1..64", &CodecConfig::stages),               \
  QVG_ROLE_ROW(P, R, "kmeans_iters", "iters", Int, 1, kI32, "> 0", &CodecConfig::kmeans_iters),               \
  QVG_ROLE_ROW(P, R, "asymmetric", "asymmetric", Bool, 0, 0, kBools, &CodecConfig::asymmetric),               \
  QVG_ROLE_ROW(P, R, "scale_dtype", "scale_dtype", Name, 0, 0, kScaleDTypes, &CodecConfig::scale_dtype),      \
  QVG_ROLE_ROW(P, R, "scaling", "scaling", Name, 0, 0, kScalings, &CodecConfig::scaling),                     \
  QVG_ROLE_ROW(P, R, "scale_search", "scale_search", Name, 0, 0, kScaleSearches, &CodecConfig::scale_search)

// The rows, in the snapshot's config order (a 1.x file is written in this order).
constinit const Setting kSettings[] = {
    QVG_CODEC_ROW("bits", "", Bits, kCodeFormats[0].bits, kCodeFormats[kCodeFormatCount - 1].bits, 0, kBitsAllowed,
                  &CodecConfig::bits, "--bits", kBitsHelp),
    QVG_CODEC_ROW("centroids", "_centroids", Int, 1, 256, 0, "in 1..256", &CodecConfig::centroids, "--centroids",
                  "k-means codebook size per stage and group: 1..256"),
    QVG_CODEC_ROW("block_size", "_block_size", Int, 1, kI32, 0, "> 0", &CodecConfig::block_size, "--block-size",
                  kBlockHelp),
    QVG_CODEC_ROW("stages", "_stages", Int, 1, kMaxStages, 0, "in 1..64", &CodecConfig::stages, "--stages",
                  "k-means (progressive residual) stages: 1..64"),
    QVG_CODEC_ROW("kmeans_iters", "_iters", Int, 1, kI32, 0, "> 0", &CodecConfig::kmeans_iters, "--iters",
                  "Lloyd iterations per stage: >= 1"),
    QVG_CODEC_ROW("asymmetric", "_asymmetric", Bool, 0, 0, 0, kBools, &CodecConfig::asymmetric, "--asymmetric",
                  "min/max + zero point per block instead of absmax"),
    {"keep_recent_chunks", "_keep_recent", SettingKind::Int, false, 0, kI32, 0, ">= 0", {}, CacheRole::Key,
     get_int<&QuantArgs::keep_recent_chunks>, set_int<&QuantArgs::keep_recent_chunks>, nullptr, "--keep-recent",
     "completed non-sink chunks kept raw"},
    {"sink", "_sink", SettingKind::Bool, false, 0, 0, 0, kBools, {}, CacheRole::Key, get_bool<&QuantArgs::sink>,
     set_bool<&QuantArgs::sink>},
    {"sink_span", "_sink_span", SettingKind::Name, false, 0, 0, 0, "chunk, full", {}, CacheRole::Key,
     get_name<&QuantArgs::sink_span>, set_name<&QuantArgs::sink_span, parse_sink_span>, parse_name<parse_sink_span>,
     "--sink-span", "chunk | full (default: the preset's sink policy)"},
    {"sink_keep_chunks", "_sink_keep", SettingKind::Int, false, 0, kI32, 0, ">= 0", {}, CacheRole::Key,
     get_int<&QuantArgs::sink_keep_chunks>, set_int<&QuantArgs::sink_keep_chunks>, nullptr, "--sink-keep",
     "leading sink chunks never packed"},
    {"span_chunks", "_span_chunks", SettingKind::Int, false, 1, kI32, 0, ">= 1", {}, CacheRole::Key,
     get_int<&QuantArgs::span_chunks>, set_int<&QuantArgs::span_chunks>, nullptr, "--span-chunks",
     "chunks per encoded span (one codebook)"},
    {"span_mode", "_span_mode", SettingKind::Name, false, 0, 0, 1, "deferred, incremental", {}, CacheRole::Key,
     get_name<&QuantArgs::span_mode>, set_name<&QuantArgs::span_mode, parse_span_mode>, parse_name<parse_span_mode>,
     "--span-mode",
     "deferred (a span is encoded once full) | incremental (each chunk at once, against the span's codebook; "
     "docs/spans.md)"},
    {"span_break_ratio", "_span_break_ratio", SettingKind::Real, false, 0, 1'000'000, 1,
     "in [0, 1e6] (0 = never break a span)", {}, CacheRole::Key, get_ratio, set_ratio, nullptr, "--span-break-ratio",
     "incremental spans: start a new span when a chunk's residual energy exceeds this factor times the span's first "
     "chunk's (0 = never)"},
    QVG_CODEC_ROW("scaling", "_scaling", Name, 0, 0, 0, kScalings, &CodecConfig::scaling, "--scaling",
                  "two_level (fp32 factor per group) | compat (the QVG Triton layout)"),
    QVG_CODEC_ROW("scale_dtype", "_scale_dtype", Name, 0, 0, 0, kScaleDTypes, &CodecConfig::scale_dtype,
                  "--scale-dtype", "storage of block scales and zeros: fp8_e4m3 (or fp8) | bf16"),
    QVG_CODEC_ROW("init", "_init", Name, 0, 0, 0, "random, kmeans++, warm", &CodecConfig::init, "--init",
                  "k-means initialisation: random | kmeans++ | warm (the previous span's codebook: a cache's "
                  "encodings only)",
                  "warm"),
    QVG_CODEC_ROW("seed", "_seed", Seed, 0, 0, 0, "an integer in 0..2^64-1", &CodecConfig::seed, "--seed",
                  "seed every random choice derives from"),
    {"refine_recent", "_refine_recent", SettingKind::Int, false, 0, 1'000'000, 4, "in 0..1000000 (0 = no refinement)",
     {}, CacheRole::Key, get_int<&QuantArgs::refine_recent>, set_int<&QuantArgs::refine_recent>, nullptr,
     "--refine-recent",
     "incremental spans: the newest N encoded chunks also keep a refinement layer of their error (0 = none; "
     "docs/spans.md)"},
    {"refine_bits", "_refine_bits", SettingKind::Width, false, kCodeFormats[0].bits,
     kCodeFormats[kCodeFormatCount - 1].bits, 4, kWidths, {}, CacheRole::Key, get_int<&QuantArgs::refine_bits>,
     set_int<&QuantArgs::refine_bits>, nullptr, "--refine-bits", kRefineHelp},
    QVG_CODEC_ROW("scale_search", "_scale_search", Name, 0, 0, 3, kScaleSearches, &CodecConfig::scale_search,
                  "--scale-search",
                  "the encoder's choice of each block's stored scale: off (the block maximum, spec 1.2) | mse (the "
                  "least-squared-error candidate among shrunk ranges; same stored form, docs/quality.md)"),
    QVG_ROLE_ROWS("k_", CacheRole::Key),
    QVG_ROLE_ROWS("v_", CacheRole::Value),
};
// clang-format on
#undef QVG_ROLE_ROWS
#undef QVG_ROLE_ROW
#undef QVG_CODEC_ROW

// The whole of `t` as a decimal T (no sign for unsigned, no spaces, no "+").
template <class T>
bool decimal(std::string_view t, T& out) {
  const char* e = t.data() + t.size();
  const auto [p, ec] = std::from_chars(t.data(), e, out);
  return !t.empty() && ec == std::errc() && p == e;
}

[[noreturn]] void bad(std::string_view what, std::string_view allowed, std::string_view text) {
  throw InvalidArgument(fmt::format("{} must be {}, got '{}'", what, allowed, text));
}

}  // namespace

std::span<const Setting> quant_settings() {
  return kSettings;
}

std::span<const Setting> role_settings(CacheRole role) {
  static const auto rows = [] {
    std::array<std::span<const Setting>, 2> out;
    for (const CacheRole r : {CacheRole::Key, CacheRole::Value}) {
      const Setting* first = nullptr;
      size_t n = 0;
      for (const Setting& s : kSettings)
        if (s.role && s.tensor == r) {
          if (first == nullptr) first = &s;
          QVG_CHECK(&s == first + n);  // a role's rows are contiguous
          ++n;
        }
      out[size_t(r)] = {first, n};
    }
    QVG_CHECK(out[0].size() == out[1].size() && out[0].size() <= 32);
    return out;
  }();
  return rows[size_t(role)];
}

SettingValue get_codec_field(const Setting& s, const CodecConfig& c) {
  return std::visit(
      [&](auto m) -> SettingValue {
        using M = decltype(m);
        if constexpr (std::is_same_v<M, std::monostate>) {
          QVG_CHECK(false && "not a codec row");
          return {};
        } else {
          using T = std::remove_cvref_t<decltype(c.*m)>;
          if constexpr (std::is_same_v<T, int>)
            return int64_t(c.*m);
          else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint64_t>)
            return c.*m;
          else
            return std::string(name(c.*m));
        }
      },
      s.field);
}

void set_codec_field(const Setting& s, CodecConfig& c, const SettingValue& v) {
  std::visit(
      [&](auto m) {
        using M = decltype(m);
        if constexpr (std::is_same_v<M, std::monostate>) {
          QVG_CHECK(false && "not a codec row");
        } else {
          using T = std::remove_cvref_t<decltype(c.*m)>;
          if constexpr (std::is_same_v<T, int>)
            c.*m = int(std::get<int64_t>(v));
          else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint64_t>)
            c.*m = std::get<T>(v);
          else
            c.*m = parse_as<T>(std::get<std::string>(v));
        }
      },
      s.field);
}

void copy_codec_field(const Setting& s, const CodecConfig& from, CodecConfig& to) {
  std::visit(
      [&](auto m) {
        if constexpr (std::is_same_v<decltype(m), std::monostate>)
          QVG_CHECK(false && "not a codec row");
        else
          to.*m = from.*m;
      },
      s.field);
}

namespace {
// A per-role row's bit of RoleCodec::overridden: its index among its role's rows.
uint32_t role_bit(const Setting& s) {
  const std::span<const Setting> rows = role_settings(s.tensor);
  return uint32_t(1) << (&s - rows.data());
}
const RoleCodec& role_of(const Setting& s, const QuantArgs& q) {
  return s.tensor == CacheRole::Key ? q.k : q.v;
}
}  // namespace

SettingValue Setting::get(const QuantArgs& q) const {
  if (!codec_row()) return get_policy(q);
  if (role) {
    const RoleCodec& r = role_of(*this, q);
    return (r.overridden & role_bit(*this)) ? get_codec_field(*this, r.values) : SettingValue();
  }
  if (kind == SettingKind::Bits && !q.quantize) return {};
  return get_codec_field(*this, q.codec);
}

void Setting::set(QuantArgs& q, const SettingValue& v) const {
  const bool none = std::holds_alternative<std::monostate>(v);
  if (!codec_row()) {
    set_policy(q, v);
  } else if (role) {
    RoleCodec& r = tensor == CacheRole::Key ? q.k : q.v;
    if (none) {
      copy_codec_field(*this, CodecConfig{}, r.values);  // an unset field holds the default
      r.overridden &= ~role_bit(*this);
    } else {
      set_codec_field(*this, r.values, v);
      r.overridden |= role_bit(*this);
    }
  } else if (kind == SettingKind::Bits && none) {
    q.quantize = false;
  } else {
    set_codec_field(*this, q.codec, v);
    if (kind == SettingKind::Bits) q.quantize = true;
  }
}

uint32_t RoleCodec::field_bit(const CodecField& field) {
  for (const Setting& s : role_settings(CacheRole::Key))
    if (s.field == field) return role_bit(s);
  check_failed("RoleCodec::field_bit: a field with a per-role row of the settings table", __FILE__, __LINE__);
}

const Setting* find_setting(std::string_view n) {
  for (const Setting& s : kSettings)
    if (s.name == n) return &s;
  return nullptr;
}

const Setting* find_setting_by_flag(std::string_view suffix) {
  if (suffix.empty()) return nullptr;
  for (const Setting& s : kSettings)
    if (s.flag == suffix) return &s;
  return nullptr;
}

SettingValue parse_setting(const Setting& s, std::string_view t, std::string_view what) {
  // Only the form is checked here; ranges are the value's (check_setting, and
  // QuantArgs::validate with the field's name), so a flag and a field give one message.
  switch (s.kind) {
    case SettingKind::Bits:
    case SettingKind::Width:
      // bits and a role's bits take a width's mode too ("int3"); refine_bits is an
      // integer whose range QuantArgs::validate checks (its message names the field).
      if (s.kind == SettingKind::Bits || s.role) {
        for (const CodeFormat& f : kCodeFormats)
          if (t == std::to_string(f.bits) || t == f.mode) return int64_t(f.bits);
        bad(what, kRoleBitsAllowed, t);
      }
      [[fallthrough]];
    case SettingKind::Int: {
      int64_t x = 0;
      if (!decimal(t, x)) bad(what, "an integer", t);
      if (x < std::numeric_limits<int32_t>::min() || x > kI32) bad(what, "an integer that fits in 32 bits", t);
      return x;
    }
    case SettingKind::Bool:
      // One rule on every surface: true/false/1/0 (True/False as Python prints them).
      if (t == "true" || t == "True" || t == "1") return true;
      if (t == "false" || t == "False" || t == "0") return false;
      bad(what, "a boolean (true/false/1/0)", t);
    case SettingKind::Name: return s.parse_name(t);  // the enum's own message, naming the field
    case SettingKind::Real: {
      const std::optional<double> x = parse_real(t);
      if (!x) bad(what, "a number", t);
      return *x;
    }
    case SettingKind::Seed: {
      uint64_t x = 0;
      if (!decimal(t, x)) bad(what, s.allowed, t);
      return x;
    }
  }
  bad(what, s.allowed, t);
}

std::optional<double> parse_real(std::string_view text) {
  // std::from_chars' general format: plain decimal or exponent form, no hex, no inf
  // or nan, no leading '+' or spaces.
  double x = 0;
  if (!decimal(text, x) || !std::isfinite(x)) return std::nullopt;
  return x;
}

std::string setting_text(const SettingValue& v) {
  struct Text {
    std::string operator()(std::monostate) const { return "none"; }
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(uint64_t x) const { return std::to_string(x); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) const { return s; }
  };
  return std::visit(Text{}, v);
}

void check_setting(const Setting& s, const SettingValue& v, std::string_view what) {
  const bool none = std::holds_alternative<std::monostate>(v);
  if (none) {
    if (s.kind == SettingKind::Bits || s.role) return;
    throw InvalidArgument(fmt::format("{} must be {}, got none", what, s.allowed));
  }
  switch (s.kind) {
    case SettingKind::Bits:
    case SettingKind::Width:
      if (const int64_t* x = std::get_if<int64_t>(&v);
          x && *x >= INT32_MIN && *x <= INT32_MAX && find_code_format(int(*x)) != nullptr)
        return;
      break;
    case SettingKind::Int:
      if (const int64_t* x = std::get_if<int64_t>(&v)) {
        if (*x >= s.lo && *x <= s.hi) return;
        throw InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, *x));
      }
      break;
    case SettingKind::Bool:
      if (std::holds_alternative<bool>(v)) return;
      break;
    case SettingKind::Name:
      if (const std::string* n = std::get_if<std::string>(&v)) {
        (void)parse_setting(s, *n, what);
        return;
      }
      break;
    case SettingKind::Real:
      if (const double* x = std::get_if<double>(&v)) {
        if (std::isfinite(*x) && *x >= double(s.lo) && *x <= double(s.hi)) return;
        throw InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, *x));
      }
      break;
    case SettingKind::Seed:
      if (std::holds_alternative<uint64_t>(v)) return;
      break;
  }
  throw InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, setting_text(v)));
}

void set_recommended_policy(QuantArgs& q) {
  // The recommended profile's cache policy (docs/quality.md): kept beside the rows, so
  // that a policy setting is named here and where it is used, not in the profiles too.
  q.span_chunks = 4;
  q.span_mode = SpanMode::Incremental;
  q.span_break_ratio = 0.0;
  q.keep_recent_chunks = 0;
  q.sink_keep_chunks = 0;
  q.refine_recent = 4;
  q.refine_bits = 4;
}

bool is_default(const Setting& s, const QuantArgs& q) {
  static const QuantArgs d;
  return s.get(q) == s.get(d);
}

// The names of the settings' enumeration values (qvg/config.h's name() and parse_*())
// and the rule across policy settings: beside the table, so that the policy settings
// are named by their rows, their members, the policy (src/cache/cache_policy.h) and
// at most one more file (scripts/check-setting-names.py).
namespace {
using detail::EnumName;
constexpr EnumName<ScaleDType> kScaleDTypeNames[] = {{ScaleDType::FP8_E4M3, "fp8_e4m3"},
                                                     {ScaleDType::FP8_E4M3, "fp8"},
                                                     {ScaleDType::FP8_E4M3, "f8_e4m3"},
                                                     {ScaleDType::BF16, "bf16"}};
constexpr EnumName<Scaling> kScalingNames[] = {{Scaling::TwoLevel, "two_level"}, {Scaling::Compat, "compat"}};
constexpr EnumName<Init> kInitNames[] = {{Init::Random, "random"},
                                         {Init::KMeansPlusPlus, "kmeans++"},
                                         {Init::KMeansPlusPlus, "kmeanspp"},
                                         {Init::Warm, "warm"}};
constexpr EnumName<ScaleSearch> kSearchNames[] = {{ScaleSearch::Off, "off"}, {ScaleSearch::Mse, "mse"}};
constexpr EnumName<SinkSpan> kSinkSpans[] = {{SinkSpan::Chunk, "chunk"}, {SinkSpan::Full, "full"}};
constexpr EnumName<SpanMode> kSpanModes[] = {{SpanMode::Deferred, "deferred"}, {SpanMode::Incremental, "incremental"}};
constexpr EnumName<CacheRole> kRoleNames[] = {{CacheRole::Key, "k"}, {CacheRole::Value, "v"}};
}  // namespace

// One line per function, so that the overloads read as a table.
using detail::name_in;
using detail::parse_in;
// clang-format off
std::string_view name(ScaleDType v) { return name_in(kScaleDTypeNames, v); }
std::string_view name(Scaling v) { return name_in(kScalingNames, v); }
std::string_view name(Init v) { return name_in(kInitNames, v); }
std::string_view name(SinkSpan v) { return name_in(kSinkSpans, v); }
std::string_view name(SpanMode v) { return name_in(kSpanModes, v); }
std::string_view name(ScaleSearch v) { return name_in(kSearchNames, v); }
std::string_view name(CacheRole v) { return name_in(kRoleNames, v); }
ScaleSearch parse_scale_search(std::string_view s) { return parse_in(kSearchNames, s, "scale_search", kScaleSearches); }
ScaleDType parse_scale_dtype(std::string_view s) { return parse_in(kScaleDTypeNames, s, "scale_dtype", kScaleDTypes); }
Scaling parse_scaling(std::string_view s) { return parse_in(kScalingNames, s, "scaling", kScalings); }
Init parse_init(std::string_view s) { return parse_in(kInitNames, s, "init", "random, kmeans++, warm"); }
SinkSpan parse_sink_span(std::string_view s) { return parse_in(kSinkSpans, s, "sink_span", "chunk, full"); }
SpanMode parse_span_mode(std::string_view s) { return parse_in(kSpanModes, s, "span_mode", "deferred, incremental"); }
// clang-format on

void check_policy_settings(const QuantArgs& q) {
  if (q.refine_recent > 0 && q.span_mode != SpanMode::Incremental)
    throw InvalidArgument(fmt::format(
        "refine_recent must be 0 unless span_mode is incremental (a refinement layer belongs to a chunk encoded on "
        "its own), got refine_recent = {} with span_mode = {}",
        q.refine_recent, name(q.span_mode)));
  // A refinement layer is block-quantized over the encoding's own blocks, so each
  // role's block_size must hold whole code groups of the layer's width too.
  const CodeFormat* layer = find_code_format(q.refine_bits);
  if (q.quantize && q.refine_recent > 0 && layer)
    for (const CacheRole role : {CacheRole::Key, CacheRole::Value}) {
      const int block = q.codec_for(role).block_size;
      if (block % layer->group_codes != 0)
        throw InvalidArgument(fmt::format(
            "refine_bits = {} needs a block_size that is a multiple of {} (the {}-bit code group; a refinement "
            "layer shares the encoding's blocks), got block_size = {} for {}",
            q.refine_bits, layer->group_codes, q.refine_bits, block, role == CacheRole::Key ? "K" : "V"));
    }
}

std::span<const std::string_view> engine_quant_fields() {
  // SGLang 0.5.23's QVGKVQuantArgs (sglang/multimodal_gen/.../qvg_packed_cache.py).
  static constexpr std::string_view kFields[] = {
      "bits",       "centroids",          "block_size", "stages",          "kmeans_iters",
      "asymmetric", "keep_recent_chunks", "sink",       "sink_keep_chunks"};
  return kFields;
}

}  // namespace qvg
