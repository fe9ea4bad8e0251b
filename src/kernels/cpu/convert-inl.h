// src/kernels/cpu/convert-inl.h — fp32 <-> bf16 (kernels::f32_to_bf16,
// bf16_to_f32) and the vector helpers the decoder stores bf16 with, per SIMD
// target. Included once per SIMD target by dispatch.cpp
// (its foreach_target pass), which has no per-target include guard for it.
// Rounding is integer arithmetic (nearest even), so every target gives the bits of
// qvg::f32_to_bf16 (qvg/numeric.h).

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
#include "qvg/numeric.h"

QVG_CPU_KERNELS_BEGIN

// bf16 bits of v rounded to nearest even, in the low half of each 32-bit lane
// (NaN inputs not handled: rounding can carry them into infinity).
template <class DF, class V>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundedBf16Bits(DF /*df*/, V v) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  return hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
}

// v as bf16, nearest even.
template <class DF, class V>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> ToBf16(DF df, V v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  // NaN stays a quiet NaN (rounding could otherwise carry it into infinity).
  const auto nan = hn::Or(hn::ShiftRight<16>(hn::BitCast(du, v)), hn::Set(du, 0x40u));
  const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, RoundedBf16Bits(df, v));
  return hn::DemoteTo(du16, hn::BitCast(di, r));
}

// As ToBf16 for inputs known not to be NaN (decoded values are finite).
template <class DF, class V>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> ToBf16NoNaN(DF df, V v) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::DemoteTo(du16, hn::BitCast(di, RoundedBf16Bits(df, v)));
}

void F32ToBf16Impl(const float* src, uint16_t* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  const hn::Rebind<uint16_t, decltype(df)> du16;
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(ToBf16(df, hn::LoadU(df, src + i)), du16, dst + i);
  for (; i < n; ++i) dst[i] = qvg::f32_to_bf16(src[i]);
}

void Bf16ToF32Impl(const uint16_t* src, float* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const size_t L = hn::Lanes(df);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, src + i)))), df, dst + i);
  for (; i < n; ++i) dst[i] = qvg::bf16_to_f32(src[i]);
}

bool Bf16ErrorRowImpl(const uint16_t* x, const uint16_t* y, size_t n, float lim, float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const size_t L = hn::Lanes(df);
  const auto widen = [&](const uint16_t* p) {
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, p))));
  };
  const auto hi = hn::Set(df, lim), lo = hn::Set(df, -lim);
  auto nan = hn::FirstN(df, 0);  // no lane
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto e = hn::Sub(widen(x + i), widen(y + i));
    nan = hn::Or(nan, hn::IsNaN(e));
    hn::StoreU(hn::Min(hn::Max(e, lo), hi), df, out + i);
  }
  bool any = !hn::AllFalse(df, nan);
  for (; i < n; ++i) {
    const float e = qvg::bf16_to_f32(x[i]) - qvg::bf16_to_f32(y[i]);
    any |= e != e;
    out[i] = std::min(std::max(e, -lim), lim);
  }
  return any;
}

QVG_CPU_KERNELS_END
