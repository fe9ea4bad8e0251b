// Host-side test of the packed caches' bookkeeping (no GPU needed):
// CachePolicy (src/cache/cache_policy.h) — the policy qvg::PackedCausalCache,
// qvg::cuda::PackedCausalCache and the memory model all run — driven with an empty
// payload (as the device cache drives it: plan, apply, view pieces, no bytes) against the
// independent model of spec 4 in tests/support/cache_model (PackedModel, which
// restates the spec per chunk with none of the library's code) over random call
// sequences:
// - the same calls are accepted, and rejected ones with the same error kind
//   (argument errors the model does not restate are generated on purpose and must
//   be InvalidArgument);
// - after every call the same segment list (g0, g1, is_sink, packed, chunks) and
//   global_end;
// - the view: the global token at every view position, as the device cache places
//   it (raw and packed pieces of the plan's view pieces, then the call's chunk), equals the
//   model's list of visible positions, and the indices are the model's;
// What this cannot check: the device copies, encodes and decodes themselves
// (tests/gpu/gpu_tests.cpp, on a GPU) and the device cache's argument errors
// (tests/gpu/device_errors_test.cpp, host-only, built with the CUDA backend).
// A GoogleTest test built by the `ci` preset (no nvcc needed): it uses only the
// host policy and the test model.
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "cache/cache_policy.h"
#include "cache/packed_state_transfer.h"
#include "cache/snapshot_io.h"
#include "cache/snapshot_records.h"
#include "gpu/call_kind.h"
#include "qvg/cache.h"
#include "qvg/error.h"
#include "support/cache_model.h"
#include "support/data.h"

