// PackedCausalCache (spec 4).
//  * Randomized differential tests (LevelDB "Randomized" pattern): the packed
//    cache with quantization off and window == cache_size against the dense
//    cache, bit for bit, at every call; both against their independent models.
//  * window < cache_size: views against the spec 4 formula (PackedModel + the
//    history of every written value).
//  * Quantization on (int2, int4): the same sequences; raw parts bit-identical,
//    encoded parts inside the spec 1.2 bound, segments and resident bytes as
//    the independent policy model predicts.
//  * Hand-checked policy cases, warm chaining, zero-copy, transient bytes, and
//    the memory figures at Self-Forcing-like shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "support/cache_model.h"
#include "support/snapshot_fixtures.h"

using namespace qvg;
using namespace qvg::testing;

namespace {

enum class Mode { QuantOffFullWindow, QuantOffWindowed, Quantized };

struct Stats {
  int sequences = 0, calls = 0, errors = 0, copies = 0, zero_copies = 0, packed_views = 0, encoded_spans = 0;
  int resets = 0, sliced = 0;
  int incremental_chunks = 0, incremental_joins = 0, span_breaks = 0;  // incremental spans
};

void run_packed_sequence(uint64_t seed, Mode mode, int bits, Stats& st) {
  std::mt19937_64 rng(seed);
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::uniform_real_distribution<float> u(0, 1);
  ScenarioParams p;
  p.B = ri(1, 2);
  p.H = ri(1, 4);
  const int64_t dims[] = {8, 16, 32, 64};
  p.D = mode == Mode::Quantized ? dims[ri(0, 2)] : (u(rng) < 0.8f ? dims[ri(0, 1)] : dims[ri(2, 3)]);
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  p.dtype = dts[ri(0, 2)];
  p.base_chunk = ri(1, 8);
  p.vary_chunks = u(rng) < 0.6f;
  // Chunk sizes first: the sink may be a number of whole chunks.
  const int nchunks = int(ri(4, mode == Mode::Quantized ? 10 : 14));
  std::vector<int64_t> sizes;
  for (int i = 0; i < nchunks + 8; ++i)
    sizes.push_back(p.vary_chunks ? ri(std::max<int64_t>(1, p.base_chunk - 2), p.base_chunk + 2) : p.base_chunk);
  int64_t sink = 0;
  switch (ri(0, 3)) {
    case 0: sink = 0; break;
    case 1: sink = sizes[0] > 1 ? ri(1, sizes[0] - 1) : 0; break;  // inside the first chunk
    case 2: sink = sizes[0]; break;                                // one whole chunk
    default: sink = sizes[0] + sizes[1]; break;                    // two whole chunks
  }
  CacheOptions o;
  o.batch = p.B;
  o.heads = p.H;
  o.head_dim = p.D;
  o.dtype = p.dtype;
  o.sink_tokens = sink;
  const int64_t maxn = *std::max_element(sizes.begin(), sizes.end());
  o.cache_size = sink + ri(maxn, 6 * p.base_chunk + 2);
  if (mode == Mode::QuantOffWindowed || (mode == Mode::Quantized && u(rng) < 0.5f))
    o.attention_window_size = ri(std::min(o.cache_size, std::max<int64_t>(1, p.base_chunk)), o.cache_size);
  QuantArgs q;
  if (mode == Mode::Quantized) q = random_quant(rng, bits, p.D);
  const bool with_dense = o.window() == o.cache_size;
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " B=" << o.batch << " H=" << o.heads << " D=" << o.head_dim
                                    << " dtype=" << dtype_name(o.dtype) << " cs=" << o.cache_size << " sink=" << sink
                                    << " window=" << o.window() << " quant: " << q.describe());

