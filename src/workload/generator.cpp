// The synthetic K/V/Q generator (include/qvg/workload.h).
//
// Pipeline for one token (frame t, row y, column x) of one layer:
//  1. Scene latent z (kLatent dims, shared by all layers): the camera-shifted world
//     position picks a region (argmax of smooth fields) whose prototype is added to a
//     smooth texture; moving soft-edged objects overwrite it with their own prototype
//     and texture; a little per-frame iid noise is added.
//  2. Per head: base = W^T z + mu + sigma * eps (eps iid per element), then per-channel
//     gains g give the channel profile (K: walls; V: mild), the row is normalised to
//     unit L2 norm and multiplied by its token norm N * exp(sigma_n * u), where u mixes
//     a smooth field of z and iid noise. Gains, sigma_n and N are fitted per (layer,
//     head) on a calibration sample so that the workload.md estimators hit the
//     preset's targets. V tokens drawn as outliers get v_outlier_norm times the median
//     norm; in the last k_cluster_layers layers the tokens of object 0 get
//     k_cluster_norm times their K norm.
//  3. K and Q get 3D RoPE (Wan's split: time, height, width sections of rope_dims,
//     interleaved channel pairs) at (frame, row, column).
// Every random number is a hash of (seed, stream, coordinates), so any part can be
// generated alone, in any order, on any number of threads, with identical bytes.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>

#include <fmt/core.h>
#include <omp.h>

#include "core/rng_impl.h"
#include "qvg/error.h"
#include "qvg/numeric.h"
#include "qvg/workload.h"

namespace qvg {
namespace {

constexpr int kLatent = 24;            // dimensions of the scene latent z
constexpr int kRegions = 6;            // background regions
constexpr int kRegionWaves = 3;        // smooth waves per region field
constexpr int kTexture = 10;           // texture waves of the background
constexpr int kObjects = 5;            // moving objects
constexpr int kObjTexture = 2;         // texture waves per object
constexpr float kLatentNoise = 0.15f;  // per-frame iid noise of z (per dim)
// Relative iid element noise of the projections (the part no codebook can learn).
constexpr float kKNoise = 0.22f;
constexpr float kQNoise = 0.50f;
constexpr float kVNoise = 0.9f;
constexpr float kNormSmooth = 0.75f;  // share of the smooth field in the token-norm variable u
constexpr double kLogitStd = 2.5;     // target std over keys of q.k / sqrt(D) (pre-RoPE)
constexpr int kCalibTokens = 768;

// ---- counter-based random numbers (SplitMix64: core/rng_impl.h) -------------------
using rng_impl::mix64;
using rng_impl::splitmix64;
/// h combined with v (boost-style hash_combine), then mixed.
inline uint64_t hash_mix(uint64_t h, uint64_t v) {
  return mix64(h ^ (v + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2)));
}
/// A 64-bit hash of (seed, vs...): the mixed seed combined with each value in turn.
template <typename... Ts>
uint64_t hash_of(uint64_t seed, Ts... vs) {
  uint64_t h = mix64(seed);
  ((h = hash_mix(h, uint64_t(vs))), ...);
  return h;
}
/// Approximately standard normal from 64 random bits (Irwin-Hall of four 16-bit
/// uniforms, rescaled): mean 0, variance 1, tails bounded at +-3.46.
inline float normal_from_bits(uint64_t r) {
  const float s = float(r & 0xFFFF) + float((r >> 16) & 0xFFFF) + float((r >> 32) & 0xFFFF) + float(r >> 48);
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}
inline float uniform_from_bits(uint64_t r) {
  return float(r >> 40) * (1.0f / 16777216.0f);
}

/// Sequential generator for setup-time parameters (independent of <random>'s
/// implementation-defined distributions).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  double uniform() { return double(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// Stream tags of the hashes.
enum Stream : uint64_t { kScene = 1, kZNoise, kKEps, kQEps, kVEps, kKNormEps, kVNormEps, kOutlier, kLayer };

// ---- the scene ---------------------------------------------------------------------
struct Wave {
  double kx = 0, ky = 0, phase = 0, omega = 0;  // cos(kx u + ky v + phase + omega t)
};

struct Object {
  double cx0 = 0, cy0 = 0;  // screen position at frame 0 (patches)
  double vx = 0, vy = 0;    // patches per frame
  double ax = 1, ay = 1;    // semi-axes (patches)
  std::array<float, kLatent> proto{};
  std::array<Wave, kObjTexture> tex{};
  std::array<float, kLatent * kObjTexture> tex_mix{};
};

struct Scene {
  int gh = 0, gw = 0;             // the generated grid
  double fy = 1, fx = 1;          // full-size patches per generated patch (1 / sqrt(scale))
  double full_h = 0, full_w = 0;  // the full-size grid the scene is laid out on
  std::array<std::array<Wave, kRegionWaves>, kRegions> region_field{};
  std::array<float, kRegions> region_bias{};
  std::array<float, kRegions * kLatent> region_proto{};
  std::array<Wave, kTexture> texture{};
  std::array<float, kLatent * kTexture> texture_mix{};  // [kLatent][kTexture]
  std::array<Object, kObjects> objects{};
  double cam_vx = 0, cam_vy = 0, cam_ax = 0, cam_ay = 0, cam_px = 1, cam_py = 1;
  uint64_t seed = 0;

