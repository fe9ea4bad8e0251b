// Every SIMD target that runs here against the scalar references of
// src/kernels/ref/ref.h: decode bit for bit (spec 1.3), bf16 conversions
// exhaustively, the encoder's kernels bit for bit, the input-limit scan, k-means
// assignment by agreement (spec 1.1), and the encoder per target (deterministic,
// MSE within 1 percent).
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "codec/decode_impl.h"
#include "codec/encode_impl.h"
#include "codec/kmeans.h"
#include "core/residual_impl.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "perf/perf.h"
#include "qvg/code_format.h"
#include "qvg/codec.h"
#include "qvg/numeric.h"
#include "support/codec_check.h"
#include "support/data.h"

namespace qvg {
namespace {

class PerTarget : public ::testing::TestWithParam<kernels::Target> {
 protected:
  void SetUp() override { kernels::force_target(GetParam().id); }
  void TearDown() override { kernels::force_target(0); }
};

std::string target_label(const ::testing::TestParamInfo<kernels::Target>& i) {
  std::string s = i.param.name;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// The targets this CPU runs, best first: several of them (every attainable one is
// compiled), each distinct, in Highway's order (a lower bit is a better target), each
// dispatchable when forced, the best one by default, and each present exactly when
// the CPU has its features (x86: SSE4 = SSE4.2 + AES/CLMUL, AVX2 = AVX2 + FMA + BMI2,
// AVX3 = AVX-512 F/VL/DQ/BW), the portable fallback always.
TEST(Targets, SeveralCompiledAndDispatchable) {
  auto t = kernels::available_targets();
  ASSERT_GE(t.size(), 2u);
  std::set<std::string> names;
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_TRUE(names.insert(t[i].name).second) << "listed twice: " << t[i].name;
    EXPECT_EQ(t[i].id & (t[i].id - 1), 0) << t[i].name << " is not one target";
    if (i > 0) {
      EXPECT_LT(t[i - 1].id, t[i].id) << t[i - 1].name << " before " << t[i].name << ": not best first";
    }
  }
  EXPECT_EQ(kernels::current_target_name(), t.front().name);  // the best one by default
  for (const auto& x : t) {
    kernels::force_target(x.id);
    EXPECT_EQ(kernels::current_target_name(), x.name);
  }
  kernels::force_target(0);
  EXPECT_EQ(kernels::current_target_name(), t.front().name);
  EXPECT_TRUE(names.count("EMU128") || names.count("SCALAR")) << "no portable target";
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool sse4 =
      __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
  const bool avx2 =
      sse4 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
  const bool avx3 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  EXPECT_EQ(names.count("SSE4") == 1, sse4);
  EXPECT_EQ(names.count("AVX2") == 1, avx2);
  EXPECT_EQ(names.count("AVX3") == 1, avx3);
#endif
  std::printf("[ targets ] best: %s; available:", kernels::current_target_name().c_str());
  for (const auto& x : t) std::printf(" %s", x.name.c_str());
  std::printf("\n");
}

TEST_P(PerTarget, Bf16ConversionsExhaustive) {
  // Every bf16 code round-trips; every fp32 tie and neighbour rounds like the scalar reference.
  std::vector<float> f;
  std::vector<uint16_t> codes;
  for (uint32_t c = 0; c < 65536; ++c) {
    codes.push_back(uint16_t(c));
    const uint32_t base = c << 16;
    for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) f.push_back(f32_from_bits(base | low));
  }
  std::vector<uint16_t> got(f.size()), want(f.size());
  kernels::f32_to_bf16(f.data(), got.data(), f.size());
  kernels::ref::f32_to_bf16(f.data(), want.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    if (std::isnan(f[i])) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(got[i])));
    }
    ASSERT_EQ(got[i], want[i]) << "input bits " << std::hex << f32_bits(f[i]);  // NaN payloads too
  }
  std::vector<float> back(codes.size()), back_ref(codes.size());
  kernels::bf16_to_f32(codes.data(), back.data(), codes.size());
  kernels::ref::bf16_to_f32(codes.data(), back_ref.data(), codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    ASSERT_EQ(f32_bits(back[i]), uint32_t(codes[i]) << 16);
    ASSERT_EQ(f32_bits(back[i]), f32_bits(back_ref[i]));
  }
}

struct DecodeCase {
  int bits;
  bool asym;
  ScaleDType sd;
  Scaling sc;
  int stages;
  int64_t block, dim;
};

TEST_P(PerTarget, DecodeBitIdenticalToScalarReference) {
  std::vector<DecodeCase> cases;
  for (int bits : {2, 4})
    for (bool asym : {false, true})
      for (ScaleDType sd : {ScaleDType::FP8_E4M3, ScaleDType::BF16})
        for (int64_t block : {8, 16, 64})
          for (int64_t dim : {64, 72, 128}) {
            if (dim % block) continue;
            cases.push_back({bits, asym, sd, Scaling::TwoLevel, 1 + int(dim % 3), block, dim});
          }
  cases.push_back({4, false, ScaleDType::FP8_E4M3, Scaling::Compat, 2, 32, 96});
  cases.push_back({2, false, ScaleDType::FP8_E4M3, Scaling::TwoLevel, 1, 4, 12});  // dim below one vector
  // int3 (8 codes in 3 bytes): every block size, dims that are and are not a multiple
  // of the vector (24, 40, 72: the generic path on 16-lane targets, the vector path on
  // 8-lane ones), both scalings.
  for (bool asym : {false, true})
    for (ScaleDType sd : {ScaleDType::FP8_E4M3, ScaleDType::BF16})
      for (Scaling sc : {Scaling::TwoLevel, Scaling::Compat})
        for (int64_t block : {8, 16, 32, 64})
          for (int64_t dim : {24, 40, 64, 72, 128}) {
            if (dim % block) continue;
            cases.push_back({3, asym, sd, sc, 1 + int((dim / 8) % 3), block, dim});
          }
  for (const auto& c : cases) {
    CodecConfig cfg;
    cfg.bits = c.bits;
    cfg.asymmetric = c.asym;
    cfg.scale_dtype = c.sd;
    cfg.scaling = c.sc;
    cfg.stages = c.stages;
    cfg.block_size = int(c.block);
    cfg.centroids = 8;
    Tensor x = testing::clustered_tensor({1, 37, 2, c.dim}, DType::BF16, 3, 4, 50, 200, 0.2f);
    EncodedTensor enc = encode(x, cfg);
    for (DType out : {DType::BF16, DType::F32, DType::F16}) {
      Tensor a(out, x.shape()), b(out, x.shape());
      decode(enc, a.view());  // dispatched kernel
      // Scalar reference, group by group.
      for (int64_t g = 0; g < 2; ++g) {
        std::vector<std::vector<float>> cent(size_t(cfg.stages));
        std::vector<const float*> cp;
        std::vector<const uint8_t*> ip;
        for (int st = 0; st < cfg.stages; ++st) {
          cent[size_t(st)].resize(size_t(8 * c.dim));
          convert_to_f32(enc.centroid[size_t(st)].data() + size_t(g * 8 * c.dim) * 2, DType::BF16,
                         cent[size_t(st)].data(), cent[size_t(st)].size());
          cp.push_back(cent[size_t(st)].data());
          ip.push_back(enc.ids[size_t(st)].data() + g * 37);
        }
        kernels::DecodeRows j = detail::rows_job(enc, g, 0, 37);
        j.ids = ip.data();
        j.centroids = cp.data();
        j.out = static_cast<uint8_t*>(b.data()) + size_t(g * c.dim) * dtype_size(out);
        j.out_dtype = out;
        j.out_token_stride = 2 * c.dim;
        kernels::ref::decode_rows(j);
      }
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0)
          << cfg.describe() << " dim " << c.dim << " out " << dtype_name(out) << " target " << GetParam().name;
    }
  }
}

