// Exhaustive and randomized tests of the numeric formats of spec 1.4 against
// independent references (nearest representable value found by search in fp64;
// the compiler's _Float16 for fp16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/exact_sum_impl.h"
#include "core/numeric_impl.h"
#include "core/residual_impl.h"
#include "qvg/numeric.h"

namespace qvg {
namespace {

// Independent fp8 e4m3fn decode: the formula of the format.
double fp8_ref_value(uint8_t v) {
  int sign = (v >> 7) ? -1 : 1;
  int e = (v >> 3) & 0xF, m = v & 7;
  if (e == 0xF && m == 7) return NAN;
  if (e == 0) return sign * std::ldexp(m / 8.0, -6);
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}

// Independent fp32 -> fp8 (nearest even, saturating) by searching all finite codes.
uint8_t fp8_ref_encode(float f) {
  if (std::isnan(f)) return 0x7F;
  double x = f;
  if (std::fabs(x) >= 448.0) return x > 0 ? 0x7E : 0xFE;  // satfinite
  int best = -1;
  double bestd = INFINITY;
  for (int c = 0; c < 256; ++c) {
    double v = fp8_ref_value(uint8_t(c));
    if (std::isnan(v)) continue;
    if (v == 0 && std::signbit(v) != std::signbit(x)) continue;  // keep the sign of zero
    double d = std::fabs(v - x);
    if (d < bestd || (d == bestd && (c & 1) == 0 && (best & 1) == 1)) {
      bestd = d;
      best = c;
    }
  }
  // Saturation: anything beyond 448 maps to +-448 (covered by the search, as 448
  // is the nearest finite value); +-inf too.
  return uint8_t(best);
}

// Independent fp32 -> bf16: compare the two neighbours in fp64.
uint16_t bf16_ref(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u = f32_bits(f);
  uint16_t lo = uint16_t(u >> 16);  // truncation (toward zero in magnitude)
  uint16_t hi = uint16_t(lo + 1);
  double vlo = bf16_to_f32(lo), x = f;
  if (double(bf16_to_f32(lo)) == x) return lo;
  // Magnitude-next value; infinity when the truncation is the largest finite.
  double vhi = ((hi & 0x7F80) == 0x7F80) ? std::copysign(INFINITY, x) : double(bf16_to_f32(hi));
  if ((hi & 0x7FFF) == 0x7F80) {
    // Next is infinity: IEEE rounds to inf when |x| >= max + half ulp.
    double maxv = std::fabs(vlo), half = std::ldexp(1.0, 127 - 7 - 1);
    return std::fabs(x) >= maxv + half ? hi : lo;
  }
  double dlo = std::fabs(x - vlo), dhi = std::fabs(vhi - x);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Fp8, AllCodesDecode) {
  for (int c = 0; c < 256; ++c) {
    double ref = fp8_ref_value(uint8_t(c));
    float got = fp8e4m3_to_f32(uint8_t(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), ref) << "code " << c;
      EXPECT_EQ(std::signbit(got), std::signbit(ref)) << "code " << c;
    }
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

// The CUDA decode's branch-free fp8 form (fp8e4m3_to_f32_scaled) gives the same bits as
// the reference conversion on every byte, NaN included.
TEST(Fp8, ScaledFormEqualsReferenceOnAllBytes) {
  for (int c = 0; c < 256; ++c) {
    const uint32_t a = numeric_impl::bits_of(numeric_impl::fp8e4m3_to_f32(uint8_t(c)));
    const uint32_t b = numeric_impl::bits_of(numeric_impl::fp8e4m3_to_f32_scaled(uint8_t(c)));
    EXPECT_EQ(a, b) << "byte " << c;
  }
}

// The CUDA decode's dequant (no int-to-float conversion) equals spec 1.3's on every code
// of every width (int2, int3, int4), symmetric and asymmetric, for scales and zeros of every magnitude
// (subnormal, normal, near the fp32 limit) and both signs.
TEST(Dequant, BiasedFormEqualsReference) {
  std::mt19937 rng(7);
  std::vector<float> vals = {0.0f, -0.0f, 1e-45f, -3e-40f, 1e-10f, 0.37f, -1.5f, 448.0f, 3e38f, -3e38f};
  for (int i = 0; i < 200; ++i) vals.push_back(numeric_impl::from_bits(uint32_t(rng()) & 0xFF7FFFFFu));  // finite
  for (int bits : {2, 3, 4})
    for (bool asym : {false, true}) {
      const int qmax = residual_impl::qmax_of(bits, asym);
      const float bias = residual_impl::dequant_bias(qmax, asym);
      for (int code = 0; code < (1 << bits); ++code)
        for (float s : vals)
          for (float z : {0.0f, -0.0f, 0.25f, -7e-39f, 1e30f}) {
            const float want = residual_impl::dequant(code, qmax, asym, s, z);
            const float got = residual_impl::dequant_biased(uint32_t(code), bias, asym, s, z);
            ASSERT_EQ(numeric_impl::bits_of(want), numeric_impl::bits_of(got))
                << "bits " << bits << " asym " << asym << " code " << code << " s " << s << " z " << z;
          }
    }
}

// Spec 1.2 per width, qmax written out here (2^(bits-1) - 1 symmetric, 2^bits - 1
// asymmetric: int3 3 and 7): every code in range, and the decoded residual within
// s_eff / 2 + dist(x, representable range) of x (plus a few fp32 ulps of the division
// and the multiply), for values inside, at the edge of and beyond the range.
TEST(Residual, EveryWidthCodesWithinTheSpecBound) {
  std::mt19937 rng(36);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int bits : {2, 3, 4})
    for (bool asym : {false, true}) {
      const int qmax = asym ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
      ASSERT_EQ(residual_impl::qmax_of(bits, asym), qmax) << bits << " " << asym;
      for (int i = 0; i < 20000; ++i) {
        const float mag = std::ldexp(1.0f, int(rng() % 40) - 20);
        const float s = std::fabs(nd(rng)) * mag + mag * 1e-3f;
        const float z = asym ? nd(rng) * mag * float(qmax) : 0.0f;
        // x around the range: its centre +- up to 1.5 half-ranges.
        const float centre = asym ? z + s * float(qmax) / 2 : 0.0f;
        const float x = centre + nd(rng) * 0.75f * s * float(qmax);
        const int code = residual_impl::quantize_code(x, qmax, asym, s, z);
        ASSERT_GE(code, 0);
        ASSERT_LE(code, asym ? qmax : 2 * qmax);
        const double dec = double(residual_impl::dequant(code, qmax, asym, s, z));
        const double lo = asym ? double(z) : -double(qmax) * s, hi = lo + (asym ? 1.0 : 2.0) * double(qmax) * s;
        const double dist = x < lo ? lo - x : x > hi ? x - hi : 0.0;
        const double ulps = 8.0 * std::ldexp(1.0, std::ilogb(std::max(std::fabs(double(x)), hi - lo)) - 23);
        ASSERT_LE(std::fabs(double(x) - dec), double(s) / 2 + dist + ulps)
            << "bits " << bits << " asym " << asym << " x " << x << " s " << s << " z " << z << " code " << code;
      }
    }
}

TEST(Fp8, AllCodesRoundTripAndMidpoints) {
  std::vector<double> vals;
  for (int c = 0; c < 256; ++c) {
    float v = fp8e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_fp8e4m3(v), uint8_t(c)) << c;
    vals.push_back(v);
  }
  // Midpoints between neighbours (ties to even) and points just beside them.
  for (int c = 0; c < 0x7E; ++c) {
    double a = fp8_ref_value(uint8_t(c)), b = fp8_ref_value(uint8_t(c + 1));
    float mid = float((a + b) / 2);  // exact in fp32
    uint8_t want = (c & 1) ? uint8_t(c + 1) : uint8_t(c);
    EXPECT_EQ(f32_to_fp8e4m3(mid), want) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_fp8e4m3(-mid), uint8_t(want | 0x80));
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, 0.0f)), uint8_t(c));
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, 1e9f)), uint8_t(c + 1));
  }
}

