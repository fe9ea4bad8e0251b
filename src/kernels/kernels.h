// src/kernels/kernels.h — the small kernel interface behind the codec and caches.
//
// Plain functions over raw pointers; no vector types leak out. The CPU
// implementation (src/kernels/cpu: one -inl.h per op, dispatch.cpp) is compiled
// once per SIMD target with Highway and dispatched at run time to the best target
// of the machine. Every kernel states its arithmetic: the decode kernels follow
// spec 1.3 exactly (no fused multiply-add), so every target gives the scalar
// path's bits. The scalar reference of each op is in src/kernels/ref/ref.h.
// Layering: uses core types only (qvg/config.h, qvg/tensor.h); never the codec
// or the caches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qvg/config.h"
#include "qvg/tensor.h"

namespace qvg::kernels {

/// Fast k-means assignment (spec 1.1, expanded form): for each of the n points
/// (row-major n x dim, fp32, group-centred by the caller) the index of the nearest
/// of the k centroids (row-major k x dim) by ||c||^2 - 2 x.c, ties to the lowest
/// index as computed (near-ties may differ from the difference form: allowed).
/// Writes ids[0..n); returns how many ids differ from their previous value
/// (every id when `first`). REQUIRES 1 <= k <= 256, dim >= 1.
/// Allocates a transposed copy of the centroids (dim x k, padded).
int64_t assign_nearest(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first);

/// A refinement layer of one group, added in the same pass as its encoding's decode
/// (docs/spans.md): a symmetric residual of `bits` (any code width of
/// qvg/code_format.h, independent of the encoding's) with one f32 centroid row, so
/// the layer's value of element (t, d) is (code - qmax) * s_eff + centroid[d]
/// (spec 1.3 for one stage of one centroid, each operation rounded once).
struct RefineRows {
  const uint8_t* codes = nullptr;   ///< count x (dim*bits/8) packed codes
  const uint8_t* scales = nullptr;  ///< count x (dim/block) stored scales
  ScaleDType scale_dtype = ScaleDType::FP8_E4M3;
  float scale_factor = 1.0f;        ///< two_level factor g (1 for compat / bf16)
  int bits = 4;
  int64_t block = 64;
  const float* centroid = nullptr;  ///< dim floats: the group's one centroid
};

/// One group's decode job: tokens [0, count) of the group's arrays.
struct DecodeRows {
  const uint8_t* codes = nullptr;    ///< count x (dim*bits/8) packed codes
  const uint8_t* scales = nullptr;   ///< count x (dim/block) stored scales (fp8 bytes or bf16 LE)
  const uint8_t* zeros = nullptr;    ///< as scales; asymmetric only
  ScaleDType scale_dtype = ScaleDType::FP8_E4M3;
  float scale_factor = 1.0f;         ///< two_level factor g (1 for compat / bf16)
  float zero_factor = 1.0f;          ///< two_level factor gz
  int bits = 4;                      ///< a code width of qvg/code_format.h
  bool asymmetric = false;
  int64_t block = 64;
  int64_t dim = 128;
  int stages = 1;
  const uint8_t* const* ids = nullptr;     ///< [stages] pointers to count ids
  const float* const* centroids = nullptr; ///< [stages] pointers to k x dim fp32 codebooks
  void* out = nullptr;               ///< token 0's first element
  DType out_dtype = DType::BF16;
  int64_t out_token_stride = 0;      ///< elements between consecutive tokens in `out`
  int64_t count = 0;
  /// The refinement layer of these rows (same tokens, dim), or null: then each
  /// element is round(widen(round(value)) + layer) — the decoded value rounded to
  /// out_dtype and widened back exactly, the layer's value added (one fp32 add),
  /// rounded again: the bits of decode_rows followed by add_refinement (qvg/codec.h).
  const RefineRows* refine = nullptr;
};
/// out[t, :] = dequant(code) + sum_s C_s[id_s[t], :] with spec 1.3's pinned fp32
/// arithmetic, rounded once to out_dtype (nearest even; fp16 saturates); with a
/// refinement layer, its value added as RefineRows says. One pass over the output.
void decode_rows(const DecodeRows& job);

/// Centroid-update sums: for i in [0, n), in that order,
///   sum[ids[i] * dim + d] += double(x[i * dim + d]) for every d, and ++cnt[ids[i]].
/// The caller zeroes sum and cnt. Bits equal the scalar loop's on every target.
void accumulate_clusters(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum, int64_t* cnt);

/// Column sums of n rows of dim floats: for i in [0, n), in that order,
///   sum[d] += double(x[i * dim + d] - minus[d])   (the fp32 subtraction only when
/// minus != nullptr) for every d. The caller sets sum's starting values. Bits equal the
/// scalar loop's on every target (the group mean of k-means, a refinement layer's
/// centroid).
void add_rows_f64(const float* x, int64_t n, int64_t dim, const float* minus, double* sum);

/// amax[b] = max |x| over the b-th run of bs consecutive elements (b < nblocks).
void block_absmax(const float* x, int64_t nblocks, int64_t bs, float* amax);
/// lo[b], hi[b]: min and max of the b-th run of bs elements, equal to the sequential
/// scan lo = min(lo, x[i]), hi = max(hi, x[i]) from x[0] (std::min/max), including
/// the sign of a zero result.
void block_minmax(const float* x, int64_t nblocks, int64_t bs, float* lo, float* hi);

/// Residual codes of spec 1.2 for count token rows of r (count x dim fp32), block by
/// block with the effective scale s = s_eff[t * nb + k] (and zero z = z_eff[...]):
///   symmetric:  q = (s == 0 ? 0 : clamp(round(x / s), -qmax, qmax)) + qmax
///   asymmetric: q =  s == 0 ? 0 : clamp(round((x - z) / s), 0, qmax)
/// round = half away from zero; packed into codes (count x dim*bits/8) in the order
/// of spec 1.5. Bits equal kernels::ref::quantize_rows on every target.
/// REQUIRES bits a code width of qvg/code_format.h, block a multiple of its code
/// group, dim % block == 0, z_eff non-null when asym.
void quantize_rows(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym,
                   const float* s_eff, const float* z_eff, uint8_t* codes);

/// err[c] = residual_impl::block_sq_error(x, n, qmax, asym, s_eff[c], z_eff[c]) for the
/// ncand candidate scales (and zeros) of one block (the encoder's scale search): the
/// candidates are evaluated in lanes, each lane the scalar definition, so the bits
/// equal kernels::ref::block_errors on every target. REQUIRES z_eff non-null when asym.
void block_errors(const float* x, int64_t n, int qmax, bool asym, const float* s_eff, const float* z_eff, int ncand,
                  float* err);
/// block_errors of nblocks consecutive blocks of bs elements (block b at x + b * bs)
/// with block b's m[b] candidates at s_eff + b * stride (and z_eff + b * stride when
/// asym; m == nullptr: residual_impl::kScaleSearchSteps each), its errors to
/// err + b * residual_impl::kScaleSearchSteps. Each block's errors are block_errors'
/// bits; several blocks run side by side (their sums overlap), so this is the fast form
/// for many blocks. REQUIRES 1 <= m[b] <= kScaleSearchSteps.
void block_errors_batch(const float* x, int64_t nblocks, int64_t bs, int qmax, bool asym, const float* s_eff,
                        const float* z_eff, int64_t stride, const int* m, float* err);
/// Slots per block of scale_candidates' outputs (at least residual_impl::kScaleSearchSteps).
inline constexpr int64_t kCandidateStride = 16;
/// The scale search's candidates of nblocks blocks before deduplication: block b's
/// candidate k (k < residual_impl::kScaleSearchSteps) at index b * kCandidateStride + k
/// of s_bits, s_eff (and, asym, z_bits, z_eff) equals residual_impl::
/// scale_search_candidate(raw_s[b], lo[b], hi[b], asym, divide, g, gz, fp8, k) bit for
/// bit on every target; the other slots are written with unspecified values. lo, hi:
/// the blocks' minima and maxima, read only when asym.
void scale_candidates(const float* raw_s, const float* lo, const float* hi, int64_t nblocks, bool asym, bool divide,
                      float g, float gz, bool fp8, uint32_t* s_bits, uint32_t* z_bits, float* s_eff, float* z_eff);

/// Native bf16 conversion (AVX512-BF16) in decode: available when the CPU has it
/// and the dispatched target is AVX-512; used unless switched off. It flushes
/// denormals, so decode keeps the integer rounding for any vector pair holding a
/// zero exponent: output bits are the same either way (tests check both).
bool native_bf16_available();
/// Allows (default) or forbids the native conversion. For tests and benchmarks.
void allow_native_bf16(bool allow);
/// native_bf16_available() and allowed.
bool native_bf16_enabled();

/// n elements, nearest even (integer arithmetic on every target).
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
/// A refinement layer's error row from bf16 rows: out[i] = clamp(float(x[i]) -
/// float(y[i]), -lim, lim), one fp32 subtraction each; returns whether any difference
/// is NaN (then `out` is unspecified). The bits of converting both rows and
/// subtracting in scalar code (an infinite difference clamps to +-lim). REQUIRES lim > 0.
bool bf16_error_row(const uint16_t* x, const uint16_t* y, size_t n, float lim, float* out);

/// Attention of n queries over T keys of one (batch, head), fp32:
/// out[i, :] = sum_t softmax_t(scale * q[i, :] . k[t, :]) v[t, :].
/// q: n x D rows; kT: keys transposed, D x tpad (columns >= T are ignored, any
/// finite value); v: T x D rows; out: row i at out + i * out_stride.
/// REQUIRES T >= 1, tpad a multiple of attention_key_padding() and >= T.
/// Allocates (4 x tpad + small) floats of scratch.
void attention_head(const float* q, int64_t n, const float* kT, int64_t tpad, int64_t T, const float* v, int64_t D,
                    float scale, float* out, int64_t out_stride);
/// The multiple kT's row length must be padded to on the dispatched target.
int64_t attention_key_padding();

/// Index of the first element of p[0..n) (dtype t) that is NaN, infinite or has
/// |x| > 1e16 (the input limit of spec 1), or n when every element is within it.
size_t first_out_of_limit(const void* p, DType t, size_t n);

/// SIMD targets compiled into this build and supported by this CPU, best first.
struct Target {
  int64_t id;
  std::string name;
};
std::vector<Target> available_targets();
/// Restricts dispatch to `target` (one of available_targets()); 0 restores the
/// default. For tests and benchmarks only; not thread-safe.
void force_target(int64_t target);
/// Name of the target the dispatcher currently uses.
std::string current_target_name();

}  // namespace qvg::kernels
