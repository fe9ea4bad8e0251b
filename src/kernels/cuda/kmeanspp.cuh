// src/kernels/cuda/kmeanspp.cuh — init kmeans++ on the device (spec 1.1): the
// per-thread bodies of kmeanspp_kernel (kmeanspp_kernels.cu) as __host__ __device__
// functions, and kmeanspp_picks_host, which runs them on the host in the kernel's
// order (tests/gpu/host_kmeanspp_test.cpp compares its picks with the CPU codec's,
// qvg::detail::kmeanspp_init_indices; tests/gpu/encode_replay.h replays with it).
//
// The rule is the CPU codec's (kmeans.cpp, kmeanspp_picks), on the device's centred
// points xc = r - mu (fp32, one rounded subtraction per element):
// - the first pick is below(S) of the group's stream (seed, stage, b, h + head_offset);
// - each round, every point's d2 = min(d2, sqdist(xc_i, xc_pick)), sqdist being the
//   CPU's 8-lane fp32 sum (lane l adds the channels d = l (mod 8) in increasing d; the
//   lanes combine as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))); the CPU keeps
//   d2 as a double, but every value it takes is a float (+inf, or a converted fp32
//   distance), so the device keeps the float;
// - the weights are the d2 on the fixed-point scale of the largest d2
//   (core/exact_sum_impl.h); with a positive largest d2, u = below(total of the
//   weights) and the pick is the first point whose prefix sum of weights exceeds u;
//   else (every point coincides with a pick) the below(left)-th unchosen point.
// The weights' sums are exact integers, so the kernel adds them in any order: the
// group's points are split into `blocks` contiguous slices (one thread block each,
// a cluster of them per group), each slice into kKppTiles contiguous tiles (one
// thread each); the pick is found from the slices' and tiles' prefix sums and one
// walk inside the tile that holds it (kpp_walk_tile).
//
// Pruning (core/kmeanspp_bound_impl.h, the CPU's too): a point whose nearest pick so
// far is at least twice as far from the new pick as from the point keeps its d2, by
// the triangle inequality, tested with a margin that covers the computed distances'
// rounding: the picks are the CPU's, bit for bit, with fewer rows read
// (tests/gpu/host_kmeanspp_test.cpp checks every skip against the distance it avoided).
#pragma once

#include <cfloat>
#include <cstdint>

#include "core/exact_sum_impl.h"
#include "core/kmeanspp_bound_impl.h"
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
/// Threads of kmeanspp_kernel: each sums one contiguous tile of its block's slice of
/// the points' weights.
inline constexpr int kKppTiles = 512;
/// The most blocks (a thread block cluster, at most the portable 8) that share one
/// group's points, and the fewest points a block's slice is given when there are
/// several (below that the cluster's barriers cost more than the rows they spread).
inline constexpr int kKppMaxBlocks = 8;
inline constexpr int64_t kKppMinSlice = 256;

/// Element d of a row of element type DT (qvg::cuda_arith::kF32 / kBF16 / kF16) as
/// fp32: exact, so a row of the input reads as the same values as its fp32 copy.
template <int DT>
QVG_HD float kpp_elem(const void* row, int64_t d) {
  namespace A = qvg::cuda_arith;
  if constexpr (DT == A::kF32) {
    return static_cast<const float*>(row)[d];
  } else {
    const uint16_t h = static_cast<const uint16_t*>(row)[d];
    if constexpr (DT == A::kBF16)
      return A::bf16_to_f32(h);
    else
      return A::f16_to_f32(h);
  }
}

