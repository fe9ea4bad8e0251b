// init kmeans++ on the device (spec 1.1): kmeanspp_kernel makes the CPU codec's
// kmeans++ picks (kmeans.cpp) from the device's centred points, with the bodies of
// kmeanspp.cuh (the rule is stated there; its host test runs them against the CPU).
//
// One block per group (kKppThreads threads). Each round, for the latest pick p:
// - warps 1.. update d2 of every point (one octet of lanes per point: lane l sums
//   the channels d = l (mod 8), the octet combines with shuffles in the CPU's order);
// - thread 0 adds the d2 in point order (the CPU's sequential fp64 total), keeping
//   the prefix sums; the two run as a pipeline over chunks of kKppChunk points
//   (the warps update chunk c while thread 0 adds chunk c - 1, a barrier between);
// - the block finds the first point whose prefix sum exceeds r = uniform() * total
//   (and d2 > 0), else the last with d2 > 0, by a parallel min / max; thread 0 draws
//   from the stream and takes the total-0 branch.
//
// Cost: k_eff - 1 rounds, each reading the group's S x D fp32 residual once (S * D
// squared differences on 60 octets) and making S dependent fp64 additions on one
// thread: about S * K dependent adds per group and stage, the price of making the
// CPU's picks exactly (the sum is sequential in the CPU's rule, and a different
// order gives a different total). Estimated on an H200 (1.98 GHz, fp64 add latency
// ~4-8 cycles, each block's residual streamed at ~100 GB/s): Self-Forcing's chunk
// [1, 4680, 12, 128], K = 256: per round ~22 us (2.4 MB per group; 4680 adds, ~15 us,
// overlap with it), ~6 ms per stage; LongCat's [1, 29640, 32, 128], K = 256: per
// round ~150 us (15 MB per group, 486 MB for the 32 groups: HBM; 29640 adds ~90 us
// overlap), ~40 ms per stage. Groups run side by side (one block each), so the time
// does not grow with G until G exceeds the SMs.
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kmeanspp.cuh"