// What one rep of crafted decode jobs decodes: the encoding's width, asymmetry, scale
// format, blocks, dim and stages, and its refinement layer (layer_bits 0: none).
struct CraftedPlan {
  int bits;
  bool asym;
  ScaleDType sd;
  int64_t block, dim;
  int stages;
  int layer_bits;
  ScaleDType layer_sd;
  int64_t layer_block;
};

// Decode jobs built by hand so that the fp32 values hit every class the bf16
// rounding treats differently: exact zeros of both signs, denormals (which the
// native AVX512-BF16 conversion flushes, so the kernel must route them through the
// integer path), normals, values near the top of the range, and rounding ties.
// The dispatched target, with the native conversion allowed and forbidden, against
// the scalar reference, bit for bit; rep r decodes plan(r). Random code bytes: every
// code value of every width, the symmetric all-ones code included.
void check_crafted_decodes(uint32_t seed, int reps, const std::function<CraftedPlan(int)>& plan,
                           const std::string& target) {
  std::mt19937 rng(seed);
  const float magnitudes[] = {0.0f, 1e-41f, 3e-39f, 1e-20f, 3e-7f, 4e-5f, 1.0f, 65510.0f, 3e5f, 1e30f};
  for (bool allow : {true, false}) {
    kernels::allow_native_bf16(allow);
    for (int rep = 0; rep < reps; ++rep) {
      const CraftedPlan pl = plan(rep);
      kernels::DecodeRows j;
      j.bits = pl.bits;
      j.asymmetric = pl.asym;
      j.scale_dtype = pl.sd;
      j.block = pl.block;
      j.dim = pl.dim;
      j.stages = pl.stages;
      j.count = 1 + int64_t(rng() % 40);
      const float fac[] = {1.0f, 1e-38f, 1e-45f, 0.5f};
      j.scale_factor = fac[rng() % 4];
      j.zero_factor = fac[rng() % 4];
      const int64_t D = j.dim, nb = D / j.block, K = 5;
      const size_t esz = j.scale_dtype == ScaleDType::BF16 ? 2 : 1;
      std::vector<uint8_t> codes(size_t(j.count * D * j.bits / 8)), scales(size_t(j.count * nb) * esz),
          zeros(scales.size());
      for (auto& c : codes) c = uint8_t(rng());
      for (size_t i = 0; i < scales.size(); ++i) {
        // Finite stored values only (fp8 0x7F/0xFF and bf16 exponent 0xFF are NaN/Inf); some zero.
        auto pick = [&]() {
          uint8_t b = uint8_t(rng() % 5 == 0 ? 0 : rng());
          if (esz == 1 && (b & 0x7F) == 0x7F) b = 0x7E;
          return b;
        };
        scales[i] = pick();
        zeros[i] = pick();
        if (esz == 2 && i % 2 == 1) {
          scales[i] &= 0x3F;  // high byte of a bf16 value: exponent well below 0xFF
          zeros[i] = uint8_t(zeros[i] & 0x3F) | uint8_t(rng() % 2 ? 0x80 : 0);
        }
      }
      std::vector<std::vector<float>> cent(size_t(j.stages), std::vector<float>(size_t(K * D)));
      for (auto& cs : cent)
        for (auto& v : cs) {
          const float m = magnitudes[rng() % 10];
          v = (rng() % 2 ? -m : m) * (1.0f + float(rng() % 1000) / 1000.0f);
          if (rng() % 7 == 0) v = f32_from_bits((f32_bits(v) & 0xFFFF0000u) | 0x8000u);  // a bf16 tie
        }
      std::vector<std::vector<uint8_t>> ids(size_t(j.stages), std::vector<uint8_t>(size_t(j.count)));
      for (auto& is : ids)
        for (auto& v : is) v = uint8_t(rng() % K);
      std::vector<const float*> cp;
      std::vector<const uint8_t*> ip;
      for (int st = 0; st < j.stages; ++st) {
        cp.push_back(cent[size_t(st)].data());
        ip.push_back(ids[size_t(st)].data());
      }
      j.codes = codes.data();
      j.scales = scales.data();
      j.zeros = j.asymmetric ? zeros.data() : nullptr;
      j.ids = ip.data();
      j.centroids = cp.data();
      // A refinement layer (fused into the same pass): its own width, its scales'
      // format, its blocks (the job's, or another size: the generic path), a centroid
      // row of every magnitude class.
      kernels::RefineRows layer;
      std::vector<uint8_t> rcodes, rscales;
      std::vector<float> rcent(static_cast<size_t>(D));
      if (pl.layer_bits != 0) {
        layer.bits = pl.layer_bits;
        layer.scale_dtype = pl.layer_sd;
        layer.block = pl.layer_block;
        layer.scale_factor = fac[rng() % 4];
        const size_t resz = layer.scale_dtype == ScaleDType::BF16 ? 2 : 1;
        rcodes.resize(size_t(j.count * D * layer.bits / 8));
        rscales.resize(size_t(j.count * (D / layer.block)) * resz);
        for (auto& c : rcodes) c = uint8_t(rng());
        for (size_t i = 0; i < rscales.size(); ++i) {
          rscales[i] = uint8_t(rng() % 5 == 0 ? 0 : rng());
          if (resz == 1 && (rscales[i] & 0x7F) == 0x7F) rscales[i] = 0x7E;
          if (resz == 2 && i % 2 == 1) rscales[i] &= 0x3F;
        }
        for (auto& v : rcent) {
          const float m = magnitudes[rng() % 10];
          v = (rng() % 2 ? -m : m) * (1.0f + float(rng() % 1000) / 1000.0f);
        }
        layer.codes = rcodes.data();
        layer.scales = rscales.data();
        layer.centroid = rcent.data();
        j.refine = &layer;
      }
      for (DType out : {DType::BF16, DType::F32, DType::F16}) {
        const int64_t stride = D + 32 * (rep % 2);  // dense rows and rows inside a wider view
        const size_t es = dtype_size(out);
        // 64-byte aligned buffers so the streaming-store path is taken where it exists.
        std::vector<uint8_t> a_buf(size_t(j.count * stride) * es + 64, 0xAB), b_buf(a_buf.size(), 0xAB);
        auto align = [](std::vector<uint8_t>& v) {
          const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
          return v.data() + ((64 - p % 64) % 64);
        };
        j.out_dtype = out;
        j.out_token_stride = stride;
        uint8_t* a = align(a_buf);
        uint8_t* b = align(b_buf);
        j.out = a;
        kernels::decode_rows(j);
        j.out = b;
        kernels::ref::decode_rows(j);
        ASSERT_EQ(std::memcmp(a, b, size_t(j.count * stride) * es), 0)
            << "rep " << rep << " bits " << j.bits << " asym " << j.asymmetric << " block " << j.block << " dim " << D
            << " stages " << j.stages << " out " << dtype_name(out) << " native " << allow << " layer "
            << (j.refine ? layer.bits : 0) << " layer block " << (j.refine ? layer.block : 0) << " target " << target;
      }
    }
  }
  kernels::allow_native_bf16(true);
}

