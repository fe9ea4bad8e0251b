// Encoder kernels (spec 1.1, 1.2) on the device: point gathering and centring,
// k-means assignment on tensor cores with a fused argmin, exact centroid update,
// the end of a stage (stored centroids, next residual) and the residual
// quantize-and-pack. The host orchestration is in encode.cpp.
//
// Mirrors of the CPU encoder (src/codec/kmeans.cpp, encode.cpp):
// - points are group-centred with the group mean (fp64 sum, rounded to fp32);
// - empty clusters keep their previous centroid; S < K uses k_eff = S;
// - early stop per group after an iteration with fewer than 1e-4 * S changes;
// - stored centroids = (c + mu) rounded to the input dtype; the next residual
//   subtracts the stored values in fp32;
// - the residual quantizer uses the arith.cuh functions, bit-identical to
//   quantize_residual_group.
// Differences (allowed by spec 1.1 for GPU encoders): x.c uses bf16-rounded
// operands with fp32 accumulation, and centroid means are accumulated in 64-bit
// fixed point (exact, so independent of the order the GPU sums in) instead of
// fp64 in point order.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace qvg::cuda::kernels {
namespace {

namespace A = qvg::cuda_arith;

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned(std::max<int64_t>(1, (n + threads - 1) / threads));
}

__device__ __forceinline__ bool group_active(const int* changed, int64_t G, int64_t g, int it, double stop) {
  for (int j = 0; j < it; ++j)
    if (double(changed[int64_t(j) * G + g]) < stop) return false;
  return true;
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

// ---- points ------------------------------------------------------------------

__global__ void gather_kernel(const void* x, int dtype, int64_t S, int64_t H, int64_t D, int64_t n, float* r) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, rest = e / D;
    const int64_t h = rest % H, bt = rest / H;
    const int64_t t = bt % S, b = bt / S;
    r[((b * H + h) * S + t) * D + d] = A::load_elem(x, dtype, e);
  }
}

constexpr int kMeanChunk = 1024;

__global__ void mean_partial_kernel(const float* r, int64_t S, int64_t D, int64_t nchunk, double* partial) {
  const int64_t g = blockIdx.x / nchunk, ch = blockIdx.x % nchunk;
  const int64_t t0 = ch * kMeanChunk, t1 = min(S, t0 + kMeanChunk);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    double s = 0;
    for (int64_t t = t0; t < t1; ++t) s += double(r[(g * S + t) * D + d]);
    partial[(g * nchunk + ch) * D + d] = s;
  }
}

__global__ void mean_final_kernel(const double* partial, int64_t S, int64_t D, int64_t nchunk, float* mu) {
  const int64_t g = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    double s = 0;
    for (int64_t ch = 0; ch < nchunk; ++ch) s += partial[(g * nchunk + ch) * D + d];
    mu[g * D + d] = float(s / double(S));
  }
}

constexpr int kCenterChunk = 8192;  // elements per block (one group per block)

__global__ void center_kernel(const float* r, const float* mu, int64_t S, int64_t D, int64_t bpg, uint16_t* xb,
                              float* maxabs) {
  __shared__ float red[32];
  const int64_t g = blockIdx.x / bpg, ch = blockIdx.x % bpg;
  const int64_t n = S * D, e0 = ch * kCenterChunk, e1 = min(n, e0 + kCenterChunk);
  float m = 0.0f;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const float v = A::sub_rn(r[g * n + e], mu[g * D + e % D]);
    xb[g * n + e] = A::f32_to_bf16(v);
    m = fmaxf(m, fabsf(v));
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) atomic_max_nonneg(maxabs + g, m);
}

__global__ void iota_kernel(uint32_t* perm, int64_t S, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    perm[e] = uint32_t(e % S);
}

