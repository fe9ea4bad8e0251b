// The synthetic K/V/Q generator (include/qvg/eval/workload.h).
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
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include <fmt/core.h>
#include <omp.h>

#include "qvg/error.h"
#include "qvg/eval/workload.h"
#include "qvg/numeric.h"
#include "workload/generator_model.h"

namespace qvg {

namespace workload_detail {
namespace {

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

}  // namespace

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

}  // namespace workload_detail

using namespace workload_detail;

// ---- Workload -------------------------------------------------------------------
struct Workload::Impl {
  ModelPreset preset;
  WorkloadOptions opts;
  Scene scene;
  mutable std::vector<std::unique_ptr<LayerParams>> layers;  // built once per layer, on first use
  std::unique_ptr<std::once_flag[]> once;
  mutable std::atomic<int64_t> built{0};  // layers whose parameters exist
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
    std::call_once(once[size_t(l)], [&] {
      layers[size_t(l)] = calibrate_layer(preset, opts, scene, l);
      built.fetch_add(1);
    });
    return *layers[size_t(l)];
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

int64_t Workload::layers_built() const {
  return impl_->built.load();
}

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
