// tests/gpu/encode_replay.h — the device encoder's rules replayed on the host with
// given k-means assignments: the GPU tests' check of a device encoding, byte for byte.
//
// The device encoder (src/codec/cuda/encode.cpp) differs from the CPU encoder only
// where spec 1.1 allows: the assignment (bf16 operands on tensor cores: near-ties
// can go either way), the group mean (fp64 partial sums of kMeanChunk points) and
// the centroid update (exact 64-bit fixed point). Everything else is fixed bits. So
// instead of comparing errors against a flat margin, the GPU tests feed the GPU's own
// assignments of every k-means iteration (encode_traced) to this replay, which
// applies those rules on the host (the __host__ __device__ bodies of
// encode_bodies.cuh, the CPU's residual quantizer), and require the same bytes.
// The choice among near-tied centroids is judged apart (AssignmentAgreement: spec
// 1.1's agreement with the exact argmin over the same centroids), since the replay
// accepts any valid ids.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "codec/encode_impl.h"
#include "kernels/cuda/encode_bodies.cuh"
#include "kernels/cuda/kmeanspp.cuh"
#include "qvg/codec.h"
#include "qvg/encoding_layout.h"
#include "qvg/tensor.h"

namespace qvg::testing {

/// Assigns the points of group g in k-means iteration `it` of stage `stage`: xb is the
/// group's centred points as bf16 bits (S x D; xc the same in fp32, before the bf16
/// rounding), c its current centroids in centred coordinates (fp32, K x D; the first
/// k_eff are in use). Writes S ids.
using AssignFn = std::function<void(int stage, int it, int64_t g, const uint16_t* xb, const float* xc, const float* c,
                                    int k_eff, uint8_t* ids)>;

/// Spec 1.1's agreement of a fast assignment (the device's bf16 tensor-core argmin)
/// with the reference: the exact argmin of sum (x - c)^2 over the same centroids, in
/// fp64, ties to the lowest index. Summed over every assignment judged: the points,
/// those whose id differs from the reference's, and the inertia (fp64) of the given
/// ids and of the reference's. Within the spec: under 1 % of the ids differ and the
/// inertia exceeds the reference's by at most 1e-3 relative. An id at or past k_eff
/// counts as differing with an infinite distance.
struct AssignmentAgreement {
  int64_t points = 0, differ = 0;
  double inertia = 0, inertia_ref = 0;

  /// The squared distance of two D-vectors in fp64 (the reference's).
  static double distance(const float* x, const float* c, int64_t D) {
    double dist = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double e = double(x[d]) - double(c[d]);
      dist += e * e;
    }
    return dist;
  }
  /// Judges the ids of S points xc (fp32, S x D) against centroids c (k_eff x D).
  void add(const float* xc, const float* c, int64_t S, int64_t D, int k_eff, const uint8_t* ids) {
    for (int64_t t = 0; t < S; ++t) {
      double best = INFINITY, mine = INFINITY;
      int bi = 0;
      for (int j = 0; j < k_eff; ++j) {
        const double dist = distance(xc + t * D, c + j * D, D);
        if (dist < best) {
          best = dist;
          bi = j;
        }
        if (j == ids[t]) mine = dist;
      }
      ++points;
      differ += ids[t] != bi;
      inertia += mine;
      inertia_ref += best;
    }
  }
  double differ_fraction() const { return points > 0 ? double(differ) / double(points) : 0.0; }
  double inertia_excess() const {
    return inertia_ref > 0 ? inertia / inertia_ref - 1.0 : (inertia > 0 ? INFINITY : 0.0);
  }
  bool within_spec() const { return points > 0 && differ_fraction() < 0.01 && inertia_excess() <= 1e-3; }
  std::string describe() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%lld of %lld ids differ from the exact argmin (%.3f %%), inertia %+.2e relative",
                  (long long)differ, (long long)points, 100.0 * differ_fraction(), inertia_excess());
    return buf;
  }
};

