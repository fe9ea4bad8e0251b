// Tests of the baseline quantizers (include/qvg/eval/baselines.h): exact byte counts,
// each format's own error bound derived from the stored scales, the orthonormal
// Hadamard rotation, and typed errors.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <random>

#include "qvg/error.h"
#include "qvg/eval/baselines.h"
#include "qvg/numeric.h"
#include "support/data.h"

namespace qvg {
namespace {

/// testing::random_tensor (normal(0, scale) + offset) in f32 with channel d/3 of every
/// row scaled 6x (an outlier channel, as in real K/V), then rounded to dt.
Tensor outlier_tensor(Shape4 s, DType dt, uint64_t seed, float scale = 1.0f, float offset = 0.0f) {
  Tensor t = testing::random_tensor(s, DType::F32, seed, scale, offset);
  float* p = static_cast<float*>(t.data());
  for (int64_t r = 0; r < s.b * s.s * s.h; ++r) p[r * s.d + (s.d / 3)] *= 6.0f;
  return dt == DType::F32 ? t : t.to(dt);
}

/// Half an ulp of `v` in dtype dt (0 for f32 output, where only fp32 arithmetic adds error).
double half_ulp(float v, DType dt) {
  if (dt == DType::F32) return 0.0;
  const int mant = dt == DType::BF16 ? 7 : 10;
  const double a = std::max(std::fabs(double(v)), dt == DType::BF16 ? 1e-38 : 6.1e-5);
  return std::ldexp(1.0, int(std::floor(std::log2(a))) - mant - 1);
}

/// Few fp32 ulps of the decode arithmetic for values of magnitude m.
double fp32_slack(double m) {
  return 4.0 * std::ldexp(1.0, -23) * (std::fabs(m) + 1e-30);
}

/// Checks |x - x'| <= s_eff / 2 per element for RTN and KIVI (both roles).
void check_elementwise_bound(BaselineMethod m, TensorRole role, const Tensor& x, const BaselineConfig& cfg) {
  RoundTrip rt = baseline_roundtrip(m, x, role, cfg);
  ASSERT_EQ(rt.decoded.dtype(), x.dtype());
  ASSERT_EQ(rt.decoded.shape(), x.shape());
  const Shape4 s = x.shape();
  const int64_t nblk = s.d / cfg.block_size, G = cfg.kivi_group_tokens, ng = (s.s + G - 1) / G;
  const bool kivi_key = m == BaselineMethod::KIVI && role == TensorRole::Key;
  int64_t checked = 0;
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t t = 0; t < s.s; ++t)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t d = 0; d < s.d; ++d) {
          const size_t si = kivi_key ? size_t(((b * s.h + h) * ng + t / G) * s.d + d)
                                     : size_t(((b * s.s + t) * s.h + h) * nblk + d / cfg.block_size);
          const double se = rt.scale.at(si);
          ASSERT_GT(se, 0.0);
          const double xv = x.at(b, t, h, d), yv = rt.decoded.at(b, t, h, d);
          const double z = rt.zero.empty() ? 0.0 : rt.zero.at(si);
          if (m == BaselineMethod::KIVI) {
            // The grid covers the group: z_eff <= x <= z_eff + qmax * s_eff.
            const int qmax = (1 << cfg.bits) - 1;
            ASSERT_LE(z, xv);
            ASSERT_GE(z + qmax * se + fp32_slack(z + qmax * se), xv);
          }
          const double bound = se / 2 + fp32_slack(std::fabs(xv) + std::fabs(z) + se) + half_ulp(float(yv), x.dtype());
          ASSERT_LE(std::fabs(xv - yv), bound) << name(m) << " " << name(role) << " at (" << b << "," << t << "," << h
                                               << "," << d << ") x=" << xv << " x'=" << yv << " s_eff=" << se;
          ++checked;
        }
  EXPECT_EQ(checked, s.numel());
}