namespace {

struct Empty {};
using Policy = qvg::detail::CachePolicy<Empty>;
using qvg::testing::PackedModel;

using Kind = qvg::testing::CallKind;
using qvg::testing::call_kind_name;

std::string describe(const qvg::CacheOptions& o, const qvg::QuantArgs& q) {
  return "B=" + std::to_string(o.batch) + " cap=" + std::to_string(o.cache_size) + " H=" + std::to_string(o.heads) +
         " sink=" + std::to_string(o.sink_tokens) + " window=" + std::to_string(o.window()) + " " + q.describe();
}

std::string segs_str(const std::vector<PackedModel::Seg>& v) {
  std::string r;
  for (const auto& s : v)
    r += fmt::format("[{},{}){}{}x{}{} ", s.g0, s.g1, s.sink ? "s" : "", s.packed ? "P" : "R", s.chunks,
                     s.joins_prev ? "+" : "");
  return r;
}

/// What the random sequences exercised (printed, and checked to be non-trivial).
struct Coverage {
  int rejected = 0, copied_views = 0, zero_copy_views = 0, packed_segments = 0, multi_chunk_spans = 0, sink_spans = 0,
      head_slices = 0;
};
Coverage coverage;

/// One random configuration, one random call sequence; returns the number of calls accepted.
int run_sequence(uint32_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  qvg::CacheOptions o;
  o.batch = pick(1, 2);
  o.heads = pick(1, 3);
  o.head_dim = 8;
  o.dtype = qvg::DType::F32;
  o.cache_size = pick(3, 40);
  o.sink_tokens = pick(0, 2) == 0 ? 0 : pick(0, o.cache_size / 2);
  if (pick(0, 2) == 0) o.attention_window_size = pick(1, o.cache_size);
  qvg::QuantArgs q;
  if (pick(0, 3) != 0) {
    q.enable(pick(0, 1) ? 2 : 4);
    q.codec.centroids = 4;
    q.codec.block_size = 8;
    q.codec.kmeans_iters = 1;
    q.keep_recent_chunks = int(pick(0, 2));
    q.sink = pick(0, 3) != 0;
    q.sink_span = pick(0, 1) ? qvg::SinkSpan::Chunk : qvg::SinkSpan::Full;
    q.sink_keep_chunks = int(pick(0, 2));
    q.span_chunks = int(pick(1, 3));
    if (pick(0, 2) == 0) q.span_mode = qvg::SpanMode::Incremental;
  }
  const std::string what = "seed " + std::to_string(seed) + ": " + describe(o, q);
  PackedModel model(o, q);
  Policy pol(o, q);
  const int64_t B = o.batch, H = o.heads, D = o.head_dim, cap = o.cache_size;
  int accepted = 0;
  const int calls = int(pick(10, 60));
  for (int call = 0; call < calls; ++call) {
    if (pick(0, 40) == 0) {
      pol.reset();
      model.reset();
      continue;
    }
    // The call: mostly valid advances and rewrites, some invalid ones.
    const auto& segs = pol.segments();
    const int64_t ge = pol.global_end();
    const int action = int(pick(0, 19));
    int64_t c = ge, n = pick(1, std::max<int64_t>(1, cap / 3));
    if (action < 6 && !segs.empty()) {  // rewrite (a denoising step)
      c = segs.back().g0;
      n = segs.back().tokens();
      if (action == 0) n += pick(-1, 1);
    } else if (action == 6) {
      c = pick(0, ge + 3);
    } else if (action == 7) {
      n = pick(1, cap + 2);
    }
    n = std::max<int64_t>(n, 1);
    qvg::testing::Call cl;
    cl.c = c;
    int64_t h_in = H;
    bool bad_args = false;  // an argument error the model does not restate
    if (pick(0, 3) == 0) {
      h_in = pick(1, H);
      cl.hs = pick(0, H - h_in);
      if (pick(0, 15) == 0) {
        cl.hs = pick(-1, H);
        bad_args = *cl.hs < 0 || *cl.hs > H - h_in;
      }
    }
    if (pick(0, 2) == 0) {
      cl.rw = pick(pick(0, 15) == 0 ? -1 : 0, cap);
      bad_args = bad_args || *cl.rw < 0;
    }
    cl.k = qvg::testing::random_tensor(rng, qvg::DType::F32, {B, n, h_in, D});
    cl.v = qvg::testing::random_tensor(rng, qvg::DType::F32, {B, n, h_in, D});

    std::optional<qvg::detail::PackedPlan> plan;
    std::string msg;
    const Kind got = qvg::testing::call_kind([&] { plan = pol.plan(cl.k.view(), cl.v.view(), c, cl.hs, cl.rw); }, &msg);
    const Kind want = bad_args ? Kind::InvalidArgument : qvg::testing::call_kind(model.check(cl));
    EXPECT_EQ(got, want) << fmt::format("{} call {} c = {} n = {}: policy {} {} vs model {}", what, call, c, n,
                                        call_kind_name(got), msg, call_kind_name(want));
    if (got != want) return -1;
    if (got != Kind::Ok) {
      ++coverage.rejected;
      continue;
    }
    ++accepted;
    const qvg::detail::CallPlan* p = &plan->call;
    (p->copies ? coverage.copied_views : coverage.zero_copy_views)++;
    if (h_in != H) ++coverage.head_slices;
    if (plan->pack) {  // executed as the device cache does, with incremental spans without adaptive breaks
      const qvg::detail::PackPlan& pp = *plan->pack;
      qvg::detail::SpanDecisions decisions(pp, q.span_chunks);
      for (const auto& e : pp.encodes)
        if (e.incremental) decisions.decide(true);
      pol.apply(pp, Empty{}, std::vector<Empty>(pp.encodes.size()), decisions);
    }
    const PackedModel::Result r = model.apply(cl);

    // Segments and cursors.
    std::vector<PackedModel::Seg> got_segs;
    for (size_t i = 0; i < pol.segments().size(); ++i) {
      const auto& sg = pol.segments()[i];
      got_segs.push_back({sg.g0, sg.g1, sg.is_sink, sg.packed, sg.chunks,
                          sg.span >= 0 && i > 0 && pol.segments()[i - 1].span == sg.span});
      coverage.packed_segments += sg.packed;
      coverage.multi_chunk_spans += sg.packed && sg.chunks > 1;
      coverage.sink_spans += sg.packed && sg.is_sink;
    }
    const std::vector<PackedModel::Seg> want_segs = model.segments();
    EXPECT_TRUE(got_segs == want_segs) << fmt::format("{} call {}: segments {}!= model {}", what, call,
                                                      segs_str(got_segs), segs_str(want_segs));
    EXPECT_EQ(pol.global_end(), model.global_end()) << what << " call " << call;
    if (got_segs != want_segs) return -1;

    // The view: the global token at every position, as the device cache lays it
    // out (view pieces, then the call's chunk from the input), against the model.
    const int64_t T = p->view.tokens;
    std::vector<int64_t> g_at(size_t(T), -1);
    int overlaps = 0;
    if (!p->copies) {
      for (int64_t t = 0; t < T; ++t) g_at[size_t(t)] = p->view.tail_start + t;
    } else {
      for (const auto& pc : plan->pieces) {
        const auto& sg = pol.segments()[pc.seg];
        for (int64_t t = pc.t0; t < pc.t1; ++t) {
          int64_t& slot = g_at[size_t(pc.out_t + t - pc.t0)];
          overlaps += slot != -1;
          slot = sg.g0 + t;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        int64_t& slot = g_at[size_t(T - n + i)];
        overlaps += slot != -1;
        slot = c + i;
      }
    }
    EXPECT_EQ(overlaps, 0) << fmt::format("{} call {}: {} view positions written twice", what, call, overlaps);
    EXPECT_EQ(g_at, r.positions) << fmt::format("{} call {}: view of {} tokens, model {}", what, call, T,
                                                r.positions.size());
    EXPECT_TRUE(T - n == r.local_start && T == r.local_end && pol.local_end() == r.visible_local_end &&
                pol.global_end() == r.visible_global_end)
        << what << " call " << call << ": view indices";
    if (overlaps != 0 || g_at != r.positions) return -1;
  }
  return accepted;
}

TEST(CachePlan, PolicyMatchesIndependentModel) {
  int accepted = 0, sequences = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    const int a = run_sequence(seed);
    if (a < 0) return;  // the failure was reported
    accepted += a;
    ++sequences;
  }
  const Coverage& cv = coverage;
  RecordProperty("coverage",
                 fmt::format("{} sequences, {} accepted calls compared ({} copied views, {} zero-copy, {} head "
                             "slices), {} rejected; packed segments seen after calls: {} ({} multi-chunk spans, {} "
                             "sink spans)",
                             sequences, accepted, cv.copied_views, cv.zero_copy_views, cv.head_slices, cv.rejected,
                             cv.packed_segments, cv.multi_chunk_spans, cv.sink_spans));
  EXPECT_TRUE(accepted > 4000 && cv.rejected > 300 && cv.copied_views > 1000 && cv.zero_copy_views > 300 &&
              cv.multi_chunk_spans > 300 && cv.sink_spans > 300 && cv.head_slices > 300)
      << "the random sequences exercise too little";
}

}  // namespace

