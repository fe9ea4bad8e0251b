// The shared model of the synthetic generator (src/workload/generator.cpp generates,
// src/workload/calibrate.cpp fits the per-layer parameters): constants, the
// counter-based random numbers, the scene, the per-layer parameters and the row
// kernels. Internal to the workload layer.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng_impl.h"
#include "qvg/eval/workload.h"

namespace qvg::workload_detail {

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

/// out[d] = sum_i z[i] * w[i*D + d] + mu[d] + sigma * eps_d, where eps_d is an
/// approximately standard normal number from (noise_seed, d) (generator.cpp).
void project(const float* w, const float* z, const float* mu, float sigma, uint64_t noise_seed, int64_t D, float* out);
/// row <- g * row / ||g * row|| (unit norm; a zero row stays zero; generator.cpp).
void gain_normalize(float* row, const float* g, int64_t D);

inline float dot_latent(const std::array<float, kLatent>& a, const float* z) {
  float s = 0;
  for (int i = 0; i < kLatent; ++i) s += a[size_t(i)] * z[i];
  return s;
}

/// The parameters of layer `layer` fitted on a calibration sample of `scene` so that
/// the workload.md estimators hit the preset's targets (calibrate.cpp). Deterministic
/// in (options.seed, layer); heads run in parallel on options.threads.
std::unique_ptr<LayerParams> calibrate_layer(const ModelPreset& preset, const WorkloadOptions& options,
                                             const Scene& scene, int layer);

}  // namespace qvg::workload_detail
