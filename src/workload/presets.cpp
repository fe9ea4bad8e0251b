// Model presets of docs/workload.md, scaling, and the chunk schedule.
#include <cmath>
#include <string>

#include <fmt/core.h>

#include "qvg/error.h"
#include "qvg/eval/workload.h"

namespace qvg {

std::string_view assumed_mark(bool assumed) {
  return assumed ? " (a)" : "";
}

namespace {

/// One row of the preset table: ModelPreset's values in their order (rope_theta and
/// k_cluster_norm keep their defaults).
struct PresetRow {
  const char* name;
  const char* model;
  int layers, heads, head_dim, grid_h, grid_w, frames_per_chunk, context_frames, sink_frames;
  SinkSpan sink_policy;
  int rope_dims;
  double k_wall_ratio, k_norm_spread, k_channel_median;
  double v_wall_ratio, v_norm_spread, v_token_norm, v_outlier_rate, v_outlier_norm;
  int k_cluster_layers;
  PresetAssumptions assumed;
};

constexpr SinkSpan kChunk = SinkSpan::Chunk, kFull = SinkSpan::Full;

// The presets of docs/workload.md, in its order.
//  - self-forcing-1.3b: Wan2.1 1.3B at 480x832 (VAE stride 8 and 2x2 patches: a 30 x 52 grid); the
//    context of the published QVG run; Wan's 3D RoPE over the whole head (44/42/42 channels).
//  - longcat-video-13.6b: the context is the cached conditioning, which is the sink. K's wall
//    channels sit around 12 ("K stays around 12"); V token norms 1000-2800 with entries in the
//    hundreds, one outlier token ~4000.
//  - hy-worldplay-8b: 22 x 40 = 880 tokens per frame; head_dim 256 = the rope and camera branches
//    concatenated (only the rope branch is rotated); the 72-frame context matches the published
//    990 MiB of bf16 K+V per layer.
// clang-format off
constexpr PresetRow kPresetRows[] = {
// {name, model,
//  layers heads head_dim grid_h grid_w frames/chunk context sink sink-policy rope_dims |
//    K: wall_ratio norm_spread channel_median | V: wall_ratio norm_spread token_norm outlier_rate outlier_norm |
//    k_cluster_layers,
//  assumed}
  {"self-forcing-1.3b", "Self-Forcing (Wan2.1 1.3B, 480x832)",
   30, 12, 128, 30, 52,  3, 168,  0, kChunk, 128,   5.4, 1.15, 1.0,    2.0, 4.5,   16.0, 2e-4, 6.0,   3,
   {.sink = true, .k_norm = true, .v_wall = true, .v_norm = true, .magnitude = true}},
  {"lingbot-world-14b", "LingBot-World (Wan2.2 A14B, 480x832)",
   40, 40, 128, 30, 52,  3,  68,  6, kChunk, 128,   7.0, 1.2,  1.0,    2.4, 5.0,   24.0, 2e-4, 6.0,   4,
   {.frames_per_chunk = true, .k_wall = true, .k_norm = true, .v_wall = true, .v_norm = true, .magnitude = true}},
  {"longcat-video-13.6b", "LongCat-Video 13.6B (480p)",
   48, 32, 128, 30, 52, 24,  19, 19, kFull,  128,   9.0, 1.2,  1.33,   2.0, 3.5, 1700.0, 1e-4, 2.4,   5,
   {.frames_per_chunk = true, .rope = true, .k_norm = true, .v_wall = true, .v_norm = true}},
  {"hy-worldplay-8b", "HY-WorldPlay 8B",
   30, 16, 256, 22, 40,  4,  72,  0, kChunk, 128,  12.8, 1.2,  1.0,    3.0, 5.5,   32.0, 2e-4, 6.0,   3,
   {.heads = true, .grid = true, .frames_per_chunk = true, .context = true, .sink = true, .rope = true,
    .k_norm = true, .v_wall = true, .v_norm = true, .magnitude = true}},
};
// clang-format on

/// The preset of one table row (fields assigned by name), validated.
ModelPreset preset_of(const PresetRow& r) {
  ModelPreset p{.name = r.name,
                .model = r.model,
                .layers = r.layers,
                .heads = r.heads,
                .head_dim = r.head_dim,
                .grid_h = r.grid_h,
                .grid_w = r.grid_w,
                .frames_per_chunk = r.frames_per_chunk,
                .context_frames = r.context_frames,
                .sink_frames = r.sink_frames,
                .sink_policy = r.sink_policy,
                .rope_dims = r.rope_dims,
                .k_wall_ratio = r.k_wall_ratio,
                .k_norm_spread = r.k_norm_spread,
                .k_channel_median = r.k_channel_median,
                .v_wall_ratio = r.v_wall_ratio,
                .v_norm_spread = r.v_norm_spread,
                .v_token_norm = r.v_token_norm,
                .v_outlier_rate = r.v_outlier_rate,
                .v_outlier_norm = r.v_outlier_norm,
                .k_cluster_layers = r.k_cluster_layers,
                .assumed = r.assumed};
  p.validate();
  return p;
}

std::vector<ModelPreset> make_presets() {
  std::vector<ModelPreset> v;
  for (const PresetRow& r : kPresetRows) v.push_back(preset_of(r));
  return v;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> v = make_presets();
  return v;
}

const ModelPreset& find_model_preset(std::string_view name) {
  std::string names;
  for (const auto& p : model_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw InvalidArgument(fmt::format("model preset must be one of {}, got '{}'", names, name));
}

void ModelPreset::validate() const {
  auto need = [&](bool ok, std::string_view field, auto value, std::string_view allowed) {
    if (!ok)
      throw InvalidArgument(fmt::format("model preset '{}': {} must be {}, got {}", name, field, allowed, value));
  };
  need(layers >= 1, "layers", layers, ">= 1");
  need(heads >= 1, "heads", heads, ">= 1");
  need(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= 4096, "head_dim", head_dim, "even and in 2..4096");
  need(grid_h >= 1, "grid_h", grid_h, ">= 1");
  need(grid_w >= 1, "grid_w", grid_w, ">= 1");
  need(frames_per_chunk >= 1, "frames_per_chunk", frames_per_chunk, ">= 1");
  need(context_frames >= 1, "context_frames", context_frames, ">= 1");
  need(sink_frames >= 0 && sink_frames <= context_frames, "sink_frames", sink_frames,
       fmt::format("in 0..context_frames ({})", context_frames));
  need(rope_dims >= 0 && rope_dims <= head_dim && rope_dims % 2 == 0, "rope_dims", rope_dims,
       fmt::format("even and in 0..head_dim ({})", head_dim));
  need(rope_theta > 1.0, "rope_theta", rope_theta, "> 1");
  need(scale > 0 && scale <= 1, "scale", scale, "in (0, 1]");
  need(k_wall_ratio >= 1 && k_wall_ratio <= 100, "k_wall_ratio", k_wall_ratio, "in [1, 100]");
  need(v_wall_ratio >= 1 && v_wall_ratio <= 100, "v_wall_ratio", v_wall_ratio, "in [1, 100]");
  need(k_norm_spread >= 1 && k_norm_spread <= 100, "k_norm_spread", k_norm_spread, "in [1, 100]");
  need(v_norm_spread >= 1 && v_norm_spread <= 100, "v_norm_spread", v_norm_spread, "in [1, 100]");
  need(k_channel_median > 0 && k_channel_median < 1e6, "k_channel_median", k_channel_median, "in (0, 1e6)");
  need(v_token_norm > 0 && v_token_norm < 1e8, "v_token_norm", v_token_norm, "in (0, 1e8)");
  need(v_outlier_rate >= 0 && v_outlier_rate <= 0.01, "v_outlier_rate", v_outlier_rate, "in [0, 0.01]");
  need(v_outlier_norm >= 1 && v_outlier_norm <= 100, "v_outlier_norm", v_outlier_norm, "in [1, 100]");
  need(k_cluster_layers >= 0 && k_cluster_layers <= layers, "k_cluster_layers", k_cluster_layers,
       fmt::format("in 0..layers ({})", layers));
  need(k_cluster_norm >= 1 && k_cluster_norm <= 100, "k_cluster_norm", k_cluster_norm, "in [1, 100]");
}

QuantArgs ModelPreset::policy_defaults() const {
  QuantArgs q;
  q.sink_span = sink_policy;
  return q;
}

bool ModelPreset::chooses(std::string_view name) { return name == "sink_span"; }

ModelPreset ModelPreset::scaled(double s) const {
  if (!(s > 0.0 && s <= 1.0)) throw InvalidArgument(fmt::format("scale must be in (0, 1], got {}", s));
  ModelPreset p = *this;
  if (s == 1.0) return p;
  auto cnt = [&](int n) { return std::max(1, int(std::lround(double(n) * s))); };
  auto dim = [&](int n) { return std::max(2, int(std::lround(double(n) * std::sqrt(s)))); };
  p.scale = scale * s;
  p.layers = cnt(layers);
  p.heads = cnt(heads);
  p.grid_h = dim(grid_h);
  p.grid_w = dim(grid_w);
  if (k_cluster_layers > 0)
    p.k_cluster_layers = std::min(p.layers, std::max(1, int(std::lround(double(k_cluster_layers) * s))));
  p.validate();
  return p;
}

ChunkInfo chunk_info(const ModelPreset& p, int64_t index) {
  if (index < 0) throw InvalidArgument(fmt::format("chunk index must be >= 0, got {}", index));
  ChunkInfo c;
  c.index = index;
  const int64_t sink_chunks = p.sink_chunks();
  if (index < sink_chunks) {
    c.frame0 = index * p.frames_per_chunk;
    c.frames = std::min<int64_t>(p.frames_per_chunk, p.sink_frames - c.frame0);
    c.sink = true;
  } else {
    c.frame0 = p.sink_frames + (index - sink_chunks) * p.frames_per_chunk;
    c.frames = p.frames_per_chunk;
  }
  c.token0 = c.frame0 * p.tokens_per_frame();
  c.tokens = c.frames * p.tokens_per_frame();
  return c;
}

}  // namespace qvg