  Wave random_wave(Rng& r, double lambda_lo, double lambda_hi, double omega) const {
    Wave w;
    const double lambda = std::exp(r.uniform(std::log(lambda_lo), std::log(lambda_hi)));
    const double ang = r.uniform(0, 6.283185307179586);
    w.kx = 6.283185307179586 / lambda * std::cos(ang);
    w.ky = 6.283185307179586 / lambda * std::sin(ang);
    w.phase = r.uniform(0, 6.283185307179586);
    w.omega = r.uniform(-omega, omega);
    return w;
  }

  /// The scene is laid out in patches of the full-size frame (full_h x full_w), so a
  /// scaled-down frame shows the same content at a coarser patch grid.
  Scene(uint64_t seed_, int gh_, int gw_, double full_h_, double full_w_)
      : gh(gh_), gw(gw_), fy(full_h_ / gh_), fx(full_w_ / gw_), full_h(full_h_), full_w(full_w_), seed(seed_) {
    Rng r(hash_of(seed, kScene));
    // Regions a little smaller than the frame, so that every frame shows several.
    for (int k = 0; k < kRegions; ++k) {
      for (auto& w : region_field[size_t(k)]) w = random_wave(r, 0.4 * full_w, 1.2 * full_w, 0.0);
      region_bias[size_t(k)] = float(r.uniform(-0.3, 0.3));
      for (int i = 0; i < kLatent; ++i) region_proto[size_t(k * kLatent + i)] = float(1.2 * r.normal());
    }
    for (auto& w : texture) w = random_wave(r, 5, 25, 0.03);
    for (auto& m : texture_mix) m = float(0.5 * r.normal() / std::sqrt(double(kTexture) / 2));
    for (auto& o : objects) {
      o.cx0 = r.uniform(0, full_w);
      o.cy0 = r.uniform(0, full_h);
      const double speed = r.uniform(0.15, 0.5), dir = r.uniform(0, 6.283185307179586);
      o.vx = speed * std::cos(dir);
      o.vy = 0.5 * speed * std::sin(dir);
      o.ax = std::max(1.5, r.uniform(0.08, 0.2) * full_w);
      o.ay = std::max(1.5, r.uniform(0.1, 0.25) * full_h);
      for (auto& p : o.proto) p = float(1.3 * r.normal());
      for (auto& w : o.tex) w = random_wave(r, 3, 10, 0.05);
      for (auto& m : o.tex_mix) m = float(0.35 * r.normal());
    }
    const double cam_speed = r.uniform(0.15, 0.35), cam_dir = r.uniform(0, 6.283185307179586);
    cam_vx = cam_speed * std::cos(cam_dir);
    cam_vy = 0.4 * cam_speed * std::sin(cam_dir);
    cam_ax = r.uniform(2, 6);
    cam_ay = r.uniform(1, 3);
    cam_px = r.uniform(60, 140);
    cam_py = r.uniform(50, 120);
  }

