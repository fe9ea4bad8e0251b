// Tests of the PRQ codec (spec 1) against its contract: the error bound derived
// from stored scales, k-means properties, known byte layouts, determinism, limits.
#include <gtest/gtest.h>

#include <fmt/core.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "codec/encode_impl.h"
#include "codec/kmeans.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/numeric.h"
#include "support/codec_check.h"
#include "support/data.h"

namespace qvg {
namespace {

using testing::check_error_bound;
using testing::clustered_tensor;
using testing::random_tensor;
using testing::rel_mse;

bool small_scale() {
  const char* s = std::getenv("QVG_TEST_SCALE");
  return s && std::string(s) == "small";
}

void expect_within_bound(const Tensor& x, const EncodedTensor& enc, const std::string& what) {
  for (DType out : {x.dtype(), DType::F32}) {
    Tensor dec(out, x.shape());
    decode(enc, dec.view());
    auto rep = check_error_bound(x, enc, dec);
    EXPECT_EQ(rep.violations, 0) << what << " out=" << dtype_name(out) << ": " << rep.first;
    EXPECT_EQ(rep.non_finite, 0) << what;
  }
}

// ---- error bound over the parameter space ---------------------------------
struct BoundCase {
  int bits;
  bool asym;
  ScaleDType sd;
  Scaling sc;
  int stages;
  DType dt;
};

class CodecBound : public ::testing::TestWithParam<BoundCase> {};

TEST_P(CodecBound, RandomAndStructuredDataWithinBound) {
  const BoundCase c = GetParam();
  CodecConfig cfg;
  cfg.bits = c.bits;
  cfg.asymmetric = c.asym;
  cfg.scale_dtype = c.sd;
  cfg.scaling = c.sc;
  cfg.stages = c.stages;
  cfg.centroids = 16;
  cfg.block_size = 16;
  const Shape4 shape{2, small_scale() ? 40 : 150, 3, 32};
  for (int kind = 0; kind < 2; ++kind) {
    Tensor x = kind == 0 ? random_tensor(shape, c.dt, 1, 1.0f) : clustered_tensor(shape, c.dt, 2, 8, 100, 300);
    EncodedTensor enc = encode(x, cfg);
    EXPECT_NO_THROW(enc.validate());
    EXPECT_EQ(enc.nbytes(), EncodedTensor::predicted_nbytes(shape, c.dt, cfg));
    if (c.sc == Scaling::Compat && c.sd == ScaleDType::FP8_E4M3 && kind == 1) continue;  // saturates by design
    expect_within_bound(x, enc, kind == 0 ? "random" : "clustered");
  }
}

std::vector<BoundCase> bound_cases() {
  std::vector<BoundCase> v;
  for (int bits : {2, 3, 4})
    for (bool asym : {false, true})
      for (ScaleDType sd : {ScaleDType::FP8_E4M3, ScaleDType::BF16})
        for (Scaling sc : {Scaling::TwoLevel, Scaling::Compat})
          for (int stages : {1, 2}) v.push_back({bits, asym, sd, sc, stages, stages == 1 ? DType::BF16 : DType::F32});
  v.push_back({2, false, ScaleDType::FP8_E4M3, Scaling::TwoLevel, 1, DType::F16});
  v.push_back({4, true, ScaleDType::FP8_E4M3, Scaling::TwoLevel, 3, DType::F16});
  v.push_back({3, true, ScaleDType::FP8_E4M3, Scaling::TwoLevel, 3, DType::F16});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllModes, CodecBound, ::testing::ValuesIn(bound_cases()),
                         [](const ::testing::TestParamInfo<BoundCase>& i) {
                           const auto& c = i.param;
                           return "int" + std::to_string(c.bits) + (c.asym ? "_asym" : "_sym") + "_" +
                                  std::string(name(c.sd)) + "_" + std::string(name(c.sc)) + "_st" +
                                  std::to_string(c.stages) + "_" + std::string(dtype_name(c.dt));
                         });

RC_GTEST_PROP(CodecProperty, DecodedWithinBoundForRandomShapesAndConfigs, ()) {
  const int bits = *rc::gen::element(2, 3, 4);
  const int bsz = *rc::gen::element(8, 16, 32);  // a multiple of every width's code group
  const int64_t D = bsz * *rc::gen::inRange(1, 4);
  const int64_t S = *rc::gen::inRange(1, 60);
  const int64_t H = *rc::gen::inRange(1, 3);
  const int64_t B = *rc::gen::inRange(1, 3);
  CodecConfig cfg;
  cfg.bits = bits;
  cfg.block_size = bsz;
  cfg.centroids = *rc::gen::inRange(1, 40);
  cfg.stages = *rc::gen::inRange(1, 3);
  cfg.kmeans_iters = *rc::gen::inRange(1, 4);
  cfg.asymmetric = *rc::gen::arbitrary<bool>();
  cfg.scale_dtype = *rc::gen::element(ScaleDType::FP8_E4M3, ScaleDType::BF16);
  cfg.init = *rc::gen::element(Init::Random, Init::KMeansPlusPlus);
  cfg.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  const DType dt = *rc::gen::element(DType::BF16, DType::F16, DType::F32);
  const float mag = *rc::gen::element(1e-3f, 1.0f, 300.0f, 3000.0f);
  Tensor x = random_tensor({B, S, H, D}, dt, *rc::gen::inRange<uint64_t>(0, 1u << 30), mag, mag * 0.5f);
  EncodedTensor enc = encode(x, cfg);
  Tensor dec = decode(enc);
  auto rep = check_error_bound(x, enc, dec);
  RC_ASSERT(rep.violations == 0);
  for (const auto& ids : enc.ids)
    for (uint8_t id : ids) RC_ASSERT(int64_t(id) < std::min<int64_t>(cfg.centroids, S));
}

// ---- extreme blocks ----------------------------------------------------------
// Refinement layers (docs/spans.md): a layer is a valid f32 encoding of the base's
// decoding error, within spec 1.2's bound of that error; adding it (one rounding to
// the dtype) brings the tensor much closer; bad arguments are InvalidArgument.
TEST(Codec, RefinementLayerEncodesTheDecodingErrorWithinItsBound) {
  for (const DType dt : {DType::BF16, DType::F16, DType::F32}) {
    const Tensor x = clustered_tensor({2, 96, 3, 64}, dt, 5, 8, 3.0f, 2.0f, 0.3f);
    CodecConfig c;
    c.bits = 2;
    c.centroids = 16;
    const EncodedTensor base = encode(x, c);
    const Tensor dec = decode(base);
    for (const int bits : {2, 3, 4}) {
      const EncodedTensor layer = encode_refinement(x, dec, refinement_config(bits, 64, c.seed));
      EXPECT_NO_THROW(layer.validate());
      EXPECT_NO_THROW(layer.validate_values());
      EXPECT_EQ(layer.dtype, DType::F32);
      EXPECT_EQ(layer.bits, bits);
      EXPECT_EQ(layer.nbytes(), EncodedTensor::predicted_nbytes(x.shape(), DType::F32, refinement_config(bits, 64, 1)));
      // The layer against the error it encodes (x - dec in fp32).
      Tensor err(DType::F32, x.shape());
      for (int64_t i = 0; i < x.shape().numel(); ++i)
        static_cast<float*>(err.data())[i] = load_f32(x.data(), dt, size_t(i)) - load_f32(dec.data(), dt, size_t(i));
      const Tensor ld = decode(layer);
      const auto rep = check_error_bound(err, layer, ld);
      EXPECT_EQ(rep.violations, 0) << dtype_name(dt) << " bits " << bits << ": " << rep.first;
      // Added to a range of the decoded tensor (tokens 10..50, heads 1..3): exactly
      // round(dec + layer) there, the rest untouched.
      Tensor out = dec;
      const Shape4 sh = x.shape();
      add_refinement(layer, 10, 50, 1, 3,
                     {static_cast<std::byte*>(out.data()) + size_t((10 * sh.h + 1) * sh.d) * dtype_size(dt), dt,
                      sh.s * sh.h * sh.d, sh.h * sh.d},
                     1);
      size_t changed = 0;
      for (int64_t b = 0; b < sh.b; ++b)
        for (int64_t t = 0; t < sh.s; ++t)
          for (int64_t h = 0; h < sh.h; ++h)
            for (int64_t d = 0; d < sh.d; ++d) {
              const size_t i = size_t(((b * sh.s + t) * sh.h + h) * sh.d + d);
              const bool inside = t >= 10 && t < 50 && h >= 1;
              float want = load_f32(dec.data(), dt, i);
              if (inside) {
                const float sum = want + static_cast<const float*>(ld.data())[i];
                Tensor one(dt, {1, 1, 1, 1});
                convert_from_f32(&sum, dt, one.data(), 1);
                want = load_f32(one.data(), dt, 0);
              }
              const float got = load_f32(out.data(), dt, i);
              ASSERT_EQ(got, want) << dtype_name(dt) << " at " << b << "," << t << "," << h << "," << d;
              changed += got != load_f32(dec.data(), dt, i);
            }
      EXPECT_GT(changed, 0u);
      // The layer fused into the decode (DecodeTask::refinement): the same bytes as
      // decode_range followed by add_refinement, on every thread count.
      for (const int threads : {1, 2}) {
        Tensor fused = dec;
        std::memset(static_cast<std::byte*>(fused.data()), 0x5A, fused.nbytes() / 2);  // also overwritten bytes
        Tensor want = dec;
        std::memset(static_cast<std::byte*>(want.data()), 0x5A, want.nbytes() / 2);
        const auto target = [&](Tensor& t) {
          return DecodeTarget{static_cast<std::byte*>(t.data()) + size_t((10 * sh.h + 1) * sh.d) * dtype_size(dt), dt,
                              sh.s * sh.h * sh.d, sh.h * sh.d};
        };
        decode_range(base, 10, 50, 1, 3, target(want), threads);
        add_refinement(layer, 10, 50, 1, 3, target(want), threads);
        decode_ranges({DecodeTask{&base, 10, 50, 1, 3, target(fused), nullptr, &layer}}, threads);
        ASSERT_EQ(std::memcmp(fused.data(), want.data(), want.nbytes()), 0) << dtype_name(dt) << " bits " << bits;
      }
      // The whole tensor refined: its error well below the base's.
      Tensor full = dec;
      add_refinement(layer, 0, sh.s, 0, sh.h, {full.data(), dt, sh.s * sh.h * sh.d, sh.h * sh.d});
      const double e0 = rel_mse(x, dec), e1 = rel_mse(x, full);
      const double gain = bits == 4 ? 0.02 : bits == 3 ? 0.1 : 0.4;  // the layer's error shrinks with its qmax
      EXPECT_LT(e1, e0 * gain) << dtype_name(dt) << " bits " << bits << ": " << e0 << " -> " << e1;
    }
    // An error beyond the input limit (|x| near 1e16, decoded far off) is clamped, not
    // refused: a cache encodes layers after its state has changed.
    if (dt != DType::F16) {
      Tensor big(dt, {1, 4, 1, 64}), neg(dt, {1, 4, 1, 64});
      for (int64_t i = 0; i < 256; ++i) {
        const float v = (i % 2 ? 1 : -1) * 9.9e15f;
        convert_from_f32(&v, dt, static_cast<std::byte*>(big.data()) + size_t(i) * dtype_size(dt), 1);
        const float w = -v;
        convert_from_f32(&w, dt, static_cast<std::byte*>(neg.data()) + size_t(i) * dtype_size(dt), 1);
      }
      EncodedTensor l;
      ASSERT_NO_THROW(l = encode_refinement(big, neg, refinement_config(2, 64, 1)));
      EXPECT_NO_THROW(l.validate_values());
    }
    // Bad arguments.
    const Tensor other = random_tensor({2, 95, 3, 64}, dt, 1);
    EXPECT_THROW((void)encode_refinement(x, other, refinement_config(2, 64, 1)), InvalidArgument);
    CodecConfig two = refinement_config(2, 64, 1);
    two.centroids = 2;
    EXPECT_THROW((void)encode_refinement(x, dec, two), InvalidArgument);
    EXPECT_THROW((void)encode_refinement(x, dec, refinement_config(5, 64, 1)), InvalidArgument);  // no such width
    EXPECT_THROW((void)encode_refinement(x, dec, refinement_config(3, 60, 1)), InvalidArgument);  // int3 blocks: 8k
  }
}

// The CPU cache's refinement path (encode_refinement_of: each group decoded and its
// error encoded in one pass) against the definition — encode_refinement of the whole
// decoded tensor — bit for bit: whole encodings and span chunks (decoded with their
// span's codebook), one and two stages, every dtype, layer widths 2 and 4, one and two
// threads (fewer groups than threads included).
TEST(Codec, RefinementOfAnEncodingEqualsEncodeRefinementOfItsDecoding) {
  int checked = 0;
  for (const DType dt : {DType::BF16, DType::F16, DType::F32})
    for (const int stages : {1, 2})
      for (const bool span_chunk : {false, true}) {
        if (span_chunk && stages == 2) continue;
        const Tensor x = clustered_tensor({1, 70, 3, 64}, dt, 4, 6, 5.0f, 2.0f, 0.3f);
        CodecConfig c;
        c.bits = 2;
        c.centroids = 8;
        c.stages = stages;
        c.block_size = 32;
        c.asymmetric = stages == 1;
        EncodedTensor enc;
        std::optional<SpanCodebook> book;
        if (span_chunk) {
          book = SpanCodebook::empty(x.shape(), dt, c);
          (void)encode_span_chunk(clustered_tensor({1, 70, 3, 64}, dt, 9, 6, 5.0f, 2.0f, 0.3f), c, *book, 4);
          enc = encode_span_chunk(x, c, *book, 4);
        } else {
          enc = encode(x, c);
        }
        const EncodedTensor full = book ? with_codebook(enc, book->book) : enc;
        const Tensor dec = decode(full);
        for (const int bits : {2, 3, 4})
          for (const int threads : {1, 2, 8}) {
            const CodecConfig rc = refinement_config(bits, 32, 77, threads);
            const EncodedTensor want = encode_refinement(x, dec, rc);
            const EncodedTensor got = detail::encode_refinement_of(x, enc, book ? &book->book : nullptr, rc);
            ASSERT_TRUE(got == want) << dtype_name(dt) << " stages " << stages << " span " << span_chunk << " bits "
                                     << bits << " threads " << threads;
            ++checked;
          }
      }
  EXPECT_EQ(checked, 81);
  // Its argument checks.
  const Tensor x = random_tensor({1, 20, 2, 64}, DType::BF16, 3);
  CodecConfig c;
  c.centroids = 4;
  const EncodedTensor enc = encode(x, c);
  const Tensor other = random_tensor({1, 21, 2, 64}, DType::BF16, 3);
  EXPECT_THROW((void)detail::encode_refinement_of(other, enc, nullptr, refinement_config(2, 64, 1)), InvalidArgument);
  EXPECT_THROW((void)detail::encode_refinement_of(x, enc, nullptr, c), InvalidArgument);
}

TEST(Codec, ZeroTinyAndHugeBlocksDecodeFiniteWithinBound) {
  const Shape4 shape{1, 24, 1, 32};
  Tensor x(DType::F32, shape);
  for (int64_t s = 0; s < shape.s; ++s)
    for (int64_t d = 0; d < shape.d; ++d) {
      float v = 0.0f;
      int kind = int(s % 4);
      float sign = (d % 3 == 0) ? -1.0f : 1.0f;
      if (kind == 1) v = sign * 1e-12f * float(1 + d % 5);
      if (kind == 2) v = sign * 1e5f * float(1 + d % 7);
      if (kind == 3) v = sign * float(d % 4);
      x.set(0, s, 0, d, v);
    }
  for (bool asym : {false, true})
    for (int bits : {2, 3, 4})
      for (ScaleDType sd : {ScaleDType::FP8_E4M3, ScaleDType::BF16})
        for (Scaling sc : {Scaling::TwoLevel, Scaling::Compat}) {
          CodecConfig cfg;
          cfg.bits = bits;
          cfg.asymmetric = asym;
          cfg.block_size = 16;
          cfg.centroids = 2;
          cfg.scale_dtype = sd;
          cfg.scaling = sc;
          EncodedTensor enc = encode(x, cfg);
          for (DType out : {DType::F32, DType::BF16, DType::F16}) {
            Tensor dec(out, shape);
            decode(enc, dec.view());
            for (float f : dec.to_f32()) ASSERT_TRUE(std::isfinite(f)) << cfg.describe();
          }
          if (sc == Scaling::TwoLevel) expect_within_bound(x, enc, cfg.describe());
        }
}

TEST(Codec, UnderflowedScaleGivesSmallestMagnitudeCode) {
  // compat fp8: a block with absmax 1e-6 has s = 1e-6/7 which flushes to 0 in fp8.
  Tensor x(DType::F32, {1, 2, 1, 8});
  for (int d = 0; d < 8; ++d) {
    x.set(0, 0, 0, d, (d % 2 ? 1e-6f : -1e-6f));
    x.set(0, 1, 0, d, (d % 2 ? -1e-6f : 1e-6f));
  }
  CodecConfig cfg;
  cfg.bits = 4;
  cfg.block_size = 8;
  cfg.centroids = 1;
  cfg.scaling = Scaling::Compat;
  EncodedTensor enc = encode(x, cfg);
  EXPECT_EQ(enc.scale_eff(0, 0, 0, 0), 0.0f);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(enc.code_at(0, 0, 0, d), 7);  // q = 0
  cfg.asymmetric = true;
  enc = encode(x, cfg);
  EXPECT_EQ(enc.scale_eff(0, 0, 0, 0), 0.0f);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(enc.code_at(0, 0, 0, d), 0);
  Tensor dec = decode(enc);
  for (float f : dec.to_f32()) EXPECT_TRUE(std::isfinite(f));
}

TEST(Codec, Fp16OutputSaturates) {
  Tensor x(DType::F32, {1, 4, 1, 8});
  for (int s = 0; s < 4; ++s)
    for (int d = 0; d < 8; ++d) x.set(0, s, 0, d, (s % 2 ? -1.0f : 1.0f) * 1e6f);
  CodecConfig cfg;
  cfg.bits = 4;
  cfg.block_size = 8;
  cfg.centroids = 2;
  EncodedTensor enc = encode(x, cfg);
  Tensor dec(DType::F16, x.shape());
  decode(enc, dec.view());
  for (float f : dec.to_f32()) EXPECT_EQ(std::fabs(f), 65504.0f);
}

// ---- S < K, ids -----------------------------------------------------------------
TEST(Codec, FewerTokensThanCentroids) {
  Tensor x = random_tensor({2, 5, 2, 16}, DType::BF16, 3, 2.0f);
  CodecConfig cfg;
  cfg.bits = 2;
  cfg.block_size = 16;
  cfg.centroids = 16;
  cfg.stages = 2;
  for (Init init : {Init::Random, Init::KMeansPlusPlus}) {
    cfg.init = init;
    EncodedTensor enc = encode(x, cfg);
    for (const auto& ids : enc.ids)
      for (uint8_t id : ids) EXPECT_LT(id, 5);
    // Unused centroids are stored as zeros.
    for (int st = 0; st < 2; ++st)
      for (int64_t g = 0; g < 4; ++g)
        for (int64_t k = 5; k < 16; ++k)
          for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(enc.centroid_at(st, g / 2, g % 2, k, d), 0.0f);
    // Each token is its own centroid at stage 0: residual is the bf16 rounding only.
    expect_within_bound(x, enc, "S<K");
    Tensor dec = decode(enc);
    EXPECT_LT(rel_mse(x, dec), 1e-4);
  }
}

// ---- known byte layouts (compat), hand-computed ---------------------------------
// Two tokens x0 = c + delta, x1 = c - delta with c = [1..8]; K = 1 so the centroid
// is c exactly and the residuals are +-delta (multiples of 1/4: exact).
Tensor known_input() {
  const float delta[8] = {0.75f, -1.5f, 0.25f, 0.0f, 2.0f, -0.5f, 1.25f, -1.75f};
  Tensor x(DType::F32, {1, 2, 1, 8});
  for (int d = 0; d < 8; ++d) {
    x.set(0, 0, 0, d, float(d + 1) + delta[d]);
    x.set(0, 1, 0, d, float(d + 1) - delta[d]);
  }
  return x;
}

CodecConfig known_cfg(int bits, bool asym) {
  CodecConfig cfg;
  cfg.bits = bits;
  cfg.asymmetric = asym;
  cfg.block_size = 8;
  cfg.centroids = 1;
  cfg.scaling = Scaling::Compat;
  return cfg;
}

TEST(CodecLayout, Int4SymmetricCompat) {
  EncodedTensor e = encode(known_input(), known_cfg(4, false));
  // s = 2/7 = 0.2857 -> fp8 0.28125 = 1.125 * 2^-2 -> 0x29.
  EXPECT_EQ(e.scales, (std::vector<uint8_t>{0x29, 0x29}));
  EXPECT_EQ(e.codes, (std::vector<uint8_t>{0xA2, 0x87, 0xE5, 0xB1, 0x4C, 0x67, 0x09, 0x3D}));
  EXPECT_EQ(e.ids[0], (std::vector<uint8_t>{0, 0}));
  EXPECT_TRUE(e.zeros.empty());
  EXPECT_TRUE(e.scale_factor.empty());
  std::vector<float> c(8);
  convert_to_f32(e.centroid[0].data(), DType::F32, c.data(), 8);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(c[size_t(d)], float(d + 1));
  // Decoded = (code - 7) * 0.28125 + c.
  Tensor dec = decode(e);
  EXPECT_EQ(dec.at(0, 0, 0, 0), 1.0f + 3 * 0.28125f);
  EXPECT_EQ(dec.at(0, 1, 0, 4), 5.0f - 7 * 0.28125f);
}

TEST(CodecLayout, Int2SymmetricCompat) {
  EncodedTensor e = encode(known_input(), known_cfg(2, false));
  EXPECT_EQ(e.scales, (std::vector<uint8_t>{0x40, 0x40}));  // s = 2.0
  EXPECT_EQ(e.codes, (std::vector<uint8_t>{0x45, 0x98, 0x65, 0x12}));
}

// int3 (spec 1.5): 8 codes in 3 bytes, V = sum code[i] << (21 - 3i), most significant
// byte first. s = 2/3 -> fp8 0.6875 (1.375 * 2^-1: 0x33); q = round(delta / 0.6875) =
// 1 -2 0 0 3 -1 2 -3, codes q + 3 = 4 1 3 3 6 2 5 0 = 100 001 011 011 110 010 101 000;
// token 1 (-delta): codes 2 5 3 3 0 4 1 6 = 010 101 011 011 000 100 001 110.
TEST(CodecLayout, Int3SymmetricCompat) {
  EncodedTensor e = encode(known_input(), known_cfg(3, false));
  EXPECT_EQ(e.scales, (std::vector<uint8_t>{0x33, 0x33}));
  EXPECT_EQ(e.codes, (std::vector<uint8_t>{0x85, 0xBC, 0xA8, 0x55, 0xB1, 0x0E}));
  EXPECT_EQ(e.code_at(0, 0, 0, 4), 6);
  EXPECT_EQ(e.code_at(0, 0, 1, 7), 6);
  // Decoded = (code - 3) * 0.6875 + c.
  Tensor dec = decode(e);
  EXPECT_EQ(dec.at(0, 0, 0, 0), 1.0f + 0.6875f);
  EXPECT_EQ(dec.at(0, 1, 0, 4), 5.0f - 3 * 0.6875f);
  EXPECT_NO_THROW(e.validate_values());
  // A symmetric code above 2 * qmax (7 = 111) is refused, reported at its group's first
  // byte: bits 6-4 of byte 4 are V's bits 14-12, code 3 of token 1's group (bytes 3-5).
  e.codes[4] |= 0x70;
  try {
    e.validate_values();
    FAIL() << "accepted a symmetric int3 code 7";
  } catch (const CorruptData& err) {
    EXPECT_NE(std::string(err.what()).find("codes byte 3 holds a symmetric int3 code above 6"), std::string::npos)
        << err.what();
  }
}

// s = 3.75/7 = 0.5357 -> fp8 0.5625 (0x31); z = -1.75 (0xBE); codes round((delta + 1.75) /
// 0.5625) = 4 0 4 3 7 2 5 0 = 100 000 100 011 111 010 101 000.
TEST(CodecLayout, Int3AsymmetricCompat) {
  EncodedTensor e = encode(known_input(), known_cfg(3, true));
  EXPECT_EQ(e.scales[0], 0x31);
  EXPECT_EQ(e.zeros[0], 0xBE);
  EXPECT_EQ((std::vector<uint8_t>(e.codes.begin(), e.codes.begin() + 3)), (std::vector<uint8_t>{0x82, 0x3E, 0xA8}));
}

TEST(CodecLayout, Int4AsymmetricCompat) {
  EncodedTensor e = encode(known_input(), known_cfg(4, true));
  // s = 3.75/15 = 0.25 -> 0x28; z = -1.75 -> 0xBE; codes (delta + 1.75) / 0.25.
  EXPECT_EQ(e.scales[0], 0x28);
  EXPECT_EQ(e.zeros[0], 0xBE);
  EXPECT_EQ((std::vector<uint8_t>(e.codes.begin(), e.codes.begin() + 4)),
            (std::vector<uint8_t>{0xA1, 0x87, 0xF5, 0xC0}));
  // Token 1: residual -delta, min -2.0 -> z = 0xC0 (-2), s = 3.75/15 = 0.25.
  EXPECT_EQ(e.zeros[1], 0xC0);
  EXPECT_EQ(e.scales[1], 0x28);
}

TEST(CodecLayout, TwoLevelFactorAndBf16Scales) {
  CodecConfig cfg = known_cfg(4, false);
  cfg.scaling = Scaling::TwoLevel;
  EncodedTensor e = encode(known_input(), cfg);
  ASSERT_EQ(e.scale_factor.size(), 1u);
  EXPECT_EQ(e.scale_factor[0], (2.0f / 7.0f) / 448.0f);
  EXPECT_EQ(e.scales, (std::vector<uint8_t>{0x7E, 0x7E}));  // s / g = 448
  cfg.scale_dtype = ScaleDType::BF16;
  e = encode(known_input(), cfg);
  EXPECT_EQ(e.scale_factor, std::vector<float>{1.0f});
  const uint16_t s = f32_to_bf16(2.0f / 7.0f);
  EXPECT_EQ(e.scales, (std::vector<uint8_t>{uint8_t(s & 0xFF), uint8_t(s >> 8), uint8_t(s & 0xFF), uint8_t(s >> 8)}));
}

// ---- k-means -------------------------------------------------------------------
std::vector<float> group_points(const Tensor& x, int64_t b, int64_t h) {
  std::vector<float> p(static_cast<size_t>(x.shape().s * x.shape().d));
  for (int64_t s = 0; s < x.shape().s; ++s)
    for (int64_t d = 0; d < x.shape().d; ++d) p[size_t(s * x.shape().d + d)] = x.at(b, s, h, d);
  return p;
}

TEST(KMeans, ReferenceInertiaNeverIncreases) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (int kind = 0; kind < 2; ++kind) {
      Tensor x = kind ? clustered_tensor({1, 600, 1, 32}, DType::F32, seed, 12, 100, 300, 0.3f)
                      : random_tensor({1, 600, 1, 32}, DType::F32, seed, 1.0f, 50.0f);
      auto p = group_points(x, 0, 0);
      for (Init init : {Init::Random, Init::KMeansPlusPlus}) {
        detail::KMeansParams kp;
        kp.k = 32;
        kp.iters = 15;
        kp.init = init;
        kp.seed = seed;
        kp.path = detail::AssignPath::Reference;
        kp.record_inertia = true;
        auto r = detail::kmeans(p.data(), 600, 32, kp);
        ASSERT_GE(r.inertia.size(), 2u);
        for (size_t i = 1; i < r.inertia.size(); ++i)
          EXPECT_LE(r.inertia[i], r.inertia[i - 1] * (1 + 1e-6)) << "iteration " << i << " seed " << seed;
        for (uint8_t id : r.ids) EXPECT_LT(id, 32);
      }
    }
  }
}

