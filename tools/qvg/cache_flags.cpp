// The packed-cache policy flags (see cache_flags.h).
#include "cache_flags.h"

#include "cli_util.h"

namespace qvg::cli {

void apply_cache_flags(const CacheFlags& f, SinkSpan preset_sink_span, QuantArgs& q) {
  q.span_chunks = int(parse_int_flag("--span-chunks", f.span_chunks, 1, 1'000'000));
  q.keep_recent_chunks = int(parse_int_flag("--keep-recent", f.keep_recent, 0, 1'000'000));
  q.sink_keep_chunks = int(parse_int_flag("--sink-keep", f.sink_keep, 0, 1'000'000));
  q.sink = !f.no_sink;
  q.sink_span = f.sink_span ? named("--sink-span", [&] { return parse_sink_span(*f.sink_span); }) : preset_sink_span;
}

}  // namespace qvg::cli
