// qvg/simulate.h — the streaming simulation behind `qvg simulate`, the quantizer
// comparison behind `qvg compare`, and their reports (JSON, text, SVG charts).
//
// simulate(): a synthetic video stream (qvg/workload.h) is fed chunk by chunk,
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
// compare(): one context of `context_chunks` chunks is quantized by each method
// (the PRQ codec as one span; RTN, KIVI-style, QuaRot-style round trips at the same
// bits and block size) and scored: bits per element (everything stored, codebooks
// included), K and V SNR over the context, and the attention of the next chunk's
// (subsampled) queries over [quantized context ++ raw next chunk] versus over the
// original tensors.
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

#include "qvg/baselines.h"
#include "qvg/config.h"
#include "qvg/workload.h"

namespace qvg {

// ---------------------------------------------------------------------------
// Error sums: kept as sums so that layers and chunks pool exactly.

/// Reconstruction error of one tensor over a set of elements.
struct ErrorSums {
  double err = 0;      ///< sum of (x - x')^2
  double ref = 0;      ///< sum of x^2
  int64_t tokens = 0;  ///< tokens (rows of all heads) the sums cover
  void add(const ErrorSums& o) { err += o.err, ref += o.ref, tokens += o.tokens; }
  /// err / ref; nullopt when no tokens were compared or ref == 0.
  std::optional<double> rel_mse() const;
  /// -10 log10(rel_mse); nullopt when rel_mse is absent or 0 (identical).
  std::optional<double> snr_db() const;
};

/// Attention output error of one view against the reference output.
struct AttentionSums {
  double err = 0;       ///< sum over outputs of ||o - o_ref||^2
  double ref = 0;       ///< sum over outputs of ||o_ref||^2
  double cos_sum = 0;   ///< sum over (query, head) vectors of cos(o, o_ref)
  double cos_min = 1;   ///< smallest cosine of any (query, head) vector
  int64_t vectors = 0;  ///< (query, head) vectors compared
  void add(const AttentionSums& o);
  double rel_l2() const;  ///< sqrt(err / ref); 0 when ref == 0
  double cosine() const;  ///< cos_sum / vectors (mean cosine); 1 when empty
};

/// Accumulates the error of `out` against `ref` (both fp32 [B, n, H, D], same shape).
/// A zero vector has cosine 1 against a zero vector and 0 against anything else.
AttentionSums attention_error(const Tensor& out, const Tensor& ref);

// ---------------------------------------------------------------------------
// simulate()

/// One packed-cache configuration streamed next to the dense cache.
struct PackedConfig {
  std::string label;  ///< shown in tables, JSON and legends, e.g. "int2"; non-empty, unique
  QuantArgs quant;    ///< must be enabled (bits set); used as given (`qvg simulate` sets
                      ///< sink_span to the preset's sink policy unless --sink-span says otherwise)
};

/// The published Self-Forcing QVG configuration: int2, 256 centroids, block 64,
/// 1 stage, 2 k-means iterations, spans of 8 chunks, keep_recent 1 (label "int2").
PackedConfig default_packed_config();

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
  /// from the memory model (qvg/memory.h): dense cache and policy peak, per layer.
  size_t full_dense_bytes = 0, full_policy_peak_bytes = 0;
  int full_layers = 0;
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

// ---------------------------------------------------------------------------
// Charts (a small hand-written SVG renderer; no dependencies)

/// One line of a chart.
struct ChartSeries {
  std::string name;          ///< legend text (XML-escaped when rendered)
  std::vector<double> x, y;  ///< same length; non-finite y values break the line
  std::string color = "#1f77b4";
  double width = 2.0;  ///< stroke width in px
  bool dashed = false;
  bool steps = false;    ///< a staircase: y[i] holds from x[i] to x[i+1]
  bool markers = false;  ///< a dot at every point
  double opacity = 1.0;
  bool legend = true;          ///< listed in the legend
  bool line = true;            ///< the points joined (false, with `markers`: a scatter)
  double marker_radius = 2.6;  ///< px
  /// Empty: markers filled with `color`; else filled with this ("none": a ring) and
  /// outlined in `color`.
  std::string marker_fill;
  std::vector<std::string> point_titles;  ///< empty, or one tooltip per point (its marker's <title>)
  std::string id;                         ///< set: the series is drawn inside <g id="...">
  std::string point_class;                ///< set: the class attribute of every marker
};

/// A labelled point drawn over the series (e.g. "reference default"): a dot, a leader
/// line and bold text `dy` px below it (negative: above), in <g id="id">.
struct ChartCallout {
  std::string id, text;
  double x = 0, y = 0;
  std::string fill = "#f1c40f";
  double dy = 0;
};

/// A vertical marker line with a label (e.g. "window full").
struct ChartMarker {
  double x = 0;
  std::string label;
};

struct LineChart {
  std::string title, subtitle;  ///< the subtitle wraps onto a second line when too long
  std::string note;             ///< optional headline under the subtitle (e.g. the ratio)
  std::string x_label, y_label;
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> markers;
  std::vector<ChartCallout> callouts;
  bool y_from_zero = true;  ///< the y axis starts at 0 (not with log_y)
  /// A log10 y axis over whole decades, a tick at each; y values <= 0 are not drawn.
  bool log_y = false;
  bool x_to_ticks = false;        ///< the x axis extends to the ticks either side of the data
  int width = 900, height = 460;  ///< px
};

/// Renders the chart as SVG text: axes with "nice" ticks (1, 2, 5 x 10^k), grid
/// lines, tick labels, axis labels (ids x-label and y-label), title, subtitle, a
/// legend, the series and the callouts.
/// Throws InvalidArgument when a series' x and y (or a non-empty point_titles) differ
/// in length or width/height < 200.
std::string render_line_chart(const LineChart& chart);

/// Tick positions from lo to hi with a 1/2/5 x 10^k step, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// ---------------------------------------------------------------------------
// compare()

struct CompareConfig {
  std::string model = "self-forcing-1.3b";
  double scale = 0.25;
  uint64_t seed = 0;
  /// Chunks of context quantized together (one PRQ span). nullopt: the fewest chunks
  /// holding at least 64 x centroids tokens, so codebooks cost at most 0.25 bits per
  /// element (see default_context_chunks). 1..1000.
  std::optional<int64_t> context_chunks;
  int layers = 2;        ///< layers scored, spread by select_layers: 1..model layers
  int query_stride = 8;  ///< every query_stride-th query of the next chunk: >= 1
  CodecConfig codec;     ///< bits, block size etc. shared by every method
  /// How the qvg codec encodes the context's chunks: deferred = one span trained on
  /// all of them; incremental = chunk by chunk into one growing span codebook, as
  /// the packed cache's incremental spans do (docs/spans.md).
  SpanMode span_mode = SpanMode::Deferred;
  int threads = 0;

