// init kmeans++ on the device (spec 1.1): kmeanspp_kernel makes the CPU codec's
// kmeans++ picks (kmeans.cpp) from the device's centred points, with the bodies of
// kmeanspp.cuh (the rule and the pruning are stated there; its host test runs them
// against the CPU).
//
// A group's points are split into `nblk` contiguous slices, one 512-thread block
// each; the nblk blocks of a group form a thread block cluster (sm_90 and later; one
// block per group elsewhere) and meet at three cluster barriers per round, exchanging
// a float, an integer and the pick through global slots (L2: st.cg / ld.cg after the
// barrier's release/acquire). Each round, for the latest pick p:
// - the block stages p's centred row and, one octet per earlier pick, the earlier
//   picks' distances to it (cc, shared memory);
// - each warp takes 32 points of its slice at a time: a lane per point reads its d2
//   (float) and nearest pick, the pruning test keeps the points that cannot change,
//   and the warp's 4 octets compute the others' distances 4 points each (lane l sums
//   the channels d = l (mod 8), the octet combines with shuffles in the CPU's order),
//   the checking lane getting its point's distance by a shuffle;
// - the block's largest d2 (barrier 1), then every thread's fixed-point weights of
//   one contiguous tile, the block's prefix sums by warp scans, its total (barrier 2);
//   every block's thread 0 draws u = below(total) from the same stream, the thread
//   whose tile holds u walks it (kpp_walk_tile) and publishes the pick (barrier 3);
// - or, with every d2 zero, warp 0 finds the below(left)-th unchosen point from the
//   list of picks (kpp_unchosen_index), the same in every block, and a barrier keeps
//   any block from writing the next round's largest d2 before all read this one's.
// d2 and the nearest pick live in global memory (L2), each block touching only its
// slice; the picks so far in shared memory. Nothing sums serially over S.
//
// Cost (estimates, not measured; H200, 4.8 TB/s; docs/cuda.md, "init kmeans++"): each
// round reads the rows of the points not skipped (stage 0: the input's, 256 bytes at
// D = 128 in bf16) and 5 bytes of every point (L2), plus ~8 us of barriers, the picks'
// distances and the tile sums. The host emulation on the workload's chunks skipped
// 57-81 % of K's distances and 24-37 % of V's. LongCat [1, 29640, 32, 128], K = 256,
// 4 blocks per group: ~105 MB of K rows per round, ~30 us, ~8 ms per stage (V ~14 ms);
// Self-Forcing [1, 4680, 12, 128], 8 blocks per group: ~2-2.5 ms per stage. One block
// per group without pruning, on fp32 rows (before): ~60 ms and ~10 ms.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <climits>
#include <cstdint>

#include "core/exact_sum_impl.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kmeanspp.cuh"
#include "kernels/cuda/per_device.h"
#include "qvg/error.h"

namespace qvg::cuda::kernels {
namespace {

namespace A = qvg::cuda_arith;

constexpr int kKppThreads = kKppTiles;  // one tile of weights per thread
constexpr int kKppWarps = kKppThreads / 32;
constexpr int kKppOctets = kKppWarps * 4;  // the octets computing the picks' distances

/// The cluster's barrier (release/acquire: the slots written before it are seen
/// after it by every block of the group); one block per group: the block's.
__device__ __forceinline__ void kpp_group_sync(int nblk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (nblk > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#else
  if (nblk > 1) __trap();  // the host launches clusters only for code built for sm_90 or later
#endif
  __syncthreads();
}

/// kpp_combine's three steps by shuffles within each octet of lanes (offsets 4, 1, 2):
/// the octet's first lane ends with its 8 lane sums combined in the CPU's order. Every
/// lane of the warp must call it.
__device__ __forceinline__ float kpp_octet_combine(float v) {
  v = A::add_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, 4, 8));
  v = A::add_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, 1, 8));
  return A::add_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, 2, 8));
}