// int2 and int4 encodings; two reps in three with a layer of width 2 or 4.
TEST_P(PerTarget, DecodeCraftedValuesBitIdentical) {
  check_crafted_decodes(
      11, 300,
      [](int rep) {
        CraftedPlan p;
        p.bits = rep % 2 ? 2 : 4;
        p.asym = (rep / 2) % 2;
        p.sd = (rep / 4) % 2 ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
        p.block = int64_t(16) << (rep % 3);  // 16, 32, 64
        p.dim = p.block * (1 + rep % 4);
        p.stages = 1 + (rep / 3) % 2;
        p.layer_bits = rep % 3 != 0 ? (rep % 5 < 3 ? 4 : 2) : 0;
        p.layer_sd = rep % 7 == 0 ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
        p.layer_block = rep % 11 == 0 && p.block > 16 ? p.block / 2 : p.block;
        return p;
      },
      GetParam().name);
  std::printf("[ native bf16 ] AVX512-BF16 on this CPU: %s (used by the AVX3 targets only)\n",
              kernels::native_bf16_available() ? "yes" : "no");
}

// int3 (qvg/code_format.h): int3 encodings with no layer or a layer of width 2, 3 or 4, and
// int2/int4 encodings with an int3 layer; blocks of 8 to 64 channels (int3's group is
// 8), dims of 1 to 4 blocks (8, 24, 40, ...: not multiples of the vector), one to
// three stages, both scale formats, symmetric and asymmetric, the layer's blocks the
// job's or half of them. Every combination the plan draws is checked to occur.
TEST_P(PerTarget, DecodeInt3CraftedValuesBitIdentical) {
  std::set<std::string> seen;
  const auto plan = [&](int rep) {
    std::mt19937 r(uint32_t(1000 + rep));
    CraftedPlan p;
    const int kind = rep % 6;  // 0-3: int3 with no layer / layer 2 / 3 / 4; 4, 5: int2 / int4 with layer 3
    p.bits = kind < 4 ? 3 : kind == 4 ? 2 : 4;
    p.layer_bits = kind < 4 ? std::array<int, 4>{0, 2, 3, 4}[size_t(kind)] : 3;
    p.asym = r() % 2;
    p.sd = r() % 2 ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
    p.block = int64_t(8) << (r() % 4);  // 8, 16, 32, 64
    p.dim = p.block * int64_t(1 + r() % 4);
    p.stages = p.layer_bits ? 1 + int(r() % 3 == 0) : 1 + int(r() % 3);
    p.layer_sd = r() % 4 == 0 ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
    p.layer_block = r() % 4 == 0 && p.block >= 16 ? p.block / 2 : p.block;
    seen.insert(fmt::format("{}/{}", p.bits, p.layer_bits));
    seen.insert(fmt::format("int{} block {}", p.bits, p.block));
    seen.insert(fmt::format("int{} asym {} sd {}", p.bits, p.asym, int(p.sd)));
    return p;
  };
  check_crafted_decodes(12, 360, plan, GetParam().name);
  for (const char* want : {"3/0", "3/2", "3/3", "3/4", "2/3", "4/3"}) EXPECT_TRUE(seen.count(want)) << want;
  for (int b : {8, 16, 32, 64}) EXPECT_TRUE(seen.count(fmt::format("int3 block {}", b))) << b;
  for (int asym : {0, 1})
    for (int sd : {0, 1}) EXPECT_TRUE(seen.count(fmt::format("int3 asym {} sd {}", asym == 1, sd))) << asym << sd;
}

