// Tests of the memory model (include/qvg/eval/memory.h): hand-computed sizes for small
// cases, consistency with EncodedTensor::predicted_nbytes, and the policy replay
// against hand-derived resident sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/eval/memory.h"
#include "qvg/eval/workload.h"
#include "qvg/tensor.h"
#include "support/cache_model.h"

namespace qvg {
namespace {

// The small case used throughout: 2 heads, head_dim 64, chunks of 10 tokens, bf16.
MemoryShape small_shape(int64_t context, int64_t sink) {
  MemoryShape s;
  s.layers = 3;
  s.heads = 2;
  s.head_dim = 64;
  s.chunk_tokens = 10;
  s.context_tokens = context;
  s.sink_tokens = sink;
  return s;
}
// int2, 4 centroids, block 32, one stage, fp8 scales, two-level scaling.
QuantArgs small_args() {
  QuantArgs a;
  a.enable(2);
  a.codec.centroids = 4;
  a.codec.block_size = 32;
  return a;
}
// Hand-computed size of one encoded [1, S, 2, 64] tensor with small_args():
//   centroids 2 groups * 4 * 64 * 2 bytes = 1024; ids 2 * S; codes 2 * S * 64 * 2 / 8 = 32 S;
//   scales 2 * S * 2 blocks * 1 byte = 4 S; two-level factors 2 * 4 = 8.
size_t enc_bytes(int64_t S) {
  return 1032 + 38 * size_t(S);
}
constexpr size_t kRawChunk = 2 * 10 * 2 * 64 * 2;  // K+V of one 10-token chunk in bf16 = 5120

TEST(Memory, HandComputedSpanSizeMatchesPredictedNbytes) {
  const QuantArgs a = small_args();
  for (int64_t S : {1, 3, 10, 20, 25}) {
    EXPECT_EQ(EncodedTensor::predicted_nbytes({1, S, 2, 64}, DType::BF16, a.codec), enc_bytes(S)) << S;
    PolicyReplay r(small_shape(30, 0), a);
    EXPECT_EQ(r.span_bytes(S), 2 * enc_bytes(S));
  }
}

TEST(Memory, FullyEncodedContextWithoutSink) {
  const MemoryShape s = small_shape(30, 0);
  QuantArgs a = small_args();
  MemoryReport r = memory_report(s, a);
  EXPECT_EQ(r.raw_context_bytes, 3 * kRawChunk);
  EXPECT_EQ(r.dense_window_bytes, 4 * kRawChunk);
  ASSERT_EQ(r.context_layout.size(), 3u);
  EXPECT_EQ(r.packed_context_bytes, 3 * 2 * enc_bytes(10));  // 8472
  EXPECT_EQ(r.packed_context_bytes, 8472u);
  EXPECT_DOUBLE_EQ(r.ratio(), 15360.0 / 8472.0);
  EXPECT_EQ(r.total(r.packed_context_bytes), 3 * 8472u);

  // Spans of two chunks from the oldest: 20 + 10 tokens.
  a.span_chunks = 2;
  r = memory_report(s, a);
  ASSERT_EQ(r.context_layout.size(), 2u);
  EXPECT_EQ(r.context_layout[0].tokens(), 20);
  EXPECT_EQ(r.context_layout[0].chunks, 2);
  EXPECT_EQ(r.context_layout[1].tokens(), 10);
  EXPECT_EQ(r.packed_context_bytes, 2 * enc_bytes(20) + 2 * enc_bytes(10));  // 6408
  EXPECT_EQ(r.packed_context_bytes, 6408u);

  // A context that is not a whole number of spans: 35 tokens in spans of 20 -> 20 + 15.
  r = memory_report(small_shape(35, 0), a);
  ASSERT_EQ(r.context_layout.size(), 2u);
  EXPECT_EQ(r.context_layout[1].tokens(), 15);
  EXPECT_EQ(r.packed_context_bytes, 2 * enc_bytes(20) + 2 * enc_bytes(15));
}

TEST(Memory, PolicyPeakSpanOneHandDerived) {
  // Window 40 tokens = 4 chunks. Steady state while chunk k is current: chunks k-3 and
  // k-2 packed (one span each), k-1 raw (keep_recent 1), k raw (current).
  MemoryReport r = memory_report(small_shape(30, 0), small_args());
  EXPECT_EQ(r.policy_peak_bytes, 2 * 2 * enc_bytes(10) + 2 * kRawChunk);  // 15888
  EXPECT_EQ(r.policy_peak_bytes, 15888u);
  EXPECT_EQ(r.peak_step.packed_tokens, 20);
  EXPECT_EQ(r.peak_step.raw_tokens, 20);
  EXPECT_DOUBLE_EQ(r.policy_ratio_vs_dense_window(), 20480.0 / 15888.0);
  EXPECT_DOUBLE_EQ(r.policy_ratio(), double(r.raw_context_bytes) / 15888.0);
}

TEST(Memory, PolicyReplayStepByStepSpanTwo) {
  // span_chunks 2, keep_recent 1, window 40 (derived by hand in the comments):
  // k=0 [0c]                       5120
  // k=1 [0r 1c]                   10240
  // k=2 [0r 1r 2c]                15360 (chunk 0 eligible alone: no span yet)
  // k=3 [S01 2r 3c]               S20 + 10240
  // k=4 [S01 2r 3r 4c]            S20 + 15360 (tail_start 10: S01 ends at 20, kept)
  // k=5 [S23 4r 5c]               S20 + 10240 (tail_start 20: S01 dropped, 2 and 3 packed)
  // k=6 like k=4, k=7 like k=5, ...
  QuantArgs a = small_args();
  a.span_chunks = 2;
  PolicyReplay rp(small_shape(30, 0), a);
  const size_t s20 = 2 * enc_bytes(20);
  const std::vector<size_t> want{5120, 10240, 15360, s20 + 10240, s20 + 15360, s20 + 10240, s20 + 15360, s20 + 10240};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(rp.advance().resident_bytes, want[k]) << "chunk " << k;
  MemoryReport r = memory_report(small_shape(30, 0), a);
  EXPECT_EQ(r.policy_peak_bytes, s20 + 15360);  // 18944
  EXPECT_EQ(r.period_chunks, 2);
}

TEST(Memory, PolicyReplayIncrementalSpansHandDerived) {
  // span_chunks 2 incremental, keep_recent 1, window 40. A chunk's data (K+V, no
  // codebook): 2 * (enc_bytes(10) - 1024) = 776; a span's codebooks (K+V): 2048.
  // k=0 [0c]                        5120
  // k=1 [0r 1c]                    10240
  // k=2 [A0 1r 2c]                 776 + 2048 + 10240 = 13064 (chunk 0 starts span A)
  // k=3 [A0 A1 2r 3c]              2 * 776 + 2048 + 10240 = 13840 (chunk 1 joins A)
  // k=4 [A1 B2 3r 4c]              2 * 776 + 2 * 2048 + 10240 = 15888 (A0 evicted per chunk; A full: B)
  // k=5 [B2 B3 4r 5c]              13840 (A1 evicted: A's codebook goes with its last chunk)
  // k=6 like k=4, k=7 like k=5, ...
  QuantArgs a = small_args();
  a.span_chunks = 2;
  a.span_mode = SpanMode::Incremental;
  PolicyReplay rp(small_shape(30, 0), a);
  EXPECT_EQ(rp.codebook_bytes(), 2048u);
  EXPECT_EQ(rp.chunk_data_bytes(10), 776u);
  const std::vector<size_t> want{5120, 10240, 13064, 13840, 15888, 13840, 15888, 13840};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(rp.advance().resident_bytes, want[k]) << "chunk " << k;
  ASSERT_EQ(rp.segments().size(), 4u);  // B3 C4 5r... after k = 7: [C4 C5 6r 7c]
  EXPECT_TRUE(rp.segments()[0].packed && rp.segments()[1].packed);
  EXPECT_EQ(rp.segments()[0].span, rp.segments()[1].span);
  EXPECT_EQ(rp.steps().back().codebook_bytes, 2048u);
  MemoryReport r = memory_report(small_shape(30, 0), a);
  EXPECT_EQ(r.policy_peak_bytes, 15888u);  // deferred spans of 2: 18944 (PolicyReplayStepByStepSpanTwo)
  EXPECT_EQ(r.period_chunks, 2);
  // Fully encoded context: [0, 20) one codebook + 2 chunks, [20, 30) one codebook + 1 chunk.
  EXPECT_EQ(r.packed_context_bytes, 2048u + 2 * 776u + 2048u + 776u);  // 6424 (deferred: 6408, one factor less)
}

TEST(Memory, PolicyReplayRefinementLayersHandDerived) {
  // As PolicyReplayIncrementalSpansHandDerived with refine_recent 1: the newest
  // encoded chunk also holds its K and V refinement layers, f32 encodings of [1, 10,
  // 2, 64] with one centroid: centroids 2 * 64 * 4 = 512, ids 2 * 10 = 20, codes
  // 2 * 10 * 64 * bits / 8 (320 at 2 bits, 640 at 4), scales 2 * 10 * 2 = 40,
  // factors 2 * 4 = 8: 900 (2 bits) or 1220 (4 bits) per role.
  for (const int bits : {2, 4}) {
    QuantArgs a = small_args();
    a.span_chunks = 2;
    a.span_mode = SpanMode::Incremental;
    a.refine_recent = 1;
    a.refine_bits = bits;
    const size_t ref = bits == 2 ? 1800 : 2440;
    PolicyReplay rp(small_shape(30, 0), a);
    EXPECT_EQ(rp.refine_bytes(10), ref);
    const std::vector<size_t> want{5120, 10240, 13064 + ref, 13840 + ref, 15888 + ref, 13840 + ref, 15888 + ref};
    for (size_t k = 0; k < want.size(); ++k) {
      const PolicyStep& st = rp.advance();
      EXPECT_EQ(st.resident_bytes, want[k]) << "bits " << bits << " chunk " << k;
      EXPECT_EQ(st.refine_bytes, k >= 2 ? ref : 0u);
    }
    // Only the newest encoded chunk holds layers.
    ASSERT_EQ(rp.segments().size(), 4u);
    EXPECT_EQ(rp.segments()[0].refine_bytes, 0u);
    EXPECT_EQ(rp.segments()[1].refine_bytes, ref);
    EXPECT_EQ(memory_report(small_shape(30, 0), a).policy_peak_bytes, 15888u + ref);
    a.refine_recent = 2;  // both encoded chunks of the window
    PolicyReplay r2(small_shape(30, 0), a);
    for (int k = 0; k < 4; ++k) (void)r2.advance();
    EXPECT_EQ(r2.steps().back().resident_bytes, 13840 + 2 * ref);
  }
}

TEST(Memory, PolicyReplayAdaptiveBreaksFollowTheDecisions) {
  // The same stream with a break at every chunk that could join: every chunk is its
  // own span (the span-1 sizes with separate codebooks).
  QuantArgs a = small_args();
  a.span_chunks = 2;
  a.span_mode = SpanMode::Incremental;
  PolicyReplay rp(small_shape(30, 0), a), span1(small_shape(30, 0), small_args());
  int asked = 0;
  for (int k = 0; k < 8; ++k) {
    const size_t got = rp.advance([&] {
                           ++asked;
                           return false;
                         }).resident_bytes;
    EXPECT_EQ(got, span1.advance().resident_bytes) << "chunk " << k;
  }
  EXPECT_EQ(asked, 6);  // chunks 0..5 were encoded (one per advance from k = 2)
}

TEST(Memory, SinkChunkSpans) {
  // Sink of one chunk, chunk mode: steady state holds the packed sink, one packed
  // chunk, the kept chunk and the current one (sink 10 + 30 tokens = the window).
  const MemoryShape s = small_shape(30, 10);
  MemoryReport r = memory_report(s, small_args());
  EXPECT_EQ(r.packed_context_bytes, 3 * 2 * enc_bytes(10));
  EXPECT_TRUE(r.context_layout[0].sink && r.context_layout[0].packed);
  EXPECT_EQ(r.policy_peak_bytes, 2 * 2 * enc_bytes(10) + 2 * kRawChunk);

  // sink = false keeps the sink raw in both figures.
  QuantArgs a = small_args();
  a.sink = false;
  r = memory_report(s, a);
  EXPECT_EQ(r.packed_context_bytes, kRawChunk + 2 * 2 * enc_bytes(10));
  EXPECT_FALSE(r.context_layout[0].packed);
  EXPECT_EQ(r.policy_peak_bytes, kRawChunk + 2 * enc_bytes(10) + 2 * kRawChunk);
}

TEST(Memory, SinkFullWithKeptChunkHandDerived) {
  // Sink of 25 tokens = chunks of 10, 10, 5; the context is all sink; window 35.
  // sink_span full, sink_keep 1: chunk 0 stays raw, chunks 1-2 form one 15-token span
  // (packed when chunk 3 starts at c = 25 >= sink). Steady: R0 + S12 + current.
  QuantArgs a = small_args();
  a.sink_span = SinkSpan::Full;
  a.sink_keep_chunks = 1;
  const MemoryShape s = small_shape(25, 25);
  EXPECT_EQ(s.sink_chunks(), 3);
  EXPECT_EQ(s.chunk_size(2), 5);
  EXPECT_EQ(s.chunk_size(3), 10);
  MemoryReport r = memory_report(s, a);
  EXPECT_EQ(r.raw_context_bytes, 12800u);
  ASSERT_EQ(r.context_layout.size(), 2u);
  EXPECT_EQ(r.context_layout[1].tokens(), 15);
  EXPECT_EQ(r.context_layout[1].chunks, 2);
  EXPECT_EQ(r.packed_context_bytes, kRawChunk + 2 * enc_bytes(15));           // 5120 + 3204
  EXPECT_EQ(r.policy_peak_bytes, kRawChunk + 2 * enc_bytes(15) + kRawChunk);  // 13444
  EXPECT_EQ(r.dense_window_bytes, 17920u);

  PolicyReplay rp(s, a);
  EXPECT_EQ(rp.advance().resident_bytes, kRawChunk);                                  // sink chunk 0
  EXPECT_EQ(rp.advance().resident_bytes, 2 * kRawChunk);                              // sink chunk 1
  EXPECT_EQ(rp.advance().resident_bytes, 2 * kRawChunk + kRawChunk / 2);              // sink chunk 2 (5 tokens)
  EXPECT_EQ(rp.advance().resident_bytes, kRawChunk + 2 * enc_bytes(15) + kRawChunk);  // packed at c = 25
  ASSERT_EQ(rp.segments().size(), 3u);
  EXPECT_FALSE(rp.segments()[0].packed);
  EXPECT_TRUE(rp.segments()[1].packed && rp.segments()[1].sink);
}

TEST(Memory, QuantizationOffKeepsEverythingRaw) {
  QuantArgs off;  // bits = none
  MemoryReport r = memory_report(small_shape(30, 0), off);
  EXPECT_EQ(r.packed_context_bytes, r.raw_context_bytes);
  EXPECT_EQ(r.policy_peak_bytes, r.dense_window_bytes);
  EXPECT_DOUBLE_EQ(r.ratio(), 1.0);
}

TEST(Memory, SmallWindowPacksNothingWithLongSpans) {
  // Spans of 8 chunks never fill in a window of 4 chunks: chunks leave raw.
  QuantArgs a = small_args();
  a.span_chunks = 8;
  MemoryReport r = memory_report(small_shape(30, 0), a);
  EXPECT_EQ(r.peak_step.packed_bytes, 0u);
  EXPECT_EQ(r.policy_peak_bytes, r.dense_window_bytes);
}

TEST(Memory, PresetShapesFollowTheFormat) {
  // Self-Forcing at int2 with the spec defaults: 56 context chunks of 4680 tokens,
  // each its own span; 12 heads x 128 dims.
  const ModelPreset& p = find_model_preset("self-forcing-1.3b");
  const MemoryShape s = MemoryShape::of(p);
  EXPECT_EQ(s.context_tokens, 262080);
  EXPECT_EQ(s.chunk_tokens, 4680);
  QuantArgs a;
  a.enable(2);
  MemoryReport r = memory_report(s, a);
  const size_t span = EncodedTensor::predicted_nbytes({1, 4680, 12, 128}, DType::BF16, a.codec);
  // By hand: centroids 12*128*128*2 = 393216; ids 12*4680 = 56160; codes 12*4680*32 = 1797120;
  // scales 12*4680*2 = 112320; factors 48.
  EXPECT_EQ(span, 393216u + 56160u + 1797120u + 112320u + 48u);
  EXPECT_EQ(r.packed_context_bytes, 56 * 2 * span);
  EXPECT_EQ(r.raw_context_bytes, size_t(262080) * 12 * 128 * 2 * 2);
  // Steady state: 55 packed chunks + the kept one + the current one (57-chunk window).
  EXPECT_EQ(r.policy_peak_bytes, 55 * 2 * span + 2 * s.raw_bytes(4680));
  EXPECT_EQ(r.total(r.raw_context_bytes), 30 * r.raw_context_bytes);

  // HY-WorldPlay: the published 990 MiB of bf16 K+V per layer.
  const MemoryShape hy = MemoryShape::of(find_model_preset("hy-worldplay-8b"));
  EXPECT_NEAR(to_mib(hy.raw_bytes(hy.context_tokens)), 990.0, 0.5);

  // --frames override: the sink shrinks with the context.
  const MemoryShape lc = MemoryShape::of(find_model_preset("longcat-video-13.6b"), 10);
  EXPECT_EQ(lc.context_tokens, 15600);
  EXPECT_EQ(lc.sink_tokens, 15600);
}

// The replay is the packed cache's policy on sizes: streaming real data through
// PackedCausalCache gives the same resident bytes after every advance.
TEST(Memory, ReplayMatchesThePackedCache) {
  struct Case {
    const char* what;
    int64_t context, sink, chunk;
    QuantArgs args;
  };
  std::vector<Case> cases;
  QuantArgs a = small_args();
  cases.push_back({"span 1", 30, 0, 10, a});
  a.span_chunks = 2;
  cases.push_back({"span 2, context not a whole number of chunks", 35, 0, 10, a});
  a.span_chunks = 3;
  a.keep_recent_chunks = 0;
  cases.push_back({"span 3, keep 0", 50, 0, 10, a});
  a = small_args();
  cases.push_back({"sink chunk", 30, 10, 10, a});
  a.sink_span = SinkSpan::Full;
  a.sink_keep_chunks = 1;
  cases.push_back({"sink full, keep 1, short last sink chunk", 40, 25, 10, a});
  a = small_args();
  a.sink = false;
  a.span_chunks = 2;
  cases.push_back({"sink raw", 40, 20, 10, a});
  a = small_args();
  a.span_chunks = 3;
  a.span_mode = SpanMode::Incremental;
  cases.push_back({"incremental spans of 3", 50, 0, 10, a});
  a.keep_recent_chunks = 0;
  a.sink_span = SinkSpan::Full;
  cases.push_back({"incremental spans of 3, keep 0, sink full", 50, 20, 10, a});
  a.span_break_ratio = 1.02;  // adaptive breaks on noise: some chunks start spans
  cases.push_back({"incremental spans with adaptive breaks", 50, 0, 10, a});
  a.refine_recent = 2;
  cases.push_back({"incremental spans with adaptive breaks, 2 refined chunks", 50, 0, 10, a});
  a.span_break_ratio = 0;
  a.refine_recent = 1;
  a.refine_bits = 4;
  a.keep_recent_chunks = 1;
  cases.push_back({"incremental spans, 1 refined chunk of 4 bits, keep 1", 50, 10, 10, a});
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int breaks_seen = 0;  // incremental chunks that started a span (first chunks and adaptive breaks)
  int64_t adaptive_breaks = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    MemoryShape s = small_shape(c.context, c.sink);
    s.chunk_tokens = c.chunk;
    s.dtype = DType::F32;
    CacheOptions o;
    o.cache_size = s.cache_tokens();
    o.heads = s.heads;
    o.head_dim = s.head_dim;
    o.dtype = DType::F32;
    o.sink_tokens = s.sink_tokens;
    PackedCausalCache cache(o, c.args);
    PolicyReplay replay(s, c.args);
    int64_t g = 0;
    for (int64_t i = 0; i < 14; ++i) {
      const int64_t n = s.chunk_size(i);
      Tensor k(DType::F32, {1, n, s.heads, s.head_dim}), v(DType::F32, {1, n, s.heads, s.head_dim});
      for (Tensor* t : {&k, &v})
        for (int64_t j = 0; j < t->shape().numel(); ++j) static_cast<float*>(t->data())[j] = nd(rng);
      std::vector<int64_t> packed_before;
      for (size_t j = 0; j < cache.num_segments(); ++j)
        if (cache.segment(j).packed) packed_before.push_back(cache.segment(j).g0);
      cache.update(k, v, g);
      g += n;
      // The cache's adaptive decisions for the incremental chunks it just encoded.
      std::deque<bool> joins;
      for (size_t j = 0; j < cache.num_segments(); ++j) {
        const auto sg = cache.segment(j);
        if (sg.span < 0 || std::count(packed_before.begin(), packed_before.end(), sg.g0)) continue;
        joins.push_back(j > 0 && cache.segment(j - 1).span == sg.span);
        breaks_seen += !joins.back();
      }
      const PolicyStep& st = replay.advance([&joins] {
        const bool j = joins.front();
        joins.pop_front();
        return j;
      });
      ASSERT_TRUE(joins.empty());
      ASSERT_EQ(st.global_end, g);
      ASSERT_EQ(cache.resident_nbytes(), st.resident_bytes) << "after chunk " << i;
      // Branches of this state (issue 38; MemoryReport::branches_bytes): real forks hold
      // the replay's raw part each and its encoded part once.
      std::vector<PackedCausalCache> forks;
      forks.push_back(cache.fork());
      forks.push_back(cache.fork());
      const std::vector<const PackedCausalCache*> all{&cache, &forks[0], &forks[1]};
      ASSERT_EQ(PackedCausalCache::group_nbytes(all), st.packed_bytes + 3 * st.raw_bytes) << "after chunk " << i;
      ASSERT_EQ(forks[1].resident_nbytes(), st.raw_bytes) << "after chunk " << i;
      ASSERT_EQ(forks[1].shared_nbytes(), st.packed_bytes) << "after chunk " << i;
    }
    adaptive_breaks += cache.span_breaks();
  }
  EXPECT_GT(breaks_seen, 0);
  EXPECT_GT(adaptive_breaks, 0);  // the break case broke spans, and the replay followed
}

// The model-level peak (docs/simulate.md) is what the caches of every layer and the
// view memory hold at one instant. Three layers of real packed caches stream chunks in
// layer order (each a denoising step with the full window, as the model calls them);
// right after every call the test adds up every cache's resident bytes and the bytes of
// the view scratches they use at that instant. Over the steady state the most of these
// equals MemoryReport::model_peak_bytes: one shared ViewScratch -> Shared, one scratch
// per layer (held by the test, as a binding would hold it) -> PerLayer.
TEST(Memory, ModelPeakIsWhatTheLayersAndTheirViewsHoldAtOnce) {
  struct Case {
    const char* what;
    int64_t context, sink;
    QuantArgs args;
  };
  std::vector<Case> cases;
  QuantArgs a = small_args();
  cases.push_back({"span 1, keep 1", 30, 0, a});
  a.span_chunks = 2;
  a.sink_span = SinkSpan::Full;
  cases.push_back({"span 2, sink", 50, 20, a});
  a = small_args();
  a.span_chunks = 3;
  a.span_mode = SpanMode::Incremental;
  a.keep_recent_chunks = 0;
  a.refine_recent = 2;
  cases.push_back({"incremental spans of 3, 2 refined chunks", 50, 0, a});
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases)
    for (const ViewMemory views : {ViewMemory::Shared, ViewMemory::PerLayer}) {
      SCOPED_TRACE(std::string(c.what) + (views == ViewMemory::Shared ? ", shared view" : ", a view per layer"));
      const MemoryShape s = small_shape(c.context, c.sink);  // 3 layers
      const MemoryReport r = memory_report(s, c.args);
      CacheOptions o;
      o.cache_size = s.cache_tokens();
      o.heads = s.heads;
      o.head_dim = s.head_dim;
      o.sink_tokens = s.sink_tokens;
      std::vector<std::shared_ptr<ViewScratch>> scratch;
      std::vector<PackedCausalCache> layers;
      for (int64_t l = 0; l < s.layers; ++l) {
        if (views == ViewMemory::PerLayer || scratch.empty()) scratch.push_back(std::make_shared<ViewScratch>());
        o.view_scratch = scratch.back();
        layers.emplace_back(o, c.args);
      }
      auto held = [&] {
        size_t n = 0;
        for (const auto& v : scratch) n += v->size();
        for (const PackedCausalCache& l : layers) n += l.resident_nbytes();
        return n;
      };
      size_t steady_peak = 0;
      int64_t g = 0;
      const int64_t chunks = r.steady_from + 2 * r.period_chunks;
      for (int64_t i = 0; i < chunks; ++i) {
        const int64_t n = s.chunk_size(i);
        Tensor k(DType::BF16, {1, n, s.heads, s.head_dim}), v(DType::BF16, {1, n, s.heads, s.head_dim});
        std::vector<float> f(size_t(k.shape().numel()));
        for (Tensor* t : {&k, &v}) {
          for (float& x : f) x = nd(rng);
          convert_from_f32(f.data(), DType::BF16, t->data(), f.size());
        }
        for (int step = 0; step < 2; ++step)  // the advance, then a rewrite: both return the full window
          for (PackedCausalCache& l : layers) {
            l.update(k, v, g);
            if (i >= r.steady_from) steady_peak = std::max(steady_peak, held());
          }
        g += n;
      }
      EXPECT_EQ(steady_peak, r.model_peak_bytes(views));
      EXPECT_EQ(r.view_window_bytes, s.raw_bytes(s.cache_tokens()));
      const size_t view_windows = views == ViewMemory::Shared ? 1 : 3;
      EXPECT_EQ(r.model_peak_bytes(views), 3 * r.policy_peak_bytes + view_windows * r.view_window_bytes);
      EXPECT_EQ(r.dense_model_bytes(), 3 * r.dense_window_bytes);
      EXPECT_DOUBLE_EQ(r.model_peak_ratio(views), double(r.dense_model_bytes()) / double(r.model_peak_bytes(views)));
    }
}

