// Golden digests: the `.qvgt` bytes (and decoded bytes) of fixed inputs encoded
// with fixed configurations must never change by accident (spec 1.6: a `/1` file
// stays byte for byte as it is). The encoder runs on the SCALAR Highway target so
// that the bytes do not depend on which SIMD target this CPU dispatches to (fast
// assignment paths may pick other near-tie ids on other targets, spec 1.1).
//
// The digests were recorded before the library was split into its layers and must stay
// equal after any change that claims to keep file formats and output bytes. A
// deliberate format change updates them in the same commit and says so. The two
// kmeans++ cases were recorded again when kmeans++ drew its picks from exact,
// order-independent integer sums (spec 1.1; core/exact_sum_impl.h) instead of a
// sequential fp64 total: other picks, so other bytes.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "kernels/kernels.h"
#include "qvg/codec.h"
#include "qvg/io.h"
#include "qvg/tensor.h"

namespace qvg {
namespace {

/// The input: a per-(head, channel) offset (V-like, up to ~40) plus a few clustered
/// patterns and noise, from a test-local LCG (independent of qvg's own PRNGs).
Tensor golden_input(DType dt, Shape4 s, uint64_t seed) {
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&]() {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return double(st >> 11) * 0x1.0p-53;  // [0, 1)
  };
  std::vector<double> offset(size_t(s.h * s.d));
  for (auto& o : offset) o = (next() - 0.5) * 80.0;
  std::vector<double> pattern(size_t(4 * s.d));
  for (auto& p : pattern) p = (next() - 0.5) * 6.0;
  Tensor t(dt, s);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t i = 0; i < s.s; ++i)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t c = int64_t(next() * 4.0);
        for (int64_t d = 0; d < s.d; ++d)
          t.set(b, i, h, d,
                float(offset[size_t(h * s.d + d)] + pattern[size_t(c * s.d + d)] + (next() - 0.5) * 1.5));
      }
  return t;
}

struct GoldenCase {
  std::string name;
  DType dtype;
  Shape4 shape;
  CodecConfig cfg;
  bool warm_chain = false;  ///< encode a first tensor, then this one warm-started from it
  uint64_t qvgt_digest;     ///< XXH64 (seed 0) of serialize_qvgt
  uint64_t decode_digest;   ///< XXH64 (seed 0) of the decoded tensor's bytes
};

CodecConfig cfg_of(int bits, int k, int block, int stages, int iters, bool asym, ScaleDType sd, Scaling sc,
                   Init init) {
  CodecConfig c;
  c.bits = bits;
  c.centroids = k;
  c.block_size = block;
  c.stages = stages;
  c.kmeans_iters = iters;
  c.asymmetric = asym;
  c.scale_dtype = sd;
  c.scaling = sc;
  c.init = init;
  c.seed = 4321;
  return c;
}

const std::vector<GoldenCase>& cases() {
  using SD = ScaleDType;
  using SC = Scaling;
  static const std::vector<GoldenCase> v = {
      {"bf16_int2_sym_fp8_two_level",
       DType::BF16,
       {1, 300, 3, 64},
       cfg_of(2, 32, 32, 1, 2, false, SD::FP8_E4M3, SC::TwoLevel, Init::Random),
       false,
       0x089d2e7954bd2510,
       0xd9cac20a96cb70b4},
      {"bf16_int4_asym_bf16_compat_2stages",
       DType::BF16,
       {1, 300, 3, 64},
       cfg_of(4, 16, 64, 2, 3, true, SD::BF16, SC::Compat, Init::Random),
       false,
       0xfcb24f4d669fb9d4,
       0x842d4f2e36850dc7},
      {"f32_int4_asym_fp8_two_level_kmeanspp",
       DType::F32,
       {2, 150, 2, 64},
       cfg_of(4, 64, 64, 1, 4, true, SD::FP8_E4M3, SC::TwoLevel, Init::KMeansPlusPlus),
       false,
       0xbb8e42cc73350a2e,
       0x14f1545378f70982},
      {"f16_int2_sym_fp8_compat_k256",
       DType::F16,
       {1, 300, 2, 64},
       cfg_of(2, 256, 16, 1, 3, false, SD::FP8_E4M3, SC::Compat, Init::Random),
       false,
       0xb79ebdb465b4ae7c,
       0xa32641f171601d35},
      {"bf16_int2_warm_chain",
       DType::BF16,
       {1, 200, 2, 128},
       cfg_of(2, 64, 64, 2, 2, false, SD::FP8_E4M3, SC::TwoLevel, Init::Warm),
       true,
       0x74bcd3daf4a98d67,
       0x8f4f718529f8ddad},
      {"bf16_int4_tokens_below_centroids",
       DType::BF16,
       {2, 20, 2, 64},
       cfg_of(4, 128, 32, 1, 2, false, SD::FP8_E4M3, SC::TwoLevel, Init::Random),
       false,
       0x12fdf86a5a140d7f,
       0xb8c74b61667fc986},
  };
  return v;
}

