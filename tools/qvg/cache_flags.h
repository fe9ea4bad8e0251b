// tools/qvg/cache_flags.h — the packed-cache policy flags of `simulate` and `memory`:
// every cache-policy row of the settings table (qvg/settings.h) with a CLI flag
// (Setting::cli; the codec rows' flags are codec_flags.h's), plus --no-sink. Registered and read from the table: one
// rule (the engine flags' parser and ranges) for every command; a new policy setting
// is a row of the table.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "qvg/config.h"
#include "qvg/eval/workload.h"

namespace qvg::cli {

/// The policy flags as given on the command line.
struct CacheFlags {
  QuantArgs defaults;                                     ///< the command's defaults (shown in --help)
  std::map<std::string, std::string, std::less<>> given;  ///< setting name -> the flag's text
  bool no_sink = false;
};

/// Registers the table's policy flags on `cmd` (all but the settings named in `skip`)
/// and --no-sink (`no_sink_help`).
void add_cache_flags(CLI::App& cmd, CacheFlags& f, std::string_view no_sink_help,
                     std::span<const std::string_view> skip = {});

/// Sets q's policy settings: f.defaults', then those of `profile` when one is named
/// (QuantArgs::apply_profile: `recommended` sets a policy, the others none), then each
/// flag given (read and range-checked by the settings table, the message naming the
/// flag), so that a flag overrides the profile; sink = !no_sink; the settings the
/// model preset chooses (ModelPreset::chooses) are the preset's unless their flags
/// name them. Throws InvalidArgument.
void apply_cache_flags(const CacheFlags& f, const ModelPreset& preset, QuantArgs& q,
                       const std::optional<std::string>& profile = std::nullopt);

}  // namespace qvg::cli
