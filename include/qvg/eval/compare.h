// qvg/eval/compare.h — the quantizer comparison behind `qvg compare`.
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

#include "qvg/config.h"
#include "qvg/eval/baselines.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/workload.h"

namespace qvg {

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
  SpanMode spans = SpanMode::Deferred;
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

}  // namespace qvg