// Incremental spans (int2, 256 centroids, spans of 8; docs/spans.md, "Peak memory")
// bring the policy peak close to the fully encoded context on the real model shapes.
TEST(Memory, IncrementalSpansPeakRatiosOfThePresets) {
  struct Want {
    const char* model;
    double keep0, keep1;
  };
  for (const Want& w :
       {Want{"self-forcing-1.3b", 5.0, 4.5}, Want{"lingbot-world-14b", 4.5, 3.8}, Want{"hy-worldplay-8b", 4.3, 3.5}}) {
    QuantArgs a;
    a.enable(2);
    a.codec.centroids = 256;
    a.span_chunks = 8;
    a.span_mode = SpanMode::Incremental;
    const ModelPreset& p = find_model_preset(w.model);
    a.sink_span = p.sink_policy;
    for (int keep : {0, 1}) {
      a.keep_recent_chunks = keep;
      const MemoryReport r = memory_report(MemoryShape::of(p), a);
      EXPECT_GE(r.policy_ratio(), keep == 0 ? w.keep0 : w.keep1) << w.model << " keep_recent " << keep;
      QuantArgs d = a;
      d.span_mode = SpanMode::Deferred;
      EXPECT_GT(r.policy_ratio(), memory_report(MemoryShape::of(p), d).policy_ratio()) << w.model;
    }
    // The setting that also holds the attention target (docs/spans.md): the four
    // newest encoded chunks with 2-bit refinement layers, keep_recent 1.
    a.keep_recent_chunks = 1;
    a.refine_recent = 4;
    a.refine_bits = 2;
    const MemoryReport r = memory_report(MemoryShape::of(p), a);
    EXPECT_GE(r.policy_ratio(), w.keep1) << w.model << " refine_recent 4";
    EXPECT_GT(r.peak_step.refine_bytes, 0u);
  }
}

