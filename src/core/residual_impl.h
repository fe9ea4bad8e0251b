// src/core/residual_impl.h — the scalar rules of the residual quantizer (spec 1.2,
// 1.4) and of the residual's decode (spec 1.3), written once, as inline functions
// that the host compiler and nvcc (host and device) both compile. The CPU encoder
// (src/codec/encode.cpp), the CPU kernels' scalar parts and references
// (src/kernels/cpu, src/kernels/ref) and the CUDA kernel bodies
// (src/kernels/cuda/bodies.cuh) all use these definitions. Every multiply, add and
// divide is one separately rounded fp32 operation (numeric_impl.h), so host and
// device give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/numeric_impl.h"
#include "qvg/code_format.h"

namespace qvg::residual_impl {

using numeric_impl::abs_f;
using numeric_impl::add_rn;
using numeric_impl::div_rn;
using numeric_impl::from_bits;
using numeric_impl::int_to_float;
using numeric_impl::max_f;
using numeric_impl::mul_rn;
using numeric_impl::sub_rn;

/// The smallest raw scale (spec 1.2: tiny).
inline constexpr float kTiny = 1e-10f;

/// Largest code of a width with a row in qvg/code_format.h: its qmax_sym (int2: 1,
/// int3: 3, int4: 7) or qmax_asym (spec 1.2). A width without a row fails loudly.
template <class W>
QVG_HD constexpr int qmax_of(bool asymmetric) {
  return asymmetric ? W::kQmaxAsym : W::kQmaxSym;
}
QVG_HD int qmax_of(int bits, bool asymmetric) {
  return dispatch_width(bits, [&](auto w) { return qmax_of<decltype(w)>(asymmetric); });
}

// ---- stored scales and zeros (spec 1.4) -------------------------------------------

/// Format bits of x stored as a scale or zero: an fp8 e4m3 byte (nearest even,
/// saturating) or bf16 (nearest even, 16 bits).
QVG_HD uint32_t store_format(float x, bool fp8) {
  return fp8 ? uint32_t(numeric_impl::f32_to_fp8e4m3(x)) : uint32_t(numeric_impl::f32_to_bf16(x));
}
/// Value of stored format bits.
QVG_HD float format_value(uint32_t stored, bool fp8) {
  return fp8 ? numeric_impl::fp8e4m3_to_f32(uint8_t(stored)) : numeric_impl::bf16_to_f32(uint16_t(stored));
}
/// Writes format bits as element i of a scale/zero array (fp8: 1 byte; bf16: 2 bytes, little-endian).
QVG_HD void put_stored(uint8_t* arr, bool fp8, int64_t i, uint32_t bits) {
  if (fp8) {
    arr[i] = uint8_t(bits);
  } else {
    arr[2 * i] = uint8_t(bits & 0xFFu);
    arr[2 * i + 1] = uint8_t(bits >> 8);
  }
}
/// Value of element i of a scale/zero array (before the two_level factor).
QVG_HD float stored_value(const uint8_t* arr, bool fp8, int64_t i) {
  if (fp8) return numeric_impl::fp8e4m3_to_f32(arr[i]);
  return numeric_impl::bf16_to_f32(uint16_t(arr[2 * i] | (uint16_t(arr[2 * i + 1]) << 8)));
}
/// s_eff (or z_eff) = value(stored) * factor: one rounded multiply (spec 1.4).
QVG_HD float effective(float stored, float factor) { return mul_rn(stored, factor); }

// ---- the encoder's block statistics and factors (spec 1.2, 1.4) --------------------

/// Raw symmetric scale of a block whose absolute maximum is `absmax`: max(absmax, tiny) / qmax.
QVG_HD float raw_scale_sym(float absmax, int qmax) { return div_rn(max_f(absmax, kTiny), int_to_float(qmax)); }
/// Raw asymmetric scale of a block spanning [lo, hi]: max((hi - lo) / qmax, tiny).
QVG_HD float raw_scale_asym(float lo, float hi, int qmax) {
  return max_f(div_rn(sub_rn(hi, lo), int_to_float(qmax)), kTiny);
}
/// Two-level factor of a group whose largest raw scale (or |zero|) is m: m / 448, or 1
/// if that is 0 — m is 0, or m / 448 underflows (|z| up to about 3.1e-43: the zeros
/// are then stored as they are, fp8 flushing them to 0). A factor is always finite and
/// > 0, as every reader requires (spec 1.4's "g = 1 if that is 0" read as "if m / 448
/// is 0"): whatever the encoder writes, its own readers accept.
QVG_HD float two_level_factor(float m) {
  const float g = div_rn(m, numeric_impl::kFp8E4M3Max);
  return g > 0.0f ? g : 1.0f;
}
/// The value converted to the scale format: raw / factor when the factor applies (two_level with fp8).
QVG_HD float to_store(float raw, bool divide, float factor) { return divide ? div_rn(raw, factor) : raw; }

// ---- codes --------------------------------------------------------------------------

/// round_half_away_from_zero(v), then clamped to [lo, hi], as an int. v is finite or
/// +-inf (never NaN): no float-to-int conversion of a non-finite value happens.
QVG_HD int round_clamp(float v, float lo, float hi) {
#if defined(__CUDA_ARCH__)
  float r = roundf(v);
#else
  float r = std::round(v);
#endif
  r = r < lo ? lo : r;
  r = r > hi ? hi : r;
  return int(r);
}
/// The code of residual x in a block with effective scale s_eff (and zero z_eff):
/// symmetric round_clamp(x / s, -qmax, qmax) + qmax; asymmetric round_clamp((x - z) / s, 0, qmax);
/// a block whose scale underflowed (s_eff == 0) gets the code of the smallest magnitude.
QVG_HD int quantize_code(float x, int qmax, bool asymmetric, float s_eff, float z_eff) {
  const float fq = int_to_float(qmax);
  if (!asymmetric) return (s_eff == 0.0f ? 0 : round_clamp(div_rn(x, s_eff), -fq, fq)) + qmax;
  return s_eff == 0.0f ? 0 : round_clamp(div_rn(sub_rn(x, z_eff), s_eff), 0.0f, fq);
}

// ---- codes without a division per element (the device's scale search) -------------
// round_clamp(div_rn(a, s), lo, hi) decides only on which side of a half-integer the
// rounded quotient falls. A multiply by the rounded reciprocal gives q within
// 2u|a/s| + u^2|a/s| of a/s (u = 2^-24: one rounding of 1/s, one of the product,
// both normal), and div_rn(a, s) is within u|a/s| of it: when q is farther than
// 8u|q| from every half-integer, no half-integer lies between q and div_rn(a, s) (3u
// would do; 8u leaves room), and both round to the integer nearest q. Else (and
// where the bound does not hold: the reciprocal not a normal float, q infinite or
// NaN) the division decides, as before. The same code, bit for bit, for every a
// (tests/gpu/host_arith_test.cpp, `reciprocal_codes_equal_the_divided_codes`). The
// CPU's SIMD scale search (src/kernels/cpu/encode-inl.h, ErrTasksN) multiplies by the
// reciprocal the same way, with a fixed tolerance over the clamp's range.

/// The reciprocal that code_value multiplies by: div_rn(1, s) where s is in
/// [2^-125, 2^126) (so that 1 / s is a normal float), else 0 (code_value then
/// divides). One division per block and scale instead of one per element.
QVG_HD float code_reciprocal(float s) {
  const uint32_t u = numeric_impl::bits_of(s), e = u >> 23;  // sign bit included: a negative s gives e > 255
  return e >= 2u && e <= 252u ? div_rn(1.0f, s) : 0.0f;
}
/// code_value's multiply and test, for inv != 0: the code value round_clamp(div_rn(a, s),
/// lo, hi) as a float (an integer of [lo, hi]; a zero of either sign), dividing only
/// where q = a * inv lies within 8u|q| of a half-integer (about one quotient in 2^20
/// of a uniform spread) or is not finite. REQUIRES inv = code_reciprocal(s) != 0,
/// a / s not NaN (as round_clamp).
QVG_HD float code_value_recip(float a, float s, float inv, float lo, float hi) {
  const float q = mul_rn(a, inv);
#if defined(__CUDA_ARCH__)
  const float r = rintf(q);  // nearest integer (even on ties: a tie fails the test below)
  // |q - r| is exact (r the nearest integer, Sterbenz); the sum rounds up past 0.5 at
  // worst (a division then), never down below it. q infinite or NaN: the test is false.
  if (__fadd_rn(fabsf(__fsub_rn(q, r)), __fmul_rn(fabsf(q), 0x1p-21f)) < 0.5f) return fmaxf(fminf(r, hi), lo);
#else
  const float r = std::rint(q);
  if (std::fabs(q - r) + std::fabs(q) * 0x1p-21f < 0.5f) return std::fmax(std::fmin(r, hi), lo);
#endif
  return int_to_float(round_clamp(div_rn(a, s), lo, hi));
}
/// The code value round_clamp(div_rn(a, s), lo, hi) from inv = code_reciprocal(s):
/// code_value_recip where inv != 0, else the division.
QVG_HD float code_value(float a, float s, float inv, float lo, float hi) {
  return inv != 0.0f ? code_value_recip(a, s, inv, lo, hi) : int_to_float(round_clamp(div_rn(a, s), lo, hi));
}
/// quantize_code through code_value_recip: the same code for every x, s_eff and
/// z_eff, given inv = code_reciprocal(s_eff) (0, s_eff == 0 included: quantize_code
/// itself). Symmetric, x - 0 is x (a zero keeps its sign): one expression for both.
QVG_HD int quantize_code_recip(float x, int qmax, bool asymmetric, float s_eff, float z_eff, float inv) {
  if (inv == 0.0f) return quantize_code(x, qmax, asymmetric, s_eff, z_eff);
  const float fq = int_to_float(qmax);
  return int(code_value_recip(sub_rn(x, asymmetric ? z_eff : 0.0f), s_eff, inv, asymmetric ? 0.0f : -fq, fq)) +
         (asymmetric ? 0 : qmax);
}

/// The dequantized residual of one code (spec 1.3): (code - qmax) * s_eff, or code * s_eff + z_eff.
QVG_HD float dequant(int code, int qmax, bool asymmetric, float s_eff, float z_eff) {
  if (!asymmetric) return mul_rn(int_to_float(code - qmax), s_eff);
  return add_rn(mul_rn(int_to_float(code), s_eff), z_eff);
}
/// dequant in the CUDA decode's form: the code's float made without an int-to-float
/// conversion (a quarter-rate instruction on the device), as from_bits(2^23 bits | code)
/// minus `bias` = 2^23 + qmax (symmetric) or 2^23 (asymmetric), both exact for codes and
/// qmax below 2^23, so the result is dequant's bit for bit (tests/test_numeric.cpp).
QVG_HD float dequant_bias(int qmax, bool asymmetric) {
  return int_to_float(0x800000 + (asymmetric ? 0 : qmax));
}
/// dequant_biased of a code whose float 2^23 + code is already formed (`biased_code`, the
/// bits 0x4B000000 | code): the CUDA decode builds those bits for 8 codes at once.
QVG_HD float dequant_biased_float(float biased_code, float bias, bool asymmetric, float s_eff, float z_eff) {
  const float c = sub_rn(biased_code, bias);
  return asymmetric ? add_rn(mul_rn(c, s_eff), z_eff) : mul_rn(c, s_eff);
}
QVG_HD float dequant_biased(uint32_t code, float bias, bool asymmetric, float s_eff, float z_eff) {
  return dequant_biased_float(from_bits(0x4B000000u | code), bias, asymmetric, s_eff, z_eff);
}

// ---- the encoder's scale search (ScaleSearch::Mse) ----------------------------------
// Only the encoder's choice of the stored scale (and zero) changes; decode is spec 1.3.
// The rule is written once here, as scalar code: every candidate is evaluated with the
// decode's own separately rounded fp32 operations and its squared error summed in fp32
// in channel order (block_sq_error), so the choice (and the bytes) are the same on every
// SIMD target and thread count (kernels::block_errors runs this rule in lanes).

/// Candidates: the block's range shrunk by the factor 1 - k/20, k = 0..kScaleSearchSteps-1
/// (1.0 down to 0.30); k = 0 is the `off` choice (spec 1.2) itself.
inline constexpr int kScaleSearchSteps = 15;
/// The shrink factor of candidate k (exact in fp32 for k = 0: 1.0f).
QVG_HD float scale_search_factor(int k) {
  return div_rn(int_to_float(20 - k), 20.0f);
}

/// The squared error the decoder gives on a block of n channels with effective scale
/// s_eff (and zero z_eff): the sum over channels of (x - dequant(quantize_code(x)))^2.
/// Pinned so that every target gives the same bits (the SIMD kernel
/// kernels::block_errors evaluates candidates in lanes, each lane exactly this): codes
/// as quantize_code gives them (the quotient clamped to [lo - 1, hi + 1] first, then
/// rounded half away from zero through an exact truncation), each square a rounded
/// fp32 multiply, summed in fp32 in channel order.
/// block_sq_error over the elements x(0), ..., x(n-1) of any accessor (the device
/// scale search reads the final residual r - stored[id] without writing it).
template <class At>
QVG_HD float block_sq_error_at(const At& x, int64_t n, int qmax, bool asymmetric, float s_eff, float z_eff) {
  float acc = 0.0f;
  const float hi = int_to_float(qmax), lo = asymmetric ? 0.0f : -hi;
  const float z = asymmetric ? z_eff : 0.0f;
  const float vlo = sub_rn(lo, 1.0f), vhi = add_rn(hi, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    float d;
    if (s_eff == 0.0f) {  // every code decodes to the smallest magnitude: 0, or z (spec 1.2)
      d = sub_rn(x(i), z);
    } else {
      float v = div_rn(sub_rn(x(i), z), s_eff);  // x - 0 is x: the symmetric quotient unchanged
      v = v < vlo ? vlo : v;
      v = v > vhi ? vhi : v;
      const float t = int_to_float(int(v));  // trunc, exact: |v| <= 2^bits
      const float fr = sub_rn(v, t);         // exact
      float r = add_rn(t, fr >= 0.5f ? 1.0f : (fr <= -0.5f ? -1.0f : 0.0f));
      r = r < lo ? lo : r;
      r = r > hi ? hi : r;
      d = sub_rn(x(i), add_rn(mul_rn(r, s_eff), z));
    }
    acc = add_rn(acc, mul_rn(d, d));
  }
  return acc;
}
/// block_sq_error_at with each code from code_value (one reciprocal per candidate
/// instead of a division per element): the same codes, hence the same operations on
/// the same values and the same error bit for bit (only a zero's sign may differ in
/// the code value r, and it cancels: r * s_eff + z is then +-0 or z, d the same, d^2
/// the same). The device's scale search (span_bodies.cuh, search_lane).
template <class At>
QVG_HD float block_sq_error_recip_at(const At& x, int64_t n, int qmax, bool asymmetric, float s_eff, float z_eff) {
  const float inv = code_reciprocal(s_eff);  // 0 for s_eff == 0 too
  if (inv == 0.0f) return block_sq_error_at(x, n, qmax, asymmetric, s_eff, z_eff);
  float acc = 0.0f;
  const float hi = int_to_float(qmax), lo = asymmetric ? 0.0f : -hi;
  const float z = asymmetric ? z_eff : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x(i);
    const float r = code_value_recip(sub_rn(xi, z), s_eff, inv, lo, hi);
    const float d = sub_rn(xi, add_rn(mul_rn(r, s_eff), z));
    acc = add_rn(acc, mul_rn(d, d));
  }
  return acc;
}
/// The element accessor of a plain array.
struct ArrayAt {
  const float* p;
  QVG_HD float operator()(int64_t i) const { return p[i]; }
};
QVG_HD float block_sq_error(const float* x, int64_t n, int qmax, bool asymmetric, float s_eff, float z_eff) {
  return block_sq_error_at(ArrayAt{x}, n, qmax, asymmetric, s_eff, z_eff);
}