  PackedCausalCache packed(o, q);
  DenseCausalCache dense(o);
  PackedModel pmodel(o, q);
  // Incremental spans: the adaptive boundaries depend on the data; the model replays
  // the cache's decisions (which it still checks for consistency with the policy).
  std::deque<bool> joins;
  pmodel.set_join_decision([&joins] {
    if (joins.empty()) return true;
    const bool j = joins.front();
    joins.pop_front();
    return j;
  });
  DenseModel dmodel(o);
  KVHistory hist(o.batch, o.heads, o.head_dim);
  ++st.sequences;
  size_t next = 0;
  for (int chunk = 0; chunk < nchunks; ++chunk) {
    if (chunk > 0 && u(rng) < 0.04f) {  // start over
      packed.reset_indices();
      dense.reset_indices();
      pmodel.reset();
      dmodel.reset();
      hist.clear();
      next = 0;
      ++st.resets;
      ASSERT_EQ(packed.resident_nbytes(), 0u);
      ASSERT_EQ(packed.num_segments(), 0u);
    }
    const int64_t c = pmodel.global_end();
    const int64_t n = sizes[std::min(next++, sizes.size() - 1)];
    const std::vector<Call> calls = chunk_calls(rng, p, c, n);
    for (const Call& call : calls) {
      ++st.calls;
      st.sliced += call.h_in() != o.heads;
      const auto perr = pmodel.check(call);
      const auto derr = with_dense ? dmodel.check(call) : std::nullopt;
      if (perr || derr) {
        // Not valid for both: whoever must reject it rejects it and stays unchanged;
        // nobody applies it, so the caches stay comparable.
        if (perr) {
          const auto before = qvg::detail::debug_state(packed);
          const Outcome out = run_call(packed, call);
          ASSERT_EQ(out.error, perr) << "c=" << call.c << " n=" << call.n() << " " << out.message;
          ASSERT_TRUE(qvg::detail::debug_state(packed) == before);
        }
        if (derr) {
          const auto before = qvg::detail::debug_state(dense);
          const Outcome out = run_call(dense, call);
          ASSERT_EQ(out.error, derr) << "c=" << call.c << " n=" << call.n() << " " << out.message;
          ASSERT_TRUE(qvg::detail::debug_state(dense) == before);
        }
        ++st.errors;
        break;  // skip the rest of this chunk
      }
      std::set<int64_t> packed_before;
      for (size_t i = 0; i < packed.num_segments(); ++i)
        if (packed.segment(i).packed) packed_before.insert(packed.segment(i).g0);
      const Outcome po = run_call(packed, call);
      ASSERT_FALSE(po.error) << "packed rejected c=" << call.c << " n=" << call.n() << ": " << po.message;
      joins.clear();
      for (size_t i = 0; i < packed.num_segments(); ++i) {
        const auto sg = packed.segment(i);
        if (sg.span < 0 || packed_before.count(sg.g0)) continue;
        const bool joined = i > 0 && packed.segment(i - 1).span == sg.span;
        joins.push_back(joined);
        st.incremental_chunks += 1;
        st.incremental_joins += joined;
      }
      const PackedModel::Result pr = pmodel.apply(call);
      hist.write(call);
      st.copies += !po.view.zero_copy;
      st.zero_copies += po.view.zero_copy;
      // Segments and resident bytes as the policy says.
      ASSERT_EQ(compare_segments(packed, pmodel.segments()), "") << "after c=" << call.c;
      ASSERT_EQ(packed.resident_nbytes(), pmodel.expected_resident(o.dtype));
      ASSERT_EQ(packed.global_end(), pmodel.global_end());
      ASSERT_EQ(packed.local_end(), std::min(pmodel.global_end(), o.cache_size));
      // The view: the formula of spec 4 over everything written.
      ModelView want = hist.view(pr.positions, call.head0(), call.h_in());
      want.local_start = pr.local_start;
      want.local_end = pr.local_end;
      want.visible_local_end = pr.visible_local_end;
      want.visible_global_end = pr.visible_global_end;
      if (mode != Mode::Quantized) {
        ASSERT_EQ(compare_exact(po.view, want), "") << "c=" << call.c << " hs=" << call.head0() << " h_in="
                                                    << call.h_in() << " rw=" << (call.rw ? *call.rw : -1);
      } else {
        ASSERT_EQ(po.view.k.shape, want.shape);
        ASSERT_EQ(po.view.local_start_index, pr.local_start);
        ASSERT_EQ(po.view.local_end_index, pr.local_end);
        ASSERT_EQ(po.view.visible_global_end, pr.visible_global_end);
        ASSERT_EQ(check_packed_view(packed, po.view, pr.positions, hist, call.head0()), "") << "c=" << call.c;
        for (size_t i = 0; i < packed.num_segments(); ++i) {
          const auto s = packed.segment(i);
          if (s.packed && s.g1 > pr.positions.front()) st.packed_views += 1;
        }
      }
      if (po.view.zero_copy) {  // a zero-copy view lies inside the current raw chunk
        const auto cur = packed.segment(packed.num_segments() - 1);
        const auto* base = static_cast<const std::byte*>(cur.k_raw.data);
        const auto* vp = static_cast<const std::byte*>(po.view.k.data);
        ASSERT_TRUE(cur.current && vp >= base && vp < base + size_t(cur.k_raw.shape.numel()) * dtype_size(o.dtype));
      } else {
        ASSERT_GE(packed.peak_transient_nbytes(), 2 * size_t(po.view.k.shape.numel()) * dtype_size(o.dtype));
      }
      if (with_dense) {
        const Outcome d = run_call(dense, call);
        ASSERT_FALSE(d.error) << d.message;
        const ModelView dm = dmodel.apply(call);
        ASSERT_EQ(compare_exact(d.view, dm), "");
        ASSERT_EQ(d.view.visible_local_end, po.view.visible_local_end);
        ASSERT_EQ(d.view.visible_global_end, po.view.visible_global_end);
        ASSERT_EQ(d.view.k.shape, po.view.k.shape);  // views have the dense shapes
        if (mode != Mode::Quantized) {
          ASSERT_EQ(compare_views(po.view, d.view), "") << "packed != dense at c=" << call.c;
        }
      }
    }
  }
  st.encoded_spans += pmodel.encodings();
  st.span_breaks += int(packed.span_breaks());
}

