// The device packed cache with every setting of the CPU cache (docs/cuda.md: the
// device cache accepts every QuantArgs setting the CPU cache accepts: incremental
// spans, adaptive breaks, refinement layers, init warm, scale_search mse, per-role K/V
// settings). Part of qvg_gpu_tests; the tests are named all_settings_*
// (scripts/gpu-check runs them in its optional second part, `qvg_gpu_tests
// all_settings_`, and excludes them from the verdict run), and `qvg_gpu_tests
// --all-settings-measure [--json FILE]` prints the measurements of that profile.
//
// What is checked, each failure naming the call, segment and array:
// - the device encoder with init warm and scale_search mse: byte for byte the host
//   replay of its own assignments (tests/gpu/encode_replay.h: warm - mu as the
//   initial centroids, quantize_residual_group with the search);
// - a span chunk's encoding (encode_span_chunk): ids inside the slots in use, and the
//   codes, scales, zeros and factors equal to the CPU quantizer's
//   (quantize_residual_group with the config's search) applied to the input minus the
//   span codebook's stored centroids at the device's own ids;
// - the device packed cache with the every-setting profile (incremental spans of 4,
//   refinement layers 2 x 2-bit, keep_recent 1, sink with sink_keep 1, init warm,
//   scale_search mse, K at int4 and V at int2), span_break_ratio 0 and 1.2: after every
//   call the same segment geometry as the CPU packed cache fed the same inputs, the
//   same refined segments, resident_nbytes() equal to the CPU cache's (the memory
//   model's, which tests/test_memory.cpp checks against the CPU cache; with breaks,
//   equal to the bytes of the device's own state counted the CPU cache's way), raw
//   view tokens equal to the CPU cache's, and packed ones equal bit for bit to the CPU
//   decode of the device's own state (its chunk encodings, span codebooks and
//   refinement layers downloaded: decode_ranges with the codebook, then
//   add_refinement);
// - snapshots between the CPU and the device caches (all_settings_snapshots_*).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/cuda/encode_traced.h"
#include "codec/encode_impl.h"
#include "core/exact_sum_impl.h"
#include "gpu/device_support.h"
#include "gpu/encode_replay.h"
#include "gpu/harness.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"
#include "qvg/snapshot.h"

namespace {

using qvg::cuda::DeviceBuffer;
using qvg::testing::gpu::host_view_bytes;
using qvg::testing::gpu::TestStream;
using qvg::testing::gpu::to_device;
using qvg::testing::gpu::to_host;
using qvg::testing::gpu::view_to_host;

/// Clustered data that drifts with `seed` (so later chunks fit a span's codebook more
/// or less well).
qvg::Tensor drifting(qvg::DType dt, qvg::Shape4 sh, uint32_t seed, float drift) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  qvg::Tensor t(dt, sh);
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.h; ++h) {
      std::vector<float> centers(size_t(6 * sh.d));
      for (size_t i = 0; i < centers.size(); ++i) centers[i] = 2.0f * std::sin(0.37f * float(i + h) + drift);
      for (int64_t s = 0; s < sh.s; ++s)
        for (int64_t d = 0; d < sh.d; ++d)
          t.set(b, s, h, d, centers[size_t((s % 6) * sh.d + d)] + 0.4f * n01(rng) + (h == 1 ? 5.0f : 0.0f));
    }
  return t;
}

/// The every-setting profile at test scale (with another init: the same policy).
qvg::QuantArgs profile(double break_ratio, qvg::Init init = qvg::Init::Warm) {
  qvg::QuantArgs q;
  q.enable(2);
  q.codec.centroids = 16;
  q.codec.block_size = 32;
  q.span_mode = qvg::SpanMode::Incremental;
  q.span_chunks = 4;
  q.span_break_ratio = break_ratio;
  q.refine_recent = 2;
  q.refine_bits = 2;
  q.keep_recent_chunks = 1;
  q.sink = true;
  q.sink_keep_chunks = 1;
  q.codec.init = init;
  q.codec.scale_search = qvg::ScaleSearch::Mse;
  q.k.set(&qvg::CodecConfig::bits, 4);  // per role: K at int4
  return q;
}

