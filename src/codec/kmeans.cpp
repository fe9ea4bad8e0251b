// k-means of one group (spec 1.1). Scalar code written so that the compiler can
// vectorise the inner loops; the Highway kernels of the performance work replace
// the assignment and update steps behind the same function.
#include "codec/kmeans.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/exact_sum_impl.h"
#include "core/kmeanspp_bound_impl.h"
#include "core/rng_impl.h"
#include "kernels/kernels.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg::detail {
namespace {

using rng_impl::Rng;

inline float sqdist(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      float t = a[i + j] - b[i + j];
      acc[j] += t * t;
    }
  for (; i < n; ++i) {
    float t = a[i] - b[i];
    acc[i & 7] += t * t;
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Assigns every point to its nearest centroid; returns how many ids changed.
// `first` marks the first assignment (every point counts as changed).
constexpr int64_t kAssignBlock = 512;  // points per parallel work item

int64_t assign(const float* x, int64_t n, int64_t dim, const float* c, int k, AssignPath path, uint8_t* ids,
               bool first, int threads) {
  int64_t changed = 0;
  if (path == AssignPath::Reference) {
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * dim;
      float best = std::numeric_limits<float>::infinity();
      int bi = 0;
      for (int j = 0; j < k; ++j) {
        float dj = sqdist(xi, c + j * dim, dim);
        if (dj < best) {
          best = dj;
          bi = j;
        }
      }
      if (first || ids[i] != bi) ++changed;
      ids[i] = uint8_t(bi);
    }
    return changed;
  }
  // Fast path (SIMD kernel): argmin of ||c||^2 - 2 x.c on the centred points.
  if (threads <= 1 || n < 2 * kAssignBlock) return kernels::assign_nearest(x, n, dim, c, k, ids, first);
  const int64_t blocks = (n + kAssignBlock - 1) / kAssignBlock;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : changed)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kAssignBlock, m = std::min(kAssignBlock, n - lo);
    changed += kernels::assign_nearest(x + lo * dim, m, dim, c, k, ids + lo, first);
  }
  return changed;
}

// New centroid = mean of its points (fp64 accumulation); empty clusters keep theirs.
void update(const float* x, int64_t n, int64_t dim, const uint8_t* ids, int k, float* c, KMeansWorkspace& ws) {
  std::vector<double>& sum = ws.sum;
  std::vector<int64_t>& cnt = ws.cnt;
  sum.assign(static_cast<size_t>(k) * size_t(dim), 0.0);
  cnt.assign(static_cast<size_t>(k), 0);
  kernels::accumulate_clusters(x, n, dim, ids, sum.data(), cnt.data());  // SIMD, same bits as the scalar sum
  for (int j = 0; j < k; ++j) {
    if (cnt[j] == 0) continue;
    const double inv = 1.0 / double(cnt[j]);
    for (int64_t d = 0; d < dim; ++d) c[size_t(j) * size_t(dim) + size_t(d)] = float(sum[size_t(j) * size_t(dim) + size_t(d)] * inv);
  }
}

// Partial Fisher-Yates: idx[0..k) are k distinct indices of 0..n-1 (k <= n).
void fisher_yates_prefix(int64_t n, int k, Rng& rng, std::vector<uint32_t>& idx) {
  idx.resize(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0u);
  for (int j = 0; j < k; ++j) {
    uint64_t r = uint64_t(j) + rng.below(uint64_t(n - j));
    std::swap(idx[size_t(j)], idx[size_t(r)]);
  }
}

void init_random(const float* x, int64_t n, int64_t dim, int k, Rng& rng, float* c, KMeansWorkspace& ws) {
  std::vector<uint32_t>& idx = ws.idx;
  fisher_yates_prefix(n, k, rng, idx);
  for (int j = 0; j < k; ++j) std::copy_n(x + int64_t(idx[size_t(j)]) * dim, dim, c + int64_t(j) * dim);
}