void run_many(Mode mode, int bits, int count, uint64_t seed0, const char* name) {
  Stats st;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    run_packed_sequence(seed0 + uint64_t(i), mode, bits, st);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%s: %d sequences, %d calls (%d head-sliced), %d rejected as predicted, %d copied views, %d zero-copy views, "
      "%d spans encoded, %d resets; incremental spans: %d chunks, %d joined their span, %d adaptive breaks; %.1f s\n",
      name, st.sequences, st.calls, st.sliced, st.errors, st.copies, st.zero_copies, st.encoded_spans, st.resets,
      st.incremental_chunks, st.incremental_joins, st.span_breaks, secs);
  EXPECT_GT(st.copies, 0);
  EXPECT_GT(st.zero_copies, 0);
  if (mode == Mode::Quantized) {
    EXPECT_GT(st.encoded_spans, 0);
    EXPECT_GT(st.incremental_joins, 0);
    EXPECT_GT(st.incremental_chunks, st.incremental_joins);
  }
}

}  // namespace

TEST(PackedCache, DifferentialQuantOffEqualsDenseBitForBit) {
  run_many(Mode::QuantOffFullWindow, 0, scaled(2000, 200), 1, "quant off, window == cache_size");
}

TEST(PackedCache, WindowSmallerThanCacheMatchesFormula) {
  run_many(Mode::QuantOffWindowed, 0, scaled(1000, 100), 100001, "quant off, window <= cache_size");
}

TEST(PackedCache, QuantizedInt4WithinCodecBound) {
  run_many(Mode::Quantized, 4, scaled(400, 40), 200001, "int4");
}

TEST(PackedCache, QuantizedInt2WithinCodecBound) {
  run_many(Mode::Quantized, 2, scaled(400, 40), 300001, "int2");
}

// ---------------------------------------------------------------------------
// Hand-checked policy cases.

namespace {

CacheOptions small_opts(int64_t cs, int64_t sink = 0, std::optional<int64_t> window = std::nullopt) {
  CacheOptions o;
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 8;
  o.dtype = DType::F32;
  o.cache_size = cs;
  o.sink_tokens = sink;
  o.attention_window_size = window;
  return o;
}

/// qvg::testing::small_quant() with one stage of one k-means iteration, random init and
/// the default recent chunks kept raw.
QuantArgs one_stage_quant() {
  const QuantArgs d;
  QuantArgs q = qvg::testing::small_quant();
  q.codec.stages = d.codec.stages;
  q.codec.kmeans_iters = 1;
  q.codec.init = d.codec.init;
  q.keep_recent_chunks = d.keep_recent_chunks;
  return q;
}

/// Segments as a compact string: "[0,2)sPx1 [2,4)Rx1 ..." (s = sink, P/R = packed/raw).
std::string seg_string(const PackedCausalCache& c) {
  std::string s;
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto g = c.segment(i);
    s += (s.empty() ? "" : " ") + std::to_string(g.g0) + "," + std::to_string(g.g1) + (g.is_sink ? "s" : "") +
         (g.packed ? "P" : "R") + std::to_string(g.chunks);
  }
  return s;
}

KVView advance(PackedCausalCache& c, std::mt19937_64& rng, int64_t n, std::optional<int64_t> rw = std::nullopt) {
  Tensor k = random_tensor(rng, DType::F32, {1, n, 2, 8}), v = random_tensor(rng, DType::F32, {1, n, 2, 8});
  return c.update(k, v, c.global_end(), std::nullopt, rw);
}

}  // namespace

// Adaptive span boundaries (docs/spans.md) against an energy computed here, from the
// data and the cache's stored encodings, not by the cache or the codec. A chunk's
// energy is the mean over its elements of the squared final residual, x minus its
// centroid by its stored id in its span's codebook (one stage); a span's reference is
// its first chunk's energy. A chunk that joined its span must have K and V energies
// within span_break_ratio x the references; a chunk that started a new span although
// the open one had room must not have fitted: its energy against the open span's slots
// (those its chunks use; the trial's new slots can only lower it, one stage being a
// nearest-slot assignment) exceeds the ratio for K or V — so a wrong energy, a wrong
// reference or a wrong comparison fails one of them.
namespace span_energy {

/// [t, h, d] residual energy of x (a [1, S, H, D] chunk) against `book` with the
/// stored ids of `part` (stage 0), in double.
double stored_energy(const Tensor& x, const EncodedTensor& part, const EncodedTensor& book) {
  const Shape4 s = x.shape();
  double e = 0;
  for (int64_t h = 0; h < s.h; ++h)
    for (int64_t t = 0; t < s.s; ++t) {
      const int id = part.ids[0][size_t(h * s.s + t)];
      for (int64_t d = 0; d < s.d; ++d) {
        const double r = double(x.at(0, t, h, d)) - double(book.centroid_at(0, 0, h, id, d));
        e += r * r;
      }
    }
  return e / double(s.numel());
}

/// The same with every token at its nearest of `slots` (per head) of `book`.
double nearest_energy(const Tensor& x, const EncodedTensor& book, const std::vector<std::set<int>>& slots) {
  const Shape4 s = x.shape();
  double e = 0;
  for (int64_t h = 0; h < s.h; ++h)
    for (int64_t t = 0; t < s.s; ++t) {
      double best = INFINITY;
      for (int k : slots[size_t(h)]) {
        double dist = 0;
        for (int64_t d = 0; d < s.d; ++d) {
          const double r = double(x.at(0, t, h, d)) - double(book.centroid_at(0, 0, h, k, d));
          dist += r * r;
        }
        best = std::min(best, dist);
      }
      e += best;
    }
  return e / double(s.numel());
}

}  // namespace span_energy

