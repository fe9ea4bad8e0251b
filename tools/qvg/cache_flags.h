// tools/qvg/cache_flags.h — the packed-cache policy flags of `simulate` and `memory`:
// --span-chunks --span-mode --span-break-ratio --refine-recent --refine-bits --keep-recent --sink-keep --sink-span
// --no-sink. Each command
// registers them with its own help text (add_value); this parses them, one rule for both.
#pragma once

#include <optional>
#include <string>

#include "qvg/config.h"

namespace qvg::cli {

/// The policy flags as given on the command line.
struct CacheFlags {
  std::string span_chunks = "1";
  std::string span_mode = "deferred";
  std::string span_break_ratio = "0";
  std::string refine_recent = "0";
  std::string refine_bits = "4";
  std::string keep_recent = "1";
  std::string sink_keep = "0";
  std::optional<std::string> sink_span = std::nullopt;  ///< nullopt: the preset's sink policy
  bool no_sink = false;
};
/// Sets q's span_chunks, span_mode, span_break_ratio, refine_recent, refine_bits,
/// keep_recent_chunks, sink_keep_chunks (each read and range-checked by the settings
/// table, qvg/settings.h: the same rule as the engine's flags), sink (!no_sink) and
/// sink_span (`preset_sink_span` unless --sink-span names one). Throws InvalidArgument
/// naming the flag.
void apply_cache_flags(const CacheFlags& f, SinkSpan preset_sink_span, QuantArgs& q);

}  // namespace qvg::cli