// The encoder kernels against their scalar references (ref.h), bit for bit,
// on values chosen to hit rounding ties, signed zeros, zero scales and
// quotients that overflow to infinity.
TEST_P(PerTarget, EncoderKernelsMatchScalarDefinitions) {
  std::mt19937 rng(21);
  auto value = [&]() {
    switch (rng() % 8) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return float(int(rng() % 15) - 7) * 0.5f;  // exact halves: ties after division by 1 or 0.5
      case 3: return f32_from_bits(uint32_t(rng() % 0x800000u));  // denormal
      case 4: return 3e38f * (rng() % 2 ? 1.0f : -1.0f);
      default: return std::normal_distribution<float>(0.0f, 3.0f)(rng);
    }
  };
  for (int rep = 0; rep < 200; ++rep) {
    const int64_t block = int64_t(4) << (rep % 5), nb = 1 + rep % 3, dim = block * nb;
    const int64_t count = 1 + int64_t(rng() % 9);
    std::vector<float> x(static_cast<size_t>(count * dim));
    for (auto& v : x) v = value();
    // Block maxima and minima.
    const size_t nblk = size_t(count * nb);
    std::vector<float> amax(nblk), lo(nblk), hi(nblk), amax_ref(nblk), lo_ref(nblk), hi_ref(nblk);
    kernels::block_absmax(x.data(), count * nb, block, amax.data());
    kernels::block_minmax(x.data(), count * nb, block, lo.data(), hi.data());
    kernels::ref::block_absmax(x.data(), count * nb, block, amax_ref.data());
    kernels::ref::block_minmax(x.data(), count * nb, block, lo_ref.data(), hi_ref.data());
    for (size_t b = 0; b < nblk; ++b) {
      ASSERT_EQ(f32_bits(amax[b]), f32_bits(amax_ref[b])) << "block " << b;
      ASSERT_EQ(f32_bits(lo[b]), f32_bits(lo_ref[b])) << "block " << b;
      ASSERT_EQ(f32_bits(hi[b]), f32_bits(hi_ref[b])) << "block " << b;
    }
    // Quantize and pack.
    const float scales[] = {0.0f, 1.0f, 0.5f, 1e-30f, 0.37f, 2.5f};
    std::vector<float> se(static_cast<size_t>(count * nb)), ze(se.size());
    for (auto& v : se) v = scales[rng() % 6];
    for (auto& v : ze) v = value();
    for (const CodeFormat& f : kCodeFormats)
      for (bool asym : {false, true}) {
        if (block % f.group_codes != 0) continue;  // a block fills whole code groups
        const int bits = f.bits;
        const int64_t cb = code_bytes(f, dim);
        std::vector<uint8_t> got(static_cast<size_t>(count * cb)), want(got.size(), 0xAB);
        kernels::quantize_rows(x.data(), count, dim, block, bits, asym, se.data(), ze.data(), got.data());
        kernels::ref::quantize_rows(x.data(), count, dim, block, bits, asym, se.data(), ze.data(), want.data());
        ASSERT_EQ(got, want) << "rep " << rep << " bits " << bits << " asym " << asym << " block " << block;
      }
    // Centroid sums.
    const int k = 1 + rep % 5;
    std::vector<uint8_t> ids(static_cast<size_t>(count * nb));
    for (auto& v : ids) v = uint8_t(rng() % k);
    std::vector<float> pts(x);
    for (auto& v : pts)
      if (std::fabs(v) > 1e30f) v = 1.0f;  // finite sums
    std::vector<double> sum(static_cast<size_t>(k * block), 0.0), sum_ref(sum);
    std::vector<int64_t> cnt(static_cast<size_t>(k), 0), cnt_ref(cnt);
    kernels::accumulate_clusters(pts.data(), count * nb, block, ids.data(), sum.data(), cnt.data());
    kernels::ref::accumulate_clusters(pts.data(), count * nb, block, ids.data(), sum_ref.data(), cnt_ref.data());
    ASSERT_EQ(cnt, cnt_ref);
    for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(std::memcmp(&sum[i], &sum_ref[i], 8), 0) << i;
  }
}

// Spec 1.5's int3 layout, written out here independently of qvg/code_format.h: the
// codes of group g (8 channels) form V = sum over i < 8 of code[8g + i] << (21 - 3i),
// stored as bytes 3g, 3g + 1, 3g + 2 = V >> 16, (V >> 8) & 255, V & 255. The encoder
// kernel (this target and the scalar reference) packs codes that way, and the decode
// (this target: vector path at dim 64, generic path at dim 24 / block 8 on 16-lane
// targets) and qvg::code_at read them back.
TEST_P(PerTarget, Int3PackingIsTheSpecLayout) {
  const auto spec_pack = [](const std::vector<int>& code) {
    std::vector<uint8_t> out;
    for (size_t g = 0; g * 8 < code.size(); ++g) {
      uint32_t v = 0;
      for (size_t i = 0; i < 8; ++i) v += uint32_t(code[8 * g + i]) << (21 - 3 * i);
      out.push_back(uint8_t(v >> 16));
      out.push_back(uint8_t((v >> 8) & 255));
      out.push_back(uint8_t(v & 255));
    }
    return out;
  };
  // Known bytes: codes 1, 2, ..., 7, 0 are the bit string 001 010 011 100 101 110 111 000.
  EXPECT_EQ(spec_pack({1, 2, 3, 4, 5, 6, 7, 0}), (std::vector<uint8_t>{0x29, 0xCB, 0xB8}));
  std::mt19937 rng(36);
  for (const int64_t dim : {8, 24, 64, 128})
    for (const int64_t block : {8, 64}) {
      if (dim % block) continue;
      const int64_t count = 5, nb = dim / block;
      std::vector<int> code(size_t(count * dim));
      for (auto& c : code) c = int(rng() % 8);
      if (dim == 8) std::iota(code.begin(), code.begin() + 8, 0);  // a group of every code
      const std::vector<uint8_t> want = spec_pack(code);
      // Asymmetric codes of x = code with scale 1 and zero 0 are the codes themselves.
      std::vector<float> x(code.begin(), code.end()), s(size_t(count * nb), 1.0f), z(s.size(), 0.0f);
      std::vector<uint8_t> got(want.size(), 0xAB), ref(want.size(), 0xCD);
      kernels::quantize_rows(x.data(), count, dim, block, 3, true, s.data(), z.data(), got.data());
      kernels::ref::quantize_rows(x.data(), count, dim, block, 3, true, s.data(), z.data(), ref.data());
      ASSERT_EQ(got, want) << "dim " << dim << " block " << block;
      ASSERT_EQ(ref, want) << "dim " << dim << " block " << block;
      for (int64_t t = 0; t < count; ++t)
        for (int64_t d = 0; d < dim; ++d)
          ASSERT_EQ(code_at(want.data() + t * dim * 3 / 8, 3, d), code[size_t(t * dim + d)]) << t << " " << d;
      // Decoded with stored scale 1 (fp8 0x38), zero 0 and a zero centroid: the codes.
      std::vector<uint8_t> scales(s.size(), 0x38), zeros(s.size(), 0x00);
      std::vector<float> cent(size_t(dim), 0.0f), dec(size_t(count * dim), -1.0f);
      std::vector<uint8_t> ids(size_t(count), 0);
      const float* cp = cent.data();
      const uint8_t* ip = ids.data();
      kernels::DecodeRows j;
      j.codes = want.data();
      j.scales = scales.data();
      j.zeros = zeros.data();
      j.bits = 3;
      j.asymmetric = true;
      j.block = block;
      j.dim = dim;
      j.stages = 1;
      j.ids = &ip;
      j.centroids = &cp;
      j.out = dec.data();
      j.out_dtype = DType::F32;
      j.out_token_stride = dim;
      j.count = count;
      kernels::decode_rows(j);
      for (size_t i = 0; i < code.size(); ++i) ASSERT_EQ(dec[i], float(code[i])) << "dim " << dim << " at " << i;
    }
}

