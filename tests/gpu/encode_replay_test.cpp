// Host test of the GPU encode check (ctest cuda.host_encode_replay).
//
// The GPU tests accept a device encoding when it is, byte for byte, the host replay
// of the device encoder's rules fed the GPU's own k-means assignments
// (check_against_replay, tests/gpu/encode_replay.h), instead of a flat margin on
// its error. Here, without a GPU, the device encoder is emulated by that replay with
// host assignments by two rules (the bf16 expanded distance of the device's kernels,
// and the direct fp32 distance), which break near-ties differently, as a device's
// tensor cores may break them differently from any host emulation.
// The check must
// - accept each emulated encoding with its own assignments (whichever way the
//   near-ties went);
// - reject the encoding of one order checked against the other order's assignments
//   when the assignments differ;
// - reject every single-bit corruption of any array (centroids, ids, codes, scales,
//   zeros, factors), naming that array. The former check (MSE within 1 % of the CPU
//   encoder's, plus the residual re-quantized from the encoding's own centroids)
//   let a corrupted centroid through.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/encode_replay.h"
#include "gpu/harness.h"
#include "gpu/modes.h"
#include "kernels/cuda/arith.cuh"
#include "qvg/codec.h"

namespace {

namespace A = qvg::cuda_arith;
using qvg::testing::Mode;

/// Clustered data with per-group offsets and scales (as the GPU tests' make_data),
/// point noise `noise` x the centres' spread (1: clusters overlap, near-ties abound).
qvg::Tensor make_data(qvg::DType dtype, qvg::Shape4 sh, uint32_t seed, float noise) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  qvg::Tensor t(dtype, sh);
  const int nc = 24;
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.h; ++h) {
      const int64_t g = b * sh.h + h;
      const float scale = g % 3 == 2 ? 300.0f : 1.0f;
      std::vector<float> centers(size_t(nc * sh.d)), offs(size_t(sh.d));
      for (float& c : centers) c = n01(rng) * scale;
      for (float& o : offs) o = g % 2 ? 2.0f * scale * n01(rng) : 0.0f;
      for (int64_t s = 0; s < sh.s; ++s) {
        const int k = int(rng() % nc);
        for (int64_t d = 0; d < sh.d; ++d)
          t.set(b, s, h, d, offs[size_t(d)] + centers[size_t(k * sh.d + d)] + noise * scale * n01(rng));
      }
    }
  return t;
}

/// Assignments by one of two rules: the argmin over the first k_eff centroids of
/// ||c||^2 - 2 x.c on bf16 operands in fp32 (as the device's kernels), or (direct)
/// of sum (x - c)^2 in fp32 with the fp32 centroids; near-ties go differently.
/// Records the ids of every iteration in `trace` ([stage][iteration][G * S]).
qvg::testing::AssignFn host_assign(bool direct, int64_t S, int64_t D, int iters, int64_t GS,
                                   std::vector<uint8_t>& trace) {
  return [=, &trace](int st, int it, int64_t g, const uint16_t* xb, const float*, const float* c, int k_eff,
                     uint8_t* ids) {
    std::vector<float> cb(static_cast<size_t>(k_eff * D)), cn(static_cast<size_t>(k_eff));
    for (int j = 0; j < k_eff; ++j) {
      float s = 0.0f;
      for (int64_t d = 0; d < D; ++d) {
        const float v = A::bf16_to_f32(A::f32_to_bf16(c[j * D + d]));
        cb[size_t(j * D + d)] = v;
        s = A::add_rn(s, A::mul_rn(v, v));
      }
      cn[size_t(j)] = s;
    }
    for (int64_t t = 0; t < S; ++t) {
      float best = INFINITY;
      int bi = 0;
      for (int j = 0; j < k_eff; ++j) {
        float dist = 0.0f;
        if (!direct) {
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d)
            dot = A::add_rn(dot, A::mul_rn(A::bf16_to_f32(xb[t * D + d]), cb[size_t(j * D + d)]));
          dist = std::fma(-2.0f, dot, cn[size_t(j)]);
        } else {
          for (int64_t d = 0; d < D; ++d) {
            const float e = A::sub_rn(A::bf16_to_f32(xb[t * D + d]), c[j * D + d]);
            dist = A::add_rn(dist, A::mul_rn(e, e));
          }
        }
        if (dist < best) {
          best = dist;
          bi = j;
        }
      }
      ids[t] = uint8_t(bi);
    }
    std::memcpy(trace.data() + (int64_t(st) * iters + it) * GS + g * S, ids, size_t(S));
  };
}

/// The arrays of an encoding, for the corruption sweep.
std::vector<std::pair<std::string, std::vector<uint8_t>*>> byte_arrays(qvg::EncodedTensor& e) {
  std::vector<std::pair<std::string, std::vector<uint8_t>*>> v;
  for (size_t s = 0; s < e.centroid.size(); ++s) {
    v.push_back({"centroids." + std::to_string(s), &e.centroid[s]});
    v.push_back({"ids." + std::to_string(s), &e.ids[s]});
  }
  v.push_back({"codes", &e.codes});
  v.push_back({"scales", &e.scales});
  if (!e.zeros.empty()) v.push_back({"zeros", &e.zeros});
  return v;
}

}  // namespace

