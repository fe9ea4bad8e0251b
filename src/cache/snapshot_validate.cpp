// The invariants of a state read from a snapshot (snapshot_validate.h).
#include "cache/snapshot_validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "cache/dense_plan.h"
#include "cache/snapshot_io.h"

namespace qvg::detail::snap {

// ---- dense ------------------------------------------------------------------------------
void check_dense_state(const DenseStateData& d) {
  const CacheOptions& opt = d.options;
  in_section("state", [&] {
    if (d.cache_size < opt.cache_size || (d.cache_size != opt.cache_size && !opt.allow_growth))
      throw InvalidArgument(fmt::format("cache_size {} must equal the configured {}{}", d.cache_size, opt.cache_size,
                                        opt.allow_growth ? " or exceed it (growth)" : ""));
    CacheOptions grown = opt;
    grown.cache_size = d.cache_size;
    grown.attention_window_size = d.window;
    validate_options(grown);
    // The window follows growth when it was the whole cache (spec 3.2).
    const int64_t want_window = opt.window() == opt.cache_size ? d.cache_size : opt.window();
    if (d.window != want_window)
      throw InvalidArgument(fmt::format("attention_window_size {} must be {}", d.window, want_window));
    check_dense_indices(d.cache_size, d.global_end, d.local_end);  // as set_indices() takes them
    return 0;
  });
}

// ---- packed -----------------------------------------------------------------------------
namespace {

[[noreturn]] void bad(const std::string& m) {
  corrupt("state", m);
}

// The window's geometry is the policy's own rule (sink end and tail start at a
// global end depend on the options only).
using PolicyOfState = CachePolicy<size_t>;

// Sorted; adjacent segments touch, except for the evicted tokens between the sink
// segments and the first non-sink segment, which must all lie before the window's
// tail: every token a view can show, [0, sink_end) and [tail_start, global_end), is
// held. The last segment is raw (the current chunk) and ends at global_end.
void check_coverage(const PackedStateData& d, const WindowRanges& w) {
  const auto& segs = d.segments;
  const int64_t sink_end = w.sink_end, tail = w.tail_start;
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    const auto &a = segs[i], &b = segs[i + 1];
    if (a.g1 == b.g0) continue;
    // The sink is never evicted: the gap starts at or after its end (docs/reliability.md,
    // finding 13).
    if (a.g1 > b.g0 || !a.is_sink || b.is_sink || a.g1 < sink_end || b.g0 > tail)
      bad(
          fmt::format("segment {} ends at {} but segment {} starts at {} (only the evicted tokens between the "
                      "sink's end at {} and the window's tail at {} may be missing)",
                      i, a.g1, i + 1, b.g0, sink_end, tail));
  }
  if (segs.back().g1 != d.global_end)
    bad(fmt::format("the last segment ends at {}, global_end is {}", segs.back().g1, d.global_end));
  if (segs.back().packed) bad("the last segment (the current chunk) is packed");
  if (sink_end > 0 ? segs.front().g0 != 0 : segs.front().g0 > tail)
    bad(fmt::format("the segments start at {}; the window needs {}", segs.front().g0, sink_end > 0 ? 0 : tail));
}

// Encoding order: packed non-sink spans come before raw non-sink chunks (oldest
// first); with the whole sink packed as one span no raw sink chunk follows a packed one.
void check_encoding_order(const PackedStateData& d) {
  bool raw_nonsink = false, packed_sink = false;
  for (size_t i = 0; i < d.segments.size(); ++i) {
    const auto& s = d.segments[i];
    if (!s.is_sink) {
      if (s.packed && raw_nonsink) bad(fmt::format("packed segment {} follows a raw non-sink chunk", i));
      raw_nonsink = raw_nonsink || !s.packed;
    } else {
      if (!s.packed && packed_sink && sink_packed_whole(d.quant))
        bad(fmt::format("raw sink segment {} follows the packed sink span (the sink is packed whole: {})", i,
                        d.quant.describe()));
      packed_sink = packed_sink || s.packed;
    }
  }
}

// Refinement layers (format 1.4): every chunk of an incremental span gets layers when
// it is encoded (refines()), and the policy's aging rule (age_refinements) frees the
// older ones': exactly the chunks it keeps hold them.
void check_refinements(const PackedStateData& d) {
  const auto& segs = d.segments;
  std::vector<bool> kept(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) kept[i] = segs[i].span >= 0;
  age_refinements(
      d.quant, segs.size(), [&](size_t i) { return segs[i].span >= 0; }, [&](size_t i) { kept[i] = false; });
  const int64_t keep = refined_chunks_kept(d.quant);
  for (size_t i = segs.size(); i-- > 0;)
    if (segs[i].span >= 0 && segs[i].k_ref.has_value() != kept[i])
      bad(
          fmt::format("segment {} {} refinement layers; exactly the {} newest chunks of incremental spans hold "
                      "them ({})",
                      i, segs[i].k_ref ? "holds" : "lacks", keep, d.quant.describe()));
}

// The incremental-span bookkeeping against the segments and span sections
// (docs/snapshot.md): ids in order, a span's chunks adjacent and at most
// span_capacity() of them, every span section used, the open span the last one started.
void check_span_state(const PackedStateData& d) {
  const QuantArgs& q = d.quant;
  const SpanState& ss = d.span_state;
  if (!incremental_spans(q)) return;  // no span state (entries and sections absent)
  const int64_t capacity = span_capacity(q);
  if (ss.next_span < 0 || ss.next_span > kMaxPosition)
    bad(fmt::format("next_span = {} is out of [0, 2^60]", ss.next_span));
  if (ss.open_span != ss.next_span - 1)
    bad(fmt::format("open_span = {} must be the last span started (next_span - 1 = {})", ss.open_span,
                    ss.next_span - 1));
  if (ss.open_span < 0 ? ss.open_span_chunks != 0 : ss.open_span_chunks < 1 || ss.open_span_chunks > capacity)
    bad(fmt::format("open_span_chunks = {} is out of [{}, {}] (open_span = {}; a span holds at most {} chunks)",
                    ss.open_span_chunks, ss.open_span < 0 ? 0 : 1, ss.open_span < 0 ? 0 : capacity, ss.open_span,
                    capacity));
  if (ss.span_breaks < 0 || ss.span_breaks > std::max<int64_t>(0, ss.next_span - 1))
    bad(fmt::format("span_breaks = {} is out of [0, {}] (every break starts one of the {} spans after the first)",
                    ss.span_breaks, std::max<int64_t>(0, ss.next_span - 1), ss.next_span));
  for (double e : {ss.open_k_energy, ss.open_v_energy})
    if (std::signbit(e) || (ss.open_span < 0 && e != 0))
      bad(fmt::format("open span energies {} and {} must be >= 0 (and 0 without an open span)", ss.open_k_energy,
                      ss.open_v_energy));
  if (ss.open_span >= 0 && (d.spans.empty() || d.spans.back().id != ss.open_span))
    bad(fmt::format("the open span {} has no span section (the last one)", ss.open_span));
  for (const PackedSpanData& sp : d.spans)
    if (sp.id >= ss.next_span) bad(fmt::format("span {} is not below next_span = {}", sp.id, ss.next_span));
  // Chunks: spans oldest first, each span's chunks adjacent, at most span_capacity()
  // (the open span: open_span_chunks, some of them maybe evicted).
  std::vector<bool> used(d.spans.size(), false);
  const auto& segs = d.segments;
  int64_t last = -1, run = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const int64_t id = segs[i].span;
    if (id < 0) continue;
    if (id < last || (id == last && segs[i - 1].span != id))
      bad(
          fmt::format("segment {} is a chunk of span {} after a chunk of span {}: the chunks of a span are adjacent, "
                      "spans in order",
                      i, id, last));
    run = id == last ? run + 1 : 1;
    last = id;
    const int64_t limit = id == ss.open_span ? ss.open_span_chunks : capacity;
    if (run > limit) bad(fmt::format("span {} has more than {} chunks (segment {})", id, limit, i));
    const auto sp = std::lower_bound(d.spans.begin(), d.spans.end(), id,
                                     [](const PackedSpanData& a, int64_t x) { return a.id < x; });
    used[size_t(sp - d.spans.begin())] = true;  // get_segment() found it
  }
  // Chunks of a span can only be missing by eviction, which drops the oldest non-sink
  // segments: the open span holds all its chunks, or it starts the non-sink segments.
  const auto first_nonsink = std::find_if(segs.begin(), segs.end(), [](const auto& g) { return !g.is_sink; });
  const auto first_open = std::find_if(segs.begin(), segs.end(), [&](const auto& g) { return g.span == ss.open_span; });
  const auto held = std::count_if(segs.begin(), segs.end(), [&](const auto& g) { return g.span == ss.open_span; });
  if (ss.open_span >= 0 && held > 0 && held < ss.open_span_chunks && first_open != first_nonsink)
    bad(
        fmt::format("the open span {} holds {} of its {} chunks, but only evicted chunks (before the first non-sink "
                    "segment) can be missing",
                    ss.open_span, held, ss.open_span_chunks));
  for (size_t i = 0; i < d.spans.size(); ++i)
    if (!used[i] && d.spans[i].id != ss.open_span)
      corrupt(section_name(uint32_t(Kind::Span), uint32_t(i)),
              fmt::format("span {} has no chunk and is not the open span", d.spans[i].id));
}

}  // namespace

