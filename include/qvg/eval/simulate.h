// qvg/eval/simulate.h — the streaming simulation behind `qvg simulate` and its report
// (JSON, text, SVG charts). The other experiments have their own headers:
// qvg/eval/compare.h (`qvg compare`), qvg/eval/frontier.h (`qvg compare --frontier`);
// the error measures are in qvg/eval/error_sums.h, the SVG charts in qvg/eval/chart.h.
//
// simulate(): a synthetic video stream (qvg/eval/workload.h) is fed chunk by chunk,
// layer by layer, through a DenseCausalCache and one PackedCausalCache per packed
// configuration, side by side. For every chunk and simulated layer:
//   1. the chunk's K/V/Q are generated (deterministic from the seed);
//   2. the *advance*: both caches get update(K_0, V_0, c, rw = 0). With
//      recent_window_tokens = 0 the returned view is only the sink and the current
//      chunk, so the packed call's time is pack-and-evict (the encoding of any span
//      that became full) and nothing of the history is decoded — encode_s;
//   3. each denoising step s = 0 .. steps-1 calls update(K_s, V_s, c) (a rewrite of
//      the current chunk) on every cache and gets the full window; the packed call's
//      time is the view reconstruction (decoding every visible span) — decode_s.
//      K_s, V_s, Q_s are the chunk's tensors plus deterministic Gaussian noise of
//      relative size step_noise * (steps-1-s) / steps (the last step is the clean
//      chunk, which is what the cache keeps);
//   4. at the last step (or every step, attention_every_step) the reference
//      attention (qvg/attention.h) of a subsample of the chunk's queries (every
//      query_stride-th token, all heads) runs over the dense view and over each
//      packed view; the packed output is scored against the dense one;
//   5. the last step's packed view is compared with the dense view on the tokens
//      that are *encoded* (inside a packed span) — raw tokens are identical by
//      construction and would only dilute the figure.
// The window (attention_window_size) equals the cache size: context + one chunk.
// Because both caches then show the same global tokens in the same order, views
// are compared position by position (checked: equal lengths).
//
// Everything except the wall times is deterministic: the same configuration gives
// the same records, bytes and errors whatever the thread count.
//
// Errors: every entry point validates its configuration first and throws
// InvalidArgument naming the field, its value and what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qvg/config.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/workload.h"

namespace qvg {

// ---------------------------------------------------------------------------
// simulate()

/// One packed-cache configuration streamed next to the dense cache. The simulated
/// layers' caches of one configuration share one ViewScratch (CacheOptions::
/// view_scratch, as qvg.torch's packed caches do): the model holds one window of view
/// memory, which the model-level figures count (PackedSummary).
struct PackedConfig {
  std::string label;  ///< shown in tables, JSON and legends, e.g. "int2"; non-empty, unique
  QuantArgs quant;    ///< must be enabled (bits set); used as given (`qvg simulate` sets
                      ///< the sink span policy to the preset's unless its flag says otherwise)
};

/// The published Self-Forcing QVG configuration: int2, 256 centroids, block 64,
/// 1 stage, 2 k-means iterations, spans of 8 chunks, keep_recent 1 (label "int2").
PackedConfig default_packed_config();

/// The engine's default configuration, as its flags give it with `kv_cache_quant=int2`
/// alone and the reference profile's codec (the baseline of the recommended profile,
/// docs/quality.md): int2, 128 centroids, block 64, 1 stage, 2 k-means iterations,
/// compat scaling, fp8 scales, spans of one chunk (deferred), keep_recent 1, the sink
/// packed as `model` does (ModelPreset::policy_defaults); label "engine".
PackedConfig engine_default_packed_config(const ModelPreset& model);

/// What to simulate. Defaults are the embedded default run of `qvg simulate`.
struct SimulationConfig {
  std::string model = "self-forcing-1.3b";  ///< preset name (find_model_preset)
  double scale = 0.25;                      ///< ModelPreset::scaled factor, (0, 1]
  uint64_t seed = 0;                        ///< the workload's video
  /// Overrides the preset's context (the cache holds context + one chunk); the sink
  /// becomes min(sink, context). nullopt: the preset's. 1..100000.
  std::optional<int64_t> context_frames = 72;
  int64_t chunks = 40;                ///< chunks streamed (sink chunks first): 1..100000
  int steps = 2;                      ///< denoising steps per chunk: 1..64
  double step_noise = 0.05;           ///< relative noise of the first step: [0, 1]
  int layers = 2;                     ///< layers simulated (see select_layers): 1..model layers
  int query_stride = 16;              ///< every query_stride-th query of a chunk is scored: >= 1
  bool attention_every_step = false;  ///< score attention at every step, not only the last
  std::vector<PackedConfig> packed = {default_packed_config()};  ///< at least one
  int threads = 0;  ///< OpenMP threads for generation, codec, attention (0 = all)

