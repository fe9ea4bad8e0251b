// Host-side test of the device encoder's init kmeans++ (no GPU needed; part of
// qvg_cuda_host_test, ctest cuda.host_arith): the bodies of kmeanspp_kernel
// (src/kernels/cuda/kmeanspp.cuh), run on the host in the kernel's order by
// kmeanspp_picks_host, make exactly the CPU codec's picks
// (qvg::detail::kmeanspp_init_indices, the rule kmeans() seeds with) from the same
// centred points: random point sets of several sizes, D = 64 and 128 (and odd D),
// K up to 256, duplicated points (every point then coincides with a pick before k
// picks: the total-0 branch), k_eff == S, and magnitudes from 1e-3 to 1e6.
// What this cannot check: the kernel's block/thread mapping (its octet shuffles,
// the chunk pipeline, the parallel search), checked on a GPU by
// tests/gpu/kmeanspp_gpu_tests.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "codec/kmeans.h"
#include "core/exact_sum_impl.h"
#include "core/kmeanspp_bound_impl.h"
#include "gpu/harness.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/kmeanspp.cuh"
#include "kernels/cuda/span_bodies.cuh"
#include "qvg/codec.h"

namespace {

namespace A = qvg::cuda_arith;
namespace K = qvg::cuda::kernels;
namespace B = qvg::kmeanspp_bound;

/// S points of dimension D (fp32, row-major): `distinct` clustered rows (scale
/// `scale`, offset by 3 scales), each of the S a copy of one of them when distinct <
/// S, else all different.
std::vector<float> make_points(int64_t S, int64_t D, int64_t distinct, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> centres(static_cast<size_t>(8 * D));
  for (float& c : centres) c = n01(rng) * scale;
  std::vector<float> rows(static_cast<size_t>(distinct * D));
  for (int64_t i = 0; i < distinct; ++i)
    for (int64_t d = 0; d < D; ++d)
      rows[size_t(i * D + d)] = 3.0f * scale + centres[size_t((i % 8) * D + d)] + 0.3f * scale * n01(rng);
  std::vector<float> x(static_cast<size_t>(S * D));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t src = distinct < S ? int64_t(rng() % uint64_t(distinct)) : i;
    std::copy_n(rows.begin() + src * D, D, x.begin() + i * D);
  }
  return x;
}

/// The CPU codec's group mean (kmeans.cpp, centre: fp64 sums, rounded to fp32).
std::vector<float> cpu_mean(const std::vector<float>& x, int64_t S, int64_t D) {
  std::vector<float> mu(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    double s = 0;
    for (int64_t i = 0; i < S; ++i) s += double(x[size_t(i * D + d)]);
    mu[size_t(d)] = float(s / double(S));
  }
  return mu;
}

}  // namespace

// The octet's shuffles (offsets 4, 1, 2 within 8 lanes, as kmeanspp_kernel does them)
// leave lane 0 with the CPU's combination ((l0 + l4) + (l1 + l5)) + ((l2 + l6) +
// (l3 + l7)), and kpp_combine (the same steps on an array) with it too.
QVG_TEST(kmeanspp_octet_shuffles_combine_in_the_cpu_order) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  int checked = 0;
  for (int rep = 0; rep < 20000; ++rep) {
    float lanes[32];
    for (float& v : lanes) v = std::ldexp(u(rng), int(rng() % 40) - 20);
    float cpu[4];
    for (int o = 0; o < 4; ++o) {
      const float* a = lanes + 8 * o;
      cpu[o] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
    float v[32];
    std::copy_n(lanes, 32, v);
    for (const int off : {4, 1, 2}) {  // __shfl_down_sync(mask, v, off, 8): lane + off within its octet, else itself
      float got[32];
      for (int l = 0; l < 32; ++l) got[l] = (l % 8) + off < 8 ? v[l + off] : v[l];
      for (int l = 0; l < 32; ++l) v[l] = A::add_rn(v[l], got[l]);
    }
    for (int o = 0; o < 4; ++o) {
      float arr[8];
      std::copy_n(lanes + 8 * o, 8, arr);
      QVG_EXPECT(A::bits_of(v[8 * o]) == A::bits_of(cpu[o]) && A::bits_of(K::kpp_combine(arr)) == A::bits_of(cpu[o]))
          << "rep" << rep << "octet" << o;
      ++checked;
    }
  }
  QVG_EXPECT(checked == 80000);
}

