// src/kernels/cuda/encode_bodies.cuh — the per-thread bodies of the device
// encoder's kernels that must give fixed bits, as __host__ __device__ functions
// over plain structs: the initial point indices, the group mean, the exact
// fixed-point centroid update, the stored centroids, and the residual quantizer
// (block statistics, stored scales, packing) with the last stage's subtraction
// fused in.
//
// The kernels (encode_kernels.cu) only map blocks and threads onto these.
// tests/gpu/host_arith_test.cpp runs them on the host: the initial indices against
// the CPU codec's (kmeans.cpp), the quantizer over the same grids the kernels use
// against quantize_residual_group, the update's block work against the direct sums;
// tests/gpu/gpu_tests.cpp replays a device
// encoding on the host with the mean and update rules below.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"  // load_as / store_as / Word4 / Word2

namespace qvg::cuda::kernels {

/// log2 of a power of two v >= 1: the shift that divides by it.
QVG_HD int log2_pow2(int64_t v) {
#if defined(__CUDA_ARCH__)
  return __ffsll((long long)v) - 1;
#else
  return __builtin_ctzll((unsigned long long)v);
#endif
}
/// n / d for non-negative n and positive d: a shift when d is a power of two (D / 8
/// and the block sizes, as a rule), else a 32-bit division when both fit (~24
/// instructions on the device, 3 of them on the slow conversion/reciprocal pipe,
/// where a 64-bit one is a subroutine call), else the 64-bit one; the same quotient
/// every way. The quantizer's passes divide flat indices by row and block sizes on
/// every thread.
QVG_HD int64_t idiv(int64_t n, int64_t d) {
  if ((d & (d - 1)) == 0) return n >> log2_pow2(d);
  return ((uint64_t(n) | uint64_t(d)) >> 32) == 0 ? int64_t(uint32_t(n) / uint32_t(d)) : n / d;
}

// ---- a stage's points ------------------------------------------------------------------

/// A stage's points r[g, t, 0..D), g = b * H + h, as the encoder's kernels read them:
/// the encoder's fp32 residual buffer ([G, S, D]: H = 1, dtype f32), or stage 0's
/// input itself (dense [B, S, H, D] of dtype bf16, f16 or f32). Stage 0's points are
/// the input (spec 1.1: r_0 = X) and every input dtype widens to fp32 exactly, so
/// reading the input gives the values its fp32 copy held, without writing the copy.
/// A view: the buffer is the caller's and outlives the kernels that read it.
struct Points {
  const void* p = nullptr;
  int dtype = qvg::cuda_arith::kF32;
  int64_t H = 1;  ///< heads of the layout (1: the residual buffer)
  int64_t S = 0, D = 0;

