// Host-side tests of the CUDA backend (no GPU needed): the __host__ __device__
// arithmetic (arith.cuh) and the per-thread kernel bodies (bodies.cuh), compiled
// here by the host compiler, against the CPU codec bit for bit:
// - every format conversion against src/core/numeric.cpp (exhaustive for 8/16-bit
//   inputs, a 4M-point sweep plus special values for fp32 inputs);
// - the codec's PRNG (one definition, host and device) against known answers;
// - decode_block_vec / decode_one over every element of CPU-encoded tensors in all
//   modes (every code width: int2, int3, int4) against kernels::ref::decode_rows,
//   into dense and strided sub-range targets;
// - block_stats + pack_word / pack_group_at against quantize_residual_group, and the
//   scale search (search_block, and the half-warp search's bodies with its lanes
//   emulated) against quantize_residual_group with ScaleSearch::Mse; the codes from a
//   reciprocal (code_value) against the division, the update's fixed-point term
//   (to_fixed_scaled) against the exact product;
// - the incremental spans' and refinement layers' bodies (span_bodies.cuh): a span
//   chunk's quantizer inputs from its span's codebook against encode_span_chunk (same
//   bytes given its assignments, and the same residual energy), the refinement error
//   against encode_refinement and the layer added in the view (refine_one) against
//   add_refinement.
// - the tensor-core assignment's fragment helpers against a model of the PTX ISA's
//   mma.m16n8k16 / ldmatrix layouts.
// What this cannot check: the kernels' block/thread mapping, the tensor-core
// instructions themselves and the centroid update (tests/gpu/gpu_tests.cpp, on a GPU).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/decode_impl.h"
#include "codec/encode_impl.h"
#include "codec/kmeans.h"
#include "gpu/harness.h"
#include "gpu/host_launch.h"
#include "gpu/modes.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"
#include "kernels/cuda/encode_bodies.cuh"
#include "kernels/cuda/guard_bodies.cuh"
#include "kernels/cuda/host.h"
#include "kernels/cuda/span_bodies.cuh"
#include "kernels/ref/ref.h"
#include "qvg/codec.h"
#include "qvg/error.h"
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

/// The modes (bits, fp8, centroid dtype, output dtype) the emulated launches ran.
using K::host_test::modes_run;

/// Runs what decode_tasks launches, on the host: plan_decode's launches, every
/// block of each grid and every thread of each block, through the same dispatch
/// (with_decode_mode) and bodies as the kernels. Returns the number of launches.
size_t run_decode_launches(const std::vector<K::DecodeArgs>& tasks, int32_t min_blocks = 0) {
  const std::vector<K::DecodeLaunch> plan = K::plan_decode(tasks.data(), int(tasks.size()), min_blocks);
  for (const K::DecodeLaunch& L : plan) K::host_test::run_launch(L);
  return plan.size();
}

/// A decode task for tokens [t0, t1), heads [h0, h1) of e into `out` with the given
/// token stride (elements); batch stride = rows * token stride.
K::DecodeArgs range_task(const qvg::EncodedTensor& e, const Contig& c, qvg::DType out_dtype, int t0, int t1, int h0,
                         int h1, int64_t token_stride, void* out) {
  K::DecodeArgs T = make_task(e, c);
  T.t0 = t0;
  T.t1 = t1;
  T.h0 = h0;
  T.h1 = h1;
  T.out_dtype = int8_t(qvg::cuda::arith_dtype(out_dtype));
  T.out = out;
  T.batch_stride = int64_t(t1 - t0) * token_stride;
  T.token_stride = token_stride;
  return T;
}

/// A 16-byte aligned buffer of n bytes filled with 0xA5 (a sentinel: bytes no task
/// writes must keep it).
struct Target {
  std::vector<uint8_t> raw;
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit Target(size_t bytes, size_t misalign = 0) : raw(bytes + 32 + misalign, 0xA5), n(bytes) {
    p = raw.data() + ((16 - reinterpret_cast<uintptr_t>(raw.data()) % 16) % 16) + misalign;
  }
};

using qvg::testing::every_width_modes;
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

// The whole decode launch on the host (plan_decode, every block and thread of the
// grid, the templated bodies) against the CPU codec's decode, bit for bit: all 48
// modes (int2, int3, int4) x input (= centroid) dtype x output dtype (so all 54
// unrefined instantiations of decode_block_vec), D = 64, 128, 256 and 24 on the
// vectorised path (S up to 150: up to 8 tokens per thread) and D = 12 (block 4,
// int2/int4) on the generic one; the whole tensor into a dense target (aligned:
// 128-bit stores; misaligned: element stores), and a strided sub-range (t0 > 0,
// h0 > 0, padded token stride) whose padding must stay untouched.
QVG_TEST(decode_launches_match_cpu_decode) {
  struct ShapeCase {
    qvg::Shape4 sh;
    int block;
  };
  // The first three give each thread of a vectorised tile 1-2 tokens; the last two
  // (S over 4 token rows per block) 5-8 in the first tile, so that a thread's second,
  // clamped batch of kDecodeBatch runs too.
  const ShapeCase shapes[] = {{{2, 37, 3, 64}, 32}, {{1, 21, 2, 128}, 64}, {{1, 13, 2, 256}, 64},
                              {{1, 21, 2, 24}, 8},  {{1, 19, 2, 12}, 4},  {{1, 150, 2, 128}, 64},
                              {{1, 75, 2, 256}, 64}};
  int checked = 0;
  uint32_t seed = 1;
  modes_run().clear();
  for (const ShapeCase& sc : shapes)
    for (const Mode& m : every_width_modes())
      for (qvg::DType in : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
        if (sc.block % qvg::find_code_format(m.bits)->group_codes != 0) continue;
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
        const int64_t S = sc.sh.s, H = sc.sh.h, D = sc.sh.d;
        for (qvg::DType out : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
          const std::vector<uint8_t> ref = reference_decode(e, out);
          qvg::Tensor cpu(out, sc.sh);
          qvg::decode(e, cpu.view());
          QVG_EXPECT(std::memcmp(cpu.data(), ref.data(), ref.size()) == 0) << "CPU decode vs ref::decode_rows";
          const size_t osz = qvg::dtype_size(out);
          for (size_t misalign : {size_t(0), osz}) {  // 128-bit stores, then element stores
            Target tg(ref.size(), misalign);
            run_decode_launches({range_task(e, c, out, 0, int(S), 0, int(H), H * D, tg.p)});
            const bool same = std::memcmp(tg.p, ref.data(), ref.size()) == 0;
            QVG_EXPECT(same) << describe(m, in) << "out" << qvg::dtype_name(out) << "D" << D << "misalign" << misalign;
            ++checked;
          }
          // A strided sub-range (tokens [5, S-2), heads [1, H)) as a window view writes it,
          // with the smallest tiles (one token per thread, as for a grid under two waves).
          const int t0 = 5, t1 = int(S) - 2, h0 = 1, h1 = int(H);
          const int64_t stride = (h1 - h0) * D + 8;
          Target tg(size_t(sc.sh.b * (t1 - t0) * stride) * osz);
          const std::vector<K::DecodeArgs> sub = {range_task(e, c, out, t0, t1, h0, h1, stride, tg.p)};
          const std::vector<K::DecodeLaunch> small = K::plan_decode(sub.data(), 1, 1 << 30);
          QVG_EXPECT(small.size() == 1 && (!small[0].vec || small[0].p[0].tile == small[0].p[0].rows))
              << "min_blocks did not shrink the tiles";
          run_decode_launches(sub, 1 << 30);
          bool same = true, pad = true;
          for (int64_t b = 0; b < sc.sh.b; ++b)
            for (int64_t t = t0; t < t1; ++t) {
              const size_t dst = size_t(b * (t1 - t0) * stride + (t - t0) * stride) * osz;
              for (int64_t h = h0; h < h1 && same; ++h) {
                const size_t src = size_t(((b * S + t) * H + h) * D) * osz;
                same = std::memcmp(tg.p + dst + size_t((h - h0) * D) * osz, ref.data() + src, size_t(D) * osz) == 0;
              }
              for (size_t i = size_t((h1 - h0) * D) * osz; i < size_t(stride) * osz; ++i)
                pad = pad && tg.p[dst + i] == 0xA5;
            }
          QVG_EXPECT(same && pad) << describe(m, in) << "out" << qvg::dtype_name(out) << "D" << D << "strided sub-range"
                                  << (same ? "padding written" : "differs");
          ++checked;
        }
      }
  QVG_EXPECT(modes_run().size() == 54) << "instantiations run:" << modes_run().size();
  QVG_EXPECT(K::host_misaligned_accesses() == 0) << K::host_misaligned_accesses() << "misaligned accesses";
  QVG_EXPECT(checked > 3000) << checked;
  std::printf("  %d decode comparisons, %zu instantiations\n", checked, modes_run().size());
}

// Several tasks of different modes in one decode_tasks call (as a window of K and V
// spans of different dtypes would be): the plan groups them by mode, 16 tasks per
// launch, and every task lands in its own region of one buffer.
QVG_TEST(decode_plan_groups_tasks_by_mode) {
  const qvg::Shape4 sh{2, 40, 3, 64};
  std::vector<qvg::EncodedTensor> encs;
  std::vector<Contig> cs;
  std::vector<qvg::DType> outs;
  for (int i = 0; i < 40; ++i) {
    qvg::CodecConfig cfg;
    cfg.bits = i % 3 == 0 ? 2 : (i % 3 == 1 ? 4 : 3);  // 3 widths (i == 7, block 4: int4)
    cfg.scale_dtype = i % 5 == 0 ? qvg::ScaleDType::BF16 : qvg::ScaleDType::FP8_E4M3;
    cfg.asymmetric = i % 2 == 1;  // runtime-uniform, not part of the mode
    cfg.centroids = 8;
    cfg.block_size = i == 7 ? 4 : 32;  // one generic task
    cfg.threads = 1;
    const qvg::DType in = i % 4 == 3 ? qvg::DType::F16 : qvg::DType::BF16;
    encs.push_back(qvg::encode(make_data(in, sh, 900u + uint32_t(i), 10.0f), cfg));
    outs.push_back(i % 6 == 5 ? qvg::DType::F32 : qvg::DType::BF16);
  }
  for (const auto& e : encs) cs.push_back(contig(e));
  const int t0 = 3, t1 = 37, h0 = 1, h1 = 3;
  const int64_t stride = (h1 - h0) * sh.d;
  std::vector<size_t> off;
  size_t total = 0;
  for (size_t i = 0; i < encs.size(); ++i) {
    off.push_back(total);
    total += size_t(sh.b * (t1 - t0) * stride) * qvg::dtype_size(outs[i]) + 16;
  }
  Target tg(total);
  std::vector<K::DecodeArgs> tasks;
  std::set<int> keys;
  for (size_t i = 0; i < encs.size(); ++i) {
    tasks.push_back(range_task(encs[i], cs[i], outs[i], t0, t1, h0, h1, stride, tg.p + off[i]));
    const K::DecodeArgs& t = tasks.back();
    keys.insert(K::task_vectorizable(t) ? t.bits * 1000 + t.fp8 * 100 + t.centroid_dtype * 10 + t.out_dtype : -1);
  }
  tasks.push_back(range_task(encs[0], cs[0], outs[0], 4, 4, h0, h1, stride, tg.p));  // empty: skipped
  const std::vector<K::DecodeLaunch> plan = K::plan_decode(tasks.data(), int(tasks.size()));
  size_t want = 0;
  for (int k : keys) {
    size_t n = 0;
    for (const K::DecodeArgs& t : tasks)
      if (t.t1 > t.t0 &&
          (K::task_vectorizable(t) ? t.bits * 1000 + t.fp8 * 100 + t.centroid_dtype * 10 + t.out_dtype : -1) == k)
        ++n;
    want += (n + K::kDecodeTasksPerLaunch - 1) / K::kDecodeTasksPerLaunch;
  }
  QVG_EXPECT(plan.size() == want) << plan.size() << "launches, want" << want;
  for (const K::DecodeLaunch& L : plan)
    for (int k = 0; k < L.n; ++k)
      QVG_EXPECT(!L.vec || (L.t[k].bits == L.bits && L.t[k].fp8 == L.fp8 && L.t[k].centroid_dtype == L.centroid_dtype &&
                            L.t[k].out_dtype == L.out_dtype))
          << "a launch mixes modes";
  run_decode_launches(tasks);
  for (size_t i = 0; i < encs.size(); ++i) {
    const std::vector<uint8_t> ref = reference_decode(encs[i], outs[i]);
    const size_t osz = qvg::dtype_size(outs[i]);
    bool same = true;
    for (int64_t b = 0; b < sh.b; ++b)
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = h0; h < h1; ++h) {
          const size_t src = size_t(((b * sh.s + t) * sh.h + h) * sh.d) * osz;
          const size_t dst = off[i] + size_t(b * (t1 - t0) * stride + (t - t0) * stride + (h - h0) * sh.d) * osz;
          same = same && std::memcmp(tg.p + dst, ref.data() + src, size_t(sh.d) * osz) == 0;
        }
    QVG_EXPECT(same) << "task" << i;
    QVG_EXPECT(K::host_misaligned_accesses() == 0) << "misaligned accesses";
    const size_t end = off[i] + size_t(sh.b * (t1 - t0) * stride) * osz;
    for (size_t j = end; j < end + 16; ++j) QVG_EXPECT(tg.p[j] == 0xA5) << "task" << i << "wrote past its target";
  }
}