  void validate() const;  ///< InvalidArgument naming the field
};

/// ceil(64 * centroids / chunk_tokens) (at least 1).
int64_t default_context_chunks(const ModelPreset& scaled, int centroids);

/// One method's figures (pooled over the scored layers).
struct CompareRow {
  std::string method;           ///< "qvg" | "rtn" | "kivi" | "quarot"
  double bits_per_element = 0;  ///< everything stored (codebooks, ids, scales, zeros), K and V
  double ratio = 0;             ///< 16 / bits_per_element (vs bf16)
  ErrorSums k, v;               ///< over the context tokens
  AttentionSums attention;      ///< vs attention over the original tensors
  double seconds = 0;           ///< quantize + dequantize time
};

struct CompareResult {
  CompareConfig config;
  ModelPreset preset;  ///< scaled
  std::vector<int> layers;
  int64_t context_chunks = 0, context_tokens = 0, queries = 0;
  std::vector<CompareRow> rows;  ///< qvg, rtn, kivi, quarot
  double wall_s = 0;
};

CompareResult compare(const CompareConfig& cfg);
std::string compare_json(const CompareResult& result, int indent = 2);
std::string compare_table_text(const CompareResult& result);

// ---------------------------------------------------------------------------
// frontier(): the rate-distortion frontier (issue 16, docs/quality.md). qvg
// configurations (per-role codec settings and span length) and the baselines at
// several rates, scored on the same context as compare(): bits per element (every
// stored byte), attention relative L2 error of the next chunk's queries, K/V SNR.
//
// Search strategy (stated, deterministic): coordinate descent from the reference
// default (reference_codec()). A round visits the knobs in a fixed order; for each,
// every value is evaluated with the other knobs at the current configuration, and the
// one of least attention error within the budget (the reference's bits per element
// + bpe_slack) is kept. Rounds repeat until one changes nothing (at most max_rounds).
// Then a ladder of rates around the result (bits 2/4 x centroids 64/256), the hq
// profile and the baselines (RTN, KIVI-style, QuaRot-style at 2, 3 and 4 bits, groups
// of 32 and 64) are evaluated. Every evaluated point is reported; the Pareto set
// (no other point has both fewer bits and less error) is marked.

/// One qvg configuration: K's and V's codec settings and the span length.
struct FrontierCodec {
  CodecConfig k, v;
  int span_chunks = 0;  ///< chunks per span (each its own codebook), oldest first; 0 = the whole context
  /// "k: bits=2 ... | v: ... | span=all" (only what differs from the reference when `short_form`).
  std::string describe(bool short_form = false) const;
  bool operator==(const FrontierCodec&) const = default;
};

/// The reference default: the engine's QVGKVQuantArgs defaults (int2, 128 centroids,
/// block 64, one stage, 2 iterations, symmetric, fp8 scales) with `compat` scaling.
FrontierCodec reference_codec();
/// The codec settings of a QuantArgs (per role; span = the whole context).
FrontierCodec frontier_codec_of(const QuantArgs& q);

struct FrontierConfig {
  std::string model = "self-forcing-1.3b";
  double scale = 0.25;
  uint64_t seed = 0;
  /// Chunks of context; nullopt: default_context_chunks(preset, 256) (the largest
  /// codebook swept costs at most 0.25 bits per element). 1..1000.
  std::optional<int64_t> context_chunks;
  int layers = 2;
  int query_stride = 8;  ///< every query_stride-th query of the next chunk: >= 1
  /// Queries scored per layer at most: the stride grows (from query_stride) until the
  /// next chunk gives at most this many (attention over the whole window is the costly
  /// part of an evaluation: LongCat's 24-frame chunks hold 9,360 queries at scale
  /// 0.25). 0 = no cap.
  int max_queries = 160;
  uint64_t codec_seed = 1234;
  double bpe_slack = 0.15;  ///< the descent's budget: reference bits per element + this (>= 0)
  int max_rounds = 3;       ///< 1..10
  bool quick = false;       ///< a reduced knob set and baseline set (tests)
  int threads = 0;
  void validate() const;
};

struct FrontierPoint {
  std::string method;       ///< "qvg" | "rtn" | "kivi" | "quarot"
  std::string label;        ///< "reference", "hq", the descent's move, or "rtn 3b g32"
  std::string stage;        ///< "reference" | "descent" | "ladder" | "profile" | "baseline"
  FrontierCodec codec;      ///< qvg points
  BaselineConfig baseline;  ///< baseline points
  double bits_per_element = 0;
  ErrorSums k, v;
  AttentionSums attention;
  double encode_s = 0, decode_s = 0;  ///< qvg: summed over layers and spans
  bool pareto = false;
};

/// A baseline's curve (one method and group size over bits 2, 3, 4) at the hq
/// profile's bits per element (linear interpolation of log error between measured
/// rates; outside them the nearest measured rate, `clamped`).
struct FrontierCurveAt {
  std::string method;
  int group = 0;
  double error = 0;
  bool clamped = false;
};

struct FrontierResult {
  FrontierConfig config;
  ModelPreset preset;  ///< scaled
  std::vector<int> layers;
  int64_t context_chunks = 0, context_tokens = 0, queries = 0;
  int query_stride = 0;  ///< the stride used (FrontierConfig::max_queries)
  std::vector<FrontierPoint> points;
  size_t reference = 0, best = 0, profile = 0;  ///< indices: reference default, descent result, hq profile
  double budget_bpe = 0;
  std::vector<std::string> trace;       ///< the descent's accepted moves, in order
  std::vector<FrontierCurveAt> curves;  ///< every baseline curve at the profile's bits per element
  /// Throughput (elements per second, K and V, best of 3) of the reference and the profile.
  double ref_encode_eps = 0, ref_decode_eps = 0, hq_encode_eps = 0, hq_decode_eps = 0;
  double wall_s = 0;
};

FrontierResult frontier(const FrontierConfig& cfg, const std::function<void(const std::string&)>& progress = {});
std::string frontier_json(const FrontierResult& r, int indent = 2);
/// Scatter chart drawn by render_line_chart: x bits per element, y attention relative
/// error (log scale); the baselines' curves, the Pareto set joined and ringed, the
/// reference default and the hq profile labelled.
std::string frontier_svg(const FrontierResult& r);
std::string frontier_text(const FrontierResult& r);
/// Writes (name, content) files into dir (created if needed), each to a temporary
/// first and renamed once all are written; throws InvalidArgument naming the file.
void write_report_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files);
/// Writes frontier.json, frontier.svg and summary.txt into dir (created if needed).
void write_frontier_report(const FrontierResult& r, const std::string& dir);

/// Warm start measured (issue 16): the context cut into one-chunk spans (the packed
/// cache's default), each span's first k-means stage on K and V, seeded at random and
/// from the previous span's centroids (init warm).
struct WarmStartFigures {
  int64_t groups = 0;                    ///< (span, tensor, head) k-means runs compared
  double random_s = 0;                   ///< time of random init, 2 iterations (the target)
  double warm_s_to_target = 0;           ///< time of warm init, the iterations it needed (runs that reached it)
  double random_s_reached = 0;           ///< random's time over the runs warm reached the target in
  double warm_s_equal_iters = 0;         ///< time of warm init with 2 iterations (all runs)
  double warm_iters_to_target = 0;       ///< mean iterations warm needs to reach random's 2-iteration inertia
  int64_t warm_never = 0;                ///< runs where warm did not reach it within 8 iterations
  double inertia_ratio_equal_iters = 0;  ///< warm / random inertia after 2 iterations each (sums)
  double inertia_ratio_one_iter = 0;     ///< warm after 1 iteration / random after 2
};
WarmStartFigures warm_start_figures(const std::string& model, double scale, int layers, int centroids, int64_t chunks,
                                    uint64_t seed, int threads);

}  // namespace qvg
