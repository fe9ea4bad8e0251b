// Host-side tests of the CUDA backend (no GPU needed): the __host__ __device__
// arithmetic (arith.cuh) and the per-thread kernel bodies (bodies.cuh), compiled
// here by the host compiler, against the CPU codec bit for bit:
// - every format conversion against src/core/numeric.cpp (exhaustive for 8/16-bit
//   inputs, a 4M-point sweep plus special values for fp32 inputs);
// - the codec's PRNG (one definition, host and device) against known answers;
// - decode_vec8 / decode_one over every element of CPU-encoded tensors in all
//   modes against kernels::ref::decode_rows, into dense and strided sub-range targets;
// - block_stats + pack_byte against quantize_residual_group.
// What this cannot check: the kernels' block/thread mapping, the tensor-core
// assignment and the centroid update (tests/gpu/gpu_tests.cpp, on a GPU).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/decode_impl.h"
#include "codec/encode_impl.h"
#include "gpu/harness.h"
#include "gpu/modes.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"
#include "kernels/cuda/host.h"
#include "kernels/ref/ref.h"
#include "qvg/codec.h"
#include "qvg/numeric.h"

namespace A = qvg::cuda_arith;
namespace K = qvg::cuda::kernels;

namespace {

/// Random [B, S, H, D] data: per group an offset and a scale that vary by group
/// (magnitudes from 1e-3 to `big`), some clustered structure, one all-zero token.
qvg::Tensor make_data(qvg::DType dtype, qvg::Shape4 sh, uint32_t seed, float big) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  qvg::Tensor t(dtype, sh);
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.h; ++h) {
      const int64_t g = b * sh.h + h;
      const float scale = std::pow(10.0f, float(g % 4) - 2.0f) * (g % 5 == 4 ? big : 1.0f);
      const float offset = g % 3 == 1 ? 3.0f * scale : 0.0f;
      std::vector<float> centers(size_t(4 * sh.d));
      for (float& c : centers) c = n01(rng) * scale;
      for (int64_t s = 0; s < sh.s; ++s)
        for (int64_t d = 0; d < sh.d; ++d) {
          float v = s == 3 ? 0.0f : offset + centers[size_t((s % 4) * sh.d + d)] + 0.3f * scale * n01(rng);
          t.set(b, s, h, d, v);
        }
    }
  return t;
}

/// Stage-contiguous copies of ids and centroids (the device layout).
struct Contig {
  std::vector<uint8_t> ids, cent;
};
Contig contig(const qvg::EncodedTensor& e) {
  Contig c;
  for (const auto& v : e.ids) c.ids.insert(c.ids.end(), v.begin(), v.end());
  for (const auto& v : e.centroid) c.cent.insert(c.cent.end(), v.begin(), v.end());
  return c;
}

/// Reference decode of the whole tensor with kernels::ref::decode_rows, [B, S, H, D] in `out_dtype`.
std::vector<uint8_t> reference_decode(const qvg::EncodedTensor& e, qvg::DType out_dtype) {
  const int64_t S = e.shape.s, H = e.shape.h, D = e.shape.d, Kc = e.centroids;
  const size_t osz = qvg::dtype_size(out_dtype);
  std::vector<uint8_t> out(size_t(e.shape.numel()) * osz);
  std::vector<std::vector<float>> cent(size_t(e.stages));
  std::vector<const float*> cptr(size_t(e.stages));
  std::vector<const uint8_t*> iptr(size_t(e.stages));
  for (int64_t g = 0; g < e.groups(); ++g) {
    const int64_t b = g / H, h = g % H;
    for (int st = 0; st < e.stages; ++st) {
      cent[size_t(st)].resize(size_t(Kc * D));
      qvg::convert_to_f32(e.centroid[size_t(st)].data() + size_t(g * Kc * D) * qvg::dtype_size(e.dtype), e.dtype,
                          cent[size_t(st)].data(), size_t(Kc * D));
      cptr[size_t(st)] = cent[size_t(st)].data();
      iptr[size_t(st)] = e.ids[size_t(st)].data() + size_t(g * S);
    }
    qvg::kernels::DecodeRows j = qvg::detail::rows_job(e, g, 0, S);
    j.ids = iptr.data();
    j.centroids = cptr.data();
    j.out = out.data() + size_t((b * S * H + h) * D) * osz;
    j.out_dtype = out_dtype;
    j.out_token_stride = H * D;
    qvg::kernels::ref::decode_rows(j);
  }
  return out;
}

