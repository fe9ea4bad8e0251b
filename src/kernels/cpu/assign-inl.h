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
#include <vector>

#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
// Requires blocked_product-inl.h, included before it by dispatch.cpp.

QVG_CPU_KERNELS_BEGIN

// Register-blocked micro-kernel: P points x NV vectors of centroids, accumulators
// in registers, centroids transposed (dim x kpad) so that one load serves P points.
template <int P, int NV>
int64_t AssignBlocked(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t tileK = NV * L;
  const int64_t kpad = (k + tileK - 1) / tileK * tileK;
  // Thread-local scratch (bounded: k <= 256), reused across calls.
  thread_local std::vector<float> cT_buf, cn_buf, zero_row;
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
  const V two = hn::Set(df, 2.0f);
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    std::fill(best.begin(), best.end(), std::numeric_limits<float>::infinity());
    std::fill(bidx.begin(), bidx.end(), 0);
    for (int64_t j0 = 0; j0 < kpad; j0 += tileK) {
      for (int64_t i0 = c0; i0 < c1; i0 += P) {
        const float* xp[P];
        for (int p = 0; p < P; ++p) xp[p] = (i0 + p < c1) ? x + (i0 + p) * dim : zero_row.data();
        V acc[P][NV];
        BlockedProduct<P, NV>(df, xp, cT, kpad, j0, dim, acc);
        for (int p = 0; p < P && i0 + p < c1; ++p) {
          V dist[NV];
          for (int v = 0; v < NV; ++v) dist[v] = hn::NegMulAdd(two, acc[p][v], hn::LoadU(df, cn + j0 + v * L));
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
    for (int64_t i = c0; i < c1; ++i) {
      const int b = bidx[size_t(i - c0)];
      if (first || ids[i] != b) ++changed;
      ids[i] = uint8_t(b);
    }
  }
  return changed;
}

int64_t AssignNearestImpl(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
#if HWY_MAX_BYTES >= 64
  return AssignBlocked<4, 4>(x, n, dim, c, k, ids, first);
#else
  return AssignBlocked<4, 3>(x, n, dim, c, k, ids, first);
#endif
}

QVG_CPU_KERNELS_END
