// qvg/eval/workload.h — a synthetic but realistic K/V/Q workload of a streaming video model.
//
// The generator reproduces the properties measured on real models in
// docs/workload.md (frame-grid tokens with spatial and temporal redundancy, K channel
// walls then 3D rotary embedding, flat K token norms, V token-norm spread with rare
// high-norm tokens, per-model magnitudes), for the model presets of that document.
//
// Guarantees:
//  - Deterministic: every element is a pure function of (seed, preset, scale, layer,
//    absolute frame, row, column, head, channel). The same request gives identical
//    bytes whatever the call order, the chunking and the thread count; another seed
//    gives a different video.
//  - Calibrated: per (layer, head), the K wall ratio, the K and V token-norm spreads,
//    the V wall ratio and the magnitudes are fitted on a calibration sample (tokens of
//    the first chunk) to the preset's targets, so the workload.md estimators measured
//    on any chunk land close to them (tests/test_workload.cpp checks the tolerance).
//  - Thread-safe: Workload::generate may be called concurrently.
//
// The scene (shared by all layers): a camera pans over a world whose latent field has
// large regions (argmax of smooth fields: "sky", "ground", ...) each with its own
// prototype, a smooth texture, and a few objects (soft ellipses with their own
// prototype and texture) moving across the frame; a little per-frame noise. Each
// layer and head projects that latent field linearly to K, Q and V, plus iid noise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qvg/config.h"
#include "qvg/tensor.h"

namespace qvg {

/// Which values of a preset are assumptions where the public material is silent
/// (printed with the mark "(a)" wherever they appear).
struct PresetAssumptions {
  bool layers = false;
  bool heads = false;
  bool head_dim = false;
  bool grid = false;  ///< the patch grid's height x width (tokens/frame itself is published)
  bool frames_per_chunk = false;
  bool context = false;
  bool sink = false;
  bool rope = false;       ///< how head_dim splits into rotary sections
  bool k_wall = false;     ///< the K wall ratio target
  bool k_norm = false;     ///< the K token-norm spread target
  bool v_wall = false;     ///< the V wall ratio target
  bool v_norm = false;     ///< the V token-norm spread and outlier targets
  bool magnitude = false;  ///< the absolute K/V magnitudes
};

/// " (a)" when `assumed`, else "" — the mark printed after assumed values.
std::string_view assumed_mark(bool assumed);

/// Shapes, cache geometry and K/V statistics of one model (docs/workload.md).
struct ModelPreset {
  std::string name;    ///< CLI name, e.g. "self-forcing-1.3b"
  std::string model;   ///< what it is, e.g. "Self-Forcing (Wan2.1 1.3B, 480x832)"
  double scale = 1.0;  ///< 1 for the full model; see scaled()
  int layers = 0;      ///< transformer blocks, one cache each
  int heads = 0;
  int head_dim = 0;  ///< D
  int grid_h = 0;    ///< patch rows of one frame
  int grid_w = 0;    ///< patch columns; tokens_per_frame = grid_h * grid_w
  int frames_per_chunk = 0;
  int context_frames = 0;  ///< history one layer's cache holds while a chunk is generated (sink included)
  int sink_frames = 0;     ///< leading frames kept forever (0: no sink)
  SinkSpan sink_policy = SinkSpan::Chunk;  ///< how the model packs its sink (policy_defaults())
  /// Leading channels with 3D RoPE (even, <= head_dim; the rest is not rotated), split as
  /// Wan does: height and width get 2*(rope_dims/6) channels each, time the rest;
  /// channel pairs (2i, 2i+1) turn together.
  int rope_dims = 0;
  double rope_theta = 10000.0;

  // --- K/V statistics (estimators of docs/workload.md, per layer and head) ---
  double k_wall_ratio = 5.0;      ///< K before RoPE: max/median over channels of per-channel median |K|
  double k_norm_spread = 1.2;     ///< K: p99/p1 of token L2 norms
  double k_channel_median = 1.0;  ///< K: median over channels of per-channel median |K| (magnitude)
  double v_wall_ratio = 2.0;      ///< V: max/median over channels of per-channel median |V|
  double v_norm_spread = 4.5;     ///< V: p99/p1 of token L2 norms (outliers excluded)
  double v_token_norm = 16.0;     ///< V: median token L2 norm (magnitude)
  double v_outlier_rate = 2e-4;   ///< probability that a token is an isolated high-norm V token
  double v_outlier_norm = 6.0;    ///< its V norm / v_token_norm
  int k_cluster_layers = 0;       ///< the last this-many layers hold a cluster of high-norm K tokens
  double k_cluster_norm = 3.0;    ///< their K norm / the usual
  PresetAssumptions assumed;

  int64_t tokens_per_frame() const { return int64_t(grid_h) * grid_w; }
  int64_t chunk_tokens() const { return tokens_per_frame() * frames_per_chunk; }
  int64_t context_tokens() const { return tokens_per_frame() * context_frames; }
  int64_t sink_tokens() const { return tokens_per_frame() * sink_frames; }
  /// The cache size (= window) a layer needs: context + one chunk.
  int64_t cache_tokens() const { return context_tokens() + chunk_tokens(); }
  /// Sink chunks: the sink frames cut into chunks of frames_per_chunk (last may be shorter).
  int64_t sink_chunks() const { return sink_frames > 0 ? (sink_frames + frames_per_chunk - 1) / frames_per_chunk : 0; }

