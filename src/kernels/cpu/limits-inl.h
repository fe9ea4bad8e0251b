// src/kernels/cpu/limits-inl.h — the input-limit scan (kernels::first_out_of_limit)
// per SIMD target: integer compares on magnitude bits. Include inside a
// foreach_target translation unit (dispatch.cpp).

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
#include "qvg/tensor.h"

QVG_CPU_KERNELS_BEGIN

// |x| <= 1e16 compared on magnitude bits: the largest float <= 1e16 is
// 9999999198822400 (0x5A0E1BC9); NaN and infinity have larger magnitude bits.
constexpr uint32_t kLimitBits = 0x5A0E1BC9u;

template <typename T, class DU, class Pred>
size_t FirstBad(DU du, const T* p, size_t n, Pred bad_vec, bool (*bad_scalar)(T)) {
  const size_t L = hn::Lanes(du);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    if (!hn::AllFalse(du, bad_vec(hn::LoadU(du, p + i)))) break;
  }
  for (; i < n; ++i)
    if (bad_scalar(p[i])) return i;
  return n;
}

size_t FirstOutOfLimitImpl(const void* p, DType t, size_t n) {
  const hn::ScalableTag<uint32_t> du32;
  const hn::ScalableTag<uint16_t> du16;
  switch (t) {
    case DType::F32: {
      const auto absm = hn::Set(du32, 0x7FFFFFFFu), lim = hn::Set(du32, kLimitBits);
      return FirstBad<uint32_t>(
          du32, static_cast<const uint32_t*>(p), n, [&](auto v) { return hn::Gt(hn::And(v, absm), lim); },
          +[](uint32_t v) { return (v & 0x7FFFFFFFu) > kLimitBits; });
    }
    case DType::BF16: {
      // bf16 magnitude bits m: value bits m << 16 > kLimitBits  <=>  m > kLimitBits >> 16 (low bits of the
      // limit are non-zero, so m == kLimitBits >> 16 is still within the limit).
      const auto absm = hn::Set(du16, uint16_t(0x7FFF)), lim = hn::Set(du16, uint16_t(kLimitBits >> 16));
      return FirstBad<uint16_t>(
          du16, static_cast<const uint16_t*>(p), n, [&](auto v) { return hn::Gt(hn::And(v, absm), lim); },
          +[](uint16_t v) { return uint32_t(v & 0x7FFF) > (kLimitBits >> 16); });
    }
    case DType::F16: {
      // Every finite fp16 is within the limit: only infinity and NaN (exponent all ones) fail.
      const auto expm = hn::Set(du16, uint16_t(0x7C00));
      return FirstBad<uint16_t>(
          du16, static_cast<const uint16_t*>(p), n, [&](auto v) { return hn::Eq(hn::And(v, expm), expm); },
          +[](uint16_t v) { return (v & 0x7C00) == 0x7C00; });
    }
  }
  return n;
}

QVG_CPU_KERNELS_END