// The kmeans++ picks (spec 1.1): idx[0..k) (k <= n) among the n centred points x,
// with the stream `rng`: the first uniformly, each next one with probability
// proportional to d2 = the squared distance (sqdist, widened to fp64) to the nearest
// pick so far. The weights are d2 on the fixed-point scale of the largest d2
// (core/exact_sum_impl.h), so the total and every prefix sum are exact integers: the
// draw is u = below(total) and the pick the first point whose prefix sum exceeds u.
// When every point coincides with a pick (largest d2 0), an unchosen point uniformly.
// A point whose d2 cannot change (core/kmeanspp_bound_impl.h: its nearest pick so far
// at least twice as far from the new pick as from it, with a margin for rounding) is
// not measured again: the same picks, ~60-80 % fewer distances on the workload's K
// and ~25-35 % on its V (docs/cuda.md, "init kmeans++"). The CUDA encoder makes the
// same picks with a parallel sum (src/kernels/cuda/kmeanspp.cuh;
// tests/gpu/host_kmeanspp_test.cpp).
void kmeanspp_picks(const float* x, int64_t n, int64_t dim, int k, Rng& rng, uint32_t* idx, KMeansWorkspace& ws) {
  namespace X = exact_sum;
  std::vector<double>& d2 = ws.d2;
  std::vector<char>& chosen = ws.chosen;
  std::vector<uint8_t>& near = ws.near;  // the round of each point's nearest pick (k <= 256)
  std::vector<float>& cc = ws.cc;        // the earlier picks' distances to the new one
  d2.assign(static_cast<size_t>(n), std::numeric_limits<double>::infinity());
  chosen.assign(static_cast<size_t>(n), 0);
  near.assign(static_cast<size_t>(n), 0);
  cc.resize(static_cast<size_t>(k));
  std::vector<int64_t>& todo = ws.todo;  // the points measured in a round
  todo.resize(static_cast<size_t>(n));
  const double factor = kmeanspp_bound::skip_factor(dim);
  int64_t pick = int64_t(rng.below(uint64_t(n)));
  for (int j = 0; j < k; ++j) {
    chosen[size_t(pick)] = 1;
    idx[j] = uint32_t(pick);
    if (j + 1 == k) break;
    const float* cj = x + pick * dim;  // the centroid just chosen
    for (int p = 0; p < j; ++p) cc[size_t(p)] = sqdist(x + int64_t(idx[p]) * dim, cj, dim);
    // The points to measure, listed without a branch per point (which one is skipped
    // is data-dependent: a branch would mispredict about as often as it saves), then
    // their distances and d2 = std::min(d2, dd).
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double di = d2[size_t(i)];  // a float's value (or +inf): float(di) is exact
      const float c = di > 0 && di <= double(FLT_MAX) ? cc[near[size_t(i)]] : 0.0f;
      todo[size_t(cnt)] = i;
      cnt += kmeanspp_bound::may_skip(c, float(di), factor) ? 0 : 1;
    }
    for (int64_t t = 0; t < cnt; ++t) {
      const int64_t i = todo[size_t(t)];
      const double dd = double(sqdist(x + i * dim, cj, dim));
      const bool lower = dd < d2[size_t(i)];
      d2[size_t(i)] = lower ? dd : d2[size_t(i)];
      near[size_t(i)] = lower ? uint8_t(j) : near[size_t(i)];
    }
    double m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, d2[size_t(i)]);
    if (m > 0) {
      const X::FixedTerm term(X::fixed_exponent(m, n));
      uint64_t total = 0;
      for (int64_t i = 0; i < n; ++i) total += term(d2[size_t(i)]);
      const uint64_t u = rng.below(total);  // total >= 2^(bits - 1): the largest weighs that much
      uint64_t acc = 0;
      pick = -1;
      for (int64_t i = 0; i < n && pick < 0; ++i) {
        acc += term(d2[size_t(i)]);
        if (acc > u) pick = i;  // the first to exceed u has a positive weight
      }
    } else {
      // Every point coincides with a chosen centroid: take an unchosen point uniformly.
      int64_t left = 0;
      for (int64_t i = 0; i < n; ++i) left += chosen[size_t(i)] ? 0 : 1;
      int64_t r = int64_t(rng.below(uint64_t(left)));
      for (int64_t i = 0; i < n; ++i)
        if (!chosen[size_t(i)] && r-- == 0) {
          pick = i;
          break;
        }
    }
  }
}