TEST(PackedCachePolicy, AdaptiveSpanBreaksFollowTheEnergyComputedIndependently) {
  using namespace span_energy;
  constexpr int64_t kChunk = 32, kHeads = 2, kDim = 32, kChunks = 18;
  CacheOptions o;
  o.heads = kHeads, o.head_dim = kDim, o.dtype = DType::F32, o.cache_size = kChunk * (kChunks + 1);
  QuantArgs q;  // incremental spans of 4 chunks, broken where a chunk's energy passes 3x
  q.enable(2), q.codec.centroids = 8, q.codec.block_size = 32, q.keep_recent_chunks = 0;
  q.span_chunks = 4, q.span_mode = SpanMode::Incremental, q.span_break_ratio = 3.0;
  PackedCausalCache cache(o, q);
  // Scenes of 1-5 chunks: tokens near a scene's 3 centres (per head) with noise; a
  // new scene moves every centre, K and V alike or one of them only.
  std::mt19937_64 rng(17);
  std::normal_distribution<float> nd(0, 1);
  const int scene_of[kChunks] = {0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 3, 4, 5, 5, 6, 6, 6, 7};
  std::vector<std::vector<float>> centres;  // per scene: [role][head][3][D]
  for (int sc = 0; sc < 8; ++sc) {
    std::vector<float> c(size_t(2 * kHeads * 3 * kDim));
    for (float& x : c) x = 3.0f * nd(rng);
    centres.push_back(c);
  }
  std::vector<Tensor> ks, vs;
  for (int64_t i = 0; i < kChunks; ++i) {
    Tensor k(DType::F32, {1, kChunk, kHeads, kDim}), v(DType::F32, {1, kChunk, kHeads, kDim});
    const std::vector<float>& c = centres[size_t(scene_of[i])];
    // Scene 3 moves V only (K keeps scene 2's centres): a break for V's sake.
    const std::vector<float>& ck = scene_of[i] == 3 ? centres[2] : c;
    for (int64_t t = 0; t < kChunk; ++t)
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t m = int64_t(rng() % 3);
        for (int64_t d = 0; d < kDim; ++d) {
          k.set(0, t, h, d, ck[size_t(((0 * kHeads + h) * 3 + m) * kDim + d)] + 0.3f * nd(rng));
          v.set(0, t, h, d, c[size_t(((1 * kHeads + h) * 3 + m) * kDim + d)] + 0.3f * nd(rng));
        }
      }
    cache.update(k.view(), v.view(), i * kChunk);
    ks.push_back(std::move(k));
    vs.push_back(std::move(v));
  }
  // Walk the encoded chunks (oldest first); segment j holds chunk g0 / kChunk.
  int joins = 0, breaks_checked = 0, breaks = 0;
  std::map<int64_t, std::pair<double, double>> reference;          // span -> (K, V) energy of its first chunk
  std::map<int64_t, int> chunks_in;                                // span -> chunks
  std::map<int64_t, std::vector<std::set<int>>> k_slots, v_slots;  // span -> slots its chunks use, per head
  for (size_t j = 0; j < cache.num_segments(); ++j) {
    const auto sg = cache.segment(j);
    if (sg.span < 0) continue;
    ASSERT_EQ(sg.g1 - sg.g0, kChunk);
    const int64_t i = sg.g0 / kChunk;
    const double ek = stored_energy(ks[size_t(i)], *sg.k_enc, *sg.k_codebook);
    const double ev = stored_energy(vs[size_t(i)], *sg.v_enc, *sg.v_codebook);
    const bool joined = j > 0 && cache.segment(j - 1).span == sg.span;
    if (joined) {
      const auto [rk, rv] = reference.at(sg.span);
      EXPECT_LE(std::max(ek / rk, ev / rv), q.span_break_ratio * (1 + 1e-6))
          << "chunk " << i << " joined span " << sg.span << " with energies " << ek << ", " << ev << " against its "
          << "first chunk's " << rk << ", " << rv;
      ++joins;
    } else {
      reference[sg.span] = {ek, ev};
      ++breaks;
      // It could have joined the previous span (adjacent, room left): it must not have fitted it.
      if (j > 0) {
        const auto prev = cache.segment(j - 1);
        if (prev.span >= 0 && prev.g1 == sg.g0 && chunks_in[prev.span] < q.span_chunks) {
          const auto [rk, rv] = reference.at(prev.span);
          const double tk = nearest_energy(ks[size_t(i)], *prev.k_codebook, k_slots[prev.span]);
          const double tv = nearest_energy(vs[size_t(i)], *prev.v_codebook, v_slots[prev.span]);
          EXPECT_GT(std::max(tk / rk, tv / rv), q.span_break_ratio * (1 - 1e-6))
              << "chunk " << i << " started a new span although against span " << prev.span
              << "'s codebook its energies " << tk << ", " << tv << " are within " << q.span_break_ratio
              << " x the references " << rk << ", " << rv;
          ++breaks_checked;
        }
      }
    }
    ++chunks_in[sg.span];
    for (auto* m : {&k_slots, &v_slots}) {
      auto& slots = (*m)[sg.span];
      slots.resize(size_t(kHeads));
      const EncodedTensor& part = m == &k_slots ? *sg.k_enc : *sg.v_enc;
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t t = 0; t < kChunk; ++t) slots[size_t(h)].insert(part.ids[0][size_t(h * kChunk + t)]);
    }
  }
  std::printf("[ spans   ] %d joins and %d adaptive breaks checked against the energies; %d spans\n", joins,
              breaks_checked, breaks);
  // Every span but those a full span ended was an adaptive break, and the cache counted each.
  EXPECT_EQ(breaks_checked, cache.span_breaks());
  EXPECT_GE(joins, 6);
  EXPECT_GE(breaks_checked, 4);
  EXPECT_GT(breaks, breaks_checked);  // spans ended by being full too
}