// A point's distance as the kernel makes it (kpp_lanes for 4 points at a time, then
// kpp_combine) is the CPU's sqdist (kmeans_sqdist) of the centred rows, bit for bit:
// D with and without lane tails, magnitudes from 1e-6 to 1e9.
QVG_TEST(kmeanspp_distance_bodies_equal_the_cpu_sqdist) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  int compared = 0;
  for (const int64_t D : {1, 5, 8, 44, 48, 64, 100, 128, 130, 256})
    for (const float scale : {1e-6f, 1.0f, 3e3f, 1e9f}) {
      const int64_t S = 37;
      std::vector<float> r(static_cast<size_t>(S * D)), mu(static_cast<size_t>(D)), xp(static_cast<size_t>(D));
      for (float& v : r) v = n01(rng) * scale + 2.0f * scale;
      for (float& v : mu) v = n01(rng) * scale;
      for (int64_t d = 0; d < D; ++d) xp[size_t(d)] = A::sub_rn(r[size_t(5 * D + d)] + n01(rng) * scale, mu[size_t(d)]);
      // The same rows as bf16 and fp16 (their values rounded there, then widened:
      // the kernel's input rows) give the fp32 rows' distances of the widened values.
      std::vector<uint16_t> rb(r.size()), rh(r.size());
      for (size_t e = 0; e < r.size(); ++e) {
        rb[e] = A::f32_to_bf16(r[e]);
        rh[e] = A::f32_to_f16_sat(r[e]);
      }
      for (int64_t i0 = 0; i0 < S; i0 += K::kKppPer) {
        const void* rows[K::kKppPer];
        const void* rows_b[K::kKppPer];
        const void* rows_h[K::kKppPer];
        for (int p = 0; p < K::kKppPer; ++p) {
          rows[p] = i0 + p < S ? r.data() + (i0 + p) * D : nullptr;
          rows_b[p] = i0 + p < S ? rb.data() + (i0 + p) * D : nullptr;
          rows_h[p] = i0 + p < S ? rh.data() + (i0 + p) * D : nullptr;
        }
        float lanes[K::kKppLanes][K::kKppPer], lanes_b[K::kKppLanes][K::kKppPer], lanes_h[K::kKppLanes][K::kKppPer];
        for (int l = 0; l < K::kKppLanes; ++l) {
          K::kpp_lanes(rows, mu.data(), xp.data(), D, l, lanes[l]);
          K::kpp_lanes<A::kBF16>(rows_b, mu.data(), xp.data(), D, l, lanes_b[l]);
          K::kpp_lanes<A::kF16>(rows_h, mu.data(), xp.data(), D, l, lanes_h[l]);
        }
        for (int p = 0; p < K::kKppPer && i0 + p < S; ++p) {
          float v[K::kKppLanes], vb[K::kKppLanes], vh[K::kKppLanes];
          for (int l = 0; l < K::kKppLanes; ++l) {
            v[l] = lanes[l][p];
            vb[l] = lanes_b[l][p];
            vh[l] = lanes_h[l][p];
          }
          std::vector<float> xc(static_cast<size_t>(D)), xb(static_cast<size_t>(D)), xh(static_cast<size_t>(D));
          for (int64_t d = 0; d < D; ++d) {
            xc[size_t(d)] = A::sub_rn(r[size_t((i0 + p) * D + d)], mu[size_t(d)]);
            xb[size_t(d)] = A::sub_rn(A::bf16_to_f32(rb[size_t((i0 + p) * D + d)]), mu[size_t(d)]);
            xh[size_t(d)] = A::sub_rn(A::f16_to_f32(rh[size_t((i0 + p) * D + d)]), mu[size_t(d)]);
          }
          QVG_EXPECT(A::bits_of(K::kpp_combine(vb)) ==
                         A::bits_of(qvg::detail::kmeans_sqdist(xb.data(), xp.data(), D)) &&
                     A::bits_of(K::kpp_combine(vh)) == A::bits_of(qvg::detail::kmeans_sqdist(xh.data(), xp.data(), D)))
              << "bf16/fp16 rows: D" << D << "scale" << scale << "point" << i0 + p;
          const float cpu = qvg::detail::kmeans_sqdist(xc.data(), xp.data(), D);
          QVG_EXPECT(A::bits_of(K::kpp_combine(v)) == A::bits_of(cpu))
              << "D" << D << "scale" << scale << "point" << i0 + p;
          ++compared;
        }
      }
    }
  QVG_EXPECT(compared == 10 * 4 * 37) << compared;
}