TEST(KMeans, FastPathAgreesWithReference) {
  // Large offsets (V entries in the hundreds): the fast path must centre the group.
  Tensor x = clustered_tensor({1, 2000, 1, 64}, DType::F32, 5, 40, 20, 800, 0.5f);
  auto p = group_points(x, 0, 0);
  detail::KMeansParams kp;
  kp.k = 64;
  kp.iters = 10;
  kp.path = detail::AssignPath::Reference;
  auto ref = detail::kmeans(p.data(), 2000, 64, kp);
  kp.path = detail::AssignPath::Fast;
  auto fast = detail::kmeans(p.data(), 2000, 64, kp);
  int diff = 0;
  for (size_t i = 0; i < ref.ids.size(); ++i) diff += ref.ids[i] != fast.ids[i];
  EXPECT_LT(diff, 20) << "ids differing: " << diff << " of 2000";
  double ir = inertia_fp64(p.data(), 2000, ref.centroids.data(), 64, 64);
  double iff = inertia_fp64(p.data(), 2000, fast.centroids.data(), 64, 64);
  EXPECT_NEAR(iff / ir, 1.0, 1e-3);
}

// One centroid (a refinement layer's stage) has its own path (no centred copy, no
// assignment): its result equals the general Lloyd loop's — which runs when the
// inertia is recorded — bit for bit, for every init, iteration count and size.
TEST(KMeans, OneCentroidEqualsTheLloydLoop) {
  std::mt19937 rng(5);
  int checked = 0;
  for (const int64_t n : {1, 2, 7, 300})
    for (const int64_t dim : {1, 16, 72})
      for (const Init init : {Init::Random, Init::KMeansPlusPlus})
        for (const int iters : {1, 2, 5}) {
          std::vector<float> x(size_t(n * dim));
          std::normal_distribution<float> nd(3.0f, 7.0f);
          for (float& v : x) v = nd(rng) * (rng() % 4 == 0 ? 1e-30f : 1.0f);
          detail::KMeansParams p;
          p.k = 1;
          p.iters = iters;
          p.init = init;
          p.seed = 11;
          const detail::KMeansResult fast = detail::kmeans(x.data(), n, dim, p);
          p.record_inertia = true;  // the general loop
          const detail::KMeansResult loop = detail::kmeans(x.data(), n, dim, p);
          ASSERT_EQ(fast.centroids.size(), loop.centroids.size());
          for (size_t i = 0; i < fast.centroids.size(); ++i)
            ASSERT_EQ(f32_bits(fast.centroids[i]), f32_bits(loop.centroids[i])) << n << " " << dim << " " << i;
          ASSERT_EQ(fast.ids, loop.ids);
          ASSERT_EQ(fast.iterations, loop.iterations) << n << " " << dim << " " << iters;
          EXPECT_FALSE(fast.centred);
          ++checked;
        }
  EXPECT_EQ(checked, 72);
}

