// src/kernels/cuda/span_bodies.cuh — the per-thread bodies of the kernels of
// src/kernels/cuda/span_kernels.cu: the scale search (ScaleSearch::Mse),
// the incremental spans' codebook steps (warm start, new centroids stored into a
// span's codebook, the span's centroids centred for the assignment, the stored
// centroids' subtraction), the refinement layers (the error to encode, the layer
// added to a decoded range) and the residual energy. __host__ __device__ functions
// over plain structs, as encode_bodies.cuh: tests/gpu/host_arith_test.cpp runs them
// on the host against the CPU codec.
#pragma once

#include <cstdint>

#include "core/exact_sum_impl.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"
#include "kernels/cuda/encode_bodies.cuh"

namespace qvg::cuda::kernels {

// ---- scale search (the CPU encoder's rule, src/core/residual_impl.h) ---------------

/// The final residual of block k of row `row`, element i (the accessor of
/// residual_impl::block_sq_error_at).
struct BlockResidual {
  const QuantizeArgs* a;
  int64_t row, d0;
  QVG_HD float operator()(int64_t i) const { return residual_at(*a, row, d0 + i); }
};

/// Block si (= row * D/block + k) of the scale search, run after quantize_residual
/// (which wrote the `off` choice and the group's factors): the block's statistics
/// rescanned in channel order (block_stats_scan, the CPU's sequential scan), the
/// candidates of residual_impl::scale_search_candidates with the group's factors,
/// each one's squared error (block_sq_error_at: the CPU's rule), the first least
/// one's stored scale (and zero), and the block's codes packed again with it. The
/// same bytes as quantize_residual_group(..., ScaleSearch::Mse). W: the codes' row of
/// qvg/code_format.h (a.bits == W::kBits). REQUIRES block % W::kGroupCodes == 0 (the
/// codec's block sizes: the block's codes are whole groups).
template <class W>
QVG_HD void search_block(const QuantizeArgs& a, int64_t si) {
  namespace A = qvg::cuda_arith;
  const int64_t nb = idiv(a.D, a.block), row = idiv(si, nb), k = si - row * nb, g = idiv(row, a.S);
  const bool asym = a.asymmetric, fp8 = a.fp8, divide = a.two_level && a.fp8;
  const int qmax = A::qmax_of<W>(asym);
  const RunStats st = block_stats_scan(a, row, k);
  float raw_s = 0.0f, raw_z = 0.0f;
  block_raw(st, qmax, asym, raw_s, raw_z);
  const float gf = divide ? a.scale_factor[g] : 1.0f;
  const float gz = divide && asym ? a.zero_factor[g] : 1.0f;
  A::ScaleCandidates c;
  A::scale_search_candidates(raw_s, asym ? st.lo : 0.0f, asym ? st.hi : 0.0f, asym, divide, gf, gz, fp8, c);
  const BlockResidual x{&a, row, k * a.block};
  float err[A::kScaleSearchSteps];
  for (int j = 0; j < c.m; ++j) err[j] = A::block_sq_error_at(x, a.block, qmax, asym, c.s_eff[j], c.z_eff[j]);
  const int best = A::scale_search_best(err, c.m);
  A::put_stored(a.scales, fp8, si, c.s_bits[best]);
  if (asym) A::put_stored(a.zeros, fp8, si, c.z_bits[best]);
  const float s_eff = c.s_eff[best], z_eff = c.z_eff[best];
  constexpr int G = W::kGroupCodes;
  uint8_t* out = a.codes + row * (a.D / G * W::kGroupBytes) + k * (a.block / G * W::kGroupBytes);
  for (int64_t j = 0; j < a.block / G; ++j) {
    int q[G];
    for (int u = 0; u < G; ++u) q[u] = A::quantize_code(x(j * G + u), qmax, asym, s_eff, z_eff);
    qvg::pack_group<W>(q, out + j * W::kGroupBytes);
  }
}

// ---- the scale search, a half-warp per block (search_half_kernel) ----------------
// search_block evaluates a block's up to 15 candidates one after another on one
// thread, reading every element from global memory again per candidate (3 loads per
// element and candidate, the 32 lanes of a warp on 32 different rows). Here 16 lanes
// share a block: they stage its final residual in shared memory once (search_stage),
// merge the statistics of their runs of it (search_run; search_scan where the block
// is not a multiple of 16 channels), lane l evaluates candidate min(l, 14) from there
// (search_lane: the candidate, its error with one reciprocal instead of a division
// per element), the 16 (error, lane) keys are reduced by search_min, and
// the lanes pack the block's groups with the chosen candidate (search_pack). Same
// bytes as search_block: candidates whose stored bits repeat the previous one's
// (which scale_search_candidates skips) have the same error and a larger index, so
// the first least error over all 15 is scale_search_best's choice over the distinct
// ones; lane 15 repeats candidate 14 with index 15 and never wins.

/// Lanes sharing one block of the scale search (a half-warp).
inline constexpr int kSearchLanes = 16;
static_assert(qvg::cuda_arith::kScaleSearchSteps <= kSearchLanes, "a lane per candidate (spare lanes repeat the last)");

/// Lane l's share of block si's final residual (channels l, l + 16, ... of
/// residual_at) into buf[0, a.block).
QVG_HD void search_stage(const QuantizeArgs& a, int64_t si, int l, float* buf) {
  const int64_t nb = idiv(a.D, a.block), row = idiv(si, nb), d0 = (si - row * nb) * a.block;
  for (int64_t i = l; i < a.block; i += kSearchLanes) buf[i] = residual_at(a, row, d0 + i);
}

/// A lane's candidate in the reduction: its error and its index.
struct SearchKey {
  float err = 0.0f;
  int k = 0;
};
/// The preferred of two keys, a total order (so that every lane of a butterfly
/// reduction ends with the same key): a number before NaN, then the smaller error,
/// then the smaller index. scale_search_best's choice is the least key when
/// candidate 0's error is a number (search_choice covers the other case).
QVG_HD SearchKey search_min(const SearchKey& a, const SearchKey& b) {
  const bool an = a.err != a.err, bn = b.err != b.err;
  if (an != bn) return an ? b : a;
  if (!an && b.err != a.err) return b.err < a.err ? b : a;
  return b.k < a.k ? b : a;
}
/// scale_search_best's index from the least key and candidate 0's error: 0 when
/// that error is NaN (nothing compares below it), else the least key's.
QVG_HD int search_choice(const SearchKey& least, float err0) {
  return err0 != err0 ? 0 : least.k;
}

/// The statistics of the block in buf[0, block), scanned in channel order
/// (block_stats_scan's values; any block size).
QVG_HD RunStats search_scan(const float* buf, int64_t block, bool asym) {
  RunStats st = run_first(buf[0], asym);
  for (int64_t i = 1; i < block; ++i) run_add(st, buf[i], asym);
  return st;
}
/// Lane l's run for the statistics' merge: channels [l * c, l * c + c) of buf, c =
/// block / 16. The kernel merges the 16 runs as the quantizer's statistics merge
/// theirs (merge_segment_runs, launch_util.cuh: shfl_down over segment_merge_offset's
/// 1, 2, 4, 8, the tree that keeps the sequential scan's value, -0/+0 ties included),
/// lane 0 then holding search_scan's value. REQUIRES block % 16 == 0.
QVG_HD RunStats search_run(const float* buf, int64_t block, int l, bool asym) {
  const int64_t c = block / kSearchLanes;
  return search_scan(buf + l * c, c, asym);
}

/// Lane l (< 16) of block si's search, buf holding the block's final residual
/// (search_stage) and st its statistics (search_scan's value): candidate min(l, 14)
/// of scale_search_candidate into c, and its key (its error by
/// block_sq_error_recip_at, the index l).
template <class W>
QVG_HD SearchKey search_lane(const QuantizeArgs& a, int64_t si, const float* buf, int l, const RunStats& st,
                             qvg::cuda_arith::ScaleCandidate& c) {
  namespace A = qvg::cuda_arith;
  const int64_t nb = idiv(a.D, a.block), g = idiv(idiv(si, nb), a.S);
  const bool asym = a.asymmetric, fp8 = a.fp8, divide = a.two_level && a.fp8;
  const int qmax = A::qmax_of<W>(asym);
  float raw_s = 0.0f, raw_z = 0.0f;
  block_raw(st, qmax, asym, raw_s, raw_z);
  const float gf = divide ? a.scale_factor[g] : 1.0f;
  const float gz = divide && asym ? a.zero_factor[g] : 1.0f;
  const int k = l < A::kScaleSearchSteps ? l : A::kScaleSearchSteps - 1;
  c = A::scale_search_candidate(raw_s, asym ? st.lo : 0.0f, asym ? st.hi : 0.0f, asym, divide, gf, gz, fp8, k);
  return SearchKey{A::block_sq_error_recip_at(A::ArrayAt{buf}, a.block, qmax, asym, c.s_eff, c.z_eff), l};
}

/// Lane l's part of writing block si with the chosen candidate (stored bits s_bits,
/// z_bits; effective s_eff, z_eff): lane 0 the stored scale (and zero), lane l the
/// block's groups of codes l, l + 16, ... from buf (quantize_code's codes).
template <class W>
QVG_HD void search_pack(const QuantizeArgs& a, int64_t si, const float* buf, int l, uint32_t s_bits, uint32_t z_bits,
                        float s_eff, float z_eff) {
  namespace A = qvg::cuda_arith;
  const bool asym = a.asymmetric;
  if (l == 0) {
    A::put_stored(a.scales, a.fp8, si, s_bits);
    if (asym) A::put_stored(a.zeros, a.fp8, si, z_bits);
  }
  constexpr int G = W::kGroupCodes;
  const int qmax = A::qmax_of<W>(asym);
  const float inv = A::code_reciprocal(s_eff);
  const int64_t nb = idiv(a.D, a.block), row = idiv(si, nb), k = si - row * nb;
  uint8_t* out = a.codes + row * (a.D / G * W::kGroupBytes) + k * (a.block / G * W::kGroupBytes);
  for (int64_t j = l; j < a.block / G; j += kSearchLanes) {
    int q[G];
    for (int u = 0; u < G; ++u) q[u] = A::quantize_code_recip(buf[j * G + u], qmax, asym, s_eff, z_eff, inv);
    qvg::pack_group<W>(q, out + j * W::kGroupBytes);
  }
}

// ---- incremental spans ----------------------------------------------------------

/// Element e (= (g * k + j) * D + d, j < k) of the initial centred centroids of a
/// warm start from slots [first, first + k) of a codebook of K slots in dtype t:
/// warm - mu (one rounded subtraction, as kmeans.cpp's warm init).
QVG_HD float warm_centroid(const void* warm, int t, int64_t K, int64_t first, int64_t k, int64_t D, const float* mu,
                           int64_t e) {
  namespace A = qvg::cuda_arith;
  const int64_t d = e % D, gj = e / D, j = gj % k, g = gj / k;
  return A::sub_rn(A::load_elem(warm, t, (g * K + first + j) * D + d), mu[g * D + d]);
}

/// Element e (= (g * k + j) * D + d) of k new centroids (centred c, group mean mu)
/// stored into slot first + j of a codebook of K slots in dtype t (as finish_stage
/// stores an encoding's: (c + mu) rounded to t).
QVG_HD void store_new_centroid(const float* c, const float* mu, int t, int64_t K, int64_t first, int64_t k, int64_t D,
                               void* book, int64_t e) {
  const int64_t d = e % D, gj = e / D, j = gj % k, g = gj / k;
  uint32_t bits = 0;
  stored_centroid(c[e], mu[g * D + d], t, &bits);
  const int64_t o = (g * K + first + j) * D + d;
  if (t == qvg::cuda_arith::kF32)
    static_cast<uint32_t*>(book)[o] = bits;
  else
    static_cast<uint16_t*>(book)[o] = uint16_t(bits);
}

/// Element e (= (g * K + j) * D + d) of a span codebook of K slots in dtype t as the
/// assignment sees it: stored[e] = the slot's value in fp32, and c[e] = stored - mu
/// (centred with the chunk's group mean, as assign_to centres them on the host).
QVG_HD void book_entry(const void* book, int t, int64_t K, int64_t D, const float* mu, float* stored, float* c,
                       int64_t e) {
  namespace A = qvg::cuda_arith;
  const int64_t d = e % D, g = e / (K * D);
  const float v = A::load_elem(book, t, e);
  stored[e] = v;
  c[e] = A::sub_rn(v, mu[g * D + d]);
}

/// Point t of group g assigned to the nearest of the first `used` centroids of a
/// codebook of K slots: argmin cnorm[j] - 2 x.c over the bf16 centred values (fp32
/// products and sums in channel order), the first on ties. The assignment of a span
/// chunk with fewer points than slots in use (the tensor-core `assign` considers at
/// most min(K, S) centroids).
QVG_HD uint8_t nearest_slot(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t S, int64_t K, int64_t D,
                            int used, int64_t g, int64_t t) {
  namespace A = qvg::cuda_arith;
  const uint16_t* x = xb + (g * S + t) * D;
  int best = 0;
  float best_d = 0.0f;
  for (int j = 0; j < used; ++j) {
    const uint16_t* c = cb + (g * K + j) * D;
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot = A::add_rn(dot, A::mul_rn(A::bf16_to_f32(x[d]), A::bf16_to_f32(c[d])));
    const float dist = A::sub_rn(cnorm[g * K + j], A::mul_rn(2.0f, dot));
    if (j == 0 || dist < best_d) {
      best = j;
      best_d = dist;
    }
  }
  return uint8_t(best);
}

/// Element e (= (g * S + t) * D + d) of the next stage's residual: r - stored[ids].
QVG_HD void subtract_stored(float* r, const float* stored, const uint8_t* ids, int64_t S, int64_t K, int64_t D,
                            int64_t e) {
  const int64_t d = e % D, row = e / D, g = row / S;
  r[e] = qvg::cuda_arith::sub_rn(r[e], stored[(g * K + ids[row]) * D + d]);
}

/// Channel d of group g's mean of r ([G, S, D]): an fp64 sum in token order, rounded
/// to fp32 (the centring of the next stage's assignment; any fixed rule would do).
QVG_HD float group_mean(const float* r, int64_t S, int64_t D, int64_t g, int64_t d) {
  double s = 0;
  for (int64_t t = 0; t < S; ++t) s += double(r[(g * S + t) * D + d]);
  return float(s / double(S));
}

/// Group g's residual energy: the squared final residual (residual_at) summed by spec
/// 1.1's exact, order-independent rule (exact_sum::energy_of), as the host encoder's
/// EncodeStats sums it; the energy kernels make the same bits with a parallel sum
/// (below).
QVG_HD double group_energy(const QuantizeArgs& a, int64_t g) {
  return qvg::exact_sum::energy_of([&a, g](int64_t i) { return residual_at(a, g * a.S + i / a.D, i % a.D); },
                                   a.S * a.D);
}

// ---- the residual energy across the device (span_kernels.cu's energy kernels) --------
//
// group_energy's value from G x energy_blocks(S) blocks: block `blk` of group g takes
// tokens [blk * kEnergyTokens, ...) and its threads their elements in turn
// (energy_squares). Two launches: the largest square (a max: any order), then each
// thread's sum of the squares' fixed-point terms on that scale (integers: any order),
// and energy_value turns the group's two results into group_energy's double.

inline constexpr int64_t kEnergyTokens = 32;  ///< tokens per block of the energy kernels

/// Blocks per group of the energy kernels for S tokens.
QVG_HD int64_t energy_blocks(int64_t S) {
  return (S + kEnergyTokens - 1) / kEnergyTokens;
}

/// f(x * x) (fp64, exact) for each final-residual value x of block `blk` of group g
/// that thread `tid` of `nthreads` takes: the block's elements e = tid, tid + nthreads,
/// ... in (token, channel) order (one division when it starts, none per element).
template <class F>
QVG_HD void energy_squares(const QuantizeArgs& a, int64_t g, int64_t blk, int tid, int nthreads, F&& f) {
  namespace A = qvg::cuda_arith;
  const int64_t t0 = blk * kEnergyTokens, t1 = a.S < t0 + kEnergyTokens ? a.S : t0 + kEnergyTokens;
  const int64_t n = (t1 - t0) * a.D;
  if (tid >= n) return;
  TokenChannel at(tid, nthreads, a.D);
  for (int64_t e = tid; e < n; e += nthreads, at.advance()) {
    const int64_t t = t0 + at.t;
    float x = a.r.at(a.r.row(g, t) + at.d);
    if (a.stored != nullptr) x = A::sub_rn(x, a.stored[(g * a.K + a.ids[g * a.S + t]) * a.D + at.d]);
    const double v = double(x);
    f(v * v);
  }
}

/// The largest square of a thread's elements (0 for none): energy_of's maximum.
QVG_HD double energy_thread_max(const QuantizeArgs& a, int64_t g, int64_t blk, int tid, int nthreads) {
  double m = 0;
  energy_squares(a, g, blk, tid, nthreads, [&m](double q) { m = q > m ? q : m; });
  return m;
}

/// The scale of group g's sum given its largest square m > 0 (energy_of's).
QVG_HD int energy_exponent(const QuantizeArgs& a, double m) {
  return qvg::exact_sum::fixed_exponent(m, a.S * a.D);
}

/// The sum (modulo 2^64, exact below 2^62) of a thread's fixed-point terms on scale e.
QVG_HD uint64_t energy_thread_sum(const QuantizeArgs& a, int64_t g, int64_t blk, int tid, int nthreads, int e) {
  uint64_t q = 0;
  energy_squares(a, g, blk, tid, nthreads, [&q, e](double v) { q += qvg::exact_sum::fixed_term(v, e); });
  return q;
}

/// group_energy from the group's largest square m and its terms' sum q (unused when
/// m is 0: every residual 0).
QVG_HD double energy_value(const QuantizeArgs& a, double m, uint64_t q) {
  return m > 0 ? qvg::exact_sum::fixed_value(q, energy_exponent(a, m)) : 0.0;
}

// ---- refinement layers ----------------------------------------------------------

/// Element i of the error a refinement layer encodes: x - decoded in fp32 (one
/// rounded subtraction), clamped to +-lim (the largest float not above the input
/// limit), as encode_refinement does on the host.
QVG_HD float refinement_error(const void* x, const void* decoded, int t, float lim, int64_t i) {
  namespace A = qvg::cuda_arith;
  float e = A::sub_rn(A::load_elem(x, t, i), A::load_elem(decoded, t, i));
  e = e < -lim ? -lim : e;
  e = e > lim ? lim : e;
  return e;
}

/// Adds the layer's value at (b, t, h, d) of a decode task T (the layer's arrays,
/// range and target; f32 centroids) to the decoded element there: round(dst + layer)
/// once, to T.out_dtype. The layer's value is decode_one's arithmetic (spec 1.3: the
/// dequantized code, then each stage's centroid added), as add_refinement's f32
/// decode_range on the host.
QVG_HD void refine_one(const DecodeArgs& T, int b, int h, int t, int d) {
  namespace A = qvg::cuda_arith;
  const int64_t e = target_index(T, b, h, t, d);
  const float v = A::add_rn(A::load_elem(T.out, T.out_dtype, e), decoded_value(T, b, h, t, d));
  if (T.out_dtype == A::kF32)
    static_cast<float*>(T.out)[e] = v;
  else
    static_cast<uint16_t*>(T.out)[e] = uint16_t(A::encode_elem(v, T.out_dtype));
}

}  // namespace qvg::cuda::kernels
