// qvg/eval/memory.h — the exact memory model of the packed cache (`qvg memory`).
//
// Everything here is computed from sizes alone, without allocating or encoding
// anything: raw segments cost tokens * H * D * dtype_size for each of K and V, an
// encoded span costs EncodedTensor::predicted_nbytes([1, span_tokens, H, D]) for each
// of K and V (spec 1.5). Three figures per layer (docs/workload.md):
//  - raw context: the context's K and V in the cache dtype (bf16 by default);
//  - fully encoded context: the context encoded as the published runs report it —
//    sink chunks as the sink policy spans them (its leading raw chunks raw; all of
//    them raw with sink = false), the other context tokens cut into spans of the
//    configured number of chunks from the oldest, the last span possibly shorter;
//  - policy peak: the most resident bytes the packed cache of spec 4 reaches over a
//    full period of steady-state streaming, found by replaying spec 4's
//    pack-and-evict on segment sizes (current chunk and keep_recent chunks raw, spans
//    filling, eviction), so it is exact for that policy.
// Ratios are raw / packed. The policy peak is compared with the dense cache holding
// the same window (context + one chunk), which is what the packed cache replaces.
//
// Stream geometry (shared with the workload generator's chunk schedule): the sink
// tokens come first, cut into chunks of chunk_tokens (the last sink chunk shorter if
// the sink is not a whole number of chunks); then chunks of chunk_tokens. The cache
// size and attention window are context_tokens + chunk_tokens. Batch is 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "qvg/cache_options.h"
#include "qvg/config.h"
#include "qvg/tensor.h"

namespace qvg {

/// The settings (their names in the settings table, qvg/settings.h) the model does not
/// take: adaptive span breaks depend on the data, so the model assumes none.
inline constexpr std::string_view kSettingsNotModelled[] = {"span_break_ratio"};

struct ModelPreset;

/// Shapes of one layer's cache and of the stream that fills it.
struct MemoryShape {
  int64_t layers = 1;
  int64_t heads = 1;
  int64_t head_dim = 128;
  int64_t chunk_tokens = 1;    ///< tokens generated per chunk (after the sink)
  int64_t context_tokens = 1;  ///< history a layer holds while a chunk is generated, sink included
  int64_t sink_tokens = 0;     ///< leading tokens never evicted; <= context_tokens
  DType dtype = DType::BF16;   ///< cache dtype (raw segments and codebooks)

  int64_t cache_tokens() const { return context_tokens + chunk_tokens; }
  /// The options of one layer's cache of this shape (batch 1, a window of
  /// cache_tokens(): the context and one chunk, the sink, the dtype; no view scratch).
  CacheOptions cache_options() const;
  /// Number of sink chunks: ceil(sink_tokens / chunk_tokens).
  int64_t sink_chunks() const { return (sink_tokens + chunk_tokens - 1) / chunk_tokens; }
  /// Tokens of chunk i of the stream (see the header comment).
  int64_t chunk_size(int64_t i) const;
  /// Raw K+V bytes of `tokens` tokens.
  size_t raw_bytes(int64_t tokens) const;
  /// Throws InvalidArgument naming the field unless all values are in range.
  void validate() const;