/// The host decode (+ refinement) of one packed segment of the device cache, K or V:
/// [B, S, H, D] of the cache dtype, from its downloaded encodings.
qvg::Tensor host_decode(const qvg::cuda::PackedCausalCache::SegmentInfo& sg, bool is_k, qvg::DType dt, cudaStream_t s,
                        std::string& why) {
  const qvg::EncodedTensor enc = (is_k ? sg.k_enc : sg.v_enc)->download(s);
  std::optional<qvg::EncodedTensor> book, ref;
  if (const auto* cb = is_k ? sg.k_codebook : sg.v_codebook) book = cb->download(s);
  if (const auto* r = is_k ? sg.k_ref : sg.v_ref) ref = r->download(s);
  const int64_t S = enc.shape.s, H = enc.shape.h, D = enc.shape.d;
  qvg::Tensor out(dt, enc.shape);
  if (sg.span >= 0 && !book) why = "a span chunk without a codebook";
  if (sg.span >= 0 && book && enc.centroid[0].size() != 0) why = "a span chunk holding centroids";
  qvg::decode_ranges({{&enc, 0, S, 0, H, {out.data(), dt, S * H * D, H * D}, book ? &*book : nullptr}});
  if (ref) qvg::add_refinement(*ref, 0, S, 0, H, {out.data(), dt, S * H * D, H * D});
  return out;
}

/// Resident bytes of the device cache's state counted as the CPU cache counts them:
/// each segment's bytes (raw, encodings, refinement layers) and each span's codebooks once.
size_t counted_resident(const qvg::cuda::PackedCausalCache& c) {
  size_t n = 0;
  int64_t last = -1;
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto sg = c.segment(i);
    n += sg.nbytes;
    if (sg.span >= 0 && sg.span != last) n += sg.k_codebook->nbytes() + sg.v_codebook->nbytes();
    last = sg.span;
  }
  return n;
}

}  // namespace

QVG_TEST(all_settings_gpu_encode_warm_and_mse_equal_host_replay) {
  TestStream st;
  int checked = 0;
  struct Case {
    int bits;
    bool asym;
    int64_t S;
    bool warm;
  };
  for (const Case cs :
       {Case{4, false, 300, true}, Case{2, true, 300, true}, Case{2, false, 10, true}, Case{4, true, 200, false}}) {
    qvg::CodecConfig cfg;
    cfg.bits = cs.bits;
    cfg.asymmetric = cs.asym;
    cfg.centroids = 16;
    cfg.block_size = 32;
    cfg.kmeans_iters = 3;
    cfg.scale_search = qvg::ScaleSearch::Mse;
    cfg.init = cs.warm ? qvg::Init::Warm : qvg::Init::Random;
    const qvg::Shape4 sh{1, cs.S, 2, 64};
    const qvg::Tensor x = drifting(qvg::DType::BF16, sh, 11u + uint32_t(cs.S), 0.0f);
    const qvg::Tensor prev = drifting(qvg::DType::BF16, {1, 64, 2, 64}, 5u, 0.3f);
    const qvg::EncodedTensor warm_host = qvg::encode(prev.view(), cfg).codebooks_only();
    const qvg::cuda::DeviceEncodedTensor warm = qvg::cuda::DeviceEncodedTensor::upload(warm_host, st.s);
    DeviceBuffer dx = to_device(x, st.s);
    const size_t trace_bytes = size_t(cfg.stages * cfg.kmeans_iters) * size_t(sh.b * sh.h * sh.s);
    DeviceBuffer trace(trace_bytes, st.s);
    const qvg::EncodedTensor got =
        qvg::cuda::detail::encode_traced({dx.data(), x.dtype(), sh}, cfg, st.s, qvg::cuda::default_allocator(),
                                         trace.data(), cs.warm ? &warm : nullptr)
            .download(st.s);
    const std::string diff = qvg::testing::check_against_replay(x, cfg, got, to_host(trace.data(), trace_bytes, st.s),
                                                                cs.warm ? &warm_host : nullptr);
    QVG_EXPECT(diff.empty()) << "bits" << cs.bits << (cs.asym ? "asym" : "sym") << "S" << cs.S
                             << (cs.warm ? "warm" : "random") << "mse: differs from the host replay in" << diff;
    ++checked;
  }
  QVG_EXPECT(checked == 4);
}