// kernels::Points, how the encoder's kernels read a stage's points: over an input in
// its [B, S, H, D] layout (bf16, f16, f32; B = 2, H = 3) and over the [G, S, D] fp32
// residual buffer, element (g = b * H + h, t, d) by at, at4, at4_pair and at8 against the
// tensor's own element, bit for bit (NaN, infinities, -0, subnormals included); and
// vector_ok refusing a pointer or D the vector loads cannot take.
QVG_TEST(points_read_the_input_layout_and_the_residual_buffer) {
  std::mt19937 rng(3);
  int checked = 0;
  for (const qvg::DType dt : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
    const qvg::Shape4 sh{2, 5, 3, 16};
    qvg::Tensor x = make_data(dt, sh, 9, 2.0f);
    const size_t numel = size_t(sh.b * sh.s * sh.h * sh.d);
    const float specials[] = {std::nanf(""), INFINITY, -INFINITY, -0.0f, 1e-41f, 3.0e-8f};
    for (size_t k = 0; k < 6; ++k) qvg::store_f32(x.data(), dt, size_t(rng() % numel), specials[k]);
    std::vector<float> buf(numel);  // the [G, S, D] fp32 buffer of the same values
    const int64_t G = sh.b * sh.h, S = sh.s, D = sh.d;
    for (int64_t b = 0; b < sh.b; ++b)
      for (int64_t h = 0; h < sh.h; ++h)
        for (int64_t t = 0; t < S; ++t)
          for (int64_t d = 0; d < D; ++d)
            buf[size_t(((b * sh.h + h) * S + t) * D + d)] =
                qvg::load_f32(x.data(), dt, size_t(((b * S + t) * sh.h + h) * D + d));
    const K::Points in = K::input_points(x.data(), qvg::cuda::arith_dtype(dt), sh.h, S, D);
    QVG_EXPECT(in.vector_ok(8) && in.vector_ok(4)) << qvg::dtype_name(dt);
    for (const K::Points& p : {in, K::residual_points(buf.data(), S, D)}) {
      bool same = true;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t t = 0; t < S; ++t) {
          const int64_t b = g / sh.h, h = g % sh.h, row = p.row(g, t);
          for (int64_t d = 0; d < D; d += 8) {
            float v4[4], v8[8], q0[4], q1[4], z0[4], z1[4];
            p.at8(row + d, v8);
            p.at4_pair(row + d, row + d + 4, true, q0, q1);   // the two halves of the 8
            p.at4_pair(row + d + 4, row + d, false, z0, z1);  // the second not read: zeros
            for (int64_t i = 0; i < 8; ++i) {
              const float want = qvg::load_f32(x.data(), dt, size_t(((b * S + t) * sh.h + h) * D + d + i));
              if (i % 4 == 0) p.at4(row + d + i, v4);
              same = same && qvg::f32_bits(p.at(row + d + i)) == qvg::f32_bits(want) &&
                     qvg::f32_bits(v8[i]) == qvg::f32_bits(want) && qvg::f32_bits(v4[i % 4]) == qvg::f32_bits(want) &&
                     qvg::f32_bits(i < 4 ? q0[i] : q1[i - 4]) == qvg::f32_bits(want);
              if (i >= 4) same = same && qvg::f32_bits(z0[i - 4]) == qvg::f32_bits(want) && z1[i - 4] == 0.0f;
            }
          }
        }
      QVG_EXPECT(same) << qvg::dtype_name(dt) << (p.H == 1 ? "buffer" : "input layout");
      ++checked;
    }
    K::Points odd = in;
    odd.p = static_cast<const uint8_t*>(x.data()) + 4;
    QVG_EXPECT(!odd.vector_ok(4)) << "a pointer off 16 bytes taken for vector loads";
    odd = in;
    odd.D = 12;
    QVG_EXPECT(!odd.vector_ok(8) && odd.vector_ok(4)) << "D = 12";
  }
  QVG_EXPECT(K::host_misaligned_accesses() == 0) << K::host_misaligned_accesses() << "misaligned accesses";
  QVG_EXPECT(checked == 6) << checked;
}

// The centring 4 elements at a time (center_thread_vec4, what center_vec4_kernel runs)
// over every block and thread of its grid, reading the residual buffer and a bf16
// input in its [B, S, H, D] layout, against the rule one element at a time:
// xb = bf16(r - mu[channel]) and the group's largest magnitude (NaN ignored). Values
// include bf16 rounding ties, NaN, infinities, -0 and subnormals; shapes with S * D
// over several blocks and not a multiple of kCenterChunk, D = 4 .. 256.
QVG_TEST(centring_bodies_match_the_element_rule) {
  std::mt19937 rng(77);
  int checked = 0;
  for (const auto& [G, S, D] : std::vector<std::array<int64_t, 3>>{
           {3, 100, 128}, {2, 4680, 128}, {1, 333, 4}, {2, 70, 12}, {1, 90, 256}, {4, 17, 64}})
    for (const int nthreads : {256, 96}) {
      const int64_t n = S * D;
      std::vector<float> r(size_t(G * n)), mu(size_t(G * D));
      std::normal_distribution<float> nd(0.0f, 3.0f);
      for (float& v : mu) v = nd(rng);
      for (size_t i = 0; i < r.size(); ++i) {
        const uint32_t k = uint32_t(rng() % 64);
        float v = nd(rng) * (k == 0 ? 1e30f : 1.0f);
        if (k == 1) v = std::nanf("");
        if (k == 2) v = -INFINITY;
        if (k == 3) v = -0.0f;
        if (k == 4) v = 1e-41f;                                                       // subnormal
        if (k == 5) v = qvg::f32_from_bits(0x3F808000u) + mu[size_t(i % size_t(D))];  // near a bf16 tie
        r[i] = v;
      }
      // 16-byte aligned copies, as the device buffers are
      std::vector<K::Word4> rbuf((r.size() + 3) / 4), mbuf((mu.size() + 3) / 4);
      std::memcpy(rbuf.data(), r.data(), r.size() * 4);
      std::memcpy(mbuf.data(), mu.data(), mu.size() * 4);
      const float* rp = reinterpret_cast<const float*>(rbuf.data());
      const float* mp = reinterpret_cast<const float*>(mbuf.data());
      std::vector<K::Word4> xbuf((size_t(G * n) * 2 + 15) / 16);
      uint16_t* xb = reinterpret_cast<uint16_t*>(xbuf.data());
      // The points as the residual buffer ([G, S, D] fp32), and as stage 0's input
      // ([1, S, H = G, D] bf16: the values rounded to bf16 first).
      std::vector<K::Word4> ibuf((size_t(G * n) * 2 + 15) / 16);
      uint16_t* xin = reinterpret_cast<uint16_t*>(ibuf.data());
      for (int64_t g = 0; g < G; ++g)
        for (int64_t e = 0; e < n; ++e)
          xin[size_t(((e / D) * G + g) * D + e % D)] = A::f32_to_bf16(r[size_t(g * n + e)]);
      const K::Points in = K::input_points(xin, A::kBF16, G, S, D);
      for (const K::Points& src : {K::residual_points(rp, S, D), in}) {
        QVG_EXPECT(K::center_vec4_ok(src, mp, xb)) << "D" << D;
        const int64_t bpg = (n + K::kCenterChunk - 1) / K::kCenterChunk;
        std::vector<float> got_max(size_t(G), 0.0f);
        for (int64_t blk = 0; blk < G * bpg; ++blk)
          for (int tid = 0; tid < nthreads; ++tid) {
            const float m = K::center_thread_vec4(src, mp, bpg, blk, tid, nthreads, xb);
            got_max[size_t(blk / bpg)] = std::fmax(got_max[size_t(blk / bpg)], m);
          }
        bool same = true, max_same = true;
        for (int64_t g = 0; g < G; ++g) {
          float want_max = 0.0f;
          for (int64_t e = 0; e < n; ++e) {
            const float x =
                src.dtype == A::kF32 ? r[size_t(g * n + e)] : A::bf16_to_f32(A::f32_to_bf16(r[size_t(g * n + e)]));
            const float v = A::sub_rn(x, mu[size_t(g * D + e % D)]);
            same = same && xb[size_t(g * n + e)] == A::f32_to_bf16(v);
            want_max = std::fmax(want_max, std::fabs(v));
          }
          max_same = max_same && qvg::f32_bits(got_max[size_t(g)]) == qvg::f32_bits(want_max);
        }
        QVG_EXPECT(same && max_same) << "G" << G << "S" << S << "D" << D << "threads" << nthreads
                                     << (src.dtype == A::kF32 ? "residual buffer" : "bf16 input layout")
                                     << (same ? "maxima differ" : "bf16 points differ");
        ++checked;
      }
    }
  QVG_EXPECT(K::host_misaligned_accesses() == 0) << K::host_misaligned_accesses() << "misaligned accesses";
  QVG_EXPECT(!K::center_vec4_ok(K::residual_points(nullptr, 1, 6), nullptr, nullptr)) << "D = 6 taken 4 at a time";
  std::printf("  %d centring grids compared\n", checked);
}

