// Host-side test of the device packed cache's bookkeeping (no GPU needed):
// CachePolicy (src/cache/cache_policy.h) — the policy both qvg::PackedCausalCache
// and qvg::cuda::PackedCausalCache run — driven with an empty payload (as the
// device cache drives it: view pieces, no CPU bytes) against the CPU
// qvg::PackedCausalCache over random call sequences:
// - the same calls are accepted, and rejected ones with the same error kind;
// - after every call the same segment list (g0, g1, is_sink, packed, chunks),
//   global_end, local_end and chunk_tokens;
// - the same view shape, indices and zero_copy flag, and the view pieces the
//   device cache would copy/decode place each global token where the CPU view has
//   it (values encode (token, head, batch), so the CPU view's raw tokens are read
//   back to check every position);
// - qvg::cuda::PackedCausalCache's constructor and its update()'s argument errors
//   (which are raised before any CUDA call) on this GPU-less machine.
// What this cannot check: the device copies, encodes and decodes themselves
// (tests/gpu/gpu_tests.cpp, on a GPU).
#include <cstdio>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/harness.h"
#include "cache/cache_policy.h"
#include "qvg/cache.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

namespace {

struct Empty {};
using Policy = qvg::detail::CachePolicy<Empty>;

enum class Kind { Ok, InvalidArgument, Unsupported, OutOfRange, Other };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Ok: return "ok";
    case Kind::InvalidArgument: return "InvalidArgument";
    case Kind::Unsupported: return "Unsupported";
    case Kind::OutOfRange: return "OutOfRange";
    case Kind::Other: return "other";
  }
  return "?";
}

template <class F>
Kind kind_of(F&& f, std::string* msg = nullptr) {
  try {
    f();
    return Kind::Ok;
  } catch (const qvg::InvalidArgument& e) {
    if (msg) *msg = e.what();
    return Kind::InvalidArgument;
  } catch (const qvg::Unsupported& e) {
    if (msg) *msg = e.what();
    return Kind::Unsupported;
  } catch (const qvg::OutOfRange& e) {
    if (msg) *msg = e.what();
    return Kind::OutOfRange;
  } catch (const std::exception& e) {
    if (msg) *msg = e.what();
    return Kind::Other;
  }
}