TEST(KMeans, EarlyStopAndIterationsReported) {
  // Two well-separated clusters: converges at once, stops before 20 iterations.
  Tensor x = clustered_tensor({1, 400, 2, 16}, DType::F32, 9, 2, 100, 0, 0.01f);
  CodecConfig cfg;
  cfg.centroids = 2;
  cfg.kmeans_iters = 20;
  cfg.block_size = 16;
  EncodeStats st;
  encode(x, cfg, nullptr, &st);
  for (int it : st.iterations[0]) {
    EXPECT_GE(it, 1);
    EXPECT_LT(it, 20);
  }
}

TEST(KMeans, WarmStartUsesPreviousCentroids) {
  Tensor a = clustered_tensor({1, 500, 2, 32}, DType::BF16, 4, 16, 50, 100);
  CodecConfig cfg;
  cfg.bits = 2;
  cfg.centroids = 16;
  cfg.block_size = 32;
  cfg.kmeans_iters = 1;
  cfg.stages = 2;
  EncodedTensor first = encode(a, cfg);
  cfg.init = Init::Warm;
  // Without previous centroids, warm falls back to random: identical to the first.
  EXPECT_EQ(encode(a, cfg), first);
  EncodedTensor warm = encode(a, cfg, &first);
  EXPECT_FALSE(warm == first);
  // One more Lloyd iteration from the previous result: error no larger.
  EXPECT_LE(rel_mse(a, decode(warm)), rel_mse(a, decode(first)) * 1.02);
  // Mismatched previous encoding is rejected.
  CodecConfig other = cfg;
  other.init = Init::Random;
  other.centroids = 8;
  EncodedTensor small = encode(a, other);
  EXPECT_THROW(encode(a, cfg, &small), InvalidArgument);
}