// The tensor-core assignment's fragment helpers (encode_bodies.cuh: which point
// values a lane loads into its A fragment, which centroid row it hands ldmatrix,
// which (point, centroid) each accumulator holds) against a model of the PTX ISA's
// layouts for mma.m16n8k16 .bf16 and ldmatrix.m8n8.x4 .b16, written from the ISA's
// tables: every accumulator must hold the dot product of the point and the centroid
// the kernel takes it for, and every pair of a 16 x 16 tile must come out once.
QVG_TEST(assignment_fragments_follow_the_ptx_layouts) {
  std::mt19937 rng(5);
  int checked = 0;
  for (const int DIM : {64, 128, 256}) {
    const int LD = DIM + 8, NTILES = 2;
    std::vector<int> x(size_t(16 * DIM)), cs(size_t(8 * NTILES * LD), 99);  // small integers: exact sums
    for (int& v : x) v = int(rng() % 9) - 4;
    for (int c = 0; c < 8 * NTILES; ++c)
      for (int k = 0; k < DIM; ++k) cs[size_t(c * LD + k)] = int(rng() % 9) - 4;
    // a[lane][ks][reg][e]: the A fragments as the kernel loads them
    std::vector<std::array<std::array<int, 2>, 4>> a(size_t(32 * (DIM / 16)));
    for (int lane = 0; lane < 32; ++lane)
      for (int ks = 0; ks < DIM / 16; ++ks)
        for (int reg = 0; reg < 4; ++reg)
          for (int e = 0; e < 2; ++e)
            a[size_t(lane * (DIM / 16) + ks)][size_t(reg)][size_t(e)] =
                x[size_t(K::a_fragment_row(lane, reg) * DIM + K::a_fragment_k(lane, ks, reg) + e)];
    bool aligned = true, linear = true;
    for (int nt = 0; nt < NTILES; ++nt) {
      double acc[32][4] = {};
      for (int ks = 0; ks < DIM / 16; ks += 2) {
        int addr[32];
        for (int lane = 0; lane < 32; ++lane) {
          addr[lane] = K::ldsm_b_offset(lane, nt, ks, LD);
          aligned = aligned && addr[lane] % 8 == 0;
          // the kernel adds the lane's part (once) and the step's (per load)
          linear = linear && addr[lane] == K::ldsm_b_offset(lane, 0, 0, LD) + K::ldsm_b_offset(0, nt, ks, LD);
        }
        // ldmatrix: thread t's register q = row t / 4 of matrix q (the row lane 8q + t / 4
        // addressed), columns 2 (t % 4), +1
        int b[32][4][2];
        for (int t = 0; t < 32; ++t)
          for (int q = 0; q < 4; ++q)
            for (int e = 0; e < 2; ++e) b[t][q][e] = cs[size_t(addr[8 * q + t / 4] + 2 * (t % 4) + e)];
        for (int half = 0; half < 2; ++half) {  // mma with B regs (0, 1) at ks, then (2, 3) at ks + 1
          // the ISA's layouts: A element a_i of lane (gid, tig): row gid + 8 ((i / 2) % 2), column
          // 2 tig + i % 2 + 8 (i / 4), register i / 2; B element b_i: row (k) 2 tig + i % 2 + 8 (i / 2),
          // column gid; C element c_i: row gid + 8 (i / 2), column 2 tig + i % 2
          int Am[16][16], Bm[16][8];
          for (int lane = 0; lane < 32; ++lane) {
            const int gid = lane / 4, tig = lane % 4;
            for (int i = 0; i < 8; ++i)
              Am[gid + 8 * ((i / 2) % 2)][2 * tig + i % 2 + 8 * (i / 4)] =
                  a[size_t(lane * (DIM / 16) + ks + half)][size_t(i / 2)][size_t(i % 2)];
            for (int i = 0; i < 4; ++i) Bm[2 * tig + i % 2 + 8 * (i / 2)][gid] = b[lane][2 * half + i / 2][i % 2];
          }
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 4; ++i) {
              const int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
              for (int k = 0; k < 16; ++k) acc[lane][i] += double(Am[row][k]) * double(Bm[k][col]);
            }
        }
      }
      std::set<std::pair<int, int>> seen;
      bool same = true;
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const int row = K::c_fragment_row(lane, i), col = nt * 8 + K::c_fragment_col(lane, i);
          double want = 0;
          for (int k = 0; k < DIM; ++k) want += double(x[size_t(row * DIM + k)]) * double(cs[size_t(col * LD + k)]);
          same = same && acc[lane][i] == want;
          seen.insert({row, col});
        }
      QVG_EXPECT(same && seen.size() == 128) << "D" << DIM << "n-tile" << nt << "pairs" << seen.size();
      ++checked;
    }
    QVG_EXPECT(aligned) << "an ldmatrix row address not 16-byte aligned, D" << DIM;
    QVG_EXPECT(linear) << "ldsm_b_offset is not the lane's part plus the step's, D" << DIM;
  }
  std::printf("  %d n-tiles' accumulators checked against the ISA's layouts\n", checked);
}

// The initial point indices the device draws (random_init_indices: sparse
// Fisher-Yates in a 512-slot table) against the indices the CPU codec's k-means
// uses (detail::random_init_indices, a dense Fisher-Yates over 0..S-1).
QVG_TEST(init_indices_match_cpu_codec) {
  int checked = 0;
  std::vector<uint32_t> keys(K::kInitTableSlots), vals(K::kInitTableSlots), idx(256);
  for (uint64_t seed : {0ull, 1234ull, 18446744073709551615ull})
    for (int stage : {0, 1, 5})
      for (int64_t S : {2ll, 3ll, 17ll, 256ll, 257ll, 1000ll, 4680ll, 29640ll})
        for (int k : {1, 2, 7, 128, 255, 256}) {
          if (k >= S) continue;
          const int64_t b = seed % 3, h = (S + stage) % 7;
          std::fill(keys.begin(), keys.end(), K::kInitEmpty);
          K::random_init_indices(seed, stage, b, h, S, k, keys.data(), vals.data(), idx.data());
          const std::vector<uint32_t> cpu = qvg::detail::random_init_indices(seed, stage, b, h, S, k);
          QVG_EXPECT(std::equal(cpu.begin(), cpu.end(), idx.begin()))
              << "seed" << seed << "stage" << stage << "S" << S << "k" << k;
          ++checked;
        }
  QVG_EXPECT(checked > 200) << checked;
}

// The kernels' index division (idiv: a shift for powers of two, a 32-bit division
// when both operands fit, else the 64-bit one) and log2_pow2 against the quotient, at
// the boundaries of each path: divisors 1, powers of two up to 2^40, odd and even
// non-powers, 2^32 - 1 and 2^32 + 1; dividends 0, d - 1, d, multiples, 2^31 - 1,
// 2^32 - 1, 2^32 and random ones up to 2^62.
QVG_TEST(index_division_matches_the_quotient) {
  std::mt19937_64 rng(23);
  std::vector<int64_t> ds = {1,         2,
                             3,         7,
                             8,         12,
                             16,        29640,
                             4096,      (1ll << 31) - 1,
                             1ll << 31, (1ll << 32) - 1,
                             1ll << 32, (1ll << 32) + 1,
                             1ll << 40, 3ll << 33};
  for (int i = 0; i < 200; ++i) ds.push_back(int64_t(1 + rng() % (i % 2 ? 100000u : (1ull << 40))));
  int bad = 0, checked = 0;
  for (const int64_t d : ds) {
    std::vector<int64_t> ns = {0, d - 1, d, 2 * d - 1, 2 * d, 5 * d + 3, (1ll << 31) - 1, (1ll << 32) - 1, 1ll << 32};
    for (int i = 0; i < 50; ++i) ns.push_back(int64_t(rng() % (i % 2 ? (1ull << 32) : (1ull << 62))));
    for (const int64_t n : ns) {
      bad += K::idiv(n, d) != n / d;
      ++checked;
    }
    if ((d & (d - 1)) == 0) bad += (int64_t(1) << K::log2_pow2(d)) != d;
  }
  QVG_EXPECT(bad == 0 && checked > 10000) << bad << checked;
}

// code_value (the scale search's codes from one reciprocal per block and candidate,
// residual_impl.h) gives round_clamp(div_rn(a, s), lo, hi) for every quotient: scales
// of every exponent (subnormal, the reciprocal's bounds 2^-125 and 2^126, the largest
// float), numerators on and 1 to 4 ulps around every half-integer multiple h * s up to
// 16.5 (where a multiply by the rounded reciprocal and the division may round to
// different sides), integer multiples, random bits of every exponent, zeros,
// subnormals and infinities, over the clamp ranges of int2/int3/int4 symmetric and
// asymmetric. quantize_code_recip equals quantize_code, and block_sq_error_recip_at
// equals block_sq_error_at bit for bit on blocks of such values.
QVG_TEST(reciprocal_codes_equal_the_divided_codes) {
  std::mt19937_64 rng(41);
  std::vector<float> scales;
  for (uint32_t e = 0; e < 255; ++e)
    for (int i = 0; i < 6; ++i) {
      const uint32_t man = i == 0 ? 0u : i == 1 ? 0x7FFFFFu : uint32_t(rng() & 0x7FFFFFu);
      const float s = A::from_bits((e << 23) | man);
      if (s > 0.0f) scales.push_back(s);
    }
  for (const float s : {0x1p-125f, std::nextafter(0x1p-125f, 0.0f), 0x1p126f, std::nextafter(0x1p126f, 0.0f), 1.0f,
                        1.0f / 3.0f, 0.1f, 448.0f, 0x1p-149f, 3.4028235e38f})
    scales.push_back(s);
  const std::array<std::pair<float, float>, 6> ranges{{{-1, 1}, {-3, 3}, {-7, 7}, {0, 3}, {0, 7}, {0, 15}}};
  int64_t checked = 0, bad = 0, near_half = 0;
  std::vector<float> as;
  for (const float s : scales) {
    const float inv = A::code_reciprocal(s);
    const bool inv_ok = inv == 0.0f || (inv == 1.0f / s && std::isnormal(inv));
    bad += !inv_ok;
    as.clear();
    for (int k = 0; k <= 16; ++k)
      for (const float h : {float(k) + 0.5f, -(float(k) + 0.5f), float(k), -float(k)}) {
        float a = A::mul_rn(h, s);
        if (!std::isfinite(a)) continue;
        as.push_back(a);
        float up = a, down = a;
        for (int step = 0; step < 4; ++step) {
          up = std::nextafter(up, INFINITY);
          down = std::nextafter(down, -INFINITY);
          as.push_back(up);
          as.push_back(down);
        }
      }
    for (int i = 0; i < 24; ++i) {
      const float a = A::from_bits(uint32_t(rng()));
      if (!std::isnan(a)) as.push_back(a);
    }
    for (const float a : {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, INFINITY, -INFINITY}) as.push_back(a);
    for (const float a : as) {
      const double ex = double(a) / double(s);  // the exact quotient's neighbourhood, for the count only
      near_half += std::abs(std::abs(ex - std::floor(ex)) - 0.5) < 1e-6;
      for (const auto& [lo, hi] : ranges) {
        const float want = A::int_to_float(A::round_clamp(A::div_rn(a, s), lo, hi));
        const float got = A::code_value(a, s, inv, lo, hi);
        if (got != want) {
          if (bad < 5)
            std::printf("  code_value(%a, %a) in [%g, %g] = %g, the division gives %g\n", double(a), double(s),
                        double(lo), double(hi), double(got), double(want));
          ++bad;
        }
        ++checked;
      }
    }
  }
  // quantize_code_recip and block_sq_error_recip_at against their dividing rules.
  int64_t qchecked = 0, echecked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const float s = trial % 7 == 0 ? scales[size_t(rng() % scales.size())]
                                   : std::ldexp(1.0f + float(rng() % 1024) / 1024.0f, int(rng() % 40) - 20);
    const float z = trial % 3 == 0 ? 0.0f : std::ldexp(float(int(rng() % 2001) - 1000) / 1000.0f, int(rng() % 20) - 10);
    const bool asym = trial % 2 == 1;
    const int qmax = std::array<int, 3>{1, 3, 7}[size_t(trial % 3)] * (asym ? 2 : 1) + (asym ? 1 : 0);
    std::array<float, 64> x;
    for (size_t i = 0; i < x.size(); ++i) {
      const float h = float(int(rng() % 33) - 16) * 0.5f;  // on the half-integers and integers
      float v = A::add_rn(A::mul_rn(h, s), asym ? z : 0.0f);
      for (int st = int(rng() % 7) - 3; st != 0; st += st > 0 ? -1 : 1)
        v = std::nextafter(v, st > 0 ? INFINITY : -INFINITY);
      x[i] = i % 9 == 8 ? A::from_bits(uint32_t(rng()) & 0xBFFFFFFFu) : v;  // and some of any exponent below 1
    }
    const float inv = A::code_reciprocal(s);
    for (const float v : x) {
      bad += A::quantize_code_recip(v, qmax, asym, s, z, inv) != A::quantize_code(v, qmax, asym, s, z);
      ++qchecked;
    }
    for (const float se : {s, 0.0f}) {
      const float e0 = A::block_sq_error(x.data(), int64_t(x.size()), qmax, asym, se, z);
      const float e1 = A::block_sq_error_recip_at(A::ArrayAt{x.data()}, int64_t(x.size()), qmax, asym, se, z);
      bad += A::bits_of(e0) != A::bits_of(e1) && !(std::isnan(e0) && std::isnan(e1));
      ++echecked;
    }
  }
  std::printf("  %lld code values (%lld quotients within 1e-6 of a half-integer), %lld codes, %lld block errors\n",
              static_cast<long long>(checked), static_cast<long long>(near_half), static_cast<long long>(qchecked),
              static_cast<long long>(echecked));
  QVG_EXPECT(bad == 0 && checked > 1000000 && near_half > 100000 && qchecked > 100000) << bad;
}