/// The kernel's global scratch (kmeanspp_scratch_bytes): per group, the slots of
/// its blocks and its points' d2 and nearest pick.
struct KppScratch {
  unsigned long long* total;  // [G][kKppMaxBlocks] the blocks' sums of weights
  long long* pick;            // [G] the round's pick
  float* max;                 // [G][kKppMaxBlocks] the blocks' largest d2
  float* d2;                  // [G][S]
  uint8_t* near;              // [G][S] the round of the nearest pick so far
};

/// Bytes of a group's slots in KppScratch (total, pick, max) and of a point's (d2, near).
constexpr size_t kKppGroupBytes = kKppMaxBlocks * 8 + 8 + kKppMaxBlocks * 4;
constexpr size_t kKppPointBytes = 4 + 1;

KppScratch carve_scratch(void* scratch, int64_t G, int64_t S) {
  auto* p = static_cast<uint8_t*>(scratch);
  KppScratch sc;
  sc.total = reinterpret_cast<unsigned long long*>(p);
  p += size_t(G) * kKppMaxBlocks * 8;
  sc.pick = reinterpret_cast<long long*>(p);
  p += size_t(G) * 8;
  sc.max = reinterpret_cast<float*>(p);
  p += size_t(G) * kKppMaxBlocks * 4;
  sc.d2 = reinterpret_cast<float*>(p);
  p += size_t(G * S) * 4;
  sc.near = p;
  return sc;
}

/// Row i of the group whose first row is at element `gb` (element type DT).
template <int DT>
__device__ __forceinline__ const void* kpp_row(const void* p, int64_t gb, int64_t stride, int64_t i) {
  constexpr int64_t esz = DT == A::kF32 ? 4 : 2;
  return static_cast<const char*>(p) + (gb + i * stride) * esz;
}