// The peak of a long context is extrapolated from three short
// replays. It must be exactly the peak of the replay from an empty cache (what
// memory_report computed before, O(frames^2)), over contexts of every phase and
// policy settings of every kind, and the chunks replayed must not grow with the
// context.
int64_t full_replay_chunks(const MemoryShape& s, const QuantArgs& a) {
  const int64_t period = a.enabled() ? a.span_chunks : 1;
  const int64_t window_chunks = (s.cache_tokens() + s.chunk_tokens - 1) / s.chunk_tokens;
  return s.sink_chunks() + window_chunks + period + (a.enabled() ? a.keep_recent_chunks : 0) + 2 + 2 * period;
}
PolicyStep full_replay_peak(const MemoryShape& s, const QuantArgs& a) {
  const int64_t period = a.enabled() ? a.span_chunks : 1;
  PolicyReplay replay(s, a);
  for (int64_t i = 0; i < full_replay_chunks(s, a); ++i) replay.advance();
  PolicyStep peak;
  const auto& st = replay.steps();
  for (size_t i = st.size() - size_t(period); i < st.size(); ++i)
    if (st[i].resident_bytes > peak.resident_bytes) peak = st[i];
  return peak;
}

std::string step_text(const PolicyStep& p) {
  return ::testing::PrintToString(std::vector<int64_t>{
      p.chunk, p.global_end, int64_t(p.resident_bytes), int64_t(p.raw_bytes), int64_t(p.packed_bytes),
      int64_t(p.codebook_bytes), int64_t(p.refine_bytes), p.raw_tokens, p.packed_tokens, p.segments});
}

