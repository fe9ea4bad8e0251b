// The kernels that give the device cache every setting of the CPU cache (incremental
// spans, refinement layers and the scale search; docs/cuda.md, "Every setting of the
// CPU cache"): each maps threads onto one body of span_bodies.cuh. The host
// orchestration is in encode.cpp; the launchers are declared in cuda_kernels.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "core/exact_sum_impl.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/span_bodies.cuh"

namespace qvg::cuda::kernels {
namespace {

// Shared memory a launch may take without an opt-in.
constexpr size_t kSearchSmemLimit = 48 * 1024;

template <int BITS>  // one instantiation per row of qvg/code_format.h
__global__ void search_kernel(QuantizeArgs a, int64_t n) {
  const int64_t si = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (si < n) search_block<qvg::Width<BITS>>(a, si);
}

// A half-warp per block (span_bodies.cuh: search_stage, search_lane, search_min,
// search_pack): 16 blocks per 256 threads, each block's residual staged in shared
// memory once (row stride block + 1 floats, so that the two halves of a warp read
// different banks).
template <int BITS>
__global__ void __launch_bounds__(kThreads) search_half_kernel(QuantizeArgs a, int64_t n) {
  using W = qvg::Width<BITS>;
  extern __shared__ float search_buf[];
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int l = int(threadIdx.x) % kSearchLanes, half = int(threadIdx.x) / kSearchLanes;
  const int64_t si_own = int64_t(blockIdx.x) * (kThreads / kSearchLanes) + half;
  const int64_t si = si_own < n ? si_own : n - 1;  // a half past the end repeats the last block, writes nothing
  float* buf = search_buf + half * (a.block + 1);
  search_stage(a, si, l, buf);
  __syncwarp();
  const bool asym = a.asymmetric;
  RunStats st;
  if (a.block % kSearchLanes == 0) {  // uniform over the grid
    st = merge_segment_runs(search_run(buf, a.block, l, asym), kSearchLanes, asym);
    st = RunStats{__shfl_sync(kAll, st.lo, 0, kSearchLanes), __shfl_sync(kAll, st.hi, 0, kSearchLanes)};
  } else {
    st = search_scan(buf, a.block, asym);
  }
  qvg::cuda_arith::ScaleCandidate c;
  SearchKey key = search_lane<W>(a, si, buf, l, st, c);
  const float err0 = __shfl_sync(kAll, key.err, 0, kSearchLanes);
  QVG_UNROLL
  for (int o = kSearchLanes / 2; o > 0; o /= 2) {
    const SearchKey other{__shfl_xor_sync(kAll, key.err, o, kSearchLanes),
                          __shfl_xor_sync(kAll, key.k, o, kSearchLanes)};
    key = search_min(key, other);
  }
  const int best = search_choice(key, err0);
  const uint32_t s_bits = __shfl_sync(kAll, c.s_bits, best, kSearchLanes);
  const uint32_t z_bits = __shfl_sync(kAll, c.z_bits, best, kSearchLanes);
  const float s_eff = __shfl_sync(kAll, c.s_eff, best, kSearchLanes);
  const float z_eff = __shfl_sync(kAll, c.z_eff, best, kSearchLanes);
  if (si_own < n) search_pack<W>(a, si, buf, l, s_bits, z_bits, s_eff, z_eff);
}

__global__ void warm_kernel(const void* warm, int t, int64_t K, int64_t first, int64_t k, int64_t D, const float* mu,
                            int64_t n, float* c) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) c[e] = warm_centroid(warm, t, K, first, k, D, mu, e);
}

__global__ void store_new_kernel(const float* c, const float* mu, int t, int64_t K, int64_t first, int64_t k, int64_t D,
                                 int64_t n, void* book) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) store_new_centroid(c, mu, t, K, first, k, D, book, e);
}

__global__ void book_kernel(const void* book, int t, int64_t K, int64_t D, const float* mu, int64_t n, float* stored,
                            float* c) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) book_entry(book, t, K, D, mu, stored, c, e);
}