/// The lowest target compiled in and supported (SCALAR or EMU128 with Highway).
int64_t scalar_target() {
  const auto t = kernels::available_targets();
  return t.back().id;
}

uint64_t digest(const void* p, size_t n) { return XXH64(p, n, 0); }

void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

class Golden : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override { kernels::force_target(scalar_target()); }
  void TearDown() override { kernels::force_target(0); }
};

TEST_P(Golden, QvgtAndDecodedBytesAreUnchanged) {
  const GoldenCase& gc = GetParam();
  const std::string target = kernels::current_target_name();
  ASSERT_TRUE(target == "SCALAR" || target == "EMU128") << "forced target is " << target;
  const Tensor x = golden_input(gc.dtype, gc.shape, 7);
  EncodedTensor enc;
  if (gc.warm_chain) {
    const Tensor first = golden_input(gc.dtype, gc.shape, 8);
    CodecConfig c0 = gc.cfg;
    const EncodedTensor prev = encode(first.view(), c0);  // warm without centroids: random
    enc = encode(x.view(), gc.cfg, &prev);
  } else {
    enc = encode(x.view(), gc.cfg);
  }
  const std::vector<uint8_t> file = serialize_qvgt(enc);
  const Tensor dec = decode(enc);
  const uint64_t fd = digest(file.data(), file.size()), dd = digest(dec.data(), dec.nbytes());
  EXPECT_EQ(fd, gc.qvgt_digest) << fmt::format("{}: .qvgt digest 0x{:016x} ({} bytes)", gc.name, fd, file.size());
  EXPECT_EQ(dd, gc.decode_digest) << fmt::format("{}: decode digest 0x{:016x}", gc.name, dd);
  // The file reads back to the same encoding (the digest covers a valid file).
  EXPECT_TRUE(parse_qvgt(file) == enc) << gc.name;
}

INSTANTIATE_TEST_SUITE_P(Fixed, Golden, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& i) { return i.param.name; });

// int3 (a qvg extension): the encoding's arrays (every array of
// EncodingLayout::arrays(), in that order, digested as one stream) and the decoded
// bytes. The `.qvgt` container of an int3 encoding carries a raised format version
// (spec 1.6) written by src/io; these digests pin the encoder's and decoder's bytes
// independently of it. Recorded when int3 was added; the int2/int4
// digests above are unchanged by it.
struct GoldenArraysCase {
  std::string name;
  DType dtype;
  Shape4 shape;
  CodecConfig cfg;
  int layer_bits = 0;      ///< > 0: digest the refinement layer of that width of cfg's decoding instead
  uint64_t arrays_digest;  ///< XXH64 (seed 0) of the arrays' bytes, in layout order
  uint64_t decode_digest;  ///< XXH64 (seed 0) of the decoded tensor's bytes
};

const std::vector<GoldenArraysCase>& int3_cases() {
  using SD = ScaleDType;
  using SC = Scaling;
  static const std::vector<GoldenArraysCase> v = {
      {"bf16_int3_sym_fp8_two_level",
       DType::BF16,
       {1, 300, 3, 64},
       cfg_of(3, 32, 32, 1, 2, false, SD::FP8_E4M3, SC::TwoLevel, Init::Random),
       0,
       0xead31d20d5d25af8,
       0xca695539713fd344},
      {"bf16_int3_asym_bf16_compat_2stages",
       DType::BF16,
       {1, 300, 3, 64},
       cfg_of(3, 16, 64, 2, 3, true, SD::BF16, SC::Compat, Init::Random),
       0,
       0x6ce90836fa1125e1,
       0x19df7c2ef29c32ad},
      {"f32_int3_asym_fp8_two_level_kmeanspp_block8",
       DType::F32,
       {2, 150, 2, 64},
       cfg_of(3, 64, 8, 1, 4, true, SD::FP8_E4M3, SC::TwoLevel, Init::KMeansPlusPlus),
       0,
       0xacb4b9a8f90ac024,
       0xaa7587ce458f9655},
      {"f16_int3_sym_fp8_compat_d40",
       DType::F16,
       {1, 200, 2, 40},
       cfg_of(3, 256, 8, 1, 3, false, SD::FP8_E4M3, SC::Compat, Init::Random),
       0,
       0xeace81bfd0e09582,
       0xc7f1ea51cca279eb},
      {"bf16_int2_base_int3_layer",
       DType::BF16,
       {1, 200, 2, 64},
       cfg_of(2, 32, 32, 1, 2, false, SD::FP8_E4M3, SC::TwoLevel, Init::Random),
       3,
       0x96b5fe96fb671674,
       0xd759070cc44a1e62},
  };
  return v;
}

void PrintTo(const GoldenArraysCase& c, std::ostream* os) {
  *os << c.name;
}

uint64_t arrays_digest(const EncodedTensor& e) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const ArrayDesc& a : e.arrays()) {
    const std::span<const uint8_t> b = e.array(a);
    XXH64_update(st, b.data(), b.size());
  }
  const uint64_t d = XXH64_digest(st);
  XXH64_freeState(st);
  return d;
}