// With the scalar (reference) assignment, every other encoder step is exact, so
// every target must produce the same bytes.
TEST(Kernels, EncoderBytesIdenticalAcrossTargetsWithReferenceAssignment) {
  Tensor x = testing::clustered_tensor({1, 300, 2, 64}, DType::BF16, 6, 16, 50, 300, 0.1f);
  for (bool asym : {false, true})
    for (ScaleDType sd : {ScaleDType::FP8_E4M3, ScaleDType::BF16})
      for (int bits : {asym ? 4 : 2, 3}) {
        CodecConfig cfg;
        cfg.bits = bits;
        cfg.asymmetric = asym;
        cfg.scale_dtype = sd;
        cfg.centroids = 16;
        cfg.block_size = 32;
        std::vector<EncodedTensor> encs;
        for (const auto& t : kernels::available_targets()) {
          kernels::force_target(t.id);
          encs.push_back(detail::encode_with_path(x, cfg, nullptr, nullptr, detail::AssignPath::Reference));
        }
        kernels::force_target(0);
        for (size_t i = 1; i < encs.size(); ++i)
          EXPECT_TRUE(encs[i] == encs[0]) << "target " << kernels::available_targets()[i].name << " " << cfg.describe();
      }
}

TEST_P(PerTarget, AssignmentAgreesWithReference) {
  Tensor x = testing::clustered_tensor({1, 3000, 1, 128}, DType::F32, 5, 64, 20, 0, 0.5f);
  std::vector<float> p = x.to_f32();
  for (int k : {1, 7, 64, 256}) {
    detail::KMeansParams kp;
    kp.k = k;
    kp.iters = 1;
    kp.path = detail::AssignPath::Reference;
    auto ref = detail::kmeans(p.data(), 3000, 128, kp);
    kp.path = detail::AssignPath::Fast;
    auto fast = detail::kmeans(p.data(), 3000, 128, kp);
    int diff = 0;
    for (size_t i = 0; i < ref.ids.size(); ++i) diff += ref.ids[i] != fast.ids[i];
    EXPECT_LT(diff, 30) << "k " << k << ": " << diff << " of 3000 ids differ";
    for (uint8_t id : fast.ids) ASSERT_LT(id, k);
    const double a = inertia_fp64(p.data(), 3000, ref.centroids.data(), k, 128);
    const double b = inertia_fp64(p.data(), 3000, fast.centroids.data(), k, 128);
    EXPECT_NEAR(b / a, 1.0, 1e-3) << "k " << k;
  }
}

// A refinement layer's error row from two bf16 rows: the scalar conversion and fp32
// subtraction's bits, clamped to +-lim (infinite differences too), and the NaN flag
// exactly when a difference is NaN, for lengths around the vector width.
TEST_P(PerTarget, Bf16ErrorRowEqualsTheScalarDefinition) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const float lim = 1e16f;
  for (size_t n : {size_t(1), size_t(7), size_t(16), size_t(17), size_t(64), size_t(128), size_t(131)})
    for (int rep = 0; rep < 40; ++rep) {
      std::vector<uint16_t> x(n), y(n);
      for (size_t i = 0; i < n; ++i) {
        x[i] = f32_to_bf16(std::ldexp(nd(rng), int(rng() % 140) - 70));
        y[i] = f32_to_bf16(std::ldexp(nd(rng), int(rng() % 140) - 70));
      }
      const int special = rep % 5;  // 1: a huge pair, 2: an infinity, 3: a NaN, 4: inf - inf
      const size_t at = rng() % n;
      if (special == 1) x[at] = f32_to_bf16(3e38f), y[at] = f32_to_bf16(-3e38f);
      if (special == 2) x[at] = 0x7f80;
      if (special == 3) y[at] = 0x7fc1;
      if (special == 4) x[at] = 0xff80, y[at] = 0xff80;
      std::vector<float> got(n, -1.0f);
      const bool nan = kernels::bf16_error_row(x.data(), y.data(), n, lim, got.data());
      bool want_nan = false;
      for (size_t i = 0; i < n; ++i) {
        const float e = bf16_to_f32(x[i]) - bf16_to_f32(y[i]);
        if (e != e) {
          want_nan = true;
          continue;
        }
        ASSERT_EQ(f32_bits(got[i]), f32_bits(std::min(std::max(e, -lim), lim))) << "n " << n << " at " << i;
      }
      ASSERT_EQ(nan, want_nan) << "n " << n << " special " << special;
    }
}

// Column sums in fp64 (the k-means group mean, a refinement layer's centroid): the
// scalar loop's bits on every target, for widths around the vector blocks, with and
// without the fp32 subtraction, from non-zero starting sums.
TEST_P(PerTarget, AddRowsF64EqualsTheScalarLoop) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-30, 30);
  for (int64_t dim : {1, 3, 7, 8, 16, 31, 32, 33, 64, 96, 128, 200, 256})
    for (int64_t n : {0, 1, 5, 129})
      for (const bool with_minus : {false, true}) {
        std::vector<float> x(static_cast<size_t>(n * dim)), minus(static_cast<size_t>(dim));
        for (auto& v : x) v = std::ldexp(nd(rng), ex(rng));
        for (auto& v : minus) v = std::ldexp(nd(rng), ex(rng));
        std::vector<double> want(static_cast<size_t>(dim)), got;
        for (auto& v : want) v = double(nd(rng));
        got = want;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t d = 0; d < dim; ++d) {
            const float v = with_minus ? x[size_t(i * dim + d)] - minus[size_t(d)] : x[size_t(i * dim + d)];
            want[size_t(d)] += double(v);
          }
        kernels::add_rows_f64(x.data(), n, dim, with_minus ? minus.data() : nullptr, got.data());
        for (int64_t d = 0; d < dim; ++d)
          ASSERT_EQ(std::memcmp(&got[size_t(d)], &want[size_t(d)], sizeof(double)), 0)
              << "dim " << dim << " n " << n << " minus " << with_minus << " d " << d;
      }
}