// ---- determinism ---------------------------------------------------------------
TEST(Codec, DeterministicAcrossThreadCounts) {
  Tensor x = clustered_tensor({2, 300, 3, 64}, DType::BF16, 6);
  CodecConfig cfg;
  cfg.bits = 2;
  cfg.centroids = 32;
  cfg.stages = 2;
  for (Init init : {Init::Random, Init::KMeansPlusPlus}) {
    cfg.init = init;
    cfg.threads = 1;
    EncodedTensor e1 = encode(x, cfg);
    for (int t : {2, 3, 5}) {
      cfg.threads = t;
      EXPECT_EQ(encode(x, cfg), e1) << "threads " << t;
    }
    Tensor d1(DType::BF16, x.shape()), d2(DType::BF16, x.shape());
    decode(e1, d1.view(), 1);
    decode(e1, d2.view(), 3);
    EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.nbytes()), 0);
    cfg.seed = 99;
    cfg.threads = 0;
    EXPECT_FALSE(encode(x, cfg) == e1) << "seed must matter";
    cfg.seed = 1234;
  }
}

// Fewer groups than threads: the k-means assignment is split over token blocks
// instead of groups; the bytes must not change.
TEST(Codec, DeterministicWithFewerGroupsThanThreads) {
  Tensor x = clustered_tensor({1, 3000, 1, 64}, DType::BF16, 7);
  CodecConfig cfg;
  cfg.bits = 4;
  cfg.centroids = 64;
  cfg.stages = 2;
  cfg.threads = 1;
  const EncodedTensor e1 = encode(x, cfg);
  for (int t : {2, 3, 4}) {
    cfg.threads = t;
    EXPECT_EQ(encode(x, cfg), e1) << "threads " << t;
  }
}

