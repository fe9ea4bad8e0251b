// src/core/numeric_impl.h — the format conversions of spec 1.4 and the separately
// rounded fp32 operations of spec 1.3, written once, as
// inline functions that both the host compiler and nvcc (host and device) compile:
// src/core/numeric.cpp exports them as qvg::f32_to_bf16 etc. (qvg/numeric.h), and
// the CUDA kernels (src/kernels/cuda/arith.cuh) call them on the device. Integer
// operations only, so the result never depends on the FPU's rounding mode or on
// compiler contraction.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "qvg/host_device.h"

namespace qvg::numeric_impl {

// The bits of an fp32 value and back: the device's intrinsics; on the host one
// memcpy of the 4 bytes (which compilers reduce to a register move).
template <class To, class From>
QVG_HD To same_bytes_as(From x) {
  static_assert(sizeof(To) == 4 && sizeof(From) == 4);
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<To, float>)
    return __uint_as_float(x);
  else
    return __float_as_uint(x);
#else
  To y;
  std::memcpy(&y, &x, sizeof y);
  return y;
#endif
}
QVG_HD uint32_t bits_of(float f) {
  return same_bytes_as<uint32_t>(f);
}
QVG_HD float from_bits(uint32_t u) {
  return same_bytes_as<float>(u);
}

// ---- separately rounded fp32 operations ----------------------------------------
// Each is one IEEE operation rounded to nearest even, never contracted into a fused
// multiply-add: intrinsics on the device; on the host the library is compiled with
// -ffp-contract=off.

#if defined(__CUDA_ARCH__)
QVG_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
QVG_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
QVG_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
QVG_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
QVG_HD float int_to_float(int v) { return __int2float_rn(v); }  // exact for |v| < 2^24
#else
QVG_HD float mul_rn(float a, float b) { return a * b; }
QVG_HD float add_rn(float a, float b) { return a + b; }
QVG_HD float sub_rn(float a, float b) { return a - b; }
QVG_HD float div_rn(float a, float b) { return a / b; }
QVG_HD float int_to_float(int v) { return static_cast<float>(v); }  // exact for |v| < 2^24
#endif
/// max/min of two non-NaN floats, picking the operand std::max(a, b) / std::min(a, b) pick.
QVG_HD float max_f(float a, float b) { return a < b ? b : a; }
QVG_HD float min_f(float a, float b) { return b < a ? b : a; }
QVG_HD float abs_f(float a) { return from_bits(bits_of(a) & 0x7FFFFFFFu); }

// ---- the formats ------------------------------------------------------------------

/// Largest finite FP8 E4M3 value.
inline constexpr float kFp8E4M3Max = 448.0f;

QVG_HD float bf16_to_f32(uint16_t h) { return from_bits(uint32_t(h) << 16); }

QVG_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest even on the 16 discarded bits; carries into the exponent
  // (and to infinity) exactly as IEEE rounding does.
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return uint16_t(u >> 16);
}

QVG_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return from_bits(sign | 0x7F800000u | (man << 13));  // inf / NaN
  // Zero or subnormal: man * 2^-24, exact in fp32 (man as a float from the 2^23 bit
  // pattern, then a multiply by a power of two) — no normalisation loop, which on the
  // device cost the decode kernels registers and spills.
  if (exp == 0) return from_bits(sign | bits_of(mul_rn(sub_rn(from_bits(0x4B000000u | man), 8388608.0f), 0x1p-24f)));
  return from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

