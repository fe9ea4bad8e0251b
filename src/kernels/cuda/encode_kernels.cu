// Encoder kernels (spec 1.1, 1.2) on the device: point gathering with the group
// mean, centring, initial indices, k-means assignment on tensor cores with a fused
// argmin, exact centroid update, the end of a stage (stored centroids, next
// residual with the next mean); the residual quantize-and-pack is in
// quantize_kernels.cu. The host orchestration is in encode.cpp; the bodies that fix
// bits are in encode_bodies.cuh.
//
// Mirrors of the CPU encoder (src/codec/kmeans.cpp, encode.cpp):
// - points are group-centred with the group mean (fp64 sums, rounded to fp32);
// - init random picks the CPU's point indices (same PRNG stream, same partial
//   Fisher-Yates, on a sparse permutation);
// - empty clusters keep their previous centroid; S < K uses k_eff = S;
// - early stop per group after an iteration with fewer than 1e-4 * S changes;
// - stored centroids = (c + mu) rounded to the input dtype; the next residual
//   subtracts the stored values in fp32;
// - the residual quantizer uses the arith.cuh functions, bit-identical to
//   quantize_residual_group.
// Differences (allowed by spec 1.1 for GPU encoders): x.c uses bf16-rounded
// operands with fp32 accumulation, centroid means are accumulated in 64-bit fixed
// point (exact, so independent of the order the GPU sums in) instead of fp64 in
// point order, and the group mean adds fp64 partial sums of kMeanChunk points.
//
// Passes over the fp32 residual per stage: written once (gather, or the previous
// stage's subtraction, each with the next mean's partial sums fused), read by the
// centring and by each centroid update; the last stage's subtraction is fused into
// the quantizer's two passes (statistics, pack) and never written.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/encode_bodies.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/per_device.h"

namespace qvg::cuda::kernels {
namespace {

namespace A = qvg::cuda_arith;

__device__ __forceinline__ bool group_active(const int* changed, int64_t G, int64_t g, int it, double stop) {
  for (int j = 0; j < it; ++j)
    if (double(changed[int64_t(j) * G + g]) < stop) return false;
  return true;
}

// ---- points and the group mean -----------------------------------------------------

constexpr int kMeanThreads = 128;

// One block per (group, chunk of kMeanChunk points), threads over channels: the
// chunk's fp64 sum of each channel in point order, and (r set: a copy for the
// kernels that need stage 0's points in the residual buffer) r[g, t, :] = x[b, t, h, :]
// as fp32 (coalesced rows of D elements). Each thread loads kMeanBatch rows before
// it stores them (x and r never alias: __restrict__), so several loads are in flight.
constexpr int kMeanBatch = 8;

__device__ __forceinline__ void init_indices_block(int64_t g, int64_t H, int64_t S, int K, int k_eff, uint64_t seed,
                                                   int stage, int64_t head_offset, uint32_t* idx);

// With init.idx set, the grid's first G blocks draw stage 0's initial indices instead
// (init_indices; they do not depend on the data), so that the serial draw of each
// group runs beside the gather rather than after it.
template <int DT>
__global__ void gather_mean_kernel(const void* __restrict__ x, int64_t S, int64_t H, int64_t D, int64_t nchunk,
                                   float* __restrict__ r, double* __restrict__ partial, const InitDraw init) {
  int64_t blk = blockIdx.x;
  if (init.idx != nullptr) {
    if (blk < init.G) {
      init_indices_block(blk, H, S, init.K, init.k_eff, init.seed, 0, init.head_offset, init.idx);
      return;
    }
    blk -= init.G;
  }
  const int64_t g = blk / nchunk, ch = blk % nchunk;
  const int64_t b = g / H, h = g % H;
  const int64_t t0 = ch * kMeanChunk, t1 = min(S, t0 + kMeanChunk);
  const int64_t xstride = H * D;  // elements between two tokens of x
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    double s = 0;
    const int64_t xbase = (b * S * H + h) * D + d;
    float* rg = r != nullptr ? r + g * S * D + d : nullptr;
    for (int64_t t = t0; t < t1; t += kMeanBatch) {
      float v[kMeanBatch];
#pragma unroll
      for (int k = 0; k < kMeanBatch; ++k) v[k] = t + k < t1 ? A::load_elem(x, DT, xbase + (t + k) * xstride) : 0.0f;
#pragma unroll
      for (int k = 0; k < kMeanBatch; ++k)
        if (t + k < t1) {
          if (rg != nullptr) rg[(t + k) * D] = v[k];
          s += double(v[k]);  // point order
        }
    }
    partial[(g * nchunk + ch) * D + d] = s;
  }
}

// As gather_mean_kernel for the next stage: r[g, t, :] = src[g, t, :] - stored[g,
// ids[g, t], :] (fp32; src is r itself after stage 0, or the input), and the chunk
// sums of the new residual; kMeanBatch rows loaded first. A thread reads each element
// before it writes it, so src may be r.
__global__ void subtract_mean_kernel(const Points src, float* r, const float* __restrict__ stored,
                                     const uint8_t* __restrict__ ids, int64_t S, int64_t D, int K, int64_t nchunk,
                                     double* __restrict__ partial) {
  const int64_t g = blockIdx.x / nchunk, ch = blockIdx.x % nchunk;
  const int64_t sbase = src.base(g), sstride = src.stride();
  const int64_t t0 = ch * kMeanChunk, t1 = min(S, t0 + kMeanChunk);
  const float* sg = stored + g * K * D;
  const uint8_t* ig = ids + g * S;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    double s = 0;
    float* rg = r + g * S * D + d;
    for (int64_t t = t0; t < t1; t += kMeanBatch) {
      float v[kMeanBatch], c[kMeanBatch];
#pragma unroll
      for (int k = 0; k < kMeanBatch; ++k) {
        const bool in = t + k < t1;
        v[k] = in ? src.at(sbase + (t + k) * sstride + d) : 0.0f;
        c[k] = in ? sg[int64_t(ig[t + k]) * D + d] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kMeanBatch; ++k)
        if (t + k < t1) {
          const float w = A::sub_rn(v[k], c[k]);
          rg[(t + k) * D] = w;
          s += double(w);  // point order
        }
    }
    partial[(g * nchunk + ch) * D + d] = s;
  }
}