// One thread per group: the partial Fisher-Yates of init_random (kmeans.cpp), with
// the same PRNG stream, so the device picks the CPU's initial points.
__global__ void random_indices_kernel(int64_t G, int64_t H, int64_t S, int K, int k_eff, uint64_t seed, int stage,
                                      int64_t head_offset, uint32_t* perm, uint32_t* idx) {
  const int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (g >= G) return;
  uint32_t* p = perm + g * S;
  if (k_eff == S) {  // every point is its own centroid, in order
    for (int j = 0; j < k_eff; ++j) idx[g * K + j] = uint32_t(j);
    return;
  }
  A::Rng rng(seed, uint64_t(stage), uint64_t(g / H), uint64_t(g % H + head_offset));
  for (int j = 0; j < k_eff; ++j) {
    const uint64_t r = uint64_t(j) + rng.below(uint64_t(S - j));
    const uint32_t tmp = p[j];
    p[j] = p[r];
    p[r] = tmp;
    idx[g * K + j] = p[j];
  }
}

__global__ void init_kernel(const float* r, const float* mu, const uint32_t* idx, int64_t S, int64_t D, int K,
                            int k_eff, int64_t n, float* c) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, gj = e / D;
    const int64_t j = gj % K, g = gj / K;
    c[e] = j < k_eff ? A::sub_rn(r[(g * S + idx[gj]) * D + d], mu[g * D + d]) : 0.0f;
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

constexpr int kMmaWarps = 4;
constexpr int kMmaRowsPerWarp = 32;
constexpr int kMmaRows = kMmaWarps * kMmaRowsPerWarp;  // points per block

// One block: kMmaRows points of one group against all of the group's centroids,
// which sit in shared memory (bf16, rows padded by 8 elements: conflict-free B
// fragment loads). Each warp keeps the A fragments of its 32 points (all of D) in
// registers and walks the centroids 8 at a time (mma.m16n8k16, two m-tiles), so
// each B fragment feeds two MMAs; the argmin is taken on the accumulators.
template <int DIM>
__global__ void __launch_bounds__(kMmaWarps * 32) assign_mma_kernel(const uint16_t* xb, const uint16_t* cb,
                                                                    const float* cnorm, int64_t G, int64_t S, int K,
                                                                    int k_eff, int64_t ntiles, uint8_t* ids,
                                                                    int* changed, int it, double stop) {
  constexpr int KS = DIM / 16, LD = DIM + 8;
  extern __shared__ uint4 smem_u4[];
  const int kpad = (k_eff + 7) & ~7;
  uint16_t* cs = reinterpret_cast<uint16_t*>(smem_u4);
  float* cn = reinterpret_cast<float*>(cs + size_t(kpad) * LD);
  const int64_t g = blockIdx.x / ntiles, tile = blockIdx.x % ntiles;
  if (!group_active(changed, G, g, it, stop)) return;

  for (int i = threadIdx.x; i < kpad * (DIM / 8); i += blockDim.x) {
    const int row = i / (DIM / 8), c8 = i % (DIM / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < k_eff) v = *reinterpret_cast<const uint4*>(cb + (g * K + row) * DIM + c8 * 8);
    *reinterpret_cast<uint4*>(cs + row * LD + c8 * 8) = v;
  }
  for (int i = threadIdx.x; i < kpad; i += blockDim.x) cn[i] = i < k_eff ? cnorm[g * K + i] : INFINITY;
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, tig = lane & 3;
  const int64_t base = tile * kMmaRows + warp * kMmaRowsPerWarp;
  const uint16_t* xg = xb + g * S * DIM;
  uint32_t a[2][KS][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int64_t r0 = base + mt * 16 + gid, r1 = r0 + 8;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int col = ks * 16 + tig * 2;
      a[mt][ks][0] = r0 < S ? *reinterpret_cast<const uint32_t*>(xg + r0 * DIM + col) : 0u;
      a[mt][ks][1] = r1 < S ? *reinterpret_cast<const uint32_t*>(xg + r1 * DIM + col) : 0u;
      a[mt][ks][2] = r0 < S ? *reinterpret_cast<const uint32_t*>(xg + r0 * DIM + col + 8) : 0u;
      a[mt][ks][3] = r1 < S ? *reinterpret_cast<const uint32_t*>(xg + r1 * DIM + col + 8) : 0u;
    }
  }
  float best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
  int bidx[4] = {INT_MAX, INT_MAX, INT_MAX, INT_MAX};
  for (int nt = 0; nt < kpad / 8; ++nt) {
    float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    const uint16_t* crow = cs + (nt * 8 + gid) * LD + tig * 2;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(crow + ks * 16);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(crow + ks * 16 + 8);
      mma_bf16(acc[0], a[0][ks], b0, b1);
      mma_bf16(acc[1], a[1][ks], b0, b1);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = nt * 8 + tig * 2 + j;
      const float c2 = cn[col];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        take_min(best[mt * 2], bidx[mt * 2], fmaf(-2.0f, acc[mt][j], c2), col);
        take_min(best[mt * 2 + 1], bidx[mt * 2 + 1], fmaf(-2.0f, acc[mt][2 + j], c2), col);
      }
    }
  }
  int nchanged = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      const float od = __shfl_xor_sync(0xFFFFFFFFu, best[q], o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bidx[q], o);
      take_min(best[q], bidx[q], od, oi);
    }
    const int64_t row = base + (q >> 1) * 16 + gid + (q & 1) * 8;
    if (tig == 0 && row < S) {
      uint8_t* p = ids + g * S + row;
      const uint8_t nid = uint8_t(bidx[q] == INT_MAX ? 0 : bidx[q]);
      if (it == 0 || *p != nid) ++nchanged;
      *p = nid;
    }
  }
  for (int o = 16; o > 0; o >>= 1) nchanged += __shfl_xor_sync(0xFFFFFFFFu, nchanged, o);
  if (lane == 0 && nchanged) atomicAdd(changed + int64_t(it) * G + g, nchanged);
}

