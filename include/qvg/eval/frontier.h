// qvg/eval/frontier.h — the rate-distortion frontier behind `qvg compare --frontier`
// (docs/quality.md) and the warm-start figures.
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
#include "qvg/eval/compare.h"

namespace qvg {

// ---------------------------------------------------------------------------
// frontier(): the rate-distortion frontier (docs/quality.md). qvg
// configurations (per-role codec settings and span length) and the baselines at
// several rates, scored on the same context as compare(): bits per element (every
// stored byte), attention relative L2 error of the next chunk's queries, K/V SNR.
//
// Search strategy (stated, deterministic): coordinate descent from the reference
// default (reference_codec()). A round visits the knobs in a fixed order; for each,
// every value is evaluated with the other knobs at the current configuration, and the
// one of least attention error within the budget (the reference's bits per element
// + bpe_slack) is kept. Rounds repeat until one changes nothing (at most max_rounds).
// Then a ladder of rates around the result (every code width x centroids 64/256), the hq
// profile and the baselines (RTN, KIVI-style, QuaRot-style at 2, 3 and 4 bits, groups
// of 32 and 64) are evaluated. Every evaluated point is reported; the Pareto set
// (no other point has both fewer bits and less error) is marked.

/// One qvg configuration: K's and V's codec settings and the span length.
struct FrontierCodec {
  CodecConfig k, v;
  int chunks_per_span = 0;  ///< chunks per span (each its own codebook), oldest first; 0 = the whole context
  /// 0, or 2 / 4: every chunk of the context also gets a refinement layer of that width
  /// over its span's decoding (encode_refinement with refinement_config(refinement_layer_bits,
  /// the role's block size, seed, threads); the packed cache's layers, docs/spans.md,
  /// given to every chunk): the rates above the codec's own.
  int refinement_layer_bits = 0;
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
  std::string stage;        ///< "reference" | "descent" | "ladder" | "profile" | "range" | "baseline"
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

/// Warm start measured (docs/quality.md, "Warm start"): the context cut into one-chunk
/// spans (the packed cache's default), each span's first k-means stage on K and V,
/// seeded at random and from the previous span's centroids (init warm).
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
