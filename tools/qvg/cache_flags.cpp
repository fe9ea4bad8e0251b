// The packed-cache policy flags (see cache_flags.h).
#include "cache_flags.h"

#include "cli_util.h"

namespace qvg::cli {

void apply_cache_flags(const CacheFlags& f, SinkSpan preset_sink_span, QuantArgs& q) {
  q.span_chunks = int(parse_int_flag("--span-chunks", f.span_chunks, 1, 1'000'000));
  q.span_mode = named("--span-mode", [&] { return parse_span_mode(f.span_mode); });
  q.span_break_ratio = parse_double_flag("--span-break-ratio", f.span_break_ratio, 0.0, 1e6, "in [0, 1e6] (0 = never)");
  q.refine_recent = int(parse_int_flag("--refine-recent", f.refine_recent, 0, 1'000'000));
  q.refine_bits = parse_width_flag("--refine-bits", f.refine_bits);
  q.keep_recent_chunks = int(parse_int_flag("--keep-recent", f.keep_recent, 0, 1'000'000));
  q.sink_keep_chunks = int(parse_int_flag("--sink-keep", f.sink_keep, 0, 1'000'000));
  q.sink = !f.no_sink;
  q.sink_span = f.sink_span ? named("--sink-span", [&] { return parse_sink_span(*f.sink_span); }) : preset_sink_span;
}

}  // namespace qvg::cli
