// GPU tests of the CUDA backend (need a CUDA device; exit status 2 without one).
// Self-contained: links qvg_cuda (qvg_lib + CUDA) and the tiny harness only, so it
// builds on the device machine (no gtest there). Run by scripts/gpu-check.
//
// - decode on the GPU == decode on the CPU, bit for bit, in every mode (every code
//   width of qvg/code_format.h: int2, int3, int4,
//   sym/asym, fp8/bf16 scales, two_level/compat, 1/2 stages, bf16/f16/f32 input,
//   bf16/f16/f32 output), whole tensors and strided multi-task windows;
// - GPU encode: a valid EncodedTensor, deterministic, and byte for byte the host
//   replay of the device encoder's rules fed the GPU's own k-means assignments
//   (tests/gpu/encode_replay.h), D = 48/64/128/256;
// - check_input_limits finds the first bad element;
// - the device packed cache (qvg/cuda_cache.h): with quantization off, random call
//   sequences (advances, denoising rewrites, head slices, recent windows, rejected
//   calls, resets, eviction) give views equal bit for bit to the CPU packed cache's
//   and, when window == cache_size, to the CPU dense cache's, and rejected calls
//   leave the device state unchanged; with int2, the same segments as the CPU packed
//   cache, raw view tokens equal to the CPU's, packed ones equal to the CPU decode of
//   the device's own encodings, and each encoding the device encoder's of the
//   segment's values, equal to the host replay of its assignments.
// The device cache with every setting of the CPU cache (tests all_settings_*, the
// measurements --all-settings-measure) is in tests/gpu/all_settings_tests.cpp; init
// kmeans++ on the device (its picks against the CPU rule, its encodings against the
// host replay) in tests/gpu/kmeanspp_gpu_tests.cpp.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/core.h>

#include "codec/cuda/encode_traced.h"
#include "codec/encode_impl.h"
#include "gpu/device_support.h"
#include "gpu/encode_replay.h"
#include "gpu/harness.h"
#include "gpu/modes.h"
#include "kernels/cuda/host.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

namespace {

using qvg::cuda::DeviceBuffer;
using qvg::testing::gpu::host_view_bytes;
using qvg::testing::gpu::TestStream;
using qvg::testing::gpu::to_device;
using qvg::testing::gpu::to_host;
using qvg::testing::gpu::view_to_host;

/// Clustered data with per-group offsets and scales (V-like magnitudes in some groups).
qvg::Tensor make_data(qvg::DType dtype, qvg::Shape4 sh, uint32_t seed, float big = 300.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  qvg::Tensor t(dtype, sh);
  const int nc = 24;
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.h; ++h) {
      const int64_t g = b * sh.h + h;
      const float scale = g % 3 == 2 ? big : 1.0f;
      std::vector<float> centers(size_t(nc * sh.d)), offs(size_t(sh.d));
      for (float& c : centers) c = n01(rng) * scale;
      for (float& o : offs) o = g % 2 ? 2.0f * scale * n01(rng) : 0.0f;
      for (int64_t s = 0; s < sh.s; ++s) {
        const int k = int(rng() % nc);
        for (int64_t d = 0; d < sh.d; ++d)
          t.set(b, s, h, d, offs[size_t(d)] + centers[size_t(k * sh.d + d)] + 0.25f * scale * n01(rng));
      }
    }
  return t;
}

double rel_mse(const qvg::Tensor& x, const qvg::Tensor& y) {
  const std::vector<float> a = x.to_f32(), b = y.to_f32();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(a[i]) * double(a[i]);
  }
  return num / std::max(den, 1e-300);
}

using qvg::testing::all_modes;
using qvg::testing::Mode;
qvg::CodecConfig config_of(const Mode& m, int K, int block) {
  qvg::CodecConfig c;
  c.bits = m.bits;
  c.asymmetric = m.asym;
  c.scale_dtype = m.sd;
  c.scaling = m.sc;
  c.stages = m.stages;
  c.centroids = K;
  c.block_size = block;
  return c;
}
std::string describe(const Mode& m) {
  return "bits=" + std::to_string(m.bits) + (m.asym ? " asym" : " sym") + " " + std::string(qvg::name(m.sd)) + " " +
         std::string(qvg::name(m.sc)) + " stages=" + std::to_string(m.stages);
}

}  // namespace