/// Element (b, t, h, d) of a chunk starting at c: d = 0 holds the global token + 1,
/// d = 1 the head + 1, d = 2 the batch + 1 (exact in f32), the rest small noise.
qvg::Tensor chunk_data(int64_t B, int64_t n, int64_t h_in, int64_t hs, int64_t D, int64_t c, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  qvg::Tensor t(qvg::DType::F32, {B, n, h_in, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < h_in; ++h)
        for (int64_t d = 0; d < D; ++d)
          t.set(b, i, h, d, d == 0 ? float(c + i + 1) : d == 1 ? float(hs + h + 1) : d == 2 ? float(b + 1) : u(rng));
  return t;
}

std::string describe(const qvg::CacheOptions& o, const qvg::QuantArgs& q) {
  return "B=" + std::to_string(o.batch) + " cap=" + std::to_string(o.cache_size) + " H=" + std::to_string(o.heads) +
         " sink=" + std::to_string(o.sink_tokens) + " window=" + std::to_string(o.window()) + " " + q.describe();
}

/// What the random sequences exercised (printed, and checked to be non-trivial).
struct Coverage {
  int rejected = 0, copied_views = 0, zero_copy_views = 0, packed_segments = 0, multi_chunk_spans = 0,
      sink_spans = 0, head_slices = 0;
};
Coverage coverage;

/// One random configuration, one random call sequence; returns the number of calls accepted.
int run_sequence(uint32_t seed) {
  std::mt19937 rng(seed);
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
    q.bits = pick(0, 1) ? 2 : 4;
    q.centroids = 4;
    q.block_size = 8;
    q.kmeans_iters = 1;
    q.keep_recent_chunks = int(pick(0, 2));
    q.sink = pick(0, 3) != 0;
    q.sink_span = pick(0, 1) ? qvg::SinkSpan::Chunk : qvg::SinkSpan::Full;
    q.sink_keep_chunks = int(pick(0, 2));
    q.span_chunks = int(pick(1, 3));
  }
  const std::string what = "seed " + std::to_string(seed) + ": " + describe(o, q);
  qvg::PackedCausalCache cpu(o, q);
  Policy pol(o, q);
  const int64_t B = o.batch, H = o.heads, D = o.head_dim, cap = o.cache_size;
  std::set<std::tuple<int64_t, int64_t>> written;  // (global token, head) ever written
  int accepted = 0;
  const int calls = int(pick(10, 60));
  for (int call = 0; call < calls; ++call) {
    if (pick(0, 40) == 0) {
      pol.reset();
      cpu.reset_indices();
      written.clear();
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
    int64_t h_in = H, hs = 0;
    std::optional<int64_t> hs_arg, rw;
    if (pick(0, 3) == 0) {
      h_in = pick(1, H);
      hs = pick(0, H - h_in);
      hs_arg = hs;
      if (pick(0, 15) == 0) hs_arg = pick(-1, H);  // maybe invalid
    }
    if (pick(0, 2) == 0) rw = pick(pick(0, 15) == 0 ? -1 : 0, cap);
    const qvg::Tensor key = chunk_data(B, n, h_in, hs_arg.value_or(0), D, c, rng);
    const qvg::Tensor value = chunk_data(B, n, h_in, hs_arg.value_or(0), D, c, rng);

    std::optional<qvg::detail::CallPlan> p;
    std::string dmsg, cmsg;
    const Kind dk = kind_of([&] { p = pol.plan(key.view(), value.view(), c, hs_arg, rw); }, &dmsg);
    qvg::KVView view;
    const Kind ck = kind_of([&] { view = cpu.update(key.view(), value.view(), c, hs_arg, rw); }, &cmsg);
    QVG_EXPECT(dk == ck) << what << "call" << call << "c =" << c << "n =" << n << ": device plan"
                         << kind_name(dk) << dmsg << "vs CPU" << kind_name(ck) << cmsg;
    if (dk != ck) return -1;
    if (dk != Kind::Ok) {
      ++coverage.rejected;
      QVG_EXPECT(dmsg == cmsg) << what << "messages differ:" << dmsg << "|" << cmsg;
      continue;
    }
    ++accepted;
    (p->copy ? coverage.copied_views : coverage.zero_copy_views)++;
    if (h_in != H) ++coverage.head_slices;
    if (p->advance) {
      pol.push_current(*p, Empty{});
      pol.evict();
      pol.pack([](const std::vector<const Policy::Segment*>& parts, Policy::Segment&) { QVG_CHECK(!parts.empty()); });
    }
    const int64_t hs_eff = hs_arg.value_or(0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < h_in; ++h) written.insert({c + i, hs_eff + h});

    // Segments and cursors.
    QVG_EXPECT(pol.segments().size() == cpu.num_segments()) << what << "call" << call;
    if (pol.segments().size() != cpu.num_segments()) return -1;
    bool seg_ok = true;
    for (size_t i = 0; i < cpu.num_segments(); ++i) {
      const auto ci = cpu.segment(i);
      const auto& di = pol.segments()[i];
      seg_ok = seg_ok && ci.g0 == di.g0 && ci.g1 == di.g1 && ci.is_sink == di.is_sink && ci.packed == di.packed &&
               ci.chunks == di.chunks;
    }
    for (const auto& sg : pol.segments()) {
      coverage.packed_segments += sg.packed;
      coverage.multi_chunk_spans += sg.packed && sg.chunks > 1;
      coverage.sink_spans += sg.packed && sg.is_sink;
    }
    QVG_EXPECT(seg_ok) << what << "call" << call << ": segment lists differ";
    QVG_EXPECT(pol.global_end() == cpu.global_end() && pol.chunk_tokens() == cpu.chunk_tokens()) << what;
    if (!seg_ok) return -1;

    // The view's shape, indices and layout.
    QVG_EXPECT(view.k.shape.s == p->T && view.k.shape.h == h_in && view.local_start_index == p->T - n &&
               view.local_end_index == p->T && view.zero_copy == !p->copy && view.visible_global_end == pol.global_end() &&
               view.visible_local_end == std::min(pol.global_end(), cap))
        << what << "call" << call << ": view T" << view.k.shape.s << "vs" << p->T;
    // Global token at each view position, as the device cache lays it out.
    std::vector<int64_t> g_at(size_t(p->T), -1);
    if (!p->copy) {
      for (int64_t t = 0; t < p->T; ++t) g_at[size_t(t)] = p->r2 + t;
    } else {
      for (const auto& pc : pol.view_pieces(*p)) {
        const auto& sg = pol.segments()[pc.seg];
        for (int64_t t = pc.t0; t < pc.t1; ++t) {
          int64_t& slot = g_at[size_t(pc.out_t + t - pc.t0)];
          QVG_EXPECT(slot == -1) << what << "view position written twice";
          slot = sg.g0 + t;
        }
      }
      for (int64_t i = 0; i < n; ++i) g_at[size_t(p->T - n + i)] = c + i;
    }
    // Expected from the ranges [0, r1) ++ [r2, r3), and checked against the CPU
    // view's values wherever the CPU holds the token raw.
    std::vector<bool> raw_at_cpu;
    auto cpu_raw = [&](int64_t g) {
      for (size_t i = 0; i < cpu.num_segments(); ++i) {
        const auto s = cpu.segment(i);
        if (g >= s.g0 && g < s.g1) return !s.packed;
      }
      return false;
    };
    int bad = 0;
    for (int64_t t = 0; t < p->T; ++t) {
      const int64_t g = g_at[size_t(t)];
      const int64_t expect = t < p->r1 ? t : p->r2 + (t - p->r1);
      if (g != expect) ++bad;
      if (g < 0 || !cpu_raw(g)) continue;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < h_in; ++h) {
          const bool w = written.count({g, hs_eff + h}) > 0;
          const float e0 = w ? float(g + 1) : 0.0f, e1 = w ? float(hs_eff + h + 1) : 0.0f, e2 = w ? float(b + 1) : 0.0f;
          for (const qvg::StridedView* v : {&view.k, &view.v})
            if (v->at(b, t, h, 0) != e0 || v->at(b, t, h, 1) != e1 || v->at(b, t, h, 2) != e2) ++bad;
        }
    }
    QVG_EXPECT(bad == 0) << what << "call" << call << ":" << bad << "misplaced view entries";
    if (bad) return -1;
  }
  return accepted;
}