namespace {

// The device cache's payload and books emulated with host types (the device cache's
// SegData and Books, src/cache/cuda/device_cache.cpp, with DeviceBuffer ->
// AlignedBuffer, DeviceEncodedTensor -> EncodedTensor, DeviceSpanCodebook ->
// SpanCodebook): the same structure (shared span codebooks, optional layers), moved
// through the same transfer templates (src/cache/packed_state_transfer.h) by copies.
struct EmuSeg {
  qvg::AlignedBuffer k_raw, v_raw;
  qvg::EncodedTensor k_enc, v_enc;
  std::shared_ptr<qvg::SpanCodebook> k_book, v_book;
  std::optional<qvg::EncodedTensor> k_ref, v_ref;
};
struct EmuBooks {
  std::shared_ptr<qvg::SpanCodebook> k, v;
};
struct Copy {  // the emulated download and upload
  qvg::AlignedBuffer raw(const qvg::AlignedBuffer& b) const { return b; }
  qvg::EncodedTensor enc(const qvg::EncodedTensor& e) const { return e; }
  qvg::SpanCodebook book(const qvg::SpanCodebook& b) const { return b; }
};

std::vector<uint8_t> bytes_of(const qvg::detail::PackedStateData& d, const char* device) {
  const qvg::detail::snap::Written w = qvg::detail::snap::write_packed(qvg::detail::ref_of(d, device));
  return qvg::detail::snap::snapshot_file_bytes(w.sections, w.minor);
}

qvg::Tensor lcg_chunk(qvg::Shape4 sh, uint64_t seed, float drift) {
  qvg::Tensor t(qvg::DType::BF16, sh);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t i = 0; i < sh.s; ++i)
      for (int64_t h = 0; h < sh.h; ++h)
        for (int64_t d = 0; d < sh.d; ++d) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          const float u = float((x >> 40) & 0xFFFF) / 65536.0f - 0.5f;
          t.set(b, i, h, d, std::sin(0.3f * float(d + 7 * h) + drift + float(i % 3)) + 0.3f * u);
        }
  return t;
}

}  // namespace