  struct FrameState {
    double camx = 0, camy = 0;
    std::array<double, kObjects> ox{}, oy{};
  };
  FrameState frame_state(int64_t t) const {
    FrameState f;
    const double td = double(t);
    f.camx = cam_vx * td + cam_ax * std::sin(6.283185307179586 * td / cam_px);
    f.camy = cam_vy * td + cam_ay * std::sin(6.283185307179586 * td / cam_py);
    for (int i = 0; i < kObjects; ++i) {
      const Object& o = objects[size_t(i)];
      // Objects wrap around the frame, out of sight (margin = semi-axis + 1).
      const double mx = o.ax + 1, my = o.ay + 1, wx = full_w + 2 * mx, wy = full_h + 2 * my;
      double x = std::fmod(o.cx0 + o.vx * td + mx, wx);
      double y = std::fmod(o.cy0 + o.vy * td + my, wy);
      if (x < 0) x += wx;
      if (y < 0) y += wy;
      f.ox[size_t(i)] = x - mx;
      f.oy[size_t(i)] = y - my;
    }
    return f;
  }

  /// Latent z of token (t, y, x); returns the weight of object 0 at that token.
  float latent(const FrameState& fs, int64_t t, int y, int x, float* z) const {
    const double xf = (x + 0.5) * fx - 0.5, yf = (y + 0.5) * fy - 0.5;  // full-size patch coordinates
    const double u = xf + fs.camx, v = yf + fs.camy, td = double(t);
    int best = 0;
    double best_f = -1e300;
    for (int k = 0; k < kRegions; ++k) {
      double f = region_bias[size_t(k)];
      for (const Wave& w : region_field[size_t(k)]) f += std::cos(w.kx * u + w.ky * v + w.phase);
      if (f > best_f) best_f = f, best = k;
    }
    std::array<float, kTexture> tex;
    for (int m = 0; m < kTexture; ++m) {
      const Wave& w = texture[size_t(m)];
      tex[size_t(m)] = float(std::cos(w.kx * u + w.ky * v + w.phase + w.omega * td));
    }
    for (int i = 0; i < kLatent; ++i) {
      float acc = region_proto[size_t(best * kLatent + i)];
      for (int m = 0; m < kTexture; ++m) acc += texture_mix[size_t(i * kTexture + m)] * tex[size_t(m)];
      z[i] = acc;
    }
    float w0 = 0.0f;
    for (int oi = 0; oi < kObjects; ++oi) {  // painter's order: later objects on top
      const Object& o = objects[size_t(oi)];
      const double dx = xf - fs.ox[size_t(oi)], dy = yf - fs.oy[size_t(oi)];
      const double rho = std::sqrt((dx / o.ax) * (dx / o.ax) + (dy / o.ay) * (dy / o.ay));
      // Soft edge about 0.7 patch wide.
      const float w = float(std::clamp(0.5 + (1.0 - rho) * std::min(o.ax, o.ay) / 0.7, 0.0, 1.0));
      if (w <= 0.0f) continue;
      std::array<float, kObjTexture> ot;
      for (int m = 0; m < kObjTexture; ++m) {
        const Wave& wv = o.tex[size_t(m)];
        ot[size_t(m)] = float(std::cos(wv.kx * dx + wv.ky * dy + wv.phase + wv.omega * td));
      }
      for (int i = 0; i < kLatent; ++i) {
        float val = o.proto[size_t(i)];
        for (int m = 0; m < kObjTexture; ++m) val += o.tex_mix[size_t(i * kObjTexture + m)] * ot[size_t(m)];
        z[i] = (1.0f - w) * z[i] + w * val;
      }
      if (oi == 0)
        w0 = w;
      else
        w0 *= (1.0f - w);
    }
    uint64_t s = hash_of(seed, kZNoise, t, y, x);
    for (int i = 0; i < kLatent; ++i) z[i] += kLatentNoise * normal_from_bits(splitmix64(s));
    return w0;
  }
};

// ---- per-layer parameters --------------------------------------------------------
struct HeadParams {
  std::vector<float> wk, wq, wv;                  // [kLatent][D]
  std::vector<float> mu_k, mu_v;                  // [D]
  std::vector<float> gk, gq, gv;                  // per-channel gains [D]
  std::array<float, kLatent> nk_dir{}, nv_dir{};  // smooth norm field directions
  float nk_mean = 0, nk_std = 1, nv_mean = 0, nv_std = 1;
  float sigma_k = 0, sigma_v = 0;            // log-norm spread
  float norm_k = 1, norm_q = 1, norm_v = 1;  // token-norm scales
};
struct LayerParams {
  std::vector<HeadParams> heads;
};

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

/// out[d] = sum_i z[i] * w[i*D + d] + mu[d] + sigma * eps_d, where eps_d is an
/// approximately standard normal number (Irwin-Hall of four 16-bit uniforms from two
/// 32-bit hashes of (noise_seed, d)); every loop vectorises.
/// Built for AVX2 and the baseline target (chosen at load time); lane order does not
/// change any result, so every target gives the same bits.
__attribute__((target_clones("avx2", "default"))) void project(const float* w, const float* z, const float* mu,
                                                               float sigma, uint64_t noise_seed, int64_t D,
                                                               float* out) {
  std::memcpy(out, mu, size_t(D) * sizeof(float));
  for (int i = 0; i < kLatent; ++i) {
    const float zi = z[i];
    const float* wi = w + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] += zi * wi[d];
  }
  const uint32_t s0 = uint32_t(noise_seed), s1 = uint32_t(noise_seed >> 32);
  const float k = sigma * 1.7320508f / 65536.0f, c = sigma * 2.0f * 1.7320508f;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) {
    const uint32_t h1 = fmix32(s0 ^ (uint32_t(d) * 0x9E3779B9u));
    const uint32_t h2 = fmix32(s1 + (uint32_t(d) * 0x7FEB352Du) + 0x68E31DA4u);
    const float sum = float(h1 & 0xFFFFu) + float(h1 >> 16) + float(h2 & 0xFFFFu) + float(h2 >> 16);
    out[d] += sum * k - c;
  }
}

