// src/kernels/cuda/kmeanspp.cuh — init kmeans++ on the device (spec 1.1): the
// per-thread bodies of kmeanspp_kernel (encode_kernels.cu) as __host__ __device__
// functions, and kmeanspp_picks_host, which runs them on the host in the kernel's
// order (tests/gpu/host_kmeanspp_test.cpp compares its picks with the CPU codec's,
// qvg::detail::kmeanspp_init_indices; tests/gpu/encode_replay.h replays with it).
//
// The rule is the CPU codec's (kmeans.cpp, kmeanspp_picks), on the device's centred
// points xc = r - mu (fp32, one rounded subtraction per element):
// - the first pick is below(S) of the group's stream (seed, stage, b, h + head_offset);
// - each round, every point's d2 = min(d2, double(sqdist(xc_i, xc_pick))), sqdist
//   being the CPU's 8-lane fp32 sum (lane l adds the channels d = l (mod 8) in
//   increasing d; the lanes combine as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)));
// - the weights are the d2 on the fixed-point scale of the largest d2
//   (core/exact_sum_impl.h); with a positive largest d2, u = below(total of the
//   weights) and the pick is the first point whose prefix sum of weights exceeds u;
//   else (every point coincides with a pick) the below(left)-th unchosen point.
// The weights' sums are exact integers, so the kernel adds them in any order: each
// thread sums a contiguous tile of points, and the pick is found from the tiles'
// prefix sums and one walk inside the tile that holds it (kpp_pick_in_tiles).
#pragma once

#include <cstdint>

#include "core/exact_sum_impl.h"
#include "kernels/cuda/arith.cuh"

#if !defined(__CUDA_ARCH__)
#include <limits>
#include <vector>
#endif