/// The encoding the device encoder makes of x (host tensor) under cfg when its
/// assignments are those `assign` gives: its rules (encode_kernels.cu) applied on
/// the host in its order.
/// `warm`: with cfg.init warm, the codebook the k-means of each stage starts from
/// (warm_centroids: warm - mu for every slot), else cfg.init random or kmeans++
/// (kmeanspp_kernel's picks from the replayed residual and mean: kmeanspp_picks_host).
inline EncodedTensor replay_device_encode(const Tensor& x, const CodecConfig& cfg, const AssignFn& assign,
                                          const EncodedTensor* warm = nullptr) {
  namespace A = qvg::cuda_arith;
  namespace KB = qvg::cuda::kernels;
  const Shape4 sh = x.shape();
  const int64_t B = sh.b, S = sh.s, H = sh.h, D = sh.d, G = B * H;
  const int K = cfg.centroids, iters = cfg.kmeans_iters, k_eff = int(std::min<int64_t>(K, S));
  const int dt = int(x.dtype());  // cuda_arith's dtype numbering (static_assert in kernels/cuda/host.h)
  EncodedTensor e = EncodedTensor::allocate(EncodingLayout::of(sh, x.dtype(), cfg));
  const double stop = 1e-4 * double(S);
  const int64_t nchunk = (S + KB::kMeanChunk - 1) / KB::kMeanChunk;

  std::vector<float> r(static_cast<size_t>(G * S * D)), mu(static_cast<size_t>(G * D)),
      c(static_cast<size_t>(G * K * D)), stored(static_cast<size_t>(G * K * D));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t d = 0; d < D; ++d)
        r[size_t((g * S + t) * D + d)] = A::load_elem(x.data(), dt, (((g / H) * S + t) * H + g % H) * D + d);
  const auto group_mean = [&] {  // gather_mean / subtract_mean + mean_final
    std::vector<double> partial(static_cast<size_t>(nchunk));
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t ch = 0; ch < nchunk; ++ch) {
          double s = 0;
          for (int64_t t = ch * KB::kMeanChunk; t < std::min(S, (ch + 1) * KB::kMeanChunk); ++t)
            s += double(r[size_t((g * S + t) * D + d)]);
          partial[size_t(ch)] = s;
        }
        mu[size_t(g * D + d)] = KB::mean_of_partials(partial.data(), nchunk, 1, S);
      }
  };
  group_mean();
  std::vector<uint16_t> xb(static_cast<size_t>(G * S * D));
  std::vector<float> xc(static_cast<size_t>(G * S * D));
  std::vector<float> maxabs(static_cast<size_t>(G));
  std::vector<uint32_t> keys(KB::kInitTableSlots), vals(KB::kInitTableSlots), idx(static_cast<size_t>(K));
  std::vector<uint8_t> next(static_cast<size_t>(S));
  std::vector<unsigned long long> sums(static_cast<size_t>(K * D));
  std::vector<int> counts(static_cast<size_t>(K));
  for (int st = 0; st < cfg.stages; ++st) {
    std::vector<uint8_t>& ids = e.ids[size_t(st)];
    std::fill(ids.begin(), ids.end(), uint8_t(0));
    for (int64_t g = 0; g < G; ++g) {
      // center_kernel
      float m = 0.0f;
      for (int64_t i = 0; i < S * D; ++i) {
        const float v = A::sub_rn(r[size_t(g * S * D + i)], mu[size_t(g * D + i % D)]);
        xb[size_t(g * S * D + i)] = A::f32_to_bf16(v);
        xc[size_t(g * S * D + i)] = v;
        m = std::max(m, std::fabs(v));
      }
      maxabs[size_t(g)] = m;
      // init_indices_kernel or kmeanspp_kernel, init_kernel
      if (k_eff == S) {
        for (int j = 0; j < k_eff; ++j) idx[size_t(j)] = uint32_t(j);
      } else if (cfg.init == qvg::Init::KMeansPlusPlus) {
        KB::kmeanspp_picks_host(r.data() + g * S * D, mu.data() + g * D, S, D, k_eff, cfg.seed, st, g / H,
                                g % H + cfg.head_offset, idx.data());
      } else {
        std::fill(keys.begin(), keys.end(), KB::kInitEmpty);
        KB::random_init_indices(cfg.seed, st, g / H, g % H + cfg.head_offset, S, k_eff, keys.data(), vals.data(),
                                idx.data());
      }
      for (int j = 0; j < K; ++j)
        for (int64_t d = 0; d < D; ++d)
          c[size_t((g * K + j) * D + d)] =
              cfg.init == qvg::Init::Warm && warm != nullptr
                  ? A::sub_rn(warm->centroid_at(st, g / H, g % H, j, d), mu[size_t(g * D + d)])
              : j < k_eff ? A::sub_rn(r[size_t((g * S + idx[size_t(j)]) * D + d)], mu[size_t(g * D + d)])
                          : 0.0f;
      // kmeans_iters x (assign, update); a group stops after an iteration with fewer
      // than 1e-4 * S changes (group_active)
      std::vector<int> changed;
      for (int it = 0; it < iters; ++it) {
        if (std::any_of(changed.begin(), changed.end(), [&](int n) { return double(n) < stop; })) break;
        assign(st, it, g, xb.data() + g * S * D, xc.data() + g * S * D, c.data() + g * K * D, k_eff, next.data());
        int n = 0;
        for (int64_t t = 0; t < S; ++t) {
          uint8_t& id = ids[size_t(g * S + t)];
          n += it == 0 || id != next[size_t(t)];
          id = next[size_t(t)];
        }
        changed.push_back(n);
        // update_accumulate_kernel, update_final_kernel: empty clusters keep theirs
        const int ex = KB::fixed_exponent(maxabs[size_t(g)], S);
        std::fill(sums.begin(), sums.end(), 0ull);
        std::fill(counts.begin(), counts.end(), 0);
        for (int64_t t = 0; t < S; ++t) {
          const int id = ids[size_t(g * S + t)];
          ++counts[size_t(id)];
          for (int64_t d = 0; d < D; ++d)
            sums[size_t(id * D + d)] +=
                (unsigned long long)KB::to_fixed(A::sub_rn(r[size_t((g * S + t) * D + d)], mu[size_t(g * D + d)]), ex);
        }
        for (int j = 0; j < K; ++j)
          if (counts[size_t(j)] > 0)
            for (int64_t d = 0; d < D; ++d)
              c[size_t((g * K + j) * D + d)] =
                  KB::centroid_from_fixed((long long)sums[size_t(j * D + d)], counts[size_t(j)], ex);
      }
    }
    // store_centroids_kernel
    std::vector<uint8_t>& out = e.centroid[size_t(st)];
    const size_t esz = dtype_size(x.dtype());
    for (int64_t i = 0; i < G * K * D; ++i) {
      const int64_t g = i / (K * D), j = (i / D) % K;
      uint32_t bits = 0;
      const float v = j < k_eff ? KB::stored_centroid(c[size_t(i)], mu[size_t(g * D + i % D)], dt, &bits) : 0.0f;
      stored[size_t(i)] = v;
      if (esz == 4) bits = A::bits_of(v);
      std::memcpy(out.data() + size_t(i) * esz, &bits, esz);  // little endian, as the device stores
    }
    // the next residual (subtract_mean_kernel), or the final one for the quantizer
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < S; ++t)
        for (int64_t d = 0; d < D; ++d) {
          float& v = r[size_t((g * S + t) * D + d)];
          v = A::sub_rn(v, stored[size_t((g * K + ids[size_t(g * S + t)]) * D + d)]);
        }
    if (st + 1 < cfg.stages) group_mean();
  }
  for (int64_t g = 0; g < G; ++g) qvg::detail::quantize_residual_group(r.data() + g * S * D, g, e, cfg.scale_search);
  return e;
}