TEST(PackedCachePolicy, SpansFillOldestFirstAndKeepRecentStaysRaw) {
  QuantArgs q = one_stage_quant();
  q.span_chunks = 2;
  q.keep_recent_chunks = 1;
  PackedCausalCache c(small_opts(100), q);
  std::mt19937_64 rng(1);
  advance(c, rng, 2);
  advance(c, rng, 2);
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2R1 2,4R1 4,6R1");  // one eligible chunk: span not full
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,4P2 4,6R1 6,8R1");
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,4P2 4,6R1 6,8R1 8,10R1");
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,4P2 4,8P2 8,10R1 10,12R1");
}

TEST(PackedCachePolicy, SinkChunkSpansAndSinkKeep) {
  QuantArgs q = one_stage_quant();
  q.sink_keep_chunks = 1;
  q.keep_recent_chunks = 0;
  PackedCausalCache c(small_opts(100, 6), q);
  std::mt19937_64 rng(2);
  advance(c, rng, 2);
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2sR1 2,4sR1");  // the first sink chunk is kept raw
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2sR1 2,4sP1 4,6sR1");  // sink_span = chunk: packed once finalized
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2sR1 2,4sP1 4,6sP1 6,8R1");
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2sR1 2,4sP1 4,6sP1 6,8P1 8,10R1");
}

TEST(PackedCachePolicy, SinkSpanFullPacksAllSinkChunksAtTheFirstNonSinkAdvance) {
  QuantArgs q = one_stage_quant();
  q.sink_span = SinkSpan::Full;
  q.span_chunks = 3;  // ignored for sinks
  PackedCausalCache c(small_opts(100, 5), q);  // sink inside the third chunk
  std::mt19937_64 rng(3);
  advance(c, rng, 2);
  advance(c, rng, 2);
  advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2sR1 2,4sR1 4,6sR1");
  advance(c, rng, 2);  // c = 6 >= sink_tokens: every sink chunk finalized
  EXPECT_EQ(seg_string(c), "0,6sP3 6,8R1");
}

TEST(PackedCachePolicy, SinkOffKeepsSinkRaw) {
  QuantArgs q = one_stage_quant();
  q.sink = false;
  q.keep_recent_chunks = 0;
  PackedCausalCache c(small_opts(100, 2), q);
  std::mt19937_64 rng(4);
  for (int i = 0; i < 4; ++i) advance(c, rng, 2);
  EXPECT_EQ(seg_string(c), "0,2sR1 2,4P1 4,6P1 6,8R1");
}

TEST(PackedCachePolicy, EvictionDropsWholeSegmentsOnly) {
  QuantArgs q = one_stage_quant();
  q.span_chunks = 2;
  q.keep_recent_chunks = 0;
  // window 7 = sink 1 + 6 tail tokens.
  PackedCausalCache c(small_opts(7, 1), q);
  std::mt19937_64 rng(5);
  advance(c, rng, 1);  // sink chunk [0, 1)
  for (int i = 0; i < 6; ++i) advance(c, rng, 2);
  // ge = 13, tail_start = 7: span [1, 5) dropped; [5, 9) straddles and stays.
  EXPECT_EQ(seg_string(c), "0,1sP1 5,9P2 9,11R1 11,13R1");
  KVView v = advance(c, rng, 2);  // ge = 15, tail = 9: [5, 9) dropped
  EXPECT_EQ(seg_string(c), "0,1sP1 9,13P2 13,15R1");
  EXPECT_EQ(v.k.shape.s, 7);
  EXPECT_FALSE(v.zero_copy);
}

TEST(PackedCachePolicy, WindowTooSmallForAFullSpanPacksNothing) {
  QuantArgs q = one_stage_quant();
  q.span_chunks = 4;
  q.keep_recent_chunks = 1;
  PackedCausalCache c(small_opts(8), q);  // 4 chunks of 2 visible: never 4 eligible at once
  std::mt19937_64 rng(6);
  for (int i = 0; i < 20; ++i) {
    advance(c, rng, 2);
    for (size_t s = 0; s < c.num_segments(); ++s) ASSERT_FALSE(c.segment(s).packed);
  }
}