namespace qvg::cuda::kernels {

/// Lanes of the CPU codec's squared distance (kmeans.cpp, sqdist).
inline constexpr int kKppLanes = 8;
/// Points whose lane sums one thread of kmeanspp_kernel computes together, and the
/// channels of each it loads before it adds (so kKppPer * kKppBatch loads are in
/// flight, not one).
inline constexpr int kKppPer = 4;
inline constexpr int kKppBatch = 8;
/// Threads of kmeanspp_kernel: each sums one contiguous tile of the points' weights.
inline constexpr int kKppTiles = 512;

/// Lane `lane` (0..7) of sqdist(xc_i, xp) for the points i with rows[p] (p <
/// kKppPer; rows[p] null: no point, acc[p] stays 0): acc[p] = the fp32 sum, in
/// increasing d, of (xc_i[d] - xp[d])^2 over d = lane (mod 8), xc_i[d] = r_i[d] -
/// mu[d]; each operation rounded separately (never fused). Loads kKppBatch channels
/// of every point before adding them; the order of the additions is the CPU's.
QVG_HD void kpp_lanes(const float* const* rows, const float* mu, const float* xp, int64_t D, int lane, float* acc) {
  namespace A = qvg::cuda_arith;
  QVG_UNROLL
  for (int p = 0; p < kKppPer; ++p) acc[p] = 0.0f;
  for (int64_t d0 = lane; d0 < D; d0 += int64_t(kKppLanes) * kKppBatch) {
    float v[kKppPer][kKppBatch], m[kKppBatch], x[kKppBatch];
    QVG_UNROLL
    for (int b = 0; b < kKppBatch; ++b) {
      const int64_t d = d0 + int64_t(b) * kKppLanes;
      const bool in = d < D;
      m[b] = in ? mu[d] : 0.0f;
      x[b] = in ? xp[d] : 0.0f;
      QVG_UNROLL
      for (int p = 0; p < kKppPer; ++p) v[p][b] = in && rows[p] != nullptr ? rows[p][d] : 0.0f;
    }
    QVG_UNROLL
    for (int b = 0; b < kKppBatch; ++b)
      if (d0 + int64_t(b) * kKppLanes < D) {
        QVG_UNROLL
        for (int p = 0; p < kKppPer; ++p) {
          const float t = A::sub_rn(A::sub_rn(v[p][b], m[b]), x[b]);
          acc[p] = A::add_rn(acc[p], A::mul_rn(t, t));
        }
      }
  }
}

/// The three steps in which the kernel's octet of lanes combines its lane sums with
/// __shfl_down_sync (offsets 4, 1, 2), on an array: v[0] ends as
/// ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)), the CPU's order (fp32
/// addition is commutative). Overwrites v.
QVG_HD float kpp_combine(float* v) {
  namespace A = qvg::cuda_arith;
  for (int l = 0; l < 4; ++l) v[l] = A::add_rn(v[l], v[l + 4]);
  v[0] = A::add_rn(v[0], v[1]);
  v[2] = A::add_rn(v[2], v[3]);
  return A::add_rn(v[0], v[2]);
}

/// The new d2 of a point at fp32 distance `dist` from the latest pick (std::min).
QVG_HD double kpp_min(double d2, float dist) {
  const double dd = double(dist);
  return dd < d2 ? dd : d2;
}

/// The points of tile t of `tiles` contiguous tiles over S points: [kpp_tile_begin(t),
/// kpp_tile_begin(t + 1)).
QVG_HD int64_t kpp_tile_begin(int64_t t, int tiles, int64_t S) {
  const int64_t len = (S + tiles - 1) / tiles;
  const int64_t b = t * len;
  return b < S ? b : S;
}

/// The sum of the weights (exact_sum::fixed_term on scale e) of points [i0, i1).
QVG_HD uint64_t kpp_weight_sum(const double* d2, int64_t i0, int64_t i1, int e) {
  uint64_t s = 0;
  for (int64_t i = i0; i < i1; ++i) s += qvg::exact_sum::fixed_term(d2[i], e);
  return s;
}

/// The pick for the draw u (< the total of tile_sum[0..tiles)): the first point whose
/// prefix sum of weights exceeds u, found from the tiles' sums and a walk inside the
/// tile that holds it.
QVG_HD int64_t kpp_pick_in_tiles(const double* d2, const uint64_t* tile_sum, int tiles, int64_t S, int e, uint64_t u) {
  uint64_t before = 0;
  for (int t = 0; t < tiles; ++t) {
    if (before + tile_sum[t] > u) {
      uint64_t acc = before;
      const int64_t i1 = kpp_tile_begin(t + 1, tiles, S);
      for (int64_t i = kpp_tile_begin(t, tiles, S); i < i1; ++i) {
        acc += qvg::exact_sum::fixed_term(d2[i], e);
        if (acc > u) return i;
      }
    }
    before += tile_sum[t];
  }
  return -1;  // unreachable: u < the total
}

/// The total-0 branch: the below(left)-th (0-based) of the `left` unchosen points,
/// in point order. REQUIRES some point unchosen.
QVG_HD int64_t kpp_unchosen_pick(const uint8_t* chosen, int64_t n, qvg::cuda_arith::Rng& rng) {
  int64_t left = 0;
  for (int64_t i = 0; i < n; ++i) left += chosen[i] ? 0 : 1;
  int64_t r = int64_t(rng.below(uint64_t(left)));
  for (int64_t i = 0; i < n; ++i)
    if (!chosen[i] && r-- == 0) return i;
  return -1;  // unreachable
}

#if !defined(__CUDA_ARCH__)
/// The picks kmeanspp_kernel writes for one group: idx[0..k) for the S points r
/// (S x D, fp32, the stage's residual) with group mean mu, stream (seed, stage, b, h)
/// (h: the stream's head, head_offset included); k == S: 0..S-1 in order. Runs the
/// kernel's bodies in its order (lane sums, octet combination, the largest d2, the
/// weights' sums of `tiles` contiguous tiles, the pick from them; the total-0
/// branch). The picks do not depend on `tiles` (exact integer sums). REQUIRES
/// 1 <= k <= S, tiles >= 1.
inline void kmeanspp_picks_host(const float* r, const float* mu, int64_t S, int64_t D, int k, uint64_t seed, int stage,
                                int64_t b, int64_t h, uint32_t* idx, int tiles = kKppTiles) {
  namespace A = qvg::cuda_arith;
  if (k == S) {
    for (int j = 0; j < k; ++j) idx[j] = uint32_t(j);
    return;
  }
  std::vector<double> d2(static_cast<size_t>(S), std::numeric_limits<double>::infinity());
  std::vector<uint8_t> chosen(static_cast<size_t>(S), 0);
  std::vector<float> xp(static_cast<size_t>(D));
  A::Rng rng(seed, uint64_t(stage), uint64_t(b), uint64_t(h));
  int64_t pick = int64_t(rng.below(uint64_t(S)));
  for (int j = 0; j < k; ++j) {
    chosen[size_t(pick)] = 1;
    idx[j] = uint32_t(pick);
    if (j + 1 == k) break;
    for (int64_t d = 0; d < D; ++d) xp[size_t(d)] = A::sub_rn(r[pick * D + d], mu[d]);
    for (int64_t i0 = 0; i0 < S; i0 += kKppPer) {  // kKppPer points at a time, as a thread of the kernel
      const float* rows[kKppPer];
      for (int p = 0; p < kKppPer; ++p) rows[p] = i0 + p < S ? r + (i0 + p) * D : nullptr;
      float lanes[kKppLanes][kKppPer];
      for (int l = 0; l < kKppLanes; ++l) kpp_lanes(rows, mu, xp.data(), D, l, lanes[l]);
      for (int p = 0; p < kKppPer && i0 + p < S; ++p) {
        float v[kKppLanes];
        for (int l = 0; l < kKppLanes; ++l) v[l] = lanes[l][p];
        d2[size_t(i0 + p)] = kpp_min(d2[size_t(i0 + p)], kpp_combine(v));
      }
    }
    double m = 0;
    for (int64_t i = 0; i < S; ++i) m = d2[size_t(i)] > m ? d2[size_t(i)] : m;
    if (m > 0) {
      const int e = qvg::exact_sum::fixed_exponent(m, S);
      std::vector<uint64_t> tile_sum(static_cast<size_t>(tiles));
      uint64_t total = 0;
      for (int t = 0; t < tiles; ++t) {
        tile_sum[size_t(t)] =
            kpp_weight_sum(d2.data(), kpp_tile_begin(t, tiles, S), kpp_tile_begin(t + 1, tiles, S), e);
        total += tile_sum[size_t(t)];
      }
      pick = kpp_pick_in_tiles(d2.data(), tile_sum.data(), tiles, S, e, rng.below(total));
    } else {
      pick = kpp_unchosen_pick(chosen.data(), S, rng);
    }
  }
}
#endif

}  // namespace qvg::cuda::kernels
