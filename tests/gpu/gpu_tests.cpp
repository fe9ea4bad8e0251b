// GPU tests of the CUDA backend (need a CUDA device; exit status 2 without one).
// Self-contained: links qvg_cuda (qvg_lib + CUDA) and the tiny harness only, so it
// builds on the device machine (no gtest there). Run by scripts/gpu-check.
//
// - decode on the GPU == decode on the CPU, bit for bit, in every mode (bits 2/4,
//   sym/asym, fp8/bf16 scales, two_level/compat, 1/2 stages, bf16/f16/f32 input,
//   bf16/f16/f32 output), whole tensors and strided multi-task windows;
// - GPU encode: a valid EncodedTensor the CPU decodes, relative MSE within 1 % of
//   the CPU encoder's on the same data; deterministic; its residual quantization
//   equals the CPU quantizer's bytes for the residual its centroids leave;
// - check_input_limits finds the first bad element.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "codec/encode_impl.h"
#include "gpu/harness.h"
#include "qvg/codec.h"
#include "qvg/cuda.h"
#include "qvg/error.h"

namespace {

using qvg::cuda::DeviceBuffer;

#define CK(call) \
  do { \
    cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

DeviceBuffer to_device(const void* p, size_t n, cudaStream_t s) {
  DeviceBuffer b(n, s);
  CK(cudaMemcpyAsync(b.data(), p, n, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  return b;
}
std::vector<uint8_t> to_host(const void* p, size_t n, cudaStream_t s) {
  std::vector<uint8_t> v(n);
  CK(cudaMemcpyAsync(v.data(), p, n, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return v;
}

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

struct Mode {
  int bits;
  bool asym;
  qvg::ScaleDType sd;
  qvg::Scaling sc;
  int stages;
};
std::vector<Mode> all_modes() {
  std::vector<Mode> m;
  for (int bits : {2, 4})
    for (bool asym : {false, true})
      for (auto sd : {qvg::ScaleDType::FP8_E4M3, qvg::ScaleDType::BF16})
        for (auto sc : {qvg::Scaling::TwoLevel, qvg::Scaling::Compat})
          for (int stages : {1, 2}) m.push_back({bits, asym, sd, sc, stages});
  return m;
}
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

struct StreamHolder {
  cudaStream_t s = nullptr;
  StreamHolder() { CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~StreamHolder() { cudaStreamDestroy(s); }
};

}  // namespace

QVG_TEST(decode_matches_cpu_bit_for_bit) {
  StreamHolder st;
  struct ShapeCase {
    qvg::Shape4 sh;
    int block, K;
  };
  const ShapeCase shapes[] = {{{2, 333, 3, 128}, 64, 64}, {{1, 150, 2, 64}, 32, 256}, {{1, 70, 2, 12}, 4, 16}};
  int checked = 0;
  uint32_t seed = 7;
  for (const ShapeCase& sc : shapes)
    for (const Mode& m : all_modes())
      for (qvg::DType in : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
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
              << describe(m) << "in" << qvg::dtype_name(in) << "out" << qvg::dtype_name(out) << "shape"
              << sc.sh.str();
          ++checked;
        }
      }
  std::printf("  %d tensor decodes compared\n", checked);
}

QVG_TEST(window_decode_tasks_match_cpu) {
  // Seven "chunks" (K and V each) decoded into one strided window buffer with a
  // head sub-range, as the packed cache's reconstruction does; 14 tasks = one launch,
  // and 20 tasks to cover several launches.
  StreamHolder st;
  const qvg::Shape4 sh{1, 96, 4, 128};
  for (int nchunks : {7, 10}) {
    std::vector<qvg::EncodedTensor> encs;
    for (int i = 0; i < 2 * nchunks; ++i) {
      Mode m{i % 2 ? 2 : 4, i % 3 == 0, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1};
      encs.push_back(qvg::encode(make_data(qvg::DType::BF16, sh, 100u + uint32_t(i)), config_of(m, 64, 64)));
    }
    std::vector<qvg::cuda::DeviceEncodedTensor> des;
    for (const auto& e : encs) des.push_back(qvg::cuda::DeviceEncodedTensor::upload(e, st.s));
    const int64_t h0 = 1, h1 = 4, hs = h1 - h0, D = sh.d;
    const int64_t token_stride = hs * D, window_tokens = nchunks * (sh.s - 3);
    const size_t bytes = size_t(2 * window_tokens * token_stride) * 2;  // K then V
    std::vector<uint8_t> ref(bytes, 0);
    DeviceBuffer dwin(bytes, st.s);
    CK(cudaMemsetAsync(dwin.data(), 0, bytes, st.s));
    std::vector<qvg::DecodeTask> cpu;
    std::vector<qvg::cuda::DeviceDecodeTask> gpu;
    for (int i = 0; i < 2 * nchunks; ++i) {
      const int kv = i % 2, chunk = i / 2;
      const int64_t off = (kv * window_tokens + chunk * (sh.s - 3)) * token_stride;
      qvg::DecodeTask c{&encs[size_t(i)], 3, sh.s, h0, h1,
                        qvg::DecodeTarget{ref.data() + off * 2, qvg::DType::BF16, 0, token_stride}};
      cpu.push_back(c);
      qvg::cuda::DeviceDecodeTask g{&des[size_t(i)], 3, sh.s, h0, h1,
                                    qvg::DecodeTarget{static_cast<uint8_t*>(dwin.data()) + off * 2,
                                                      qvg::DType::BF16, 0, token_stride}};
      gpu.push_back(g);
    }
    qvg::decode_ranges(cpu);
    qvg::cuda::decode_ranges(gpu, st.s);
    const std::vector<uint8_t> got = to_host(dwin.data(), bytes, st.s);
    QVG_EXPECT(got == ref) << "window of" << nchunks << "chunks";
  }
}

QVG_TEST(gpu_encode_quality_within_1pct_of_cpu) {
  StreamHolder st;
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
      {{1, 1000, 2, 48}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 32},  // generic assign
      {{1, 100, 2, 64}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 256},   // S < K
  };
  uint32_t seed = 500;
  for (const Case& c : cases)
    for (qvg::DType in : {qvg::DType::BF16, qvg::DType::F32}) {
      const qvg::CodecConfig cfg = config_of(c.m, c.K, 64 <= c.sh.d ? 64 : 16);
      const qvg::Tensor x = make_data(in, c.sh, seed++);
      const qvg::EncodedTensor cpu = qvg::encode(x, cfg);
      const double cpu_mse = rel_mse(x, qvg::decode(cpu));
      DeviceBuffer dx = to_device(x.data(), x.nbytes(), st.s);
      const qvg::ConstTensorView xv{dx.data(), in, c.sh};
      qvg::cuda::check_input_limits(xv, "input", st.s);
      const qvg::EncodedTensor gpu = qvg::cuda::encode(xv, cfg, st.s).download(st.s);
      const qvg::EncodedTensor gpu2 = qvg::cuda::encode(xv, cfg, st.s).download(st.s);
      bool valid = true;
      try {
        gpu.validate();
      } catch (const qvg::Error& err) {
        valid = false;
        QVG_EXPECT(false) << "invalid GPU encoding:" << err.what();
      }
      if (!valid) continue;
      QVG_EXPECT(gpu == gpu2) << describe(c.m) << "GPU encode is not deterministic";
      QVG_EXPECT(gpu.nbytes() == cpu.nbytes());
      const double gpu_mse = rel_mse(x, qvg::decode(gpu));
      std::printf("  %s in=%s shape=%s K=%d: rel MSE cpu %.4e gpu %.4e (ratio %.4f)\n", describe(c.m).c_str(),
                  std::string(qvg::dtype_name(in)).c_str(), c.sh.str().c_str(), c.K, cpu_mse, gpu_mse,
                  gpu_mse / cpu_mse);
      QVG_EXPECT(gpu_mse <= 1.01 * cpu_mse) << describe(c.m) << "gpu" << gpu_mse << "cpu" << cpu_mse;

      // The residual quantizer is bit-exact: re-quantize on the CPU the residual the
      // GPU's stored centroids and ids leave, and compare the bytes.
      const int64_t S = c.sh.s, H = c.sh.h, D = c.sh.d, Kc = cfg.centroids;
      qvg::EncodedTensor requant = gpu;
      const std::vector<float> xf = x.to_f32();
      std::vector<float> r(size_t(S * D));
      for (int64_t g = 0; g < gpu.groups(); ++g) {
        const int64_t b = g / H, h = g % H;
        for (int64_t t = 0; t < S; ++t)
          for (int64_t d = 0; d < D; ++d) {
            float v = xf[size_t(((b * S + t) * H + h) * D + d)];
            for (int s = 0; s < gpu.stages; ++s) {
              const int id = gpu.ids[size_t(s)][size_t(g * S + t)];
              v = v - gpu.centroid_at(s, b, h, id, d);
            }
            r[size_t(t * D + d)] = v;
          }
        (void)Kc;
        qvg::detail::quantize_residual_group(r.data(), g, requant);
      }
      QVG_EXPECT(requant.codes == gpu.codes && requant.scales == gpu.scales && requant.zeros == gpu.zeros &&
                 requant.scale_factor == gpu.scale_factor && requant.zero_factor == gpu.zero_factor)
          << describe(c.m) << "GPU residual quantization differs from the CPU quantizer";
    }
}

QVG_TEST(check_input_limits_reports_first_bad_element) {
  StreamHolder st;
  std::vector<float> v(10000, 1.0f);
  v[7777] = 2e16f;
  v[8888] = NAN;
  DeviceBuffer d = to_device(v.data(), v.size() * 4, st.s);
  bool threw = false;
  try {
    qvg::cuda::check_input_limits(qvg::ConstTensorView{d.data(), qvg::DType::F32, {1, 10000, 1, 1}}, "x", st.s);
  } catch (const qvg::InvalidArgument& e) {
    threw = std::string(e.what()).find("7777") != std::string::npos;
  }
  QVG_EXPECT(threw);
}

QVG_TEST(unsupported_init_is_rejected) {
  StreamHolder st;
  qvg::CodecConfig cfg;
  cfg.init = qvg::Init::KMeansPlusPlus;
  DeviceBuffer d(64 * 4, st.s);
  bool threw = false;
  try {
    (void)qvg::cuda::encode(qvg::ConstTensorView{d.data(), qvg::DType::F32, {1, 1, 1, 64}}, cfg, st.s);
  } catch (const qvg::Unsupported&) {
    threw = true;
  }
  QVG_EXPECT(threw);
}

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
  return qvg::testing::run_all(argc, argv);
}