/// The arrays where two encodings differ ("" when equal), by name (spec 1.5).
inline std::string encoding_difference(const EncodedTensor& a, const EncodedTensor& b) {
  std::string out;
  const auto note = [&](bool same, const std::string& name) {
    if (!same) out += (out.empty() ? "" : ", ") + name;
  };
  note(a.shape == b.shape && a.dtype == b.dtype && a.bits == b.bits && a.stages == b.stages &&
           a.block_size == b.block_size && a.asymmetric == b.asymmetric && a.scale_dtype == b.scale_dtype &&
           a.scaling == b.scaling,
       "metadata");
  for (size_t s = 0; s < std::min(a.centroid.size(), b.centroid.size()); ++s) {
    note(a.centroid[s] == b.centroid[s], "centroids." + std::to_string(s));
    note(a.ids[s] == b.ids[s], "ids." + std::to_string(s));
  }
  note(a.codes == b.codes, "codes");
  note(a.scales == b.scales, "scales");
  note(a.zeros == b.zeros, "zeros");
  note(a.scale_factor == b.scale_factor, "scale_factor");
  note(a.zero_factor == b.zero_factor, "zero_factor");
  return out;
}

/// Replays the device encoder on x with the assignments of `trace` (the ids after
/// each k-means iteration, [stage][iteration][G * S], as encode_traced writes them;
/// a group stopped early keeps its ids there) and names the arrays where `got`
/// differs from the replay ("" when it is the same bytes). With `agree`, also judges
/// every traced assignment against the exact argmin over the same centroids (spec
/// 1.1's agreement: the replay alone accepts any valid ids).
inline std::string check_against_replay(const Tensor& x, const CodecConfig& cfg, const EncodedTensor& got,
                                        const std::vector<uint8_t>& trace, const EncodedTensor* warm = nullptr,
                                        AssignmentAgreement* agree = nullptr) {
  const int64_t GS = x.shape().b * x.shape().h * x.shape().s, S = x.shape().s, D = x.shape().d;
  if (trace.size() != size_t(cfg.stages * cfg.kmeans_iters * GS)) return "trace size";
  const EncodedTensor want = replay_device_encode(
      x, cfg,
      [&](int st, int it, int64_t g, const uint16_t*, const float* xc, const float* c, int k_eff, uint8_t* ids) {
        const uint8_t* p = trace.data() + (int64_t(st) * cfg.kmeans_iters + it) * GS + g * S;
        std::copy(p, p + S, ids);
        if (agree) agree->add(xc, c, S, D, k_eff, ids);
      },
      warm);
  return encoding_difference(got, want);
}

}  // namespace qvg::testing