QVG_TEST(decode_matches_cpu_bit_for_bit) {
  TestStream st;
  struct ShapeCase {
    qvg::Shape4 sh;
    int block, K;
  };
  const ShapeCase shapes[] = {{{2, 333, 3, 128}, 64, 64}, {{1, 150, 2, 64}, 32, 256}, {{1, 70, 2, 12}, 4, 16}};
  int checked = 0;
  uint32_t seed = 7;
  for (const ShapeCase& sc : shapes)
    for (const Mode& m : qvg::testing::every_width_modes())
      for (qvg::DType in : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
        if (sc.block % qvg::find_code_format(m.bits)->group_codes != 0) continue;  // int3: blocks of 8k
        qvg::CodecConfig cfg = config_of(m, sc.K, sc.block);
        const qvg::Tensor x = make_data(in, sc.sh, seed++, in == qvg::DType::F32 ? 3e4f : 300.0f);
        const qvg::EncodedTensor e = qvg::encode(x, cfg);
        const auto de = qvg::cuda::DeviceEncodedTensor::upload(e, st.s);
        QVG_EXPECT(de.nbytes() == e.nbytes());
        for (qvg::DType out : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
          qvg::Tensor ref(out, sc.sh);
          qvg::decode(e, ref.view());
          DeviceBuffer dout(ref.nbytes(), st.s);
          qvg::cuda::decode(de, qvg::TensorView{dout.data(), out, sc.sh}, st.s);
          const std::vector<uint8_t> got = to_host(dout.data(), ref.nbytes(), st.s);
          QVG_EXPECT(std::memcmp(got.data(), ref.data(), ref.nbytes()) == 0)
              << describe(m) << "in" << qvg::dtype_name(in) << "out" << qvg::dtype_name(out) << "shape" << sc.sh.str();
          ++checked;
        }
      }
  std::printf("  %d tensor decodes compared\n", checked);
}

QVG_TEST(window_decode_tasks_match_cpu) {
  // Seven "chunks" (K and V each) decoded into one strided window buffer with a
  // head sub-range, as the packed cache's reconstruction does; 14 tasks = one launch,
  // and 20 tasks to cover several launches.
  TestStream st;
  const qvg::Shape4 sh{1, 96, 4, 128};
  for (int nchunks : {7, 10}) {
    std::vector<qvg::EncodedTensor> encs;
    for (int i = 0; i < 2 * nchunks; ++i) {
      Mode m{i % 3 == 2 ? 3 : (i % 2 ? 2 : 4), i % 3 == 0, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1};
      encs.push_back(qvg::encode(make_data(qvg::DType::BF16, sh, 100u + uint32_t(i)), config_of(m, 64, 64)));
    }
    std::vector<qvg::cuda::DeviceEncodedTensor> des;
    for (const auto& e : encs) des.push_back(qvg::cuda::DeviceEncodedTensor::upload(e, st.s));
    const int64_t h0 = 1, h1 = 4, hs = h1 - h0, D = sh.d;
    const int64_t token_stride = hs * D, window_tokens = nchunks * (sh.s - 3);
    const size_t bytes = size_t(2 * window_tokens * token_stride) * 2;  // K then V
    std::vector<uint8_t> ref(bytes, 0);
    DeviceBuffer dwin(bytes, st.s);
    QVG_GPU_CHECK(cudaMemsetAsync(dwin.data(), 0, bytes, st.s));
    std::vector<qvg::DecodeTask> cpu;
    std::vector<qvg::cuda::DeviceDecodeTask> gpu;
    for (int i = 0; i < 2 * nchunks; ++i) {
      const int kv = i % 2, chunk = i / 2;
      const int64_t off = (kv * window_tokens + chunk * (sh.s - 3)) * token_stride;
      qvg::DecodeTask c{&encs[size_t(i)],
                        3,
                        sh.s,
                        h0,
                        h1,
                        qvg::DecodeTarget{ref.data() + off * 2, qvg::DType::BF16, 0, token_stride}};
      cpu.push_back(c);
      qvg::cuda::DeviceDecodeTask g{
          &des[size_t(i)],
          3,
          sh.s,
          h0,
          h1,
          qvg::DecodeTarget{static_cast<uint8_t*>(dwin.data()) + off * 2, qvg::DType::BF16, 0, token_stride}};
      gpu.push_back(g);
    }
    qvg::decode_ranges(cpu);
    qvg::cuda::decode_ranges(gpu, st.s);
    const std::vector<uint8_t> got = to_host(dwin.data(), bytes, st.s);
    QVG_EXPECT(got == ref) << "window of" << nchunks << "chunks";
  }
}

