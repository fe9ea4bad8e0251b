// qvg/numeric.h — the numeric formats of spec 1.4, written with integer operations.
//
// All conversions from fp32 round to nearest, ties to even. NaN inputs map to a
// NaN of the target (fp8: 0x7F with the sign); qvg never feeds NaN to them.
// These scalar functions are the reference every SIMD/CUDA conversion is tested
// against bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace qvg {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// bf16 -> fp32: exact.
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
/// fp32 -> bf16, nearest even; overflow rounds to +-inf as IEEE does.
uint16_t f32_to_bf16(float f);

/// fp16 -> fp32: exact (subnormals included).
float f16_to_f32(uint16_t h);
/// fp16 from fp32, nearest even; magnitudes past the fp16 range become +-inf.
uint16_t f32_to_f16(float f);
/// fp16 from fp32, nearest even, saturating to +-65504 (the decode output rule of 1.3).
uint16_t f32_to_f16_sat(float f);

/// FP8 E4M3 ("e4m3fn") -> fp32: exact; 0x7F/0xFF decode to NaN.
float fp8e4m3_to_f32(uint8_t v);
/// fp32 -> FP8 E4M3, nearest even, saturating to +-448 (`satfinite`).
uint8_t f32_to_fp8e4m3(float f);

/// Largest finite FP8 E4M3 value (the satfinite bound).
inline constexpr float kFp8E4M3Max = 448.0f;

}  // namespace qvg