// Any D: one thread per point, centroids staged through shared memory as fp32
// (the bf16 values the tensor-core path uses), expanded form in fp32.
__global__ void assign_generic_kernel(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G,
                                      int64_t S, int64_t D, int K, int k_eff, int64_t ntiles, int chunk, uint8_t* ids,
                                      int* changed, int it, double stop) {
  extern __shared__ float cf[];
  const int64_t g = blockIdx.x / ntiles, tile = blockIdx.x % ntiles;
  if (!group_active(changed, G, g, it, stop)) return;
  const int64_t t = tile * blockDim.x + threadIdx.x;
  const uint16_t* x = xb + (g * S + (t < S ? t : 0)) * D;
  float best = INFINITY;
  int bi = 0;
  for (int j0 = 0; j0 < k_eff; j0 += chunk) {
    const int nj = min(chunk, k_eff - j0);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < int64_t(nj) * D; i += blockDim.x)
      cf[i] = A::bf16_to_f32(cb[(g * K + j0) * D + i]);
    __syncthreads();
    for (int j = 0; j < nj; ++j) {
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) dot = fmaf(A::bf16_to_f32(x[d]), cf[j * D + d], dot);
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

constexpr int kUpdPoints = 4096;
constexpr int kUpdDims = 32;

// Exponent e with sum over S points of |x| * 2^e < 2^61 for |x| <= maxabs.
__device__ __forceinline__ int fixed_exponent(float maxabs, int64_t S) {
  if (!(maxabs > 0.0f)) return 0;
  int E;
  frexpf(maxabs, &E);  // maxabs < 2^E
  const int sbits = 64 - __clzll((unsigned long long)S);  // S < 2^sbits
  return 61 - E - sbits;
}

__global__ void update_accumulate_kernel(const float* r, const float* mu, const float* maxabs, const uint8_t* ids,
                                         int64_t G, int64_t S, int64_t D, int K, int64_t nchunk, int64_t nslice,
                                         unsigned long long* sums, int* counts, const int* changed, int it,
                                         double stop) {
  extern __shared__ unsigned long long acc[];  // [K][kUpdDims]
  __shared__ int cnt[256];
  const int64_t g = blockIdx.x / (nchunk * nslice), rest = blockIdx.x % (nchunk * nslice);
  const int64_t slice = rest / nchunk, ch = rest % nchunk;
  if (!group_active(changed, G, g, it, stop)) return;
  for (int i = threadIdx.x; i < K * kUpdDims; i += blockDim.x) acc[i] = 0ull;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const double scale = ldexp(1.0, fixed_exponent(maxabs[g], S));
  const int lane = threadIdx.x % kUpdDims, pg = threadIdx.x / kUpdDims, npg = blockDim.x / kUpdDims;
  const int64_t d = slice * kUpdDims + lane;
  const int64_t t0 = ch * kUpdPoints, t1 = min(S, t0 + kUpdPoints);
  for (int64_t t = t0 + pg; t < t1; t += npg) {
    const int id = ids[g * S + t];
    if (d < D) {
      const float x = A::sub_rn(r[(g * S + t) * D + d], mu[g * D + d]);
      const long long v = __double2ll_rn(double(x) * scale);
      atomicAdd(&acc[id * kUpdDims + lane], (unsigned long long)v);
    }
    if (slice == 0 && lane == 0) atomicAdd(&cnt[id], 1);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < K * kUpdDims; i += blockDim.x) {
    const int64_t dd = slice * kUpdDims + i % kUpdDims;
    if (acc[i] != 0ull && dd < D) atomicAdd(sums + (g * K + i / kUpdDims) * D + dd, acc[i]);
  }
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
    const double inv = 1.0 / double(cntv);
    const double sum = double((long long)sums[e]) * ldexp(1.0, -fixed_exponent(maxabs[g], S));
    c[e] = float(sum * inv);
  }
}