TEST(Baselines, ExactByteCounts) {
  const Shape4 s{1, 10, 2, 64};
  BaselineConfig cfg;
  cfg.bits = 2;
  cfg.block_size = 32;
  cfg.kivi_group_tokens = 4;
  // codes: 1280 elements * 2 bits = 320 bytes.
  // RTN / QuaRot: 10 tokens * 2 heads * 2 blocks * 2 bytes = 80.
  EXPECT_EQ(baseline_nbytes(BaselineMethod::RTN, s, TensorRole::Key, cfg), 400u);
  EXPECT_EQ(baseline_nbytes(BaselineMethod::QuaRot, s, TensorRole::Value, cfg), 400u);
  // KIVI K: ceil(10/4) = 3 groups * 2 heads * 64 channels * (2 + 2) bytes = 1536.
  EXPECT_EQ(baseline_nbytes(BaselineMethod::KIVI, s, TensorRole::Key, cfg), 320u + 1536u);
  // KIVI V: 40 blocks * 4 bytes = 160.
  EXPECT_EQ(baseline_nbytes(BaselineMethod::KIVI, s, TensorRole::Value, cfg), 480u);

  cfg.bits = 4;
  cfg.block_size = 64;
  // 1280 * 4 / 8 = 640 codes; 20 blocks * 2 = 40.
  EXPECT_EQ(baseline_nbytes(BaselineMethod::RTN, s, TensorRole::Value, cfg), 680u);

  Tensor x = outlier_tensor(s, DType::BF16, 3);
  for (BaselineMethod m : all_baseline_methods())
    for (TensorRole r : {TensorRole::Key, TensorRole::Value}) {
      RoundTrip rt = baseline_roundtrip(m, x, r, cfg);
      EXPECT_EQ(rt.nbytes, baseline_nbytes(m, s, r, cfg));
      EXPECT_DOUBLE_EQ(rt.bits_per_element, double(rt.nbytes) * 8.0 / 1280.0);
    }
  // The usual operating point: int2, block 64, head_dim 128 costs 2 + 16/64 bits per element.
  cfg.bits = 2;
  RoundTrip rt =
      baseline_roundtrip(BaselineMethod::RTN, outlier_tensor({1, 8, 1, 128}, DType::F32, 4), TensorRole::Key, cfg);
  EXPECT_DOUBLE_EQ(rt.bits_per_element, 2.25);
}

TEST(Baselines, RtnAndKiviMeetTheirBounds) {
  for (int bits : {2, 3, 4, 8})
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      BaselineConfig cfg;
      cfg.bits = bits;
      cfg.block_size = 32;
      cfg.kivi_group_tokens = 7;  // 23 tokens: groups of 7, 7, 7, 2
      Tensor x = outlier_tensor({2, 23, 3, 64}, dt, uint64_t(bits * 10) + uint64_t(dt), 3.0f, 0.5f);
      SCOPED_TRACE(::testing::Message() << "bits " << bits << " dtype " << dtype_name(dt));
      check_elementwise_bound(BaselineMethod::RTN, TensorRole::Key, x, cfg);
      check_elementwise_bound(BaselineMethod::KIVI, TensorRole::Key, x, cfg);
      check_elementwise_bound(BaselineMethod::KIVI, TensorRole::Value, x, cfg);
    }
}

TEST(Baselines, LargeOffsetsStayWithinTheGrid) {
  // V entries in the hundreds with a small spread: a nearest-rounded bf16 zero could
  // sit above the minimum by more than s/2; the rounded-down zero may not.
  Tensor x = outlier_tensor({1, 40, 2, 64}, DType::F32, 9, 0.05f, 301.3f);
  BaselineConfig cfg;
  cfg.bits = 4;
  cfg.kivi_group_tokens = 16;
  check_elementwise_bound(BaselineMethod::KIVI, TensorRole::Key, x, cfg);
  check_elementwise_bound(BaselineMethod::KIVI, TensorRole::Value, x, cfg);
  check_elementwise_bound(BaselineMethod::RTN, TensorRole::Value, x, cfg);
}

TEST(Baselines, ZeroBlocksDecodeToZero) {
  Tensor x(DType::BF16, {1, 3, 1, 64});
  for (BaselineMethod m : all_baseline_methods()) {
    RoundTrip rt = baseline_roundtrip(m, x, TensorRole::Key, BaselineConfig{});
    for (float v : rt.decoded.to_f32()) EXPECT_EQ(v, 0.0f) << name(m);
  }
}