/// row <- g * row / ||g * row|| (unit norm; a zero row stays zero). The squared norm
/// is summed in 8 fixed lanes, then the lanes in order: deterministic and vectorisable.
__attribute__((target_clones("avx2", "default"))) void gain_normalize(float* row, const float* g, int64_t D) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
#pragma omp simd
    for (int j = 0; j < 8; ++j) {
      row[d + j] *= g[d + j];
      lanes[j] += row[d + j] * row[d + j];
    }
  }
  for (; d < D; ++d) {
    row[d] *= g[d];
    lanes[0] += row[d] * row[d];
  }
  float n2 = 0;
  for (float l : lanes) n2 += l;
  const float inv = n2 > 0 ? 1.0f / std::sqrt(n2) : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) row[i] *= inv;
}

float dot_latent(const std::array<float, kLatent>& a, const float* z) {
  float s = 0;
  for (int i = 0; i < kLatent; ++i) s += a[size_t(i)] * z[i];
  return s;
}

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

}  // namespace

// ---- Workload -------------------------------------------------------------------
struct Workload::Impl {
  ModelPreset preset;
  WorkloadOptions opts;
  Scene scene;
  mutable std::vector<std::unique_ptr<LayerParams>> layers;  // built once per layer, on first use
  std::unique_ptr<std::once_flag[]> once;
  // RoPE sections (in channel pairs) and per-pair inverse frequencies.
  int64_t pairs_t = 0, pairs_h = 0, pairs_w = 0;
  std::vector<double> inv_freq;  // [rope_dims / 2]