// A snapshot written from the device cache's state is the CPU cache's
// snapshot, byte for byte, for the same history. The device state is emulated on the
// host: the CPU cache's state (read back from its snapshot) is restored into a
// CachePolicy over the device cache's payload structure (EmuSeg, EmuBooks) with
// restore_state, the device load's template, and written with state_data_of and
// ref_of, the device save's: with the device entry "cpu" the bytes are the CPU cache's;
// with "cuda" (what the device cache writes) only the config section differs, and the
// CPU cache loads it and writes its own bytes back. Settings: the every-setting profile
// (incremental spans, adaptive breaks, refinement layers, init warm, mse, per-role K),
// deferred spans with warm, and quantization off.
TEST(CachePlan, DeviceStateSnapshotEqualsTheCpuCachesBytes) {
  qvg::CacheOptions o;
  o.cache_size = 40;
  o.head_dim = 32;
  o.heads = 2;
  o.sink_tokens = 4;
  std::vector<qvg::QuantArgs> qs(4);
  qs[0].enable(2);
  qs[0].codec.centroids = 8;
  qs[0].codec.block_size = 16;
  qs[0].span_mode = qvg::SpanMode::Incremental;
  qs[0].span_chunks = 3;
  qs[0].span_break_ratio = 1.1;
  qs[0].refine_recent = 2;
  qs[0].keep_recent_chunks = 1;
  qs[0].sink = true;
  qs[0].codec.init = qvg::Init::Warm;
  qs[0].codec.scale_search = qvg::ScaleSearch::Mse;
  qs[0].k.set(&qvg::CodecConfig::bits, 4);
  qs[1] = qs[0];
  qs[1].span_break_ratio = 0;
  qs[2].enable(4);
  qs[2].codec.centroids = 8;
  qs[2].codec.block_size = 16;
  qs[2].span_chunks = 2;
  qs[2].codec.init = qvg::Init::Warm;
  int checked = 0;
  for (const qvg::QuantArgs& q : qs) {
    qvg::PackedCausalCache cpu(o, q);
    for (int i = 0; i < 9; ++i) {
      const qvg::Shape4 sh{1, 4, o.heads, o.head_dim};
      const float drift = i == 6 ? 4.0f : 0.1f * float(i);
      const qvg::Tensor k = lcg_chunk(sh, uint64_t(2 * i), drift), v = lcg_chunk(sh, uint64_t(2 * i + 1), drift);
      const int64_t c = i % 5 == 4 ? cpu.segment(cpu.num_segments() - 1).g0 : cpu.global_end();
      (void)cpu.update(k.view(), v.view(), c);
      const std::vector<uint8_t> a = cpu.snapshot_bytes();
      qvg::SnapshotExpectation x;
      x.options = o;
      x.quant = q;
      const qvg::detail::PackedStateData d = qvg::detail::snap::read_packed(qvg::detail::snap::MemorySource(a), x);
      qvg::detail::CachePolicy<EmuSeg, EmuBooks> pol(o, q);
      auto r = qvg::detail::restore_state<EmuSeg, EmuBooks, qvg::EncodedTensor>(d, Copy{});
      pol.restore(std::move(r.segments), d.global_end, d.chunk_tokens, std::move(r.spans));
      const qvg::detail::PackedStateData back = qvg::detail::state_data_of(
          pol, o, q, r.warm_k ? &*r.warm_k : nullptr, r.warm_v ? &*r.warm_v : nullptr, Copy{});
      const std::string at = q.describe() + " call " + std::to_string(i);
      EXPECT_TRUE(bytes_of(back, "cpu") == a) << at << "the device state's snapshot differs from the CPU cache's";
      const std::vector<uint8_t> dev = bytes_of(back, "cuda");
      EXPECT_TRUE(qvg::inspect_snapshot_bytes(dev, true).device == "cuda") << at;
      const qvg::PackedCausalCache loaded = qvg::PackedCausalCache::from_snapshot_bytes(dev, x);
      EXPECT_TRUE(loaded.snapshot_bytes() == a) << at << "the CPU cache's load of the device snapshot";
      // Books shared by a span's chunks (one codebook object per span, as on the device).
      int64_t last = -1;
      const qvg::SpanCodebook* book = nullptr;
      for (const auto& sg : pol.segments()) {
        EXPECT_TRUE(sg.span < 0 || sg.span != last || sg.data.k_book.get() == book) << at << "span" << sg.span;
        last = sg.span;
        book = sg.data.k_book.get();
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 36);
}