TEST(Baselines, HadamardIsOrthonormal) {
  for (int64_t d : {1, 2, 8, 64, 128, 256}) {
    // Rows of H_d / sqrt(d): rotate the identity.
    std::vector<float> m(static_cast<size_t>(d * d), 0.0f);
    for (int64_t i = 0; i < d; ++i) m[size_t(i * d + i)] = 1.0f;
    hadamard_rotate(m.data(), d, d);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        EXPECT_NEAR(std::fabs(m[size_t(i * d + j)]), 1.0 / std::sqrt(double(d)), 1e-6);
        double dot = 0;
        for (int64_t k = 0; k < d; ++k) dot += double(m[size_t(i * d + k)]) * m[size_t(j * d + k)];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << "d=" << d << " rows " << i << "," << j;
      }
    }
    // Symmetric: applying it twice is the identity.
    hadamard_rotate(m.data(), d, d);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(m[size_t(i * d + j)], i == j ? 1.0 : 0.0, 1e-5);
  }
  float v[3] = {1, 2, 3};
  EXPECT_THROW(hadamard_rotate(v, 1, 3), InvalidArgument);
}

TEST(Baselines, QuaRotMeetsItsBoundInTheRotatedBasis) {
  for (int bits : {2, 4, 8}) {
    BaselineConfig cfg;
    cfg.bits = bits;
    cfg.block_size = 32;
    const Shape4 s{1, 17, 2, 128};
    Tensor x = outlier_tensor(s, DType::F32, 77, 2.0f, -1.0f);
    RoundTrip rt = baseline_roundtrip(BaselineMethod::QuaRot, x, TensorRole::Value, cfg);
    EXPECT_TRUE(rt.zero.empty());
    const int64_t nblk = s.d / cfg.block_size;
    for (int64_t t = 0; t < s.s; ++t)
      for (int64_t h = 0; h < s.h; ++h) {
        double err2 = 0, bound2 = 0, norm2 = 0;
        for (int64_t d = 0; d < s.d; ++d) {
          const double e = double(x.at(0, t, h, d)) - rt.decoded.at(0, t, h, d);
          err2 += e * e;
          norm2 += double(x.at(0, t, h, d)) * x.at(0, t, h, d);
        }
        for (int64_t k = 0; k < nblk; ++k) {
          const double se = rt.scale.at(size_t((t * s.h + h) * nblk + k));
          bound2 += double(cfg.block_size) * (se / 2) * (se / 2);
        }
        EXPECT_LE(std::sqrt(err2), std::sqrt(bound2) + 1e-5 * std::sqrt(norm2)) << "bits " << bits;
      }
  }
}

TEST(Baselines, QuaRotAtHighBitsIsNearlyIdentity) {
  BaselineConfig cfg;
  cfg.bits = 8;
  Tensor x = outlier_tensor({1, 32, 2, 128}, DType::F32, 5);
  RoundTrip rt = baseline_roundtrip(BaselineMethod::QuaRot, x, TensorRole::Key, cfg);
  double e = 0, n = 0;
  for (int64_t t = 0; t < 32; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 128; ++d) {
        const double a = x.at(0, t, h, d), b = rt.decoded.at(0, t, h, d);
        e += (a - b) * (a - b);
        n += a * a;
      }
  // int8 with absmax scales: relative MSE ~ 1e-5; a non-orthonormal rotation would be far off.
  EXPECT_LT(e / n, 1e-4);
}

TEST(Baselines, RotationHelpsAgainstChannelOutliers) {
  // One huge channel per head: RTN's block absmax is ruled by it, the rotation spreads it.
  BaselineConfig cfg;
  cfg.bits = 4;
  Tensor x = outlier_tensor({1, 64, 2, 128}, DType::F32, 8);
  for (int64_t t = 0; t < 64; ++t)
    for (int64_t h = 0; h < 2; ++h) x.set(0, t, h, 5, 80.0f + x.at(0, t, h, 5));
  auto mse = [&](BaselineMethod m) {
    RoundTrip rt = baseline_roundtrip(m, x, TensorRole::Key, cfg);
    double e = 0;
    std::vector<float> a = x.to_f32(), b = rt.decoded.to_f32();
    for (size_t i = 0; i < a.size(); ++i) e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    return e;
  };
  EXPECT_LT(mse(BaselineMethod::QuaRot), mse(BaselineMethod::RTN));
  // KIVI's per-channel key scales isolate the outlier channel entirely.
  EXPECT_LT(mse(BaselineMethod::KIVI), mse(BaselineMethod::RTN));
}