// ---- end of a stage ------------------------------------------------------------

__global__ void store_centroids_kernel(const float* c, const float* mu, int64_t D, int K, int k_eff, int dtype,
                                       int64_t n, void* out_c, float* stored) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, gj = e / D;
    const int64_t j = gj % K, g = gj / K;
    const float v = j < k_eff ? A::add_rn(c[e], mu[g * D + d]) : 0.0f;
    const uint32_t bits = A::encode_elem(v, dtype);
    if (dtype == A::kF32)
      static_cast<float*>(out_c)[e] = v;
    else
      static_cast<uint16_t*>(out_c)[e] = uint16_t(bits);
    stored[e] = A::round_trip(v, dtype);
  }
}

__global__ void subtract_kernel(float* r, const float* stored, const uint8_t* ids, int64_t S, int64_t D, int K,
                                int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, gt = e / D;
    const int64_t g = gt / S;
    r[e] = A::sub_rn(r[e], stored[(g * K + ids[gt]) * D + d]);
  }
}

// ---- residual quantization -----------------------------------------------------

__global__ void block_stats_kernel(const float* r, int64_t S, int64_t D, int bs, int qmax, bool asym, int64_t bpg,
                                   float* raw_s, float* raw_z, float* group_max, int64_t G) {
  __shared__ float red[32];
  const int64_t nb = D / bs;
  const int64_t g = blockIdx.x / bpg, i = (blockIdx.x % bpg) * blockDim.x + threadIdx.x;  // i: (t, k) in group
  float ms = 0.0f, mz = 0.0f;
  if (i < S * nb) {
    float z = 0.0f;
    block_stats(r + g * S * D + (i / nb) * D + (i % nb) * bs, bs, qmax, asym, ms, z);
    raw_s[g * S * nb + i] = ms;
    if (asym) {
      raw_z[g * S * nb + i] = z;
      mz = A::abs_f(z);
    }
  }
  ms = block_max(ms, red);
  if (threadIdx.x == 0) atomic_max_nonneg(group_max + g, ms);
  if (asym) {
    __syncthreads();
    mz = block_max(mz, red);
    if (threadIdx.x == 0) atomic_max_nonneg(group_max + G + g, mz);
  }
}

