// init kmeans++ on the device (spec 1.1): kmeanspp_kernel makes the CPU codec's
// kmeans++ picks (kmeans.cpp) from the device's centred points, with the bodies of
// kmeanspp.cuh (the rule is stated there; its host test runs them against the CPU).
//
// One block per group (kKppThreads threads). Each round, for the latest pick p:
// - warps 1.. update d2 of every point (one octet of lanes per point: lane l sums
//   the channels d = l (mod 8), the octet combines with shuffles in the CPU's order);
// - the block finds the largest d2 (a max: exact in any order) and each thread sums
//   the fixed-point weights of one contiguous tile of points (exact integers,
//   core/exact_sum_impl.h); thread 0 adds the tiles' sums, draws u = below(total) and
//   walks the tile that holds the pick (kpp_pick_in_tiles), or takes the total-0
//   branch.
//
// Cost: k_eff - 1 rounds, each reading the group's S x D fp32 residual once (S * D
// squared differences on 60 octets), then d2 twice (S fp64 reads per thread pass,
// spread over 512 threads) and one thread's 512 tile sums plus a walk of S / 512
// points: per round ~ the residual's read time plus a few microseconds, where the
// earlier rule's sequential fp64 sum of S dependent adds (~15 us for 4680 points,
// ~90 us for 29640) is gone. Estimated on an H200 (not measured): Self-Forcing's chunk
// [1, 4680, 12, 128], K = 256: per round ~10 us, ~2.5 ms per stage; LongCat's
// [1, 29640, 32, 128], K = 256: per round ~60 us (486 MB of residual for the 32 groups
// from HBM), ~15 ms per stage. Groups run side by side (one block each), so the time
// does not grow with G until G exceeds the SMs.
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "core/exact_sum_impl.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kmeanspp.cuh"

namespace qvg::cuda::kernels {
namespace {

namespace A = qvg::cuda_arith;

constexpr int kKppThreads = kKppTiles;                  // one tile of weights per thread
constexpr int kKppOctets = (kKppThreads / 32 - 1) * 4;  // the distance octets (warps 1..)
constexpr int kKppChunk = kKppOctets * kKppPer;         // points per pipeline step (kKppPer per octet)

__global__ void __launch_bounds__(kKppThreads)
    kmeanspp_kernel(const float* __restrict__ r, const float* __restrict__ mu, int64_t H, int64_t S, int64_t D, int K,
                    int k_eff, uint64_t seed, int stage, int64_t head_offset, double* __restrict__ scratch,
                    uint8_t* __restrict__ chosen_all, float* __restrict__ xp_all, uint32_t* __restrict__ idx) {
  __shared__ uint64_t s_tile[kKppTiles];  // each thread's tile sum of the weights
  __shared__ int64_t s_pick;
  __shared__ unsigned long long s_max;  // the largest d2's bits (non-negative doubles order as their bits)
  const int64_t g = blockIdx.x;
  uint32_t* out = idx + g * K;
  const int tid = int(threadIdx.x);
  if (k_eff == S) {  // every point its own centroid, in order (kmeans.cpp)
    for (int j = tid; j < k_eff; j += blockDim.x) out[j] = uint32_t(j);
    return;
  }
  const float* rg = r + g * S * D;
  const float* mg = mu + g * D;
  double* d2 = scratch + g * S;
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
      s_max = 0;
    }
    if (j + 1 == k_eff) break;
    for (int64_t d = tid; d < D; d += blockDim.x) xp[d] = A::sub_rn(rg[pick * D + d], mg[d]);
    __syncthreads();  // xp written; every thread has read s_pick
    if (warp > 0)
      for (int64_t c = 0; c < nch; ++c) {  // the octet's points: chunk positions q * kKppOctets + oct
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
          const int64_t i = c * kKppChunk + q * kKppOctets + oct;
          if (i < S && l8 == 0) d2[i] = kpp_min(d2[i], v);
        }
      }
    __syncthreads();  // every d2 written
    double m = 0;     // the largest d2 (max is exact in any order)
    for (int64_t i = tid; i < S; i += blockDim.x) m = fmax(m, d2[i]);
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (tid % 32 == 0) atomicMax(&s_max, (unsigned long long)__double_as_longlong(m));
    __syncthreads();
    const double mx = __longlong_as_double((long long)s_max);
    if (mx > 0) {  // exact integer weights: each thread one tile, thread 0 the tiles' sums and the pick
      const int e = qvg::exact_sum::fixed_exponent(mx, S);
      s_tile[tid] = kpp_weight_sum(d2, kpp_tile_begin(tid, kKppTiles, S), kpp_tile_begin(tid + 1, kKppTiles, S), e);
      __syncthreads();
      if (tid == 0) {
        uint64_t total = 0;
        for (int t = 0; t < kKppTiles; ++t) total += s_tile[t];
        s_pick = kpp_pick_in_tiles(d2, s_tile, kKppTiles, S, e, rng.below(total));
      }
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