K::DecodeArgs make_task(const qvg::EncodedTensor& e, const Contig& c) {
  return qvg::cuda::decode_args(e, {e.codes.data(), e.scales.data(), e.asymmetric ? e.zeros.data() : nullptr,
                                    e.scale_factor.empty() ? nullptr : e.scale_factor.data(),
                                    e.zero_factor.empty() ? nullptr : e.zero_factor.data(), c.ids.data(),
                                    c.cent.data()});
}

/// Runs the kernel bodies over tokens [t0, t1), heads [h0, h1) into a target with
/// the given token stride (elements), as the decode kernel would; returns the buffer.
std::vector<uint8_t> body_decode(const qvg::EncodedTensor& e, const Contig& c, qvg::DType out_dtype, int t0, int t1,
                                 int h0, int h1, int64_t token_stride, bool vec, bool vstore) {
  K::DecodeArgs T = make_task(e, c);
  const int64_t D = e.shape.d, rows = t1 - t0;
  const size_t osz = qvg::dtype_size(out_dtype);
  const int64_t batch_stride = rows * token_stride;
  std::vector<uint8_t> out(size_t(e.shape.b * batch_stride) * osz + 64, 0xA5);
  T.t0 = t0;
  T.t1 = t1;
  T.h0 = h0;
  T.h1 = h1;
  T.out_dtype = int8_t(qvg::cuda::arith_dtype(out_dtype));
  // 16-byte aligned target (std::vector data is 16-byte aligned on this ABI; checked).
  T.out = out.data();
  T.batch_stride = batch_stride;
  T.token_stride = token_stride;
  for (int b = 0; b < e.shape.b; ++b)
    for (int h = h0; h < h1; ++h)
      for (int t = t0; t < t1; ++t) {
        if (vec)
          for (int cc = 0; cc < D / 8; ++cc) K::decode_vec8(T, b, h, t, cc, vstore);
        else
          for (int d = 0; d < D; ++d) K::decode_one(T, b, h, t, d);
      }
  return out;
}

using qvg::testing::all_modes;
using qvg::testing::Mode;
std::string describe(const Mode& m, qvg::DType in) {
  return "bits=" + std::to_string(m.bits) + (m.asym ? " asym" : " sym") + " scale=" + std::string(qvg::name(m.sd)) +
         " scaling=" + std::string(qvg::name(m.sc)) + " stages=" + std::to_string(m.stages) + " in=" +
         std::string(qvg::dtype_name(in));
}

}  // namespace

QVG_TEST(conversions_match_numeric_h) {
  for (uint32_t h = 0; h < 65536; ++h) {
    QVG_EXPECT(A::bits_of(A::bf16_to_f32(uint16_t(h))) == qvg::f32_bits(qvg::bf16_to_f32(uint16_t(h)))) << h;
    QVG_EXPECT(A::bits_of(A::f16_to_f32(uint16_t(h))) == qvg::f32_bits(qvg::f16_to_f32(uint16_t(h)))) << h;
  }
  for (uint32_t v = 0; v < 256; ++v) {
    const float a = A::fp8e4m3_to_f32(uint8_t(v)), b = qvg::fp8e4m3_to_f32(uint8_t(v));
    QVG_EXPECT(A::bits_of(a) == qvg::f32_bits(b) || (std::isnan(a) && std::isnan(b))) << v;
  }
  std::vector<uint32_t> pats = {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x43E00000u, 0x43DFFFFFu,
                                0x477FEFFFu, 0x477FF000u, 0x47800000u, 0x33000000u, 0x3A800000u, 0x00000001u};
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 1021) pats.push_back(uint32_t(u));
  int bad = 0;
  for (uint32_t u : pats) {
    const float f = qvg::f32_from_bits(u);
    if (A::f32_to_bf16(f) != qvg::f32_to_bf16(f) || A::f32_to_f16_sat(f) != qvg::f32_to_f16_sat(f) ||
        A::f32_to_fp8e4m3(f) != qvg::f32_to_fp8e4m3(f)) {
      if (++bad < 5) {
        QVG_EXPECT(false) << "fp32 bits" << u;
      }
    }
    if (!std::isnan(f)) {
      for (int t : {A::kBF16, A::kF16, A::kF32}) {
        const float rt = A::round_trip(f, t);
        float ref = f;
        if (t == A::kBF16) ref = qvg::bf16_to_f32(qvg::f32_to_bf16(f));
        if (t == A::kF16) ref = qvg::f16_to_f32(qvg::f32_to_f16_sat(f));
        if (A::bits_of(rt) != qvg::f32_bits(ref) && ++bad < 5) {
          QVG_EXPECT(false) << "round_trip" << u << t;
        }
      }
    }
  }
  QVG_EXPECT(bad == 0) << bad << "mismatches";
}