__global__ void pack_kernel(const __grid_constant__ QuantizeArgs a, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    pack_byte(a, e);
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

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>(blocks_for(n), 132 * 32)); }

template <int DIM>
void launch_assign_mma(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int K,
                       int k_eff, uint8_t* ids, int* changed, int it, double stop, cudaStream_t stream) {
  const int kpad = (k_eff + 7) & ~7;
  const size_t smem = size_t(kpad) * (DIM + 8) * 2 + size_t(kpad) * 4;
  static bool configured = false;  // the attribute is per function, set once (max K = 256)
  if (!configured) {
    QVG_CUDA(cudaFuncSetAttribute(assign_mma_kernel<DIM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(256 * (DIM + 8) * 2 + 256 * 4)));
    configured = true;
  }
  const int64_t ntiles = (S + kMmaRows - 1) / kMmaRows;
  assign_mma_kernel<DIM><<<unsigned(G * ntiles), kMmaWarps * 32, smem, stream>>>(xb, cb, cnorm, G, S, K, k_eff, ntiles,
                                                                                ids, changed, it, stop);
  detail::check_launch("assign_mma_kernel");
}

}  // namespace

void gather_points(const void* x, int dtype, int64_t B, int64_t S, int64_t H, int64_t D, float* r,
                   cudaStream_t stream) {
  const int64_t n = B * S * H * D;
  gather_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, dtype, S, H, D, n, r);
  detail::check_launch("gather_kernel");
}

void group_mean(const float* r, int64_t G, int64_t S, int64_t D, double* partial, float* mu, cudaStream_t stream) {
  const int64_t nchunk = (S + kMeanChunk - 1) / kMeanChunk;
  mean_partial_kernel<<<unsigned(G * nchunk), 128, 0, stream>>>(r, S, D, nchunk, partial);
  detail::check_launch("mean_partial_kernel");
  mean_final_kernel<<<unsigned(G), 128, 0, stream>>>(partial, S, D, nchunk, mu);
  detail::check_launch("mean_final_kernel");
}

void center_points(const float* r, const float* mu, int64_t G, int64_t S, int64_t D, uint16_t* xb, float* maxabs,
                   cudaStream_t stream) {
  const int64_t bpg = (S * D + kCenterChunk - 1) / kCenterChunk;
  center_kernel<<<unsigned(G * bpg), kThreads, 0, stream>>>(r, mu, S, D, bpg, xb, maxabs);
  detail::check_launch("center_kernel");
}

void init_indices(int64_t G, int64_t H, int64_t S, int K, int k_eff, uint64_t seed, int stage, int64_t head_offset,
                  uint32_t* perm, uint32_t* idx, cudaStream_t stream) {
  if (k_eff < S) {
    iota_kernel<<<grid_for(G * S), kThreads, 0, stream>>>(perm, S, G * S);
    detail::check_launch("iota_kernel");
  }
  random_indices_kernel<<<blocks_for(G, 64), 64, 0, stream>>>(G, H, S, K, k_eff, seed, stage, head_offset, perm,
                                                                idx);
  detail::check_launch("random_indices_kernel");
}