// kmeanspp_picks_host (the kernel's bodies in its order) against the CPU rule
// (kmeanspp_init_indices) on the same centred points xc = r - mu: identical picks,
// whatever the number of tiles the weights are summed in (spec 1.1: exact sums).
QVG_TEST(kmeanspp_bodies_make_the_cpu_picks) {
  struct Case {
    int64_t S, D;
    int k;
    int64_t distinct;  // < S: duplicated points
    float scale;
  };
  std::vector<Case> cases;
  for (const int64_t D : {64, 128})
    for (const int64_t S : {2, 3, 17, 100, 256, 257, 700, 1500}) {
      for (const int k : {1, 2, 7, 64, 128, 255, 256}) {
        if (k > S) continue;
        cases.push_back({S, D, k, S, D == 64 ? 1.0f : 1e-3f});
        if (S >= 100 && k >= 64) cases.push_back({S, D, k, 20, 300.0f});  // 20 distinct < k: total 0 after 20 picks
      }
      cases.push_back({S, D, int(std::min<int64_t>(S, 256)), S, 1e6f});  // k_eff == S when S <= 256
    }
  for (const float scale : {1e-19f, 1e-15f, 1e15f})  // squares below the normal range; sums near 1e32
    cases.push_back({500, 128, 64, 500, scale});
  for (const int64_t D : {1, 7, 48, 130}) cases.push_back({300, D, 32, 300, 1.0f});  // lane tails
  cases.push_back({4680, 128, 256, 4680, 1.0f});                                     // Self-Forcing's chunk, one group
  cases.push_back({600, 128, 256, 3, 1.0f});                                         // 3 distinct points

  int compared = 0, coincide_cases = 0, identity_cases = 0;
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const std::vector<float> r = make_points(c.S, c.D, c.distinct, c.scale, seed);
    const std::vector<float> mu = cpu_mean(r, c.S, c.D);
    std::vector<float> xc(r.size());
    for (size_t e = 0; e < r.size(); ++e) xc[e] = A::sub_rn(r[e], mu[e % size_t(c.D)]);
    const uint64_t kseed = seed % 2 ? 1234ull : 0xFFFFFFFFFFFFFFFFull;
    const int stage = int(seed % 3);
    const int64_t b = seed % 2, h = int64_t(seed % 5) + 7;  // h: a head with a head_offset
    const std::vector<uint32_t> cpu = qvg::detail::kmeanspp_init_indices(kseed, stage, b, h, xc.data(), c.S, c.D, c.k);
    std::vector<uint32_t> dev(size_t(c.k), 0xFFFFFFFFu);
    K::kmeanspp_picks_host(r.data(), mu.data(), c.S, c.D, c.k, kseed, stage, b, h, dev.data());
    QVG_EXPECT(cpu == dev) << "S" << c.S << "D" << c.D << "k" << c.k << "distinct" << c.distinct << "scale" << c.scale;
    // The weights' sums are exact integers: any tiling of the points (the kernel's
    // threads) and any split into slices (its blocks) makes the same picks; and the
    // pruning's skips are exact: without it (a test that skips nothing) the same.
    for (const auto& [tiles, blocks] : {std::pair{1, 3}, std::pair{7, 1}, std::pair{64, 8}, std::pair{512, 2}}) {
      std::vector<uint32_t> other(size_t(c.k), 0xFFFFFFFFu);
      K::KppHostRun run;
      run.tiles = tiles;
      run.blocks = blocks;
      K::kmeanspp_picks_host(r.data(), mu.data(), c.S, c.D, c.k, kseed, stage, b, h, other.data(), run);
      QVG_EXPECT(other == dev) << "tiles" << tiles << "blocks" << blocks << "S" << c.S << "k" << c.k;
    }
    if (c.S <= 700) {
      std::vector<uint32_t> other(size_t(c.k), 0xFFFFFFFFu);
      K::KppHostRun run;
      run.may_skip = [](float, float, double) { return false; };
      K::kmeanspp_picks_host(r.data(), mu.data(), c.S, c.D, c.k, kseed, stage, b, h, other.data(), run);
      QVG_EXPECT(other == dev) << "without pruning: S" << c.S << "k" << c.k;
    }
    const std::set<uint32_t> uniq(dev.begin(), dev.end());
    QVG_EXPECT(uniq.size() == size_t(c.k) && *uniq.rbegin() < uint64_t(c.S)) << "picks not distinct or out of range";
    coincide_cases += c.distinct < c.k;
    identity_cases += c.k == c.S;
    ++compared;
    ++seed;
  }
  std::printf("  %d point sets compared (%d with fewer distinct points than picks, %d with k_eff == S)\n", compared,
              coincide_cases, identity_cases);
  QVG_EXPECT(compared == int(cases.size()) && compared > 100 && coincide_cases >= 10 && identity_cases >= 10)
      << compared << coincide_cases << identity_cases;
}