__global__ void mean_final_kernel(const double* partial, int64_t S, int64_t D, int64_t nchunk, float* mu) {
  const int64_t g = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    mu[g * D + d] = mean_of_partials(partial + g * nchunk * D + d, nchunk, D, S);
}

// One group per block of kCenterChunk elements (encode_bodies.cuh): the elements one at a
// time (any D or alignment), or 4 at a time (center_thread_vec4).
__global__ void center_kernel(const Points r, const float* __restrict__ mu, int64_t bpg, uint16_t* __restrict__ xb,
                              float* __restrict__ maxabs) {
  __shared__ float red[32];
  const int64_t S = r.S, D = r.D;
  const int64_t g = blockIdx.x / bpg, ch = blockIdx.x % bpg;
  const int64_t n = S * D, e0 = ch * kCenterChunk, e1 = min(n, e0 + kCenterChunk);
  const int64_t rbase = r.base(g), rstride = r.stride();
  const float* mg = mu + g * D;
  uint16_t* xg = xb + g * n;
  int64_t e = e0 + threadIdx.x;
  TokenChannel at(e, blockDim.x, D);
  float m = 0.0f;
  for (; e < e1; e += blockDim.x, at.advance()) {
    const float v = A::sub_rn(r.at(rbase + at.t * rstride + at.d), mg[at.d]);
    xg[e] = A::f32_to_bf16(v);
    m = fmaxf(m, fabsf(v));
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) atomic_max_nonneg(maxabs + g, m);
}

__global__ void __launch_bounds__(kThreads, 5)
    center_vec4_kernel(const Points r, const float* __restrict__ mu, int64_t bpg, uint16_t* __restrict__ xb,
                       float* __restrict__ maxabs) {
  __shared__ float red[32];
  float m = center_thread_vec4(r, mu, bpg, blockIdx.x, int(threadIdx.x), int(blockDim.x), xb);
  m = block_max(m, red);
  if (threadIdx.x == 0) atomic_max_nonneg(maxabs + blockIdx.x / bpg, m);
}

// One block per group. k_eff < S: thread 0 draws the CPU's initial indices
// (random_init_indices) with its table in shared memory (O(K) work, nothing of size
// S); k_eff == S: every point in order.
// The block's part of init_indices for group g (every thread of the block calls it).
__device__ __forceinline__ void init_indices_block(int64_t g, int64_t H, int64_t S, int K, int k_eff, uint64_t seed,
                                                   int stage, int64_t head_offset, uint32_t* idx) {
  __shared__ uint32_t keys[kInitTableSlots], vals[kInitTableSlots];
  if (k_eff == S) {
    for (int j = threadIdx.x; j < k_eff; j += blockDim.x) idx[g * K + j] = uint32_t(j);
    return;
  }
  for (int i = threadIdx.x; i < kInitTableSlots; i += blockDim.x) keys[i] = kInitEmpty;
  __syncthreads();
  if (threadIdx.x == 0) random_init_indices(seed, stage, g / H, g % H + head_offset, S, k_eff, keys, vals, idx + g * K);
}

__global__ void init_indices_kernel(int64_t H, int64_t S, int K, int k_eff, uint64_t seed, int stage,
                                    int64_t head_offset, uint32_t* idx) {
  init_indices_block(blockIdx.x, H, S, K, k_eff, seed, stage, head_offset, idx);
}

__global__ void init_kernel(const Points r, const float* mu, const uint32_t* idx, int K, int k_eff, int64_t n,
                            float* c) {
  const int64_t D = r.D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, gj = e / D;
    const int64_t j = gj % K, g = gj / K;
    c[e] = j < k_eff ? A::sub_rn(r.at(r.row(g, idx[gj]) + d), mu[g * D + d]) : 0.0f;
  }
}