// The half-warp search's choice (search_min's butterfly over 16 keys, search_choice)
// is scale_search_best's over the distinct candidates, on error lists the quantizer
// cases do not reach: 15 candidates whose stored bits repeat the previous one's in
// runs (equal errors; scale_search_keep drops all but the first of a run), errors
// from a few values with ties, +inf and NaN (candidate 0's included), lane 15 a
// repeat of candidate 14 with index 15.
QVG_TEST(search_keys_choose_what_scale_search_best_chooses) {
  std::mt19937 rng(31);
  const float pool[] = {0.0f, 1.0f, 1.0f, 2.0f, 0.5f, INFINITY, std::nanf("")};
  constexpr int L = K::kSearchLanes, M = A::kScaleSearchSteps;
  int checked = 0, bad = 0, nan_first = 0, repeats = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    // A run structure: candidate k repeats k - 1 (same bits, same error) or starts a new run.
    std::array<float, M> full{};
    std::array<int, M> first_of_run{};
    std::vector<float> distinct;
    std::vector<int> distinct_at;  // index in `full` of each kept candidate
    for (int k = 0; k < M; ++k) {
      const bool repeat = k > 0 && rng() % 3 == 0;
      if (repeat) {
        full[size_t(k)] = full[size_t(k - 1)];
        first_of_run[size_t(k)] = first_of_run[size_t(k - 1)];
        ++repeats;
      } else {
        full[size_t(k)] = pool[rng() % (sizeof(pool) / sizeof(pool[0]))];
        first_of_run[size_t(k)] = k;
        distinct.push_back(full[size_t(k)]);
        distinct_at.push_back(k);
      }
    }
    nan_first += std::isnan(full[0]);
    const int want = distinct_at[size_t(A::scale_search_best(distinct.data(), int(distinct.size())))];
    std::array<K::SearchKey, L> key;
    for (int l = 0; l < L; ++l) key[size_t(l)] = K::SearchKey{full[size_t(std::min(l, M - 1))], l};
    const float err0 = key[0].err;
    for (int o = L / 2; o > 0; o /= 2) {
      std::array<K::SearchKey, L> next;
      for (int l = 0; l < L; ++l) next[size_t(l)] = K::search_min(key[size_t(l)], key[size_t(l ^ o)]);
      key = next;
    }
    for (int l = 1; l < L; ++l) bad += key[size_t(l)].k != key[0].k;
    const int got = K::search_choice(key[0], err0);
    // The chosen candidate's stored bits: those of its run's first (kept) candidate.
    bad += got >= M || first_of_run[size_t(got)] != want;
    ++checked;
  }
  QVG_EXPECT(bad == 0 && checked == 20000 && nan_first > 1000 && repeats > 50000) << bad << nan_first << repeats;
}

// The update rule of the device encoder: fixed_exponent keeps S * maxabs * 2^e in
// [2^59, 2^61); to_fixed rounds half to even; centroid_from_fixed of an exact sum
// is the correctly rounded mean (the reference: the mean in long double).
QVG_TEST(fixed_point_update_rules) {
  QVG_EXPECT(K::to_fixed(2.5f, 0) == 2 && K::to_fixed(3.5f, 0) == 4 && K::to_fixed(-2.5f, 0) == -2 &&
             K::to_fixed(0.75f, 1) == 2);
  // The integer form against the exact fp64 product rounded to nearest even, over
  // random bit patterns (normal and subnormal floats, both signs), exponents with
  // |x| * 2^e < 2^62, and exact ties.
  {
    std::mt19937 bits_rng(19);
    int compared = 0, mismatched = 0;
    for (int i = 0; i < 400000; ++i) {
      uint32_t b = uint32_t(bits_rng());
      if (i % 4 == 0) b &= 0x807FFFFFu;  // a subnormal (or a zero)
      float x;
      std::memcpy(&x, &b, 4);
      if (!std::isfinite(x)) continue;
      int fexp = 0;
      std::frexp(x, &fexp);
      const int emax = 61 - fexp;  // |x| * 2^e < 2^61
      const int e = emax - int(bits_rng() % 90u);
      if (i % 7 == 0 && x != 0.0f) {  // an exact tie: x * 2^e = k + 1/2
        const float t = std::ldexp(float(int(bits_rng() % 1000u)) + 0.5f, -e);
        if (std::isfinite(t) && std::ldexp(double(t), e) == double(int(std::ldexp(double(t), e) - 0.5)) + 0.5) x = t;
      }
      const long long want = (long long)std::nearbyint(std::ldexp(double(x), e));
      mismatched += K::to_fixed(x, e) != want;
      mismatched += K::to_fixed_scaled(x, K::fixed_scale(e)) != want;  // the update's form
      ++compared;
    }
    QVG_EXPECT(mismatched == 0 && compared > 390000) << mismatched << compared;
  }
  // to_fixed_scaled at every exponent fixed_exponent can give (-99..208): the largest
  // |x| the update passes (just below 2^(61 - e)), ties and their neighbours at
  // several scales, tiny and subnormal x (a product that underflows), zeros.
  {
    std::mt19937 rng(29);
    int compared = 0, mismatched = 0;
    for (int e = -99; e <= 208; ++e) {
      std::vector<float> xs = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, std::nextafter(0x1p-126f, 0.0f)};
      const float top = std::nextafter(std::ldexp(1.0f, 61 - e), 0.0f);
      if (std::isfinite(top)) {
        xs.push_back(top);
        xs.push_back(-top);
      }
      for (int i = 0; i < 40; ++i) {
        const int k = int(rng() % 40u);  // x * 2^e = n + 1/2 with n < 2^k
        const float t = std::ldexp(float(rng() % (1u << std::min(k, 22))) + 0.5f, -e);
        if (t == 0.0f || !std::isfinite(t)) continue;
        for (const float v : {t, std::nextafter(t, 0.0f), std::nextafter(t, INFINITY)}) {
          xs.push_back(v);
          xs.push_back(-v);
        }
      }
      for (const float x : xs) {
        if (std::ldexp(std::fabs(double(x)), e) >= 0x1p62) continue;
        mismatched += K::to_fixed_scaled(x, K::fixed_scale(e)) != K::to_fixed(x, e);
        ++compared;
      }
    }
    QVG_EXPECT(mismatched == 0 && compared > 30000) << mismatched << compared;
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int bad = 0;
  for (int i = 0; i < 2000; ++i) {
    const float maxabs = std::ldexp(std::fabs(u(rng)) + 1e-3f, int(rng() % 60) - 30);
    const int64_t S = 1 + int64_t(rng() % 100000);
    const int e = K::fixed_exponent(maxabs, S);
    const long double bound = (long double)S * maxabs * std::ldexp(1.0L, e);
    if (!(bound < std::ldexp(1.0L, 61) && bound >= std::ldexp(1.0L, 58))) ++bad;
    // Points on the 2^-e grid: the fixed-point sum is exact, the mean correctly rounded.
    const int cnt = 1 + int(rng() % 50);
    long long sum = 0;
    long double exact = 0;
    for (int j = 0; j < cnt; ++j) {
      const float x = std::ldexp(std::round(std::ldexp(u(rng) * maxabs, 12)), -12);
      if (std::ldexp(double(x), e) != std::round(std::ldexp(double(x), e))) continue;  // off the grid
      sum += K::to_fixed(x, e);
      exact += x;
    }
    const float got = K::centroid_from_fixed(sum, cnt, e);
    const double want = double(exact / cnt);  // |rel. error| ~ 2^-64 before rounding to fp32
    if (std::fabs(double(got) - want) > std::fabs(want) * 0x1p-24 + 1e-300) ++bad;
  }
  QVG_EXPECT(bad == 0) << bad;
}