TEST(Fp8, SaturatesAndSpecials) {
  EXPECT_EQ(f32_to_fp8e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_fp8e4m3(464.0f), 0x7E);  // would round to 480 (NaN code) without satfinite
  EXPECT_EQ(f32_to_fp8e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_fp8e4m3(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_fp8e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_fp8e4m3(-500.0f), 0xFE);
  EXPECT_EQ(f32_to_fp8e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_fp8e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to even 0
  EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_fp8e4m3(1e-30f), 0x00);
}

TEST(Fp8, RandomFp32MatchesReference) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    float f;
    if (i % 2) {
      f = f32_from_bits(uint32_t(rng()));  // every exponent, NaN included
    } else {
      std::uniform_real_distribution<float> e(-14.0f, 10.0f);
      f = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng), int(e(rng)));
    }
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp8e4m3(f), fp8_ref_encode(f)) << f;
  }
}

TEST(Bf16, AllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float v = bf16_to_f32(uint16_t(c));
    EXPECT_EQ(f32_bits(v), c << 16);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(v), uint16_t(c)) << c;
    // Tie with the next code (when both finite): rounds to the even one.
    uint16_t n = uint16_t(c + 1);
    if ((c & 0x7F80) == 0x7F80 || (n & 0x7F80) == 0x7F80 || (c & 0x7FFF) == 0x7FFF) continue;
    uint32_t mid_bits = (c << 16) | 0x8000u;  // exactly halfway in magnitude
    float mid = f32_from_bits(mid_bits);
    uint16_t want = (c & 1) ? n : uint16_t(c);
    ASSERT_EQ(f32_to_bf16(mid), want) << "tie after code " << c;
    ASSERT_EQ(f32_to_bf16(f32_from_bits(mid_bits - 1)), uint16_t(c));
    ASSERT_EQ(f32_to_bf16(f32_from_bits(mid_bits + 1)), n);
  }
}