__global__ void prepare_kernel(const float* c, int64_t D, int K, int k_eff, uint16_t* cb, float* cnorm) {
  __shared__ float red[kThreads];
  const int64_t gj = blockIdx.x;
  const int j = int(gj % K);
  float s = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const uint16_t h = j < k_eff ? A::f32_to_bf16(c[gj * D + d]) : uint16_t(0);
    cb[gj * D + d] = h;
    const float v = A::bf16_to_f32(h);
    s = A::add_rn(s, A::mul_rn(v, v));
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {  // fixed tree: deterministic
    if (int(threadIdx.x) < o) red[threadIdx.x] = A::add_rn(red[threadIdx.x], red[threadIdx.x + o]);
    __syncthreads();
  }
  if (threadIdx.x == 0) cnorm[gj] = j < k_eff ? red[0] : INFINITY;
}

// ---- assignment ----------------------------------------------------------------

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d;
  (void)a;
  (void)b0;
  (void)b1;
  __trap();  // the backend is built for sm_80 and newer only
#endif
}

__device__ __forceinline__ void take_min(float& best, int& bidx, float d, int idx) {
  if (d < best || (d == best && idx < bidx)) {
    best = d;
    bidx = idx;
  }
}

/// B fragments of one n-tile for two k-steps from shared memory in one instruction
/// (ldmatrix.x4; `saddr`: the shared-space byte address of the lane's row,
/// ldsm_b_offset in encode_bodies.cuh).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t saddr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr));
#else
  (void)r;
  (void)saddr;
  __trap();  // the backend is built for sm_80 and newer only
#endif
}

// The tensor-core configurations: DIM (head dim), MT m-tiles of 16 points per warp
// (their A fragments, all of DIM, stay in registers: MT * DIM / 4 registers per
// thread), NT n-tiles of 8 centroids per step (independent accumulators), WARPS
// per block. D = 64: 32 points per warp, each B fragment feeds two MMAs. D =
// 256: 16 points per warp (64 registers of A), two n-tiles per step so that two
// accumulation chains are in flight, 8 warps to share the 132 KB of centroids.
template <int DIM>
struct MmaConfig;
template <>
struct MmaConfig<64> {
  static constexpr int MT = 2, NT = 1, WARPS = 4, MIN_BLOCKS = 1;
};
// D = 128: 16 points per warp, two n-tiles per step, 12 warps (56 registers, three
// 384-thread blocks per multiprocessor by registers and shared memory: 36 warps). On
// the H200 (LongCat tensor, K = 256) this ran the assignment in 0.307 ms, against
// 0.429 ms for MT 2 / NT 1 / 4 warps (12 warps resident) and 0.337-0.411 ms for four
// other tilings (docs/cuda.md, "Measured on the H200"), all one tile per block. The
// persistent tile loop takes 75 registers unbounded (two blocks, 24 warps); MIN_BLOCKS
// keeps the three at 56 registers, with 32 bytes of spill stores outside the centroid
// loop (a few local loads per tile of 192 points; ptxas sm_90a, nvcc 13.0).
template <>
struct MmaConfig<128> {
  static constexpr int MT = 1, NT = 2, WARPS = 12, MIN_BLOCKS = 3;
};
template <>
struct MmaConfig<256> {
  static constexpr int MT = 1, NT = 2, WARPS = 8, MIN_BLOCKS = 1;
};

template <int DIM>
constexpr int mma_rows_per_block() {
  return MmaConfig<DIM>::WARPS * 16 * MmaConfig<DIM>::MT;
}
/// Centroid rows the kernel stages for k_eff centroids (a multiple of 8 * NT).
template <int DIM>
int mma_kpad(int k_eff) {
  constexpr int step = 8 * MmaConfig<DIM>::NT;
  return (k_eff + step - 1) / step * step;
}
template <int DIM>
size_t mma_smem_bytes(int k_eff) {
  const int kpad = mma_kpad<DIM>(k_eff);
  return size_t(kpad) * (DIM + 8) * 2 + size_t(kpad) * 4;
}