  /// Throws InvalidArgument naming the field unless every value is in range
  /// (including the model name, the layer count against the scaled preset, and
  /// each packed configuration against head_dim).
  void validate() const;
};

/// The scaled preset a configuration runs on (scale and context override applied).
ModelPreset simulation_preset(const SimulationConfig& cfg);

/// `count` layers of `total`, spread evenly: layer floor((i + 0.5) * total / count)
/// for i = 0 .. count-1 (count = 1 gives the middle layer). REQUIRES 1 <= count <= total
/// (InvalidArgument otherwise).
std::vector<int> select_layers(int total, int count);

/// One packed configuration on one layer during one chunk.
struct PackedLayerRecord {
  size_t resident_bytes = 0;                       ///< after the chunk's calls
  size_t transient_peak_bytes = 0;                 ///< max peak_transient_nbytes() over the chunk's calls
  int64_t encoded_tokens = 0;                      ///< tokens held in packed spans (resident)
  int64_t encoded_visible = 0;                     ///< of the last step's view, tokens inside packed spans
  size_t encoded_bytes = 0;                        ///< bytes of the resident packed spans (K + V)
  int spans_encoded = 0;                           ///< spans started by this chunk's advance
  int chunks_encoded = 0;                          ///< chunks encoded by this chunk's advance
  int64_t span_breaks = 0;                         ///< adaptive span breaks so far (incremental spans)
  std::optional<size_t> predicted_resident_bytes;  ///< memory model (PolicyReplay) for this chunk
  ErrorSums k, v;                                  ///< last step's view vs dense view, encoded tokens only
  AttentionSums attention;                         ///< vs the dense view's attention
  double encode_s = 0;                             ///< the advance call (pack-and-evict; see top)
  double decode_s = 0;                             ///< the step calls (view reconstruction), summed over steps
  double attention_s = 0;                          ///< reference attention over the packed views
  /// The model-level figures of the simulated layers (see PackedSummary): right after
  /// each of this layer's calls in the chunk, the resident bytes of every simulated
  /// layer's cache of this configuration plus the bytes of the view scratch they share,
  /// at that instant; the most of these. view_bytes: the shared scratch after the call.
  size_t model_bytes = 0;
  size_t view_bytes = 0;
};

/// One simulated layer during one chunk.
struct LayerRecord {
  int layer = 0;
  size_t dense_resident_bytes = 0;
  size_t dense_transient_peak_bytes = 0;
  int64_t window_tokens = 0;              ///< tokens of the last step's view
  double generate_s = 0;                  ///< workload generation and step perturbation
  double dense_update_s = 0;              ///< all dense calls of the chunk
  double dense_attention_s = 0;           ///< reference attention over the dense views
  std::vector<PackedLayerRecord> packed;  ///< one per PackedConfig, in order
};

/// One chunk of the stream.
struct ChunkRecord {
  ChunkInfo chunk;
  int64_t global_end = 0;           ///< tokens generated after this chunk
  int64_t window_tokens = 0;        ///< tokens visible to this chunk's queries
  int64_t queries = 0;              ///< queries scored per head and step
  double wall_s = 0;                ///< wall time of the whole chunk (all layers)
  std::vector<LayerRecord> layers;  ///< one per simulated layer, in select_layers order
};

/// Progress of a running simulation (for progress bars).
struct SimulationProgress {
  int64_t chunk = 0, chunks = 0;  ///< chunks finished so far, of chunks
  int layer = 0, layers = 0;      ///< layers finished in the current chunk, of layers
  double elapsed_s = 0;
  const ChunkRecord* last = nullptr;  ///< the chunk just finished (when layer == 0), else null
};
using ProgressFn = std::function<void(const SimulationProgress&)>;

/// Figures of one packed configuration over a whole run. Memory is per layer (every
/// layer has the same shapes, so the same sizes); "full-window chunks" are those
/// whose view is the whole cache (from SimulationResult::window_full_chunk on; all
/// chunks if the window never fills); "quality chunks" are those whose last view held
/// encoded tokens (before the first span is encoded, packed and dense views are
/// identical and the errors are exactly 0).
struct PackedSummary {
  std::string label;
  size_t dense_bytes = 0;                  ///< the dense cache (its buffers: constant)
  size_t packed_last_bytes = 0;            ///< after the last chunk
  size_t packed_peak_bytes = 0;            ///< the most over the run
  size_t packed_mean_full_bytes = 0;       ///< mean over the full-window chunks
  size_t transient_peak_bytes = 0;         ///< the most over the run
  double ratio_peak = 0;                   ///< dense / packed peak
  double ratio_full = 0;                   ///< dense / packed mean over the full-window chunks
  std::optional<double> bits_per_element;  ///< of the encoded spans after the last chunk
  ErrorSums k, v;                          ///< pooled over the quality chunks and layers
  AttentionSums attention;                 ///< pooled over the quality chunks and layers
  double worst_attention_rel_l2 = 0;       ///< largest per-chunk value (layers pooled)
  int64_t quality_chunks = 0;
  int64_t spans = 0;                  ///< spans encoded over the run (per layer)
  double encode_s_per_span = 0;       ///< mean advance-call time of chunks that encoded, per span and layer
  double encode_s_per_chunk = 0;      ///< the same per chunk encoded
  int64_t span_breaks = 0;            ///< adaptive span breaks over the run (incremental spans; per layer)
  double decode_s_per_step = 0;       ///< mean per step call and layer (view reconstruction)
  double attention_s_per_chunk = 0;   ///< mean per chunk and layer, over the packed views
  bool memory_model_matches = false;  ///< every resident size equals the PolicyReplay prediction
  /// The full-size model (scale 1, the preset's own context, this configuration),
  /// from the memory model (qvg/eval/memory.h): dense cache and policy peak, per layer.
  size_t full_dense_bytes = 0, full_policy_peak_bytes = 0;
  int full_layers = 0;