// The codec's PRNG (src/core/rng_impl.h, one definition for host and device):
// known answers recorded from the implementation the codec shipped with before the
// host and device copies were merged, so that a change of the stream is caught.
QVG_TEST(rng_known_answers) {
  struct Kat {
    uint64_t seed, first, below_hash;
  };
  const Kat kats[] = {{0ull, 0x631a9154fbabf717ull, 0xc8566ad1f90ab7cfull},
                      {1234ull, 0x12ae1d5120245934ull, 0xe85a836544081e98ull},
                      {18446744073709551615ull, 0x82b43276abb80226ull, 0x8ea4153827388d2bull}};
  for (const Kat& k : kats) {
    A::Rng first(k.seed, 0, 0, 0);
    QVG_EXPECT(first.next() == k.first) << "seed" << k.seed;
    A::Rng r(k.seed, 3, 1, 7);
    uint64_t h = 0;
    for (uint64_t m : {1ull, 2ull, 3ull, 255ull, 29640ull, (1ull << 63) + 5ull})
      for (int i = 0; i < 200; ++i) h = h * 1099511628211ull ^ r.below(m);
    QVG_EXPECT(h == k.below_hash) << "seed" << k.seed;
  }
}

// mul64wide's host path (__int128) against a schoolbook product of 32-bit limbs;
// the device path (__umul64hi) is exercised by the GPU tests' initial indices.
QVG_TEST(mul64wide_matches_limb_product) {
  uint64_t s = 99;
  for (int i = 0; i < 100000; ++i) {
    const uint64_t a = A::splitmix64(s), b = i % 7 == 0 ? ~uint64_t(0) - uint64_t(i) : A::splitmix64(s);
    uint64_t hi, lo;
    A::mul64wide(a, b, hi, lo);
    const uint64_t a0 = a & 0xFFFFFFFFu, a1 = a >> 32, b0 = b & 0xFFFFFFFFu, b1 = b >> 32;
    const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint64_t mid = (p00 >> 32) + (p01 & 0xFFFFFFFFu) + (p10 & 0xFFFFFFFFu);
    const uint64_t want_hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    const uint64_t want_lo = (mid << 32) | (p00 & 0xFFFFFFFFu);
    if (hi != want_hi || lo != want_lo) {
      QVG_EXPECT(false) << "a" << a << "b" << b;
      return;
    }
  }
}