// Groups that do not divide among the threads (3 heads on 2 threads; 5 groups on 4):
// every encode of the recommended profile's paths gives the same bytes whatever the
// thread count: a whole encode (scale search, asymmetric, two-level), an incremental
// span's first and later chunk, its codebook, and a refinement layer.
TEST(Codec, DeterministicWhenGroupsDoNotDivideAmongThreads) {
  for (const int64_t heads : {3, 5}) {
    const Tensor x = clustered_tensor({1, 700, heads, 64}, DType::BF16, 9);
    const Tensor y = clustered_tensor({1, 700, heads, 64}, DType::BF16, 10);
    CodecConfig cfg;
    cfg.bits = 2;
    cfg.centroids = 32;
    cfg.block_size = 16;
    cfg.asymmetric = true;
    cfg.scaling = Scaling::TwoLevel;
    cfg.scale_search = ScaleSearch::Mse;
    const auto encodings = [&](int threads) {
      cfg.threads = threads;
      std::vector<EncodedTensor> out;
      out.push_back(encode(x.view(), cfg));
      SpanCodebook span = SpanCodebook::empty({1, 700, heads, 64}, DType::BF16, cfg);
      out.push_back(encode_span_chunk(x.view(), cfg, span, 16));
      out.push_back(encode_span_chunk(y.view(), cfg, span, 5));
      out.push_back(span.book);
      out.push_back(detail::encode_refinement_of(y.view(), out[2], &span.book, refinement_config(4, 16, 3, threads)));
      return out;
    };
    const std::vector<EncodedTensor> one = encodings(1);
    for (const int t : {2, 3, 4}) {
      const std::vector<EncodedTensor> many = encodings(t);
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_TRUE(many[i] == one[i]) << "heads " << heads << " threads " << t << " encoding " << i;
    }
  }
}