template <int DT>
__global__ void __launch_bounds__(kKppThreads)
    kmeanspp_kernel(Points pts, const float* __restrict__ mu, int64_t H, int K, int k_eff, uint64_t seed, int stage,
                    int64_t head_offset, int nblk, KppScratch sc, uint32_t* __restrict__ idx) {
  const int64_t S = pts.S, D = pts.D;
  extern __shared__ float s_dyn[];
  float* s_xp = s_dyn;                                        // [D] the pick's centred row
  float* s_cc = s_dyn + D;                                    // [K] the earlier picks' distances to it
  uint32_t* s_picks = reinterpret_cast<uint32_t*>(s_cc + K);  // [K] the picks so far
  __shared__ float s_wmax[kKppWarps];
  __shared__ unsigned long long s_wsum[kKppWarps];
  __shared__ unsigned char s_list[kKppWarps][32];  // a warp's points to evaluate (lanes)
  __shared__ unsigned long long s_u;
  __shared__ long long s_pick;
  const int64_t g = blockIdx.x / nblk;
  const int rank = int(blockIdx.x % nblk);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, l8 = tid % 8, o4 = lane / 8, oct = tid / 8;
  uint32_t* out = idx + g * K;
  if (k_eff == S) {  // every point its own centroid, in order (kmeans.cpp); uniform over the cluster
    if (rank == 0)
      for (int j = tid; j < k_eff; j += blockDim.x) out[j] = uint32_t(j);
    return;
  }
  const void* x = pts.p;  // the group's rows: kpp_row(x, gb, stride, i)
  const int64_t gb = pts.base(g), stride = pts.stride();
  const double factor = qvg::kmeanspp_bound::skip_factor(D);
  const float* mg = mu + g * D;
  const int64_t s0 = kpp_tile_begin(rank, nblk, S), s1 = kpp_tile_begin(rank + 1, nblk, S), n = s1 - s0;
  float* d2 = sc.d2 + g * S;
  uint8_t* near = sc.near + g * S;
  unsigned long long* slot_total = sc.total + g * kKppMaxBlocks;
  float* slot_max = sc.max + g * kKppMaxBlocks;
  long long* slot_pick = sc.pick + g;
  for (int64_t i = s0 + tid; i < s1; i += blockDim.x) {
    d2[i] = __int_as_float(0x7F800000);  // +inf
    near[i] = 0;
  }
  // Thread 0 of every block draws: the same stream, the same totals, the same draws.
  A::Rng rng(seed, uint64_t(stage), uint64_t(g / H), uint64_t(g % H + head_offset));
  if (tid == 0) s_pick = (long long)rng.below(uint64_t(S));
  __syncthreads();
  // Tile t = tid of this block's slice.
  const int64_t t0 = s0 + kpp_tile_begin(tid, kKppTiles, n), t1 = s0 + kpp_tile_begin(tid + 1, kKppTiles, n);
  for (int j = 0;; ++j) {
    const int64_t pick = s_pick;
    if (tid == 0) {
      s_picks[j] = uint32_t(pick);
      if (rank == 0) out[j] = uint32_t(pick);
    }
    if (j + 1 == k_eff) break;
    for (int64_t d = tid; d < D; d += blockDim.x)
      s_xp[d] = A::sub_rn(kpp_elem<DT>(kpp_row<DT>(x, gb, stride, pick), d), mg[d]);
    __syncthreads();  // s_xp and s_picks[j] written; every thread has read s_pick
    for (int base = 0; base < j; base += kKppOctets * kKppPer) {  // cc[jp] for the earlier picks jp < j
      const void* rows[kKppPer];
#pragma unroll
      for (int q = 0; q < kKppPer; ++q) {
        const int jp = base + q * kKppOctets + oct;
        rows[q] = jp < j ? kpp_row<DT>(x, gb, stride, s_picks[jp]) : nullptr;
      }
      float acc[kKppPer];
      kpp_lanes<DT>(rows, mg, s_xp, D, l8, acc);
#pragma unroll
      for (int q = 0; q < kKppPer; ++q) {  // uniform over the warp: the shuffles see every lane
        const float v = kpp_octet_combine(acc[q]);
        const int jp = base + q * kKppOctets + oct;
        if (jp < j && l8 == 0) s_cc[jp] = v;
      }
    }
    __syncthreads();  // s_cc written
    float m = 0.0f;   // the largest d2 of the warp's points (fmaxf: exact in any order)
    constexpr int64_t kStride = int64_t(kKppWarps) * 32;
    float next_d2 = 0.0f;  // the warp's next 32 points' d2 and nearest pick, loaded a step ahead
    int next_near = 0;
    if (s0 + int64_t(warp) * 32 + lane < s1) {
      next_d2 = d2[s0 + int64_t(warp) * 32 + lane];
      next_near = near[s0 + int64_t(warp) * 32 + lane];
    }
    for (int64_t c0 = s0 + int64_t(warp) * 32; c0 < s1; c0 += kStride) {  // uniform per warp
      const int64_t i = c0 + lane;
      const bool in = i < s1;
      float di = in ? next_d2 : 0.0f;
      const int ni = in ? next_near : 0;
      if (i + kStride < s1) {  // other points than this step writes
        next_d2 = d2[i + kStride];
        next_near = near[i + kStride];
      }
      const bool need = in && !qvg::kmeanspp_bound::may_skip(di > 0.0f && di <= FLT_MAX ? s_cc[ni] : 0.0f, di, factor);
      const unsigned mask = __ballot_sync(0xFFFFFFFFu, need);
      const int cnt = __popc(mask), pos = __popc(mask & ((1u << lane) - 1u));
      if (need) s_list[warp][pos] = (unsigned char)lane;
      __syncwarp();
      for (int p0 = 0; p0 < cnt; p0 += 4 * kKppPer) {  // 16 points per pass: octet o4 takes p0 + 4q + o4
        const void* rows[kKppPer];
#pragma unroll
        for (int q = 0; q < kKppPer; ++q) {
          const int p = p0 + 4 * q + o4;
          rows[q] = p < cnt ? kpp_row<DT>(x, gb, stride, c0 + s_list[warp][p]) : nullptr;
        }
        float acc[kKppPer];
        kpp_lanes<DT>(rows, mg, s_xp, D, l8, acc);
        const int rel = pos - p0;  // this lane's point: slot rel / 4 of octet rel % 4
        float dist = 0.0f;
#pragma unroll
        for (int q = 0; q < kKppPer; ++q) {
          const float w = __shfl_sync(0xFFFFFFFFu, kpp_octet_combine(acc[q]), 8 * (rel & 3));
          if (rel >> 2 == q) dist = w;
        }
        if (need && rel >= 0 && rel < 4 * kKppPer && dist < di) {  // kpp_min
          di = dist;
          d2[i] = dist;
          near[i] = uint8_t(j);
        }
      }
      __syncwarp();  // s_list read before the next batch writes it
      if (in) m = fmaxf(m, di);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (lane == 0) s_wmax[warp] = m;
    __syncthreads();
    if (tid == 0) {
      float bm = 0.0f;
      for (int w = 0; w < kKppWarps; ++w) bm = fmaxf(bm, s_wmax[w]);
      __stcg(slot_max + rank, bm);
    }
    kpp_group_sync(nblk);  // 1: every block's largest d2
    float mx = 0.0f;
    for (int b = 0; b < nblk; ++b) mx = fmaxf(mx, __ldcg(slot_max + b));
    if (mx > 0.0f) {  // uniform over the cluster
      const int e = qvg::exact_sum::fixed_exponent(double(mx), S);
      const unsigned long long ts = kpp_weight_sum(d2, t0, t1, e);
      unsigned long long scan = ts;  // the warp's inclusive scan of its tiles' sums
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xFFFFFFFFu, scan, o);
        if (lane >= o) scan += y;
      }
      if (lane == 31) s_wsum[warp] = scan;
      __syncthreads();
      unsigned long long before = scan - ts, btotal = 0;  // tile tid's prefix in the block, the block's sum
      for (int w = 0; w < kKppWarps; ++w) {
        const unsigned long long v = s_wsum[w];
        before += w < warp ? v : 0ull;
        btotal += v;
      }
      if (tid == 0) __stcg(slot_total + rank, btotal);
      kpp_group_sync(nblk);  // 2: every block's sum
      unsigned long long total = 0, bbefore = 0;
      for (int b = 0; b < nblk; ++b) {
        const unsigned long long v = __ldcg(slot_total + b);
        bbefore += b < rank ? v : 0ull;
        total += v;
      }
      if (tid == 0) s_u = rng.below(total);
      __syncthreads();
      const unsigned long long u = s_u;
      if (u >= bbefore && u - bbefore < btotal) {
        const unsigned long long ul = u - bbefore;
        if (ul >= before && ul - before < ts) __stcg(slot_pick, (long long)kpp_walk_tile(d2, t0, t1, e, before, ul));
      }
      kpp_group_sync(nblk);  // 3: the pick
      if (tid == 0) s_pick = __ldcg(slot_pick);
    } else {  // every d2 zero: the same unchosen point in every block
      if (warp == 0) {
        unsigned long long rr = 0;
        if (lane == 0) rr = rng.below(uint64_t(S - (j + 1)));
        rr = __shfl_sync(0xFFFFFFFFu, rr, 0);
        const int64_t p = kpp_unchosen_index(rr, [&](uint64_t xv) {
          return uint64_t(__reduce_add_sync(0xFFFFFFFFu, kpp_count_le(s_picks, j + 1, lane, 32, xv)));
        });
        if (lane == 0) s_pick = (long long)p;
      }
      kpp_group_sync(nblk);  // every block has read this round's maxima before any writes the next's
    }
    __syncthreads();
  }
}