QVG_TEST(decode_bodies_match_ref_decode_rows) {
  struct ShapeCase {
    qvg::Shape4 sh;
    int block;
  };
  // D = 64 (vectorised path) and D = 24 with block 8 (vectorised, 3 blocks), and
  // D = 12 with block 4 (int2 only: not vectorisable, generic path).
  const ShapeCase shapes[] = {{{2, 37, 3, 64}, 32}, {{1, 21, 2, 24}, 8}, {{1, 19, 2, 12}, 4}};
  int checked = 0;
  uint32_t seed = 1;
  for (const ShapeCase& sc : shapes)
    for (const Mode& m : all_modes())
      for (qvg::DType in : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
        if (sc.block % (8 / m.bits) != 0) continue;
        qvg::CodecConfig cfg;
        cfg.bits = m.bits;
        cfg.asymmetric = m.asym;
        cfg.scale_dtype = m.sd;
        cfg.scaling = m.sc;
        cfg.stages = m.stages;
        cfg.centroids = 16;
        cfg.block_size = sc.block;
        cfg.threads = 1;
        // f32 input with magnitudes past the fp16 range exercises the saturation.
        const float big = in == qvg::DType::F32 ? 3e6f : (in == qvg::DType::F16 ? 100.0f : 1e4f);
        qvg::Tensor x = make_data(in, sc.sh, seed++, big);
        const qvg::EncodedTensor e = qvg::encode(x, cfg);
        const Contig c = contig(e);
        const bool vec = K::task_vectorizable(make_task(e, c));
        for (qvg::DType out : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
          const std::vector<uint8_t> ref = reference_decode(e, out);
          const int64_t S = sc.sh.s, H = sc.sh.h, D = sc.sh.d;
          const size_t osz = qvg::dtype_size(out);
          // Whole tensor, dense target: vectorised (aligned and element stores) and generic bodies.
          for (int variant = 0; variant < 3; ++variant) {
            if (variant < 2 && !vec) continue;
            const std::vector<uint8_t> got = body_decode(e, c, out, 0, int(S), 0, int(H), H * D, variant < 2,
                                                         variant == 0);
            const bool same = std::memcmp(got.data(), ref.data(), ref.size()) == 0;
            QVG_EXPECT(same) << describe(m, in) << "out" << qvg::dtype_name(out) << "variant" << variant;
            ++checked;
          }
          // A strided sub-range (tokens [5, S-2), heads [1, H)) as a window view writes it.
          const int t0 = 5, t1 = int(S) - 2, h0 = 1, h1 = int(H);
          const int64_t stride = (h1 - h0) * D + 8;
          const std::vector<uint8_t> got = body_decode(e, c, out, t0, t1, h0, h1, stride, vec, false);
          bool same = true;
          for (int64_t b = 0; b < sc.sh.b && same; ++b)
            for (int64_t t = t0; t < t1 && same; ++t)
              for (int64_t h = h0; h < h1 && same; ++h) {
                const size_t src = size_t(((b * S + t) * H + h) * D) * osz;
                const size_t dst = size_t(b * (t1 - t0) * stride + (t - t0) * stride + (h - h0) * D) * osz;
                same = std::memcmp(got.data() + dst, ref.data() + src, size_t(D) * osz) == 0;
              }
          QVG_EXPECT(same) << describe(m, in) << "out" << qvg::dtype_name(out) << "strided sub-range";
          ++checked;
        }
      }
  QVG_EXPECT(checked > 300) << checked;
  std::printf("  %d decode comparisons\n", checked);
}