QVG_TEST(all_settings_span_chunk_quantizer_equals_cpu_given_device_ids) {
  TestStream st;
  int checked = 0;
  for (const qvg::ScaleSearch search : {qvg::ScaleSearch::Off, qvg::ScaleSearch::Mse})
    for (const int stages : {1, 2}) {
      qvg::CodecConfig cfg;
      cfg.bits = 2;
      cfg.centroids = 16;
      cfg.block_size = 32;
      cfg.stages = stages;
      cfg.scale_search = search;
      const qvg::Shape4 sh{1, 48, 2, 64};
      qvg::cuda::DeviceSpanCodebook span = qvg::cuda::DeviceSpanCodebook::empty(sh, qvg::DType::BF16, cfg, st.s);
      for (int chunk = 0; chunk < 4; ++chunk) {
        // The last chunk has fewer points (6) than slots in use (16): assign_to_slots.
        const qvg::Shape4 shc{sh.b, chunk == 3 ? 6 : sh.s, sh.h, sh.d};
        const qvg::Tensor x = drifting(qvg::DType::BF16, shc, 40u + uint32_t(chunk), 0.2f * float(chunk));
        DeviceBuffer dx = to_device(x, st.s);
        DeviceBuffer energy(size_t(sh.b * sh.h) * 8, st.s);
        const qvg::cuda::DeviceEncodedTensor de =
            qvg::cuda::encode_span_chunk({dx.data(), x.dtype(), shc}, cfg, span, chunk == 0 ? 8 : 4, nullptr, st.s,
                                         qvg::cuda::default_allocator(), static_cast<double*>(energy.data()));
        const qvg::EncodedTensor got = de.download(st.s);
        const qvg::SpanCodebook book = span.download(st.s);
        const std::string what =
            std::string(qvg::name(search)) + " stages=" + std::to_string(stages) + " chunk " + std::to_string(chunk);
        QVG_EXPECT(book.filled == std::min(16, 8 + 4 * chunk)) << what << "filled" << book.filled;
        // The CPU quantizer on the input minus the stored centroids at the device's ids.
        const int64_t G = sh.b * sh.h, S = shc.s, D = sh.d;
        qvg::EncodedTensor want = got;
        std::vector<float> r(size_t(S * D));
        bool ids_ok = true;
        double e_host = 0;
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t t = 0; t < S; ++t)
            for (int64_t d = 0; d < D; ++d) r[size_t(t * D + d)] = x.at(g / sh.h, t, g % sh.h, d);
          for (int s2 = 0; s2 < stages; ++s2)
            for (int64_t t = 0; t < S; ++t) {
              const int id = got.ids[size_t(s2)][size_t(g * S + t)];
              ids_ok = ids_ok && id < book.filled;
              for (int64_t d = 0; d < D; ++d)
                r[size_t(t * D + d)] = r[size_t(t * D + d)] - book.book.centroid_at(s2, g / sh.h, g % sh.h, id, d);
            }
          // spec 1.1's exact, order-independent sum (the host EncodeStats' and the device's rule)
          e_host += qvg::exact_sum::energy_of([&r](int64_t i) { return r[size_t(i)]; }, S * D);
          qvg::detail::quantize_residual_group(r.data(), g, want, search);
        }
        QVG_EXPECT(ids_ok) << what << "an id outside the slots in use";
        QVG_EXPECT(got.codes == want.codes) << what << "codes";
        QVG_EXPECT(got.scales == want.scales) << what << "scales";
        QVG_EXPECT(got.zeros == want.zeros && got.scale_factor == want.scale_factor) << what << "zeros/factors";
        const std::vector<uint8_t> eb = to_host(energy.data(), size_t(G) * 8, st.s);
        double e_dev = 0;
        for (int64_t g = 0; g < G; ++g) {
          double v = 0;
          std::memcpy(&v, eb.data() + size_t(g) * 8, 8);
          e_dev += v;
        }
        QVG_EXPECT(e_dev == e_host) << what << "residual energy" << e_dev << "host" << e_host;
        ++checked;
      }
    }
  QVG_EXPECT(checked == 16);
}