// The device encoder against its own rules replayed on the host (no error margin):
// the replay (tests/gpu/encode_replay.h) is fed the GPU's assignments of every
// k-means iteration and must give the same bytes in every array (group means,
// initial indices, fixed-point centroid updates, early stops, stored centroids,
// next residuals, the residual quantizer). The assignments themselves may differ
// from the CPU encoder's in near-ties (spec 1.1: bf16 operands, tensor-core sums),
// so every traced assignment is also judged against the exact argmin over the same
// centroids (AssignmentAgreement: under 1 % of ids differ, inertia within 1e-3
// relative; the replay alone would accept any valid ids); the relative MSE beside the
// CPU encoder's is printed. Cases: the
// tensor-core paths D = 64, 128 and 256 (hy-worldplay-8b's head dim), the generic
// one (D = 48), S < K, two stages, every scale mode family, int2, int3 and int4, S over
// several of the update's chunks (bf16, f16 and f32 inputs). Each
// input is also encoded from an address off 16 bytes, where the encoder reads stage
// 0's points from an fp32 copy instead of the input itself: the same bytes.
QVG_TEST(gpu_encode_equals_host_replay_of_its_assignments) {
  TestStream st;
  struct Case {
    qvg::Shape4 sh;
    Mode m;
    int K;
  };
  const std::vector<Case> cases = {
      {{1, 4096, 4, 128}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 256},
      {{1, 4096, 4, 128}, {4, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 256},
      {{1, 4096, 4, 128}, {2, true, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 128},
      {{1, 4096, 4, 128}, {4, true, qvg::ScaleDType::BF16, qvg::Scaling::Compat, 1}, 128},
      {{1, 4096, 4, 128}, {2, false, qvg::ScaleDType::BF16, qvg::Scaling::TwoLevel, 2}, 128},
      {{2, 2000, 2, 64}, {4, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::Compat, 2}, 64},
      {{1, 1000, 2, 48}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 32},    // generic assign
      {{1, 100, 2, 64}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 256},    // S < K
      {{1, 2048, 2, 256}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 256},  // D = 256 MMA
      {{1, 1500, 3, 256}, {4, true, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 2}, 128},   // D = 256 MMA
      {{1, 2048, 2, 128}, {3, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 128},  // int3
      {{1, 1000, 2, 64}, {3, true, qvg::ScaleDType::BF16, qvg::Scaling::Compat, 2}, 64},           // int3
      // the update over three chunks of kUpdPoints (4,096) points, stage 0 from each input dtype
      {{1, 9000, 2, 128}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 2}, 256},
  };
  uint32_t seed = 500;
  int compared = 0;
  for (const Case& c : cases)
    for (qvg::DType in : c.sh.s > 4096 ? std::vector{qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}
                                       : std::vector{qvg::DType::BF16, qvg::DType::F32}) {
      const qvg::CodecConfig cfg = config_of(c.m, c.K, 64 <= c.sh.d ? 64 : 16);
      const qvg::Tensor x = make_data(in, c.sh, seed++);
      DeviceBuffer dx = to_device(x.data(), x.nbytes(), st.s);
      const qvg::ConstTensorView xv{dx.data(), in, c.sh};
      qvg::cuda::check_input_limits(xv, "input", st.s);
      const size_t trace_bytes = size_t(cfg.stages * cfg.kmeans_iters) * size_t(c.sh.b * c.sh.h * c.sh.s);
      DeviceBuffer dtrace(trace_bytes, st.s);
      const qvg::EncodedTensor gpu =
          qvg::cuda::detail::encode_traced(xv, cfg, st.s, qvg::cuda::default_allocator(), dtrace.data()).download(st.s);
      const std::vector<uint8_t> trace = to_host(dtrace.data(), trace_bytes, st.s);
      const qvg::EncodedTensor gpu2 = qvg::cuda::encode(xv, cfg, st.s).download(st.s);
      {
        // The same input one element past a 16-byte boundary: the encoder then reads
        // stage 0's points from an fp32 copy instead of the input itself
        // (src/codec/cuda/encode.cpp); the two must give the same bytes.
        const size_t esz = qvg::dtype_size(in);
        DeviceBuffer dxo(x.nbytes() + esz, st.s);
        uint8_t* po = static_cast<uint8_t*>(dxo.data()) + esz;
        QVG_GPU_CHECK(cudaMemcpyAsync(po, x.data(), x.nbytes(), cudaMemcpyHostToDevice, st.s));
        const qvg::EncodedTensor gpu3 = qvg::cuda::encode(qvg::ConstTensorView{po, in, c.sh}, cfg, st.s).download(st.s);
        QVG_EXPECT(gpu3 == gpu2) << describe(c.m) << "in" << qvg::dtype_name(in) << "shape" << c.sh.str()
                                 << "an input off 16 bytes (read through its fp32 copy) encodes differently";
      }
      bool valid = true;
      try {
        gpu.validate();
      } catch (const qvg::Error& err) {
        valid = false;
        QVG_EXPECT(false) << "invalid GPU encoding:" << err.what();
      }
      if (!valid) continue;
      QVG_EXPECT(gpu == gpu2) << describe(c.m) << "GPU encode is not deterministic (or the trace changed it)";
      qvg::testing::AssignmentAgreement agree;
      const std::string diff = qvg::testing::check_against_replay(x, cfg, gpu, trace, nullptr, &agree);
      QVG_EXPECT(diff.empty()) << describe(c.m) << "in" << qvg::dtype_name(in) << "shape" << c.sh.str()
                               << "differs from the host replay of its assignments in:" << diff;
      QVG_EXPECT(agree.within_spec()) << describe(c.m) << "in" << qvg::dtype_name(in) << "shape" << c.sh.str()
                                      << "assignments outside spec 1.1's agreement:" << agree.describe();
      ++compared;
      const double cpu_mse = rel_mse(x, qvg::decode(qvg::encode(x, cfg)));
      const double gpu_mse = rel_mse(x, qvg::decode(gpu));
      std::printf("  %s in=%s shape=%s K=%d: replay %s; assignments: %s; rel MSE cpu %.4e gpu %.4e (ratio %.4f)\n",
                  describe(c.m).c_str(), std::string(qvg::dtype_name(in)).c_str(), c.sh.str().c_str(), c.K,
                  diff.empty() ? "equal" : "DIFFERS", agree.describe().c_str(), cpu_mse, gpu_mse, gpu_mse / cpu_mse);
    }
  QVG_EXPECT(compared == 27) << compared;
}

QVG_TEST(check_input_limits_reports_first_bad_element) {
  TestStream st;
  std::vector<float> v(10000, 1.0f);
  v[7777] = 2e16f;
  v[8888] = NAN;
  DeviceBuffer d = to_device(v.data(), v.size() * 4, st.s);
  bool threw = false;
  try {
    qvg::cuda::check_input_limits(qvg::ConstTensorView{d.data(), qvg::DType::F32, {1, 10000, 1, 1}}, "x", st.s);
  } catch (const qvg::InvalidArgument& e) {
    // the CPU's message: the first bad value and its [b, t, h, d] index
    threw = std::string(e.what()) == "x must hold finite values with |x| <= 1e16, got 2e+16 at [0, 7777, 0, 0]";
  }
  QVG_EXPECT(threw);
}

// The pair check of a cache update: the first tensor with a bad element is named, a
// clean pair passes, and the flag buffer comes from the allocator given (counted).
QVG_TEST(check_input_limits_of_a_pair_names_the_bad_tensor_and_uses_the_allocator) {
  struct Counting final : qvg::cuda::Allocator {
    int calls = 0;
    void* allocate(size_t bytes, qvg::cuda::Stream s) override {
      ++calls;
      return qvg::cuda::default_allocator().allocate(bytes, s);
    }
    void deallocate(void* p, size_t bytes, qvg::cuda::Stream s) noexcept override {
      qvg::cuda::default_allocator().deallocate(p, bytes, s);
    }
  } counting;
  TestStream st;
  std::vector<float> good(4096, 0.5f), bad(4096, 0.5f);
  bad[1234] = INFINITY;
  DeviceBuffer dg = to_device(good.data(), good.size() * 4, st.s), db = to_device(bad.data(), bad.size() * 4, st.s);
  const qvg::ConstTensorView g{dg.data(), qvg::DType::F32, {1, 4096, 1, 1}},
      b{db.data(), qvg::DType::F32, {1, 4096, 1, 1}};
  qvg::cuda::check_input_limits(g, "key", g, "value", st.s, counting);  // passes
  QVG_EXPECT(counting.calls == 1);
  for (const bool bad_is_key : {true, false}) {
    std::string msg;
    try {
      qvg::cuda::check_input_limits(bad_is_key ? b : g, "key", bad_is_key ? g : b, "value", st.s, counting);
    } catch (const qvg::InvalidArgument& e) {
      msg = e.what();
    }
    QVG_EXPECT(msg == fmt::format("{} must hold finite values with |x| <= 1e16, got inf at [0, 1234, 0, 0]",
                                  bad_is_key ? "key" : "value"))
        << msg;
  }
  QVG_EXPECT(counting.calls == 3);
}

// ---- the device packed cache ---------------------------------------------------

namespace {

/// Segment list and raw bytes of the device cache (for "a rejected call changes nothing").
struct DevSnapshot {
  std::vector<std::string> segs;
  std::vector<std::vector<uint8_t>> raw;
  int64_t ge = 0;
  size_t resident = 0;
  bool operator==(const DevSnapshot&) const = default;
};
DevSnapshot snapshot(const qvg::cuda::PackedCausalCache& c, cudaStream_t s) {
  DevSnapshot d;
  d.ge = c.global_end();
  d.resident = c.resident_nbytes();
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto sg = c.segment(i);
    d.segs.push_back(std::to_string(sg.g0) + "," + std::to_string(sg.g1) + "," + std::to_string(sg.is_sink) + "," +
                     std::to_string(sg.packed) + "," + std::to_string(sg.chunks));
    if (!sg.packed) {
      d.raw.push_back(view_to_host(sg.k_raw, s));
      d.raw.push_back(view_to_host(sg.v_raw, s));
    }
  }
  return d;
}

/// Segments of the device cache and the CPU packed cache agree (g0, g1, sink, packed, chunks).
std::string compare_segments(const qvg::cuda::PackedCausalCache& d, const qvg::PackedCausalCache& c) {
  if (d.num_segments() != c.num_segments())
    return "segment count " + std::to_string(d.num_segments()) + " vs CPU " + std::to_string(c.num_segments());
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto a = d.segment(i);
    const auto b = c.segment(i);
    if (a.g0 != b.g0 || a.g1 != b.g1 || a.is_sink != b.is_sink || a.packed != b.packed || a.chunks != b.chunks ||
        a.current != b.current)
      return "segment " + std::to_string(i) + " differs";
  }
  if (d.global_end() != c.global_end() || d.chunk_tokens() != c.chunk_tokens()) return "cursors differ";
  return "";
}

int error_kind(const std::exception_ptr& e) {
  if (!e) return 0;
  try {
    std::rethrow_exception(e);
  } catch (const qvg::InvalidArgument&) {
    return 1;
  } catch (const qvg::Unsupported&) {
    return 2;
  } catch (const qvg::OutOfRange&) {
    return 3;
  } catch (...) {
    return 4;
  }
}

qvg::Tensor random_chunk(qvg::DType dt, qvg::Shape4 sh, std::mt19937& rng) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  qvg::Tensor t(dt, sh);
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t i = 0; i < sh.s; ++i)
      for (int64_t h = 0; h < sh.h; ++h)
        for (int64_t d = 0; d < sh.d; ++d) t.set(b, i, h, d, 3.0f * n01(rng));
  return t;
}

}  // namespace

