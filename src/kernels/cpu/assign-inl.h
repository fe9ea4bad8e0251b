// src/kernels/cpu/assign-inl.h — k-means assignment (kernels::assign_nearest), per
// SIMD target. Included once per SIMD target by dispatch.cpp
// (its foreach_target pass), which has no per-target include guard for it.
//
// x.c accumulates with fused multiply-adds per channel in SIMD lanes; the result
// may differ from the scalar reference in the last bits (spec 1.1 allows it for
// fast paths).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
// Requires blocked_product-inl.h, included before it by dispatch.cpp.

QVG_CPU_KERNELS_BEGIN

// Register-blocked micro-kernel: P points x NV vectors of centroids (the tile of
// centroids [j0, j0 + NV * L)), accumulators in registers, centroids transposed
// (dim x kpad) so that one load serves P points. Updates each point's best distance
// and index: a centroid replaces the best only when strictly nearer, so with tiles
// swept in increasing j0 the lowest index of the minimum wins, whatever the tiles'
// widths. Every distance is the same FMA chain over d, whatever P and NV.
template <int P, int NV, class DF, class V = hn::Vec<DF>>
void AssignTile(DF df, const float* x, int64_t c0, int64_t c1, int64_t dim, const float* cT, const float* cn,
                int64_t kpad, int64_t j0, const float* zero_row, float* HWY_RESTRICT acc, float* best, int* bidx) {
  const int64_t L = int64_t(hn::Lanes(df));
  const V two = hn::Set(df, 2.0f);
  for (int64_t i0 = c0; i0 < c1; i0 += P) {
    const float* xp[P];
    for (int p = 0; p < P; ++p) xp[p] = (i0 + p < c1) ? x + (i0 + p) * dim : zero_row;
    BlockedProductStore<P, NV>(df, xp, cT, kpad, j0, dim, acc);
    for (int p = 0; p < P && i0 + p < c1; ++p) {
      V dist[NV];
      for (int v = 0; v < NV; ++v)
        dist[v] = hn::NegMulAdd(two, hn::Load(df, acc + (p * NV + v) * L), hn::LoadU(df, cn + j0 + v * L));
      V m = dist[0];
      for (int v = 1; v < NV; ++v) m = hn::Min(m, dist[v]);
      const float mv = hn::GetLane(hn::MinOfLanes(df, m));
      const size_t slot = size_t(i0 + p - c0);
      if (mv < best[slot]) {  // strict: earlier tiles (lower indices) win ties
        best[slot] = mv;
        const V mvv = hn::Set(df, mv);
        for (int v = 0; v < NV; ++v) {
          const intptr_t lane = hn::FindFirstTrue(df, hn::Eq(dist[v], mvv));
          if (lane >= 0) {
            bidx[slot] = int(j0 + v * L + lane);
            break;
          }
        }
      }
    }
  }
}

// The assignment: tiles of kNV vectors of centroids, and one narrower tile for the
// last centroids, so that a small codebook (an incremental span's later chunk trains
// about K/6 centroids; its final assignment sees 64 + K/6 slots at K = 128) is not
// padded to a whole tile. Each tile takes P points per step, P x NV accumulators plus
// NV centroid vectors and a broadcast within the registers (32 with AVX-512, else 16).
// At D = 128, 1,170 points (AVX-512 here; medians): K = 21 117 -> 60 us, K = 85 320
// -> 190 us, K = 128 330 -> 280 us against one tile shape of 4 points x 4 vectors.
int64_t AssignNearestImpl(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
  const hn::ScalableTag<float> df;
#if HWY_MAX_BYTES >= 64
  constexpr int kP = 8, kNV = 2;
#else
  constexpr int kP = 4, kNV = 3;
#endif
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t kpad = (k + L - 1) / L * L;
  // Thread-local scratch (bounded: k <= 256), reused across calls.
  thread_local std::vector<float> cT_buf, cn_buf, zero_row;
  thread_local hwy::AlignedFreeUniquePtr<float[]> acc;  // a tile's P x NV accumulators
  if (!acc) acc = hwy::AllocateAligned<float>(size_t(std::max(kP * kNV, 12) * L));
  cT_buf.assign(size_t(dim * kpad), 0.0f);
  cn_buf.resize(size_t(kpad));
  zero_row.assign(size_t(dim), 0.0f);
  float* cT = cT_buf.data();
  float* cn = cn_buf.data();
  for (int64_t j = 0; j < kpad; ++j) {
    if (j < k) {
      float s = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const float v = c[j * dim + d];
        cT[size_t(d * kpad + j)] = v;
        s += v * v;
      }
      cn[size_t(j)] = s;
    } else {
      cn[size_t(j)] = std::numeric_limits<float>::infinity();  // padding: never nearest
    }
  }
  constexpr int64_t kChunk = 128;  // points whose rows stay in L2 while tiles sweep
  std::vector<float> best(static_cast<size_t>(kChunk));
  std::vector<int> bidx(static_cast<size_t>(kChunk));
  int64_t changed = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    std::fill(best.begin(), best.end(), std::numeric_limits<float>::infinity());
    std::fill(bidx.begin(), bidx.end(), 0);
    for (int64_t j0 = 0; j0 < kpad;) {
      const int64_t nv = std::min<int64_t>(kNV, (kpad - j0) / L);
      const auto tile = [&](auto p, auto v) {
        AssignTile<decltype(p)::value, decltype(v)::value>(df, x, c0, c1, dim, cT, cn, kpad, j0, zero_row.data(),
                                                           acc.get(), best.data(), bidx.data());
      };
      using std::integral_constant;
      if (nv == kNV)
        tile(integral_constant<int, kP>{}, integral_constant<int, kNV>{});
      else if (nv == 2)
        tile(integral_constant<int, 6>{}, integral_constant<int, 2>{});
      else
        tile(integral_constant<int, 8>{}, integral_constant<int, 1>{});
      j0 += nv * L;
    }
    for (int64_t i = c0; i < c1; ++i) {
      const int b = bidx[size_t(i - c0)];
      if (first || ids[i] != b) ++changed;
      ids[i] = uint8_t(b);
    }
  }
  return changed;
}

QVG_CPU_KERNELS_END