// One block: tiles of rows_per_block points of one group (tiles first, first + bpg,
// ...: a persistent block loads the group's codebook once, not once per tile) against
// all of the group's centroids, which sit in shared memory (bf16, rows padded by 8
// elements: conflict-free ldmatrix rows). Each warp keeps the A fragments of its
// 16 * MT points (all of DIM) in registers and walks the centroids 8 * NT at a time
// (mma.m16n8k16, B fragments of two k-steps per ldmatrix.x4); the argmin is taken
// on the accumulators. Fragment layouts (PTX ISA, m16n8k16 bf16): lane = 4 * gid +
// tig; A regs 0..3 = rows gid, gid+8 x columns 2tig(+1), 2tig+8(+1); B regs 0, 1 =
// column gid x rows 2tig(+1), 2tig+8(+1); C regs 0..3 = rows gid, gid, gid+8, gid+8
// x columns 2tig, 2tig+1 (a_fragment_*, ldsm_b_offset, c_fragment_*: encode_bodies.cuh).
template <int DIM>
__global__ void __launch_bounds__(MmaConfig<DIM>::WARPS * 32, MmaConfig<DIM>::MIN_BLOCKS)
    assign_mma_kernel(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int K,
                      int k_eff, int64_t ntiles, int64_t bpg, uint8_t* ids, int* changed, int it, double stop) {
  constexpr int MT = MmaConfig<DIM>::MT, NT = MmaConfig<DIM>::NT;
  constexpr int KS = DIM / 16, LD = DIM + 8, ROWS_W = 16 * MT, ROWS_B = mma_rows_per_block<DIM>();
  static_assert(KS % 2 == 0, "one ldmatrix.x4 covers two k-steps");
  extern __shared__ uint4 smem_u4[];
  const int kpad = (k_eff + 8 * NT - 1) / (8 * NT) * (8 * NT);
  uint16_t* cs = reinterpret_cast<uint16_t*>(smem_u4);
  float* cn = reinterpret_cast<float*>(cs + size_t(kpad) * LD);
  const int64_t g = blockIdx.x / bpg, first = blockIdx.x % bpg;
  if (!group_active(changed, G, g, it, stop)) return;

  for (int i = threadIdx.x; i < kpad * (DIM / 8); i += blockDim.x) {
    const int row = i / (DIM / 8), c8 = i % (DIM / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < k_eff) v = *reinterpret_cast<const uint4*>(cb + (g * K + row) * DIM + c8 * 8);
    *reinterpret_cast<uint4*>(cs + row * LD + c8 * 8) = v;
  }
  for (int i = threadIdx.x; i < kpad; i += blockDim.x) cn[i] = i < k_eff ? cnorm[g * K + i] : INFINITY;
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint16_t* xg = xb + g * S * DIM;
  // ldsm_b_offset is linear in (nt, ks): the lane's part once, the step's added per load
  const uint32_t b_lane = uint32_t(__cvta_generic_to_shared(cs)) + 2u * uint32_t(ldsm_b_offset(lane, 0, 0, LD));
  // 32-bit tile and row numbers: S < 2^31 (DeviceEncodedTensor::allocate checks it);
  // tile * ROWS_B < S + ROWS_B overflows only past 2^31 - 256 points of one group
  // (256 GB of bf16 points at D = 64: more than a device holds)
  const int s32 = int(S), nt32 = int(ntiles), step = int(bpg);
  int nchanged = 0;
  for (int tile = int(first); tile < nt32; tile += step) {
    const int base = tile * ROWS_B + warp * ROWS_W;
    if (base >= s32) break;  // this warp's rows of this and every later tile lie past S (warp-uniform)
    uint32_t a[MT][KS][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          const int row = base + mt * 16 + a_fragment_row(lane, reg);
          a[mt][ks][reg] =
              row < s32 ? *reinterpret_cast<const uint32_t*>(xg + int64_t(row) * DIM + a_fragment_k(lane, ks, reg))
                        : 0u;
        }
    float best[2 * MT];
    int bidx[2 * MT];
#pragma unroll
    for (int q = 0; q < 2 * MT; ++q) {
      best[q] = INFINITY;
      bidx[q] = INT_MAX;
    }
    for (int nt0 = 0; nt0 < kpad / 8; nt0 += NT) {
      float acc[NT][MT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[n][mt][i] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          uint32_t b[4];  // b[0], b[1]: step ks; b[2], b[3]: step ks + 1
          ldsm_x4(b, b_lane + 2u * uint32_t(ldsm_b_offset(0, nt0 + n, ks, LD)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[n][mt], a[mt][ks], b[0], b[1]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[n][mt], a[mt][ks + 1], b[2], b[3]);
        }
      }
      // A thread meets its columns in increasing order (nt0, then n, then j), so a
      // tie with an earlier column never displaces it: `d < best` alone keeps the
      // lowest index among the thread's equal distances. The distances of real
      // columns are finite within the input limits (spec 1.0: |x| <= 1e16), so the
      // padding's +inf is never taken; out of the limits, a row whose distances
      // are all +inf or NaN gets id 0.
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 c2 = *reinterpret_cast<const float2*>(cn + (nt0 + n) * 8 + c_fragment_col(lane, 0));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // row c_fragment_row(lane, i) = gid + 8 (i >> 1): best[2 mt + (i >> 1)]
            const int col = (nt0 + n) * 8 + c_fragment_col(lane, i);
            const float d = fmaf(-2.0f, acc[n][mt][i], (i & 1) ? c2.y : c2.x);
            const int q = mt * 2 + (i >> 1);
            if (d < best[q]) {
              best[q] = d;
              bidx[q] = col;
            }
          }
      }
    }