void init_kmeanspp(const float* x, int64_t n, int64_t dim, int k, Rng& rng, float* c, KMeansWorkspace& ws) {
  std::vector<uint32_t>& idx = ws.idx;
  idx.resize(static_cast<size_t>(k));
  kmeanspp_picks(x, n, dim, k, rng, idx.data(), ws);
  for (int j = 0; j < k; ++j) std::copy_n(x + int64_t(idx[size_t(j)]) * dim, dim, c + int64_t(j) * dim);
}

}  // namespace

namespace {
/// The group mean (fp64 sums, rounded to fp32) and the centred points xc = x - mu.
void centre(const float* points, int64_t n, int64_t dim, KMeansWorkspace& ws) {
  std::vector<double>& mean_d = ws.mean;
  mean_d.assign(static_cast<size_t>(dim), 0.0);
  kernels::add_rows_f64(points, n, dim, nullptr, mean_d.data());  // SIMD, the scalar sums' bits
  std::vector<float>& mu = ws.mu;
  mu.resize(static_cast<size_t>(dim));
  for (int64_t d = 0; d < dim; ++d) mu[size_t(d)] = float(mean_d[size_t(d)] / double(n));
  std::vector<float>& xc = ws.xc;
  xc.resize(static_cast<size_t>(n * dim));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dim; ++d) xc[size_t(i * dim + d)] = points[i * dim + d] - mu[size_t(d)];
}
}  // namespace

std::vector<uint32_t> random_init_indices(uint64_t seed, int stage, int64_t b, int64_t h, int64_t n, int k) {
  QVG_CHECK(n >= 1 && k >= 1 && k <= n);
  Rng rng(seed, uint64_t(stage), uint64_t(b), uint64_t(h));
  std::vector<uint32_t> idx;
  fisher_yates_prefix(n, k, rng, idx);
  idx.resize(size_t(k));
  return idx;
}

float kmeans_sqdist(const float* a, const float* b, int64_t n) {
  return sqdist(a, b, n);
}

std::vector<uint32_t> kmeanspp_init_indices(uint64_t seed, int stage, int64_t b, int64_t h, const float* xc, int64_t n,
                                            int64_t dim, int k) {
  QVG_CHECK(n >= 1 && dim >= 1 && k >= 1 && k <= n);
  std::vector<uint32_t> idx(static_cast<size_t>(k));
  if (k == n) {  // kmeans(): every point is its own centroid, in order
    std::iota(idx.begin(), idx.end(), 0u);
    return idx;
  }
  Rng rng(seed, uint64_t(stage), uint64_t(b), uint64_t(h));
  KMeansWorkspace ws;
  kmeanspp_picks(xc, n, dim, k, rng, idx.data(), ws);
  return idx;
}

void assign_to(const float* points, int64_t n, int64_t dim, const float* centroids, int k, uint8_t* ids,
               AssignPath path, int threads, KMeansWorkspace& ws, bool centred) {
  QVG_CHECK(n >= 1 && dim >= 1 && k >= 1 && k <= 256);
  if (centred)
    QVG_CHECK(ws.xc.size() == size_t(n * dim) && ws.mu.size() == size_t(dim));
  else
    centre(points, n, dim, ws);
  std::vector<float>& c = ws.c;
  c.resize(static_cast<size_t>(k) * size_t(dim));
  for (int j = 0; j < k; ++j)
    for (int64_t d = 0; d < dim; ++d) c[size_t(j * dim + d)] = centroids[j * dim + d] - ws.mu[size_t(d)];
  assign(ws.xc.data(), n, dim, c.data(), k, path, ids, true, threads);
}

KMeansResult kmeans(const float* points, int64_t n, int64_t dim, const KMeansParams& p) {
  KMeansWorkspace ws;
  return kmeans(points, n, dim, p, ws);
}

