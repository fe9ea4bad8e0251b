// src/kernels/cuda/launch_util.cuh — what the encoder's kernel files share: the block
// size and grid sizing of their elementwise launches, and two block reductions.
// Included by encode_kernels.cu and quantize_kernels.cu only (internal linkage).
#pragma once

#include <algorithm>
#include <cstdint>

namespace qvg::cuda::kernels {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned(std::max<int64_t>(1, (n + threads - 1) / threads));
}

// Non-negative floats order like their bit patterns.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}

__device__ __forceinline__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < int(blockDim.x / 32) ? red[l] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  }
  return v;  // valid in thread 0
}

inline unsigned grid_for(int64_t n) {
  return unsigned(std::min<int64_t>(blocks_for(n), 132 * 32));
}

}  // namespace
}  // namespace qvg::cuda::kernels