__global__ void subtract_kernel(float* r, const float* stored, const uint8_t* ids, int64_t S, int64_t K, int64_t D,
                                int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) subtract_stored(r, stored, ids, S, K, D, e);
}

__global__ void nearest_kernel(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S,
                               int64_t K, int64_t D, int used, uint8_t* ids) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < G * S) ids[e] = nearest_slot(xb, cb, cnorm, S, K, D, used, e / S, e % S);
}

__global__ void mean_kernel(const float* r, int64_t G, int64_t S, int64_t D, float* mu) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < G * D) mu[e] = group_mean(r, S, D, e / D, e % D);
}

// The residual energy (span_bodies.cuh, "the residual energy across the device"): G x
// energy_blocks(S) blocks, each over kEnergyTokens tokens of its group. A block's
// largest square (a max), then its sum of fixed-point terms (integers), each reduced
// in the block and handed to one 64-bit global atomic per block: the same bits in any
// order (block_reduce_u64). gmax[g] holds the double's bits (non-negative doubles order
// like their bits), gsum[g] the sum; both zeroed first.
__global__ void energy_max_kernel(const __grid_constant__ QuantizeArgs a, int64_t bpg, unsigned long long* gmax) {
  __shared__ unsigned long long red[kThreads / 32];
  const int64_t g = blockIdx.x / bpg, blk = blockIdx.x % bpg;
  const double m = energy_thread_max(a, g, blk, int(threadIdx.x), int(blockDim.x));
  const unsigned long long bm = block_reduce_u64((unsigned long long)__double_as_longlong(m), true, red);
  if (threadIdx.x == 0 && bm != 0ull) atomicMax(gmax + g, bm);
}

__global__ void energy_sum_kernel(const __grid_constant__ QuantizeArgs a, int64_t bpg, const unsigned long long* gmax,
                                  unsigned long long* gsum) {
  __shared__ unsigned long long red[kThreads / 32];
  const int64_t g = blockIdx.x / bpg, blk = blockIdx.x % bpg;
  const double m = __longlong_as_double((long long)gmax[g]);
  if (!(m > 0)) return;  // every residual of the group 0 (uniform over the block)
  const int e = energy_exponent(a, m);
  const unsigned long long q =
      block_reduce_u64(energy_thread_sum(a, g, blk, int(threadIdx.x), int(blockDim.x), e), false, red);
  if (threadIdx.x == 0 && q != 0ull) atomicAdd(gsum + g, q);
}

__global__ void energy_final_kernel(const __grid_constant__ QuantizeArgs a, const unsigned long long* gmax,
                                    const unsigned long long* gsum, double* out) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < a.G) out[g] = energy_value(a, __longlong_as_double((long long)gmax[g]), gsum[g]);
}

__global__ void refinement_error_kernel(const void* x, const void* decoded, int t, float lim, int64_t n, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = refinement_error(x, decoded, t, lim, i);
}

__global__ void refine_kernel(DecodeArgs T, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t H = T.h1 - T.h0, Tn = T.t1 - T.t0;
  const int d = int(e % T.D);
  const int64_t q = e / T.D;
  const int h = T.h0 + int(q % H);
  const int64_t bt = q / H;
  refine_one(T, int(bt / Tn), h, T.t0 + int(bt % Tn), d);
}

}  // namespace

void search_scales(const QuantizeArgs& a, cudaStream_t stream) {
  const int64_t n = a.G * a.S * (a.D / a.block);
  if (n == 0) return;
  const size_t smem = size_t(kThreads / kSearchLanes) * size_t(a.block + 1) * sizeof(float);
  qvg::dispatch_width(a.bits, [&](auto w) {
    if (smem <= kSearchSmemLimit) {
      const int64_t per = kThreads / kSearchLanes;
      search_half_kernel<decltype(w)::kBits><<<unsigned((n + per - 1) / per), kThreads, smem, stream>>>(a, n);
      detail::check_launch("search_half_kernel");
    } else {  // blocks past 767 channels: a thread per block
      search_kernel<decltype(w)::kBits><<<blocks_for(n), kThreads, 0, stream>>>(a, n);
      detail::check_launch("search_kernel");
    }
  });
}

