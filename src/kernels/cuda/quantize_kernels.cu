// The residual quantizer on the device (spec 1.2-1.4): the statistics of each block
// (raw scales and zeros, the group maxima), the stored scales (the two-level factor),
// the codes packed; plus the input-limit check and the clustered test-data fill. Every
// value is set by the bodies of encode_bodies.cuh (arith.cuh functions,
// bit-identical to quantize_residual_group; the host test runs them).
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/encode_bodies.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace qvg::cuda::kernels {
namespace {

namespace A = qvg::cuda_arith;

// ---- residual quantization -----------------------------------------------------

// Vectorised statistics: one thread per 8 channels (word w = t * D/8 + c of group
// g), the final residual computed in registers (residual8: r minus the stored
// centroid, never written). A block of bs channels is a segment of bs/8 lanes;
// the segment's run statistics merge down to its first lane in channel order
// (merge_segment_runs), and the first lane writes the block's raw scale (and zero). The group's maxima:
// block reduction, then one atomic per block.
__global__ void quantize_stats_vec_kernel(const __grid_constant__ QuantizeArgs a, int64_t bpg, int width) {
  __shared__ float red[32];
  const int64_t g = blockIdx.x / bpg, w = (blockIdx.x % bpg) * blockDim.x + threadIdx.x;
  const bool asym = a.asymmetric;
  // lanes past the group take part in the shuffles too
  const RunStats s = merge_segment_runs(stats_lane(a, g, w), width, asym);
  float ms = 0.0f, mz = 0.0f;
  stats_leader(a, g, w, s, ms, mz);
  ms = block_max(ms, red);
  if (threadIdx.x == 0) atomic_max_nonneg(a.group_max + g, ms);
  if (asym) {
    __syncthreads();
    mz = block_max(mz, red);
    if (threadIdx.x == 0) atomic_max_nonneg(a.group_max + a.G + g, mz);
  }
}

// Any block size: one thread per block, scanned in order.
__global__ void quantize_stats_scan_kernel(const __grid_constant__ QuantizeArgs a, int64_t bpg) {
  __shared__ float red[32];
  const int64_t g = blockIdx.x / bpg, i = (blockIdx.x % bpg) * blockDim.x + threadIdx.x;  // i: (t, k) in group
  float ms = 0.0f, mz = 0.0f;
  stats_scan(a, g, i, ms, mz);
  ms = block_max(ms, red);
  if (threadIdx.x == 0) atomic_max_nonneg(a.group_max + g, ms);
  if (a.asymmetric) {
    __syncthreads();
    mz = block_max(mz, red);
    if (threadIdx.x == 0) atomic_max_nonneg(a.group_max + a.G + g, mz);
  }
}

__global__ void quantize_scales_kernel(const __grid_constant__ QuantizeArgs a, int64_t n) {
  for (int64_t si = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; si < n; si += int64_t(gridDim.x) * blockDim.x)
    scale_block(a, si);
}

// The pack passes, one instantiation per row of qvg/code_format.h (BITS: its width).
template <int BITS>
__global__ void pack_vec_kernel(const __grid_constant__ QuantizeArgs a, int64_t n) {
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < n; w += int64_t(gridDim.x) * blockDim.x)
    pack_word<qvg::Width<BITS>>(a, w);
}

template <int BITS>
__global__ void pack_group_kernel(const __grid_constant__ QuantizeArgs a, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    pack_group_at<qvg::Width<BITS>>(a, e);
}

__global__ void limit_kernel(const void* x, int dtype, int64_t n, unsigned long long* first_bad) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const double v = double(A::load_elem(x, dtype, e));
    // NaN fails the comparison, as do infinities and |x| > 1e16 (compared in fp64, as the CPU does).
    if (!(fabs(v) <= 1e16)) atomicMin(first_bad, (unsigned long long)e);
  }
}

__device__ __forceinline__ float hash_unit(uint64_t v) {  // uniform in [-1, 1)
  uint64_t st = v;
  return float(int64_t(A::splitmix64(st) >> 11) - (int64_t(1) << 52)) * 0x1.0p-52f;
}

__global__ void fill_kernel(void* x, int dtype, int64_t S, int64_t H, int64_t D, int64_t n, uint64_t seed,
                            float scale) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, rest = e / D, h = rest % H, t = (rest / H) % S;
    uint64_t st = seed ^ (uint64_t(t) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(h) << 48);
    const uint64_t cluster = A::splitmix64(st) % 48;
    const float center = hash_unit(seed + 0x1000 + (uint64_t(h) * 64 + cluster) * 4096 + uint64_t(d));
    const float offset = (h % 3 == 1) ? 2.0f * hash_unit(seed + 0x777 + uint64_t(h) * 4096 + uint64_t(d)) : 0.0f;
    const float v = scale * (offset + center + 0.25f * hash_unit(seed * 31 + uint64_t(e)));
    const uint32_t bits = A::encode_elem(v, dtype);
    if (dtype == A::kF32)
      static_cast<float*>(x)[e] = v;
    else
      static_cast<uint16_t*>(x)[e] = uint16_t(bits);
  }
}

}  // namespace

void quantize_residual(const QuantizeArgs& a, cudaStream_t stream) {
  QVG_CUDA(cudaMemsetAsync(a.group_max, 0, size_t(2 * a.G) * sizeof(float), stream));
  const int64_t nb = a.D / a.block;
  const bool vec = quantize_vectorizable(a.D, a.block) && a.r.vector_ok(8);
  if (vec) {
    const int64_t bpg = (a.S * (a.D / 8) + kThreads - 1) / kThreads;
    quantize_stats_vec_kernel<<<unsigned(a.G * bpg), kThreads, 0, stream>>>(a, bpg, a.block / 8);
    detail::check_launch("quantize_stats_vec_kernel");
  } else {
    const int64_t bpg = (a.S * nb + kThreads - 1) / kThreads;
    quantize_stats_scan_kernel<<<unsigned(a.G * bpg), kThreads, 0, stream>>>(a, bpg);
    detail::check_launch("quantize_stats_scan_kernel");
  }
  const int64_t nblocks = a.G * a.S * nb;
  quantize_scales_kernel<<<grid_for(nblocks), kThreads, 0, stream>>>(a, nblocks);
  detail::check_launch("quantize_scales_kernel");
  qvg::dispatch_width(a.bits, [&](auto w) {
    using W = decltype(w);
    if constexpr (kCodeWordFits<W>) {
      if (vec) {
        const int64_t n = a.G * a.S * (a.D / 8);
        pack_vec_kernel<W::kBits><<<grid_for(n), kThreads, 0, stream>>>(a, n);
        detail::check_launch("pack_vec_kernel");
        return;
      }
    }
    const int64_t n = code_groups<W>(a);
    pack_group_kernel<W::kBits><<<grid_for(n), kThreads, 0, stream>>>(a, n);
    detail::check_launch("pack_group_kernel");
  });
}

void fill_clustered(void* x, int dtype, int64_t B, int64_t S, int64_t H, int64_t D, uint64_t seed, float scale,
                    cudaStream_t stream) {
  const int64_t n = B * S * H * D;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, dtype, S, H, D, n, seed, scale);
  detail::check_launch("fill_kernel");
}

void first_out_of_limit(const void* x, int dtype, int64_t n, unsigned long long* first_bad, cudaStream_t stream) {
  limit_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, dtype, n, first_bad);
  detail::check_launch("limit_kernel");
}

}  // namespace qvg::cuda::kernels