TEST(Codec, DecodeRangeMatchesFullDecode) {
  Tensor x = random_tensor({2, 700, 4, 32}, DType::BF16, 8);
  CodecConfig cfg;
  cfg.bits = 4;
  cfg.centroids = 8;
  cfg.block_size = 16;
  EncodedTensor e = encode(x, cfg);
  Tensor full = decode(e);
  const int64_t t0 = 13, t1 = 650, h0 = 1, h1 = 3, H = h1 - h0, D = 32;
  Tensor part(DType::BF16, {2, t1 - t0, H, D});
  decode_range(e, t0, t1, h0, h1, {part.data(), DType::BF16, (t1 - t0) * H * D, H * D});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t d = 0; d < D; ++d)
          ASSERT_EQ(f32_bits(part.at(b, t - t0, h - h0, d)), f32_bits(full.at(b, t, h, d)));
}

// ---- quality and size -------------------------------------------------------------
// Independent RTN: per token, per block absmax, round half away, no clustering.
double rtn_rel_mse(const Tensor& x, int bits, int bs) {
  const int qmax = (1 << (bits - 1)) - 1;
  auto f = x.to_f32();
  double num = 0, den = 0;
  const int64_t D = x.shape().d;
  for (size_t row = 0; row < f.size() / size_t(D); ++row)
    for (int64_t k = 0; k < D / bs; ++k) {
      float* p = f.data() + row * size_t(D) + size_t(k * bs);
      float a = 0;
      for (int i = 0; i < bs; ++i) a = std::max(a, std::fabs(p[i]));
      float s = std::max(a, 1e-10f) / float(qmax);
      for (int i = 0; i < bs; ++i) {
        float q = std::clamp(std::round(p[i] / s), -float(qmax), float(qmax)) * s;
        num += double(p[i] - q) * double(p[i] - q);
        den += double(p[i]) * double(p[i]);
      }
    }
  return num / den;
}