// The fast assignment is the exact argmin (lowest index on ties) of its own distances
// ||c||^2 - 2 x.c, each x.c one multiply-add chain over d in order (fused where the
// target has FMA: the kernel's ids must equal the fused model's or the unfused one's,
// for all points of a call), whatever tile of points and centroids the kernel computes
// it in: every codebook size of an incremental span (the narrow last tile, several
// tiles, 256), duplicated centroids across tiles (exact ties), point counts around its
// chunk.
TEST_P(PerTarget, AssignmentIsTheExactArgminOfItsDistances) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-8, 8);
  std::normal_distribution<float> nd;
  std::vector<int> ks;
  for (int k = 1; k <= 40; ++k) ks.push_back(k);
  for (int k : {47, 48, 63, 64, 65, 80, 85, 96, 100, 127, 128, 129, 160, 200, 255, 256}) ks.push_back(k);
  int64_t checked = 0;
  for (int64_t dim : {3, 24, 128})
    for (int64_t n : {1, 7, 130, 301})
      for (int k : ks) {
        if (dim != 128 && k % 3 != 0) continue;
        std::vector<float> x(size_t(n * dim)), c(size_t(k * dim));
        const bool integers = (k + n) % 2 == 0;  // exact products: many exact ties
        for (auto& v : x) v = integers ? float(small(rng)) : nd(rng);
        for (auto& v : c) v = integers ? float(small(rng)) : nd(rng);
        for (int j = 1; j < k; j += 1 + int(rng() % 19))  // duplicates of lower slots, across tiles
          std::copy_n(c.begin() + int64_t(rng() % uint64_t(j)) * dim, dim, c.begin() + int64_t(j) * dim);
        for (int64_t i = 0; i < n; i += 3)  // points on a centroid
          std::copy_n(c.begin() + int64_t(rng() % uint64_t(k)) * dim, dim, x.begin() + i * dim);
        std::vector<float> cn(static_cast<size_t>(k));
        for (int j = 0; j < k; ++j) {
          float s = 0;
          for (int64_t d = 0; d < dim; ++d) {
            volatile float sq = c[size_t(j * dim + d)] * c[size_t(j * dim + d)];  // not fused, as the kernel
            s += sq;
          }
          cn[size_t(j)] = s;
        }
        std::vector<uint8_t> ids(size_t(n), 0);
        kernels::assign_nearest(x.data(), n, dim, c.data(), k, ids.data(), true);
        const auto model = [&](bool fused) {
          std::vector<int> want(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) {
            float best = std::numeric_limits<float>::infinity();
            int bi = 0;
            for (int j = 0; j < k; ++j) {
              float acc = 0;
              for (int64_t d = 0; d < dim; ++d) {
                const float a = x[size_t(i * dim + d)], b = c[size_t(j * dim + d)];
                if (fused) {
                  acc = std::fma(a, b, acc);
                } else {
                  volatile float prod = a * b;
                  acc += prod;
                }
              }
              const float dist = std::fma(-2.0f, acc, cn[size_t(j)]);  // 2 * acc is exact: fused or not alike
              if (dist < best) {
                best = dist;
                bi = j;
              }
            }
            want[size_t(i)] = bi;
          }
          return want;
        };
        const std::vector<int> got(ids.begin(), ids.end()), fused = model(true), unfused = model(false);
        ASSERT_TRUE(got == fused || got == unfused) << "k " << k << " n " << n << " dim " << dim;
        checked += n;
      }
  EXPECT_GT(checked, 20000);
}

TEST_P(PerTarget, EncoderDeterministicAndCloseToScalarEncoder) {
  Tensor x = testing::clustered_tensor({1, 2000, 2, 128}, DType::BF16, 6, 48, 50, 300, 0.1f);
  CodecConfig cfg;
  cfg.bits = 2;
  cfg.centroids = 64;
  cfg.threads = 1;
  EncodedTensor a = encode(x, cfg);
  cfg.threads = 2;
  EXPECT_EQ(encode(x, cfg), a) << "not deterministic on " << GetParam().name;
  EncodedTensor ref = detail::encode_with_path(x, cfg, nullptr, nullptr, detail::AssignPath::Reference);
  const double ma = testing::rel_mse(x, decode(a)), mr = testing::rel_mse(x, decode(ref));
  EXPECT_NEAR(ma / mr, 1.0, 0.01) << "rel mse " << ma << " vs scalar " << mr;
}

TEST_P(PerTarget, AttentionHeadMatchesFp64) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t D : {8, 24, 64, 128})
    for (int64_t T : {1, 5, 37, 300})
      for (int64_t n : {1, 3, 9}) {
        const int64_t pad = kernels::attention_key_padding(), tpad = (T + pad - 1) / pad * pad;
        std::vector<float> q(static_cast<size_t>(n * D)), k(static_cast<size_t>(T * D)), kT(static_cast<size_t>(D * tpad), 7.0f), v(static_cast<size_t>(T * D));
        for (auto& x : q) x = nd(rng);
        for (auto& x : k) x = nd(rng);
        for (auto& x : v) x = nd(rng);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) kT[size_t(d * tpad + t)] = k[size_t(t * D + d)];
        const float scale = 1.0f / std::sqrt(float(D));
        std::vector<float> out(size_t(n * (D + 3)), -1.0f);
        kernels::attention_head(q.data(), n, kT.data(), tpad, T, v.data(), D, scale, out.data(), D + 3);
        for (int64_t i = 0; i < n; ++i) {
          std::vector<double> s(static_cast<size_t>(T));
          double m = -1e300, l = 0;
          for (int64_t t = 0; t < T; ++t) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += double(q[size_t(i * D + d)]) * k[size_t(t * D + d)];
            s[size_t(t)] = dot * scale;
            m = std::max(m, s[size_t(t)]);
          }
          for (auto& x : s) l += (x = std::exp(x - m));
          for (int64_t d = 0; d < D; ++d) {
            double want = 0;
            for (int64_t t = 0; t < T; ++t) want += s[size_t(t)] / l * v[size_t(t * D + d)];
            ASSERT_NEAR(out[size_t(i * (D + 3) + d)], want, 2e-5 * (1 + std::fabs(want)))
                << "D " << D << " T " << T << " n " << n << " target " << GetParam().name;
          }
          for (int64_t d = D; d < D + 3; ++d) ASSERT_EQ(out[size_t(i * (D + 3) + d)], -1.0f);  // stride respected
        }
      }
}