QVG_TEST(policy_matches_cpu_packed_cache) {
  int accepted = 0, sequences = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    const int a = run_sequence(seed);
    if (a < 0) return;  // the failure was reported
    accepted += a;
    ++sequences;
  }
  const Coverage& cv = coverage;
  std::printf(
      "  %d sequences, %d accepted calls compared (%d copied views, %d zero-copy, %d head slices), %d rejected;\n"
      "  packed segments seen after calls: %d (%d multi-chunk spans, %d sink spans)\n",
      sequences, accepted, cv.copied_views, cv.zero_copy_views, cv.head_slices, cv.rejected, cv.packed_segments,
      cv.multi_chunk_spans, cv.sink_spans);
  QVG_EXPECT(accepted > 4000 && cv.rejected > 300 && cv.copied_views > 1000 && cv.zero_copy_views > 300 &&
             cv.multi_chunk_spans > 300 && cv.sink_spans > 300 && cv.head_slices > 300)
      << "the random sequences exercise too little";
}

QVG_TEST(device_cache_constructor_errors) {
  qvg::CacheOptions o;
  o.cache_size = 16;
  o.head_dim = 64;
  qvg::QuantArgs q;
  q.bits = 4;
  std::string msg;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::Ok);
  q.init = qvg::Init::Warm;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }, &msg) == Kind::Unsupported &&
             msg.find("init") != std::string::npos && msg.find("warm") != std::string::npos)
      << msg;
  q.init = qvg::Init::KMeansPlusPlus;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }, &msg) == Kind::Unsupported &&
             msg.find("kmeans++") != std::string::npos)
      << msg;
  q.init = qvg::Init::Random;
  q.block_size = 48;  // does not divide 64
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::InvalidArgument);
  q.block_size = 64;
  qvg::CacheOptions g = o;
  g.allow_growth = true;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(g, q); }) == Kind::Unsupported);
  g = o;
  g.view_scratch = std::make_shared<qvg::ViewScratch>();
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(g, q); }, &msg) == Kind::Unsupported &&
             msg.find("view_scratch") != std::string::npos)
      << msg;
  g = o;
  g.sink_tokens = 17;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(g, q); }, &msg) == Kind::InvalidArgument &&
             msg.find("sink_tokens") != std::string::npos)
      << msg;
}

// update() validates its arguments before any CUDA call, so the argument errors
// can be checked here (the tensors' pointers are never dereferenced).
QVG_TEST(device_cache_update_argument_errors_before_any_cuda_call) {
  qvg::CacheOptions o;
  o.cache_size = 16;
  o.heads = 2;
  o.head_dim = 8;
  qvg::cuda::PackedCausalCache c(o);
  alignas(16) static char dummy[64];
  const qvg::ConstTensorView k{dummy, qvg::DType::BF16, {1, 4, 2, 8}};
  std::string msg;
  QVG_EXPECT(kind_of([&] { (void)c.update(k, k, 3, nullptr); }, &msg) == Kind::Unsupported &&
             msg.find("non-sequential") != std::string::npos)
      << msg;
  const qvg::ConstTensorView kf{dummy, qvg::DType::F32, {1, 4, 2, 8}};
  QVG_EXPECT(kind_of([&] { (void)c.update(kf, kf, 0, nullptr); }, &msg) == Kind::InvalidArgument &&
             msg.find("dtype") != std::string::npos)
      << msg;
  const qvg::ConstTensorView k1{dummy, qvg::DType::BF16, {1, 4, 1, 8}};
  QVG_EXPECT(kind_of([&] { (void)c.update(k1, k1, 0, nullptr); }, &msg) == Kind::InvalidArgument &&
             msg.find("cache_head_start") != std::string::npos)
      << msg;
  const qvg::ConstTensorView big{dummy, qvg::DType::BF16, {1, 17, 2, 8}};
  QVG_EXPECT(kind_of([&] { (void)c.update(big, big, 0, nullptr); }) == Kind::OutOfRange);
  QVG_EXPECT(kind_of([&] { (void)c.update(k, k, 0, nullptr, std::nullopt, -1); }, &msg) == Kind::InvalidArgument &&
             msg.find("recent_window_tokens") != std::string::npos)
      << msg;
  QVG_EXPECT(c.global_end() == 0 && c.num_segments() == 0 && c.view_buffer_nbytes() == 0);
  QVG_EXPECT(kind_of([&] { (void)c.segment(0); }) == Kind::InvalidArgument);
}

}  // namespace

int main(int argc, char** argv) { return qvg::testing::run_all(argc, argv); }