TEST(Codec, StructuredInt2FarBelowRtnAndExactBitsPerElement) {
  const int64_t S = small_scale() ? 1024 : 4096;
  Tensor x = clustered_tensor({1, S, 2, 128}, DType::BF16, 10, 64, 100, 300, 0.05f);
  CodecConfig cfg;
  cfg.bits = 2;
  cfg.centroids = 256;
  cfg.block_size = 64;
  EncodedTensor e = encode(x, cfg);
  Tensor dec = decode(e);
  const double ours = rel_mse(x, dec), rtn = rtn_rel_mse(x, 2, 64);
  std::printf("[ figures ] structured int2 K256 b64: rel_mse qvg %.3e, rtn %.3e, ratio rtn/qvg %.1f\n", ours, rtn,
              rtn / ours);
  EXPECT_LT(ours, rtn / 10);
  // Bits per element exactly as spec 1.5: per (b,h): K*D*2 bytes of bf16 centroids +
  // S ids + S*D/4 code bytes + S*D/64 fp8 scales, + 4 bytes of two_level factor.
  const double bytes = 2.0 * (256.0 * 128 * 2 + double(S) + double(S) * 128 / 4 + double(S) * 128 / 64 + 4);
  EXPECT_EQ(double(e.nbytes()), bytes);
  EXPECT_DOUBLE_EQ(e.bits_per_element(), bytes * 8 / double(2 * S * 128));
}

// ---- input limits and configuration errors -----------------------------------------
TEST(Codec, RejectsInputsPastLimits) {
  CodecConfig cfg;
  cfg.block_size = 8;
  for (float bad : {NAN, INFINITY, -INFINITY, 2e16f, -1e17f}) {
    Tensor x = random_tensor({1, 4, 1, 8}, DType::F32, 1);
    x.set(0, 2, 0, 5, bad);
    try {
      encode(x, cfg);
      FAIL() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("input must hold finite values with |x| <= 1e16"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("[0, 2, 0, 5]"), std::string::npos) << e.what();
    }
  }
  Tensor ok = random_tensor({1, 4, 1, 8}, DType::F32, 1);
  ok.set(0, 0, 0, 0, 1e16f * 0.99f);
  EXPECT_NO_THROW(encode(ok, cfg));
  Tensor x = random_tensor({1, 4, 1, 24}, DType::F32, 1);
  cfg.block_size = 16;
  EXPECT_THROW(encode(x, cfg), InvalidArgument);  // block_size does not divide D
  Tensor empty(DType::F32, {1, 0, 1, 16});
  EXPECT_THROW(encode(empty, cfg), InvalidArgument);
}