  /// A reduced copy for quick runs: heads and layers times s (rounded, >= 1), the
  /// frame grid's rows and columns times sqrt(s) (rounded, >= 2), so tokens per frame
  /// scale by about s. head_dim, the frame counts (chunk, context, sink) and every
  /// statistic target are kept. The scene is in patch units, so a scaled frame shows a
  /// crop of the full-size scene with the same local statistics.
  /// Throws InvalidArgument unless 0 < s <= 1.
  ModelPreset scaled(double s) const;
  /// QuantArgs{} with the settings this model chooses (its sink policy): the defaults
  /// the CLI and the simulator start from for this model.
  QuantArgs policy_defaults() const;
  /// Whether the model presets choose the setting `name`'s default (policy_defaults).
  static bool chooses(std::string_view name);

  /// Throws InvalidArgument naming the field unless every value is in range.
  void validate() const;
};

/// The presets of docs/workload.md, in its order.
const std::vector<ModelPreset>& model_presets();
/// The preset called `name`; InvalidArgument listing the names otherwise.
const ModelPreset& find_model_preset(std::string_view name);

/// One chunk of the stream. Chunks are numbered from 0: first the sink chunks (the
/// sink frames cut into chunks of frames_per_chunk, the last one shorter if the sink
/// is not a whole number of chunks), then regular chunks of frames_per_chunk frames.
struct ChunkInfo {
  int64_t index = 0;
  int64_t frame0 = 0;  ///< first frame (absolute)
  int64_t frames = 0;
  int64_t token0 = 0;  ///< first token (global position) = frame0 * tokens_per_frame
  int64_t tokens = 0;  ///< frames * tokens_per_frame
  bool sink = false;   ///< a sink chunk (token0 < sink_tokens)
};
/// The chunk `index` of `preset`'s stream (InvalidArgument if index < 0).
ChunkInfo chunk_info(const ModelPreset& preset, int64_t index);

/// Generator options.
struct WorkloadOptions {
  double scale = 1.0;         ///< applied with ModelPreset::scaled (1 = full size)
  uint64_t seed = 0;          ///< the video; every random choice derives from it
  DType dtype = DType::BF16;  ///< of the generated tensors (bf16 or f32; f16 also accepted)
  int threads = 0;            ///< OpenMP threads for generate(); 0 = all. Never changes bytes.
};

/// Which tensors generate() fills (skipping saves time).
struct GenerateParts {
  bool k_pre_rope = true;
  bool q = true;
};

/// The K/V/Q of one layer for a run of frames, each [B=1, n, H, D] with
/// n = frames * tokens_per_frame; token i is (frame frame0 + i / tpf, row
/// (i % tpf) / grid_w, column i % grid_w) — frame-major, then rows, then columns.
struct LayerChunk {
  int layer = 0;
  ChunkInfo chunk;    ///< which tokens (index = -1 when produced by generate_frames)
  Tensor k_pre_rope;  ///< K before rotary embedding (empty if not requested)
  Tensor k;           ///< K after 3D rotary embedding: what the cache stores
  Tensor v;
  Tensor q;  ///< Q after 3D rotary embedding (empty if not requested)
};

/// The generator. Movable, not copyable; const methods are thread-safe.
class Workload {
 public:
  /// Validates the preset and options (InvalidArgument naming the field).
  /// Cheap: per-layer parameters are built on first use of a layer.
  explicit Workload(const ModelPreset& preset, const WorkloadOptions& options = {});
  ~Workload();
  Workload(Workload&&) noexcept;
  Workload& operator=(Workload&&) noexcept;
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  /// The preset after scaling: the shapes of everything generated.
  const ModelPreset& preset() const;
  const WorkloadOptions& options() const;
  ChunkInfo chunk(int64_t index) const { return chunk_info(preset(), index); }

  /// K, V, Q of chunk `chunk_index` for `layer` (0 <= layer < preset().layers, else
  /// InvalidArgument; chunk_index >= 0).
  LayerChunk generate(int layer, int64_t chunk_index, GenerateParts parts = {}) const;
  /// The same for frames [frame0, frame0 + frames) (frame0 >= 0, 1 <= frames <= 100000).
  LayerChunk generate_frames(int layer, int64_t frame0, int64_t frames, GenerateParts parts = {}) const;
  /// generate() into `out`, reusing its tensors' storage when their shape and dtype
  /// already match (a streaming loop allocates once); tensors of parts not requested
  /// are emptied. On error `out` is unspecified.
  void generate_into(int layer, int64_t chunk_index, LayerChunk& out, GenerateParts parts = {}) const;
  void generate_frames_into(int layer, int64_t frame0, int64_t frames, LayerChunk& out, GenerateParts parts = {}) const;
  /// Layers whose parameters were built so far: each once, on its first use (the
  /// costly part of a layer; a chunk of a built layer costs only its tokens).
  int64_t layers_built() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- the estimators of docs/workload.md (used by tests and reports) ----------

/// Per-head statistics of one [B, S, H, D] tensor (batch 0), each averaged over heads.
struct KVStats {
  double wall_ratio = 0;      ///< mean over heads of max/median over channels of per-channel median |x|
  double norm_spread = 0;     ///< mean over heads of p99/p1 of token L2 norms
  double channel_median = 0;  ///< mean over heads of the median over channels of per-channel median |x|
  double norm_median = 0;     ///< mean over heads of the median token norm
  double norm_max = 0;        ///< largest token norm of any head
  double abs_max = 0;         ///< largest |x|
};
/// Computes KVStats of x (any dtype). Percentiles use the nearest-rank rule.
KVStats kv_stats(ConstTensorView x);

}  // namespace qvg
