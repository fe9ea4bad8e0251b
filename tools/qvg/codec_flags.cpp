// The shared codec flags (see codec_flags.h).
#include "codec_flags.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/eval/simulate.h"
#include "qvg/settings.h"

namespace qvg::cli {

namespace {

// --threads (how a call runs, not a setting of the table). Only "is it an int" is
// checked here; the range is CodecConfig::validate's (one place, one message).
void add_threads(CLI::App& cmd, int& target) {
  cmd.add_option_function<std::string>(
         "--threads",
         [&target](const std::string& v) {
           int x = 0;
           const char* end = v.data() + v.size();
           const auto [p, ec] = std::from_chars(v.data(), end, x);
           if (ec == std::errc::result_out_of_range)
             throw InvalidArgument(fmt::format("--threads is out of range, got '{}'", v));
           if (v.empty() || ec != std::errc() || p != end)
             throw InvalidArgument(fmt::format("--threads must be an integer, got '{}'", v));
           target = x;
         },
         "worker threads (0 = all cores); never changes bytes")
      ->type_name("INT")
      ->default_str(std::to_string(target));
}

// The groups of commands with their own defaults, and why: each codec flag's help
// states its group's default and why, and the other groups' where they differ.
struct Group {
  CodecDefaults which;
  std::vector<std::string_view> commands;
  std::string_view why;
};
const std::vector<Group>& groups() {
  static const std::vector<Group> g = {
      {CodecDefaults::TensorFile, {"encode", "eval"}, "spec 1's, for a tensor file"},
      {CodecDefaults::Stream, {"simulate", "compare"}, "the published QVG runs', which these workloads reproduce"},
      {CodecDefaults::Engine, {"memory"}, "the engine's defaults, a cache built with kv_cache_quant=int2"}};
  return g;
}

// "a", "a and b", "a, b and c".
std::string listed(const std::vector<std::string_view>& v) {
  std::string o;
  for (size_t i = 0; i < v.size(); ++i)
    o += fmt::format("{}{}", i == 0 ? "" : i + 1 == v.size() ? " and " : ", ", v[i]);
  return o;
}

// The row's help, with the group's default and the other groups' where they differ:
// "... (default 4: spec 1's, for a tensor file; simulate, compare and memory default to 2)".
std::string help_of(const Setting& s, CodecDefaults which) {
  const SettingValue mine = get_codec_field(s, codec_defaults(which));
  std::vector<std::pair<std::string, std::vector<std::string_view>>> others;  // value -> commands
  std::string_view why;
  for (const Group& g : groups()) {
    if (g.which == which) {
      why = g.why;
      continue;
    }
    const std::string v = setting_text(get_codec_field(s, codec_defaults(g.which)));
    if (v == setting_text(mine)) continue;
    auto it = std::find_if(others.begin(), others.end(), [&](const auto& o) { return o.first == v; });
    if (it == others.end()) it = others.insert(others.end(), {v, {}});
    it->second.insert(it->second.end(), g.commands.begin(), g.commands.end());
  }
  std::string h(s.cli_help);
  if (others.empty()) return h;
  h += fmt::format(" (default {}: {}", setting_text(mine), why);
  for (const auto& [v, commands] : others) h += fmt::format("; {} default to {}", listed(commands), v);
  return h + ")";
}

bool skipped(const CodecFlagsOf& how, std::string_view name) {
  return std::find(how.skip.begin(), how.skip.end(), name) != how.skip.end();
}

}  // namespace

CodecConfig codec_defaults(CodecDefaults which) {
  switch (which) {
    case CodecDefaults::Stream: return default_packed_config().quant.codec;
    case CodecDefaults::Engine: return QuantArgs::from_flags({{"kv_cache_quant", "int2"}}).codec;
    case CodecDefaults::TensorFile: break;
  }
  return CodecConfig{};
}

void add_codec_flags(CLI::App& cmd, CodecConfig& cfg, const CodecFlagsOf& how) {
  cfg = codec_defaults(how.defaults);
  // The flag registered for each codec row (null: the command has none), for --profile.
  auto flags = std::make_shared<CodecFlagOptions>();
  // One flag per shared codec row with a CLI name, read by the table's parser.
  for (const Setting& s : quant_settings()) {
    if (!s.codec_row() || s.role || s.cli.empty() || skipped(how, s.name)) continue;
    const std::string flag(s.cli), help = help_of(s, how.defaults);
    if (s.kind == SettingKind::Bool) {
      flags->emplace_back(&s, cmd.add_flag(flag, cfg.*std::get<bool CodecConfig::*>(s.field), help));
      continue;
    }
    const bool cache = how.cache;
    auto* o = cmd.add_option_function<std::string>(
        flag,
        [&cfg, &s, flag, cache](const std::string& text) {
          // A name's message is its enum's (naming the field): prefixed with the flag.
          const SettingValue v = s.kind == SettingKind::Name
                                     ? named(flag.c_str(), [&] { return parse_setting(s, text, flag); })
                                     : parse_setting(s, text, flag);
          if (!cache && !s.cache_only.empty() && v == SettingValue(std::string(s.cache_only)))
            throw InvalidArgument(fmt::format(
                "{} must not be {} here, got '{}' ({} needs the previous segment of a cache; this command has none)",
                flag, s.cache_only, text, s.cache_only));
          set_codec_field(s, cfg, v);
        },
        help);
    o->type_name(s.kind == SettingKind::Name ? "NAME" : s.kind == SettingKind::Seed ? "UINT" : "INT");
    o->default_str(setting_text(get_codec_field(s, cfg)));
    flags->emplace_back(&s, o);
  }
  if (!skipped(how, "threads")) add_threads(cmd, cfg.threads);
  add_profile_flag(cmd, cfg, flags);
}

void add_profile_flag(CLI::App& cmd, CodecConfig& cfg, std::shared_ptr<const CodecFlagOptions> flags) {
  auto profile = std::make_shared<std::string>();
  cmd.add_option("--profile", *profile,
                 "settings by name: reference (the engine's defaults, compat scaling) | hq (a codec, "
                 "docs/quality.md) | recommended (hq's codec with V's scale search off, and a "
                 "cache policy where the command has one, docs/quality.md); explicit flags override it, whatever their "
                 "order")
      ->type_name("NAME");
  // After parsing: the profile's value for every codec setting whose flag was not given.
  cmd.parse_complete_callback([&cmd, &cfg, profile, flags] {
    // Not given: nothing to apply. Given, even as '' (one option parser on every
    // surface): a name that apply_profile accepts, or its error, as from the engine's
    // flags.
    if (cmd.get_option("--profile")->count() == 0) return;
    QuantArgs q;
    named("--profile", [&] {
      q.apply_profile(*profile);
      return 0;
    });
    // Every shared codec row whose own flag (the one add_codec_flags registered, not
    // another option of the same name) was not given, and every row the command has
    // no flag for, takes the profile's value.
    const CodecConfig p = q.codec_for(CacheRole::Key);
    for (const Setting& s : quant_settings()) {
      if (!s.codec_row() || s.role) continue;
      const CLI::Option* o = nullptr;
      for (const auto& [row, opt] : *flags)
        if (row == &s) o = opt;
      if (o == nullptr || o->count() == 0) copy_codec_field(s, p, cfg);
    }
  });
}

std::optional<std::string> given_profile(const CLI::App& cmd) {
  const CLI::Option* o = cmd.get_option_no_throw("--profile");
  if (o == nullptr || o->count() == 0) return std::nullopt;
  return o->as<std::string>();
}

void add_role_config_flags(CLI::App& cmd, std::string& k_config, std::string& v_config) {
  std::string fields;
  for (const Setting& s : role_settings(CacheRole::Key))
    fields += fmt::format("{}{}", fields.empty() ? "" : ", ", s.flag.substr(3));  // "_k_iters" -> "iters"
  add_value(cmd, "--k-config", k_config,
            fmt::format("K's own codec settings over the shared ones: field=value,... ({})", fields), "LIST");
  add_value(cmd, "--v-config", v_config, "V's own codec settings (as --k-config)", "LIST");
}

CLI::Option* add_codec_seed_flag(CLI::App& cmd, std::string& codec_seed) {
  return add_value(cmd, "--codec-seed", codec_seed, "seed of the codec's random choices", "UINT");
}

std::string codebook_dtype_note(const Shape4& shape, DType input, const CodecConfig& cfg) {
  if (input != DType::F32) return {};
  const double elements = double(shape.numel());
  auto bpe = [&](DType t) { return double(EncodedTensor::predicted_nbytes(shape, t, cfg)) * 8.0 / elements; };
  return fmt::format(
      "codebooks stored in float32, the input's dtype ({:.4f} bits per element; in bf16 the same tensor would take "
      "{:.4f})",
      bpe(DType::F32), bpe(DType::BF16));
}

void check_codec_flags(const CodecConfig& cfg) {
  try {
    cfg.validate();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("invalid codec flags: {}", e.what()));
  }
}

void check_codec_flags(const CodecConfig& cfg, int64_t head_dim) {
  try {
    cfg.validate_for_head_dim(head_dim);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("invalid codec flags for this input: {}", e.what()));
  }
}

}  // namespace qvg::cli