namespace {
/// kmeans() with one centroid (a refinement layer's stage): whatever the initial
/// centroid, the first update makes it the mean of the centred points and every later
/// pass leaves it (all ids 0, nothing changes, so the loop stops after a second pass).
/// The same fp64 sums in the same order as centre() and update() — mu from the
/// points, then the centred points' sum — in two passes, without the centred copy.
KMeansResult one_centroid(const float* points, int64_t n, int64_t dim, const KMeansParams& p, KMeansWorkspace& ws) {
  KMeansResult res;
  res.k_eff = 1;
  res.centred = false;
  std::vector<double>& sum = ws.sum;
  sum.assign(size_t(dim), 0.0);
  kernels::add_rows_f64(points, n, dim, nullptr, sum.data());
  std::vector<float>& mu = ws.mu;
  mu.resize(size_t(dim));
  for (int64_t d = 0; d < dim; ++d) mu[size_t(d)] = float(sum[size_t(d)] / double(n));
  sum.assign(size_t(dim), 0.0);
  kernels::add_rows_f64(points, n, dim, mu.data(), sum.data());
  const double inv = 1.0 / double(n);
  res.centroids.resize(size_t(dim));
  for (int64_t d = 0; d < dim; ++d) res.centroids[size_t(d)] = float(sum[size_t(d)] * inv) + mu[size_t(d)];
  res.ids.assign(size_t(n), 0);
  res.iterations = std::min(p.iters, 2);
  return res;
}
}  // namespace

KMeansResult kmeans(const float* points, int64_t n, int64_t dim, const KMeansParams& p, KMeansWorkspace& ws) {
  QVG_CHECK(n >= 1 && dim >= 1 && p.k >= 1 && p.k <= 256 && p.iters >= 1);
  if (p.k == 1 && !p.record_inertia) return one_centroid(points, n, dim, p, ws);
  KMeansResult res;
  const int k = int(std::min<int64_t>(p.k, n));
  res.k_eff = k;

  // Group-centred copy of the points (spec 1.1: required for the expanded form).
  centre(points, n, dim, ws);
  const std::vector<float>& mu = ws.mu;
  std::vector<float>& xc = ws.xc;

  std::vector<float>& c = ws.c;
  c.resize(static_cast<size_t>(k) * size_t(dim));
  Rng rng(p.seed, uint64_t(p.stage), uint64_t(p.b), uint64_t(p.h));
  if (p.init == Init::Warm) {
    QVG_CHECK(p.warm != nullptr);
    for (int j = 0; j < k; ++j)
      for (int64_t d = 0; d < dim; ++d)
        c[size_t(j * dim + d)] = p.warm[j * dim + d] - mu[size_t(d)];
  } else if (k == n) {
    // S <= K: every point is its own centroid, in order (spec 1.1: S < K).
    std::copy_n(xc.begin(), n * dim, c.begin());
  } else if (p.init == Init::KMeansPlusPlus) {
    init_kmeanspp(xc.data(), n, dim, k, rng, c.data(), ws);
  } else {
    init_random(xc.data(), n, dim, k, rng, c.data(), ws);
  }

  res.ids.assign(size_t(n), 0);
  if (p.record_inertia) res.inertia.push_back(inertia_fp64(xc.data(), n, c.data(), k, dim));
  const double stop_below = 1e-4 * double(n);
  for (int it = 0; it < p.iters; ++it) {
    // One centroid: every point is nearest to it (ids stay 0; the first pass counts all).
    int64_t changed = k == 1 ? (it == 0 ? n : 0)
                             : assign(xc.data(), n, dim, c.data(), k, p.path, res.ids.data(), it == 0, p.threads);
    update(xc.data(), n, dim, res.ids.data(), k, c.data(), ws);
    res.iterations = it + 1;
    if (p.record_inertia) res.inertia.push_back(inertia_fp64(xc.data(), n, c.data(), k, dim));
    if (double(changed) < stop_below) break;
  }

  res.centroids.assign(size_t(p.k) * size_t(dim), 0.0f);
  for (int j = 0; j < k; ++j)
    for (int64_t d = 0; d < dim; ++d)
      res.centroids[size_t(j * dim + d)] = c[size_t(j * dim + d)] + mu[size_t(d)];
  return res;
}

}  // namespace qvg::detail