  /// Element offset of (g, 0, 0); (g, t, d) lies at base(g) + t * stride() + d.
  QVG_HD int64_t base(int64_t g) const {
    if (H == 1) return g * S * D;
    const int64_t b = g < H ? 0 : idiv(g, H);  // batch 1: no division
    return (b * S * H + (g - b * H)) * D;
  }
  /// Elements between two tokens of a group.
  QVG_HD int64_t stride() const { return H * D; }
  /// Element offset of (g, t, 0).
  QVG_HD int64_t row(int64_t g, int64_t t) const { return base(g) + t * stride(); }
  /// The element at offset `off` as fp32 (exact).
  QVG_HD float at(int64_t off) const { return qvg::cuda_arith::load_elem(p, dtype, off); }
  /// The 4 elements at offset `off` (one 16-byte load of fp32, one 8-byte load of
  /// 16-bit elements). REQUIRES off % 4 == 0 and p 16-byte aligned (vector_ok).
  QVG_HD void at4(int64_t off, float (&v)[4]) const;
  /// at4 of offsets off0 and off1 (off1 read only when `both`; v1 zeros otherwise),
  /// both loads issued before either is widened: two loads in flight per thread.
  QVG_HD void at4_pair(int64_t off0, int64_t off1, bool both, float (&v0)[4], float (&v1)[4]) const;
  /// The 8 elements at offset `off` (two 16-byte loads of fp32, one of 16-bit
  /// elements). REQUIRES off % 8 == 0 and p 16-byte aligned.
  QVG_HD void at8(int64_t off, float (&v)[8]) const;
  /// Whether at4 / at8 may be used for rows of D channels: D % n == 0 and p 16-byte
  /// aligned. Host only.
  bool vector_ok(int n) const { return D % n == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0; }
};

/// The input x (dense [B, S, H, D], element type `dtype`) as Points.
inline Points input_points(const void* x, int dtype, int64_t H, int64_t S, int64_t D) {
  Points pts;
  pts.p = x;
  pts.dtype = dtype;
  pts.H = H;
  pts.S = S;
  pts.D = D;
  return pts;
}
/// The fp32 residual buffer r ([G, S, D]) as Points.
inline Points residual_points(const float* r, int64_t S, int64_t D) {
  return input_points(r, qvg::cuda_arith::kF32, 1, S, D);
}

/// The token t and channel d of a group's element e = t * D + d, advanced by a fixed
/// step of elements (one division when made, none per step): the centring kernels'
/// walk over a group's elements.
struct TokenChannel {
  int64_t t, tstep;
  int d, dstep, Dn;
  QVG_HD TokenChannel(int64_t e, int64_t step, int64_t D)
      : t(e / D), tstep(step / D), d(int(e % D)), dstep(int(step % D)), Dn(int(D)) {}
  QVG_HD void advance() {
    t += tstep;
    d += dstep;
    if (d >= Dn) {
      d -= Dn;
      ++t;
    }
  }
};

namespace points_impl {
/// The 16-bit elements of n 32-bit words as fp32 (each word's low one first). One
/// test of the dtype for all of them: a test per element compiled to a branch per
/// element around f16_to_f32 (the quantizer's and centring's loads).
template <int N>
QVG_HD void widen(const uint32_t (&w)[N], int dtype, float* v) {
  namespace A = qvg::cuda_arith;
  if (dtype == A::kBF16) {
    QVG_UNROLL
    for (int i = 0; i < N; ++i) {
      v[2 * i] = A::bf16_to_f32(uint16_t(w[i] & 0xFFFFu));
      v[2 * i + 1] = A::bf16_to_f32(uint16_t(w[i] >> 16));
    }
  } else {
    QVG_UNROLL
    for (int i = 0; i < N; ++i) {
      v[2 * i] = A::f16_to_f32(uint16_t(w[i] & 0xFFFFu));
      v[2 * i + 1] = A::f16_to_f32(uint16_t(w[i] >> 16));
    }
  }
}
}  // namespace points_impl

QVG_HD void Points::at4(int64_t off, float (&v)[4]) const {
  namespace A = qvg::cuda_arith;
  if (dtype == A::kF32) {
    const Word4 w = load_word4(static_cast<const float*>(p) + off);
    QVG_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = A::from_bits(w.v[i]);
    return;
  }
  const Word2 w = load_as<Word2>(static_cast<const uint16_t*>(p) + off);
  points_impl::widen(w.v, dtype, v);
}

QVG_HD void Points::at4_pair(int64_t off0, int64_t off1, bool both, float (&v0)[4], float (&v1)[4]) const {
  namespace A = qvg::cuda_arith;
  if (dtype == A::kF32) {
    const float* f = static_cast<const float*>(p);
    const Word4 w0 = load_word4(f + off0);
    const Word4 w1 = both ? load_word4(f + off1) : Word4{};
    QVG_UNROLL
    for (int i = 0; i < 4; ++i) {
      v0[i] = A::from_bits(w0.v[i]);
      v1[i] = A::from_bits(w1.v[i]);
    }
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(p);
  const Word2 w0 = load_as<Word2>(h + off0);
  const Word2 w1 = both ? load_as<Word2>(h + off1) : Word2{};
  points_impl::widen(w0.v, dtype, v0);
  points_impl::widen(w1.v, dtype, v1);
}

QVG_HD void Points::at8(int64_t off, float (&v)[8]) const {
  namespace A = qvg::cuda_arith;
  if (dtype == A::kF32) {
    const float* f = static_cast<const float*>(p) + off;
    const Word4 w0 = load_word4(f), w1 = load_word4(f + 4);
    QVG_UNROLL
    for (int i = 0; i < 4; ++i) {
      v[i] = A::from_bits(w0.v[i]);
      v[4 + i] = A::from_bits(w1.v[i]);
    }
    return;
  }
  const Word4 w = load_word4(static_cast<const uint16_t*>(p) + off);
  points_impl::widen(w.v, dtype, v);
}

// ---- the assignment's fragments (mma.m16n8k16 bf16; host-tested against a model of
// the PTX ISA's layouts, tests/gpu/host_arith_test.cpp) ----------------------------------

/// Register `reg` (0..3) of lane `lane`'s A fragment at k-step `ks` holds the two bf16
/// values of point row `a_fragment_row(lane, reg)` of the 16-row tile at k =
/// a_fragment_k(lane, ks, reg), +1.
QVG_HD constexpr int a_fragment_row(int lane, int reg) {
  return lane / 4 + 8 * (reg & 1);
}
QVG_HD constexpr int a_fragment_k(int lane, int ks, int reg) {
  return ks * 16 + (lane % 4) * 2 + 8 * (reg >> 1);
}
/// Accumulator `i` (0..3) of lane `lane` is the dot product of tile row
/// c_fragment_row(lane, i) with the n-tile's centroid c_fragment_col(lane, i) (0..7).
QVG_HD constexpr int c_fragment_row(int lane, int i) {
  return lane / 4 + 8 * (i >> 1);
}
QVG_HD constexpr int c_fragment_col(int lane, int i) {
  return (lane % 4) * 2 + (i & 1);
}
/// The row lane `lane` addresses for ldmatrix.m8n8.x4 (b16, no transpose), as an
/// element offset in a [rows][ld] bf16 centroid tile (row = centroid, k contiguous),
/// so that its registers 0..3 are the B fragments of n-tile `nt`: regs 0, 1 of step
/// ks, then regs 0, 1 of step ks + 1. Lane L addresses row L % 8 of matrix L / 8 =
/// centroid nt * 8 + L % 8 at k = ks * 16 + 8 (L / 8). The rows must be 16-byte
/// aligned: ld % 8 == 0 and the tile 16-byte aligned.
QVG_HD constexpr int ldsm_b_offset(int lane, int nt, int ks, int ld) {
  return (nt * 8 + (lane & 7)) * ld + ks * 16 + (lane >> 3) * 8;
}

// ---- initial indices (spec 1.1 init random) -----------------------------------------

/// Slots of the table random_init_indices works in (a power of two >= 2 * 256, so
/// the table is at most half full: K <= 256 insertions).
inline constexpr int kInitTableSlots = 512;
inline constexpr uint32_t kInitEmpty = 0xFFFFFFFFu;

QVG_HD uint32_t init_slot(uint32_t pos) {
  return (pos * 0x9E3779B1u) >> (32 - 9);
}
/// Value at position `pos` of the virtual permutation (pos itself until written).
QVG_HD uint32_t init_get(const uint32_t* keys, const uint32_t* vals, uint32_t pos) {
  for (uint32_t i = init_slot(pos);; i = (i + 1) & (kInitTableSlots - 1)) {
    if (keys[i] == pos) return vals[i];
    if (keys[i] == kInitEmpty) return pos;
  }
}
QVG_HD void init_put(uint32_t* keys, uint32_t* vals, uint32_t pos, uint32_t v) {
  for (uint32_t i = init_slot(pos);; i = (i + 1) & (kInitTableSlots - 1))
    if (keys[i] == pos || keys[i] == kInitEmpty) {
      keys[i] = pos;
      vals[i] = v;
      return;
    }
}

/// The k point indices init random picks for group (b, h) of stage `stage`: the
/// first k entries of the CPU codec's partial Fisher-Yates over 0..S-1
/// (kmeans.cpp), with the same PRNG stream, but on a sparse permutation (a table
/// of the positions the swaps touched) instead of an S-element array: O(k) work
/// and memory. `keys`/`vals`: kInitTableSlots entries each, keys all kInitEmpty
/// on entry. REQUIRES 1 <= k <= 256, k < S < 2^31.
QVG_HD void random_init_indices(uint64_t seed, int stage, int64_t b, int64_t h, int64_t S, int k, uint32_t* keys,
                                uint32_t* vals, uint32_t* idx) {
  qvg::cuda_arith::Rng rng(seed, uint64_t(stage), uint64_t(b), uint64_t(h));
  for (int j = 0; j < k; ++j) {
    const uint32_t r = uint32_t(uint64_t(j) + rng.below(uint64_t(S - j)));
    const uint32_t vr = init_get(keys, vals, r);
    if (r != uint32_t(j)) init_put(keys, vals, r, init_get(keys, vals, uint32_t(j)));  // swap; j is final now
    idx[j] = vr;
  }
}

// ---- group mean ---------------------------------------------------------------------

/// Points per partial sum of the group mean.
inline constexpr int kMeanChunk = 256;

/// The device encoder's group mean of one channel: fp64 sums over chunks of
/// kMeanChunk points in point order (partial[ch * stride], computed that way by the
/// kernels), added in chunk order, divided by S, rounded to fp32.
QVG_HD float mean_of_partials(const double* partial, int64_t nchunk, int64_t stride, int64_t S) {
  double s = 0;
  for (int64_t ch = 0; ch < nchunk; ++ch) s += partial[ch * stride];
  return float(s / double(S));
}

// ---- centring --------------------------------------------------------------------------
//
// k-means runs on the group-centred points in bf16: xb[e] = bf16(r[e] - mu[e % D]) (an
// fp32 subtraction, nearest even), and the group's largest |r[e] - mu[e % D]| (fmaxf:
// a NaN is ignored; 0 for none) sizes the update's fixed point.

inline constexpr int kCenterChunk = 8192;  ///< elements per centring block (one group per block)

/// Whether the centring can go 4 elements at a time (16- or 8-byte loads of the
/// points and 16-byte loads of mu, an 8-byte store of xb): D % 4 == 0 and the buffers
/// aligned for it. Host only.
inline bool center_vec4_ok(const Points& r, const float* mu, const uint16_t* xb) {
  const auto al = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return r.vector_ok(4) && al(mu, 16) && al(xb, 8);
}

/// Thread `tid` of `nthreads` of centring block `blk` (group blk / bpg, elements
/// [e0, e1) of its S * D, e0 = (blk % bpg) * kCenterChunk, element e = t * D + d):
/// centres elements e0 + 4 tid, e0 + 4 (tid + nthreads), ..., 4 at a time, into
/// xb[g * S * D + e], and returns the largest magnitude it saw. Two steps per pass:
/// both loads are issued before either is used (a thread's one 8-byte load in flight
/// left the bandwidth to the number of resident warps).
/// REQUIRES center_vec4_ok (then every 4 elements lie in one row: e and D multiples of 4).
QVG_HD float center_thread_vec4(const Points& r, const float* mu, int64_t bpg, int64_t blk, int tid, int nthreads,
                                uint16_t* xb) {
  namespace A = qvg::cuda_arith;
  const int64_t S = r.S, D = r.D;
  const int64_t g = blk / bpg, ch = blk - g * bpg;
  const int64_t n = S * D, e0 = ch * kCenterChunk, e1 = n < e0 + kCenterChunk ? n : e0 + kCenterChunk;
  const int64_t rbase = r.base(g), rstride = r.stride();
  const float* mg = mu + g * D;
  uint16_t* xg = xb + g * n;
  const int64_t step = 4 * int64_t(nthreads);
  int64_t e = e0 + 4 * int64_t(tid);
  TokenChannel at(e, step, D);
  float m = 0.0f;
  const auto centre = [&](int64_t ee, int d, const float (&rv)[4]) {
    const Word4 mv = load_word4(mg + d);
    uint32_t h[4];
    QVG_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float v = A::sub_rn(rv[i], A::from_bits(mv.v[i]));
      h[i] = A::f32_to_bf16(v);
      m = fmaxf(m, fabsf(v));
    }
    store_as(xg + ee, Word2{{h[0] | (h[1] << 16), h[2] | (h[3] << 16)}});
  };
  for (; e < e1; e += 2 * step) {
    const TokenChannel a0 = at;
    at.advance();
    const TokenChannel a1 = at;
    at.advance();
    const bool second = e + step < e1;
    float r0[4], r1[4];
    r.at4_pair(rbase + a0.t * rstride + a0.d, rbase + a1.t * rstride + a1.d, second, r0, r1);
    centre(e, a0.d, r0);
    if (second) centre(e + step, a1.d, r1);
  }
  return m;
}

// ---- exact centroid update ------------------------------------------------------------

/// Exponent e with sum over S points of |x| * 2^e < 2^61 for |x| <= maxabs (0 when
/// maxabs is 0): centred values are summed as round(x * 2^e) in 64-bit integers, so
/// sums do not depend on the order the device adds them in.
QVG_HD int fixed_exponent(float maxabs, int64_t S) {
  if (!(maxabs > 0.0f)) return 0;
  int E = 0;
#if defined(__CUDA_ARCH__)
  frexpf(maxabs, &E);                            // maxabs < 2^E
  const int sbits = 64 - __clzll((long long)S);  // S < 2^sbits
#else
  std::frexp(maxabs, &E);
  const int sbits = 64 - __builtin_clzll((unsigned long long)S);
#endif
  return 61 - E - sbits;
}
/// round_half_even(x * 2^e) (|x| * 2^e < 2^62), in integer operations on x's bits:
/// its 24-bit significand shifted by its exponent plus e, the bits shifted out
/// rounded to nearest even — the value of the exact product x * 2^e rounded, as
/// nearbyint(double(x) * 2^e) gives it. The rule as the host replay of the device
/// encoder (tests/gpu/encode_replay.h) and the host tests compute it; the kernels take
/// the same integer from to_fixed_scaled, below (fewer instructions).
QVG_HD long long to_fixed(float x, int e) {
  const uint32_t u = qvg::cuda_arith::bits_of(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const int ex = int(a >> 23);
  const uint32_t m = (a & 0x7FFFFFu) | (ex != 0 ? 0x800000u : 0u);  // x = m * 2^(max(ex, 1) - 150)
  const int sh = (ex != 0 ? ex : 1) - 150 + e;
  unsigned long long r;
  if (sh >= 0) {
    r = (unsigned long long)m << sh;
  } else {
    // m / 2^k rounded half to even: (m + 2^(k-1) - 1 + lsb(m >> k)) >> k; a k >= 25
    // gives 0 as k = 25 does (m < 2^24: m * 2^-k < 1/2).
    const int k = -sh < 25 ? -sh : 25;
    r = (m + (1u << (k - 1)) - 1u + ((m >> k) & 1u)) >> k;
  }
  return (u >> 31) ? -(long long)r : (long long)r;
}
/// The two power-of-two factors of 2^e for to_fixed_scaled: 2^(e/2) and 2^(e - e/2),
/// each a normal float. REQUIRES -252 <= e <= 254 (fixed_exponent gives -99..208).
struct FixedScale {
  float a = 1.0f, b = 1.0f;
};
QVG_HD FixedScale fixed_scale(int e) {
  const int e1 = e / 2, e2 = e - e1;
  return {qvg::cuda_arith::from_bits(uint32_t(127 + e1) << 23), qvg::cuda_arith::from_bits(uint32_t(127 + e2) << 23)};
}
/// to_fixed(x, e) from f = fixed_scale(e): x * 2^e in two multiplies by powers of two,
/// exact but where a product falls below 2^-126 (then so does x * 2^e, whose rounding
/// is 0 either way), and one conversion rounding to nearest even (cvt.rni.s64.f32:
/// one F2I.S64, on the conversion pipe at 16 per clock and SM: ~29 us for the LongCat
/// tensor's 121 M elements on an H200, where to_fixed's integer path issues ~18
/// instructions more per element, ~70 us). The same integer as to_fixed for every
/// finite x with |x| * 2^e < 2^62 (tests/gpu/host_arith_test.cpp).
QVG_HD long long to_fixed_scaled(float x, FixedScale f) {
  namespace A = qvg::cuda_arith;
  const float p = A::mul_rn(A::mul_rn(x, f.a), f.b);
#if defined(__CUDA_ARCH__)
  return __float2ll_rn(p);
#else
  return std::llrint(p);
#endif
}
/// The centroid (centred coordinates) of a cluster of `cnt` >= 1 points whose
/// fixed-point sum (exponent e) is `sum`.
QVG_HD float centroid_from_fixed(long long sum, int cnt, int e) {
  const double inv = 1.0 / double(cnt);
#if defined(__CUDA_ARCH__)
  const double s = double(sum) * ldexp(1.0, -e);
#else
  const double s = double(sum) * std::ldexp(1.0, -e);
#endif
  return float(s * inv);
}

// ---- the update's block work (update_accumulate_kernel) -------------------------------
//
// A block takes kUpdPoints consecutive points of one group and kUpdLanes channels, one
// per lane. It sorts the points by cluster id (a counting sort in shared memory: the
// histogram, its exclusive scan, a scatter whose order within a cluster is any),
// splits the sorted positions evenly among its warps (update_warp_range), and each
// lane adds its channel's fixed-point values over each run of equal ids in a 64-bit
// register (update_run_sums), handing a run's sum to one 64-bit global atomic. No
// shared atomic per element (the kernel before this took three), no fp64. Integer
// sums modulo 2^64 do not depend on the order they are added in: the sums are the
// bits one sum of the points in index order gives.

inline constexpr int kUpdPoints = 4096;  ///< points per block (a key's index field has 16 bits)
inline constexpr int kUpdLanes = 32;     ///< channels per block: one per lane
inline constexpr int kUpdRows = 8;       ///< sorted rows a lane loads before it adds them
static_assert(kUpdPoints <= 65536, "a key holds the point's index in 16 bits");

/// A point's sort key: its cluster id (< 256) above its index in the block's chunk.
QVG_HD uint32_t update_key(int id, int i) { return (uint32_t(id) << 16) | uint32_t(i); }

/// Warp w's share [*p0, *p1) of n sorted positions among nwarp warps (sizes differ by
/// at most one; together they cover [0, n) once).
QVG_HD void update_warp_range(int n, int w, int nwarp, int* p0, int* p1) {
  *p0 = int(int64_t(n) * w / nwarp);
  *p1 = int(int64_t(n) * (w + 1) / nwarp);
}

/// One lane's work in update_accumulate_kernel. keys[p0, p1): a warp's share of the
/// block's sorted keys (ids nondecreasing). For each run of equal ids, the sum modulo
/// 2^64 of to_fixed(r - m, fe) (computed as to_fixed_scaled) over the run's points,
/// in channel offset `rd` (r.base(g) + d) of token t0 + the key's index, goes to
/// flush(id, sum) once, when it is not 0 and `in_d`. A lane past D (in_d false) passes
/// a valid channel's rd and flushes nothing. Loads kUpdRows rows before it adds them (several loads in flight,
/// no test between them; the element type DT == r.dtype a template argument, so that
/// no load waits on a branch on it).
template <int DT, class Flush>
QVG_HD void update_run_sums(const Points& r, int64_t rd, int64_t t0, const uint32_t* keys, int p0, int p1, bool in_d,
                            float m, int fe, Flush&& flush) {
  namespace A = qvg::cuda_arith;
  const int64_t stride = r.stride();
  const int64_t elem = DT == A::kF32 ? 4 : 2;
  const void* base = static_cast<const char*>(r.p) + (rd + t0 * stride) * elem;  // token t0 of the channel
  const auto load = [&](uint32_t k) { return A::load_elem(base, DT, int64_t(k & 0xFFFFu) * stride); };
  const FixedScale fs = fixed_scale(fe);
  int cur = -1;
  unsigned long long acc = 0;
  const auto add = [&](uint32_t k, float x) {
    const int id = int(k >> 16);
    if (id != cur) {
      if (acc != 0ull && in_d) flush(cur, acc);
      cur = id;
      acc = 0ull;
    }
    acc += (unsigned long long)to_fixed_scaled(A::sub_rn(x, m), fs);
  };
  int p = p0;
  for (; p + kUpdRows <= p1; p += kUpdRows) {
    uint32_t k[kUpdRows];
    float x[kUpdRows];
    QVG_UNROLL
    for (int u = 0; u < kUpdRows; ++u) k[u] = keys[p + u];
    QVG_UNROLL
    for (int u = 0; u < kUpdRows; ++u) x[u] = load(k[u]);  // the loads first
    QVG_UNROLL
    for (int u = 0; u < kUpdRows; ++u) add(k[u], x[u]);
  }
  for (; p < p1; ++p) add(keys[p], load(keys[p]));
  if (acc != 0ull && in_d) flush(cur, acc);
}

/// The stored value of centroid element c (centred) of a group with mean mu: c + mu
/// (one rounded add) rounded to the storage dtype t; its bits in *out_bits.
QVG_HD float stored_centroid(float c, float mu, int t, uint32_t* out_bits) {
  namespace A = qvg::cuda_arith;
  const float v = A::add_rn(c, mu);
  *out_bits = A::encode_elem(v, t);
  return A::round_trip(v, t);
}

// ---- residual quantizer (spec 1.2, 1.4) ------------------------------------------------

/// Arguments of the residual quantizer kernels (device pointers).
struct QuantizeArgs {
  /// The last stage's points r_{stages-1} when `stored` is set (the final residual is
  /// then r - stored[ids], computed where it is used and never written), else the
  /// final residual itself: the fp32 residual buffer, or the input (one stage).
  Points r;
  const float* stored = nullptr;  ///< [G, K, D] last stage's stored centroids (fp32 values), or null
  const uint8_t* ids = nullptr;   ///< [G, S] last stage's ids (with `stored`)
  int64_t G = 0, S = 0, D = 0;
  int K = 0;
  int bits = 4, block = 64;
  bool asymmetric = false, fp8 = true, two_level = true;
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  uint8_t* zeros = nullptr;
  float* scale_factor = nullptr;  ///< [G], two_level only
  float* zero_factor = nullptr;   ///< [G], two_level and asymmetric only
  /// Scratch, G * S * D/block: the raw block scale (after quantize_stats), then the
  /// effective one s_eff (after quantize_scales).
  float* raw_s = nullptr;
  float* raw_z = nullptr;      ///< as raw_s for zeros, asymmetric only
  float* group_max = nullptr;  ///< scratch: 2 * G (largest raw scale, then largest |zero|), zeroed first
};

/// Whether the quantizer runs the vectorised bodies: a thread per 8 channels, a
/// block of bs channels on a power-of-two segment of bs/8 <= 32 lanes of a warp.
QVG_HD bool quantize_vectorizable(int64_t D, int bs) {
  const int w = bs / 8;
  return D % 8 == 0 && bs % 8 == 0 && w >= 1 && w <= 32 && (w & (w - 1)) == 0;
}

/// Element d of the final residual of row `row` (= g * S + t).
QVG_HD float residual_at(const QuantizeArgs& a, int64_t row, int64_t d) {
  const int64_t g = idiv(row, a.S);  // once, for the points' row and the centroid's
  const float x = a.r.at(a.r.row(g, row - g * a.S) + d);
  if (a.stored == nullptr) return x;
  return qvg::cuda_arith::sub_rn(x, a.stored[(g * a.K + a.ids[row]) * a.D + d]);
}
/// Channels [8c, 8c + 8) of the final residual of token t of group g (Points::at8 of
/// r, two 128-bit loads of the stored centroid row). REQUIRES D % 8 == 0 and
/// a.r.vector_ok(8).
QVG_HD void residual8(const QuantizeArgs& a, int64_t g, int64_t t, int64_t c, float (&v)[8]) {
  namespace A = qvg::cuda_arith;
  a.r.at8(a.r.row(g, t) + c * 8, v);
  if (a.stored == nullptr) return;
  const float* s = a.stored + (g * a.K + a.ids[g * a.S + t]) * a.D + c * 8;
  const Word4 s0 = load_word4(s), s1 = load_word4(s + 4);
  QVG_UNROLL
  for (int i = 0; i < 4; ++i) {
    v[i] = A::sub_rn(v[i], A::from_bits(s0.v[i]));
    v[4 + i] = A::sub_rn(v[4 + i], A::from_bits(s1.v[i]));
  }
}

/// Statistics of a run of consecutive channels of a block: symmetric, hi = max |x|
/// (lo unused, 0); asymmetric, lo = min x and hi = max x. A run's value is that of
/// the CPU's sequential scan (kernels::ref::block_minmax / block_absmax): on ties
/// the earlier element is kept, which matters for the sign of a zero minimum.
struct RunStats {
  float lo = 0.0f, hi = 0.0f;
};
/// The statistics of the single element v.
QVG_HD RunStats run_first(float v, bool asym) {
  RunStats s;
  if (asym) {
    s.lo = v;
    s.hi = v;
  } else {
    s.hi = qvg::cuda_arith::max_f(0.0f, qvg::cuda_arith::abs_f(v));
  }
  return s;
}
/// Appends element v (after the run).
QVG_HD void run_add(RunStats& s, float v, bool asym) {
  namespace A = qvg::cuda_arith;
  if (asym) {
    s.lo = A::min_f(s.lo, v);
    s.hi = A::max_f(s.hi, v);
  } else {
    s.hi = A::max_f(s.hi, A::abs_f(v));
  }
}
/// Appends the run `later` (the channels right after s's): min_f / max_f keep
/// their first operand on ties, so a tree of merges gives the sequential scan's
/// value only if every merge appends the run that directly follows (a -0 and a +0
/// tie: the earlier channel's sign must win). segment_merge_offset gives such a tree.
QVG_HD void run_merge(RunStats& s, const RunStats& later, bool asym) {
  namespace A = qvg::cuda_arith;
  if (asym) s.lo = A::min_f(s.lo, later.lo);
  s.hi = A::max_f(s.hi, later.hi);
}
/// The shuffle offset of step `step` of the vectorised statistics' segment merge
/// (quantize_stats_vec_kernel, and its host emulation in tests/gpu/host_arith_test):
/// 1, 2, 4, ... while below the segment's width. Lane l takes the run of lane l + o
/// (shfl_down), so after the step of o, lane l with l % 2o == 0 holds lanes
/// l .. l + 2o - 1 merged in channel order. (Halving offsets, width/2 first, merge
/// lanes 0, 4, 2, 6, 1, 5, 3, 7: a -0/+0 tie then keeps the wrong sign, and the
/// encoding's bits are no longer the CPU codec's.)
QVG_HD constexpr int segment_merge_offset(int step) {
  return 1 << step;
}
/// The statistics of 8 consecutive channels.
QVG_HD RunStats run_stats8(const float (&v)[8], bool asym) {
  RunStats s = run_first(v[0], asym);
  QVG_UNROLL
  for (int i = 1; i < 8; ++i) run_add(s, v[i], asym);
  return s;
}
/// The raw scale (and raw zero, the block minimum) of a whole block's statistics,
/// as quantize_residual_group computes them.
QVG_HD void block_raw(const RunStats& s, int qmax, bool asym, float& raw_s, float& raw_z) {
  namespace A = qvg::cuda_arith;
  if (asym) {
    raw_s = A::raw_scale_asym(s.lo, s.hi, qmax);
    raw_z = s.lo;
  } else {
    raw_s = A::raw_scale_sym(s.hi, qmax);
    raw_z = 0.0f;
  }
}
/// The statistics of block k of row `row`, scanned in order (the per-block path,
/// any block size).
QVG_HD RunStats block_stats_scan(const QuantizeArgs& a, int64_t row, int64_t k) {
  const int64_t d0 = k * a.block;
  RunStats s = run_first(residual_at(a, row, d0), a.asymmetric);
  for (int64_t d = d0 + 1; d < d0 + a.block; ++d) run_add(s, residual_at(a, row, d), a.asymmetric);
  return s;
}

/// Thread `w` (word w = t * D/8 + c of group g) of the vectorised statistics pass,
/// before the segment merge: the run statistics of its 8 channels of the final
/// residual (lanes past the group, w >= S * D/8, give zeros and write nothing).
/// REQUIRES quantize_vectorizable.
QVG_HD RunStats stats_lane(const QuantizeArgs& a, int64_t g, int64_t w) {
  const int64_t cpr = a.D / 8;
  if (w >= a.S * cpr) return RunStats{};
  float v[8];
  const int64_t t = idiv(w, cpr);
  residual8(a, g, t, w - t * cpr, v);
  return run_stats8(v, a.asymmetric);
}
/// The same thread after the merge of its segment of bs/8 lanes (s = the merged
/// statistics, complete in the segment's first lane): the first lane writes its
/// block's raw scale (and zero) and gives them in ms (mz = |zero|) for the group
/// maxima; every other lane gives 0.
QVG_HD void stats_leader(const QuantizeArgs& a, int64_t g, int64_t w, const RunStats& s, float& ms, float& mz) {
  const int64_t cpr = a.D / 8, width = a.block / 8;
  ms = 0.0f;
  mz = 0.0f;
  if (w >= a.S * cpr || (w & (width - 1)) != 0) return;  // block and width: powers of two
  const int64_t t = idiv(w, cpr), row = g * a.S + t, c = w - t * cpr;
  const int sh = log2_pow2(a.block);
  const int64_t si = row * (a.D >> sh) + ((c * 8) >> sh);
  float rs = 0.0f, rz = 0.0f;
  block_raw(s, qvg::cuda_arith::qmax_of(a.bits, a.asymmetric), a.asymmetric, rs, rz);
  a.raw_s[si] = rs;
  ms = rs;
  if (a.asymmetric) {
    a.raw_z[si] = rz;
    mz = qvg::cuda_arith::abs_f(rz);
  }
}
/// Thread `i` (block i = t * D/block + k of group g) of the per-block statistics
/// pass (any block size): scans the block in order, writes its raw scale (and zero)
/// and gives them in ms/mz for the group maxima (0 past the group).
QVG_HD void stats_scan(const QuantizeArgs& a, int64_t g, int64_t i, float& ms, float& mz) {
  const int64_t nb = a.D / a.block;
  ms = 0.0f;
  mz = 0.0f;
  if (i >= a.S * nb) return;
  float rs = 0.0f, rz = 0.0f;
  block_raw(block_stats_scan(a, g * a.S + i / nb, i % nb), qvg::cuda_arith::qmax_of(a.bits, a.asymmetric), a.asymmetric,
            rs, rz);
  const int64_t si = g * a.S * nb + i;
  a.raw_s[si] = rs;
  ms = rs;
  if (a.asymmetric) {
    a.raw_z[si] = rz;
    mz = qvg::cuda_arith::abs_f(rz);
  }
}

/// Block `si` (= row * D/block + k) of the stored-scale pass: converts the raw scale
/// (and zero) with the group's two-level factor, writes the stored bytes, replaces
/// raw_s[si] (raw_z[si]) by the effective value s_eff (z_eff) the codes use, and
/// for the group's first block writes the group's factors. REQUIRES group_max
/// complete (every block's statistics done).
QVG_HD void scale_block(const QuantizeArgs& a, int64_t si) {
  namespace A = qvg::cuda_arith;
  const int64_t nb = idiv(a.D, a.block), g = idiv(si, a.S * nb);
  const bool asym = a.asymmetric, fp8 = a.fp8, divide = a.two_level && a.fp8;
  const float gf = divide ? A::two_level_factor(a.group_max[g]) : 1.0f;
  const uint32_t s_st = A::store_format(A::to_store(a.raw_s[si], divide, gf), fp8);
  A::put_stored(a.scales, fp8, si, s_st);
  a.raw_s[si] = A::effective(A::format_value(s_st, fp8), gf);
  float gz = 1.0f;
  if (asym) {
    gz = divide ? A::two_level_factor(a.group_max[a.G + g]) : 1.0f;
    const uint32_t z_st = A::store_format(A::to_store(a.raw_z[si], divide, gz), fp8);
    A::put_stored(a.zeros, fp8, si, z_st);
    a.raw_z[si] = A::effective(A::format_value(z_st, fp8), gz);
  }
  if (a.two_level && si == g * a.S * nb) {
    a.scale_factor[g] = gf;
    if (asym) a.zero_factor[g] = gz;
  }
}

/// The code word (bodies.cuh: the codes of 8 channels, spec 1.5 order) of 8
/// consecutive channels v of one block with effective scale s_eff (and zero z_eff),
/// codes of width W (qmax = qmax_of<W>(asym)): code i at bit code_word_shift<W>(i).
template <class W>
QVG_HD uint32_t pack8(const float (&v)[8], int qmax, bool asym, float s_eff, float z_eff) {
  namespace A = qvg::cuda_arith;
  const float inv = A::code_reciprocal(s_eff);  // one division for the 8 codes (quantize_code_recip: the same codes)
  uint32_t w = 0;
  if (inv != 0.0f) {  // tested once, not per code
    QVG_UNROLL
    for (int i = 0; i < 8; ++i)
      w |= uint32_t(A::quantize_code_recip(v[i], qmax, asym, s_eff, z_eff, inv)) << code_word_shift<W>(i);
  } else {
    QVG_UNROLL
    for (int i = 0; i < 8; ++i)
      w |= uint32_t(A::quantize_code(v[i], qmax, asym, s_eff, z_eff)) << code_word_shift<W>(i);
  }
  return w;
}
/// Word w (= row * D/8 + c) of the vectorised pack pass: 8 channels of one block
/// into the kCodeWordBytes<W> bytes of their codes (a.bits == W::kBits).
/// REQUIRES quantize_vectorizable, scale_block done.
template <class W>
QVG_HD void pack_word(const QuantizeArgs& a, int64_t w) {
  const int64_t cpr = a.D / 8, row = idiv(w, cpr), c = w - row * cpr, g = idiv(row, a.S);
  float v[8];
  residual8(a, g, row - g * a.S, c, v);
  const int sh = log2_pow2(a.block);  // a power of two (quantize_vectorizable)
  const int64_t si = row * (a.D >> sh) + ((c * 8) >> sh);
  const bool asym = a.asymmetric;
  // qmax from the argument's width (== W's), not the constant qmax_of<W>: pack_vec_kernel
  // then takes 34 registers, with the constant 48 (nvcc 13, sm_90a; 40 with the former run-time-width pack8).
  const int qmax = qvg::cuda_arith::qmax_of(a.bits, asym);
  const uint32_t word = pack8<W>(v, qmax, asym, a.raw_s[si], asym ? a.raw_z[si] : 0.0f);
  store_code_word<W>(a.codes + row * (cpr * kCodeWordBytes<W>)+c * kCodeWordBytes<W>, word);
}
/// Group e (flat index over the rows' groups of W::kGroupCodes channels) of the
/// per-group pack pass (any block size): the group's codes into its
/// W::kGroupBytes bytes (int2/int4: one byte). REQUIRES block % W::kGroupCodes == 0
/// (the codec's rule: a group never spans two blocks), scale_block done.
template <class W>
QVG_HD void pack_group_at(const QuantizeArgs& a, int64_t e) {
  namespace A = qvg::cuda_arith;
  constexpr int G = W::kGroupCodes;
  const int64_t gpr = a.D / G, row = idiv(e, gpr), j = e - row * gpr;
  const int64_t d0 = j * G, si = row * idiv(a.D, a.block) + idiv(d0, a.block);
  const bool asym = a.asymmetric;
  const int qmax = A::qmax_of<W>(asym);
  const float s_eff = a.raw_s[si], z_eff = asym ? a.raw_z[si] : 0.0f, inv = A::code_reciprocal(s_eff);
  int q[G];
  for (int u = 0; u < G; ++u) q[u] = A::quantize_code_recip(residual_at(a, row, d0 + u), qmax, asym, s_eff, z_eff, inv);
  qvg::pack_group<W>(q, a.codes + row * (gpr * W::kGroupBytes) + j * W::kGroupBytes);
}
/// Groups of codes of a's residual (the per-group pack pass's threads).
template <class W>
QVG_HD int64_t code_groups(const QuantizeArgs& a) {
  return a.G * a.S * (a.D / W::kGroupCodes);
}

}  // namespace qvg::cuda::kernels