  Impl(const ModelPreset& p, const WorkloadOptions& o)
      : preset(p),
        opts(o),
        scene(o.seed, p.grid_h, p.grid_w, p.grid_h / std::sqrt(p.scale), p.grid_w / std::sqrt(p.scale)),
        layers(static_cast<size_t>(p.layers)),
        once(new std::once_flag[size_t(p.layers)]) {
    // Wan's split of the rotary channels: height and width get 2*(R/6) channels each,
    // time the rest; inside a section of ds channels pair j turns at theta^(-2j/ds).
    const int64_t R = p.rope_dims;
    pairs_h = pairs_w = R / 6;
    pairs_t = R / 2 - pairs_h - pairs_w;
    for (int64_t sec = 0; sec < 3; ++sec) {
      const int64_t np = sec == 0 ? pairs_t : (sec == 1 ? pairs_h : pairs_w);
      for (int64_t j = 0; j < np; ++j) inv_freq.push_back(std::pow(p.rope_theta, -2.0 * double(j) / double(2 * np)));
    }
  }

  const LayerParams& layer(int l) const {
    std::call_once(once[size_t(l)], [&] { layers[size_t(l)] = calibrate(l); });
    return *layers[size_t(l)];
  }

  /// The calibration sample: tokens of four frames spread over the first ~140.
  struct Sample {
    std::vector<int64_t> t;
    std::vector<int> y, x;
    std::vector<float> z;  // [n][kLatent]
  };
  Sample calibration_sample() const {
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

  std::unique_ptr<LayerParams> calibrate(int l) const {
    const int64_t D = preset.head_dim;
    const Sample smp = calibration_sample();
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
        uk[i] =
            a * (sk[i] - hp.nk_mean) / hp.nk_std + b * normal_from_bits(hash_of(opts.seed, kKNormEps, l, h, t, y, x));
        uv[i] =
            a * (sv[i] - hp.nv_mean) / hp.nv_std + b * normal_from_bits(hash_of(opts.seed, kVNormEps, l, h, t, y, x));
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
};

Workload::Workload(const ModelPreset& preset, const WorkloadOptions& options) {
  preset.validate();
  if (options.dtype != DType::BF16 && options.dtype != DType::F32 && options.dtype != DType::F16)
    throw InvalidArgument("workload dtype must be bf16, f16 or f32");
  check_threads("workload threads", options.threads);
  impl_ = std::make_unique<Impl>(preset.scaled(options.scale), options);
}
Workload::~Workload() = default;
Workload::Workload(Workload&&) noexcept = default;
Workload& Workload::operator=(Workload&&) noexcept = default;

const ModelPreset& Workload::preset() const {
  return impl_->preset;
}
const WorkloadOptions& Workload::options() const {
  return impl_->opts;
}

LayerChunk Workload::generate(int layer, int64_t chunk_index, GenerateParts parts) const {
  LayerChunk out;
  generate_into(layer, chunk_index, out, parts);
  return out;
}

void Workload::generate_into(int layer, int64_t chunk_index, LayerChunk& out, GenerateParts parts) const {
  const ChunkInfo c = chunk(chunk_index);
  generate_frames_into(layer, c.frame0, c.frames, out, parts);
  out.chunk = c;
}

LayerChunk Workload::generate_frames(int layer, int64_t frame0, int64_t frames, GenerateParts parts) const {
  LayerChunk out;
  generate_frames_into(layer, frame0, frames, out, parts);
  return out;
}

void Workload::generate_frames_into(int layer, int64_t frame0, int64_t frames, LayerChunk& out,
                                    GenerateParts parts) const {
  const Impl& im = *impl_;
  const ModelPreset& p = im.preset;
  if (layer < 0 || layer >= p.layers)
    throw InvalidArgument(fmt::format("layer must be in 0..{}, got {}", p.layers - 1, layer));
  if (frame0 < 0) throw InvalidArgument(fmt::format("frame0 must be >= 0, got {}", frame0));
  if (frames < 1 || frames > 100000) throw InvalidArgument(fmt::format("frames must be in 1..100000, got {}", frames));
  const LayerParams& lp = im.layer(layer);
  const uint64_t seed = im.opts.seed;
  const int64_t H = p.heads, D = p.head_dim, tpf = p.tokens_per_frame(), n = frames * tpf;
  const Shape4 shape{1, n, H, D};
  const DType dt = im.opts.dtype;

  out.layer = layer;
  out.chunk.index = -1;
  out.chunk.frame0 = frame0;
  out.chunk.frames = frames;
  out.chunk.token0 = frame0 * tpf;
  out.chunk.tokens = n;
  out.chunk.sink = frame0 < p.sink_frames;
  auto ensure = [&](Tensor& t, bool want) {
    if (!want)
      t = Tensor();
    else if (t.dtype() != dt || !(t.shape() == shape))
      t = Tensor(dt, shape);
  };
  ensure(out.k, true);
  ensure(out.v, true);
  ensure(out.k_pre_rope, parts.k_pre_rope);
  ensure(out.q, parts.q);

  // RoPE tables: cos/sin per frame (time section), row and column.
  const int64_t pt = im.pairs_t, ph = im.pairs_h, pw = im.pairs_w;
  auto table = [&](int64_t count, int64_t pairs, int64_t pos0, int64_t freq0, std::vector<float>& c,
                   std::vector<float>& sn) {
    c.resize(size_t(count * pairs));
    sn.resize(c.size());
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < pairs; ++j) {
        const double ang = double(pos0 + i) * im.inv_freq[size_t(freq0 + j)];
        c[size_t(i * pairs + j)] = float(std::cos(ang));
        sn[size_t(i * pairs + j)] = float(std::sin(ang));
      }
  };
  std::vector<float> ct, st, ch, sh, cw, sw;
  table(frames, pt, frame0, 0, ct, st);
  table(p.grid_h, ph, 0, pt, ch, sh);
  table(p.grid_w, pw, 0, pt + ph, cw, sw);
  std::vector<Scene::FrameState> fstate;
  for (int64_t f = 0; f < frames; ++f) fstate.push_back(im.scene.frame_state(frame0 + f));

  const bool cluster_layer = layer >= p.layers - p.k_cluster_layers;
  const double a = kNormSmooth, b = std::sqrt(1 - a * a);
  const int nthreads = resolve_threads(im.opts.threads);
  std::byte* kp = static_cast<std::byte*>(out.k.data());
  std::byte* vp = static_cast<std::byte*>(out.v.data());
  std::byte* kpre = parts.k_pre_rope ? static_cast<std::byte*>(out.k_pre_rope.data()) : nullptr;
  std::byte* qp = parts.q ? static_cast<std::byte*>(out.q.data()) : nullptr;
  const size_t row_bytes = size_t(D) * dtype_size(dt);

  // Phase 1: the scene latent of every token (shared by all heads).
  std::vector<float> zs(size_t(n) * kLatent);
  std::vector<uint8_t> in_cluster(static_cast<size_t>(n)), outlier(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t f = i / tpf, t = frame0 + f;
    const int y = int((i % tpf) / p.grid_w), x = int(i % p.grid_w);
    const float w0 = im.scene.latent(fstate[size_t(f)], t, y, x, zs.data() + size_t(i) * kLatent);
    in_cluster[size_t(i)] = cluster_layer && w0 > 0.5f;
    outlier[size_t(i)] = uniform_from_bits(hash_of(seed, kOutlier, layer, t, y, x)) < float(p.v_outlier_rate);
  }

  // Phase 2: per head (its projections stay in cache), blocks of tokens.
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<float> row(static_cast<size_t>(D)), rot(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t blk = 0; blk < nblocks; ++blk) {
        const HeadParams& hp = lp.heads[size_t(h)];
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
          const int64_t f = i / tpf, t = frame0 + f;
          const int y = int((i % tpf) / p.grid_w), x = int(i % p.grid_w);
          const float* z = zs.data() + size_t(i) * kLatent;
          const size_t off = size_t(i * H + h) * row_bytes;
          // 3D RoPE of `src` into `dst` at this token's position.
          auto rope = [&](const float* src, float* dst) {
            std::memcpy(dst, src, size_t(D) * sizeof(float));
            auto turn = [&](int64_t pair, float c, float sn) {
              const float x0 = src[2 * pair], x1 = src[2 * pair + 1];
              dst[2 * pair] = x0 * c - x1 * sn;
              dst[2 * pair + 1] = x0 * sn + x1 * c;
            };
            for (int64_t j = 0; j < pt; ++j) turn(j, ct[size_t(f * pt + j)], st[size_t(f * pt + j)]);
            for (int64_t j = 0; j < ph; ++j) turn(pt + j, ch[size_t(y * ph + j)], sh[size_t(y * ph + j)]);
            for (int64_t j = 0; j < pw; ++j) turn(pt + ph + j, cw[size_t(x * pw + j)], sw[size_t(x * pw + j)]);
          };
          // K
          project(hp.wk.data(), z, hp.mu_k.data(), kKNoise, hash_of(seed, kKEps, layer, h, t, y, x), D, row.data());
          gain_normalize(row.data(), hp.gk.data(), D);
          {
            const float u = float(a * (dot_latent(hp.nk_dir, z) - hp.nk_mean) / hp.nk_std +
                                  b * normal_from_bits(hash_of(seed, kKNormEps, layer, h, t, y, x)));
            float nrm = hp.norm_k * std::exp(hp.sigma_k * u);
            if (in_cluster[size_t(i)]) nrm *= float(p.k_cluster_norm);
            for (int64_t d = 0; d < D; ++d) row[size_t(d)] *= nrm;
          }
          if (kpre) convert_from_f32(row.data(), dt, kpre + off, size_t(D));
          rope(row.data(), rot.data());
          convert_from_f32(rot.data(), dt, kp + off, size_t(D));
          // Q
          if (qp) {
            project(hp.wq.data(), z, hp.mu_k.data(), kQNoise, hash_of(seed, kQEps, layer, h, t, y, x), D, row.data());
            gain_normalize(row.data(), hp.gq.data(), D);
            for (int64_t d = 0; d < D; ++d) row[size_t(d)] *= hp.norm_q;
            rope(row.data(), rot.data());
            convert_from_f32(rot.data(), dt, qp + off, size_t(D));
          }
          // V
          project(hp.wv.data(), z, hp.mu_v.data(), kVNoise, hash_of(seed, kVEps, layer, h, t, y, x), D, row.data());
          gain_normalize(row.data(), hp.gv.data(), D);
          {
            float nrm;
            if (outlier[size_t(i)]) {
              nrm = float(p.v_outlier_norm * p.v_token_norm);
            } else {
              const float u = float(a * (dot_latent(hp.nv_dir, z) - hp.nv_mean) / hp.nv_std +
                                    b * normal_from_bits(hash_of(seed, kVNormEps, layer, h, t, y, x)));
              nrm = hp.norm_v * std::exp(hp.sigma_v * u);
            }
            for (int64_t d = 0; d < D; ++d) row[size_t(d)] *= nrm;
          }
          convert_from_f32(row.data(), dt, vp + off, size_t(D));
        }
      }
    }
  }
}

}  // namespace qvg