QVG_TEST(device_packed_cache_quant_off_matches_cpu_caches) {
  TestStream st;
  int calls = 0, compared_dense = 0, rejected = 0, copied = 0, zero_copy = 0, sliced = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    qvg::CacheOptions o;
    o.batch = pick(1, 2);
    o.heads = pick(1, 4);
    o.head_dim = seed % 2 ? 64 : 24;
    o.dtype = seed % 3 == 0 ? qvg::DType::F32 : qvg::DType::BF16;
    const int64_t chunk = pick(2, 12);
    o.sink_tokens = pick(0, 1) ? 0 : pick(1, 2 * chunk);
    o.cache_size = o.sink_tokens + pick(chunk, 5 * chunk);
    if (seed % 4 == 0) o.attention_window_size = pick(std::min(o.cache_size, chunk + o.sink_tokens), o.cache_size);
    bool with_dense = o.window() == o.cache_size;
    const std::string what = "seed " + std::to_string(seed);
    qvg::cuda::PackedCausalCache dev(o);
    qvg::PackedCausalCache cpu(o);
    qvg::DenseCausalCache dense(o);
    for (int step = 0; step < 40; ++step) {
      if (pick(0, 30) == 0) {
        dev.reset_indices();
        cpu.reset_indices();
        dense.reset_indices();
        continue;
      }
      // An advance (all heads) or a denoising rewrite (maybe head-sliced), or a bad call.
      const bool rewrite = cpu.num_segments() > 0 && pick(0, 2) == 0;
      int64_t c = cpu.global_end(), n = std::max<int64_t>(1, chunk + pick(-1, 1));
      if (rewrite) {
        const auto cur = cpu.segment(cpu.num_segments() - 1);
        c = cur.g0;
        n = cur.g1 - cur.g0;
      }
      const int bad = int(pick(0, 12));  // 0: wrong c, 1: a NaN, 2: a too long chunk
      if (bad == 0) c += pick(1, 3);
      if (bad == 2) n = o.cache_size + 1;
      int64_t h_in = o.heads;
      std::optional<int64_t> hs, rw;
      if (rewrite && pick(0, 1)) {
        h_in = pick(1, o.heads);
        hs = pick(0, o.heads - h_in);
      }
      if (pick(0, 2) == 0) rw = pick(0, 3) == 0 ? 0 : pick(0, o.cache_size);  // rw = 0: often zero-copy
      qvg::Tensor k = random_chunk(o.dtype, {o.batch, n, h_in, o.head_dim}, rng);
      qvg::Tensor v = random_chunk(o.dtype, {o.batch, n, h_in, o.head_dim}, rng);
      // A NaN in a denoising rewrite: the device checks it without waiting (docs/cuda.md,
      // "update() does not wait"): the call returns, check() raises the CPU's error, and the
      // rows were not written (the cache as before). In an advance the device's positions
      // would advance with zero rows, which the CPU cache does not do (async_update_tests'
      // deferred_check_* test that case), so a NaN is put only into rewrites.
      const bool deferred = bad == 1 && rewrite;
      if (deferred) v.set(0, n - 1, 0, 1, NAN);
      DeviceBuffer dk = to_device(k.data(), k.nbytes(), st.s), dv = to_device(v.data(), v.nbytes(), st.s);
      const qvg::ConstTensorView dkv{dk.data(), o.dtype, k.shape()}, dvv{dv.data(), o.dtype, v.shape()};

      const DevSnapshot before = snapshot(dev, st.s);
      std::exception_ptr de, ce, xe;
      qvg::KVView dview, cview, xview;
      try {
        dview = dev.update(dkv, dvv, c, st.s, hs, rw);
        if (deferred) dev.check(st.s);  // raises the device's finding
      } catch (...) {
        de = std::current_exception();
      }
      try {
        cview = cpu.update(k.view(), v.view(), c, hs, rw);
      } catch (...) {
        ce = std::current_exception();
      }
      if (with_dense && !ce) {  // a call the packed cache rejects is applied to neither (the dense cache may
                                // accept it, e.g. an advance with a gap); one only the dense cache rejects
                                // ends the dense comparison of this sequence
        try {
          xview = dense.update(k.view(), v.view(), c, hs, rw);
        } catch (...) {
          xe = std::current_exception();
        }
        if (xe) with_dense = false;
      }
      QVG_EXPECT(error_kind(de) == error_kind(ce))
          << what << "step" << step << "device error kind" << error_kind(de) << "vs CPU" << error_kind(ce);
      if (ce || de) {
        ++rejected;
        QVG_EXPECT(snapshot(dev, st.s) == before) << what << "a rejected call changed the device cache";
        continue;
      }
      ++calls;
      sliced += h_in != o.heads;
      (dview.zero_copy ? zero_copy : copied)++;
      const std::string segs = compare_segments(dev, cpu);
      QVG_EXPECT(segs.empty()) << what << "step" << step << segs;
      QVG_EXPECT(dview.zero_copy == cview.zero_copy && dview.k.shape == cview.k.shape &&
                 dview.local_start_index == cview.local_start_index && dview.local_end_index == cview.local_end_index &&
                 dview.visible_local_end == cview.visible_local_end &&
                 dview.visible_global_end == cview.visible_global_end)
          << what << "step" << step << "view metadata differs";
      const std::vector<uint8_t> gk = view_to_host(dview.k, st.s), gv = view_to_host(dview.v, st.s);
      QVG_EXPECT(gk == host_view_bytes(cview.k) && gv == host_view_bytes(cview.v))
          << what << "step" << step << "view != CPU packed view";
      if (with_dense) {
        ++compared_dense;
        QVG_EXPECT(gk == host_view_bytes(xview.k) && gv == host_view_bytes(xview.v))
            << what << "step" << step << "view != CPU dense view";
      }
      if (segs.empty())
        for (size_t i = 0; i < cpu.num_segments(); ++i) {
          const auto a = dev.segment(i);
          const auto b = cpu.segment(i);
          QVG_EXPECT(view_to_host(a.k_raw, st.s) == host_view_bytes(b.k_raw) &&
                     view_to_host(a.v_raw, st.s) == host_view_bytes(b.v_raw))
              << what << "step" << step << "raw segment" << i << "differs";
        }
      QVG_EXPECT(dev.resident_nbytes() == cpu.resident_nbytes()) << what << "resident bytes";
    }
  }
  std::printf(
      "  %d calls compared (%d also with the dense cache; %d copied, %d zero-copy, %d head-sliced), %d rejected\n",
      calls, compared_dense, copied, zero_copy, sliced, rejected);
  QVG_EXPECT(calls > 500 && compared_dense > 200 && rejected > 50 && zero_copy > 10 && sliced > 20);
}