// The update kernel's block work (update_accumulate_kernel) on the host: every block
// of its grid (group, chunk of kUpdPoints, slice of kUpdLanes channels) sorts its
// chunk's points by cluster with a random order within each cluster (the scatter's
// shared atomics give any), splits the sorted positions among 16 (and 8, 3, 1) warps
// as update_warp_range does, and runs update_run_sums for each lane; the flushed sums
// (wrapping, as the 64-bit global atomics add them) must equal the direct sums of
// to_fixed(r - mu) in point order, bit for bit, for every (group, cluster, channel).
// Each lane flushes once per run (ids strictly increasing), never a zero sum, never
// past D. Inputs: the residual buffer and the [B, S, H, D] input layout of each dtype;
// S over several chunks and not a multiple of kUpdPoints, below 8 per warp, and 1; D
// not a multiple of 32; K = 1, 5, 256 with a dominant cluster, empty clusters and
// values 0, -0, subnormal and large.
QVG_TEST(update_block_sums_equal_the_direct_sums) {
  std::mt19937 rng(41);
  int checked = 0, flushes = 0;
  struct Case {
    int64_t B, S, H, D;
    int K;
  };
  for (const Case c : {Case{1, 9000, 2, 40, 256}, Case{2, 4097, 3, 16, 5}, Case{1, 4096, 1, 128, 256},
                       Case{1, 5, 2, 64, 256}, Case{1, 1, 1, 33, 1}, Case{1, 700, 4, 8, 5}})
    for (const qvg::DType dt : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32})
      for (const bool layout : {true, false}) {
        const qvg::Shape4 sh{c.B, c.S, c.H, c.D};
        qvg::Tensor x = make_data(dt, sh, uint32_t(rng()), 3.0f);
        const int64_t G = c.B * c.H, S = c.S, D = c.D, K = c.K, numel = G * S * D;
        const float specials[] = {0.0f, -0.0f, 1e-41f, 3.0e-8f, 250.0f, -250.0f};
        for (size_t k = 0; k < 6; ++k) qvg::store_f32(x.data(), dt, size_t(rng() % uint64_t(numel)), specials[k]);
        std::vector<float> buf(static_cast<size_t>(numel));  // the same values as the [G, S, D] fp32 buffer
        for (int64_t g = 0; g < G; ++g)
          for (int64_t t = 0; t < S; ++t)
            for (int64_t d = 0; d < D; ++d)
              buf[size_t((g * S + t) * D + d)] =
                  qvg::load_f32(x.data(), dt, size_t(((g / c.H * S + t) * c.H + g % c.H) * D + d));
        const K::Points pts = layout ? K::input_points(x.data(), qvg::cuda::arith_dtype(dt), c.H, S, D)
                                     : K::residual_points(buf.data(), S, D);
        std::vector<uint8_t> ids(size_t(G * S));
        for (auto& id : ids) id = uint8_t(rng() % 3 == 0 ? 0 : rng() % uint32_t(K));  // cluster 0 dominant
        if (K == 256)
          for (auto& id : ids) id = id == 200 ? uint8_t(0) : id;  // an empty cluster
        std::vector<float> mu(size_t(G * D));
        std::vector<int> fe(static_cast<size_t>(G));
        for (auto& m : mu) m = std::uniform_real_distribution<float>(-0.5f, 0.5f)(rng);
        std::vector<unsigned long long> want(size_t(G * K * D), 0ull), got(want.size(), 0ull);
        for (int64_t g = 0; g < G; ++g) {
          float maxabs = 0.0f;
          for (int64_t i = 0; i < S * D; ++i)
            maxabs = std::fmax(maxabs, std::fabs(A::sub_rn(buf[size_t(g * S * D + i)], mu[size_t(g * D + i % D)])));
          fe[size_t(g)] = K::fixed_exponent(maxabs, S);
          for (int64_t t = 0; t < S; ++t)
            for (int64_t d = 0; d < D; ++d)
              want[size_t((g * K + ids[size_t(g * S + t)]) * D + d)] += (unsigned long long)K::to_fixed(
                  A::sub_rn(buf[size_t((g * S + t) * D + d)], mu[size_t(g * D + d)]), fe[size_t(g)]);
        }
        const int nwarp = std::array{16, 8, 3, 1}[size_t(checked % 4)];  // 16: the kernel's
        bool once_per_run = true, in_range = true;
        for (int64_t g = 0; g < G; ++g)
          for (int64_t t0 = 0; t0 < S; t0 += K::kUpdPoints) {
            const int n = int(std::min<int64_t>(S - t0, K::kUpdPoints));
            std::vector<std::vector<uint32_t>> by_id(256);  // the counting sort, any order within a cluster
            for (int i = 0; i < n; ++i) {
              const int id = ids[size_t(g * S + t0 + i)];
              by_id[size_t(id)].push_back(K::update_key(id, i));
            }
            std::vector<uint32_t> keys;
            for (auto& v : by_id) {
              std::shuffle(v.begin(), v.end(), rng);
              keys.insert(keys.end(), v.begin(), v.end());
            }
            for (int64_t slice = 0; slice * K::kUpdLanes < D; ++slice)
              for (int w = 0; w < nwarp; ++w) {
                int p0 = 0, p1 = 0;
                K::update_warp_range(n, w, nwarp, &p0, &p1);
                for (int lane = 0; lane < K::kUpdLanes; ++lane) {
                  const int64_t d = slice * K::kUpdLanes + lane;
                  const bool in_d = d < D;
                  const int64_t dv = in_d ? d : D - 1;  // as the kernel: a valid channel
                  int last = -1;
                  const auto flush = [&](int id, unsigned long long sum) {
                    once_per_run = once_per_run && id > last && sum != 0ull;
                    in_range = in_range && in_d && id >= 0 && id < K;
                    last = id;
                    got[size_t((g * K + id) * D + dv)] += sum;
                    ++flushes;
                  };
                  const float m = mu[size_t(g * D + dv)];
                  const int64_t rd = pts.base(g) + dv;
                  K::with_dtype(pts.dtype, [&](auto et) {
                    K::update_run_sums<decltype(et)::value>(pts, rd, t0, keys.data(), p0, p1, in_d, m, fe[size_t(g)],
                                                            flush);
                  });
                }
              }
          }
        QVG_EXPECT(got == want && once_per_run && in_range)
            << qvg::dtype_name(dt) << (layout ? "input layout" : "buffer") << "S" << S << "D" << D << "K" << K
            << "warps" << nwarp << once_per_run << in_range;
        ++checked;
      }
  QVG_EXPECT(checked == 36 && flushes > 100000) << checked << flushes;
  // update_warp_range: the warps' shares cover [0, n) once, in order, sizes within one.
  bool covers = true;
  for (const int n : {0, 1, 7, 8, 9, 4095, 4096})
    for (const int nwarp : {1, 3, 8, 16}) {
      int next = 0, lo = n, hi = 0;
      for (int w = 0; w < nwarp; ++w) {
        int p0 = 0, p1 = 0;
        K::update_warp_range(n, w, nwarp, &p0, &p1);
        covers = covers && p0 == next && p1 >= p0;
        next = p1;
        lo = std::min(lo, p1 - p0);
        hi = std::max(hi, p1 - p0);
      }
      covers = covers && next == n && hi - lo <= 1;
    }
  QVG_EXPECT(covers);
  QVG_EXPECT(K::update_key(255, 4095) >> 16 == 255u && (K::update_key(255, 4095) & 0xFFFFu) == 4095u);
}

namespace {

/// What the quantizer kernels do, on the host: the statistics pass (vectorised:
/// stats_lane per thread, the segment merge of the kernel's shfl_down loop over
/// each warp of 32 lanes, stats_leader; else stats_scan per block), the group
/// maxima, the stored scales (scale_block per block), the pack (pack_word per 8
/// channels, else pack_group_at per group of codes).
/// search_block of a's width (the thread-per-block search, search_scales' path past
/// 767 channels per block).
void search_block_of_width(const K::QuantizeArgs& a, int64_t si) {
  qvg::dispatch_width(a.bits, [&](auto w) { K::search_block<decltype(w)>(a, si); });
}

/// search_half_kernel on block si, its 16 lanes run one after the other: the staging
/// (search_stage per lane), the statistics (the lanes' runs merged, else a scan),
/// each lane's key (search_lane), the kernel's butterfly of
/// search_min over shfl_xor offsets 8, 4, 2, 1, candidate 0's error broadcast, the
/// chosen candidate's fields read from lane `best`, and search_pack per lane. Returns
/// false if the merged statistics differ from the scan's bits or the lanes end the
/// butterfly with different keys (the kernel's shuffles would then read different
/// candidates).
bool search_half_of_width(const K::QuantizeArgs& a, int64_t si) {
  return qvg::dispatch_width(a.bits, [&](auto w) {
    using W = decltype(w);
    constexpr int L = K::kSearchLanes;
    std::vector<float> buf(size_t(a.block), std::nanf(""));
    for (int l = 0; l < L; ++l) K::search_stage(a, si, l, buf.data());
    // The statistics: the kernel's merge of the lanes' runs (shfl_down over
    // segment_merge_offset, width 16: a lane past the segment reads its own), else a scan.
    K::RunStats st = K::search_scan(buf.data(), a.block, a.asymmetric);
    if (a.block % L == 0) {
      std::array<K::RunStats, L> run;
      for (int l = 0; l < L; ++l) run[size_t(l)] = K::search_run(buf.data(), a.block, l, a.asymmetric);
      for (int step = 0; (1 << step) < L; ++step) {
        const int o = K::segment_merge_offset(step);
        const std::array<K::RunStats, L> before = run;
        for (int l = 0; l < L; ++l)
          if (l % (2 * o) == 0) K::run_merge(run[size_t(l)], before[size_t(l + o < L ? l + o : l)], a.asymmetric);
      }
      if (A::bits_of(run[0].lo) != A::bits_of(st.lo) || A::bits_of(run[0].hi) != A::bits_of(st.hi)) return false;
      st = run[0];
    }
    std::array<A::ScaleCandidate, L> c;
    std::array<K::SearchKey, L> key;
    for (int l = 0; l < L; ++l) key[size_t(l)] = K::search_lane<W>(a, si, buf.data(), l, st, c[size_t(l)]);
    const float err0 = key[0].err;
    for (int o = L / 2; o > 0; o /= 2) {
      std::array<K::SearchKey, L> next;
      for (int l = 0; l < L; ++l) next[size_t(l)] = K::search_min(key[size_t(l)], key[size_t(l ^ o)]);
      key = next;
    }
    bool same = true;
    for (int l = 1; l < L; ++l) same = same && key[size_t(l)].k == key[0].k;
    const int best = K::search_choice(key[0], err0);
    const A::ScaleCandidate& b = c[size_t(best)];
    for (int l = 0; l < L; ++l) K::search_pack<W>(a, si, buf.data(), l, b.s_bits, b.z_bits, b.s_eff, b.z_eff);
    return same && best < A::kScaleSearchSteps;
  });
}

/// The quantizer's outputs into the arrays of `t` (its asymmetric and scaling fields
/// decide which), its scratch into the given vectors.
void outputs_into(K::QuantizeArgs& a, qvg::EncodedTensor& t, std::vector<float>& raw_s, std::vector<float>& raw_z,
                  std::vector<float>& gmax) {
  a.codes = t.codes.data();
  a.scales = t.scales.data();
  a.zeros = t.asymmetric ? t.zeros.data() : nullptr;
  a.scale_factor = a.two_level ? t.scale_factor.data() : nullptr;
  a.zero_factor = a.two_level && t.asymmetric ? t.zero_factor.data() : nullptr;
  a.raw_s = raw_s.data();
  a.raw_z = raw_z.data();
  a.group_max = gmax.data();
}

void run_quantize_kernels(const K::QuantizeArgs& a, int threads_per_block = 256) {
  std::fill(a.group_max, a.group_max + 2 * a.G, 0.0f);
  const int64_t nb = a.D / a.block;
  if (K::quantize_vectorizable(a.D, a.block) && a.r.vector_ok(8)) {
    const int width = a.block / 8;
    const int64_t wpg = a.S * (a.D / 8), bpg = (wpg + threads_per_block - 1) / threads_per_block;
    for (int64_t g = 0; g < a.G; ++g)
      for (int64_t w0 = 0; w0 < bpg * threads_per_block; w0 += 32) {  // one warp
        K::RunStats lane[32];
        for (int l = 0; l < 32; ++l) lane[l] = K::stats_lane(a, g, w0 + l);
        // __shfl_down_sync(v, o, width) with the kernel's offsets, all lanes at once
        for (int step = 0, o = K::segment_merge_offset(0); o < width; o = K::segment_merge_offset(++step)) {
          K::RunStats prev[32];
          std::copy(lane, lane + 32, prev);
          for (int l = 0; l < 32; ++l) {
            const K::RunStats later = (l % width) + o < width ? prev[l + o] : prev[l];
            K::run_merge(lane[l], later, a.asymmetric);
          }
        }
        for (int l = 0; l < 32; ++l) {
          float ms = 0, mz = 0;
          K::stats_leader(a, g, w0 + l, lane[l], ms, mz);
          a.group_max[g] = std::max(a.group_max[g], ms);
          a.group_max[a.G + g] = std::max(a.group_max[a.G + g], mz);
        }
      }
  } else {
    for (int64_t g = 0; g < a.G; ++g)
      for (int64_t i = 0; i < a.S * nb + 7; ++i) {  // past the group too, as the grid's last block
        float ms = 0, mz = 0;
        K::stats_scan(a, g, i, ms, mz);
        a.group_max[g] = std::max(a.group_max[g], ms);
        a.group_max[a.G + g] = std::max(a.group_max[a.G + g], mz);
      }
  }
  for (int64_t si = 0; si < a.G * a.S * nb; ++si) K::scale_block(a, si);
  qvg::dispatch_width(a.bits, [&](auto wd) {  // as quantize_residual picks the pack kernel
    using W = decltype(wd);
    if (K::kCodeWordFits<W> && K::quantize_vectorizable(a.D, a.block) && a.r.vector_ok(8))
      for (int64_t w = 0; w < a.G * a.S * (a.D / 8); ++w) K::pack_word<W>(a, w);
    else
      for (int64_t e = 0; e < K::code_groups<W>(a); ++e) K::pack_group_at<W>(a, e);
  });
}

}  // namespace