  /// The full-size shapes of a preset; `context_frames` overrides its context
  /// (the sink is then min(sink, context)). InvalidArgument if context_frames < 1.
  static MemoryShape of(const ModelPreset& preset, std::optional<int64_t> context_frames = std::nullopt);
};

/// One segment of a cache layout: raw tokens, one encoded span, or one encoded
/// chunk of an incremental span (span >= 0; its bytes exclude the span's codebooks,
/// which count once per span in the resident totals).
struct SegmentSize {
  int64_t g0 = 0, g1 = 0;  ///< global token range [g0, g1)
  int64_t chunks = 1;      ///< chunks it holds
  bool sink = false;
  bool packed = false;  ///< an encoded span (else raw K and V)
  size_t k_bytes = 0, v_bytes = 0;
  int64_t span = -1;  ///< incremental span id
  /// K + V refinement layers (of the newest encoded chunks), else 0.
  size_t refine_bytes = 0;
  int64_t tokens() const { return g1 - g0; }
  size_t bytes() const { return k_bytes + v_bytes + refine_bytes; }
};

/// The state after one advance (a new chunk) of the replayed policy.
struct PolicyStep {
  int64_t chunk = 0;       ///< index of the chunk just started (the current one)
  int64_t global_end = 0;  ///< tokens generated so far
  size_t resident_bytes = 0;
  size_t raw_bytes = 0;       ///< of which raw segments (current chunk included)
  size_t packed_bytes = 0;    ///< of which encoded spans (incremental spans' codebooks included)
  size_t codebook_bytes = 0;  ///< of which the codebooks of incremental spans (once per span)
  size_t refine_bytes = 0;    ///< of which the refinement layers of the newest encoded chunks
  int64_t raw_tokens = 0, packed_tokens = 0;
  int64_t segments = 0;  ///< current included
};

/// The packed cache's pack-and-evict policy (spec 4) replayed on sizes: the policy
/// the caches run (src/cache/cache_policy.h) with byte counts as the payload.
/// REQUIRES: shape.validate() and args.validate_for_head_dim(head_dim) hold (checked).
class PolicyReplay {
 public:
  PolicyReplay(const MemoryShape& shape, const QuantArgs& args);
  ~PolicyReplay();
  PolicyReplay(PolicyReplay&&) noexcept;
  PolicyReplay& operator=(PolicyReplay&&) noexcept;
  /// Whether an incremental chunk joins the open span when it may (true) or starts
  /// a new span (an adaptive boundary: data-dependent). Called once per incremental
  /// chunk, in encoding order; the answer matters only when the chunk may join
  /// (the open span has room and holds the chunk's predecessor).
  using JoinDecision = std::function<bool()>;
  /// Starts the next chunk (an advance at global_end) and runs pack-and-evict. With
  /// incremental spans, `join` decides the adaptive boundaries (default: none, every
  /// chunk that may join does, as the cache with a break ratio of 0).
  const PolicyStep& advance(const JoinDecision& join = nullptr);
  const std::vector<SegmentSize>& segments() const;  ///< oldest first, current last
  const std::vector<PolicyStep>& steps() const;
  /// Size of an encoded span of `tokens` tokens (K + V).
  size_t span_bytes(int64_t tokens) const;
  /// Incremental spans: the size of one chunk's data (K + V, without codebooks) and
  /// of one span's codebooks (K + V).
  size_t chunk_data_bytes(int64_t tokens) const;
  size_t codebook_bytes() const;
  /// With refinement on: the K + V refinement layers of a chunk of `tokens` tokens.
  size_t refine_bytes(int64_t tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// How the layers of a model hold the views their caches return (the model-level peak).
///  - Shared: one window of view memory for the whole model — the layers' packed caches
///    share one ViewScratch (CacheOptions::view_scratch; qvg.torch does it for every
///    packed cache of a process), or, as the engine's packed cache does, each layer's
///    view is a fresh tensor freed after that layer's attention.
///  - PerLayer: one window per layer — C++ packed caches that each own their scratch
///    (the default without CacheOptions::view_scratch) keep it between calls.
enum class ViewMemory { Shared, PerLayer };

/// What n branches forked from one state hold (MemoryReport::branches; issue 38).
struct BranchesMemory {
  int64_t n = 1;  ///< branches
  // --- per layer, bytes ---
  size_t shared_bytes = 0;  ///< the encoded part, held once by all branches (peak_step.packed_bytes)
  size_t own_bytes = 0;     ///< the raw part, one copy per branch (peak_step.raw_bytes)
  size_t forked_bytes = 0;  ///< shared_bytes + n * own_bytes (MemoryReport::branches_bytes)
  size_t copies_bytes = 0;  ///< n full copies of the packed cache: n * policy_peak_bytes
  size_t dense_bytes = 0;   ///< n dense caches: n * dense_window_bytes
  // --- the model, bytes ---
  size_t model_forked_bytes = 0;  ///< MemoryReport::model_branches_bytes(n)
  size_t model_copies_bytes = 0;  ///< n * model_peak_bytes(ViewMemory::Shared)
  size_t model_dense_bytes = 0;   ///< n * dense_model_bytes()
  /// model_copies_bytes / model_forked_bytes (>= 1: what forking saves over copies).
  double ratio_vs_copies() const;
  /// model_dense_bytes / model_forked_bytes.
  double ratio_vs_dense() const;
};

/// The most branches MemoryReport::branches_bytes and its kin take (keeps the products
/// far from overflowing for every shape MemoryShape::validate accepts in practice).
inline constexpr int64_t kMaxBranches = int64_t(1) << 20;

/// The `qvg memory` figures for one layer and for all layers.
struct MemoryReport {
  MemoryShape shape;
  QuantArgs args;
  // --- per layer, bytes ---
  size_t raw_context_bytes = 0;     ///< context K+V in the cache dtype
  size_t packed_context_bytes = 0;  ///< fully encoded context
  size_t dense_window_bytes = 0;    ///< the dense cache of the same window: (context + chunk) raw
  size_t policy_peak_bytes = 0;     ///< the packed cache's steady-state peak
  /// How the fully encoded context is cut (oldest first).
  std::vector<SegmentSize> context_layout;
  /// Steady state: a replay from an empty cache reaches it after `steady_from`
  /// chunks; over the measured period of `period_chunks` chunks the peak is reached
  /// after chunk `peak_chunk` started.
  int64_t steady_from = 0, period_chunks = 1, peak_chunk = 0;
  /// Chunks actually replayed to find the peak: a long context's peak is extrapolated
  /// exactly from three short replays (a window of a few spans), so this does not
  /// grow with the context (docs/reliability.md).
  int64_t replayed_chunks = 0;
  PolicyStep peak_step;  ///< the state at the peak

  /// One decoded view of the full window (context + chunk, K and V in the cache dtype):
  /// what a packed cache's update() assembles at steady state (decoded spans and raw
  /// chunks copied into one buffer), the size of the dense window.
  size_t view_window_bytes = 0;

  // --- the model: every layer at once (docs/simulate.md, "The model-level peak") ---
  /// The most bytes the whole model's packed caches hold at once between calls (while
  /// a layer attends over its view): every layer's resident bytes at the policy peak
  /// (all layers have the same shapes and reach it at the same chunk) plus the view
  /// memory held at once: one window (ViewMemory::Shared) or one per layer (PerLayer).
  /// A call that encodes holds more while it runs (a span's input and its encodings:
  /// the cache's peak_transient_nbytes()), for the one layer running it.
  size_t model_peak_bytes(ViewMemory views = ViewMemory::Shared) const;
  /// The dense caches of every layer (their views are ranges of their buffers: no copy).
  size_t dense_model_bytes() const { return total(dense_window_bytes); }
  /// dense_model_bytes / model_peak_bytes(views): the headline ratio of `qvg memory`,
  /// `qvg simulate` and the main job.
  double model_peak_ratio(ViewMemory views = ViewMemory::Shared) const;

  // --- branches: n sessions forked from one state (issue 38; docs/simulate.md) ---
  // A packed cache's fork shares the encoded part of its state with its source,
  // immutable and reference-counted (encoded spans, incremental spans' codebooks,
  // refinement layers: peak_step.packed_bytes, which holds all three), and copies the
  // raw part (the current chunk, the keep_recent chunks, raw sink chunks and chunks
  // waiting for their span: peak_step.raw_bytes); resident_bytes = raw + packed. A
  // dense cache's fork is a full copy. The figures are for n branches forked from
  // the state at the policy peak (peak_step), at the fork: every branch encodes its
  // own chunks afterwards and the shared spans slide out of the window, so after one
  // window of chunks the branches hold about n full copies (n * policy_peak_bytes; the
  // encoded sink, never evicted, stays shared). No state
  // of the steady period costs n branches more than the peak state (tests/test_memory.cpp).
  // Every n must be in 1..kMaxBranches (InvalidArgument naming n otherwise).
  /// Per layer: peak_step.packed_bytes once + n * peak_step.raw_bytes;
  /// branches_bytes(1) == policy_peak_bytes.
  size_t branches_bytes(int64_t n) const;
  /// The model: every layer's branches_bytes(n) plus the view memory of n running
  /// branches, each with ViewMemory::Shared (one window per branch: each branch is a
  /// session whose layers share one view); model_branches_bytes(1) ==
  /// model_peak_bytes(ViewMemory::Shared).
  size_t model_branches_bytes(int64_t n) const;
  /// The figures above beside n full copies of the packed cache and n dense caches.
  BranchesMemory branches(int64_t n) const;

  double ratio() const;  ///< raw_context / packed_context
  /// raw_context / policy_peak: bf16 / packed as `qvg memory --json` defines its ratios.
  double policy_ratio() const;
  /// dense_window / policy_peak: against the dense cache holding the same window.
  double policy_ratio_vs_dense_window() const;
  size_t total(size_t per_layer) const { return per_layer * size_t(shape.layers); }
};

/// Computes the report. Throws InvalidArgument for an invalid shape or arguments.
MemoryReport memory_report(const MemoryShape& shape, const QuantArgs& args);

/// bytes / 2^20.
inline double to_mib(size_t bytes) {
  return double(bytes) / double(1 << 20);
}

}  // namespace qvg