class GoldenInt3 : public ::testing::TestWithParam<GoldenArraysCase> {
 protected:
  void SetUp() override { kernels::force_target(scalar_target()); }
  void TearDown() override { kernels::force_target(0); }
};

TEST_P(GoldenInt3, ArraysAndDecodedBytesAreUnchanged) {
  const GoldenArraysCase& gc = GetParam();
  const Tensor x = golden_input(gc.dtype, gc.shape, 7);
  EncodedTensor enc = encode(x.view(), gc.cfg);
  if (gc.layer_bits > 0) {
    const Tensor dec = decode(enc);
    enc = encode_refinement(x.view(), dec.view(), refinement_config(gc.layer_bits, gc.cfg.block_size, gc.cfg.seed));
  }
  ASSERT_EQ(enc.bits, gc.layer_bits > 0 ? gc.layer_bits : 3);
  const Tensor dec = decode(enc);
  const uint64_t ad = arrays_digest(enc), dd = digest(dec.data(), dec.nbytes());
  EXPECT_EQ(ad, gc.arrays_digest) << fmt::format("{}: arrays digest 0x{:016x} ({} bytes)", gc.name, ad, enc.nbytes());
  EXPECT_EQ(dd, gc.decode_digest) << fmt::format("{}: decode digest 0x{:016x}", gc.name, dd);
}

INSTANTIATE_TEST_SUITE_P(Fixed, GoldenInt3, ::testing::ValuesIn(int3_cases()),
                         [](const ::testing::TestParamInfo<GoldenArraysCase>& i) { return i.param.name; });

// The scale search (ScaleSearch::Mse): every block's choice among its candidates is
// stored, so the encoding's arrays pin the search's rule (the candidates, the errors'
// bits, the first least one). Recorded before the search's errors were computed many
// blocks per call; equal after it. Cases span the widths, both scalings and scale
// formats, symmetric and asymmetric, blocks of 8-64 and a group's block count below and
// above the encoder's tile of 64 blocks.
const std::vector<GoldenArraysCase>& scale_search_cases() {
  using SD = ScaleDType;
  using SC = Scaling;
  const auto mse = [](CodecConfig c) {
    c.scale_search = ScaleSearch::Mse;
    return c;
  };
  static const std::vector<GoldenArraysCase> v = {
      {"bf16_int2_asym_fp8_two_level_mse",
       DType::BF16,
       {1, 300, 3, 128},
       mse(cfg_of(2, 32, 64, 1, 2, true, SD::FP8_E4M3, SC::TwoLevel, Init::Random)),
       0,
       0xbf7bfeb1b3ffdc0e,
       0x165aec6e3e5ddc72},
      {"bf16_int4_sym_bf16_compat_mse",
       DType::BF16,
       {1, 120, 2, 64},
       mse(cfg_of(4, 16, 32, 2, 2, false, SD::BF16, SC::Compat, Init::Random)),
       0,
       0x27cbba66c35a59d8,
       0xf51d75f1fedb6f95},
      {"f32_int3_asym_fp8_two_level_block8_mse",
       DType::F32,
       {2, 50, 2, 64},
       mse(cfg_of(3, 16, 8, 1, 2, true, SD::FP8_E4M3, SC::TwoLevel, Init::Random)),
       0,
       0x3101a44a6bc7f5a0,
       0x54ebbfb1fb42a1ab},
      {"f16_int2_sym_fp8_compat_few_blocks_mse",
       DType::F16,
       {1, 7, 2, 32},
       mse(cfg_of(2, 4, 16, 1, 2, false, SD::FP8_E4M3, SC::Compat, Init::Random)),
       0,
       0xf2b78b8df0aaf6a4,
       0x84d302b7984f5d71},
  };
  return v;
}

class GoldenScaleSearch : public GoldenInt3 {};

TEST_P(GoldenScaleSearch, ArraysAndDecodedBytesAreUnchanged) {
  const GoldenArraysCase& gc = GetParam();
  const Tensor x = golden_input(gc.dtype, gc.shape, 9);
  const EncodedTensor enc = encode(x.view(), gc.cfg);
  const Tensor dec = decode(enc);
  const uint64_t ad = arrays_digest(enc), dd = digest(dec.data(), dec.nbytes());
  EXPECT_EQ(ad, gc.arrays_digest) << fmt::format("{}: arrays digest 0x{:016x} ({} bytes)", gc.name, ad, enc.nbytes());
  EXPECT_EQ(dd, gc.decode_digest) << fmt::format("{}: decode digest 0x{:016x}", gc.name, dd);
}

INSTANTIATE_TEST_SUITE_P(Fixed, GoldenScaleSearch, ::testing::ValuesIn(scale_search_cases()),
                         [](const ::testing::TestParamInfo<GoldenArraysCase>& i) { return i.param.name; });

}  // namespace
}  // namespace qvg