#pragma unroll
    for (int q = 0; q < 2 * MT; ++q) {
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {  // across the 4 lanes of a row: the spec's tie rule
        const float od = __shfl_xor_sync(0xFFFFFFFFu, best[q], o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bidx[q], o);
        take_min(best[q], bidx[q], od, oi);
      }
      const int row = base + (q >> 1) * 16 + c_fragment_row(lane, 2 * (q & 1));
      if (lane % 4 == 0 && row < s32) {
        uint8_t* p = ids + g * S + row;
        const uint8_t nid = uint8_t(bidx[q] == INT_MAX ? 0 : bidx[q]);
        if (it == 0 || *p != nid) ++nchanged;
        *p = nid;
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) nchanged += __shfl_xor_sync(0xFFFFFFFFu, nchanged, o);
  if (lane == 0 && nchanged) atomicAdd(changed + int64_t(it) * G + g, nchanged);
}

constexpr int kGenericThreads = 64;
constexpr int kGenericXStride = kGenericThreads + 2;  // halfwords: rows d of xs start 33 banks apart

// Any D: one thread per point, expanded form in fp32 on the bf16 values the
// tensor-core path uses. The block's points sit in shared memory (XSMEM; bf16,
// transposed: thread p reads xs[d * kGenericXStride + p], conflict-free) or, for a
// D too large for that, are read from global memory; the centroids go through
// shared memory in chunks, as fp32 (broadcast reads).
template <bool XSMEM>
__global__ void __launch_bounds__(kGenericThreads)
    assign_generic_kernel(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int64_t D,
                          int K, int k_eff, int64_t ntiles, int chunk, uint8_t* ids, int* changed, int it,
                          double stop) {
  extern __shared__ float cf[];  // [chunk][D], then (XSMEM) xs [D][kGenericXStride] bf16
  uint16_t* xs = reinterpret_cast<uint16_t*>(cf + size_t(chunk) * D);
  const int64_t g = blockIdx.x / ntiles, tile = blockIdx.x % ntiles;
  if (!group_active(changed, G, g, it, stop)) return;
  const int64_t t = tile * kGenericThreads + threadIdx.x;
  const uint16_t* x = xb + (g * S + (t < S ? t : 0)) * D;
  if (XSMEM) {
    const int64_t t0 = tile * kGenericThreads;
    for (int64_t i = threadIdx.x; i < kGenericThreads * D; i += kGenericThreads) {  // coalesced rows
      const int64_t p = i / D, d = i % D;
      xs[d * kGenericXStride + p] = t0 + p < S ? xb[(g * S + t0 + p) * D + d] : uint16_t(0);
    }
  }
  float best = INFINITY;
  int bi = 0;
  for (int j0 = 0; j0 < k_eff; j0 += chunk) {
    const int nj = min(chunk, k_eff - j0);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < int64_t(nj) * D; i += kGenericThreads)
      cf[i] = A::bf16_to_f32(cb[(g * K + j0) * D + i]);
    __syncthreads();
    for (int j = 0; j < nj; ++j) {
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) {
        const uint16_t xv = XSMEM ? xs[d * kGenericXStride + threadIdx.x] : x[d];
        dot = fmaf(A::bf16_to_f32(xv), cf[j * D + d], dot);
      }
      const float dist = fmaf(-2.0f, dot, cnorm[g * K + j0 + j]);
      if (dist < best) {
        best = dist;
        bi = j0 + j;
      }
    }
  }
  int nchanged = 0;
  if (t < S) {
    uint8_t* p = ids + g * S + t;
    if (it == 0 || *p != uint8_t(bi)) nchanged = 1;
    *p = uint8_t(bi);
  }
  for (int o = 16; o > 0; o >>= 1) nchanged += __shfl_xor_sync(0xFFFFFFFFu, nchanged, o);
  if (threadIdx.x % 32 == 0 && nchanged) atomicAdd(changed + int64_t(it) * G + g, nchanged);
}

// ---- centroid update (exact fixed point) -------------------------------------

// 16 warps, 256 sorted points each (40 registers at sm_90a: 3 blocks, 48 warps, per
// SM). A small tensor (the Self-Forcing chunk: 96 blocks, under one per SM) gets 16
// warps per SM instead of 8 with 256-thread blocks, and half the sequential rows per
// warp; more warps per block add global atomics only at the warp boundaries.
constexpr int kUpdThreads = 512;
constexpr int kUpdIdsPerThread = kUpdPoints / kUpdThreads;
static_assert(kUpdPoints % kUpdThreads == 0, "a thread counts kUpdIdsPerThread ids");