// kmeans() with init kmeans++ starts from kmeanspp_init_indices' picks of its own
// centred points: its initial inertia (record_inertia) is that of those rows.
QVG_TEST(kmeans_starts_from_kmeanspp_init_indices) {
  int checked = 0;
  for (const int64_t S : {50, 300, 1000})
    for (const int k : {8, 64, 256}) {
      if (k >= S) continue;
      const int64_t D = 64;
      const std::vector<float> x = make_points(S, D, S, 1.0f, uint32_t(S + k));
      const std::vector<float> mu = cpu_mean(x, S, D);
      std::vector<float> xc(x.size());
      for (size_t e = 0; e < x.size(); ++e) xc[e] = x[e] - mu[e % size_t(D)];
      qvg::detail::KMeansParams p;
      p.k = k;
      p.iters = 1;
      p.init = qvg::Init::KMeansPlusPlus;
      p.seed = 77;
      p.stage = 1;
      p.b = 0;
      p.h = 3;
      p.record_inertia = true;
      const qvg::detail::KMeansResult km = qvg::detail::kmeans(x.data(), S, D, p);
      const std::vector<uint32_t> idx = qvg::detail::kmeanspp_init_indices(77, 1, 0, 3, xc.data(), S, D, k);
      std::vector<float> c(static_cast<size_t>(k * D));
      for (int j = 0; j < k; ++j) std::copy_n(xc.begin() + int64_t(idx[size_t(j)]) * D, D, c.begin() + j * D);
      QVG_EXPECT(!km.inertia.empty() && km.inertia[0] == qvg::inertia_fp64(xc.data(), S, c.data(), k, D))
          << "S" << S << "k" << k;
      ++checked;
    }
  QVG_EXPECT(checked == 7) << checked;
}