TEST(Memory, PeakOfALongContextIsTheFullReplaysWithoutReplayingIt) {
  std::vector<std::pair<std::string, QuantArgs>> settings;
  settings.emplace_back("quantization off", QuantArgs{});
  for (int span : {1, 3, 8})
    for (int keep : {0, 2}) {
      QuantArgs a = small_args();
      a.span_chunks = span;
      a.keep_recent_chunks = keep;
      settings.emplace_back("deferred span " + std::to_string(span) + " keep " + std::to_string(keep), a);
      a.span_mode = SpanMode::Incremental;
      a.refine_recent = span == 3 ? 2 : 0;
      settings.emplace_back("incremental span " + std::to_string(span) + " keep " + std::to_string(keep) + " refine " +
                                std::to_string(a.refine_recent),
                            a);
    }
  {
    QuantArgs a = small_args();
    a.span_chunks = 4;
    a.sink_span = SinkSpan::Full;
    settings.emplace_back("full sink span", a);
    a.sink_keep_chunks = 1;
    settings.emplace_back("full sink span, one kept raw", a);
    a.sink = false;
    settings.emplace_back("raw sink", a);
  }
  int compared = 0, extrapolated = 0;
  const int64_t step = testing::scaled(7, 19);  // 17 contexts (7 under the sanitizers)
  for (const auto& [what, a] : settings)
    for (int64_t sink : {0, 7, 20})
      for (int64_t chunks = 2; chunks <= 120; chunks += step)
        for (int64_t part : {0, 3}) {  // a context ending inside a chunk too
          const MemoryShape s = small_shape(chunks * 10 + part, std::min<int64_t>(sink, chunks * 10));
          const MemoryReport r = memory_report(s, a);
          const PolicyStep want = full_replay_peak(s, a);
          ASSERT_EQ(step_text(r.peak_step), step_text(want))
              << what << ", context " << s.context_tokens << ", sink " << s.sink_tokens;
          ASSERT_EQ(r.policy_peak_bytes, want.resident_bytes);
          ASSERT_EQ(r.peak_chunk, want.chunk);
          ++compared;
          extrapolated += r.replayed_chunks != full_replay_chunks(s, a);
        }
  EXPECT_EQ(compared, int(settings.size()) * 3 * int((120 - 2) / step + 1) * 2);
  EXPECT_GT(extrapolated, compared / 2);  // most were extrapolated, not replayed in full
  // The replay's cost does not grow with the context: a context longer by 1,000
  // periods replays exactly as many chunks.
  for (const auto& [what, a] : settings) {
    const int64_t period = a.enabled() ? a.span_chunks : 1;
    const MemoryReport near = memory_report(small_shape(2000 * 10 + 3, 7), a);
    ASSERT_LT(near.replayed_chunks, 1000) << what;  // a window of 2,001 chunks: not replayed
    const MemoryReport far = memory_report(small_shape((2000 + 1'000 * period) * 10 + 3, 7), a);
    EXPECT_EQ(far.replayed_chunks, near.replayed_chunks) << what;
    EXPECT_EQ(far.peak_step.packed_tokens + far.peak_step.raw_tokens - near.peak_step.packed_tokens -
                  near.peak_step.raw_tokens,
              1'000 * period * 10)
        << what;
  }
}

// Branches (issue 38): n sessions forked from the state at the peak share its encoded
// part (encoded spans, incremental spans' codebooks, refinement layers) and each copy
// its raw part (current chunk, kept chunks, raw sink chunks).
TEST(Memory, BranchesShareTheEncodedPartAndCopyTheRawPart) {
  struct Case {
    const char* what;
    int64_t context, sink;
    QuantArgs args;
  };
  std::vector<Case> cases;
  QuantArgs a = small_args();
  cases.push_back({"span 1, keep 1", 30, 0, a});
  a.sink = false;
  cases.push_back({"span 1, keep 1, raw sink chunk", 30, 10, a});
  a = small_args();
  a.span_chunks = 2;
  a.sink_span = SinkSpan::Full;
  cases.push_back({"span 2, sink", 50, 20, a});
  a = small_args();
  a.span_chunks = 3;
  a.span_mode = SpanMode::Incremental;
  a.keep_recent_chunks = 0;
  a.refine_recent = 2;
  cases.push_back({"incremental spans of 3, 2 refined chunks", 50, 0, a});
  cases.push_back({"quantization off", 30, 0, QuantArgs{}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const MemoryShape s = small_shape(c.context, c.sink);  // 3 layers
    const MemoryReport r = memory_report(s, c.args);
    const PolicyStep& pk = r.peak_step;
    // resident = raw + packed (the packed part holds the codebooks and the layers).
    EXPECT_EQ(pk.raw_bytes + pk.packed_bytes, r.policy_peak_bytes);
    EXPECT_LE(pk.codebook_bytes + pk.refine_bytes, pk.packed_bytes);
    EXPECT_EQ(r.branches_bytes(1), r.policy_peak_bytes);
    EXPECT_EQ(r.model_branches_bytes(1), r.model_peak_bytes(ViewMemory::Shared));
    for (int64_t n = 2; n <= 6; ++n) {
      EXPECT_EQ(r.branches_bytes(n) - r.branches_bytes(n - 1), pk.raw_bytes) << n;
      EXPECT_EQ(r.model_branches_bytes(n) - r.model_branches_bytes(n - 1), 3 * pk.raw_bytes + r.view_window_bytes) << n;
      const BranchesMemory b = r.branches(n);
      EXPECT_EQ(b.n, n);
      EXPECT_EQ(b.shared_bytes, pk.packed_bytes);
      EXPECT_EQ(b.own_bytes, pk.raw_bytes);
      EXPECT_EQ(b.forked_bytes, pk.packed_bytes + size_t(n) * pk.raw_bytes);
      EXPECT_EQ(b.copies_bytes, size_t(n) * r.policy_peak_bytes);
      EXPECT_EQ(b.dense_bytes, size_t(n) * r.dense_window_bytes);
      EXPECT_EQ(b.model_forked_bytes, 3 * b.forked_bytes + size_t(n) * r.view_window_bytes);
      EXPECT_EQ(b.model_copies_bytes, size_t(n) * r.model_peak_bytes(ViewMemory::Shared));
      EXPECT_EQ(b.model_dense_bytes, size_t(n) * r.dense_model_bytes());
      EXPECT_DOUBLE_EQ(b.ratio_vs_copies(), double(b.model_copies_bytes) / double(b.model_forked_bytes));
      EXPECT_DOUBLE_EQ(b.ratio_vs_dense(), double(b.model_dense_bytes) / double(b.model_forked_bytes));
      if (pk.packed_bytes == 0) {
        EXPECT_EQ(b.forked_bytes, b.copies_bytes);  // nothing encoded: a fork copies everything
      } else {
        EXPECT_LT(b.forked_bytes, b.copies_bytes);
        EXPECT_GT(b.ratio_vs_copies(), 1.0);
      }
    }

    // The shared part is what a replay's peak step holds encoded: its packed segments
    // (refinement layers included) plus each incremental span's codebooks once; the
    // copied part its raw segments.
    // Also: no state of the steady period makes n branches hold more than the peak's
    // (the peak state holds the most raw bytes too), so the fork at the peak is the worst.
    PolicyReplay rp(s, c.args);
    size_t packed = 0, raw = 0, resident = 0, worst2 = 0, worst8 = 0;
    for (int64_t i = 0; i < r.steady_from + 2 * r.period_chunks; ++i) {
      const PolicyStep& st = rp.advance();
      if (i < r.steady_from + r.period_chunks) continue;
      worst2 = std::max(worst2, st.packed_bytes + 2 * st.raw_bytes);
      worst8 = std::max(worst8, st.packed_bytes + 8 * st.raw_bytes);
      if (st.resident_bytes <= resident) continue;
      resident = st.resident_bytes;
      packed = raw = 0;
      int64_t last_span = -1;
      for (const SegmentSize& seg : rp.segments()) {
        (seg.packed ? packed : raw) += seg.bytes();
        if (seg.span >= 0 && seg.span != last_span) packed += rp.codebook_bytes();
        last_span = seg.span;
      }
      EXPECT_EQ(st.packed_bytes, packed);
      EXPECT_EQ(st.raw_bytes, raw);
    }
    EXPECT_EQ(resident, r.policy_peak_bytes);
    EXPECT_EQ(worst2, r.branches_bytes(2));
    EXPECT_EQ(worst8, r.branches_bytes(8));
    EXPECT_EQ(r.branches(2).shared_bytes, packed);
    EXPECT_EQ(r.branches(2).own_bytes, raw);
  }
}

TEST(Memory, BranchesHandDerived) {
  // PolicyPeakSpanOneHandDerived's peak: 2 packed one-chunk spans (shared) + the kept
  // and the current chunk raw (copied): n branches hold 2 * 2 * enc(10) + n * 2 chunks.
  const MemoryReport r = memory_report(small_shape(30, 0), small_args());
  EXPECT_EQ(r.branches_bytes(1), 15888u);
  EXPECT_EQ(r.branches_bytes(3), 2 * 2 * enc_bytes(10) + 3 * 2 * kRawChunk);  // 5648 + 30720
  // The model: 3 layers, one view window (the dense window, 20480) per branch.
  EXPECT_EQ(r.model_branches_bytes(3), 3 * (5648u + 30720u) + 3 * 20480u);
  // Incremental spans of 2 with a refined chunk (PolicyReplayRefinementLayersHandDerived):
  // the shared part holds the 2 chunks' data, 2 spans' codebooks and the layers.
  QuantArgs a = small_args();
  a.span_chunks = 2;
  a.span_mode = SpanMode::Incremental;
  a.refine_recent = 1;
  a.refine_bits = 2;
  const MemoryReport ri = memory_report(small_shape(30, 0), a);
  EXPECT_EQ(ri.policy_peak_bytes, 15888u + 1800u);
  EXPECT_EQ(ri.branches(4).shared_bytes, 2 * 776u + 2 * 2048u + 1800u);
  EXPECT_EQ(ri.branches_bytes(4), 2 * 776u + 2 * 2048u + 1800u + 4 * 2 * kRawChunk);
}

TEST(Memory, BranchesOutOfRangeAreInvalidArguments) {
  const MemoryReport r = memory_report(small_shape(30, 0), small_args());
  for (const int64_t n : {int64_t(0), int64_t(-1), kMaxBranches + 1}) {
    SCOPED_TRACE(n);
    EXPECT_THROW((void)r.branches_bytes(n), InvalidArgument);
    EXPECT_THROW((void)r.model_branches_bytes(n), InvalidArgument);
    EXPECT_THROW((void)r.branches(n), InvalidArgument);
  }
  try {
    (void)r.branches_bytes(0);
    FAIL() << "n = 0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "memory model: branches n must be in 1..1048576, got 0");
  }
  EXPECT_EQ(r.branches_bytes(kMaxBranches), r.peak_step.packed_bytes + size_t(kMaxBranches) * r.peak_step.raw_bytes);
}

TEST(Memory, TypedErrors) {
  MemoryShape s = small_shape(30, 40);  // sink past the context
  EXPECT_THROW(memory_report(s, small_args()), InvalidArgument);
  s = small_shape(30, 0);
  QuantArgs a = small_args();
  a.codec.block_size = 48;  // does not divide 64
  EXPECT_THROW(memory_report(s, a), InvalidArgument);
  a = small_args();
  a.span_chunks = 0;
  EXPECT_THROW(memory_report(s, a), InvalidArgument);
  EXPECT_THROW(MemoryShape::of(find_model_preset("self-forcing-1.3b"), 0), InvalidArgument);
  s.chunk_tokens = 0;
  EXPECT_THROW(memory_report(s, small_args()), InvalidArgument);
}

}  // namespace
}  // namespace qvg