/// The launch of nblk blocks per group (a cluster when nblk > 1); attr: its one attribute.
cudaLaunchConfig_t kpp_config(int64_t G, int nblk, size_t smem, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(unsigned(G * nblk));
  lc.blockDim = dim3(kKppThreads);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(nblk);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = nblk > 1 ? 1 : 0;
  return lc;
}

/// Blocks per group: a cluster of up to kKppMaxBlocks where the device and the
/// kernel's code allow clusters (sm_90 and later), as many as keep G * nblk within
/// the multiprocessors, every slice at kKppMinSlice points or more and all G clusters
/// resident at once (cudaOccupancyMaxActiveClusters: a cluster's blocks share a GPC);
/// 1 elsewhere.
template <class Kernel>
int kpp_blocks_per_group(Kernel kernel, int64_t G, int64_t S, size_t smem, cudaStream_t stream) {
  if (!kmeanspp_clusters_supported()) return 1;
  const int64_t sms = detail::multiprocessor_count();
  int nblk = kKppMaxBlocks;
  while (nblk > 1 && (G * nblk > sms || S < int64_t(nblk) * kKppMinSlice)) nblk /= 2;
  for (; nblk > 1; nblk /= 2) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t lc = kpp_config(G, nblk, smem, stream, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &lc) != cudaSuccess) {
      (void)cudaGetLastError();  // a refused query: no cluster of this size
      continue;
    }
    if (clusters >= G) break;
  }
  return nblk;
}

}  // namespace