// The exact fixed-point sums of one block: kUpdPoints points of group g by kUpdLanes
// channels (encode_bodies.cuh, "the update's block work"). Shared memory: the chunk's
// ids, the per-cluster counts and cursors, the sorted keys (22.5 KB). The counts go to
// the global ones from the channel slice 0's blocks. DT: r.dtype.
template <int DT>
__global__ void __launch_bounds__(kUpdThreads)
    update_accumulate_kernel(const Points r, const float* __restrict__ mu, const float* __restrict__ maxabs,
                             const uint8_t* __restrict__ ids, int64_t G, int64_t S, int64_t D, int K, int64_t nchunk,
                             int64_t nslice, unsigned long long* __restrict__ sums, int* __restrict__ counts,
                             const int* __restrict__ changed, int it, double stop) {
  __shared__ uint32_t keys[kUpdPoints];
  __shared__ uint8_t cid[kUpdPoints];
  __shared__ int cnt[256], cursor[256];
  const int64_t g = blockIdx.x / (nchunk * nslice), rest = blockIdx.x % (nchunk * nslice);
  const int64_t slice = rest / nchunk, ch = rest % nchunk;
  if (!group_active(changed, G, g, it, stop)) return;
  const int64_t t0 = ch * kUpdPoints;
  const int n = int(min(S - t0, int64_t(kUpdPoints)));
  for (int i = threadIdx.x; i < 256; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const uint8_t* ig = ids + g * S + t0;
  uint8_t own[kUpdIdsPerThread];  // the histogram: a thread's ids loaded together, then counted
#pragma unroll
  for (int j = 0; j < kUpdIdsPerThread; ++j) {
    const int i = int(threadIdx.x) + j * kUpdThreads;
    own[j] = i < n ? ig[i] : uint8_t(0);
  }
#pragma unroll
  for (int j = 0; j < kUpdIdsPerThread; ++j) {
    const int i = int(threadIdx.x) + j * kUpdThreads;
    if (i < n) {
      cid[i] = own[j];
      atomicAdd(&cnt[own[j]], 1);
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // its exclusive scan: 8 clusters per lane, then across the warp
    const int l = int(threadIdx.x);
    int v[8], s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += (v[j] = cnt[8 * l + j]);
    int incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
      if (l >= o) incl += y;
    }
    int run = incl - s;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      cursor[8 * l + j] = run;
      run += v[j];
    }
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += kUpdThreads) {  // the scatter (any order within a cluster)
    const int id = cid[i];
    keys[atomicAdd(&cursor[id], 1)] = update_key(id, i);
  }
  __syncthreads();
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int64_t d = slice * kUpdLanes + lane;
  const bool in_d = d < D;
  const int64_t dv = in_d ? d : D - 1;  // a lane past D reads a valid channel and flushes nothing
  int p0 = 0, p1 = 0;
  update_warp_range(n, warp, kUpdThreads / 32, &p0, &p1);
  unsigned long long* sg = sums + g * K * D + dv;
  update_run_sums<DT>(r, r.base(g) + dv, t0, keys, p0, p1, in_d, mu[g * D + dv], fixed_exponent(maxabs[g], S),
                      [&](int id, unsigned long long s) { atomicAdd(sg + int64_t(id) * D, s); });
  if (slice == 0)
    for (int i = threadIdx.x; i < K; i += blockDim.x)
      if (cnt[i]) atomicAdd(counts + g * K + i, cnt[i]);
}

__global__ void update_final_kernel(const unsigned long long* sums, const int* counts, const float* maxabs, int64_t G,
                                    int64_t S, int64_t D, int K, int64_t n, float* c, const int* changed, int it,
                                    double stop) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t gj = e / D, g = gj / K;
    const int cntv = counts[gj];
    if (cntv == 0 || !group_active(changed, G, g, it, stop)) continue;  // empty: keep the previous centroid
    c[e] = centroid_from_fixed((long long)sums[e], cntv, fixed_exponent(maxabs[g], S));
  }
}

// ---- end of a stage ------------------------------------------------------------

__global__ void store_centroids_kernel(const float* c, const float* mu, int64_t D, int K, int k_eff, int dtype,
                                       int64_t n, void* out_c, float* stored) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, gj = e / D;
    const int64_t j = gj % K, g = gj / K;
    uint32_t bits = 0;
    const float v = j < k_eff ? stored_centroid(c[e], mu[g * D + d], dtype, &bits) : 0.0f;
    if (dtype == A::kF32)
      static_cast<float*>(out_c)[e] = v;
    else
      static_cast<uint16_t*>(out_c)[e] = uint16_t(j < k_eff ? bits : 0u);
    stored[e] = v;
  }
}

/// Resident blocks per multiprocessor of assign_mma_kernel<DIM> with k_eff (1..256)
/// centroids' shared memory (at least 1): the occupancy query once per (device, k_eff)
/// instead of on every launch (4 per layer update with 2 iterations). The value
/// depends only on the device, the kernel and the shared memory; two threads that
/// both miss store the same number.
template <int DIM>
int assign_blocks_per_sm(int k_eff, size_t smem) {
  static std::atomic<int> known[detail::kMaxDevices][257] = {};
  const int dev = detail::current_device();
  const bool slot = dev >= 0 && dev < detail::kMaxDevices && k_eff >= 1 && k_eff <= 256;
  if (slot) {
    const int v = known[dev][k_eff].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int per_sm = 0;
  QVG_CUDA(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, assign_mma_kernel<DIM>, MmaConfig<DIM>::WARPS * 32, smem));
  per_sm = std::max(per_sm, 1);
  if (slot) known[dev][k_eff].store(per_sm, std::memory_order_relaxed);
  return per_sm;
}