QVG_TEST(encode_check_accepts_any_near_tie_order_and_rejects_every_corruption) {
  struct Case {
    qvg::Shape4 sh;
    Mode m;
    int K;
  };
  // The modes of the GPU test's cases, on shapes a host can replay in a second.
  const std::vector<Case> cases = {
      {{1, 600, 2, 128}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 64},
      {{1, 600, 2, 128}, {4, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 64},
      {{1, 600, 2, 128}, {2, true, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 32},
      {{1, 600, 2, 128}, {4, true, qvg::ScaleDType::BF16, qvg::Scaling::Compat, 1}, 32},
      {{1, 600, 3, 128}, {2, false, qvg::ScaleDType::BF16, qvg::Scaling::TwoLevel, 2}, 32},
      {{2, 400, 2, 64}, {4, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::Compat, 2}, 32},
      {{1, 300, 2, 48}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 16},
      {{1, 100, 2, 64}, {2, false, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 1}, 256},  // S < K
      {{1, 300, 2, 256}, {4, true, qvg::ScaleDType::FP8_E4M3, qvg::Scaling::TwoLevel, 2}, 32},   // D = 256
  };
  uint32_t seed = 900;
  int accepted = 0, cross_rejected = 0, cross_same = 0, corruptions = 0, corruptions_named = 0;
  int64_t ids_differing = 0;
  for (const Case& c : cases)
    for (qvg::DType in : {qvg::DType::BF16, qvg::DType::F32}) {
      qvg::CodecConfig cfg;
      cfg.bits = c.m.bits;
      cfg.asymmetric = c.m.asym;
      cfg.scale_dtype = c.m.sd;
      cfg.scaling = c.m.sc;
      cfg.stages = c.m.stages;
      cfg.centroids = c.K;
      cfg.block_size = c.sh.d >= 64 ? 64 : 16;
      const qvg::Tensor x = make_data(in, c.sh, seed++, in == qvg::DType::F32 ? 1.0f : 0.25f);
      const int64_t GS = c.sh.b * c.sh.h * c.sh.s;
      const size_t trace_n = size_t(cfg.stages * cfg.kmeans_iters * GS);
      std::vector<uint8_t> trace[2] = {std::vector<uint8_t>(trace_n), std::vector<uint8_t>(trace_n)};
      qvg::EncodedTensor enc[2];
      for (int order = 0; order < 2; ++order) {
        enc[order] = qvg::testing::replay_device_encode(
            x, cfg, host_assign(order == 1, c.sh.s, c.sh.d, cfg.kmeans_iters, GS, trace[order]));
        enc[order].validate();
        const std::string diff = qvg::testing::check_against_replay(x, cfg, enc[order], trace[order]);
        QVG_EXPECT(diff.empty()) << "order" << order << "shape" << c.sh.str() << "rejected:" << diff;
        accepted += diff.empty();
      }
      for (size_t i = 0; i < trace_n; ++i) ids_differing += trace[0][i] != trace[1][i];
      if (trace[0] != trace[1]) {
        const std::string diff = qvg::testing::check_against_replay(x, cfg, enc[1], trace[0]);
        QVG_EXPECT(!diff.empty()) << "shape" << c.sh.str() << "an encoding passed with another's assignments";
        cross_rejected += !diff.empty();
      } else {
        ++cross_same;
      }
      // One bit flipped in each array, at a position from the seed; the check must
      // name that array.
      std::mt19937 rng(seed);
      qvg::EncodedTensor base = enc[0];
      const auto names = byte_arrays(base);
      for (size_t a = 0; a < names.size(); ++a) {
        qvg::EncodedTensor bad = enc[0];
        std::vector<uint8_t>& arr = *byte_arrays(bad)[a].second;
        if (arr.empty()) continue;
        const size_t at = size_t(rng() % arr.size());
        arr[at] ^= uint8_t(1u << (rng() % (names[a].first.rfind("ids", 0) == 0 ? 1 : 8)));  // ids stay < 2K
        const std::string diff = qvg::testing::check_against_replay(x, cfg, bad, trace[0]);
        ++corruptions;
        const bool named = diff.find(names[a].first) != std::string::npos;
        corruptions_named += named;
        QVG_EXPECT(named) << "a flipped bit in" << names[a].first << "at" << at << "shape" << c.sh.str()
                          << "check says:" << (diff.empty() ? std::string("equal") : diff);
      }
      for (std::vector<float>* f : {&base.scale_factor, &base.zero_factor}) {
        if (f->empty()) continue;
        qvg::EncodedTensor bad = enc[0];
        std::vector<float>& arr = f == &base.scale_factor ? bad.scale_factor : bad.zero_factor;
        arr[size_t(rng() % arr.size())] = std::nextafter(arr[0], INFINITY);
        const std::string name = f == &base.scale_factor ? "scale_factor" : "zero_factor";
        const std::string diff = qvg::testing::check_against_replay(x, cfg, bad, trace[0]);
        ++corruptions;
        corruptions_named += diff.find(name) != std::string::npos;
        QVG_EXPECT(diff.find(name) != std::string::npos) << "a changed" << name << "check says:" << diff;
      }
    }
  std::printf(
      "  %d emulated encodings accepted; %lld ids differ between the two assignment rules; %d cross checks "
      "rejected (%d cases with equal assignments); %d of %d corruptions named\n",
      accepted, (long long)ids_differing, cross_rejected, cross_same, corruptions_named, corruptions);
  QVG_EXPECT(accepted == 36 && cross_rejected >= 10 && corruptions >= 100 && corruptions_named == corruptions)
      << accepted << cross_rejected << corruptions << corruptions_named;
}

int main(int argc, char** argv) {
  return qvg::testing::run_all(argc, argv);
}

// The assignment judged (spec 1.1: a fast path's ids differ from the exact argmin for
// under 1 % of the points, its inertia within 1e-3 relative), on the shapes the caches
// encode: one group of the Self-Forcing chunk (4680 tokens, D = 128, K = 256) and of
// HY-WorldPlay's head dim (D = 256, K = 128). The device kernel's arithmetic emulated
// on the host (bf16 operands, ||c||^2 - 2 x.c in fp32, ties to the lowest index) and
// the direct fp32 rule are within it; planted wrong assignments are not: every id
// moved to the next centroid, every id 0, and 2 % of the points moved to their
// second-nearest centroid (the inertia alone might pass that one; the ids do not).
QVG_TEST(assignment_agreement_accepts_the_kernel_rule_and_rejects_planted_errors) {
  struct Case {
    qvg::Shape4 sh;
    int K;
  };
  const std::vector<Case> cases = {{{1, 4680, 1, 128}, 256}, {{1, 1500, 1, 256}, 128}};
  int judged = 0;
  uint32_t seed = 1300;
  for (const Case& c : cases) {
    qvg::CodecConfig cfg;
    cfg.bits = 2;
    cfg.centroids = c.K;
    const qvg::Tensor x = make_data(qvg::DType::BF16, c.sh, seed++, 0.5f);
    const int64_t GS = c.sh.b * c.sh.h * c.sh.s, S = c.sh.s, D = c.sh.d;
    std::vector<uint8_t> trace(size_t(cfg.stages * cfg.kmeans_iters * GS));
    // The replay with the kernel's rule (or the direct one), each assignment judged
    // after `plant` changed it (-1: as the rule made it).
    const auto judge = [&](bool direct, int plant) {
      qvg::testing::AssignmentAgreement agree;
      const qvg::testing::AssignFn rule = host_assign(direct, S, D, cfg.kmeans_iters, GS, trace);
      qvg::testing::replay_device_encode(x, cfg,
                                         [&](int st, int it, int64_t g, const uint16_t* xb, const float* xc,
                                             const float* cen, int k_eff, uint8_t* ids) {
                                           rule(st, it, g, xb, xc, cen, k_eff, ids);
                                           std::vector<uint8_t> judged_ids(ids, ids + S);
                                           for (int64_t t = 0; t < S && plant >= 0; ++t) {
                                             uint8_t& id = judged_ids[size_t(t)];
                                             if (plant == 0) id = uint8_t((ids[t] + 1) % k_eff);
                                             if (plant == 1) id = 0;
                                             if (plant == 2 && t % 50 == 0) {  // the second-nearest centroid
                                               double d1 = INFINITY, d2 = INFINITY;
                                               int j1 = 0, j2 = 0;
                                               for (int j = 0; j < k_eff; ++j) {
                                                 const double dist = qvg::testing::AssignmentAgreement::distance(
                                                     xc + t * D, cen + j * D, D);
                                                 if (dist < d1) {
                                                   d2 = d1, j2 = j1, d1 = dist, j1 = j;
                                                 } else if (dist < d2) {
                                                   d2 = dist, j2 = j;
                                                 }
                                               }
                                               id = uint8_t(j2);
                                             }
                                           }
                                           agree.add(xc, cen, S, D, k_eff, judged_ids.data());
                                         });
      return agree;
    };
    for (const bool direct : {false, true}) {
      const qvg::testing::AssignmentAgreement agree = judge(direct, -1);
      std::printf("  shape %s K %d, %s rule: %s\n", c.sh.str().c_str(), c.K, direct ? "direct fp32" : "kernel (bf16)",
                  agree.describe().c_str());
      QVG_EXPECT(agree.within_spec()) << c.sh.str() << (direct ? "direct" : "kernel") << agree.describe();
      ++judged;
    }
    for (const int plant : {0, 1, 2}) {  // planted errors, against the kernel rule's centroids
      const qvg::testing::AssignmentAgreement agree = judge(false, plant);
      std::printf("  shape %s K %d, planted error %d: %s\n", c.sh.str().c_str(), c.K, plant, agree.describe().c_str());
      QVG_EXPECT(!agree.within_spec()) << c.sh.str() << "planted error" << plant << "passed:" << agree.describe();
      ++judged;
    }
  }
  QVG_EXPECT(judged == 10) << judged;
}
