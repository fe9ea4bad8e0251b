// src/kernels/cuda/launch_util.cuh — what the encoder's kernel files share: the block
// size and grid sizing of their elementwise launches, three block reductions and the
// in-order merge of run statistics across a segment of lanes. Included by
// encode_kernels.cu, quantize_kernels.cu and span_kernels.cu only (internal linkage).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/encode_bodies.cuh"  // RunStats, run_merge, segment_merge_offset

namespace qvg::cuda::kernels {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned(std::max<int64_t>(1, (n + threads - 1) / threads));
}

// Non-negative floats order like their bit patterns. *addr starts at +0; a v that is
// not > 0 (0, -0, whose bits would rank above every positive float, or NaN) changes
// nothing and is skipped.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  if (!(v > 0.0f)) return;
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

// The block's largest (max) or sum (modulo 2^64) of the threads' v: xor shuffles in
// each warp, then thread 0 over the warps' results in red[] (blockDim.x / 32 words).
// Every thread of the block must call it; the result is valid in thread 0.
__device__ __forceinline__ unsigned long long block_reduce_u64(unsigned long long v, bool max,
                                                               unsigned long long* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long y = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = max ? (y > v ? y : v) : v + y;
  }
  const int w = int(threadIdx.x / 32), l = int(threadIdx.x % 32);
  if (l == 0) red[w] = v;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int i = 1; i < int(blockDim.x / 32); ++i) v = max ? (red[i] > v ? red[i] : v) : v + red[i];
  return v;  // valid in thread 0
}

// The run statistics s of each lane merged down a segment of `width` lanes (a power of
// two, at most 32) in channel order (segment_merge_offset: o = 1, 2, 4, ...; shfl_down:
// lane l takes l + o, so after the step of o lane l, l % 2o == 0, holds lanes
// l .. l + 2o - 1 merged in order). Every lane of the warp must call it; the result is
// valid in each segment's first lane.
__device__ __forceinline__ RunStats merge_segment_runs(RunStats s, int width, bool asym) {
  for (int step = 0, o = segment_merge_offset(0); o < width; o = segment_merge_offset(++step)) {
    RunStats later;
    later.lo = __shfl_down_sync(0xFFFFFFFFu, s.lo, o, width);
    later.hi = __shfl_down_sync(0xFFFFFFFFu, s.hi, o, width);
    run_merge(s, later, asym);
  }
  return s;
}

inline unsigned grid_for(int64_t n) {
  return unsigned(std::min<int64_t>(blocks_for(n), 132 * 32));
}

}  // namespace
}  // namespace qvg::cuda::kernels