namespace {
// Rounds the magnitude bits `a` (fp32 bit pattern without sign) to fp16, nearest even.
QVG_HD uint16_t f16_magnitude(uint32_t a) {
  if (a > 0x7F800000u) return 0x7E00u;  // NaN
  if (a >= 0x47800000u) return 0x7C00u;  // >= 65536: inf ([65520, 65536) carries to inf below)
  uint32_t exp = a >> 23;
  if (exp < 113) {  // result is fp16 subnormal or zero: value < 2^-14
    if (exp < 102) return 0;  // < 2^-25: rounds to 0 (2^-25 exactly is a tie to even -> 0)
    uint32_t man = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - exp;  // so that the result is in units of 2^-24
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(q);
  }
  uint32_t v = a - (112u << 23);  // rebias exponent
  uint32_t lsb = (v >> 13) & 1u;
  v += 0xFFFu + lsb;
  return uint16_t(v >> 13);  // may carry to 0x7C00 (inf)
}
}  // namespace

QVG_HD uint16_t f32_to_f16(float f) {
  uint32_t u = bits_of(f);
  return uint16_t(((u >> 16) & 0x8000u) | f16_magnitude(u & 0x7FFFFFFFu));
}

QVG_HD uint16_t f32_to_f16_sat(float f) {
  uint32_t u = bits_of(f);
  uint16_t m = f16_magnitude(u & 0x7FFFFFFFu);
  if (m == 0x7C00u) m = 0x7BFFu;  // saturate to 65504
  return uint16_t(((u >> 16) & 0x8000u) | m);
}

QVG_HD float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = uint32_t(v & 0x80u) << 24;
  uint32_t exp = (v >> 3) & 0xFu;
  uint32_t man = v & 0x7u;
  if (exp == 0xF && man == 0x7) return from_bits(sign | 0x7FC00000u);
  if (exp == 0) {
    if (man == 0) return from_bits(sign);
    // value = man * 2^-9: normalise into fp32.
    int e = 0;
    while ((man & 0x8u) == 0) {
      man <<= 1;
      ++e;
    }
    man &= 0x7u;
    return from_bits(sign | (uint32_t(127 - 6 - e) << 23) | (man << 20));
  }
  return from_bits(sign | ((exp + 120u) << 23) | (man << 20));
}
/// fp8e4m3_to_f32 without branches (the CUDA decode's form, once per token and scale
/// block): the 7 magnitude bits placed as an fp32's exponent and mantissa, scaled by
/// 2^120 with one exact multiply (an e4m3 subnormal becomes an fp32 subnormal, which the
/// multiply normalises; the device code does not flush subnormals), the sign OR-ed in;
/// NaN (0x7F, 0xFF) as fp8e4m3_to_f32. Equal to it, bit for bit, on all 256 inputs
/// (tests/test_numeric.cpp).
QVG_HD float fp8e4m3_to_f32_scaled(uint8_t v) {
  const uint32_t m = v & 0x7Fu, sign = uint32_t(v & 0x80u) << 24;
  if (m == 0x7Fu) return from_bits(sign | 0x7FC00000u);
  return from_bits(bits_of(mul_rn(from_bits(m << 20), 0x1p120f)) | sign);
}

QVG_HD uint8_t f32_to_fp8e4m3(float f) {
  uint32_t u = bits_of(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint8_t(sign | 0x7Fu);  // NaN
  if (a >= 0x43E00000u) return uint8_t(sign | 0x7Eu);  // >= 448 (and inf): saturate
  uint32_t exp = a >> 23;
  if (exp < 121) {  // < 2^-6: fp8 subnormal range, units of 2^-9
    if (exp < 117) return sign;  // < 2^-10 (half the smallest subnormal) rounds to zero
    uint32_t man = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 141 - exp;  // value / 2^-9 = man24 * 2^(exp - 141)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint8_t(sign | q);  // q == 8 is the smallest normal (exp field 1), correct encoding
  }
  uint32_t v = a - (120u << 23);
  uint32_t lsb = (v >> 20) & 1u;
  v += 0x7FFFFu + lsb;
  uint32_t r = v >> 20;
  if (r > 0x7Eu) r = 0x7Eu;  // rounding up past 448 saturates (cannot happen below 464)
  return uint8_t(sign | r);
}

}  // namespace qvg::numeric_impl