// The pruning test (kmeanspp_bound::may_skip) keeps a point only where the new pick's computed
// distance cannot be below its d2: on clustered sets, sets with duplicates, points
// on a line (where b = 2a and b - a = a occur in every round) and magnitudes whose
// squares leave the normal range, every skip is audited against the distance it
// avoided (none changes d2), and most distances are skipped on clustered data.
// Planted: the test without its factor 4 (cc >= d2) or a factor 3.9 makes wrong
// skips and other picks.
QVG_TEST(kmeanspp_pruning_skips_only_unchanged_points) {
  std::mt19937 rng(41);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  struct Set {
    std::vector<float> r;
    int64_t S, D;
    int k;
  };
  std::vector<Set> sets;
  uint32_t seed = 500;
  for (const float scale : {1e-19f, 1e-3f, 1.0f, 1e4f, 1e15f})
    for (const int64_t D : {8, 64, 128}) sets.push_back({make_points(600, D, 600, scale, seed++), 600, D, 64});
  sets.push_back({make_points(800, 64, 40, 1.0f, seed++), 800, 64, 64});  // duplicates: d2 = 0 and the total-0 branch
  for (int line = 0; line < 6; ++line) {  // points on a line: position t_i along v, some on a coarse grid
    const int64_t S = 400, D = 64;
    std::vector<float> v(static_cast<size_t>(D)), r(static_cast<size_t>(S * D));
    for (float& x : v) x = n01(rng);
    for (int64_t i = 0; i < S; ++i) {
      const float t = line % 2 ? float(int(rng() % 64)) * 0.25f : n01(rng) * 10.0f;
      for (int64_t d = 0; d < D; ++d) r[size_t(i * D + d)] = t * v[size_t(d)] + 1.0f;
    }
    sets.push_back({r, S, D, 32});
  }
  int64_t skipped = 0, evaluated = 0, clustered_skipped = 0, clustered_all = 0;
  int planted_wrong[2] = {0, 0}, planted_differ[2] = {0, 0};
  for (size_t si = 0; si < sets.size(); ++si) {
    const Set& st = sets[si];
    const std::vector<float> mu = cpu_mean(st.r, st.S, st.D);
    std::vector<uint32_t> ref(size_t(st.k)), got(size_t(st.k));
    K::KppHostRun none;
    none.may_skip = [](float, float, double) { return false; };
    K::kmeanspp_picks_host(st.r.data(), mu.data(), st.S, st.D, st.k, 9, 0, 0, int64_t(si), ref.data(), none);
    K::KppHostRun run;
    run.audit = true;
    K::kmeanspp_picks_host(st.r.data(), mu.data(), st.S, st.D, st.k, 9, 0, 0, int64_t(si), got.data(), run);
    QVG_EXPECT(run.wrong_skips == 0 && got == ref) << "set" << si << "wrong skips" << run.wrong_skips;
    skipped += run.skipped;
    evaluated += run.evaluated;
    if (si < 15 && si % 3 != 0) {  // clustered, D = 64 and 128
      clustered_skipped += run.skipped;
      clustered_all += run.skipped + run.evaluated;
    }
    const std::pair<int, bool (*)(float, float, double)> plants[] = {
        {0, [](float cc, float d2, double) { return d2 == 0.0f || (d2 <= FLT_MAX && cc <= FLT_MAX && cc >= d2); }},
        {1,
         [](float cc, float d2, double) { return d2 == 0.0f || (d2 <= FLT_MAX && cc <= FLT_MAX && cc >= 3.9f * d2); }}};
    for (const auto& [p, fn] : plants) {
      K::KppHostRun bad;
      bad.may_skip = fn;
      bad.audit = true;
      std::vector<uint32_t> wrong(size_t(st.k));
      K::kmeanspp_picks_host(st.r.data(), mu.data(), st.S, st.D, st.k, 9, 0, 0, int64_t(si), wrong.data(), bad);
      planted_wrong[p] += bad.wrong_skips > 0;
      planted_differ[p] += wrong != ref;
    }
  }
  const double frac = double(clustered_skipped) / double(clustered_all);
  std::printf(
      "  %zu point sets: %lld distances skipped, %lld computed, none wrong (clustered D >= 64: %.1f %% skipped); "
      "planted cc >= d2: %d sets with wrong skips, %d with other picks; cc >= 3.9 d2: %d, %d\n",
      sets.size(), (long long)skipped, (long long)evaluated, 100.0 * frac, planted_wrong[0], planted_differ[0],
      planted_wrong[1], planted_differ[1]);
  QVG_EXPECT(frac > 0.5) << "the pruning skipped only" << frac << "of the clustered sets' distances";
  QVG_EXPECT(planted_wrong[0] >= 10 && planted_differ[0] >= 5 && planted_wrong[1] >= 3)
      << planted_wrong[0] << planted_differ[0] << planted_wrong[1] << planted_differ[1];
}

