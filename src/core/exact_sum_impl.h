// src/core/exact_sum_impl.h — spec 1.1's exact, order-independent sums: the sums that
// decide a kmeans++ pick or a span break. Every term (a non-negative finite double:
// here an fp32 value, or the exact square of one) is rounded once to a fixed-point
// integer on a scale set by the sum's largest term, and the integers are added. The
// integer sum is exact, so a sequential CPU loop, a parallel device reduction (integer
// atomics, a tree, any tiling) and any prefix sum over the terms agree bit for bit.
//
// The scale: for n terms with largest term m > 0, E = fixed_bits(n) - 1 - ilogb(m), so
// m * 2^E lies in [2^(bits-1), 2^bits) and n terms add up below 2^62 (no overflow). A
// term is v * 2^E (exact: a power-of-two scaling of a double that stays normal for
// every fp32 value and square) rounded to the nearest integer, ties to even; a term
// much smaller than m rounds to 0 (it then weighs nothing in a kmeans++ draw). Used by
// the CPU codec (src/codec) and the CUDA kernels (src/kernels/cuda) alike.
#pragma once

#include <cstdint>

#include "qvg/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <algorithm>
#include <cmath>
#endif

namespace qvg::exact_sum {

/// Bits the largest scaled term may use so that n (>= 1) terms add up below 2^62.
QVG_HD int fixed_bits(int64_t n) {
  int l = 0;
  while (l < 62 && (int64_t(1) << l) < n) ++l;
  return 62 - l;
}

/// The scale exponent E of a sum of n terms whose largest is m (> 0, finite).
QVG_HD int fixed_exponent(double m, int64_t n) {
#if defined(__CUDA_ARCH__)
  return fixed_bits(n) - 1 - ilogb(m);
#else
  return fixed_bits(n) - 1 - std::ilogb(m);
#endif
}

/// The term of v (0 <= v <= the sum's largest term) on scale E: v * 2^E rounded to the
/// nearest integer, ties to even.
QVG_HD uint64_t fixed_term(double v, int e) {
#if defined(__CUDA_ARCH__)
  return uint64_t(rint(ldexp(v, e)));
#else
  return uint64_t(std::nearbyint(std::ldexp(v, e)));
#endif
}

#if !defined(__CUDA_ARCH__)
/// fixed_term(v, e) for many terms on one scale, on the host without a libm call per
/// term (ldexp and nearbyint were most of an encode's residual-energy time): v * 2^e is
/// a multiplication by 2^e (exact, or rounded exactly as ldexp rounds, whenever 2^e is a
/// normal double; ldexp otherwise), and the rounding of y in [0, 2^52) is
/// (y + 2^52) - 2^52, where the sum's unit in the last place is 1: the nearest integer,
/// ties to even, as nearbyint in the default rounding mode. The same integer as
/// fixed_term for every v (tests/test_numeric.cpp, ExactSum.HostTermEqualsFixedTerm).
class FixedTerm {
 public:
  explicit FixedTerm(int e) : e_(e), scale_(e >= -1022 && e <= 1023 ? std::ldexp(1.0, e) : 0.0) {}
  uint64_t operator()(double v) const {
    if (scale_ == 0.0) return fixed_term(v, e_);
    constexpr double k52 = 4503599627370496.0;  // 2^52
    const double y = v * scale_;                // < 2^62 for the sum's terms
    return uint64_t(y < k52 ? (y + k52) - k52 : y);
  }

 private:
  int e_;
  double scale_;
};
#endif

/// The value of an exact sum q on scale E as a double: q * 2^-E, rounded once.
QVG_HD double fixed_value(uint64_t q, int e) {
#if defined(__CUDA_ARCH__)
  return ldexp(double(q), -e);
#else
  return std::ldexp(double(q), -e);
#endif
}

/// The exact energy (sum of squares) of the n fp32 values v(0), ..., v(n-1) of any
/// accessor, as a double: each square exact in fp64, summed on the scale of the
/// largest (0 when every value is 0). Two passes over the values.
template <class At>
QVG_HD double energy_of(const At& v, int64_t n) {
  double m = 0;
#if defined(__CUDA_ARCH__)
  for (int64_t i = 0; i < n; ++i) {
    const double x = double(v(i));
    m = x * x > m ? x * x : m;
  }
#else
  // The largest square is the square of the largest |v| (rounding is monotone, and exact
  // for fp32 values), taken with 8 independent maxima: one chain of dependent maxima
  // waited a max's latency per value.
  double a[8] = {};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int j = 0; j < 8; ++j) a[j] = std::max(a[j], std::fabs(double(v(t + j))));
  for (; t < n; ++t) a[0] = std::max(a[0], std::fabs(double(v(t))));
  for (int j = 1; j < 8; ++j) a[0] = std::max(a[0], a[j]);
  m = a[0] * a[0];
#endif
  if (!(m > 0)) return 0.0;
  const int e = fixed_exponent(m, n);
#if defined(__CUDA_ARCH__)
  const auto term = [e](double t) { return fixed_term(t, e); };
#else
  const FixedTerm term(e);
#endif
  uint64_t q = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = double(v(i));
    q += term(x * x);
  }
  return fixed_value(q, e);
}

}  // namespace qvg::exact_sum