bool kmeanspp_clusters_supported() {
  static detail::PerDeviceOnce once;
  static bool ok[detail::kMaxDevices];
  const int dev = detail::current_device();
  const auto query = [dev] {
    int major = 0, cluster = 0;
    QVG_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    QVG_CUDA(cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, dev));
    cudaFuncAttributes fa{};
    QVG_CUDA(cudaFuncGetAttributes(&fa, kmeanspp_kernel<A::kF32>));
    // The cluster barrier is compiled only into code for sm_90 or later (a JIT of
    // older PTX on a newer device traps instead): ptxVersion is the code's target.
    return major >= 9 && cluster != 0 && fa.ptxVersion >= 90;
  };
  if (dev < 0 || dev >= detail::kMaxDevices) return query();
  once.run(dev, [&] { ok[dev] = query(); });
  return ok[dev];
}

size_t kmeanspp_scratch_bytes(int64_t G, int64_t S) {
  return size_t(G) * kKppGroupBytes + size_t(G * S) * kKppPointBytes;
}

void kmeanspp_indices(const Points& pts, const float* mu, int64_t G, int64_t H, int K, int k_eff, uint64_t seed,
                      int stage, int64_t head_offset, void* scratch, uint32_t* idx, cudaStream_t stream,
                      int blocks_per_group) {
  const int64_t S = pts.S, D = pts.D;
  if (blocks_per_group != 0 && blocks_per_group != 1 && blocks_per_group != 2 && blocks_per_group != 4 &&
      blocks_per_group != 8)
    throw InvalidArgument(
        fmt::format("kmeanspp_indices: blocks_per_group must be 0 (chosen), 1, 2, 4 or 8, got {}", blocks_per_group));
  if (blocks_per_group > 1 && !kmeanspp_clusters_supported())
    throw InvalidArgument(fmt::format(
        "kmeanspp_indices: blocks_per_group={} needs thread block clusters (sm_90 or later code and device)",
        blocks_per_group));
  const size_t smem = size_t(D + 2 * int64_t(K)) * 4;
  const auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) {
      if (smem > size_t(detail::max_shared_optin()))
        throw InvalidArgument(
            fmt::format("kmeanspp_indices: head dim {} needs {} bytes of shared memory, the device allows {}", D, smem,
                        detail::max_shared_optin()));
      QVG_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    }
    const int nblk = blocks_per_group > 0 ? blocks_per_group : kpp_blocks_per_group(kernel, G, S, smem, stream);
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t lc = kpp_config(G, nblk, smem, stream, attr);
    QVG_CUDA(cudaLaunchKernelEx(&lc, kernel, pts, mu, H, K, k_eff, seed, stage, head_offset, nblk,
                                carve_scratch(scratch, G, S), idx));
  };
  if (pts.dtype == A::kF32)
    launch(kmeanspp_kernel<A::kF32>);
  else if (pts.dtype == A::kBF16)
    launch(kmeanspp_kernel<A::kBF16>);
  else
    launch(kmeanspp_kernel<A::kF16>);
  detail::check_launch("kmeanspp_kernel");
}

}  // namespace qvg::cuda::kernels