void init_centroids(const float* r, const float* mu, const uint32_t* idx, int64_t G, int64_t S, int64_t D, int K,
                    int k_eff, float* c, cudaStream_t stream) {
  const int64_t n = G * K * D;
  init_kernel<<<grid_for(n), kThreads, 0, stream>>>(r, mu, idx, S, D, K, k_eff, n, c);
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
  if (D == 128) return launch_assign_mma<128>(xb, cb, cnorm, G, S, K, k_eff, ids, changed, it, stop, stream);
  if (D == 64) return launch_assign_mma<64>(xb, cb, cnorm, G, S, K, k_eff, ids, changed, it, stop, stream);
  const int threads = 128;
  const int chunk = int(std::max<int64_t>(1, std::min<int64_t>(k_eff, 8192 / D)));
  const int64_t ntiles = (S + threads - 1) / threads;
  assign_generic_kernel<<<unsigned(G * ntiles), threads, size_t(chunk) * size_t(D) * 4, stream>>>(
      xb, cb, cnorm, G, S, D, K, k_eff, ntiles, chunk, ids, changed, it, stop);
  detail::check_launch("assign_generic_kernel");
}

void update_centroids(const float* r, const float* mu, const float* maxabs, const uint8_t* ids, int64_t G, int64_t S,
                      int64_t D, int K, long long* sums, int* counts, float* c, const int* changed, int it,
                      double stop, cudaStream_t stream) {
  QVG_CUDA(cudaMemsetAsync(sums, 0, size_t(G * K * D) * sizeof(long long), stream));
  QVG_CUDA(cudaMemsetAsync(counts, 0, size_t(G * K) * sizeof(int), stream));
  const int64_t nchunk = (S + kUpdPoints - 1) / kUpdPoints, nslice = (D + kUpdDims - 1) / kUpdDims;
  const size_t smem = size_t(K) * kUpdDims * sizeof(unsigned long long);
  static bool configured = false;
  if (!configured) {
    QVG_CUDA(cudaFuncSetAttribute(update_accumulate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(256 * kUpdDims * sizeof(unsigned long long))));
    configured = true;
  }
  auto* usums = reinterpret_cast<unsigned long long*>(sums);
  update_accumulate_kernel<<<unsigned(G * nchunk * nslice), kThreads, smem, stream>>>(
      r, mu, maxabs, ids, G, S, D, K, nchunk, nslice, usums, counts, changed, it, stop);
  detail::check_launch("update_accumulate_kernel");
  const int64_t n = G * K * D;
  update_final_kernel<<<grid_for(n), kThreads, 0, stream>>>(usums, counts, maxabs, G, S, D, K, n, c, changed, it,
                                                            stop);
  detail::check_launch("update_final_kernel");
}

void finish_stage(float* r, const float* c, const float* mu, const uint8_t* ids, int64_t G, int64_t S, int64_t D,
                  int K, int k_eff, int dtype, void* out_c, float* stored, cudaStream_t stream) {
  const int64_t nc = G * K * D;
  store_centroids_kernel<<<grid_for(nc), kThreads, 0, stream>>>(c, mu, D, K, k_eff, dtype, nc, out_c, stored);
  detail::check_launch("store_centroids_kernel");
  const int64_t n = G * S * D;
  subtract_kernel<<<grid_for(n), kThreads, 0, stream>>>(r, stored, ids, S, D, K, n);
  detail::check_launch("subtract_kernel");
}

void quantize_residual(const QuantizeArgs& a, cudaStream_t stream) {
  QVG_CUDA(cudaMemsetAsync(a.group_max, 0, size_t(2 * a.G) * sizeof(float), stream));
  const int64_t nb = a.D / a.block;
  const int64_t bpg = (a.S * nb + kThreads - 1) / kThreads;
  const int qmax = qvg::cuda_arith::qmax_of(a.bits, a.asymmetric);
  block_stats_kernel<<<unsigned(a.G * bpg), kThreads, 0, stream>>>(a.r, a.S, a.D, a.block, qmax, a.asymmetric, bpg,
                                                                   a.raw_s, a.raw_z, a.group_max, a.G);
  detail::check_launch("block_stats_kernel");
  const int64_t n = a.G * a.S * a.D * a.bits / 8;
  pack_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, n);
  detail::check_launch("pack_kernel");
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