QVG_TEST(quantize_bodies_match_quantize_residual_group) {
  int checked = 0;
  uint32_t seed = 100;
  for (const Mode& m : all_modes()) {
    if (m.stages != 1) continue;
    for (int block : {8, 32, 64}) {
      const qvg::Shape4 sh{1, 29, 3, 64};
      qvg::EncodedTensor e;
      e.dtype = qvg::DType::F32;
      e.shape = sh;
      e.bits = m.bits;
      e.block_size = block;
      e.asymmetric = m.asym;
      e.scale_dtype = m.sd;
      e.scaling = m.sc;
      const int64_t G = sh.b * sh.h, S = sh.s, D = sh.d, nb = D / block;
      e.codes.assign(size_t(G * S * D * m.bits / 8), 0);
      e.scales.assign(size_t(G * S * nb) * e.scale_elem_size(), 0);
      if (m.asym) e.zeros.assign(e.scales.size(), 0);
      if (m.sc == qvg::Scaling::TwoLevel) {
        e.scale_factor.assign(size_t(G), 1.0f);
        if (m.asym) e.zero_factor.assign(size_t(G), 1.0f);
      }
      // Residuals: group 0 ordinary, group 1 huge (fp8 saturation in compat), group 2
      // tiny (underflow to a zero scale) with one all-zero block and exact ties.
      std::mt19937 rng(seed++);
      std::normal_distribution<float> n01(0.0f, 1.0f);
      std::vector<float> r(size_t(G * S * D));
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < S * D; ++i) {
          const float s = g == 0 ? 1.0f : g == 1 ? 5000.0f : 1e-12f;
          float v = s * n01(rng);
          if (i < D) v = 0.0f;
          if (i >= D && i < 2 * D) v = s * 0.5f * float(i % 5);
          r[size_t(g * S * D + i)] = v;
        }
      qvg::EncodedTensor ref = e;
      for (int64_t g = 0; g < G; ++g) qvg::detail::quantize_residual_group(r.data() + g * S * D, g, ref);

      std::vector<float> raw_s(size_t(G * S * nb)), raw_z(size_t(G * S * nb)), gmax(size_t(2 * G), 0.0f);
      const int qmax = A::qmax_of(m.bits, m.asym);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < S * nb; ++i) {
          float s = 0, z = 0;
          K::block_stats(r.data() + g * S * D + (i / nb) * D + (i % nb) * block, block, qmax, m.asym, s, z);
          raw_s[size_t(g * S * nb + i)] = s;
          raw_z[size_t(g * S * nb + i)] = z;
          gmax[size_t(g)] = std::max(gmax[size_t(g)], s);
          if (m.asym) gmax[size_t(G + g)] = std::max(gmax[size_t(G + g)], std::fabs(z));
        }
      qvg::EncodedTensor got = e;
      K::QuantizeArgs a;
      a.r = r.data();
      a.G = G;
      a.S = S;
      a.D = D;
      a.bits = m.bits;
      a.block = block;
      a.asymmetric = m.asym;
      a.fp8 = m.sd == qvg::ScaleDType::FP8_E4M3;
      a.two_level = m.sc == qvg::Scaling::TwoLevel;
      a.codes = got.codes.data();
      a.scales = got.scales.data();
      a.zeros = m.asym ? got.zeros.data() : nullptr;
      a.scale_factor = a.two_level ? got.scale_factor.data() : nullptr;
      a.zero_factor = a.two_level && m.asym ? got.zero_factor.data() : nullptr;
      a.raw_s = raw_s.data();
      a.raw_z = raw_z.data();
      a.group_max = gmax.data();
      for (int64_t i = 0; i < G * S * D * m.bits / 8; ++i) K::pack_byte(a, i);
      for (size_t i = 0; i < got.codes.size(); ++i)
        if (got.codes[i] != ref.codes[i]) {
          const int64_t cb = D * m.bits / 8, gt = int64_t(i) / cb, d0 = (int64_t(i) % cb) * (8 / m.bits);
          const int64_t si = gt * nb + d0 / block;
          QVG_EXPECT(got.codes[i] == ref.codes[i])
              << describe(m, qvg::DType::F32) << "block" << block << "first differing code byte" << i << "got"
              << int(got.codes[i]) << "cpu" << int(ref.codes[i]) << "x[0]" << r[size_t(gt * D + d0)] << "raw_s"
              << raw_s[size_t(si)] << "factor" << (a.two_level ? ref.scale_factor[size_t(gt / S)] : 1.0f);
          break;
        }
      QVG_EXPECT(got.scales == ref.scales) << describe(m, qvg::DType::F32) << "block" << block << "scales";
      QVG_EXPECT(got.zeros == ref.zeros) << describe(m, qvg::DType::F32) << "block" << block << "zeros";
      QVG_EXPECT(got.scale_factor == ref.scale_factor) << describe(m, qvg::DType::F32) << "factors";
      QVG_EXPECT(got.zero_factor == ref.zero_factor) << describe(m, qvg::DType::F32) << "zero factors";
      ++checked;
    }
  }
  QVG_EXPECT(checked == 48) << checked;
}

int main(int argc, char** argv) { return qvg::testing::run_all(argc, argv); }