TEST(Bf16, RandomFp32MatchesReference) {
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    float f = f32_from_bits(uint32_t(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), bf16_ref(f)) << f;
  }
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7F80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(std::ldexp(1.0f, -140)), 0x0000 | uint16_t(f32_bits(std::ldexp(1.0f, -140)) >> 16));
}

TEST(Fp16, AllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    _Float16 h;
    uint16_t cc = uint16_t(c);
    std::memcpy(&h, &cc, 2);
    float ref = float(h);
    float got = f16_to_f32(cc);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(f32_bits(got), f32_bits(ref)) << c;
    ASSERT_EQ(f32_to_f16(got), cc) << c;
    // Midpoint to the next finite code: tie to even (fp64 midpoint is exact in fp32).
    if ((c & 0x7C00) == 0x7C00 || ((c + 1) & 0x7C00) == 0x7C00 || (c & 0x7FFF) == 0x7FFF) continue;
    float mid = float((double(got) + double(f16_to_f32(uint16_t(c + 1)))) / 2);
    uint16_t want = (c & 1) ? uint16_t(c + 1) : cc;
    ASSERT_EQ(f32_to_f16(mid), want) << "tie after " << c;
  }
}

TEST(Fp16, RandomFp32MatchesCompiler) {
  std::mt19937 rng(13);
  for (int i = 0; i < 1000000; ++i) {
    float f = (i % 2) ? f32_from_bits(uint32_t(rng()))
                      : std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), int(rng() % 50) - 30);
    if (std::isnan(f)) continue;
    _Float16 h = _Float16(f);
    uint16_t ref;
    std::memcpy(&ref, &h, 2);
    ASSERT_EQ(f32_to_f16(f), ref) << f;
  }
}