namespace {

/// The caches of the profile runs: 1 x 2 heads of 64, bf16, 16 sink tokens, 9 chunks of 16.
qvg::CacheOptions profile_options() {
  qvg::CacheOptions o;
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 64;
  o.dtype = qvg::DType::BF16;
  o.sink_tokens = 16;
  o.cache_size = 16 * 9;
  return o;
}

/// One run of the profile on the device cache and the CPU cache side by side.
void run_profile(double break_ratio, int& packed_rows, int& refined_rows, int& calls,
                 qvg::Init init = qvg::Init::Warm) {
  TestStream st;
  const qvg::CacheOptions o = profile_options();
  const qvg::QuantArgs q = profile(break_ratio, init);
  qvg::cuda::PackedCausalCache dev(o, q);
  qvg::PackedCausalCache cpu(o, q);
  const int64_t chunk = 16;
  const size_t row = size_t(o.heads * o.head_dim) * 2;
  for (int step = 0; step < 30; ++step) {
    const bool rewrite = step % 4 == 3;
    const int64_t c = rewrite ? cpu.segment(cpu.num_segments() - 1).g0 : cpu.global_end();
    const qvg::Shape4 sh{o.batch, chunk, o.heads, o.head_dim};
    const float drift = step >= 14 && step < 18 ? 3.0f : 0.05f * float(step);  // a jump: breaks with ratio 1.2
    const qvg::Tensor k = drifting(o.dtype, sh, 100u + uint32_t(step), drift);
    const qvg::Tensor v = drifting(o.dtype, sh, 200u + uint32_t(step), drift + 1.0f);
    DeviceBuffer dk = to_device(k, st.s), dv = to_device(v, st.s);
    const qvg::KVView dview = dev.update({dk.data(), o.dtype, sh}, {dv.data(), o.dtype, sh}, c, st.s);
    const qvg::KVView cview = cpu.update(k.view(), v.view(), c);
    ++calls;
    const std::string at = "init " + std::string(qvg::name(init)) + " ratio " + std::to_string(break_ratio) + " step " +
                           std::to_string(step);
    // Geometry and refined segments as the CPU cache's.
    QVG_EXPECT(dev.num_segments() == cpu.num_segments())
        << at << "segments" << dev.num_segments() << "cpu" << cpu.num_segments();
    if (dev.num_segments() != cpu.num_segments()) return;
    for (size_t i = 0; i < cpu.num_segments(); ++i) {
      const auto a = dev.segment(i);
      const auto b = cpu.segment(i);
      QVG_EXPECT(a.g0 == b.g0 && a.g1 == b.g1 && a.is_sink == b.is_sink && a.packed == b.packed &&
                 a.chunks == b.chunks && (a.k_ref != nullptr) == (b.k_ref != nullptr) && (a.span >= 0) == (b.span >= 0))
          << at << "segment" << i << "[" << a.g0 << a.g1 << ") differs from the CPU cache's";
      QVG_EXPECT(break_ratio > 0 || a.span == b.span) << at << "segment" << i << "span id";
    }
    // Resident bytes: the CPU cache's (the memory model) without breaks; with breaks
    // (decisions depend on the encoders' fits), the device state's own, counted the CPU way.
    const size_t counted = counted_resident(dev);
    QVG_EXPECT(dev.resident_nbytes() == counted) << at << "resident" << dev.resident_nbytes() << "counted" << counted;
    QVG_EXPECT(break_ratio > 0 || dev.resident_nbytes() == cpu.resident_nbytes())
        << at << "resident" << dev.resident_nbytes() << "cpu (the memory model)" << cpu.resident_nbytes();
    // The view: raw tokens the CPU's, packed ones the CPU decode of the device's state.
    const int64_t T = dview.k.shape.s;
    QVG_EXPECT(T == cview.k.shape.s && dview.local_start_index == cview.local_start_index) << at << "view shape";
    const int64_t ge = dev.global_end(), se = std::min(o.sink_tokens, ge);
    const int64_t lo = std::max(se, ge - std::max<int64_t>(0, o.window() - se));
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint8_t> got = view_to_host(kv ? dview.v : dview.k, st.s);
      const std::vector<uint8_t> ref = host_view_bytes(kv ? cview.v : cview.k);
      for (size_t i = 0; i < dev.num_segments(); ++i) {
        const auto sg = dev.segment(i);
        std::optional<qvg::Tensor> dec;
        std::string why;
        if (sg.packed) dec.emplace(host_decode(sg, kv == 0, o.dtype, st.s, why));
        QVG_EXPECT(why.empty()) << at << "segment" << i << why;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t g = t < se ? t : lo + (t - se);
          if (g < sg.g0 || g >= sg.g1) continue;
          const size_t off = size_t(t) * row;
          if (!sg.packed) {
            QVG_EXPECT(std::memcmp(got.data() + off, ref.data() + off, row) == 0)
                << at << (kv ? "V" : "K") << "raw token" << g << "differs from the CPU cache's";
            continue;
          }
          const auto* want = static_cast<const uint8_t*>(dec->data()) + size_t(g - sg.g0) * row;
          const bool same = std::memcmp(got.data() + off, want, row) == 0;
          QVG_EXPECT(same) << at << (kv ? "V" : "K") << "packed token" << g << "segment" << i
                           << (sg.k_ref ? "(refined)" : "") << "!= the CPU decode of the device's state";
          ++packed_rows;
          refined_rows += sg.k_ref != nullptr;
        }
      }
    }
  }
  std::printf("  ratio %.2g: span breaks device %lld, CPU %lld (not asserted)\n", break_ratio,
              (long long)dev.span_breaks(), (long long)cpu.span_breaks());
}

}  // namespace

