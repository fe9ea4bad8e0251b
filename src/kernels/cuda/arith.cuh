// src/kernels/cuda/arith.cuh — the per-element arithmetic of the CUDA kernels,
// written once as __host__ __device__ inline functions.
//
// The decode kernels (spec 1.3) and the residual quantizer (spec 1.2, 1.4) call
// these functions on the device; tests/gpu/host_arith_test.cpp compiles this same
// header with the host compiler and checks it bit for bit against the CPU codec
// (decode_rows_reference, quantize_residual_group, the numeric.h conversions).
// Every multiply, add and divide is a separately rounded fp32 operation
// (__fmul_rn/__fadd_rn/__fdiv_rn on the device; the host side is compiled with
// -ffp-contract=off), and every format conversion uses integer operations only,
// the library's own (src/core/numeric_impl.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numeric_impl.h"  // QVG_HD and the spec 1.4 conversions

// Loop unrolling hint for the device pass only (the host compiler warns on it).
#if defined(__CUDA_ARCH__)
#define QVG_UNROLL _Pragma("unroll")
#else
#define QVG_UNROLL
#endif

namespace qvg::cuda_arith {

// ---- fp32 bits and separately rounded operations -----------------------------

using numeric_impl::bits_of;
using numeric_impl::from_bits;
QVG_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
QVG_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
QVG_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
QVG_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
/// Exact for the small integers used here (|v| < 2^24).
QVG_HD float int_to_float(int v) {
#if defined(__CUDA_ARCH__)
  return __int2float_rn(v);
#else
  return static_cast<float>(v);
#endif
}
/// max/min of two non-NaN floats, as std::max(a, b) / std::min(a, b) pick them.
QVG_HD float max_f(float a, float b) { return a < b ? b : a; }
QVG_HD float min_f(float a, float b) { return b < a ? b : a; }
QVG_HD float abs_f(float a) { return from_bits(bits_of(a) & 0x7FFFFFFFu); }

// ---- numeric formats (spec 1.4): the library's own, src/core/numeric_impl.h ----
using numeric_impl::bf16_to_f32;
using numeric_impl::f16_magnitude;
using numeric_impl::f16_to_f32;
using numeric_impl::f32_to_bf16;
using numeric_impl::f32_to_f16_sat;
using numeric_impl::f32_to_fp8e4m3;
using numeric_impl::fp8e4m3_to_f32;

// ---- element types ------------------------------------------------------------

/// Element types as small integers (the order of qvg::DType: BF16, F16, F32).
enum : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

/// Element i of a buffer of type t as fp32 (exact).
QVG_HD float load_elem(const void* p, int t, int64_t i) {
  if (t == kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
/// The storage bits of v in type t (nearest even; fp16 saturating): 16 low bits
/// for bf16/f16, all 32 for f32.
QVG_HD uint32_t encode_elem(float v, int t) {
  if (t == kF32) return bits_of(v);
  return t == kBF16 ? uint32_t(f32_to_bf16(v)) : uint32_t(f32_to_f16_sat(v));
}
/// Rounds v to type t and back to fp32 (the "stored value" of a centroid).
QVG_HD float round_trip(float v, int t) {
  if (t == kF32) return v;
  return t == kBF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16_sat(v));
}

// ---- decode (spec 1.3) --------------------------------------------------------

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kTiny = 1e-10f;

QVG_HD int qmax_of(int bits, bool asymmetric) { return asymmetric ? (1 << bits) - 1 : (1 << (bits - 1)) - 1; }

/// Value of stored scale/zero element i (fp8 byte or bf16 little-endian), before the factor.
QVG_HD float stored_value(const uint8_t* arr, bool fp8, int64_t i) {
  if (fp8) return fp8e4m3_to_f32(arr[i]);
  const uint16_t v = uint16_t(arr[2 * i] | (uint16_t(arr[2 * i + 1]) << 8));
  return bf16_to_f32(v);
}

/// s_eff (or z_eff) = decode(stored) * factor, one rounded multiply (spec 1.4).
QVG_HD float effective(float stored, float factor) { return mul_rn(stored, factor); }

/// Code i (0..7) of an 8-channel code word: int4 uses the 4 bytes of `word`
/// (little-endian, byte j = code[2j] << 4 | code[2j+1]); int2 uses the 2 low bytes
/// (byte j = code[4j] << 6 | code[4j+1] << 4 | code[4j+2] << 2 | code[4j+3]).
QVG_HD int code_of_word(uint32_t word, int bits, int i) {
  if (bits == 4) {
    const uint32_t byte = (word >> (8 * (i >> 1))) & 0xFFu;
    return int((i & 1) ? (byte & 0xFu) : (byte >> 4));
  }
  const uint32_t byte = (word >> (8 * (i >> 2))) & 0xFFu;
  return int((byte >> (6 - 2 * (i & 3))) & 0x3u);
}
/// Code of channel i of a packed row (spec 1.5 order).
QVG_HD int code_of_row(const uint8_t* row, int bits, int64_t i) {
  if (bits == 4) {
    const uint8_t byte = row[i >> 1];
    return (i & 1) ? (byte & 0xF) : (byte >> 4);
  }
  const uint8_t byte = row[i >> 2];
  return (byte >> (6 - 2 * (i & 3))) & 0x3;
}

/// The dequantized residual of one code: (code - qmax) * s_eff, or code * s_eff + z_eff.
QVG_HD float dequant(int code, int qmax, bool asymmetric, float s_eff, float z_eff) {
  if (!asymmetric) return mul_rn(int_to_float(code - qmax), s_eff);
  return add_rn(mul_rn(int_to_float(code), s_eff), z_eff);
}

// ---- residual quantization (spec 1.2): mirrors quantize_residual_group --------

/// round_half_away_from_zero, clamp to [lo, hi]; finite or +-inf input.
QVG_HD int round_clamp(float v, float lo, float hi) {
  float r = roundf(v);
  r = r < lo ? lo : r;
  r = r > hi ? hi : r;
  return int(r);
}
/// Raw symmetric scale of a block of absolute maximum `absmax`.
QVG_HD float raw_scale_sym(float absmax, int qmax) { return div_rn(max_f(absmax, kTiny), int_to_float(qmax)); }
/// Raw asymmetric scale of a block spanning [lo, hi].
QVG_HD float raw_scale_asym(float lo, float hi, int qmax) {
  return max_f(div_rn(sub_rn(hi, lo), int_to_float(qmax)), kTiny);
}
/// Two-level factor of a group whose largest raw scale (or |zero|) is m.
QVG_HD float two_level_factor(float m) { return m > 0.0f ? div_rn(m, kFp8Max) : 1.0f; }
/// The value written to the scale array before format conversion.
QVG_HD float to_store(float raw, bool divide, float factor) { return divide ? div_rn(raw, factor) : raw; }
/// Stored format bits of x: fp8 byte or bf16 (16 bits).
QVG_HD uint32_t store_format(float x, bool fp8) { return fp8 ? uint32_t(f32_to_fp8e4m3(x)) : uint32_t(f32_to_bf16(x)); }
/// Value of stored format bits.
QVG_HD float format_value(uint32_t stored, bool fp8) {
  return fp8 ? fp8e4m3_to_f32(uint8_t(stored)) : bf16_to_f32(uint16_t(stored));
}
/// The code of residual x in a block with effective scale s_eff (and zero z_eff).
QVG_HD int quantize_code(float x, int qmax, bool asymmetric, float s_eff, float z_eff) {
  const float fq = int_to_float(qmax);
  if (!asymmetric) return (s_eff == 0.0f ? 0 : round_clamp(div_rn(x, s_eff), -fq, fq)) + qmax;
  return s_eff == 0.0f ? 0 : round_clamp(div_rn(sub_rn(x, z_eff), s_eff), 0.0f, fq);
}

}  // namespace qvg::cuda_arith

namespace qvg::cuda_arith {

// ---- the codec's PRNG (src/codec/rng.h), usable on the device --------------------

QVG_HD uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// High and low 64 bits of a * b.
QVG_HD void mul64wide(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
  lo = a * b;
#if defined(__CUDA_ARCH__)
  hi = __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 u128;
  hi = uint64_t((u128(a) * b) >> 64);
#endif
}

/// The same stream as qvg::detail::Rng(seed, stage, b, h) (tested on the host).
struct Rng {
  uint64_t state;
  QVG_HD Rng(uint64_t seed, uint64_t stage, uint64_t b, uint64_t h) {
    uint64_t s = seed;
    state = splitmix64(s);
    state ^= stage * 0xD6E8FEB86659FD93ull;
    splitmix64(state);
    state ^= b * 0xA0761D6478BD642Full;
    splitmix64(state);
    state ^= h * 0xE7037ED1A0B428DBull;
  }
  QVG_HD uint64_t next() { return splitmix64(state); }
  /// Uniform integer in [0, m), m >= 1 (Lemire with rejection), as Rng::below.
  QVG_HD uint64_t below(uint64_t m) {
    uint64_t hi, lo;
    mul64wide(next(), m, hi, lo);
    if (lo < m) {
      const uint64_t t = (0 - m) % m;
      while (lo < t) mul64wide(next(), m, hi, lo);
    }
    return hi;
  }
};

}  // namespace qvg::cuda_arith