void check_packed_state(const PackedStateData& d) {
  const CacheOptions& o = d.options;
  const auto& segs = d.segments;
  if (d.global_end < 0 || d.global_end > kMaxPosition)
    bad(fmt::format("global_end = {} is out of [0, 2^60]", d.global_end));
  if (segs.empty() != (d.global_end == 0) || segs.empty() != !d.chunk_tokens)
    bad(fmt::format("{} segments, global_end = {} and chunk_tokens = {} do not agree", segs.size(), d.global_end,
                    d.chunk_tokens ? std::to_string(*d.chunk_tokens) : "none"));
  if (d.chunk_tokens && (*d.chunk_tokens < 1 || *d.chunk_tokens > o.cache_size))
    bad(fmt::format("chunk_tokens = {} is out of [1, cache_size = {}]", *d.chunk_tokens, o.cache_size));
  if (segs.empty()) {
    if (d.warm_k) bad("warm-start codebooks in an empty cache");
  } else {
    const PolicyOfState pol(d.options, d.quant);
    check_coverage(d, pol.window_ranges_at(d.global_end));
    check_encoding_order(d);
    check_refinements(d);
    if (d.warm_k.has_value() != d.warm_v.has_value()) bad("warm-start codebooks for only one of K and V");
    if (d.warm_k && (!d.quant.enabled() || d.quant.codec.init != Init::Warm))
      bad("warm-start codebooks in a cache with init != warm");
  }
  check_span_state(d);
}

}  // namespace qvg::detail::snap
