// The packed-cache policy flags (see cache_flags.h).
#include "cache_flags.h"

#include <algorithm>

#include "cli_util.h"
#include "qvg/settings.h"

namespace qvg::cli {

void add_cache_flags(CLI::App& cmd, CacheFlags& f, std::string_view no_sink_help,
                     std::span<const std::string_view> skip) {
  for (const Setting& s : quant_settings()) {
    if (s.codec_row() || s.cli.empty() || std::find(skip.begin(), skip.end(), s.name) != skip.end()) continue;
    const std::string key(s.name);
    auto* o = cmd.add_option_function<std::string>(
        std::string(s.cli), [&f, key](const std::string& v) { f.given[key] = v; }, std::string(s.cli_help));
    o->type_name(s.kind == SettingKind::Name ? "NAME" : s.kind == SettingKind::Real ? "X" : "INT");
    if (!ModelPreset::chooses(s.name)) o->default_str(setting_text(s.get(f.defaults)));  // the preset's otherwise
  }
  cmd.add_flag("--no-sink", f.no_sink, std::string(no_sink_help));
}

void apply_cache_flags(const CacheFlags& f, const ModelPreset& preset, QuantArgs& q,
                       const std::optional<std::string>& profile) {
  QuantArgs d = f.defaults;
  const QuantArgs model = preset.policy_defaults();
  for (const Setting& s : quant_settings())
    if (ModelPreset::chooses(s.name)) s.set(d, s.get(model));
  if (profile)
    named("--profile", [&] {
      d.apply_profile(*profile);
      return 0;
    });
  for (const Setting& s : quant_settings())
    if (!s.codec_row() && !s.cli.empty()) s.set(q, s.get(d));
  for (const auto& [key, text] : f.given) {
    const Setting& s = *find_setting(key);
    const SettingValue v = parse_setting(s, text, s.cli);
    check_setting(s, v, s.cli);
    s.set(q, v);
  }
  q.sink = !f.no_sink;
}

}  // namespace qvg::cli