// The quantizer's kernels (run on the host as the grid runs them) against
// quantize_residual_group, in every scale mode, on the vectorised path (blocks of 8
// to 256 channels: segments of 1 to 32 lanes, D = 64/128/256) and the per-block one
// (blocks of 24, and of 4/2 channels), with the final residual given (r) or fused
// (r minus the last stage's stored centroid of each row's id). The data includes
// huge groups (compat fp8 saturation), tiny ones (zero scales), zero blocks, exact
// .5 ties, and asymmetric blocks whose minimum is a zero of either sign, with a -0
// and a +0 in different lanes (the stored zero keeps the sign the CPU's in-order
// scan finds): lanes 0 and 1 (channels 3, 13), and lanes 1 and 4 (channels 8, 32),
// which only a merge in channel order gets right.
QVG_TEST(quantize_kernels_match_quantize_residual_group) {
  struct BlockCase {
    int64_t D;
    int block;
  };
  const BlockCase blocks[] = {{64, 8},   {64, 32},   {64, 64}, {128, 16}, {128, 64}, {128, 128},
                              {256, 64}, {256, 256}, {48, 24}, {64, 4},   {64, 2}};
  int checked = 0, vec_cases = 0, zero_signs = 0, mse_checked = 0, mse_changed = 0;
  uint32_t seed = 100;
  for (const Mode& m : every_width_modes()) {
    if (m.stages != 1) continue;
    for (const BlockCase& bc : blocks)
      for (bool fused : {false, true}) {
        if (bc.block % qvg::find_code_format(m.bits)->group_codes != 0) continue;
        const qvg::Shape4 sh{1, 29, 3, bc.D};
        const int block = bc.block;
        qvg::EncodedTensor e;
        e.dtype = qvg::DType::F32;
        e.shape = sh;
        e.bits = m.bits;
        e.block_size = block;
        e.asymmetric = m.asym;
        e.scale_dtype = m.sd;
        e.scaling = m.sc;
        const int64_t G = sh.b * sh.h, S = sh.s, D = sh.d, nb = D / block;
        const int Kc = 5;
        e.codes.assign(size_t(G * S * D * m.bits / 8), 0);
        e.scales.assign(size_t(G * S * nb) * e.scale_elem_size(), 0);
        if (m.asym) e.zeros.assign(e.scales.size(), 0);
        if (m.sc == qvg::Scaling::TwoLevel) {
          e.scale_factor.assign(size_t(G), 1.0f);
          if (m.asym) e.zero_factor.assign(size_t(G), 1.0f);
        }
        // Final residuals: group 0 ordinary, group 1 huge (fp8 saturation in compat),
        // group 2 tiny (underflow to a zero scale); in each, token 0 all zero, token 1
        // exact ties, token 2 non-negative with zeros of both signs in its first block.
        std::mt19937 rng(seed++);
        std::normal_distribution<float> n01(0.0f, 1.0f);
        std::vector<float> fin(size_t(G * S * D));
        for (int64_t g = 0; g < G; ++g)
          for (int64_t i = 0; i < S * D; ++i) {
            const float s = g == 0 ? 1.0f : g == 1 ? 5000.0f : 1e-12f;
            float v = s * n01(rng);
            if (i < D) v = 0.0f;
            if (i >= D && i < 2 * D) v = s * 0.5f * float(i % 5);
            if (i >= 2 * D && i < 3 * D) {
              const int64_t d = i - 2 * D;
              v = std::fabs(v) + s;
              if (d == 3) v = g == 1 ? 0.0f : -0.0f;   // the first zero: -0 (groups 0, 2) or +0 (group 1)
              if (d == 13) v = g == 1 ? -0.0f : 0.0f;  // a later zero of the other sign (another lane)
            }
            if (i >= 3 * D && i < 4 * D) {  // token 3: the first zero in lane 1 (channel 8), the other in
              const int64_t d = i - 3 * D;  // lane 4 (channel 32), which a merge in the lane order 0, 4, 2,
              v = std::fabs(v) + s;         // 6, 1, 5, 3, 7 takes first
              if (d == 8) v = g == 1 ? 0.0f : -0.0f;
              if (d == 32) v = g == 1 ? -0.0f : 0.0f;
            }
            fin[size_t(g * S * D + i)] = v;
          }
        qvg::EncodedTensor ref = e;
        for (int64_t g = 0; g < G; ++g) qvg::detail::quantize_residual_group(fin.data() + g * S * D, g, ref);
        // The kernels' input: the final residual itself, or r = residual + stored[id];
        // the rows with zeros and ties use an all-zero stored row (r - 0 = r exactly,
        // signed zeros included).
        std::vector<float> r = fin, stored(size_t(G * Kc * D), 0.0f);
        std::vector<uint8_t> ids(size_t(G * S), 0);
        if (fused) {
          for (int64_t g = 0; g < G; ++g) {
            const float sc = g == 0 ? 1.0f : g == 1 ? 5000.0f : 1e-12f;
            for (int j = 0; j + 1 < Kc; ++j)
              for (int64_t d = 0; d < D; ++d) stored[size_t((g * Kc + j) * D + d)] = sc * n01(rng);
            for (int64_t t = 0; t < S; ++t) {
              const int id = t <= 3 ? Kc - 1 : int(rng() % (Kc - 1));
              ids[size_t(g * S + t)] = uint8_t(id);
              for (int64_t d = 0; d < D; ++d) {
                const size_t i = size_t((g * S + t) * D + d);
                r[i] = id == Kc - 1 ? fin[i] : fin[i] + stored[size_t((g * Kc + id) * D + d)];
              }
            }
          }
          // The reference is the residual the kernels see: r - stored[id] in fp32.
          for (int64_t g = 0; g < G; ++g)
            for (int64_t t = 0; t < S; ++t)
              for (int64_t d = 0; d < D; ++d) {
                const size_t i = size_t((g * S + t) * D + d);
                fin[i] = r[i] - stored[size_t((g * Kc + ids[size_t(g * S + t)]) * D + d)];
              }
          ref = e;
          for (int64_t g = 0; g < G; ++g) qvg::detail::quantize_residual_group(fin.data() + g * S * D, g, ref);
        }

        if (m.asym)
          for (int64_t g = 0; g < G; ++g) {
            for (const auto& [t, d] : {std::pair<int64_t, int64_t>{2, 3}, {3, 8}}) {  // the first zero's block
              const int64_t si = (g * S + t) * nb + d / block;
              const float z =
                  m.sd == qvg::ScaleDType::FP8_E4M3
                      ? qvg::fp8e4m3_to_f32(ref.zeros[size_t(si)])
                      : qvg::bf16_to_f32(uint16_t(ref.zeros[size_t(2 * si)] | ref.zeros[size_t(2 * si + 1)] << 8));
              zero_signs += z == 0.0f && std::signbit(z) == (g != 1);
            }
          }

        std::vector<float> raw_s(size_t(G * S * nb)), raw_z(size_t(G * S * nb)), gmax(size_t(2 * G), 0.0f);
        qvg::EncodedTensor got = e;
        K::QuantizeArgs a;
        a.r = K::residual_points(r.data(), S, D);
        a.stored = fused ? stored.data() : nullptr;
        a.ids = fused ? ids.data() : nullptr;
        a.G = G;
        a.S = S;
        a.D = D;
        a.K = Kc;
        a.bits = m.bits;
        a.block = block;
        a.asymmetric = m.asym;
        a.fp8 = m.sd == qvg::ScaleDType::FP8_E4M3;
        a.two_level = m.sc == qvg::Scaling::TwoLevel;
        outputs_into(a, got, raw_s, raw_z, gmax);
        run_quantize_kernels(a);
        vec_cases += K::quantize_vectorizable(D, block) ? 1 : 0;
        const std::string what = describe(m, qvg::DType::F32) + " D=" + std::to_string(D) +
                                 " block=" + std::to_string(block) + (fused ? " fused" : "");
        for (size_t i = 0; i < got.codes.size(); ++i)
          if (got.codes[i] != ref.codes[i]) {
            QVG_EXPECT(got.codes[i] == ref.codes[i])
                << what << "first differing code byte" << i << "got" << int(got.codes[i]) << "cpu" << int(ref.codes[i]);
            break;
          }
        QVG_EXPECT(got.scales == ref.scales) << what << "scales";
        QVG_EXPECT(got.zeros == ref.zeros) << what << "zeros";
        QVG_EXPECT(got.scale_factor == ref.scale_factor) << what << "factors";
        QVG_EXPECT(got.zero_factor == ref.zero_factor) << what << "zero factors";
        ++checked;
        // The same points read where the encoder reads stage 0's: the input's own
        // [B, S, H, D] layout (Points with H = 3), not a [G, S, D] buffer.
        {
          std::vector<float> xin(r.size());
          for (int64_t g = 0; g < G; ++g)
            for (int64_t t = 0; t < S; ++t)
              for (int64_t d = 0; d < D; ++d) xin[size_t((t * G + g) * D + d)] = r[size_t((g * S + t) * D + d)];
          qvg::EncodedTensor got2 = e;
          std::vector<float> raw_s2(raw_s.size()), raw_z2(raw_z.size()), gmax2(gmax.size(), 0.0f);
          K::QuantizeArgs a2 = a;
          a2.r = K::input_points(xin.data(), A::kF32, sh.h, S, D);
          outputs_into(a2, got2, raw_s2, raw_z2, gmax2);
          run_quantize_kernels(a2);
          QVG_EXPECT(got2.codes == got.codes && got2.scales == got.scales && got2.zeros == got.zeros &&
                     got2.scale_factor == got.scale_factor && got2.zero_factor == got.zero_factor)
              << what << "read from the input layout";
        }
        // The scale search: search_block over every block of what the
        // kernels left, against the CPU's choice with ScaleSearch::Mse.
        qvg::EncodedTensor refm = e;
        for (int64_t g = 0; g < G; ++g)
          qvg::detail::quantize_residual_group(fin.data() + g * S * D, g, refm, qvg::ScaleSearch::Mse);
        qvg::EncodedTensor got_thread = got;  // the thread-per-block search, from the same state
        {
          std::vector<float> rs(raw_s), rz(raw_z), gm(gmax);
          K::QuantizeArgs at = a;
          outputs_into(at, got_thread, rs, rz, gm);
          for (int64_t si = 0; si < G * S * nb; ++si) search_block_of_width(at, si);
        }
        bool lanes_agree = true;
        for (int64_t si = 0; si < G * S * nb; ++si) lanes_agree = search_half_of_width(a, si) && lanes_agree;
        QVG_EXPECT(lanes_agree) << what << "the half-warp's lanes chose different candidates";
        QVG_EXPECT(got.codes == refm.codes) << what << "mse codes";
        QVG_EXPECT(got.scales == refm.scales) << what << "mse scales";
        QVG_EXPECT(got.zeros == refm.zeros) << what << "mse zeros";
        QVG_EXPECT(got.scale_factor == refm.scale_factor) << what << "mse factors";
        QVG_EXPECT(got_thread.codes == refm.codes && got_thread.scales == refm.scales && got_thread.zeros == refm.zeros)
            << what << "mse by search_block";
        mse_changed += refm.scales != ref.scales;
        ++mse_checked;
      }
  }
  QVG_EXPECT(K::host_misaligned_accesses() == 0) << K::host_misaligned_accesses() << "misaligned accesses";
  std::printf("  %d quantizer comparisons (%d vectorised), %d signed zero minima checked\n", checked, vec_cases,
              zero_signs);
  // 8 scale modes x 2 (fused or not) x the blocks of each width (int4 11, int2 10, int3 9).
  QVG_EXPECT(checked == 480 && vec_cases == 384 && zero_signs == 1440) << checked << vec_cases << zero_signs;
  std::printf("  %d scale-search comparisons (%d where mse chose other scales than off)\n", mse_checked, mse_changed);
  QVG_EXPECT(mse_checked == 480 && mse_changed > 280) << mse_checked << mse_changed;
}