/// Lane `lane` (0..7) of sqdist(xc_i, xp) for the points i with rows[p] (p <
/// kKppPer; rows of element type DT; rows[p] null: no point, acc[p] stays 0): acc[p]
/// = the fp32 sum, in increasing d, of (xc_i[d] - xp[d])^2 over d = lane (mod 8),
/// xc_i[d] = r_i[d] - mu[d]; each operation rounded separately (never fused). Loads
/// kKppBatch channels of every point before adding them; the order of the additions
/// is the CPU's.
template <int DT = qvg::cuda_arith::kF32>
QVG_HD void kpp_lanes(const void* const* rows, const float* mu, const float* xp, int64_t D, int lane, float* acc) {
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
      for (int p = 0; p < kKppPer; ++p) v[p][b] = in && rows[p] != nullptr ? kpp_elem<DT>(rows[p], d) : 0.0f;
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

/// The new d2 of a point at fp32 distance `dist` from the latest pick: the CPU's
/// std::min(d2, double(dist)) on a d2 that is always a float (a NaN distance keeps d2).
QVG_HD float kpp_min(float d2, float dist) {
  return dist < d2 ? dist : d2;
}

/// The points of tile t of `tiles` contiguous tiles over S points: [kpp_tile_begin(t),
/// kpp_tile_begin(t + 1)).
QVG_HD int64_t kpp_tile_begin(int64_t t, int tiles, int64_t S) {
  const int64_t len = (S + tiles - 1) / tiles;
  const int64_t b = t * len;
  return b < S ? b : S;
}

/// The sum of the weights (exact_sum::fixed_term on scale e) of points [i0, i1).
QVG_HD uint64_t kpp_weight_sum(const float* d2, int64_t i0, int64_t i1, int e) {
  uint64_t s = 0;
  for (int64_t i = i0; i < i1; ++i) s += qvg::exact_sum::fixed_term(double(d2[i]), e);
  return s;
}

/// The pick inside the tile [i0, i1) whose weights' prefix before it is `before`,
/// for the draw u with before <= u < before + the tile's sum: the first point whose
/// prefix sum of weights exceeds u.
QVG_HD int64_t kpp_walk_tile(const float* d2, int64_t i0, int64_t i1, int e, uint64_t before, uint64_t u) {
  uint64_t acc = before;
  for (int64_t i = i0; i < i1; ++i) {
    acc += qvg::exact_sum::fixed_term(double(d2[i]), e);
    if (acc > u) return i;
  }
  return -1;  // unreachable: u < before + the tile's sum
}

/// How many of picks[first], picks[first + stride], ... (< count) are <= x.
QVG_HD uint32_t kpp_count_le(const uint32_t* picks, int count, int first, int stride, uint64_t x) {
  uint32_t c = 0;
  for (int t = first; t < count; t += stride) c += uint64_t(picks[t]) <= x ? 1u : 0u;
  return c;
}

/// The total-0 branch's point: the r-th (0-based) of the points of 0..S-1 not among
/// the `count` distinct picks, in point order (r = below(S - count) of the stream).
/// It is the least x with x = r + #{picks <= x}: the iteration x <- r + #{picks <= x}
/// from x = r rises to it (at most count + 1 steps); such an x is no pick (else x - 1
/// would be one too) and has r unchosen points before it. `count_le(x)` counts the
/// picks <= x (kpp_count_le; the kernel's warp splits it over its lanes).
template <class CountLe>
QVG_HD int64_t kpp_unchosen_index(uint64_t r, CountLe count_le) {
  uint64_t x = r;
  for (;;) {
    const uint64_t next = r + count_le(x);
    if (next == x) return int64_t(x);
    x = next;
  }
}

#if !defined(__CUDA_ARCH__)
/// How kmeanspp_picks_host splits the work and what it reports (the tests').
struct KppHostRun {
  int tiles = kKppTiles;  ///< tiles per block's slice (the kernel: kKppTiles)
  int blocks = 1;         ///< blocks (slices) per group (the kernel: 1..kKppMaxBlocks)
  /// The pruning test (the kernel's: kmeanspp_bound::may_skip; a test plants others),
  /// given kmeanspp_bound::skip_factor(D).
  bool (*may_skip)(float cc, float d2, double factor) = qvg::kmeanspp_bound::may_skip;
  /// With true, every skipped point's distance is computed too, and a skip whose
  /// distance is below the point's d2 (a wrong skip) is counted in `wrong_skips`.
  bool audit = false;
  int64_t evaluated = 0;    ///< out: distances computed for the d2 update
  int64_t skipped = 0;      ///< out: points kept by the pruning test
  int64_t wrong_skips = 0;  ///< out (audit): skips that changed the d2 update
};

/// The picks kmeanspp_kernel writes for one group: idx[0..k) for the S points r
/// (S x D, fp32, the stage's residual) with group mean mu, stream (seed, stage, b, h)
/// (h: the stream's head, head_offset included); k == S: 0..S-1 in order. Runs the
/// kernel's bodies in its order: the new pick's distances to the earlier picks, the
/// pruning test, lane sums and the octet combination of the points not skipped, the
/// largest d2, the weights' sums of `tiles` contiguous tiles of `blocks` contiguous
/// slices, the pick from them; the total-0 branch. The picks depend neither on
/// `tiles` nor on `blocks` (exact integer sums) nor on the pruning (exact skips).
/// REQUIRES 1 <= k <= S, run.tiles >= 1, run.blocks >= 1.
inline void kmeanspp_picks_host(const float* r, const float* mu, int64_t S, int64_t D, int k, uint64_t seed, int stage,
                                int64_t b, int64_t h, uint32_t* idx, KppHostRun& run) {
  namespace A = qvg::cuda_arith;
  if (k == S) {
    for (int j = 0; j < k; ++j) idx[j] = uint32_t(j);
    return;
  }
  std::vector<float> d2(static_cast<size_t>(S), std::numeric_limits<float>::infinity());
  std::vector<uint8_t> near(static_cast<size_t>(S), 0);
  std::vector<float> xp(static_cast<size_t>(D)), cc(static_cast<size_t>(k));
  std::vector<int64_t> todo;
  const double factor = qvg::kmeanspp_bound::skip_factor(D);
  A::Rng rng(seed, uint64_t(stage), uint64_t(b), uint64_t(h));
  int64_t pick = int64_t(rng.below(uint64_t(S)));
  // kKppPer rows' distances to xp at a time, as an octet of the kernel does them.
  const auto distances = [&](const int64_t* rows_of, int64_t n, float* out) {
    for (int64_t i0 = 0; i0 < n; i0 += kKppPer) {
      const void* rows[kKppPer];
      for (int p = 0; p < kKppPer; ++p) rows[p] = i0 + p < n ? r + rows_of[i0 + p] * D : nullptr;
      float lanes[kKppLanes][kKppPer];
      for (int l = 0; l < kKppLanes; ++l) kpp_lanes(rows, mu, xp.data(), D, l, lanes[l]);
      for (int p = 0; p < kKppPer && i0 + p < n; ++p) {
        float v[kKppLanes];
        for (int l = 0; l < kKppLanes; ++l) v[l] = lanes[l][p];
        out[i0 + p] = kpp_combine(v);
      }
    }
  };
  std::vector<int64_t> picks64;
  for (int j = 0; j < k; ++j) {
    idx[j] = uint32_t(pick);
    picks64.push_back(pick);
    if (j + 1 == k) break;
    for (int64_t d = 0; d < D; ++d) xp[size_t(d)] = A::sub_rn(r[pick * D + d], mu[d]);
    distances(picks64.data(), j, cc.data());  // the earlier picks' distances to the new one
    todo.clear();
    for (int64_t i = 0; i < S; ++i) {
      const float di = d2[size_t(i)];
      const float c = di > 0.0f && di <= FLT_MAX ? cc[near[size_t(i)]] : 0.0f;
      if (run.may_skip(c, di, factor)) {
        ++run.skipped;
        if (run.audit) {
          float dist;
          distances(&i, 1, &dist);
          run.wrong_skips += kpp_min(di, dist) != di ? 1 : 0;
        }
      } else {
        todo.push_back(i);
      }
    }
    std::vector<float> dist(todo.size());
    distances(todo.data(), int64_t(todo.size()), dist.data());
    run.evaluated += int64_t(todo.size());
    for (size_t t = 0; t < todo.size(); ++t) {
      float& di = d2[size_t(todo[t])];
      if (dist[t] < di) {
        di = dist[t];
        near[size_t(todo[t])] = uint8_t(j);
      }
    }
    float m = 0;  // the blocks' maxima, then theirs (fmaxf: NaN-free order-free)
    for (int blk = 0; blk < run.blocks; ++blk) {
      float bm = 0;
      for (int64_t i = kpp_tile_begin(blk, run.blocks, S); i < kpp_tile_begin(blk + 1, run.blocks, S); ++i)
        bm = d2[size_t(i)] > bm ? d2[size_t(i)] : bm;
      m = bm > m ? bm : m;
    }
    if (m > 0) {
      const int e = qvg::exact_sum::fixed_exponent(double(m), S);
      std::vector<uint64_t> tile_sum(static_cast<size_t>(run.blocks) * size_t(run.tiles));
      std::vector<uint64_t> block_sum(static_cast<size_t>(run.blocks), 0);
      uint64_t total = 0;
      for (int blk = 0; blk < run.blocks; ++blk) {
        const int64_t s0 = kpp_tile_begin(blk, run.blocks, S), n = kpp_tile_begin(blk + 1, run.blocks, S) - s0;
        for (int t = 0; t < run.tiles; ++t) {
          uint64_t& ts = tile_sum[size_t(blk) * size_t(run.tiles) + size_t(t)];
          ts = kpp_weight_sum(d2.data(), s0 + kpp_tile_begin(t, run.tiles, n), s0 + kpp_tile_begin(t + 1, run.tiles, n),
                              e);
          block_sum[size_t(blk)] += ts;
        }
        total += block_sum[size_t(blk)];
      }
      const uint64_t u = rng.below(total);
      pick = -1;
      uint64_t bbefore = 0;
      for (int blk = 0; blk < run.blocks && pick < 0; ++blk) {
        if (u >= bbefore && u - bbefore < block_sum[size_t(blk)]) {
          const uint64_t ul = u - bbefore;
          const int64_t s0 = kpp_tile_begin(blk, run.blocks, S), n = kpp_tile_begin(blk + 1, run.blocks, S) - s0;
          uint64_t before = 0;
          for (int t = 0; t < run.tiles && pick < 0; ++t) {
            const uint64_t ts = tile_sum[size_t(blk) * size_t(run.tiles) + size_t(t)];
            if (ul >= before && ul - before < ts)
              pick = kpp_walk_tile(d2.data(), s0 + kpp_tile_begin(t, run.tiles, n),
                                   s0 + kpp_tile_begin(t + 1, run.tiles, n), e, before, ul);
            before += ts;
          }
        }
        bbefore += block_sum[size_t(blk)];
      }
    } else {
      const uint64_t rr = rng.below(uint64_t(S - (j + 1)));
      pick = kpp_unchosen_index(rr, [&](uint64_t x) { return kpp_count_le(idx, j + 1, 0, 1, x); });
    }
  }
}

/// kmeanspp_picks_host with the kernel's split for one block per group.
inline void kmeanspp_picks_host(const float* r, const float* mu, int64_t S, int64_t D, int k, uint64_t seed, int stage,
                                int64_t b, int64_t h, uint32_t* idx) {
  KppHostRun run;
  kmeanspp_picks_host(r, mu, S, D, k, seed, stage, b, h, idx, run);
}
#endif

}  // namespace qvg::cuda::kernels