TEST(PackedCachePolicy, WarmInitChainsCodebooksPerTensor) {
  QuantArgs q = one_stage_quant();
  q.codec.init = Init::Warm;
  q.keep_recent_chunks = 0;
  q.codec.kmeans_iters = 2;
  PackedCausalCache c(small_opts(100), q);
  std::mt19937_64 rng(7);
  std::vector<Tensor> ks, vs;
  for (int i = 0; i < 4; ++i) {
    ks.push_back(random_tensor(rng, DType::F32, {1, 6, 2, 8}));
    vs.push_back(random_tensor(rng, DType::F32, {1, 6, 2, 8}));
    c.update(ks.back(), vs.back(), c.global_end());
  }
  // Expected chain: the first encoding random, each next one warm from the previous (same tensor).
  CodecConfig cfg = q.codec;
  EncodedTensor k0 = encode(ks[0], cfg), v0 = encode(vs[0], cfg);
  EncodedTensor k1 = encode(ks[1], cfg, &k0), v1 = encode(vs[1], cfg, &v0);
  EncodedTensor k2 = encode(ks[2], cfg, &k1), v2 = encode(vs[2], cfg, &v1);
  ASSERT_EQ(c.num_segments(), 4u);
  EXPECT_TRUE(*c.segment(0).k_enc == k0);
  EXPECT_TRUE(*c.segment(0).v_enc == v0);
  EXPECT_TRUE(*c.segment(1).k_enc == k1);
  EXPECT_TRUE(*c.segment(2).k_enc == k2);
  EXPECT_TRUE(*c.segment(2).v_enc == v2);
  EXPECT_GT(c.warm_state_nbytes(), 0u);
  // After a reset the chain starts over with random init.
  c.reset_indices();
  EXPECT_EQ(c.warm_state_nbytes(), 0u);
  EXPECT_FALSE(c.chunk_tokens().has_value());
  c.update(ks[2], vs[2], 0);
  c.update(ks[3], vs[3], 6);
  EXPECT_TRUE(*c.segment(0).k_enc == encode(ks[2], cfg));
}

// Refinement layers (QuantArgs::refine_recent) are an addition only: a cache with
// them holds exactly the base encodings and codebooks of one without, shows the
// same rows for every chunk that holds no layer, and lower error on those that do.
TEST(PackedCachePolicy, RefinementLeavesTheBaseEncodingsAsWithout) {
  for (const int refine_bits : {2, 4}) {
    QuantArgs q = one_stage_quant();
    q.enable(2);
    q.span_chunks = 3;
    q.span_mode = SpanMode::Incremental;
    q.keep_recent_chunks = 1;
    QuantArgs qr = q;
    qr.refine_recent = 2;
    qr.refine_bits = refine_bits;
    CacheOptions o = small_opts(60, 6);
    o.dtype = DType::BF16;
    o.head_dim = 16;
    PackedCausalCache plain(o, q), refined(o, qr);
    std::mt19937_64 rng(11);
    double err_plain = 0, err_refined = 0;
    int refined_rows = 0;
    std::vector<Tensor> ks, vs;  // every chunk written, by index (chunks of 6 tokens)
    for (int i = 0; i < 12; ++i) {
      ks.push_back(random_tensor(rng, DType::BF16, {1, 6, 2, 16}));
      vs.push_back(random_tensor(rng, DType::BF16, {1, 6, 2, 16}));
      const KVView a = plain.update(ks.back(), vs.back(), 6 * i);
      const KVView b = refined.update(ks.back(), vs.back(), 6 * i);
      ASSERT_EQ(plain.num_segments(), refined.num_segments());
      std::set<int64_t> refined_starts;
      int layers = 0;
      for (size_t s = 0; s < plain.num_segments(); ++s) {
        const auto pa = plain.segment(s), pb = refined.segment(s);
        ASSERT_EQ(pa.g0, pb.g0);
        ASSERT_EQ(pa.packed, pb.packed);
        ASSERT_EQ(pa.k_ref, nullptr);
        if (!pa.packed) continue;
        EXPECT_TRUE(*pa.k_enc == *pb.k_enc && *pa.v_enc == *pb.v_enc) << "chunk " << i << " segment " << s;
        if (pa.k_codebook) {
          EXPECT_TRUE(*pa.k_codebook == *pb.k_codebook && *pa.v_codebook == *pb.v_codebook);
        }
        if (pb.k_ref) {
          refined_starts.insert(pb.g0);
          ++layers;
          EXPECT_EQ(pb.nbytes, pa.nbytes + pb.k_ref->nbytes() + pb.v_ref->nbytes());
        }
      }
      EXPECT_LE(layers, 2);
      EXPECT_EQ(refined.resident_nbytes() - plain.resident_nbytes(), [&] {
        size_t n = 0;
        for (size_t s = 0; s < refined.num_segments(); ++s)
          if (refined.segment(s).k_ref) n += refined.segment(s).k_ref->nbytes() + refined.segment(s).v_ref->nbytes();
        return n;
      }());
      // The view: the sink (tokens 0..5) then the window's tail, one row per token.
      ASSERT_TRUE(a.k.shape == b.k.shape);
      const int64_t T = a.k.shape.s, ge = refined.global_end();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t g = t < 6 ? t : ge - (T - t);
        const bool in_layer = refined_starts.count(g - g % 6) > 0;
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t d = 0; d < 16; ++d) {
            const float x = ks[size_t(g / 6)].at(0, g % 6, h, d);
            const float pk = a.k.at(0, t, h, d), rk = b.k.at(0, t, h, d);
            if (!in_layer) {
              ASSERT_EQ(pk, rk) << "chunk " << i << " token " << g;
              continue;
            }
            err_plain += double(pk - x) * double(pk - x);
            err_refined += double(rk - x) * double(rk - x);
          }
        refined_rows += in_layer;
      }
    }
    EXPECT_GT(refined_rows, 0);
    // Refined rows: the int2 base's squared error reduced by the layer (measured on
    // this data: to 0.18x with bits 2, 0.004x with bits 4; asserted with margin).
    EXPECT_LT(err_refined, err_plain * (refine_bits == 4 ? 0.02 : 0.3))
        << "refine_bits " << refine_bits << " plain " << err_plain;
  }
}