QVG_TEST(all_settings_device_cache_profile_matches_cpu_decode_of_its_state) {
  int packed_rows = 0, refined_rows = 0, calls = 0;
  for (const double ratio : {0.0, 1.2}) run_profile(ratio, packed_rows, refined_rows, calls);
  std::printf("  %d calls, %d packed view rows (%d refined) compared\n", calls, packed_rows, refined_rows);
  QVG_EXPECT(calls == 60 && packed_rows > 500 && refined_rows > 100) << calls << packed_rows << refined_rows;
}

// The same with init kmeans++ (the device cache refused it before the device encoder
// seeded with kmeans++): every span chunk's new centroids and every whole encoding
// start from kmeans++ picks; views as the CPU decode of the device's state.
QVG_TEST(all_settings_device_cache_kmeanspp_profile_matches_cpu_decode_of_its_state) {
  int packed_rows = 0, refined_rows = 0, calls = 0;
  run_profile(0.0, packed_rows, refined_rows, calls, qvg::Init::KMeansPlusPlus);
  std::printf("  %d calls, %d packed view rows (%d refined) compared\n", calls, packed_rows, refined_rows);
  QVG_EXPECT(calls == 30 && packed_rows > 250 && refined_rows > 50) << calls << packed_rows << refined_rows;
}