// kmeanspp_bound::may_skip's edges: d2 = 0 is always kept; d2 or cc +inf or NaN never; the
// margin: cc = 4 d2 exactly, or within 2^-10 above it, is not enough, 2^-9 above is;
// skip_factor's eps grows with D past 2^-10 (D > 32,720) and stays above 2 gamma.
QVG_TEST(kmeanspp_may_skip_edges) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const double f = B::skip_factor(128);
  QVG_EXPECT(f == 4.0 * (1.0 + 0x1p-10) && B::skip_factor(32720) == f && B::skip_factor(32800) > f);
  for (const int64_t D : {1, 128, 4096, 32800, 60000, 1000000}) {
    const double gamma = double(D / 8 + 5) * 0x1p-24;
    QVG_EXPECT(B::skip_factor(D) >= 4.0 * (1.0 + 2.0 * gamma)) << D;
  }
  QVG_EXPECT(B::may_skip(0.0f, 0.0f, f) && B::may_skip(nan, 0.0f, f) && B::may_skip(inf, 0.0f, f));
  QVG_EXPECT(!B::may_skip(inf, inf, f) && !B::may_skip(1.0f, inf, f) && !B::may_skip(1e30f, nan, f));
  QVG_EXPECT(!B::may_skip(inf, 1.0f, f) && !B::may_skip(nan, 1.0f, f));
  int checked = 0;
  for (const float d2 : {1e-44f, 1e-30f, 1e-3f, 1.0f, 7.0f, 1e30f}) {
    const float c4 = 4.0f * d2;
    QVG_EXPECT(!B::may_skip(c4, d2, f) && !B::may_skip(c4 * (1.0f + 0x1p-11f), d2, f)) << d2;
    if (d2 > 1e-30f) {
      QVG_EXPECT(B::may_skip(c4 * (1.0f + 0x1p-9f), d2, f)) << d2;
    }
    ++checked;
  }
  QVG_EXPECT(checked == 6);
}

// The total-0 branch's point from the list of picks (kpp_unchosen_index, the
// iteration x <- r + #{picks <= x}) is the r-th unchosen point of a walk over
// chosen flags, on 3,000 pick sets (sizes 1 to 255 of S up to 600, every r).
QVG_TEST(kmeanspp_unchosen_index_is_the_walk_over_chosen_flags) {
  std::mt19937 rng(43);
  int checked = 0;
  for (int rep = 0; rep < 3000; ++rep) {
    const int64_t S = 2 + int64_t(rng() % 600);
    const int count = 1 + int(rng() % uint32_t(std::min<int64_t>(S - 1, 255)));
    std::vector<uint32_t> all(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) all[size_t(i)] = uint32_t(i);
    if (rep % 3 != 0) std::shuffle(all.begin(), all.end(), rng);  // else a run of picks from point 0
    std::vector<uint32_t> picks(all.begin(), all.begin() + count);
    std::vector<uint8_t> chosen(static_cast<size_t>(S), 0);
    for (const uint32_t p : picks) chosen[p] = 1;
    const uint64_t r = rng() % uint64_t(S - count);
    int64_t walk = -1;
    for (int64_t i = 0, left = int64_t(r); i < S; ++i)
      if (!chosen[size_t(i)] && left-- == 0) {
        walk = i;
        break;
      }
    const int64_t got = K::kpp_unchosen_index(r, [&](uint64_t x) {
      uint32_t c = 0;
      for (int first = 0; first < 3; ++first) c += K::kpp_count_le(picks.data(), count, first, 3, x);  // strided
      return uint64_t(c);
    });
    QVG_EXPECT(got == walk) << "S" << S << "count" << count << "r" << r << got << walk;
    ++checked;
  }
  QVG_EXPECT(checked == 3000);
}