namespace {

/// The quantizer's arguments over host arrays of `got` (F32 scratch in raw_s/raw_z/gmax).
K::QuantizeArgs host_quantize_args(qvg::EncodedTensor& got, const float* r, const float* stored, const uint8_t* ids,
                                   int K_slots, std::vector<float>& raw_s, std::vector<float>& raw_z,
                                   std::vector<float>& gmax) {
  const int64_t G = got.groups(), S = got.shape.s, D = got.shape.d, nb = D / got.block_size;
  raw_s.assign(size_t(G * S * nb), 0.0f);
  raw_z.assign(size_t(G * S * nb), 0.0f);
  gmax.assign(size_t(2 * G), 0.0f);
  K::QuantizeArgs a = qvg::cuda::quantize_format(got, K_slots);
  a.r = K::residual_points(r, S, D);
  a.stored = stored;
  a.ids = ids;
  outputs_into(a, got, raw_s, raw_z, gmax);
  return a;
}

}  // namespace

// A chunk of an incremental span, encoded by the CPU (encode_span_chunk,
// a first chunk and a later one, one and two stages, scale search off and mse), is
// reproduced byte for byte by the device's bodies given its assignments: the span's
// codebook read back (book_entry: stored fp32 values, the centred copy), the
// intermediate stages' residuals (subtract_stored), the quantizer kernels and the
// scale search on the last stage's residual with the stored codebook; its residual
// energy (group_energy, summed over groups in order) equals EncodeStats'. Also
// store_new_centroid writes the CPU's stored slots, and warm_centroid the CPU's warm
// start (warm - mu).
QVG_TEST(span_chunk_bodies_match_encode_span_chunk) {
  int checked = 0;
  for (const int stages : {1, 2})
    for (const qvg::ScaleSearch search : {qvg::ScaleSearch::Off, qvg::ScaleSearch::Mse})
      for (const bool asym : {false, true})
        for (const qvg::DType dt : {qvg::DType::BF16, qvg::DType::F32}) {
          qvg::CodecConfig cfg;
          cfg.bits = asym ? 2 : 4;
          cfg.centroids = 16;
          cfg.stages = stages;
          cfg.block_size = 32;
          cfg.asymmetric = asym;
          cfg.scale_search = search;
          cfg.kmeans_iters = 3;
          const qvg::Shape4 sh{1, 40, 3, 64};
          qvg::SpanCodebook span = qvg::SpanCodebook::empty(sh, dt, cfg);
          for (int chunk = 0; chunk < 2; ++chunk) {
            const qvg::Tensor x = make_data(dt, sh, uint32_t(700 + 10 * chunk + stages), 50.0f);
            const qvg::SpanCodebook before = span;
            qvg::EncodeStats stats;
            const qvg::EncodedTensor cpu =
                qvg::encode_span_chunk(x.view(), cfg, span, chunk == 0 ? 8 : 4, nullptr, &stats);
            const int64_t G = sh.b * sh.h, S = sh.s, D = sh.d, Kc = cfg.centroids;
            const int t = int(dt) == 0 ? A::kBF16 : A::kF32;
            const std::string what = "stages=" + std::to_string(stages) + " " + std::string(qvg::name(search)) +
                                     (asym ? " asym " : " sym ") + std::string(qvg::dtype_name(dt)) + " chunk " +
                                     std::to_string(chunk);
            // The stored slots: the book after the chunk holds the new centroids; writing
            // the same fp32 values (as c + mu with mu = 0) through store_new_centroid
            // gives the same bytes.
            for (int st = 0; st < stages; ++st) {
              const size_t esz = qvg::dtype_size(dt);
              std::vector<uint8_t> book = before.book.centroid[size_t(st)];
              const int64_t first = before.filled, k = span.filled - before.filled;
              std::vector<float> c(size_t(G * k * D)), mu(size_t(G * D), 0.0f), back(size_t(G * k * D));
              for (int64_t e = 0; e < G * k * D; ++e) {
                const int64_t d = e % D, j = (e / D) % k, g = e / (k * D);
                c[size_t(e)] = A::load_elem(span.book.centroid[size_t(st)].data(), t, (g * Kc + first + j) * D + d);
              }
              for (int64_t e = 0; e < G * k * D; ++e)
                K::store_new_centroid(c.data(), mu.data(), t, Kc, first, k, D, book.data(), e);
              QVG_EXPECT(book == span.book.centroid[size_t(st)]) << what << "stored slots, stage" << st;
              // warm_centroid: slots [first, first + k) minus a mean, as kmeans.cpp's warm start.
              for (int64_t i = 0; i < G * D; ++i) mu[size_t(i)] = 0.25f * float(i % 7) - 0.5f;
              for (int64_t e = 0; e < G * k * D; ++e)
                back[size_t(e)] = K::warm_centroid(book.data(), t, Kc, first, k, D, mu.data(), e);
              for (int64_t e = 0; e < G * k * D; ++e) {
                const int64_t d = e % D, g = e / (k * D);
                if (back[size_t(e)] != c[size_t(e)] - mu[size_t(g * D + d)]) {
                  QVG_EXPECT(false) << what << "warm_centroid element" << e;
                  break;
                }
              }
              (void)esz;
            }
            // The quantizer's inputs: r = x as fp32, the intermediate stages subtracted.
            std::vector<float> r(size_t(G * S * D)), stored(size_t(G * Kc * D)), cc(size_t(G * Kc * D)),
                mu(size_t(G * D), 0.0f);
            for (int64_t b = 0; b < sh.b; ++b)
              for (int64_t tt = 0; tt < S; ++tt)
                for (int64_t h = 0; h < sh.h; ++h)
                  for (int64_t d = 0; d < D; ++d) r[size_t(((b * sh.h + h) * S + tt) * D + d)] = x.at(b, tt, h, d);
            for (int st = 0; st < stages; ++st) {
              for (int64_t e = 0; e < G * Kc * D; ++e)
                K::book_entry(span.book.centroid[size_t(st)].data(), t, Kc, D, mu.data(), stored.data(), cc.data(), e);
              if (st + 1 < stages)
                for (int64_t e = 0; e < G * S * D; ++e)
                  K::subtract_stored(r.data(), stored.data(), cpu.ids[size_t(st)].data(), S, Kc, D, e);
            }
            qvg::EncodedTensor got = qvg::EncodedTensor::allocate(qvg::EncodingLayout::of(sh, dt, cfg));
            std::vector<float> raw_s, raw_z, gmax;
            const K::QuantizeArgs a = host_quantize_args(
                got, r.data(), stored.data(), cpu.ids[size_t(stages - 1)].data(), int(Kc), raw_s, raw_z, gmax);
            run_quantize_kernels(a);
            if (search == qvg::ScaleSearch::Mse) {
              bool agree = true;
              for (int64_t si = 0; si < G * S * (D / cfg.block_size); ++si)
                agree = search_half_of_width(a, si) && agree;
              QVG_EXPECT(agree) << what << "the half-warp's lanes chose different candidates";
            }
            QVG_EXPECT(got.codes == cpu.codes) << what << "codes";
            QVG_EXPECT(got.scales == cpu.scales) << what << "scales";
            QVG_EXPECT(got.zeros == cpu.zeros) << what << "zeros";
            QVG_EXPECT(got.scale_factor == cpu.scale_factor && got.zero_factor == cpu.zero_factor) << what << "factors";
            double energy = 0;
            for (int64_t g = 0; g < G; ++g) energy += K::group_energy(a, g);
            QVG_EXPECT(energy == stats.residual_energy) << what << "energy" << energy << stats.residual_energy;
            ++checked;
          }
        }
  std::printf("  %d span chunks reproduced\n", checked);
  QVG_EXPECT(checked == 32) << checked;
}

