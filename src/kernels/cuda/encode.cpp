// The device encoder (spec 1.1, 1.2): the host side enqueues the points with their
// group mean, then per stage centring, initial indices and centroids, kmeans_iters
// x (assignment, update), stored centroids and (but for the last stage) the next
// residual with its mean; then the residual quantizer, which subtracts the last
// stage's centroids itself. Every group
// is processed by the same launches; early stopping is decided per group on the
// device (kernels of a stopped group return at once), so nothing synchronizes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include <fmt/core.h>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "qvg/cuda.h"

namespace qvg::cuda {
namespace {

/// Carves 256-byte aligned pieces out of one scratch allocation.
class Carver {
 public:
  size_t take(size_t bytes) {
    const size_t off = used_;
    used_ += (bytes + 255) & ~size_t(255);
    return off;
  }
  size_t size() const { return used_; }

 private:
  size_t used_ = 0;
};

}  // namespace

DeviceEncodedTensor detail::encode_traced(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc,
                                          void* ids_trace) {
  if (x.data == nullptr) throw InvalidArgument("encode input is null");
  if (cfg.init != Init::Random)
    throw Unsupported(fmt::format("the CUDA encoder supports init random only, got init {}", name(cfg.init)));
  if (cfg.scale_search != ScaleSearch::Off)
    throw Unsupported(
        fmt::format("the CUDA encoder supports scale_search off only, got scale_search {}", name(cfg.scale_search)));
  DeviceEncodedTensor enc = DeviceEncodedTensor::allocate(x.shape, x.dtype, cfg, stream, alloc);
  const int64_t B = x.shape.b, S = x.shape.s, H = x.shape.h, D = x.shape.d, G = B * H;
  const int K = cfg.centroids, iters = cfg.kmeans_iters;
  const int k_eff = int(std::min<int64_t>(K, S));
  const int64_t nb = D / cfg.block_size;

  Carver cv;
  const int64_t nchunk = (S + kernels::kMeanChunk - 1) / kernels::kMeanChunk;
  const size_t o_r = cv.take(size_t(G * S * D) * 4);
  const size_t o_xb = cv.take(size_t(G * S * D) * 2);
  const size_t o_part = cv.take(size_t(G * nchunk * D) * 8);
  const size_t o_mu = cv.take(size_t(G * D) * 4);
  const size_t o_maxabs = cv.take(size_t(G) * 4);
  const size_t o_idx = cv.take(size_t(G * K) * 4);
  const size_t o_c = cv.take(size_t(G * K * D) * 4);
  const size_t o_cb = cv.take(size_t(G * K * D) * 2);
  const size_t o_cn = cv.take(size_t(G * K) * 4);
  const size_t o_stored = cv.take(size_t(G * K * D) * 4);
  const size_t o_sums = cv.take(size_t(G * K * D) * 8);
  const size_t o_counts = cv.take(size_t(G * K) * 4);
  const size_t o_changed = cv.take(size_t(iters) * size_t(G) * 4);
  const size_t o_raws = cv.take(size_t(G * S * nb) * 4);
  const size_t o_rawz = cv.take(cfg.asymmetric ? size_t(G * S * nb) * 4 : 0);
  const size_t o_gmax = cv.take(size_t(2 * G) * 4);
  DeviceBuffer scratch(cv.size(), stream, alloc);
  uint8_t* base = static_cast<uint8_t*>(scratch.data());
  const auto F = [&](size_t off) { return reinterpret_cast<float*>(base + off); };
  float* r = F(o_r);
  uint16_t* xb = reinterpret_cast<uint16_t*>(base + o_xb);
  double* partial = reinterpret_cast<double*>(base + o_part);
  float* mu = F(o_mu);
  float* maxabs = F(o_maxabs);
  uint32_t* idx = reinterpret_cast<uint32_t*>(base + o_idx);
  float* c = F(o_c);
  uint16_t* cb = reinterpret_cast<uint16_t*>(base + o_cb);
  float* cnorm = F(o_cn);
  float* stored = F(o_stored);
  long long* sums = reinterpret_cast<long long*>(base + o_sums);
  int* counts = reinterpret_cast<int*>(base + o_counts);
  int* changed = reinterpret_cast<int*>(base + o_changed);

  const size_t esz = dtype_size(x.dtype);
  const double stop = 1e-4 * double(S);

  // Stage 0's points and mean; each later stage's come from the previous stage's
  // subtraction (finish_stage). The last stage's residual is never written: the
  // quantizer subtracts its stored centroids itself.
  // stage 0's initial indices are drawn by the gather's launch, beside it
  kernels::InitDraw draw;
  draw.idx = idx;
  draw.K = K;
  draw.k_eff = k_eff;
  draw.seed = cfg.seed;
  draw.head_offset = cfg.head_offset;
  kernels::gather_points(x.data, arith_dtype(x.dtype), B, S, H, D, r, partial, mu, stream, draw);
  const uint8_t* last_ids = nullptr;
  for (int st = 0; st < cfg.stages; ++st) {
    uint8_t* ids = enc.mutable_data(EncodedArray::Ids) + size_t(st) * size_t(G * S);
    void* out_c = enc.mutable_data(EncodedArray::Centroids) + size_t(st) * size_t(G * K * D) * esz;
    QVG_CUDA(cudaMemsetAsync(changed, 0, size_t(iters) * size_t(G) * 4, stream));
    QVG_CUDA(cudaMemsetAsync(maxabs, 0, size_t(G) * 4, stream));
    kernels::center_points(r, mu, G, S, D, xb, maxabs, stream);
    if (st > 0) kernels::init_indices(G, H, S, K, k_eff, cfg.seed, st, cfg.head_offset, idx, stream);
    kernels::init_centroids(r, mu, idx, G, S, D, K, k_eff, c, stream);
    for (int it = 0; it < iters; ++it) {
      kernels::prepare_centroids(c, G, D, K, k_eff, cb, cnorm, stream);
      kernels::assign(xb, cb, cnorm, G, S, D, K, ids, changed, it, stop, stream);
      if (ids_trace != nullptr)  // the GPU tests' replay (tests/gpu/encode_replay.h)
        QVG_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(ids_trace) + (size_t(st) * iters + size_t(it)) * size_t(G * S),
                                 ids, size_t(G * S), cudaMemcpyDeviceToDevice, stream));
      kernels::update_centroids(r, mu, maxabs, ids, G, S, D, K, sums, counts, c, changed, it, stop, stream);
    }
    kernels::finish_stage(r, c, mu, ids, G, S, D, K, k_eff, arith_dtype(x.dtype), out_c, stored, st + 1 == cfg.stages,
                          partial, stream);
    last_ids = ids;
  }
  kernels::QuantizeArgs q;
  q.r = r;
  q.stored = stored;
  q.ids = last_ids;
  q.G = G;
  q.S = S;
  q.D = D;
  q.K = K;
  q.bits = cfg.bits;
  q.block = cfg.block_size;
  q.asymmetric = cfg.asymmetric;
  q.fp8 = cfg.scale_dtype == ScaleDType::FP8_E4M3;
  q.two_level = cfg.scaling == Scaling::TwoLevel;
  q.codes = enc.mutable_data(EncodedArray::Codes);
  q.scales = enc.mutable_data(EncodedArray::Scales);
  q.zeros = enc.mutable_data(EncodedArray::Zeros);                                         // nullptr unless asymmetric
  q.scale_factor = reinterpret_cast<float*>(enc.mutable_data(EncodedArray::ScaleFactor));  // nullptr unless two_level
  q.zero_factor = reinterpret_cast<float*>(enc.mutable_data(EncodedArray::ZeroFactor));
  q.raw_s = F(o_raws);
  q.raw_z = cfg.asymmetric ? F(o_rawz) : nullptr;
  q.group_max = F(o_gmax);
  kernels::quantize_residual(q, stream);
  return enc;  // `scratch` is freed on `stream`, after the kernels above
}

DeviceEncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc) {
  return detail::encode_traced(x, cfg, stream, alloc, nullptr);
}

namespace {

// The first element index of each tensor with a non-finite value or |x| > 1e16 (its
// element count when none): one flag buffer, one copy back, one synchronization.
void check_limits(std::initializer_list<std::pair<ConstTensorView, const char*>> xs, Stream stream, Allocator& alloc) {
  unsigned long long init[2] = {0, 0}, first[2] = {0, 0};
  QVG_CHECK(xs.size() <= 2);
  size_t i = 0;
  bool any = false;
  for (const auto& [x, what] : xs) {
    init[i++] = (unsigned long long)x.shape.numel();
    any = any || x.shape.numel() > 0;
  }
  if (!any) return;
  DeviceBuffer flag(sizeof init, stream, alloc);
  auto* p = static_cast<unsigned long long*>(flag.data());
  QVG_CUDA(cudaMemcpyAsync(p, init, sizeof init, cudaMemcpyHostToDevice, stream));
  i = 0;
  for (const auto& [x, what] : xs) {
    if (x.shape.numel() > 0) kernels::first_out_of_limit(x.data, arith_dtype(x.dtype), x.shape.numel(), p + i, stream);
    ++i;
  }
  QVG_CUDA(cudaMemcpyAsync(first, p, sizeof first, cudaMemcpyDeviceToHost, stream));
  QVG_CUDA(cudaStreamSynchronize(stream));
  i = 0;
  for (const auto& [x, what] : xs) {
    if (first[i] < init[i]) {
      // The CPU's message (check_finite_and_bounded): the value and its [b, t, h, d] index.
      const size_t es = dtype_size(x.dtype);
      unsigned char elem[8] = {};
      QVG_CUDA(cudaMemcpy(elem, static_cast<const unsigned char*>(x.data) + first[i] * es, es, cudaMemcpyDeviceToHost));
      const float v = load_f32(elem, x.dtype, 0);
      const auto& s = x.shape;
      const int64_t k = int64_t(first[i]);
      throw InvalidArgument(fmt::format("{} must hold finite values with |x| <= 1e16, got {} at [{}, {}, {}, {}]", what,
                                        v, k / (s.d * s.h * s.s), (k / (s.d * s.h)) % s.s, (k / s.d) % s.h, k % s.d));
    }
    ++i;
  }
}

}  // namespace

void check_input_limits(ConstTensorView x, const char* what, Stream stream) {
  check_limits({{x, what}}, stream, default_allocator());
}

void check_input_limits(ConstTensorView a, const char* what_a, ConstTensorView b, const char* what_b, Stream stream,
                        Allocator& alloc) {
  check_limits({{a, what_a}, {b, what_b}}, stream, alloc);
}

}  // namespace qvg::cuda