// Spec 1.1's exact sums for span breaks (exact_sum::energy_of on the host): a
// partition of the terms over threads — 256 threads striding over the values, each
// adding its fixed-point terms, the warps combining by xor shuffles, the warps' sums
// added by atomics in whatever order they arrive (here shuffled) — gives the
// rule's bits on 120 value sets: sizes 1-5000, magnitudes 1e-20 to 1e16, all zeros,
// all equal, a single non-zero value, fp32 subnormals. The value is within the rule's
// rounding of the fp64 sum.
QVG_TEST(exact_energy_is_the_same_in_any_order_and_partition) {
  namespace X = qvg::exact_sum;
  const auto dbits = [](double d) {
    uint64_t b;
    std::memcpy(&b, &d, 8);
    return b;
  };
  std::mt19937 rng(29);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  int checked = 0;
  for (int rep = 0; rep < 120; ++rep) {
    const int64_t n = std::vector<int64_t>{1, 2, 31, 32, 33, 255, 256, 1000, 5000}[size_t(rep % 9)];
    const float scale = std::vector<float>{1e-20f, 1e-3f, 1.0f, 3e5f, 1e16f}[size_t(rep % 5)];
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = n01(rng) * scale;
    if (rep % 11 == 0) std::fill(v.begin(), v.end(), 0.0f);
    if (rep % 13 == 1) std::fill(v.begin(), v.end(), scale);
    if (rep % 17 == 2) {
      std::fill(v.begin(), v.end(), 0.0f);
      v[size_t(rng() % uint64_t(n))] = scale;
    }
    if (rep % 19 == 3)
      for (float& x : v) x = 1e-42f * float(rng() % 5);
    const double rule = X::energy_of([&v](int64_t i) { return v[size_t(i)]; }, n);
    // The kernel's partition.
    double m = 0;
    for (const float x : v) m = std::max(m, double(x) * double(x));
    uint64_t q = 0;
    if (m > 0) {
      const int e = X::fixed_exponent(m, n);
      constexpr int kThreads = 256;
      std::vector<uint64_t> thread_sum(kThreads, 0);
      for (int t = 0; t < kThreads; ++t)
        for (int64_t i = t; i < n; i += kThreads)
          thread_sum[size_t(t)] += X::fixed_term(double(v[size_t(i)]) * double(v[size_t(i)]), e);
      std::vector<uint64_t> warp_sum;
      for (int w = 0; w < kThreads / 32; ++w) {
        uint64_t lanes[32];
        std::copy_n(thread_sum.begin() + 32 * w, 32, lanes);
        for (int o = 16; o > 0; o >>= 1) {
          uint64_t next[32];
          for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
          std::copy_n(next, 32, lanes);
        }
        warp_sum.push_back(lanes[0]);
      }
      std::shuffle(warp_sum.begin(), warp_sum.end(), rng);
      for (const uint64_t s : warp_sum) q += s;
      QVG_EXPECT(dbits(X::fixed_value(q, e)) == dbits(rule)) << "rep" << rep << "n" << n;
      // Any order of the terms: the same integer.
      std::vector<float> p = v;
      std::shuffle(p.begin(), p.end(), rng);
      QVG_EXPECT(dbits(X::energy_of([&p](int64_t i) { return p[size_t(i)]; }, n)) == dbits(rule))
          << "rep" << rep << "shuffled";
      double naive = 0;
      for (const float x : v) naive += double(x) * double(x);
      const double bound = double(n) * std::ldexp(0.5, -e) + naive * double(n + 2) * 0x1p-52;  // + the fp64 sum's error
      QVG_EXPECT(std::fabs(rule - naive) <= bound) << "rep" << rep << "rule" << rule << "naive" << naive;
    } else {
      QVG_EXPECT(rule == 0.0) << "rep" << rep << "all zero";
    }
    ++checked;
  }
  QVG_EXPECT(checked == 120) << checked;
}