void warm_centroids(const void* warm, int dtype, int64_t K, int64_t first, int64_t k, int64_t G, int64_t D,
                    const float* mu, float* c, cudaStream_t stream) {
  const int64_t n = G * k * D;
  warm_kernel<<<blocks_for(n), kThreads, 0, stream>>>(warm, dtype, K, first, k, D, mu, n, c);
  detail::check_launch("warm_kernel");
}

void store_new_centroids(const float* c, const float* mu, int dtype, int64_t K, int64_t first, int64_t k, int64_t G,
                         int64_t D, void* book, cudaStream_t stream) {
  const int64_t n = G * k * D;
  store_new_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, mu, dtype, K, first, k, D, n, book);
  detail::check_launch("store_new_kernel");
}

void book_entries(const void* book, int dtype, int64_t G, int64_t K, int64_t D, const float* mu, float* stored,
                  float* c, cudaStream_t stream) {
  const int64_t n = G * K * D;
  book_kernel<<<blocks_for(n), kThreads, 0, stream>>>(book, dtype, K, D, mu, n, stored, c);
  detail::check_launch("book_kernel");
}

void subtract_stored_centroids(float* r, const float* stored, const uint8_t* ids, int64_t G, int64_t S, int64_t K,
                               int64_t D, cudaStream_t stream) {
  const int64_t n = G * S * D;
  subtract_kernel<<<blocks_for(n), kThreads, 0, stream>>>(r, stored, ids, S, K, D, n);
  detail::check_launch("subtract_kernel");
}

void assign_to_slots(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int64_t K,
                     int64_t D, int used, uint8_t* ids, cudaStream_t stream) {
  nearest_kernel<<<blocks_for(G * S), kThreads, 0, stream>>>(xb, cb, cnorm, G, S, K, D, used, ids);
  detail::check_launch("nearest_kernel");
}

void group_means(const float* r, int64_t G, int64_t S, int64_t D, float* mu, cudaStream_t stream) {
  mean_kernel<<<blocks_for(G * D), kThreads, 0, stream>>>(r, G, S, D, mu);
  detail::check_launch("mean_kernel");
}

void residual_energies(const QuantizeArgs& a, unsigned long long* scratch, double* out, cudaStream_t stream) {
  if (a.G == 0) return;
  unsigned long long *gmax = scratch, *gsum = scratch + a.G;
  QVG_CUDA(cudaMemsetAsync(scratch, 0, size_t(2 * a.G) * sizeof(unsigned long long), stream));
  const int64_t bpg = energy_blocks(a.S), blocks = a.G * bpg;
  energy_max_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(a, bpg, gmax);
  detail::check_launch("energy_max_kernel");
  energy_sum_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(a, bpg, gmax, gsum);
  detail::check_launch("energy_sum_kernel");
  energy_final_kernel<<<blocks_for(a.G), kThreads, 0, stream>>>(a, gmax, gsum, out);
  detail::check_launch("energy_final_kernel");
}

void refinement_errors(const void* x, const void* decoded, int dtype, float lim, int64_t n, float* out,
                       cudaStream_t stream) {
  refinement_error_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, decoded, dtype, lim, n, out);
  detail::check_launch("refinement_error_kernel");
}

void refine_tasks(const DecodeArgs* tasks, int n, cudaStream_t stream) {
  for (int i = 0; i < n; ++i) {
    const DecodeArgs& T = tasks[i];
    const int64_t m = int64_t(T.B) * (T.t1 - T.t0) * (T.h1 - T.h0) * T.D;
    if (m == 0) continue;
    refine_kernel<<<blocks_for(m), kThreads, 0, stream>>>(T, m);
    detail::check_launch("refine_kernel");
  }
}

}  // namespace qvg::cuda::kernels