// Snapshots between the caches: the CPU cache's snapshot loaded by the device cache
// gives, at the next call (a denoising rewrite of the current chunk), the CPU cache's
// view bit for bit (every packed token decodes the CPU's encodings, refinement layers
// included); the device cache's snapshot is the CPU's bytes but for the device entry
// (the CPU cache loads it and writes the CPU's bytes back), and the device cache
// loads its own.
QVG_TEST(all_settings_snapshots_between_cpu_and_device_caches) {
  TestStream st;
  const qvg::CacheOptions o = profile_options();
  const qvg::QuantArgs q = profile(1.2);
  qvg::PackedCausalCache cpu(o, q);
  const qvg::Shape4 sh{o.batch, 16, o.heads, o.head_dim};
  for (int i = 0; i < 12; ++i) {
    const qvg::Tensor k = drifting(o.dtype, sh, 300u + uint32_t(i), 0.1f * float(i));
    const qvg::Tensor v = drifting(o.dtype, sh, 400u + uint32_t(i), 1.0f + 0.1f * float(i));
    (void)cpu.update(k.view(), v.view(), cpu.global_end());
  }
  const std::vector<uint8_t> a = cpu.snapshot_bytes();
  qvg::SnapshotExpectation x;
  x.options = o;
  x.quant = q;
  qvg::cuda::PackedCausalCache dev = qvg::cuda::PackedCausalCache::from_snapshot_bytes(a, x, st.s);
  const std::vector<uint8_t> b = dev.snapshot_bytes(st.s);
  QVG_EXPECT(qvg::inspect_snapshot_bytes(b).device == "cuda");
  QVG_EXPECT(qvg::PackedCausalCache::from_snapshot_bytes(b, x).snapshot_bytes() == a)
      << "the device cache's snapshot, loaded by the CPU cache, is not the CPU's bytes";
  QVG_EXPECT(dev.resident_nbytes() == cpu.resident_nbytes()) << dev.resident_nbytes() << cpu.resident_nbytes();
  const qvg::cuda::PackedCausalCache again = qvg::cuda::PackedCausalCache::from_snapshot_bytes(b, x, st.s);
  QVG_EXPECT(again.snapshot_bytes(st.s) == b) << "the device cache's own snapshot";
  const int64_t c = cpu.segment(cpu.num_segments() - 1).g0;
  const qvg::Tensor k = drifting(o.dtype, sh, 999u, 2.0f), v = drifting(o.dtype, sh, 998u, 3.0f);
  DeviceBuffer dk = to_device(k, st.s), dv = to_device(v, st.s);
  const qvg::KVView dview = dev.update({dk.data(), o.dtype, sh}, {dv.data(), o.dtype, sh}, c, st.s);
  const qvg::KVView cview = cpu.update(k.view(), v.view(), c);
  int refined = 0;
  for (size_t i = 0; i < cpu.num_segments(); ++i) refined += cpu.segment(i).k_ref != nullptr;
  QVG_EXPECT(refined > 0) << "no refined segment in the loaded state";
  QVG_EXPECT(view_to_host(dview.k, st.s) == host_view_bytes(cview.k)) << "K view after the load != the CPU cache's";
  QVG_EXPECT(view_to_host(dview.v, st.s) == host_view_bytes(cview.v)) << "V view after the load != the CPU cache's";
}