// The energy kernels' partition (span_bodies.cuh, "the residual energy across the
// device"): G x energy_blocks(S) blocks of kEnergyTokens tokens, each thread of a block
// taking elements tid, tid + nthreads, ... (energy_squares); the blocks' maxima, then
// their sums of terms, combined in any order (here shuffled), give group_energy's bits
// (the sequential rule over residual_at) for every group. Shapes with S below, at and
// past multiples of kEnergyTokens, D = 8..128 (not a power of two too), B > 1 and H > 1
// in the [B, S, H, D] layout, 256, 64 and 7 threads per block, with and without a
// stored centroid subtracted (the last stage's residual), all-zero groups. Every
// element is visited exactly once: the squares visited are the group's squares as a
// multiset (the values are distinct), so a block or thread that skipped or repeated
// an element fails it.
QVG_TEST(energy_blocks_equal_group_energy) {
  const auto dbits = [](double d) {
    uint64_t b;
    std::memcpy(&b, &d, 8);
    return b;
  };
  struct Case {
    int64_t B, S, H, D;
  };
  std::mt19937 rng(43);
  int checked = 0;
  for (const Case c : {Case{1, 1, 1, 8}, Case{1, 31, 2, 16}, Case{2, 33, 3, 40}, Case{1, 100, 2, 128},
                       Case{1, 64, 1, 24}, Case{3, 65, 2, 8}})
    for (const int nthreads : {256, 64, 7})
      for (const bool with_stored : {false, true}) {
        const int64_t G = c.B * c.H, S = c.S, D = c.D, Kc = 5;
        std::vector<float> x(size_t(G * S * D));  // [B, S, H, D], distinct magnitudes
        for (size_t e = 0; e < x.size(); ++e)
          x[e] = (rng() % 2 ? 1.0f : -1.0f) * std::ldexp(1.0f + float(e) * 0x1p-20f, int(rng() % 9) - 4);
        const int64_t zero_g = G > 1 ? G - 1 : -1;  // an all-zero group
        std::vector<float> stored(size_t(G * Kc * D), 0.0f);
        std::vector<uint8_t> ids(size_t(G * S), 0);
        if (with_stored) {
          for (float& v : stored) v = float(rng() % 64) * 0.25f;
          for (uint8_t& id : ids) id = uint8_t(rng() % Kc);
        }
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.H; ++h) {
            const int64_t g = b * c.H + h;
            if (g != zero_g) continue;
            for (int64_t t = 0; t < S; ++t)
              for (int64_t d = 0; d < D; ++d)  // x = the stored centroid: a zero residual
                x[size_t(((b * S + t) * c.H + h) * D + d)] = stored[size_t((g * Kc + ids[size_t(g * S + t)]) * D + d)];
          }
        K::QuantizeArgs a;
        a.r = K::input_points(x.data(), A::kF32, c.H, S, D);
        a.stored = with_stored ? stored.data() : nullptr;
        a.ids = with_stored ? ids.data() : nullptr;
        a.G = G;
        a.S = S;
        a.D = D;
        a.K = int(Kc);
        const int64_t bpg = K::energy_blocks(S);
        for (int64_t g = 0; g < G; ++g) {
          std::vector<double> seen, want;
          for (int64_t i = 0; i < S * D; ++i) {
            const double v = double(K::residual_at(a, g * S + i / D, i % D));
            want.push_back(v * v);
          }
          double m = 0;
          std::vector<uint64_t> block_max, block_sum;
          for (int64_t blk = 0; blk < bpg; ++blk) {
            double bm = 0;
            for (int tid = 0; tid < nthreads; ++tid) {
              K::energy_squares(a, g, blk, tid, nthreads, [&seen](double q) { seen.push_back(q); });
              const double tm = K::energy_thread_max(a, g, blk, tid, nthreads);
              bm = tm > bm ? tm : bm;
            }
            block_max.push_back(dbits(bm));
          }
          std::shuffle(block_max.begin(), block_max.end(), rng);
          for (const uint64_t bm : block_max) m = std::max(m, std::bit_cast<double>(bm));
          uint64_t q = 0;
          if (m > 0) {
            const int e = K::energy_exponent(a, m);
            for (int64_t blk = 0; blk < bpg; ++blk) {
              uint64_t bs = 0;
              for (int tid = 0; tid < nthreads; ++tid) bs += K::energy_thread_sum(a, g, blk, tid, nthreads, e);
              block_sum.push_back(bs);
            }
            std::shuffle(block_sum.begin(), block_sum.end(), rng);
            for (const uint64_t bs : block_sum) q += bs;
          }
          std::sort(seen.begin(), seen.end());
          std::sort(want.begin(), want.end());
          const double got = K::energy_value(a, m, q), rule = K::group_energy(a, g);
          QVG_EXPECT(seen == want && dbits(got) == dbits(rule))
              << "B" << c.B << "S" << S << "H" << c.H << "D" << D << "threads" << nthreads << "stored" << with_stored
              << "g" << g << "visited" << seen.size() << "of" << want.size() << got << rule;
          QVG_EXPECT((g == zero_g) == (rule == 0.0)) << "zero group" << g << rule;
          ++checked;
        }
      }
  QVG_EXPECT(checked == 108) << checked;
}