// Refinement layers on the device's bodies. refinement_error gives the
// error encode_refinement encodes (the encodings of both are the same bytes), and
// refine_one adds a layer to a decoded range as add_refinement does, bit for bit,
// into bf16, f16 and f32 targets, whole and strided sub-ranges (t0 > 0, h0 > 0).
QVG_TEST(refinement_bodies_match_the_cpu) {
  int checked = 0;
  for (const qvg::DType dt : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32})
    for (const int bits : {2, 3, 4}) {
      const qvg::Shape4 sh{2, 12, 3, 64};
      const qvg::Tensor x = make_data(dt, sh, uint32_t(900 + bits), 20.0f);
      qvg::CodecConfig base;
      base.bits = 2;
      base.centroids = 4;
      base.block_size = 32;
      const qvg::EncodedTensor enc = qvg::encode(x.view(), base);
      qvg::Tensor dec(dt, sh);
      qvg::decode(enc, dec.view());
      const qvg::CodecConfig rc = qvg::refinement_config(bits, 32, 7);
      const qvg::EncodedTensor layer = qvg::encode_refinement(x.view(), dec.view(), rc);
      // The error as the device computes it, then the host encoder: the same layer.
      float lim = float(qvg::kMaxAbsInput);
      if (double(lim) > qvg::kMaxAbsInput) lim = std::nextafter(lim, 0.0f);
      const int t = dt == qvg::DType::BF16 ? A::kBF16 : dt == qvg::DType::F16 ? A::kF16 : A::kF32;
      std::vector<float> err(size_t(sh.numel()));
      for (int64_t i = 0; i < sh.numel(); ++i)
        err[size_t(i)] = K::refinement_error(x.view().data, dec.view().data, t, lim, i);
      const qvg::EncodedTensor again = qvg::encode(qvg::ConstTensorView{err.data(), qvg::DType::F32, sh}, rc);
      QVG_EXPECT(again.codes == layer.codes && again.scales == layer.scales && again.centroid == layer.centroid &&
                 again.scale_factor == layer.scale_factor)
          << qvg::dtype_name(dt) << bits << "refinement error";
      // The layer added to decoded ranges: whole, and tokens [3, 10) heads [1, 3) into a
      // strided target.
      const Contig lc = contig(layer);
      struct Range {
        int64_t t0, t1, h0, h1;
      };
      for (const Range rg : {Range{0, sh.s, 0, sh.h}, Range{3, 10, 1, 3}})
        for (const qvg::DType od : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32}) {
          const int64_t T = rg.t1 - rg.t0, Hn = rg.h1 - rg.h0, D = sh.d;
          const int64_t tok_stride = (Hn + 1) * D, batch_stride = (T + 2) * tok_stride;
          const size_t osz = qvg::dtype_size(od);
          std::vector<uint8_t> base_out(size_t(sh.b * batch_stride) * osz);
          qvg::decode_range(enc, rg.t0, rg.t1, rg.h0, rg.h1, {base_out.data(), od, batch_stride, tok_stride});
          std::vector<uint8_t> want = base_out, got = base_out;
          qvg::add_refinement(layer, rg.t0, rg.t1, rg.h0, rg.h1, {want.data(), od, batch_stride, tok_stride});
          K::DecodeArgs T_ =
              qvg::cuda::decode_args(layer, {layer.codes.data(), layer.scales.data(), nullptr,
                                             layer.scale_factor.data(), nullptr, lc.ids.data(), lc.cent.data()});
          T_.t0 = int32_t(rg.t0);
          T_.t1 = int32_t(rg.t1);
          T_.h0 = int32_t(rg.h0);
          T_.h1 = int32_t(rg.h1);
          T_.out_dtype = int8_t(od == qvg::DType::BF16 ? A::kBF16 : od == qvg::DType::F16 ? A::kF16 : A::kF32);
          T_.out = got.data();
          T_.batch_stride = batch_stride;
          T_.token_stride = tok_stride;
          for (int64_t b = 0; b < sh.b; ++b)
            for (int64_t tt = rg.t0; tt < rg.t1; ++tt)
              for (int64_t h = rg.h0; h < rg.h1; ++h)
                for (int64_t d = 0; d < D; ++d) K::refine_one(T_, int(b), int(h), int(tt), int(d));
          QVG_EXPECT(got == want) << qvg::dtype_name(dt) << bits << "into" << qvg::dtype_name(od) << "range" << rg.t0
                                  << rg.t1 << rg.h0 << rg.h1;
          QVG_EXPECT(got != base_out) << "the layer changed nothing";
          ++checked;
        }
    }
  std::printf("  %d refined ranges compared\n", checked);
  QVG_EXPECT(checked == 54) << checked;
}

// The refinement layer fused into the decode launch (DecodeArgs::ref_*): every mode's
// vectorised launch with a layer (output in the centroids' dtype), the generic launch
// (another output dtype, or a block not a multiple of 8), in launches that mix refined
// and unrefined tasks over whole and strided sub-ranges — the bytes of the CPU's
// decode_range followed by add_refinement.
QVG_TEST(fused_refinement_launches_match_the_cpu) {
  modes_run().clear();
  int checked = 0;
  for (const qvg::DType dt : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32})
    for (const int bits : {2, 3, 4})
      for (const bool fp8 : {true, false})
        for (const int block : {32, 12}) {
          if (block % qvg::find_code_format(bits)->group_codes != 0) continue;  // int3: 32 only
          // 200 tokens: a thread of the first tile (21 rows of 12 threads at D = 96) has
          // 8 tokens, so both of its batches run.
          const qvg::Shape4 sh{2, 200, 3, 96};
          const qvg::Tensor x = make_data(dt, sh, uint32_t(1000 + bits + 7 * block + (fp8 ? 1 : 0)), 20.0f);
          qvg::CodecConfig base;
          base.bits = bits;
          base.centroids = 4;
          base.block_size = block;
          base.scale_dtype = fp8 ? qvg::ScaleDType::FP8_E4M3 : qvg::ScaleDType::BF16;
          base.asymmetric = bits == 2;
          const qvg::EncodedTensor enc = qvg::encode(x.view(), base);
          qvg::Tensor dec(dt, sh);
          qvg::decode(enc, dec.view());
          const qvg::EncodedTensor layer =
              qvg::encode_refinement(x.view(), dec.view(), qvg::refinement_config(6 - bits, block, 7));
          const Contig ec = contig(enc), lc = contig(layer);
          for (const qvg::DType od : {dt, dt == qvg::DType::F32 ? qvg::DType::BF16 : qvg::DType::F32}) {
            // Tokens [2, 187) heads [0, 3) refined and [5, 150) x [1, 3) unrefined into one
            // strided target.
            const int64_t D = sh.d, tok_stride = 6 * D, batch_stride = sh.s * tok_stride;
            const size_t osz = qvg::dtype_size(od);
            std::vector<uint8_t> want(size_t(sh.b * batch_stride) * osz, 0xA5), got = want;
            const qvg::DecodeTarget wa{want.data(), od, batch_stride, tok_stride};
            const qvg::DecodeTarget wb{want.data() + size_t(3 * D) * osz, od, batch_stride, tok_stride};
            qvg::decode_range(enc, 2, 187, 0, 3, wa);
            qvg::add_refinement(layer, 2, 187, 0, 3, wa);
            qvg::decode_range(enc, 5, 150, 1, 3, wb);
            K::DecodeArgs refined = range_task(enc, ec, od, 2, 187, 0, 3, tok_stride, got.data());
            refined.batch_stride = batch_stride;
            qvg::cuda::set_refinement(refined, layer,
                                      {layer.codes.data(), layer.scales.data(), nullptr, layer.scale_factor.data(),
                                       nullptr, lc.ids.data(), lc.cent.data()});
            K::DecodeArgs plain = range_task(enc, ec, od, 5, 150, 1, 3, tok_stride, got.data() + size_t(3 * D) * osz);
            plain.batch_stride = batch_stride;
            run_decode_launches({refined, plain});
            QVG_EXPECT(got == want) << qvg::dtype_name(dt) << " bits " << bits << " fp8 " << fp8 << " block " << block
                                    << " into " << qvg::dtype_name(od);
            ++checked;
          }
        }
  int refined_modes = 0;
  for (const int m : modes_run()) refined_modes += m >= 10000;
  std::printf("  %d fused launches compared, %d refined vectorised modes\n", checked, refined_modes);
  QVG_EXPECT(checked == 60) << checked;
  // every (bits, scale format, dtype) with output == centroids, the layer of width 6 - bits
  QVG_EXPECT(refined_modes == 18) << refined_modes;
}

// The deferred input check's bodies (guard_bodies.cuh; docs/cuda.md, "update() does not
// wait"). input_ok passes a call only when both scans found nothing; bad_call_slot
// names the element the CPU's check_finite_and_bounded names (the key's first bad
// element before the value's), with its value, for every dtype and a bad element
// anywhere in [B, n, H, D].
QVG_TEST(input_guard_bodies_name_the_cpu_checks_element) {
  namespace K = qvg::cuda::kernels;
  const qvg::Shape4 sh{2, 5, 3, 8};
  const unsigned long long numel = (unsigned long long)sh.numel();
  K::CheckFlags none{{~0ull, ~0ull}, 0};
  QVG_EXPECT(K::input_ok(none, numel, numel));
  int checked = 0;
  std::mt19937 rng(3);
  for (const qvg::DType dt : {qvg::DType::BF16, qvg::DType::F16, qvg::DType::F32})
    for (int rep = 0; rep < 20; ++rep) {
      qvg::Tensor key = make_data(dt, sh, uint32_t(40 + rep), 2.0f), value = make_data(dt, sh, uint32_t(80 + rep), 2.0f);
      const int which = rep % 2;
      const unsigned long long e = rng() % numel;
      const float bad = rep % 3 == 0 ? std::nanf("") : rep % 3 == 1 ? INFINITY : -3e17f;
      if (dt == qvg::DType::F16 && rep % 3 != 0) continue;  // stores saturate to a finite fp16: only NaN is bad
      qvg::Tensor& t = which == 0 ? key : value;
      qvg::store_f32(t.data(), dt, size_t(e), bad);
      K::CheckFlags f = none;
      f.first[which] = e;  // what the limit scans leave
      QVG_EXPECT(!K::input_ok(f, numel, numel));
      const K::CheckSlot s = K::bad_call_slot(f, key.data(), value.data(), qvg::cuda::arith_dtype(dt), sh.b, sh.s, sh.h, sh.d, 64);
      std::string cpu;
      try {
        qvg::check_finite_and_bounded(t.view(), which == 0 ? "key" : "value");
      } catch (const qvg::InvalidArgument& ex) {
        cpu = ex.what();
      }
      const std::string at = "at [" + std::to_string(s.b) + ", " + std::to_string(s.t) + ", " + std::to_string(s.h) +
                             ", " + std::to_string(s.d) + "]";
      QVG_EXPECT(s.which == which && s.chunk_start == 64 && s.n == sh.s) << s.which << s.chunk_start << s.n;
      QVG_EXPECT(cpu.find(at) != std::string::npos) << cpu << "vs" << at << qvg::dtype_name(dt) << rep;
      const float want = qvg::load_f32(t.data(), dt, size_t(e));
      QVG_EXPECT((std::isnan(want) && std::isnan(s.value)) || want == s.value) << want << s.value;
      ++checked;
    }
  std::printf("  %d bad elements located as the CPU check locates them\n", checked);
  QVG_EXPECT(checked == 47) << checked;
}

int main(int argc, char** argv) { return qvg::testing::run_all(argc, argv); }