TEST(PackedCachePolicy, ZeroCopyInsideTheCurrentChunkAndTransientBytes) {
  QuantArgs q = one_stage_quant();
  q.span_chunks = 2;
  q.keep_recent_chunks = 0;
  PackedCausalCache c(small_opts(100), q);
  std::mt19937_64 rng(8);
  KVView v = advance(c, rng, 4);
  EXPECT_TRUE(v.zero_copy);  // the first chunk is the whole view
  EXPECT_EQ(c.peak_transient_nbytes(), 0u);
  EXPECT_EQ(c.chunk_tokens(), 4);
  v = advance(c, rng, 4, 0);  // rw = 0: only the chunk itself
  EXPECT_TRUE(v.zero_copy);
  EXPECT_EQ(v.k.shape.s, 4);
  EXPECT_EQ(v.local_start_index, 0);
  v = advance(c, rng, 4);  // [0, 12), copied
  EXPECT_FALSE(v.zero_copy);
  const size_t view_bytes = 2 * size_t(12 * 2 * 8) * 4;
  EXPECT_EQ(c.peak_transient_nbytes(), view_bytes);
  // This advance packs the span [0, 8): concatenated K (8 tokens) + encoded K and V.
  EXPECT_EQ(seg_string(c), "0,8P2 8,12R1");
  const auto span = c.segment(0);
  const size_t concat = size_t(8 * 2 * 8) * 4;
  EXPECT_GE(c.peak_transient_nbytes(), span.k_enc->nbytes() + span.v_enc->nbytes() + concat - 0);
  // A rewrite step with the same view shape reuses the view buffer.
  Tensor k = random_tensor(rng, DType::F32, {1, 4, 2, 8});
  v = c.update(k, k, 8);
  EXPECT_EQ(c.peak_transient_nbytes(), view_bytes);
  EXPECT_EQ(c.resident_nbytes(), span.nbytes + 2 * size_t(4 * 2 * 8) * 4);
}

// ---------------------------------------------------------------------------
// Memory at Self-Forcing-like shapes, reduced to 2 heads: chunk 3 frames x 1560
// tokens, window 21 frames, sink 1 chunk, head_dim 128, bf16, int2, centroids 256,
// block 64 (spec 2 defaults otherwise: keep_recent 1, sink on, sink_span chunk).

namespace {

void memory_run(int span_chunks) {
  const int64_t tpf = scaled(1560, 156), chunk = 3 * tpf, window = 21 * tpf;
  CacheOptions o;
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 128;
  o.dtype = DType::BF16;
  o.cache_size = window;
  o.sink_tokens = chunk;
  QuantArgs q;
  q.enable(2);
  q.codec.centroids = 256;
  q.codec.block_size = 64;
  q.span_chunks = span_chunks;
  PackedCausalCache packed(o, q);
  PackedModel model(o, q);
  const size_t dense_bytes = DenseCausalCache(o).resident_nbytes();
  std::mt19937_64 rng(11);
  // Clustered K/V (32 centres + noise), as real K/V are.
  std::vector<Tensor> centres;
  for (int i = 0; i < 32; ++i) centres.push_back(random_tensor(rng, DType::F32, {1, 1, 2, 128}, 2.0f));
  std::normal_distribution<float> noise(0.0f, 0.15f);
  std::uniform_int_distribution<int> pick(0, 31);
  auto make = [&]() {
    Tensor t(DType::BF16, {1, chunk, 2, 128});
    for (int64_t s = 0; s < chunk; ++s) {
      const Tensor& c = centres[size_t(pick(rng))];
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 128; ++d) t.set(0, s, h, d, c.at(0, 0, h, d) + noise(rng));
    }
    return t;
  };
  const int chunks = 7 + (span_chunks == 1 ? 4 : 2 * span_chunks + 1);  // window full, then a full period
  double first_full = -1, lo = 1e9, hi = 0;
  size_t peak_transient = 0;
  std::printf("span_chunks=%d (tokens/frame %lld, chunk %lld tokens, window %lld tokens, dense %.2f MiB)\n",
              span_chunks, (long long)tpf, (long long)chunk, (long long)window, double(dense_bytes) / 1048576.0);
  for (int i = 0; i < chunks; ++i) {
    Tensor k = make(), v = make();
    Call call;
    call.c = packed.global_end();
    call.k = k;
    call.v = v;
    ASSERT_FALSE(model.check(call));
    model.apply(call);
    const auto t0 = std::chrono::steady_clock::now();
    KVView view = packed.update(k, v, call.c);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(packed.resident_nbytes(), model.expected_resident(o.dtype));
    const double ratio = double(packed.resident_nbytes()) / double(dense_bytes);
    peak_transient = std::max(peak_transient, packed.peak_transient_nbytes());
    std::printf("  chunk %2d: global_end %6lld  resident %7.2f MiB  packed/dense %.3f  transient peak %6.2f MiB "
                "(view %s)  %6.0f ms  segments %s\n",
                i, (long long)packed.global_end(), double(packed.resident_nbytes()) / 1048576.0, ratio,
                double(packed.peak_transient_nbytes()) / 1048576.0, view.zero_copy ? "zero-copy" : "copied", ms,
                seg_string(packed).c_str());
    if (packed.global_end() >= window) {
      if (first_full < 0) first_full = ratio;
      lo = std::min(lo, ratio);
      hi = std::max(hi, ratio);
    }
  }
  std::printf("span_chunks=%d: packed/dense once the window is full: %.3f (first), min %.3f, max %.3f; largest "
              "transient peak of a call %.2f MiB = %.3f of the dense cache\n",
              span_chunks, first_full, lo, hi, double(peak_transient) / 1048576.0,
              double(peak_transient) / double(dense_bytes));
  EXPECT_GT(lo, 0.0);
  // The view of a full window is materialized: at most K+V of the window in bf16
  // plus encode scratch (a span's concatenated input and its encoding).
  EXPECT_LE(peak_transient, dense_bytes + dense_bytes / 2);
  if (small_scale()) return;  // at the reduced sanitizer scale the 256-entry codebooks dominate: no ratio bounds
  if (span_chunks == 1) {
    EXPECT_LT(hi, 0.5);
  } else {
    // Up to span_chunks - 1 eligible chunks wait raw for their span to fill.
    EXPECT_LT(lo, 0.5);
    EXPECT_LT(hi, 0.9);
  }
}

}  // namespace