// ---- the measurements (--all-settings-measure) ---------------------------------------

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Milliseconds of fn() on `s`, median of `reps` runs (events around each).
template <class F>
double time_ms(cudaStream_t s, int reps, F&& fn) {
  cudaEvent_t a, b;
  QVG_GPU_CHECK(cudaEventCreate(&a));
  QVG_GPU_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  fn();  // warm-up
  for (int i = 0; i < reps; ++i) {
    QVG_GPU_CHECK(cudaEventRecord(a, s));
    fn();
    QVG_GPU_CHECK(cudaEventRecord(b, s));
    QVG_GPU_CHECK(cudaEventSynchronize(b));
    float m = 0;
    QVG_GPU_CHECK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(double(m));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

}  // namespace

/// The measurements at the Self-Forcing chunk shape ([1, 4680, 12, 128] bf16, int2,
/// 256 centroids, block 64): the encode time of a later incremental chunk (against
/// its span's codebook, later_chunk_slots new centroids) and of a first one, against
/// a deferred span of 4 chunks per chunk; the view time (a denoising rewrite's
/// update(), copied view of a 7-chunk window) with 2 refinement layers and without;
/// resident bytes against the bytes of the device state counted the CPU way at every
/// call. Prints one JSON object (and writes it to --json FILE).
int all_settings_measure(int argc, char** argv) {
  std::string json_path;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  TestStream st;
  const int64_t n = 4680, H = 12, D = 128;
  const qvg::Shape4 chunk{1, n, H, D};
  qvg::CodecConfig cfg;
  cfg.bits = 2;
  cfg.centroids = 256;
  cfg.block_size = 64;
  cfg.kmeans_iters = 2;
  qvg::cuda::DeviceBuffer x4(size_t(4 * n * H * D) * 2, st.s);
  qvg::cuda::kernels::fill_clustered(x4.data(), 0, 1, 4 * n, H, D, 7, 1.0f, st.s);
  const qvg::ConstTensorView span4{x4.data(), qvg::DType::BF16, {1, 4 * n, H, D}};
  const qvg::ConstTensorView one{x4.data(), qvg::DType::BF16, chunk};
  const double deferred = time_ms(st.s, 5, [&] { (void)qvg::cuda::encode(span4, cfg, st.s); }) / 4.0;
  qvg::cuda::DeviceSpanCodebook book = qvg::cuda::DeviceSpanCodebook::empty(chunk, qvg::DType::BF16, cfg, st.s);
  const double first = time_ms(st.s, 5, [&] {
    qvg::cuda::DeviceSpanCodebook b = qvg::cuda::DeviceSpanCodebook::empty(chunk, qvg::DType::BF16, cfg, st.s);
    (void)qvg::cuda::encode_span_chunk(one, cfg, b, 128, nullptr, st.s);
  });
  (void)qvg::cuda::encode_span_chunk(one, cfg, book, 128, nullptr, st.s);
  const double later = time_ms(st.s, 5, [&] {
    qvg::cuda::DeviceSpanCodebook b = book.copy(st.s);
    (void)qvg::cuda::encode_span_chunk(one, cfg, b, 42, nullptr, st.s);
  });
  const double later_no_new = time_ms(st.s, 5, [&] {
    qvg::cuda::DeviceSpanCodebook b = book.copy(st.s);
    (void)qvg::cuda::encode_span_chunk(one, cfg, b, 0, nullptr, st.s);
  });
  // View time: a cache of 7 chunks' window, the profile with and without refinement.
  double view_ms[2] = {0, 0};
  bool resident_ok = true;
  int resident_calls = 0;
  for (int refine = 0; refine < 2; ++refine) {
    qvg::CacheOptions o;
    o.batch = 1;
    o.heads = H;
    o.head_dim = D;
    o.dtype = qvg::DType::BF16;
    o.sink_tokens = n;
    o.cache_size = 7 * n;
    qvg::QuantArgs q;
    q.enable(2);
    q.codec.centroids = 256;
    q.codec.block_size = 64;
    q.span_mode = qvg::SpanMode::Incremental;
    q.span_chunks = 8;
    q.keep_recent_chunks = 1;
    q.refine_recent = refine ? 4 : 0;
    q.refine_bits = 2;
    qvg::cuda::PackedCausalCache c(o, q);
    qvg::cuda::DeviceBuffer kv(size_t(2 * n * H * D) * 2, st.s);
    for (int i = 0; i < 10; ++i) {
      qvg::cuda::kernels::fill_clustered(kv.data(), 0, 1, 2 * n, H, D, 100 + uint64_t(i), 1.0f, st.s);
      const auto* base = static_cast<const uint8_t*>(kv.data());
      (void)c.update({base, o.dtype, chunk}, {base + size_t(n * H * D) * 2, o.dtype, chunk}, c.global_end(), st.s);
      resident_ok = resident_ok && c.resident_nbytes() == counted_resident(c);
      ++resident_calls;
    }
    const auto* base = static_cast<const uint8_t*>(kv.data());
    const int64_t cur = c.segment(c.num_segments() - 1).g0;
    std::vector<double> ms;
    for (int r = 0; r < 6; ++r) {
      QVG_GPU_CHECK(cudaStreamSynchronize(st.s));
      const auto t0 = std::chrono::steady_clock::now();
      (void)c.update({base, o.dtype, chunk}, {base + size_t(n * H * D) * 2, o.dtype, chunk}, cur, st.s);
      QVG_GPU_CHECK(cudaStreamSynchronize(st.s));
      if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    view_ms[refine] = median(ms);
  }
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"shape\": [1, %lld, %lld, %lld], \"bits\": 2, \"centroids\": 256, "
                "\"deferred_span4_encode_ms_per_chunk\": %.4f, \"incremental_first_chunk_ms\": %.4f, "
                "\"incremental_later_chunk_ms\": %.4f, \"incremental_later_chunk_no_new_centroids_ms\": %.4f, "
                "\"later_over_deferred\": %.4f, \"view_update_ms_no_refine\": %.4f, \"view_update_ms_refine4\": %.4f, "
                "\"resident_equals_counted_state\": %s, \"resident_calls\": %d}\n",
                (long long)n, (long long)H, (long long)D, deferred, first, later, later_no_new, later / deferred,
                view_ms[0], view_ms[1], resident_ok ? "true" : "false", resident_calls);
  std::fputs(buf, stdout);
  if (!json_path.empty()) std::ofstream(json_path) << buf;
  return resident_ok ? 0 : 1;
}
