// The statistics model of the synthetic generator (src/workload/generator_model.h):
// per (layer, head) projections, channel profiles, gains and token norms fitted on a
// calibration sample so that the workload.md estimators hit the preset's targets.
#include <algorithm>
#include <array>
#include <cmath>

#include <omp.h>

#include "qvg/numeric.h"
#include "workload/generator_model.h"

namespace qvg::workload_detail {
namespace {

double quantile(std::vector<double> v, double q) {  // nearest rank
  if (v.empty()) return 0;
  const double pos = std::ceil(q * double(v.size())) - 1;
  const auto k = std::ptrdiff_t(std::clamp(pos, 0.0, double(v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[size_t(k)];
}
double median_of(std::vector<double> v) {
  return quantile(std::move(v), 0.5);
}

/// A per-channel target profile of median |x|, normalised to median 1.
struct Profile {
  std::vector<double> c;   ///< [D]
  std::vector<bool> wall;  ///< [D]: a wall channel
};

/// Channel profile with max/median exactly `ratio`. walls > 0: that many wall
/// channels (at random positions within the first `wall_span` channels) between
/// ratio/2 and ratio, the others lognormal with a mild spread (capped below the
/// walls). walls == 0: a smooth lognormal profile stretched to the ratio.
Profile channel_profile(Rng& r, int64_t D, double ratio, int walls, int64_t wall_span) {
  Profile p;
  p.c.resize(size_t(D));
  p.wall.assign(size_t(D), false);
  for (auto& x : p.c) x = std::exp(0.2 * r.normal());
  const double med = median_of(p.c);
  if (walls <= 0) {
    std::vector<double> lg(p.c.size());
    for (size_t i = 0; i < p.c.size(); ++i) lg[i] = std::log(p.c[i] / med);
    const double mx = *std::max_element(lg.begin(), lg.end()), md = median_of(lg);
    const double a = mx > md ? std::log(ratio) / (mx - md) : 0.0;
    for (size_t i = 0; i < p.c.size(); ++i) p.c[i] = std::exp(a * (lg[i] - md));
    return p;
  }
  const double cap = std::max(1.0, 0.45 * ratio);
  for (auto& x : p.c) x = std::min(x / med, cap);
  int placed = 0;
  while (placed < walls) {
    const int64_t pos = std::min<int64_t>(wall_span - 1, int64_t(r.uniform() * double(wall_span)));
    if (p.wall[size_t(pos)]) continue;
    p.wall[size_t(pos)] = true;
    p.c[size_t(pos)] = placed == 0 ? ratio : std::max(1.0, ratio * r.uniform(0.5, 0.95));
    ++placed;
  }
  // The walls sit above the median, so the median stays 1 up to the caps; renormalise.
  const double m2 = median_of(p.c);
  for (auto& x : p.c) x /= m2;
  return p;
}

/// Rows of `base` (n x D) after gains g, unit normalisation and the token norms
/// exp(sigma * u_i) (no overall scale).
std::vector<float> shaped_rows(const std::vector<float>& base, const std::vector<float>& g,
                               const std::vector<double>& u, float sigma, int64_t D) {
  std::vector<float> rows = base;
  for (size_t i = 0; i < u.size(); ++i) {
    float* row = rows.data() + i * size_t(D);
    gain_normalize(row, g.data(), D);
    const float f = std::exp(sigma * float(u[i]));
    for (int64_t d = 0; d < D; ++d) row[d] *= f;
  }
  return rows;
}

/// Per-channel median |x| of n x D rows.
std::vector<double> channel_medians(const std::vector<float>& rows, size_t n, int64_t D) {
  std::vector<double> med(static_cast<size_t>(D)), col(n);
  for (int64_t d = 0; d < D; ++d) {
    for (size_t i = 0; i < n; ++i) col[i] = std::fabs(rows[i * size_t(D) + size_t(d)]);
    med[size_t(d)] = median_of(col);
  }
  return med;
}

/// Gains g such that the per-channel median |x| of shaped_rows follows the profile
/// (up to one overall factor). Rows are normalised after the gains, so this is a
/// fixed point; a few rounds bring the profile within a percent.
std::vector<float> fit_gains(const std::vector<float>& base, const Profile& prof, const std::vector<double>& u,
                             float sigma, int64_t D) {
  std::vector<float> g(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) g[size_t(d)] = float(prof.c[size_t(d)]);
  for (int it = 0; it < 4; ++it) {
    const std::vector<double> med = channel_medians(shaped_rows(base, g, u, sigma, D), u.size(), D);
    const double mm = std::max(median_of(med), 1e-30);
    for (int64_t d = 0; d < D; ++d)
      g[size_t(d)] = float(double(g[size_t(d)]) * prof.c[size_t(d)] / std::max(med[size_t(d)] / mm, 1e-12));
  }
  return g;
}

/// The calibration sample: tokens of four frames spread over the first ~140.
struct Sample {
  std::vector<int64_t> t;
  std::vector<int> y, x;
  std::vector<float> z;  // [n][kLatent]
};
Sample calibration_sample(const ModelPreset& preset, const Scene& scene) {
  Sample s;
  const std::array<int64_t, 4> frames{0, 29, 71, 137};
  const int64_t tpf = preset.tokens_per_frame();
  const int64_t per_frame = std::max<int64_t>(1, kCalibTokens / int64_t(frames.size()));
  const int64_t step = std::max<int64_t>(1, tpf / per_frame);
  for (int64_t t : frames) {
    const auto fs = scene.frame_state(t);
    for (int64_t i = (t * 7) % step; i < tpf; i += step) {
      const int y = int(i / preset.grid_w), x = int(i % preset.grid_w);
      s.t.push_back(t);
      s.y.push_back(y);
      s.x.push_back(x);
      s.z.resize(s.z.size() + kLatent);
      scene.latent(fs, t, y, x, s.z.data() + s.z.size() - kLatent);
    }
  }
  return s;
}

}  // namespace

std::unique_ptr<LayerParams> calibrate_layer(const ModelPreset& preset, const WorkloadOptions& opts, const Scene& scene,
                                             int l) {
  const int64_t D = preset.head_dim;
  const Sample smp = calibration_sample(preset, scene);
  const size_t n = smp.t.size();
  auto lp = std::make_unique<LayerParams>();
  lp->heads.resize(size_t(preset.heads));
  const int nthreads = resolve_threads(opts.threads);
  // Heads are independent (each has its own random stream): calibrate them in parallel.
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int h = 0; h < preset.heads; ++h) {
    HeadParams& hp = lp->heads[size_t(h)];
    Rng r(hash_of(opts.seed, kLayer, l, h));
    const double wscale = 1.0 / std::sqrt(double(kLatent));
    auto rand_matrix = [&](std::vector<float>& w) {
      w.resize(size_t(kLatent * D));
      for (auto& x : w) x = float(wscale * r.normal());
    };
    rand_matrix(hp.wk);
    rand_matrix(hp.wv);
    // Q shares most of K's projection so that q.k follows content similarity.
    rand_matrix(hp.wq);
    for (size_t i = 0; i < hp.wq.size(); ++i) hp.wq[i] = 0.8f * hp.wk[i] + 0.6f * hp.wq[i];
    // K walls sit in the rotary channels (or anywhere when there is no RoPE).
    const int walls = std::max(2, int(D / 32));
    const int64_t wall_span = preset.rope_dims > 0 ? preset.rope_dims : D;
    const Profile ck = channel_profile(r, D, preset.k_wall_ratio, walls, wall_span);
    const Profile cv = channel_profile(r, D, preset.v_wall_ratio, 0, D);
    hp.mu_k.resize(size_t(D));
    hp.mu_v.resize(size_t(D));
    for (int64_t d = 0; d < D; ++d) {
      // Wall channels carry a consistent sign (a large mean); others a small one.
      const double sign = r.uniform() < 0.5 ? -1.0 : 1.0;
      hp.mu_k[size_t(d)] = float(ck.wall[size_t(d)] ? sign * 2.5 : 0.3 * r.normal());
      hp.mu_v[size_t(d)] = float(0.7 * r.normal());
    }
    for (auto& x : hp.nk_dir) x = float(r.normal());
    for (auto& x : hp.nv_dir) x = float(r.normal());

    // Base rows of the sample, exactly as generate() computes them.
    std::vector<float> bk(n * size_t(D)), bq(n * size_t(D)), bv(n * size_t(D));
    std::vector<double> sk(n), sv(n);
    for (size_t i = 0; i < n; ++i) {
      const float* z = smp.z.data() + i * kLatent;
      const int64_t t = smp.t[i];
      const int y = smp.y[i], x = smp.x[i];
      project(hp.wk.data(), z, hp.mu_k.data(), kKNoise, hash_of(opts.seed, kKEps, l, h, t, y, x), D,
              bk.data() + i * size_t(D));
      project(hp.wq.data(), z, hp.mu_k.data(), kQNoise, hash_of(opts.seed, kQEps, l, h, t, y, x), D,
              bq.data() + i * size_t(D));
      project(hp.wv.data(), z, hp.mu_v.data(), kVNoise, hash_of(opts.seed, kVEps, l, h, t, y, x), D,
              bv.data() + i * size_t(D));
      sk[i] = dot_latent(hp.nk_dir, z);
      sv[i] = dot_latent(hp.nv_dir, z);
    }
    // Standardise the smooth norm fields on the sample; u = a * field + b * iid.
    auto standardize = [&](const std::vector<double>& s, float& mean, float& sd) {
      double m = 0, q = 0;
      for (double x : s) m += x;
      m /= double(n);
      for (double x : s) q += (x - m) * (x - m);
      sd = float(std::sqrt(std::max(q / double(n), 1e-12)));
      mean = float(m);
    };
    standardize(sk, hp.nk_mean, hp.nk_std);
    standardize(sv, hp.nv_mean, hp.nv_std);
    const double a = kNormSmooth, b = std::sqrt(1 - a * a);
    std::vector<double> uk(n), uv(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = smp.t[i];
      const int y = smp.y[i], x = smp.x[i];
      uk[i] = a * (sk[i] - hp.nk_mean) / hp.nk_std + b * normal_from_bits(hash_of(opts.seed, kKNormEps, l, h, t, y, x));
      uv[i] = a * (sv[i] - hp.nv_mean) / hp.nv_std + b * normal_from_bits(hash_of(opts.seed, kVNormEps, l, h, t, y, x));
    }
    // Token-norm spreads: a token's norm is exactly N * exp(sigma * u).
    auto sigma_for = [&](const std::vector<double>& u, double spread) {
      const double w = quantile(u, 0.99) - quantile(u, 0.01);
      return float(w > 0 ? std::log(spread) / w : 0.0);
    };
    hp.sigma_k = sigma_for(uk, preset.k_norm_spread);
    hp.sigma_v = sigma_for(uv, preset.v_norm_spread);

    // Channel profiles, then magnitudes.
    hp.gk = fit_gains(bk, ck, uk, hp.sigma_k, D);
    const std::vector<float> kr = shaped_rows(bk, hp.gk, uk, hp.sigma_k, D);
    hp.norm_k = float(preset.k_channel_median / std::max(median_of(channel_medians(kr, n, D)), 1e-30));
    hp.gv = fit_gains(bv, cv, uv, hp.sigma_v, D);
    {
      std::vector<double> e(n);
      for (size_t i = 0; i < n; ++i) e[i] = double(hp.sigma_v) * uv[i];
      hp.norm_v = float(preset.v_token_norm / std::exp(median_of(e)));
    }
    // Q: milder walls (square root of K's gains), unit norm times norm_q, chosen so
    // that the std over keys of q.k / sqrt(D) (before RoPE) is kLogitStd.
    hp.gq.resize(size_t(D));
    for (int64_t d = 0; d < D; ++d) hp.gq[size_t(d)] = std::sqrt(hp.gk[size_t(d)]);
    {
      std::vector<float> qr = bq;
      for (size_t i = 0; i < n; ++i) gain_normalize(qr.data() + i * size_t(D), hp.gq.data(), D);
      double acc = 0;
      int cnt = 0;
      const size_t qstep = std::max<size_t>(1, n / 32);
      for (size_t qi = 0; qi < n; qi += qstep) {
        double m = 0, m2 = 0;
        for (size_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += double(qr[qi * size_t(D) + size_t(d)]) * kr[j * size_t(D) + size_t(d)];
          s *= double(hp.norm_k) / std::sqrt(double(D));
          m += s;
          m2 += s * s;
        }
        m /= double(n);
        acc += std::sqrt(std::max(m2 / double(n) - m * m, 0.0));
        ++cnt;
      }
      const double sd = acc / cnt;
      hp.norm_q = float(sd > 0 ? kLogitStd / sd : 1.0);
    }
  }
  return lp;
}

}  // namespace qvg::workload_detail