  // --- the model level (docs/simulate.md, "The model-level peak") ---------------
  // What the model's GPU (or host) holds at once: every layer's cache plus the view
  // memory. The packed caches of one configuration share one view window (the
  // engine's packed cache, which frees its view after each layer's attention, holds one
  // too); dense views are ranges of the dense buffers (no copy).
  /// The largest shared view scratch of the run (the decoded full window).
  size_t view_bytes = 0;
  /// The scaled model, all ModelPreset::layers layers: dense = layers x dense_bytes;
  /// packed = the most, over the chunks, of layers x resident bytes (mean of the
  /// simulated layers) + the shared view after that chunk's calls.
  size_t model_dense_bytes = 0, model_peak_bytes = 0;
  double ratio_model_peak = 0;  ///< model_dense_bytes / model_peak_bytes
  /// Measured on the simulated layers: the most, over every instant right after a
  /// cache call, of the resident bytes of all simulated layers' caches plus the shared
  /// view scratch's bytes at that instant (PackedLayerRecord::model_bytes)...
  size_t measured_model_peak_bytes = 0;
  /// ... and the same sum from the memory model (each layer's PolicyReplay prediction,
  /// in the order the layers are called, plus the window's view), 0 when the memory
  /// model does not cover the shapes; model_peak_matches when the two are equal.
  size_t predicted_model_peak_bytes = 0;
  bool model_peak_matches = false;
  /// The full-size model (full_layers layers, one shared view window, the memory
  /// model: MemoryReport::model_peak_bytes and dense_model_bytes).
  size_t full_model_dense_bytes = 0, full_model_peak_bytes = 0;
  double full_ratio_model_peak = 0;

  // --- time per denoising step (docs/simulate.md) ---------------------------------
  /// Per layer and denoising step, over the full-window chunks (all chunks when the
  /// window never fills): the advance call's time (pack-and-evict: the encoding)
  /// amortised over the chunk's steps plus one view reconstruction, i.e. (advance +
  /// all step calls) / steps, averaged over chunks and simulated layers. Wall clock.
  double step_s = 0;
  /// Chunk (0-based) whose advance encoded the configuration's first span or chunk; -1
  /// when nothing was encoded during the run (its ratios then compare the dense cache's
  /// up-front allocation with raw chunks).
  int64_t first_encoded_chunk = -1;
};

/// The result of simulate().
struct SimulationResult {
  SimulationConfig config;
  ModelPreset preset;       ///< the scaled preset (context override applied)
  std::vector<int> layers;  ///< simulated layer indices
  std::vector<ChunkRecord> chunks;
  std::vector<PackedSummary> summary;  ///< one per PackedConfig
  int64_t window_full_chunk = -1;      ///< first chunk whose view is the full cache (-1: never)
  double wall_s = 0;
};

/// Runs the simulation. Validates cfg first (InvalidArgument). `progress` is called
/// after every layer of every chunk, from the calling thread.
SimulationResult simulate(const SimulationConfig& cfg, const ProgressFn& progress = {});

/// Recomputes result.summary from result.chunks (simulate() already did).
void summarize(SimulationResult& result);

/// The report as JSON text (validates against docs/simulate.schema.json).
/// Non-finite numbers are written as null. indent < 0: one line.
std::string simulation_json(const SimulationResult& result, int indent = 2);

/// The closing summary for a terminal (plain text, several lines, ends with '\n').
std::string simulation_summary_text(const SimulationResult& result);

/// The charts: resident memory per layer over the chunks (dense vs each packed
/// configuration, with the packed transient peak dashed), and the attention
/// relative error over the chunks per configuration. Self-contained SVG 1.1 text.
std::string memory_chart_svg(const SimulationResult& result);
std::string attention_chart_svg(const SimulationResult& result);

/// Writes report.json, memory.svg, attention.svg and summary.txt into `dir`
/// (created if missing). Throws InvalidArgument naming the path when the directory
/// cannot be created or a file cannot be written. All four files are first written
/// to temporaries in `dir` and then renamed, so a write error leaves none of them
/// (the temporaries are removed); only a failing rename could leave some.
void write_simulation_report(const SimulationResult& result, const std::string& dir);

}  // namespace qvg