TEST(PackedCacheMemory, SelfForcingShapesSpan1) { memory_run(1); }
TEST(PackedCacheMemory, SelfForcingShapesSpan4) { memory_run(4); }

TEST(PackedCachePolicy, HeadsNotWrittenInANewChunkAreZeros) {
  CacheOptions o = small_opts(100);
  PackedCausalCache c(o);
  std::mt19937_64 rng(9);
  Tensor k = random_tensor(rng, DType::F32, {1, 3, 1, 8}), v = random_tensor(rng, DType::F32, {1, 3, 1, 8});
  KVView view = c.update(k, v, 0, 1);  // writes head 1 only
  EXPECT_EQ(view.k.shape, (Shape4{1, 3, 1, 8}));
  EXPECT_EQ(view.k.at(0, 2, 0, 5), k.at(0, 2, 0, 5));
  const auto seg = c.segment(0);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t d = 0; d < 8; ++d) {
      EXPECT_EQ(seg.k_raw.at(0, t, 0, d), 0.0f);
      EXPECT_EQ(seg.v_raw.at(0, t, 0, d), 0.0f);
      EXPECT_EQ(seg.k_raw.at(0, t, 1, d), k.at(0, t, 0, d));
    }
  // The other head in a second call of the same step: a rewrite of the current chunk.
  view = c.update(k, v, 0, 0);
  EXPECT_EQ(c.segment(0).k_raw.at(0, 1, 0, 3), k.at(0, 1, 0, 3));
  EXPECT_EQ(c.global_end(), 3);
}

// Two layers' caches sharing one ViewScratch: identical views to unshared caches,
// one window of view memory for both, and the documented lifetime (a shared
// view is overwritten by the other cache's next update).
TEST(PackedCacheScratch, SharedViewScratchAcrossLayers) {
  std::mt19937_64 rng(77);
  CacheOptions o = small_opts(24, 4);
  auto shared = std::make_shared<ViewScratch>();
  CacheOptions os = o;
  os.view_scratch = shared;
  QuantArgs q = one_stage_quant();
  PackedCausalCache a(o, q), b(o, q), as(os, q), bs(os, q);
  for (int64_t c = 0; c < 48; c += 4) {
    Tensor ka = random_tensor(rng, o.dtype, {o.batch, 4, o.heads, o.head_dim});
    Tensor va = random_tensor(rng, o.dtype, {o.batch, 4, o.heads, o.head_dim});
    Tensor kb = random_tensor(rng, o.dtype, {o.batch, 4, o.heads, o.head_dim});
    Tensor vb = random_tensor(rng, o.dtype, {o.batch, 4, o.heads, o.head_dim});
    for (int step = 0; step < 2; ++step) {
      const Tensor ra = a.update(ka, va, c).k.to_tensor();
      const KVView sa = as.update(ka, va, c);
      const Tensor sa_k = sa.k.to_tensor();
      ASSERT_EQ(std::memcmp(ra.data(), sa_k.data(), ra.nbytes()), 0) << "layer a, chunk at " << c;
      const Tensor rb = b.update(kb, vb, c).k.to_tensor();
      const KVView sb = bs.update(kb, vb, c);
      ASSERT_EQ(std::memcmp(rb.data(), sb.k.to_tensor().data(), rb.nbytes()), 0) << "layer b, chunk at " << c;
      if (!sa.zero_copy && !sb.zero_copy) {
        // Both copied views live in the one shared buffer.
        EXPECT_EQ(sa.k.data, sb.k.data);
        EXPECT_LE(shared->size(), 2 * size_t(o.batch * 24 * o.heads * o.head_dim) * dtype_size(o.dtype));
      }
    }
  }
}