void expect_invalid(const CodecConfig& c, const std::string& needle) {
  try {
    c.validate();
    FAIL() << "accepted " << c.describe();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Config, CodecValidation) {
  CodecConfig c;
  c.bits = 5;
  expect_invalid(c,
                 "bits must be 2, 3 or 4 (or none to disable quantization), got 5");  // the widths of qvg/code_format.h
  c.bits = 3;
  EXPECT_NO_THROW(c.validate());
  c.block_size = 12;
  expect_invalid(c, "block_size must be a multiple of 8");  // int3's code group
  c = {};
  c.centroids = 0;
  expect_invalid(c, "centroids must be in 1..256, got 0");
  c.centroids = 257;
  expect_invalid(c, "got 257");
  c = {};
  c.block_size = 0;
  expect_invalid(c, "block_size must be > 0");
  c = {};
  c.stages = 0;
  expect_invalid(c, "stages must be in 1..64, got 0");
  c.stages = 65;  // the .qvgt format holds 1..64 stages: refused before any encoding
  expect_invalid(c, "stages must be in 1..64, got 65");
  c.stages = 64;
  EXPECT_NO_THROW(c.validate());
  c = {};
  c.threads = -1;
  expect_invalid(c, fmt::format("threads must be in 0..{}", max_threads()));
  c.threads = max_threads() + 1;
  expect_invalid(c, fmt::format("got {}", max_threads() + 1));
  c.threads = max_threads();
  EXPECT_NO_THROW(c.validate());
  c = {};
  c.kmeans_iters = -1;
  expect_invalid(c, "kmeans_iters must be > 0, got -1");
  c = {};
  c.bits = 2;
  c.block_size = 6;
  expect_invalid(c, "block_size must be a multiple of 4");
  c = {};
  c.block_size = 48;
  EXPECT_THROW(c.validate_for_head_dim(128), InvalidArgument);
  EXPECT_NO_THROW(c.validate_for_head_dim(96));
}

TEST(Config, EngineFlags) {
  EXPECT_FALSE(QuantArgs::from_flags({}).enabled());
  // Without the master flag nothing else is read (spec 2).
  QuantArgs none = QuantArgs::from_flags({{"kv_cache_quant_centroids", "300"}, {"kv_cache_quant_bogus", "x"}});
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.codec.centroids, 128);
  EXPECT_NO_THROW(QuantArgs::from_flags({{"kv_cache_quant", "int4"}, {"kv_cache_quant_config", "{}"}}));
  for (const char* off : {"off", "none", "bf16"})
    EXPECT_FALSE(QuantArgs::from_flags({{"kv_cache_quant", off}}).enabled());
  QuantArgs a = QuantArgs::from_flags({{"kv_cache_quant", "int2"},
                                       {"kv_cache_quant_centroids", "256"},
                                       {"kv_cache_quant_block_size", "16"},
                                       {"kv_cache_quant_stages", "2"},
                                       {"kv_cache_quant_iters", "4"},
                                       {"kv_cache_quant_keep_recent", "2"},
                                       {"kv_cache_quant_sink_keep", "1"},
                                       {"kv_cache_quant_asymmetric", "true"},
                                       {"kv_cache_quant_sink", "false"},
                                       {"kv_cache_quant_sink_span", "full"},
                                       {"other_flag", "ignored"}});
  EXPECT_TRUE(a.enabled());
  EXPECT_EQ(a.codec.bits, 2);
  EXPECT_EQ(a.codec.centroids, 256);
  EXPECT_EQ(a.codec.block_size, 16);
  EXPECT_EQ(a.codec.stages, 2);
  EXPECT_EQ(a.codec.kmeans_iters, 4);
  EXPECT_EQ(a.keep_recent_chunks, 2);
  EXPECT_EQ(a.sink_keep_chunks, 1);
  EXPECT_TRUE(a.codec.asymmetric);
  EXPECT_FALSE(a.sink);
  EXPECT_EQ(a.sink_span, SinkSpan::Full);
  QuantArgs d = QuantArgs::from_flags({{"kv_cache_quant", "int4"}});
  EXPECT_EQ(d.codec.centroids, 128);
  EXPECT_EQ(d.codec.block_size, 64);
  EXPECT_EQ(d.keep_recent_chunks, 1);
  EXPECT_TRUE(d.sink);
  EXPECT_EQ(d.sink_span, SinkSpan::Chunk);

  auto bad = [](std::map<std::string, std::string> f, const std::string& needle) {
    try {
      QuantArgs::from_flags(f);
      FAIL() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad({{"kv_cache_quant", "int5"}}, "kv_cache_quant must be one of off, none, bf16, int2, int3 or int4, got 'int5'");
  bad({{"kv_cache_quant", "3"}}, "kv_cache_quant must be one of off, none, bf16, int2, int3 or int4, got '3'");
  // int3: qvg's extension, a row of qvg/code_format.h (block sizes a multiple of 8).
  EXPECT_EQ(QuantArgs::from_flags({{"kv_cache_quant", "int3"}}).codec.bits, 3);
  EXPECT_EQ(QuantArgs::from_flags({{"kv_cache_quant", "int3"}}).describe().substr(0, 20), "kv_cache_quant=int3 ");
  bad({{"kv_cache_quant", "int3"}, {"kv_cache_quant_block_size", "36"}}, "block_size must be a multiple of 8");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_centroids", "0"}}, "centroids must be in 1..256, got 0");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_centroids", "300"}}, "got 300");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_block_size", "-64"}}, "block_size must be > 0");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_stages", "0"}}, "stages must be in 1..64, got 0");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_stages", "65"}}, "stages must be in 1..64, got 65");
  bad({{"kv_cache_quant", "off"}, {"kv_cache_quant_stages", "1000"}}, "stages must be in 1..64, got 1000");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_iters", "0"}}, "kmeans_iters must be > 0");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_keep_recent", "-1"}}, "keep_recent_chunks must be >= 0, got -1");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_sink_keep", "-2"}}, "sink_keep_chunks must be >= 0, got -2");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_sink_span", "half"}}, "sink_span must be one of chunk, full");
  bad({{"kv_cache_quant", "int2"}, {"kv_cache_quant_block_size", "6"}}, "block_size must be a multiple of 4");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_span_chunks", "0"}}, "span_chunks must be >= 1, got 0");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_bogus", "1"}}, "unknown flag 'kv_cache_quant_bogus'");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_refine_recent", "2"}},
      "refine_recent must be 0 unless span_mode is incremental");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_span_mode", "incremental"}, {"kv_cache_quant_refine_bits", "8"}},
      "refine_bits must be 2, 3 or 4, got 8");
  {
    const QuantArgs r = QuantArgs::from_flags({{"kv_cache_quant", "int2"},
                                               {"kv_cache_quant_span_mode", "incremental"},
                                               {"kv_cache_quant_refine_recent", "4"},
                                               {"kv_cache_quant_refine_bits", "2"}});
    EXPECT_EQ(r.refine_recent, 4);
    EXPECT_EQ(r.refine_bits, 2);
    EXPECT_NE(r.describe().find(" refine_recent=4 refine_bits=2"), std::string::npos) << r.describe();
  }
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_centroids", "12x"}}, "must be an integer, got '12x'");
  // A negative seed is refused, not wrapped to 2^64 - 5 (docs/reliability.md, finding 9).
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_seed", "-5"}},
      "kv_cache_quant_seed must be an integer in 0..2^64-1, got '-5'");
  bad({{"kv_cache_quant", "int4"}, {"kv_cache_quant_seed", "18446744073709551616"}}, "got '18446744073709551616'");
  EXPECT_EQ(
      QuantArgs::from_flags({{"kv_cache_quant", "int4"}, {"kv_cache_quant_seed", "18446744073709551615"}}).codec.seed,
      UINT64_MAX);
  QuantArgs h = QuantArgs::from_flags({{"kv_cache_quant", "int4"}, {"kv_cache_quant_block_size", "48"}});
  EXPECT_THROW(h.validate_for_head_dim(128), InvalidArgument);
  QuantArgs bits;
  bits.enable(3);
  EXPECT_NO_THROW(bits.validate());
  bits.enable(5);
  EXPECT_THROW(bits.validate(), InvalidArgument);
}

}  // namespace
}  // namespace qvg