QVG_TEST(device_packed_cache_int2_matches_cpu_decode_of_its_encodings) {
  TestStream st;
  qvg::CacheOptions o;
  o.batch = 2;
  o.heads = 2;
  o.head_dim = 64;
  o.dtype = qvg::DType::BF16;
  o.sink_tokens = 32;
  o.cache_size = 192;
  o.attention_window_size = 160;
  qvg::QuantArgs q;
  q.enable(2);
  q.codec.centroids = 16;
  q.codec.block_size = 32;
  q.keep_recent_chunks = 1;
  q.span_chunks = 2;
  q.sink = true;
  q.sink_span = qvg::SinkSpan::Chunk;
  qvg::cuda::PackedCausalCache dev(o, q);
  qvg::PackedCausalCache cpu(o, q);
  qvg::PackedCausalCache truth(o);  // quantization off: the values written
  std::mt19937 rng(77);
  const int64_t chunk = 16, max_tokens = 36 * chunk;
  double dev_err = 0, cpu_err = 0, energy = 0;
  int packed_rows = 0, raw_rows = 0, replayed = 0;
  // The values last written at each global token ([kv][b][token][h][d]): a packed
  // segment's input, re-encoded directly on the device and replayed on the host.
  const size_t tok_bytes = size_t(o.heads * o.head_dim) * 2;
  std::vector<uint8_t> written(size_t(2 * o.batch * max_tokens) * tok_bytes);
  std::set<std::tuple<int, int64_t, int64_t>> encodings_checked;
  const qvg::CodecConfig codec = q.codec;
  for (int step = 0; step < 36; ++step) {
    const bool rewrite = step % 3 == 2;
    const int64_t c = rewrite ? cpu.segment(cpu.num_segments() - 1).g0 : cpu.global_end();
    const qvg::Shape4 sh{o.batch, chunk, o.heads, o.head_dim};
    const qvg::Tensor k = make_data(o.dtype, sh, 1000u + uint32_t(step), 30.0f);
    const qvg::Tensor v = make_data(o.dtype, sh, 2000u + uint32_t(step), 30.0f);
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t b = 0; b < o.batch; ++b)
        std::memcpy(written.data() + size_t((kv * o.batch + b) * max_tokens + c) * tok_bytes,
                    static_cast<const uint8_t*>((kv ? v : k).data()) + size_t(b * chunk) * tok_bytes,
                    size_t(chunk) * tok_bytes);
    DeviceBuffer dk = to_device(k.data(), k.nbytes(), st.s), dv = to_device(v.data(), v.nbytes(), st.s);
    const qvg::KVView dview = dev.update({dk.data(), o.dtype, sh}, {dv.data(), o.dtype, sh}, c, st.s);
    const qvg::KVView cview = cpu.update(k.view(), v.view(), c);
    const qvg::KVView tview = truth.update(k.view(), v.view(), c);
    const std::string segs = compare_segments(dev, cpu);
    QVG_EXPECT(segs.empty()) << "step" << step << segs;
    if (!segs.empty()) return;
    QVG_EXPECT(dview.k.shape == cview.k.shape && dview.local_start_index == cview.local_start_index);
    // The view's global positions: [0, sink_end) ++ [lo, global_end).
    const int64_t ge = cpu.global_end(), se = std::min(o.sink_tokens, ge);
    const int64_t lo = std::max(se, ge - std::max<int64_t>(0, o.window() - se));
    const int64_t T = se + (ge - lo);
    QVG_EXPECT(T == dview.k.shape.s);
    const size_t esz = 2, row = size_t(o.heads * o.head_dim) * esz;
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint8_t> got = view_to_host(kv ? dview.v : dview.k, st.s);
      const std::vector<uint8_t> ref = host_view_bytes(kv ? cview.v : cview.k);
      const std::vector<uint8_t> tru = host_view_bytes(kv ? tview.v : tview.k);
      for (size_t i = 0; i < dev.num_segments(); ++i) {
        const auto sg = dev.segment(i);
        std::optional<qvg::Tensor> dec;
        if (sg.packed) {  // the CPU decode of the device's encoding
          const qvg::EncodedTensor e = (kv ? sg.v_enc : sg.k_enc)->download(st.s);
          dec.emplace(o.dtype, e.shape);
          qvg::decode(e, dec->view());
          if (encodings_checked.insert({kv, sg.g0, sg.g1}).second) {
            // The encoding is the device encoder's of the segment's values, and that is
            // the host replay of its own assignments (no error margin).
            const qvg::Shape4 ssh{o.batch, sg.g1 - sg.g0, o.heads, o.head_dim};
            qvg::Tensor in(o.dtype, ssh);
            for (int64_t b = 0; b < o.batch; ++b)
              std::memcpy(static_cast<uint8_t*>(in.data()) + size_t(b * ssh.s) * tok_bytes,
                          written.data() + size_t((kv * o.batch + b) * max_tokens + sg.g0) * tok_bytes,
                          size_t(ssh.s) * tok_bytes);
            DeviceBuffer din = to_device(in.data(), in.nbytes(), st.s);
            const size_t trace_bytes = size_t(codec.stages * codec.kmeans_iters) * size_t(ssh.b * ssh.h * ssh.s);
            DeviceBuffer dtrace(trace_bytes, st.s);
            const qvg::EncodedTensor direct =
                qvg::cuda::detail::encode_traced({din.data(), o.dtype, ssh}, codec, st.s,
                                                 qvg::cuda::default_allocator(), dtrace.data())
                    .download(st.s);
            QVG_EXPECT(direct == e) << "step" << step << "segment" << sg.g0 << sg.g1
                                    << "the cache's encoding != the device encoder's of its values";
            const std::string diff =
                qvg::testing::check_against_replay(in, codec, direct, to_host(dtrace.data(), trace_bytes, st.s));
            QVG_EXPECT(diff.empty()) << "step" << step << "segment" << sg.g0 << sg.g1 << "replay differs:" << diff;
            ++replayed;
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          const int64_t g = t < se ? t : lo + (t - se);
          if (g < sg.g0 || g >= sg.g1) continue;
          for (int64_t b = 0; b < o.batch; ++b) {
            const size_t at = size_t(b * T + t) * row;
            if (!sg.packed) {
              ++raw_rows;
              QVG_EXPECT(std::memcmp(got.data() + at, ref.data() + at, row) == 0 &&
                         std::memcmp(got.data() + at, tru.data() + at, row) == 0)
                  << "step" << step << "raw token" << g << "differs";
              continue;
            }
            ++packed_rows;
            const auto* want =
                static_cast<const uint8_t*>(dec->data()) + size_t(b * sg.k_enc->shape.s + (g - sg.g0)) * row;
            QVG_EXPECT(std::memcmp(got.data() + at, want, row) == 0)
                << "step" << step << "packed token" << g << "!= CPU decode of the device encoding";
            for (int64_t j = 0; j < o.heads * o.head_dim; ++j) {
              const float x = qvg::load_f32(tru.data() + at, o.dtype, size_t(j));
              const float gd = qvg::load_f32(got.data() + at, o.dtype, size_t(j));
              const float cd = qvg::load_f32(ref.data() + at, o.dtype, size_t(j));
              dev_err += (double(gd) - x) * (double(gd) - x);
              cpu_err += (double(cd) - x) * (double(cd) - x);
              energy += double(x) * x;
            }
          }
        }
      }
    }
  }
  std::printf(
      "  %d packed and %d raw view rows checked, %d encodings replayed; relative MSE on packed rows: device %.4g, "
      "CPU %.4g (not asserted)\n",
      packed_rows, raw_rows, replayed, dev_err / energy, cpu_err / energy);
  QVG_EXPECT(packed_rows > 1000 && raw_rows > 500 && replayed > 10) << packed_rows << raw_rows << replayed;
}

// tests/gpu/all_settings_tests.cpp: the every-setting measurements (scripts/gpu-check, part 2).
int all_settings_measure(int argc, char** argv);

int main(int argc, char** argv) {
  const int n = qvg::cuda::device_count();
  if (n == 0) {
    std::fprintf(stderr, "qvg_gpu_tests: no CUDA device (device_count() == 0); nothing run\n");
    return 2;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor, p.multiProcessorCount,
                double(p.totalGlobalMem) / (1u << 30));
  if (argc > 1 && std::string(argv[1]) == "--all-settings-measure") return all_settings_measure(argc, argv);
  return qvg::testing::run_all(argc, argv);
}