TEST_P(PerTarget, InputLimitScanMatchesDefinition) {
  auto within = [](double x) { return std::fabs(x) <= kMaxAbsInput; };  // false for NaN
  // bf16 and fp16: every code, alone at every position of a short buffer.
  for (DType t : {DType::BF16, DType::F16}) {
    for (uint32_t c = 0; c < 65536; ++c) {
      const float x = t == DType::BF16 ? bf16_to_f32(uint16_t(c)) : f16_to_f32(uint16_t(c));
      std::vector<uint16_t> buf(static_cast<size_t>(37), 0);
      const size_t pos = c % 37;
      buf[pos] = uint16_t(c);
      const size_t got = kernels::first_out_of_limit(buf.data(), t, buf.size());
      ASSERT_EQ(got, within(x) ? buf.size() : pos) << dtype_name(t) << " code " << c;
      ASSERT_EQ(kernels::ref::first_out_of_limit(buf.data(), t, buf.size()), got) << dtype_name(t) << " code " << c;
    }
  }
  // fp32: the boundary, specials and random bit patterns.
  std::mt19937 rng(3);
  std::vector<float> vals = {9999999198822400.0f, std::nextafter(9999999198822400.0f, INFINITY), -1e16f, 1e16f,
                             INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-45f};
  for (int i = 0; i < 200000; ++i) vals.push_back(f32_from_bits(uint32_t(rng())));
  for (size_t i = 0; i < vals.size(); ++i) {
    std::vector<float> buf(static_cast<size_t>(19), 1.0f);
    const size_t pos = i % 19;
    buf[pos] = vals[i];
    const size_t got = kernels::first_out_of_limit(buf.data(), DType::F32, buf.size());
    ASSERT_EQ(got, within(vals[i]) ? buf.size() : pos) << vals[i];
    ASSERT_EQ(kernels::ref::first_out_of_limit(buf.data(), DType::F32, buf.size()), got) << vals[i];
  }
}

// The scale search's errors (ScaleSearch::Mse): candidates in lanes, every lane the scalar rule.
TEST_P(PerTarget, BlockErrorsMatchTheReference) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int rep = 0; rep < 60; ++rep) {
    const int64_t n = std::vector<int64_t>{2, 8, 16, 32, 64, 128}[size_t(rep % 6)];
    const float mag = std::vector<float>{1e-3f, 1.0f, 300.0f, 3e4f}[size_t(rep % 4)];
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng) * mag;
    if (rep % 7 == 0) x[0] = 0.0f;
    const int ncand = 1 + rep % 20;
    std::vector<float> s(static_cast<size_t>(ncand)), z(s.size());
    for (int c = 0; c < ncand; ++c) {
      s[size_t(c)] = (c % 9 == 4) ? 0.0f : std::fabs(nd(rng)) * mag;
      z[size_t(c)] = nd(rng) * mag;
    }
    for (int bits : {2, 3, 4})
      for (bool asym : {false, true}) {
        const int qmax = asym ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
        std::vector<float> got(s.size()), want(s.size());
        kernels::block_errors(x.data(), n, qmax, asym, s.data(), z.data(), ncand, got.data());
        kernels::ref::block_errors(x.data(), n, qmax, asym, s.data(), z.data(), ncand, want.data());
        for (int c = 0; c < ncand; ++c)
          ASSERT_EQ(f32_bits(got[size_t(c)]), f32_bits(want[size_t(c)]))
              << "rep " << rep << " candidate " << c << " bits " << bits << " asym " << asym;
      }
  }
}

// The kernel forms most quotients (x - z) / s as (x - z) * (1 / s) and takes the
// division only near a rounding breakpoint: elements whose exact quotient is a
// half-integer or within a few ulps of one on either side (where the two forms could
// round to different codes), with scales of every size (tiny and huge ones take the
// division throughout), against the scalar reference, bit for bit.
TEST_P(PerTarget, BlockErrorsAtRoundingBreakpointsMatchTheReference) {
  std::mt19937 rng(91);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (int rep = 0; rep < 300; ++rep) {
    const int bits = rep >= 200 ? 3 : rep % 2 ? 4 : 2;  // int3 in the last 100
    const bool asym = (rep / 2) % 2;
    const int qmax = asym ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
    const int ncand = 1 + rep % 16;
    const float smag = std::vector<float>{1e-3f, 1.0f, 3e4f, 1e-39f, 3e38f}[size_t(rep % 5)];
    std::vector<float> s(static_cast<size_t>(ncand)), z(s.size());
    for (int c = 0; c < ncand; ++c) {
      s[size_t(c)] = std::fabs(nd(rng)) * smag + (smag < 1e-30f ? 0.0f : smag * 1e-3f);
      z[size_t(c)] = asym ? nd(rng) * smag : 0.0f;
    }
    // x: a half-integer (or integer) multiple of candidate c's scale, nudged by a few ulps.
    const int64_t n = 64;
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int c = int(rng() % unsigned(ncand));
      const float k = float(int(rng() % unsigned(2 * qmax + 4)) - (qmax + 2)) + (rng() % 3 ? 0.5f : 0.0f);
      float v = z[size_t(c)] + k * s[size_t(c)];
      for (int u = int(rng() % 9) - 4; u != 0; u += u > 0 ? -1 : 1) v = std::nextafter(v, u > 0 ? INFINITY : -INFINITY);
      x[size_t(i)] = std::isfinite(v) ? v : 0.0f;
    }
    std::vector<float> got(s.size()), want(s.size());
    kernels::block_errors(x.data(), n, qmax, asym, s.data(), z.data(), ncand, got.data());
    kernels::ref::block_errors(x.data(), n, qmax, asym, s.data(), z.data(), ncand, want.data());
    for (int c = 0; c < ncand; ++c)
      ASSERT_EQ(f32_bits(got[size_t(c)]), f32_bits(want[size_t(c)]))
          << "rep " << rep << " candidate " << c << " bits " << bits << " asym " << asym << " scale " << smag;
    ++checked;
  }
  EXPECT_EQ(checked, 300);
}