/// Launches the tensor-core assignment for D = DIM if the device has the shared
/// memory for k_eff centroids; false (nothing launched) otherwise.
template <int DIM>
bool launch_assign_mma(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int K,
                       int k_eff, uint8_t* ids, int* changed, int it, double stop, cudaStream_t stream) {
  const size_t smem = mma_smem_bytes<DIM>(k_eff);
  const int optin = detail::max_shared_optin();
  if (smem > size_t(optin)) return false;
  // The opt-in is per device and per function: set once per device (thread-safe),
  // to what K = 256 needs or the device's limit.
  static detail::PerDeviceOnce configured;
  configured.run(detail::current_device(), [&] {
    const int want = int(std::min<size_t>(mma_smem_bytes<DIM>(256), size_t(optin)));
    QVG_CUDA(cudaFuncSetAttribute(assign_mma_kernel<DIM>, cudaFuncAttributeMaxDynamicSharedMemorySize, want));
  });
  constexpr int rows = mma_rows_per_block<DIM>(), threads = MmaConfig<DIM>::WARPS * 32;
  const int64_t ntiles = (S + rows - 1) / rows;
  // Persistent blocks: as many per group as kAssignWaves waves of resident blocks
  // hold (at least 1, at most one per tile), so that each loads its codebook once for
  // several tiles. Two waves, not one: after an early stop (iteration >= 1, spec 1.1)
  // the blocks of the stopped groups return at once, and the active groups' blocks
  // should still fill the device (with half of the groups stopped they do). The
  // occupancy query is a host computation (no stream work, allowed during capture).
  constexpr int64_t kAssignWaves = 2;
  const int64_t resident = int64_t(assign_blocks_per_sm<DIM>(k_eff, smem)) * detail::multiprocessor_count();
  const int64_t bpg = std::clamp<int64_t>(kAssignWaves * resident / G, 1, ntiles);
  assign_mma_kernel<DIM><<<unsigned(G * bpg), threads, smem, stream>>>(xb, cb, cnorm, G, S, K, k_eff, ntiles, bpg, ids,
                                                                       changed, it, stop);
  detail::check_launch("assign_mma_kernel");
  return true;
}

/// The dynamic shared memory the generic assignment may take on the current device.
size_t generic_smem_budget() {
  return std::min<size_t>(size_t(96) << 10, size_t(detail::max_shared_optin()));
}

void launch_assign_generic(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int64_t D,
                           int K, int k_eff, uint8_t* ids, int* changed, int it, double stop, cudaStream_t stream) {
  const size_t budget = generic_smem_budget();
  const size_t xbytes = size_t(D) * kGenericXStride * 2;
  const bool xsmem = xbytes + size_t(D) * 4 <= budget;
  const size_t cbudget = xsmem ? budget - xbytes : std::min<size_t>(budget, size_t(48) << 10);
  const int chunk = int(std::max<int64_t>(1, std::min<int64_t>(k_eff, int64_t(cbudget / (size_t(D) * 4)))));
  const size_t smem = size_t(chunk) * size_t(D) * 4 + (xsmem ? xbytes : 0);
  static detail::PerDeviceOnce configured;
  configured.run(detail::current_device(), [&] {
    QVG_CUDA(
        cudaFuncSetAttribute(assign_generic_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget)));
    QVG_CUDA(
        cudaFuncSetAttribute(assign_generic_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget)));
  });
  const int64_t ntiles = (S + kGenericThreads - 1) / kGenericThreads;
  if (xsmem)
    assign_generic_kernel<true><<<unsigned(G * ntiles), kGenericThreads, smem, stream>>>(
        xb, cb, cnorm, G, S, D, K, k_eff, ntiles, chunk, ids, changed, it, stop);
  else
    assign_generic_kernel<false><<<unsigned(G * ntiles), kGenericThreads, smem, stream>>>(
        xb, cb, cnorm, G, S, D, K, k_eff, ntiles, chunk, ids, changed, it, stop);
  detail::check_launch("assign_generic_kernel");
}

}  // namespace

int64_t max_encode_head_dim() {
  return int64_t(generic_smem_budget() / 4);
}

void gather_points(const void* x, int dtype, int64_t B, int64_t S, int64_t H, int64_t D, float* r, double* partial,
                   float* mu, cudaStream_t stream, const InitDraw& init) {
  const int64_t G = B * H, nchunk = (S + kMeanChunk - 1) / kMeanChunk;
  // the element type a template argument: no per-load branch on it (the loads of a batch stay in flight together)
  InitDraw d = init;
  d.G = init.idx != nullptr ? G : 0;  // the grid's first d.G blocks draw the indices
  with_dtype(dtype, [&](auto dt) {
    gather_mean_kernel<decltype(dt)::value>
        <<<unsigned(d.G + G * nchunk), kMeanThreads, 0, stream>>>(x, S, H, D, nchunk, r, partial, d);
  });
  detail::check_launch("gather_mean_kernel");
  mean_final_kernel<<<unsigned(G), kMeanThreads, 0, stream>>>(partial, S, D, nchunk, mu);
  detail::check_launch("mean_final_kernel");
}