namespace qvg::cuda::kernels {
namespace {

namespace A = qvg::cuda_arith;

constexpr int kKppThreads = 512;
constexpr int kKppOctets = (kKppThreads / 32 - 1) * 4;  // the distance octets (warps 1..)
constexpr int kKppChunk = kKppOctets * kKppPer;         // points per pipeline step (kKppPer per octet)

__global__ void __launch_bounds__(kKppThreads)
    kmeanspp_kernel(const float* __restrict__ r, const float* __restrict__ mu, int64_t H, int64_t S, int64_t D, int K,
                    int k_eff, uint64_t seed, int stage, int64_t head_offset, double* __restrict__ scratch,
                    uint8_t* __restrict__ chosen_all, float* __restrict__ xp_all, uint32_t* __restrict__ idx) {
  __shared__ double buf[2][kKppChunk];  // the d2 of the chunk being added (double buffer)
  __shared__ int64_t s_pick;
  __shared__ double s_total, s_r;
  __shared__ unsigned long long s_first, s_last1;  // first qualifying point; last positive + 1
  const int64_t G = gridDim.x, g = blockIdx.x;
  uint32_t* out = idx + g * K;
  const int tid = int(threadIdx.x);
  if (k_eff == S) {  // every point its own centroid, in order (kmeans.cpp)
    for (int j = tid; j < k_eff; j += blockDim.x) out[j] = uint32_t(j);
    return;
  }
  const float* rg = r + g * S * D;
  const float* mg = mu + g * D;
  double* d2 = scratch + g * S;
  double* prefix = scratch + G * S + g * S;
  uint8_t* chosen = chosen_all + g * S;
  float* xp = xp_all + g * D;
  const int warp = tid / 32, l8 = tid % 8, oct = (warp - 1) * 4 + (tid % 32) / 8;
  for (int64_t i = tid; i < S; i += blockDim.x) {
    d2[i] = __longlong_as_double(0x7FF0000000000000ll);  // +inf
    chosen[i] = 0;
  }
  A::Rng rng(seed, uint64_t(stage), uint64_t(g / H), uint64_t(g % H + head_offset));  // thread 0 draws
  if (tid == 0) s_pick = int64_t(rng.below(uint64_t(S)));
  __syncthreads();
  const int64_t nch = (S + kKppChunk - 1) / kKppChunk;
  for (int j = 0;; ++j) {
    const int64_t pick = s_pick;
    if (tid == 0) {
      chosen[pick] = 1;
      out[j] = uint32_t(pick);
    }
    if (j + 1 == k_eff) break;
    for (int64_t d = tid; d < D; d += blockDim.x) xp[d] = A::sub_rn(rg[pick * D + d], mg[d]);
    __syncthreads();   // xp written; every thread has read s_pick
    double total = 0;  // thread 0's
    for (int64_t c = 0; c <= nch; ++c) {
      if (warp > 0 && c < nch) {  // the octet's points: chunk positions q * kKppOctets + oct
        const float* rows[kKppPer];
        for (int q = 0; q < kKppPer; ++q) {
          const int64_t i = c * kKppChunk + q * kKppOctets + oct;
          rows[q] = i < S ? rg + i * D : nullptr;
        }
        float acc[kKppPer];
        kpp_lanes(rows, mg, xp, D, l8, acc);
#pragma unroll
        for (int q = 0; q < kKppPer; ++q) {  // uniform over the warp: the shuffles see every lane
          float v = acc[q];
          v = A::add_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, 4, 8));  // kpp_combine's steps
          v = A::add_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, 1, 8));
          v = A::add_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, 2, 8));
          const int p = q * kKppOctets + oct;
          const int64_t i = c * kKppChunk + p;
          if (i < S && l8 == 0) {
            const double w = kpp_min(d2[i], v);
            d2[i] = w;
            buf[c & 1][p] = w;
          }
        }
      }
      if (tid == 0 && c > 0) {
        const int64_t c0 = (c - 1) * kKppChunk;
        total = kpp_prefix(buf[(c - 1) & 1], min(int64_t(kKppChunk), S - c0), total, prefix + c0);
      }
      __syncthreads();
    }
    if (tid == 0) {
      s_total = total;
      if (total > 0) s_r = rng.uniform() * total;
      s_first = (unsigned long long)S;
      s_last1 = 0;
    }
    __syncthreads();
    if (s_total > 0) {
      const double rr = s_r;
      unsigned long long first = (unsigned long long)S, last1 = 0;
      for (int64_t i = tid; i < S; i += blockDim.x) {  // increasing i: the thread's first and last
        const double w = d2[i];
        if (first == (unsigned long long)S && kpp_qualifies(w, prefix[i], rr)) first = (unsigned long long)i;
        if (w > 0) last1 = (unsigned long long)i + 1;
      }
      for (int o = 16; o > 0; o >>= 1) {
        first = min(first, __shfl_xor_sync(0xFFFFFFFFu, first, o));
        last1 = max(last1, __shfl_xor_sync(0xFFFFFFFFu, last1, o));
      }
      if (tid % 32 == 0) {
        atomicMin(&s_first, first);
        atomicMax(&s_last1, last1);
      }
      __syncthreads();
      if (tid == 0) s_pick = s_first < (unsigned long long)S ? int64_t(s_first) : int64_t(s_last1) - 1;
    } else if (tid == 0) {
      s_pick = kpp_unchosen_pick(chosen, S, rng);
    }
    __syncthreads();
  }
}

}  // namespace

void kmeanspp_indices(const float* r, const float* mu, int64_t G, int64_t H, int64_t S, int64_t D, int K, int k_eff,
                      uint64_t seed, int stage, int64_t head_offset, double* scratch_d2, uint8_t* scratch_chosen,
                      float* scratch_xp, uint32_t* idx, cudaStream_t stream) {
  kmeanspp_kernel<<<unsigned(G), kKppThreads, 0, stream>>>(r, mu, H, S, D, K, k_eff, seed, stage, head_offset,
                                                           scratch_d2, scratch_chosen, scratch_xp, idx);
  detail::check_launch("kmeanspp_kernel");
}

}  // namespace qvg::cuda::kernels
