// src/codec/residual.h — scalar pieces of the residual quantizer (spec 1.2, 1.4)
// shared by the encoder, the decoder and the EncodedTensor accessors.
#pragma once

#include <cmath>
#include <cstdint>

#include "qvg/config.h"
#include "qvg/numeric.h"

namespace qvg::detail {

inline constexpr float kTiny = 1e-10f;

inline int qmax_of(int bits, bool asymmetric) {
  return asymmetric ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
}

/// Value of one stored scale/zero element (before the two_level factor).
inline float stored_value(const uint8_t* arr, ScaleDType t, size_t i) {
  if (t == ScaleDType::FP8_E4M3) return fp8e4m3_to_f32(arr[i]);
  uint16_t v = uint16_t(arr[2 * i] | (uint16_t(arr[2 * i + 1]) << 8));
  return bf16_to_f32(v);
}

/// Stores x / factor in the scale format (fp8 saturating or bf16), at element i.
inline void store_value(uint8_t* arr, ScaleDType t, size_t i, float x) {
  if (t == ScaleDType::FP8_E4M3) {
    arr[i] = f32_to_fp8e4m3(x);
  } else {
    uint16_t v = f32_to_bf16(x);
    arr[2 * i] = uint8_t(v & 0xFF);
    arr[2 * i + 1] = uint8_t(v >> 8);
  }
}

/// round_half_away_from_zero, then clamp to [lo, hi], as an int; never converts NaN/Inf.
inline int round_clamp(float v, float lo, float hi) {
  float r = std::round(v);
  r = r < lo ? lo : r;  // NaN-free inputs only: v is finite or +-inf here
  r = r > hi ? hi : r;
  return int(r);
}

}  // namespace qvg::detail