void center_points(const Points& r, const float* mu, int64_t G, uint16_t* xb, float* maxabs, cudaStream_t stream) {
  const int64_t bpg = (r.S * r.D + kCenterChunk - 1) / kCenterChunk;
  if (center_vec4_ok(r, mu, xb)) {
    center_vec4_kernel<<<unsigned(G * bpg), kThreads, 0, stream>>>(r, mu, bpg, xb, maxabs);
    detail::check_launch("center_vec4_kernel");
    return;
  }
  center_kernel<<<unsigned(G * bpg), kThreads, 0, stream>>>(r, mu, bpg, xb, maxabs);
  detail::check_launch("center_kernel");
}

void init_indices(int64_t G, int64_t H, int64_t S, int K, int k_eff, uint64_t seed, int stage, int64_t head_offset,
                  uint32_t* idx, cudaStream_t stream) {
  init_indices_kernel<<<unsigned(G), 128, 0, stream>>>(H, S, K, k_eff, seed, stage, head_offset, idx);
  detail::check_launch("init_indices_kernel");
}

void init_centroids(const Points& r, const float* mu, const uint32_t* idx, int64_t G, int K, int k_eff, float* c,
                    cudaStream_t stream) {
  const int64_t n = G * K * r.D;
  init_kernel<<<grid_for(n), kThreads, 0, stream>>>(r, mu, idx, K, k_eff, n, c);
  detail::check_launch("init_kernel");
}

void prepare_centroids(const float* c, int64_t G, int64_t D, int K, int k_eff, uint16_t* cb, float* cnorm,
                       cudaStream_t stream) {
  prepare_kernel<<<unsigned(G * K), kThreads, 0, stream>>>(c, D, K, k_eff, cb, cnorm);
  detail::check_launch("prepare_kernel");
}

void assign(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int64_t D, int K,
            uint8_t* ids, int* changed, int it, double stop, cudaStream_t stream) {
  const int k_eff = int(std::min<int64_t>(K, S));
  if (D == 128 && launch_assign_mma<128>(xb, cb, cnorm, G, S, K, k_eff, ids, changed, it, stop, stream)) return;
  if (D == 64 && launch_assign_mma<64>(xb, cb, cnorm, G, S, K, k_eff, ids, changed, it, stop, stream)) return;
  if (D == 256 && launch_assign_mma<256>(xb, cb, cnorm, G, S, K, k_eff, ids, changed, it, stop, stream)) return;
  launch_assign_generic(xb, cb, cnorm, G, S, D, K, k_eff, ids, changed, it, stop, stream);
}

void update_centroids(const Points& r, const float* mu, const float* maxabs, const uint8_t* ids, int64_t G, int64_t S,
                      int64_t D, int K, long long* sums, int* counts, float* c, const int* changed, int it, double stop,
                      cudaStream_t stream) {
  QVG_CUDA(cudaMemsetAsync(sums, 0, size_t(G * K * D) * sizeof(long long), stream));
  QVG_CUDA(cudaMemsetAsync(counts, 0, size_t(G * K) * sizeof(int), stream));
  const int64_t nchunk = (S + kUpdPoints - 1) / kUpdPoints, nslice = (D + kUpdLanes - 1) / kUpdLanes;
  auto* usums = reinterpret_cast<unsigned long long*>(sums);
  with_dtype(r.dtype, [&](auto dt) {
    update_accumulate_kernel<decltype(dt)::value><<<unsigned(G * nchunk * nslice), kUpdThreads, 0, stream>>>(
        r, mu, maxabs, ids, G, S, D, K, nchunk, nslice, usums, counts, changed, it, stop);
  });
  detail::check_launch("update_accumulate_kernel");
  const int64_t n = G * K * D;
  update_final_kernel<<<grid_for(n), kThreads, 0, stream>>>(usums, counts, maxabs, G, S, D, K, n, c, changed, it, stop);
  detail::check_launch("update_final_kernel");
}

void finish_stage(const Points& src, float* r, const float* c, float* mu, const uint8_t* ids, int64_t G, int64_t S,
                  int64_t D, int K, int k_eff, int dtype, void* out_c, float* stored, bool last, double* partial,
                  cudaStream_t stream) {
  const int64_t nc = G * K * D;
  store_centroids_kernel<<<grid_for(nc), kThreads, 0, stream>>>(c, mu, D, K, k_eff, dtype, nc, out_c, stored);
  detail::check_launch("store_centroids_kernel");
  if (last) return;  // the quantizer subtracts the last stage's centroids itself
  const int64_t nchunk = (S + kMeanChunk - 1) / kMeanChunk;
  subtract_mean_kernel<<<unsigned(G * nchunk), kMeanThreads, 0, stream>>>(src, r, stored, ids, S, D, K, nchunk,
                                                                          partial);
  detail::check_launch("subtract_mean_kernel");
  mean_final_kernel<<<unsigned(G), kMeanThreads, 0, stream>>>(partial, S, D, nchunk, mu);
  detail::check_launch("mean_final_kernel");
}

}  // namespace qvg::cuda::kernels