TEST(Baselines, NamesRoundTrip) {
  for (BaselineMethod m : all_baseline_methods()) EXPECT_EQ(parse_baseline_method(name(m)), m);
  EXPECT_EQ(name(BaselineMethod::KIVI), "kivi");
  try {
    parse_baseline_method("gptq");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gptq"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("rtn, kivi, quarot"), std::string::npos);
  }
  EXPECT_THROW(parse_baseline_method("RTN"), InvalidArgument);
}

TEST(Baselines, TypedErrors) {
  Tensor x = outlier_tensor({1, 4, 1, 96}, DType::F32, 1);
  BaselineConfig cfg;
  cfg.block_size = 32;
  EXPECT_NO_THROW(baseline_roundtrip(BaselineMethod::RTN, x, TensorRole::Key, cfg));
  // 96 is not a power of two.
  try {
    baseline_roundtrip(BaselineMethod::QuaRot, x, TensorRole::Key, cfg);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos);
  }
  BaselineConfig bad = cfg;
  bad.bits = 5;
  EXPECT_THROW(baseline_roundtrip(BaselineMethod::RTN, x, TensorRole::Key, bad), InvalidArgument);
  bad = cfg;
  bad.block_size = 64;  // does not divide 96
  EXPECT_THROW(baseline_roundtrip(BaselineMethod::KIVI, x, TensorRole::Value, bad), InvalidArgument);
  bad = cfg;
  bad.bits = 2;
  bad.block_size = 2;  // 2 * 2 bits do not fill a byte
  EXPECT_THROW(bad.validate(), InvalidArgument);
  bad = cfg;
  bad.kivi_group_tokens = 0;
  EXPECT_THROW(baseline_roundtrip(BaselineMethod::KIVI, x, TensorRole::Key, bad), InvalidArgument);
  x.set(0, 2, 0, 7, std::nanf(""));
  EXPECT_THROW(baseline_roundtrip(BaselineMethod::RTN, x, TensorRole::Key, cfg), InvalidArgument);
  Tensor empty(DType::F32, {1, 0, 1, 32});
  EXPECT_THROW(baseline_roundtrip(BaselineMethod::RTN, empty, TensorRole::Key, cfg), InvalidArgument);
  EXPECT_THROW(baseline_nbytes(BaselineMethod::RTN, {1, 0, 1, 32}, TensorRole::Key, cfg), InvalidArgument);
}

RC_GTEST_PROP(Baselines, BoundsHoldForRandomShapes, ()) {
  const int bits = *rc::gen::element(2, 4, 8);
  const int bs = *rc::gen::element(8, 16, 32);
  const int64_t d = bs * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t s = *rc::gen::inRange<int64_t>(1, 20);
  const int64_t h = *rc::gen::inRange<int64_t>(1, 3);
  const float scale = *rc::gen::element(1e-3f, 1.0f, 500.0f);
  BaselineConfig cfg;
  cfg.bits = bits;
  cfg.block_size = bs;
  cfg.kivi_group_tokens = *rc::gen::inRange(1, 9);
  Tensor x = outlier_tensor({1, s, h, d}, *rc::gen::element(DType::F32, DType::BF16), *rc::gen::arbitrary<uint32_t>(),
                            scale, scale * *rc::gen::inRange(-3, 4));
  check_elementwise_bound(BaselineMethod::RTN, TensorRole::Value, x, cfg);
  check_elementwise_bound(BaselineMethod::KIVI, TensorRole::Key, x, cfg);
  check_elementwise_bound(BaselineMethod::KIVI, TensorRole::Value, x, cfg);
  RC_ASSERT(!::testing::Test::HasFailure());
}

}  // namespace
}  // namespace qvg