// Many blocks in one call (the encoder's form: several blocks' sums side by side, in
// groups of tasks): each block's errors are the scalar reference's bits, whatever the
// block's candidate count, and whether or not its group holds a block whose scales
// need the division (tiny or huge ones) or a zero scale.
TEST_P(PerTarget, BlockErrorsOfManyBlocksMatchTheReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  constexpr int kStride = residual_impl::kScaleSearchSteps;
  for (int rep = 0; rep < 40; ++rep) {
    const int64_t bs = std::vector<int64_t>{8, 32, 64}[size_t(rep % 3)];
    const int64_t nblocks = 1 + int64_t(rng() % 23);
    const int bits = 2 + rep % 3;
    const bool asym = (rep / 3) % 2;
    const int qmax = asym ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
    std::vector<float> x(size_t(nblocks * bs)), s(size_t(nblocks * kStride), -7.0f), z(s.size(), -7.0f);
    std::vector<int> m(static_cast<size_t>(nblocks));
    for (int64_t b = 0; b < nblocks; ++b) {
      const float mag = std::vector<float>{1e-3f, 1.0f, 3e4f}[size_t(rng() % 3)];
      for (int64_t i = 0; i < bs; ++i) x[size_t(b * bs + i)] = nd(rng) * mag;
      m[size_t(b)] = 1 + int(rng() % kStride);
      const float smag = rng() % 5 == 0 ? 1e-39f : mag;  // a block needing the division now and then
      for (int c = 0; c < m[size_t(b)]; ++c) {
        s[size_t(b * kStride + c)] = rng() % 11 == 0 ? 0.0f : std::fabs(nd(rng)) * smag;
        z[size_t(b * kStride + c)] = nd(rng) * mag;
      }
    }
    // Every block with all kStride candidates (m == nullptr) now and then.
    const bool all = rep % 4 == 3;
    if (all)
      for (int64_t b = 0; b < nblocks; ++b) {
        m[size_t(b)] = int(kStride);
        for (int c = 0; c < kStride; ++c) {
          s[size_t(b * kStride + c)] = std::fabs(nd(rng));
          z[size_t(b * kStride + c)] = nd(rng);
        }
      }
    std::vector<float> got(s.size(), -1.0f);
    kernels::block_errors_batch(x.data(), nblocks, bs, qmax, asym, s.data(), asym ? z.data() : nullptr, kStride,
                                all ? nullptr : m.data(), got.data());
    for (int64_t b = 0; b < nblocks; ++b) {
      std::vector<float> want(kStride, -1.0f);
      kernels::ref::block_errors(x.data() + b * bs, bs, qmax, asym, s.data() + b * kStride, z.data() + b * kStride,
                                 m[size_t(b)], want.data());
      for (int c = 0; c < kStride; ++c)
        ASSERT_EQ(f32_bits(got[size_t(b * kStride + c)]), f32_bits(want[size_t(c)]))
            << "rep " << rep << " block " << b << " of " << nblocks << " candidate " << c << " of " << m[size_t(b)];
    }
  }
}

// The scale search's candidates in lanes (fp8 and bf16 conversions as integer
// operations): every candidate's stored bits and effective values equal the scalar
// rule's, over raw scales and ranges of every size (zeros, fp32 subnormals, fp8
// subnormals, values rounding to the saturation at 448 and beyond it), both stored
// formats, with and without the two-level division, symmetric and asymmetric.
TEST_P(PerTarget, ScaleCandidatesMatchTheScalarRule) {
  namespace R = residual_impl;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> ex(-40.0f, 24.0f);
  const auto value = [&] {  // a magnitude from ~1e-12 to ~1.6e7, or a special one
    switch (rng() % 16) {
      case 0: return 0.0f;
      case 1: return 1e-40f;                                                      // fp32 subnormal
      case 2: return std::nextafter(448.0f, 0.0f) * float(1 + rng() % 3) / 2.0f;  // near the fp8 maximum
      default: return std::exp2(ex(rng));
    }
  };
  constexpr int64_t kS = kernels::kCandidateStride;
  int64_t checked = 0;
  for (int rep = 0; rep < 400; ++rep) {
    const bool asym = rep % 2, fp8 = (rep / 2) % 2, divide = fp8 && (rep / 4) % 2;
    const float g = divide ? R::two_level_factor(value() * 448.0f) : 1.0f;
    const float gz = divide && asym ? R::two_level_factor(value() * 448.0f) : 1.0f;
    const int64_t nb = 1 + int64_t(rng() % 9);
    std::vector<float> raw(static_cast<size_t>(nb)), lo(raw.size()), hi(raw.size());
    for (size_t b = 0; b < raw.size(); ++b) {
      lo[b] = (rng() % 3 ? -1.0f : 1.0f) * value();
      hi[b] = lo[b] + (rng() % 5 ? value() : 0.0f);
      raw[b] = asym ? R::raw_scale_asym(lo[b], hi[b], 3) : value();
    }
    std::vector<uint32_t> sb(size_t(nb * kS)), zb(sb.size());
    std::vector<float> se(sb.size()), ze(sb.size());
    kernels::scale_candidates(raw.data(), lo.data(), hi.data(), nb, asym, divide, g, gz, fp8, sb.data(), zb.data(),
                              se.data(), ze.data());
    for (int64_t b = 0; b < nb; ++b)
      for (int k = 0; k < R::kScaleSearchSteps; ++k) {
        const R::ScaleCandidate want =
            R::scale_search_candidate(raw[size_t(b)], lo[size_t(b)], hi[size_t(b)], asym, divide, g, gz, fp8, k);
        const size_t o = size_t(b * kS + k);
        const std::string at = fmt::format("rep {} block {} candidate {}: raw {} lo {} hi {} g {} gz {}", rep, b, k,
                                           raw[size_t(b)], lo[size_t(b)], hi[size_t(b)], g, gz);
        ASSERT_EQ(sb[o], want.s_bits) << at;
        ASSERT_EQ(f32_bits(se[o]), f32_bits(want.s_eff)) << at;
        if (asym) {
          ASSERT_EQ(zb[o], want.z_bits) << at;
          ASSERT_EQ(f32_bits(ze[o]), f32_bits(want.z_eff)) << at;
        }
        ++checked;
      }
  }
  EXPECT_GT(checked, 400 * 15);
}

INSTANTIATE_TEST_SUITE_P(Kernels, PerTarget, ::testing::ValuesIn(kernels::available_targets()), target_label);

// The benchmark's FMA loop (src/perf, compiled per target like the kernels).
TEST(Perf, FmaLoopCountsFlops) {
  const double flops = perf::fma_loop(1000);
  EXPECT_GT(flops, 1000.0 * 12 * 2);  // at least one lane per accumulator
}

}  // namespace
}  // namespace qvg