TEST(Fp16, SaturatingVariant) {
  EXPECT_EQ(f32_to_f16_sat(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_sat(65520.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_sat(1e9f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_sat(-1e9f), 0xFBFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // the IEEE conversion overflows to inf
  EXPECT_EQ(f32_to_f16_sat(1.0f), 0x3C00);
}

}  // namespace
}  // namespace qvg

// The host's term on a fixed scale (exact_sum::FixedTerm) against fixed_term's
// ldexp + nearbyint: the same integer for every value and exponent the sums meet
// (squares of fp32 values, fp64 distances) and for exponents outside the normal
// range of 2^e (ldexp there), with exact ties to even and subnormal products.
TEST(ExactSum, HostTermEqualsFixedTerm) {
  namespace X = qvg::exact_sum;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> ex(-1100, 1100);
  int64_t checked = 0, ties = 0;
  for (int round = 0; round < 2000; ++round) {
    // A largest term m, its sum's scale for n terms, and terms below m.
    const int64_t n = int64_t(1) << (rng() % 40);
    double m = std::ldexp(1.0 + double(rng() % 1000000) / 1e6, ex(rng));
    if (!(m > 0) || !std::isfinite(m)) continue;
    const int e = X::fixed_exponent(m, n);
    const X::FixedTerm term(e);
    std::vector<double> vs = {m, 0.0, m / 3, std::nextafter(m, 0.0), std::ldexp(m, -60), std::ldexp(m, -61),
                              std::ldexp(m, -62), std::ldexp(m, -2000), 4.9e-324};
    for (int i = 0; i < 40; ++i) vs.push_back(m * double(rng() % (uint64_t(1) << 53)) / 9007199254740992.0);
    for (int i = 0; i < 20; ++i) {  // exact halves on the scale: ties
      const double half = std::ldexp(double(2 * (rng() % 1000000) + 1), -e - 1);
      if (half <= m) {
        vs.push_back(half);
        ++ties;
      }
    }
    for (double v : vs) {
      if (v > m) continue;
      ASSERT_EQ(term(v), X::fixed_term(v, e)) << "v " << v << " e " << e;
      ++checked;
    }
  }
  // Squares of fp32 values on their sums' scales (what energy_of and kmeans++ sum).
  std::uniform_real_distribution<float> uf(-1.0f, 1.0f);
  for (int round = 0; round < 500; ++round) {
    const float big = std::ldexp(1.0f, int(rng() % 250) - 149);
    const double m = double(big) * double(big);
    const int e = X::fixed_exponent(m, 4096);
    const X::FixedTerm term(e);
    for (int i = 0; i < 200; ++i) {
      const double x = double(uf(rng) * big);
      ASSERT_EQ(term(x * x), X::fixed_term(x * x, e));
      ++checked;
    }
  }
  EXPECT_GT(checked, 150000);
  EXPECT_GT(ties, 1000);
}

// exact_sum::energy_of (the host's: the largest square from 8 running maxima of |v|,
// terms through FixedTerm) against the rule written plainly: the largest square by a
// sequential max of squares, terms by fixed_term. Bit for bit over sizes around 8,
// zeros, subnormals and wide magnitudes.
TEST(ExactSum, EnergyOfEqualsThePlainRule) {
  namespace X = qvg::exact_sum;
  std::mt19937_64 rng(8);
  std::normal_distribution<float> nd;
  for (int round = 0; round < 3000; ++round) {
    const int64_t n = int64_t(rng() % 70);
    std::vector<float> v(static_cast<size_t>(n));
    const int scale = int(rng() % 120) - 100;
    for (auto& x : v) {
      const uint64_t kind = rng() % 10;
      x = kind == 0 ? 0.0f : kind == 1 ? std::ldexp(nd(rng), -140) : std::ldexp(nd(rng), scale + int(rng() % 40));
    }
    double m = 0;
    for (float x : v) m = double(x) * double(x) > m ? double(x) * double(x) : m;
    double want = 0;
    if (m > 0) {
      const int e = X::fixed_exponent(m, n);
      uint64_t q = 0;
      for (float x : v) q += X::fixed_term(double(x) * double(x), e);
      want = X::fixed_value(q, e);
    }
    const double got = X::energy_of([&v](int64_t i) { return v[size_t(i)]; }, n);
    ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "n " << n << " round " << round;
  }
}
