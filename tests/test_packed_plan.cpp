// The packed cache's plan as a value (src/cache/packed_plan.h, CachePolicy::plan_pack
// and apply): deferred and sink spans, eviction and the view's pieces, incremental
// spans with joins and adaptive breaks (phase 2, SpanDecisions), the aging of
// refinement layers — each against an expectation written from spec 4 and
// docs/spans.md — planning as a pure function, and the CPU cache executing exactly
// the plan the policy makes (segments, spans, refinement layers, breaks).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cache/cache_policy.h"
#include "cache/plan_access.h"
#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "support/snapshot_fixtures.h"

namespace qvg {
namespace {

/// A payload naming its data: the first token of the chunk or step it came from.
struct Tag {
  int64_t g0 = -1;
};
using Policy = detail::CachePolicy<Tag>;
using detail::PackPlan;
using detail::PlannedSegment;

CacheOptions options(int64_t cache_size, int64_t sink = 0) {
  CacheOptions o;
  o.batch = 1;
  o.heads = 2;  // the shape of testing::lcg_kv
  o.head_dim = 8;
  o.dtype = DType::F32;
  o.cache_size = cache_size;
  o.sink_tokens = sink;
  return o;
}

QuantArgs quant(int span_chunks, int keep_recent, SpanMode mode = SpanMode::Deferred) {
  QuantArgs q;
  q.enable(2);
  q.codec.block_size = 8;
  q.codec.centroids = 4;
  q.span_chunks = span_chunks;
  q.keep_recent_chunks = keep_recent;
  q.span_mode = mode;
  q.sink = false;
  return q;
}

/// Executes `pp` on tags: every step's payload is its first token; incremental
/// chunks fit their open span as `fits` says, in order (true when it runs out).
void execute(Policy& pol, const PackPlan& pp, int span_chunks, const std::vector<bool>& fits = {}) {
  detail::SpanDecisions d(pp, span_chunks);
  std::vector<Tag> encoded;
  size_t next = 0;
  for (const detail::EncodeStep& e : pp.encodes) {
    encoded.push_back({e.g0});
    if (e.incremental) d.decide(next < fits.size() ? fits[next++] : true);
  }
  pol.apply(pp, Tag{pp.start}, std::move(encoded), d);
}

/// The policy's segments after apply() are the plan's `after` list.
template <class Books>
void expect_after(const detail::CachePolicy<Tag, Books>& pol, const PackPlan& pp) {
  ASSERT_EQ(pol.segments().size(), pp.after.size());
  for (size_t i = 0; i < pp.after.size(); ++i) {
    const auto& s = pol.segments()[i];
    const PlannedSegment& a = pp.after[i];
    EXPECT_EQ(s.g0, a.g0);
    EXPECT_EQ(s.g1, a.g1);
    EXPECT_EQ(s.is_sink, a.is_sink);
    EXPECT_EQ(s.packed, a.packed);
    EXPECT_EQ(s.chunks, a.chunks);
    EXPECT_EQ(s.refined, a.refined);
    // The payload came from where the plan said: a kept segment's is its own.
    EXPECT_EQ(s.data.g0, s.g0) << "segment " << i;
  }
}

TEST(PackedPlan, DeferredSpansOfSpanChunksOldestFirstKeepRecentRaw) {
  // Chunks of 4, spans of 2 chunks, 1 recent chunk kept raw: the advance that starts
  // chunk k (k >= 3, k odd) encodes chunks k-3 and k-2 as one span.
  const QuantArgs q = quant(2, 1);
  Policy pol(options(64), q);
  for (int64_t k = 0; k < 12; ++k) {
    const PackPlan pp = pol.plan_pack(4 * k, 4);
    EXPECT_TRUE(pp.evicted.empty());
    if (k >= 3 && k % 2 == 1) {
      ASSERT_EQ(pp.encodes.size(), 1u) << "chunk " << k;
      const detail::EncodeStep& e = pp.encodes[0];
      EXPECT_EQ(e.g0, 4 * (k - 3));
      EXPECT_EQ(e.g1, 4 * (k - 1));
      EXPECT_EQ(e.chunks, 2);
      EXPECT_EQ(e.count, 2u);
      EXPECT_FALSE(e.incremental);
      EXPECT_FALSE(e.refine);
      EXPECT_EQ(pol.segments()[e.first].g0, e.g0);  // steps name the list before the call
      EXPECT_EQ(pol.segments()[e.first + e.count - 1].g1, e.g1);
    } else {
      EXPECT_TRUE(pp.encodes.empty()) << "chunk " << k;
    }
    EXPECT_EQ(pp.incremental_chunks(), 0u);
    EXPECT_EQ(pp.after.back().source, PlannedSegment::Source::Current);
    execute(pol, pp, q.span_chunks);
    expect_after(pol, pp);
    EXPECT_EQ(pol.global_end(), 4 * (k + 1));
  }
}

TEST(PackedPlan, SinkSpanFullIsEncodedAtTheFirstNonSinkAdvance) {
  QuantArgs q = quant(4, 0);
  q.sink = true;
  q.sink_span = SinkSpan::Full;
  Policy pol(options(64, 8), q);  // sink = chunks 0 and 1
  for (int64_t k = 0; k < 3; ++k) {
    const PackPlan pp = pol.plan_pack(4 * k, 4);
    if (k < 2) {
      EXPECT_TRUE(pp.encodes.empty());
    } else {
      ASSERT_EQ(pp.encodes.size(), 1u);
      EXPECT_TRUE(pp.encodes[0].is_sink);
      EXPECT_EQ(pp.encodes[0].g0, 0);
      EXPECT_EQ(pp.encodes[0].g1, 8);
      EXPECT_EQ(pp.encodes[0].chunks, 2);
    }
    execute(pol, pp, q.span_chunks);
    expect_after(pol, pp);
  }
  EXPECT_TRUE(pol.segments()[0].packed && pol.segments()[0].is_sink);
}

TEST(PackedPlan, EvictionDropsSegmentsLeftOfTheTailAndTheViewReadsTheListAfter) {
  // Quantization off, window = cache = 16 tokens, chunks of 4: the advance that
  // starts chunk k >= 4 drops chunk k-4 (its tokens end at the new tail).
  QuantArgs off;
  Policy pol(options(16), off);
  const Tensor kv = testing::lcg_kv(4, 1);
  for (int64_t k = 0; k < 8; ++k) {
    const ConstTensorView x = kv.view();
    const detail::PackedPlan plan = pol.plan(x, x, 4 * k, std::nullopt, std::nullopt);
    ASSERT_TRUE(plan.pack.has_value());
    const PackPlan& pp = *plan.pack;
    if (k >= 4) {
      ASSERT_EQ(pp.evicted.size(), 1u) << "chunk " << k;
      EXPECT_EQ(pol.segments()[pp.evicted[0]].g0, 4 * (k - 4));
    } else {
      EXPECT_TRUE(pp.evicted.empty());
    }
    // The view [tail, start) ++ the call's chunk: pieces in order, over `after`.
    const int64_t tail = std::max<int64_t>(0, 4 * k + 4 - 16);
    int64_t t = tail;
    for (const detail::ViewPiece& pc : plan.pieces) {
      ASSERT_LT(pc.seg, pp.after.size());
      EXPECT_EQ(pp.after[pc.seg].g0 + pc.t0, t);
      EXPECT_EQ(pc.out_t, t - tail);
      t += pc.t1 - pc.t0;
    }
    EXPECT_EQ(t, 4 * k);
    EXPECT_EQ(plan.call.view.tokens, 4 * k + 4 - tail);
    execute(pol, pp, 1);
    expect_after(pol, pp);
  }
}

TEST(PackedPlan, IncrementalChunksJoinTheOpenSpanBreakWhenTheyDoNotFitAndStartOneWhenItIsFull) {
  // Spans of up to 3 chunks, every completed chunk encoded at once; chunk 4 does not
  // fit its open span (an adaptive break).
  const QuantArgs q = quant(3, 0, SpanMode::Incremental);
  Policy pol(options(128), q);
  struct Want {
    bool may_join, joined;
    int64_t span;
  };
  const std::vector<Want> want = {{false, false, 0}, {true, true, 0},   {true, true, 0},
                                  {false, false, 1}, {true, false, 2},  {true, true, 2},
                                  {true, true, 2},   {false, false, 3}, {true, true, 3}};
  for (int64_t k = 0; k <= int64_t(want.size()); ++k) {
    const PackPlan pp = pol.plan_pack(4 * k, 4);
    if (k == 0) {
      EXPECT_TRUE(pp.encodes.empty());
      execute(pol, pp, q.span_chunks);
      continue;
    }
    const Want& w = want[size_t(k - 1)];  // chunk k-1 is encoded
    ASSERT_EQ(pp.incremental_chunks(), 1u);
    EXPECT_EQ(pp.encodes[0].g0, 4 * (k - 1));
    EXPECT_EQ(pp.follows_open, k >= 2);
    detail::SpanDecisions d(pp, q.span_chunks);
    EXPECT_EQ(d.may_join(), w.may_join) << "chunk " << k - 1;
    const detail::ChunkDecision c = d.decide(k - 1 != 4);
    EXPECT_EQ(c.may_join, w.may_join);
    EXPECT_EQ(c.joined, w.joined) << "chunk " << k - 1;
    EXPECT_EQ(c.span, w.span) << "chunk " << k - 1;
    pol.apply(pp, Tag{pp.start}, {Tag{pp.encodes[0].g0}}, d);
    expect_after(pol, pp);
    EXPECT_EQ(pol.segments()[pol.segments().size() - 2].span, w.span);
    EXPECT_EQ(pol.spans().cursor.open, w.span);
  }
  EXPECT_EQ(pol.spans().cursor.open_chunks, 2);
  EXPECT_EQ(pol.spans().cursor.next, 4);
  EXPECT_EQ(pol.spans().breaks, 1);
}

TEST(PackedPlan, SeveralIncrementalChunksOfOneAdvanceAreDecidedInOrder) {
  // A restored state (as a snapshot may hold) of four raw chunks and keep_recent 0:
  // the next advance encodes all four (the current one among them), each decided
  // after the one before it. Spans of 2 chunks, every chunk fits: a new span, a
  // join, a new span (the first is full), a join. The books (here an int) become
  // the last new span's.
  const QuantArgs q = quant(2, 0, SpanMode::Incremental);
  detail::CachePolicy<Tag, int> pol(options(128), q);
  std::vector<detail::PlanSegment<Tag>> segs;
  for (int64_t k = 0; k < 4; ++k) {
    detail::PlanSegment<Tag> s;
    s.g0 = 4 * k;
    s.g1 = 4 * k + 4;
    s.data = {s.g0};
    segs.push_back(s);
  }
  pol.restore(std::move(segs), 16, int64_t(4), {});
  const PackPlan pp = pol.plan_pack(16, 4);
  ASSERT_EQ(pp.incremental_chunks(), 4u);
  EXPECT_FALSE(pp.follows_open);
  detail::SpanDecisions d(pp, q.span_chunks);
  const std::vector<std::pair<bool, int64_t>> want = {{false, 0}, {true, 0}, {false, 1}, {true, 1}};
  std::vector<Tag> encoded;
  for (size_t j = 0; j < 4; ++j) {  // want[j]: may_join, span
    EXPECT_EQ(d.may_join(), want[j].first) << "chunk " << j;
    EXPECT_EQ(d.decide(true, double(j), 0).span, want[j].second) << "chunk " << j;
    encoded.push_back({pp.encodes[j].g0});
  }
  pol.apply(pp, Tag{16}, std::move(encoded), d, 7);
  expect_after(pol, pp);
  EXPECT_EQ(pol.spans().cursor, (detail::SpanCursor{1, 2, 2}));
  EXPECT_EQ(pol.spans().books, 7);
  EXPECT_EQ(pol.spans().k_energy, 2.0);  // the reference of the span chunk 2 started
  EXPECT_EQ(pol.spans().breaks, 0);
}

TEST(PackedPlan, OnlyTheRefineRecentNewestChunksKeepTheirLayers) {
  QuantArgs q = quant(4, 0, SpanMode::Incremental);
  q.refine_recent = 2;
  Policy pol(options(128), q);
  for (int64_t k = 0; k < 8; ++k) {
    const PackPlan pp = pol.plan_pack(4 * k, 4);
    for (const detail::EncodeStep& e : pp.encodes) EXPECT_TRUE(e.refine);
    // Packed chunks after the advance: 0 .. k-1; the two newest keep their layers,
    // the third newest (chunk k-3) loses them now.
    if (k >= 3) {
      ASSERT_EQ(pp.drop_refinement.size(), 1u);
      EXPECT_EQ(pp.after[pp.drop_refinement[0]].g0, 4 * (k - 3));
    } else {
      EXPECT_TRUE(pp.drop_refinement.empty());
    }
    execute(pol, pp, q.span_chunks);
    expect_after(pol, pp);
    for (const auto& s : pol.segments()) EXPECT_EQ(s.refined, s.packed && s.g0 >= 4 * (k - 2)) << s.g0;
  }
}

TEST(PackedPlan, AdaptiveBoundaryRule) {
  EXPECT_TRUE(detail::fits_open_span(0, 100, 100, 1, 1));  // ratio 0: never break
  EXPECT_TRUE(detail::fits_open_span(2, 2, 1, 1, 1));
  EXPECT_FALSE(detail::fits_open_span(2, 2.5, 1, 1, 1));   // K over
  EXPECT_FALSE(detail::fits_open_span(2, 1, 2.5, 1, 1));   // V over
  EXPECT_FALSE(detail::fits_open_span(2, 1e-9, 0, 0, 0));  // against a zero reference: infinite
  EXPECT_TRUE(detail::fits_open_span(1, 0, 0, 0, 0));      // zero over zero: the ratio 1
  EXPECT_FALSE(detail::fits_open_span(0.5, 0, 0, 0, 0));
}

TEST(PackedPlan, PlanningIsPureAndRepeatable) {
  QuantArgs q = quant(3, 1, SpanMode::Incremental);
  q.refine_recent = 1;
  q.sink = true;
  q.sink_span = SinkSpan::Chunk;
  Policy pol(options(24, 4), q);
  for (int64_t k = 0; k < 9; ++k) execute(pol, pol.plan_pack(4 * k, 4), q.span_chunks, {k % 3 != 1});
  EXPECT_GT(pol.spans().breaks, 0);
  struct Summary {
    int64_t g0, g1;
    bool sink, packed, refined;
    int chunks;
    int64_t span;
    bool operator==(const Summary&) const = default;
  };
  const auto summary = [&] {
    std::vector<Summary> v;
    for (const auto& s : pol.segments()) v.push_back({s.g0, s.g1, s.is_sink, s.packed, s.refined, s.chunks, s.span});
    return v;
  };
  const std::vector<Summary> before = summary();
  const detail::SpanCursor cursor = pol.spans().cursor;
  const Tensor kv = testing::lcg_kv(4, 3);
  const ConstTensorView x = kv.view();
  const detail::PackedPlan a = pol.plan(x, x, 36, std::nullopt, std::nullopt);
  const detail::PackedPlan b = pol.plan(x, x, 36, std::nullopt, std::nullopt);
  ASSERT_TRUE(a.pack && b.pack);
  EXPECT_EQ(*a.pack, *b.pack);
  EXPECT_EQ(a.pieces, b.pieces);
  EXPECT_FALSE(a.pack->evicted.empty());  // the window moved on
  EXPECT_FALSE(a.pack->encodes.empty());
  EXPECT_EQ(*a.pack, pol.plan_pack(36, 4));
  EXPECT_TRUE(summary() == before);
  EXPECT_EQ(pol.spans().cursor, cursor);
  EXPECT_EQ(pol.global_end(), 36);
  // A rewrite plans no pack-and-evict.
  const detail::PackedPlan r = pol.plan(x, x, 32, std::nullopt, std::nullopt);
  EXPECT_FALSE(r.pack.has_value());
  EXPECT_FALSE(r.call.advance);
}

TEST(PackedPlan, TheCacheExecutesThePolicysPlan) {
  // A CPU cache with incremental spans, adaptive breaks, refinement and eviction,
  // and a tag-payload policy fed the cache's decisions: before each advance the
  // policy's plan is what the cache then encodes, and afterwards both hold the same
  // segments, spans, refinement layers and breaks.
  QuantArgs q = testing::small_incremental_quant(2.0);
  q.refine_recent = 2;
  const CacheOptions o = testing::small_cache_options();
  PackedCausalCache cache(o, q);
  Policy pol(o, q);
  int64_t joins = 0, breaks = 0;
  for (int64_t i = 0; i < 14; ++i) {
    const PackPlan pp = pol.plan_pack(4 * i, 4);
    cache.update(testing::lcg_kv(4, uint64_t(2 * i)), testing::lcg_kv(4, uint64_t(2 * i + 1)), 4 * i);
    const detail::PackOutcome& done = detail::PlanAccess::last_advance(cache);
    EXPECT_EQ(done.encodes, pp.encodes) << "chunk " << i;
    ASSERT_EQ(done.decisions.size(), pp.incremental_chunks());
    detail::SpanDecisions d(pp, q.span_chunks);
    std::vector<Tag> encoded;
    size_t next = 0;
    for (const detail::EncodeStep& e : pp.encodes) {
      encoded.push_back({e.g0});
      if (!e.incremental) continue;
      const detail::ChunkDecision& want = done.decisions[next++];
      EXPECT_EQ(d.may_join(), want.may_join);
      const detail::ChunkDecision& got = d.decide(want.joined);
      EXPECT_EQ(got.span, want.span);
      joins += got.joined;
      breaks += got.may_join && !got.joined;
    }
    pol.apply(pp, Tag{pp.start}, std::move(encoded), d);
    ASSERT_EQ(cache.num_segments(), pol.segments().size()) << "chunk " << i;
    for (size_t j = 0; j < cache.num_segments(); ++j) {
      const PackedCausalCache::SegmentInfo s = cache.segment(j);
      const auto& p = pol.segments()[j];
      EXPECT_EQ(s.g0, p.g0);
      EXPECT_EQ(s.g1, p.g1);
      EXPECT_EQ(s.is_sink, p.is_sink);
      EXPECT_EQ(s.packed, p.packed);
      EXPECT_EQ(s.chunks, p.chunks);
      EXPECT_EQ(s.span, p.span);
      EXPECT_EQ(s.k_ref != nullptr, p.refined);
      EXPECT_EQ(s.v_ref != nullptr, p.refined);
    }
    EXPECT_EQ(cache.span_breaks(), pol.spans().breaks);
    const auto st = qvg::detail::debug_state(cache);
    EXPECT_EQ(st.open_span, pol.spans().cursor.open);
    EXPECT_EQ(st.open_span_chunks, pol.spans().cursor.open_chunks);
    EXPECT_EQ(st.next_span, pol.spans().cursor.next);
  }
  // The sequence exercised both outcomes of phase 2.
  EXPECT_GT(joins, 0);
  EXPECT_GT(breaks, 0);
  cache.reset_indices();
  EXPECT_TRUE(detail::PlanAccess::last_advance(cache).encodes.empty());
}

}  // namespace
}  // namespace qvg