/// The candidates of one block's scale search (the CPU encoder and the device
/// kernel src/kernels/cuda/scale_search.cu both take them from here): stored bits
/// and effective values of each distinct candidate, in candidate order.
struct ScaleCandidates {
  uint32_t s_bits[kScaleSearchSteps], z_bits[kScaleSearchSteps];
  float s_eff[kScaleSearchSteps], z_eff[kScaleSearchSteps];
  int m = 0;  ///< distinct candidates (a candidate whose stored bits equal the previous one's is skipped)
};
/// Candidate k of a block with raw scale `raw_s` and, asymmetric, minimum `lo` (its raw
/// zero) and maximum `hi`: the range shrunk by scale_search_factor(k) (the asymmetric
/// range about its centre: z = lo + (hi - lo) * (1 - f) / 2), stored with the `off`
/// choice's factors g, gz (divide: two_level with fp8 scales): its stored bits and
/// effective values (z: 0 and 0.0f when symmetric). kernels::scale_candidates gives
/// these bits for many blocks at once.
struct ScaleCandidate {
  uint32_t s_bits = 0, z_bits = 0;
  float s_eff = 0, z_eff = 0;
};
QVG_HD ScaleCandidate scale_search_candidate(float raw_s, float lo, float hi, bool asym, bool divide, float g, float gz,
                                             bool fp8, int k) {
  ScaleCandidate c;
  const float f = scale_search_factor(k);
  const float cs = mul_rn(raw_s, f);
  const float cz = asym ? add_rn(lo, mul_rn(sub_rn(hi, lo), mul_rn(sub_rn(1.0f, f), 0.5f))) : 0.0f;
  c.s_bits = store_format(to_store(cs, divide, g), fp8);
  c.z_bits = asym ? store_format(to_store(cz, divide, gz), fp8) : 0u;
  c.s_eff = effective(format_value(c.s_bits, fp8), g);
  c.z_eff = asym ? effective(format_value(c.z_bits, fp8), gz) : 0.0f;
  return c;
}
/// Appends candidate `k` to `c` unless its stored bits equal the last kept one's (the
/// same error: such candidates are skipped).
QVG_HD void scale_search_keep(ScaleCandidates& c, const ScaleCandidate& k) {
  if (c.m > 0 && k.s_bits == c.s_bits[c.m - 1] && k.z_bits == c.z_bits[c.m - 1]) return;
  c.s_bits[c.m] = k.s_bits;
  c.z_bits[c.m] = k.z_bits;
  c.s_eff[c.m] = k.s_eff;
  c.z_eff[c.m] = k.z_eff;
  ++c.m;
}
/// The distinct candidates of a block (scale_search_candidate for k = 0, 1, ...,
/// through scale_search_keep).
QVG_HD void scale_search_candidates(float raw_s, float lo, float hi, bool asym, bool divide, float g, float gz,
                                    bool fp8, ScaleCandidates& c) {
  c.m = 0;
  for (int k = 0; k < kScaleSearchSteps; ++k)
    scale_search_keep(c, scale_search_candidate(raw_s, lo, hi, asym, divide, g, gz, fp8, k));
}
/// The chosen candidate: the first of least error.
QVG_HD int scale_search_best(const float* err, int m) {
  int best = 0;
  for (int k = 1; k < m; ++k)
    if (err[k] < err[best]) best = k;
  return best;
}

/// Code of channel i of a packed row (spec 1.5; qvg::code_at of qvg/code_format.h).
QVG_HD int code_of_row(const uint8_t* row, int bits, int64_t i) {
  return code_at(row, bits, i);
}

}  // namespace qvg::residual_impl
