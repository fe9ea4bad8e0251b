// src/sim/sim_common.h — helpers shared by the simulation, the comparison and their
// reports (internal; not part of the public API).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/cache.h"
#include "qvg/error.h"
#include "qvg/eval/compare.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/frontier.h"
#include "qvg/eval/simulate.h"
#include "qvg/eval/workload.h"
#include "qvg/tensor.h"

namespace qvg::sim {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Rows 0, stride, 2*stride, ... of x ([1, n, H, D]) as a new dense tensor of x's dtype.
/// REQUIRES stride >= 1, x.shape.b == 1 (checked).
Tensor subsample_tokens(ConstTensorView x, int64_t stride);

/// [a ++ b] along tokens (both [1, *, H, D], same H, D and dtype; checked).
Tensor concat_tokens(ConstTensorView a, ConstTensorView b);

/// The reconstruction error of y against x (same shape; checked), element by element
/// in double; tokens = B x S.
ErrorSums tensor_error(ConstTensorView x, ConstTensorView y);

/// One layer of a scored context (compare, frontier): the context's K/V [1, S, H, D],
/// the next chunk's K/V, the next chunk's queries (every query_stride-th token) and
/// their exact attention output over [context ++ next chunk].
struct ScoredLayer {
  Tensor k, v;
  Tensor k_cur, v_cur;
  Tensor q, ref;
};
struct ScoredContext {
  std::vector<ScoredLayer> layers;  ///< in the order of the layers asked for
  int64_t queries = 0;              ///< queries per layer
  double elements = 0;              ///< K and V elements of the context over all layers
};
/// The first ctx_frames frames of each layer of `w` as the context, the chunk after them
/// as the next one (generated deterministically by the workload).
ScoredContext scored_context(const Workload& w, const std::vector<int>& layers, int64_t ctx_frames,
                             int64_t query_stride, int threads);

/// The checks shared by CompareConfig and FrontierConfig (model, scale, context_chunks,
/// layers, query_stride, threads; InvalidArgument naming the field); returns the scaled
/// preset.
template <class Config>
ModelPreset validate_context_config(const Config& c) {
  const ModelPreset& base = find_model_preset(c.model);
  if (!(c.scale > 0 && c.scale <= 1)) throw InvalidArgument(fmt::format("scale must be in (0, 1], got {}", c.scale));
  const ModelPreset p = base.scaled(c.scale);
  if (c.context_chunks && (*c.context_chunks < 1 || *c.context_chunks > 1000))
    throw InvalidArgument(fmt::format("context_chunks must be in 1..1000, got {}", *c.context_chunks));
  if (c.layers < 1 || c.layers > p.layers)
    throw InvalidArgument(fmt::format("layers must be in 1..{} (the layers of {} at scale {}), got {}", p.layers,
                                      p.name, c.scale, c.layers));
  if (c.query_stride < 1) throw InvalidArgument(fmt::format("query_stride must be >= 1, got {}", c.query_stride));
  check_threads("threads", c.threads);
  return p;
}

/// The workload of a one-context report (CompareResult, FrontierResult) with the
/// result's shared fields filled: config, preset (scaled), layers, context_chunks
/// (cfg.context_chunks, else the fewest chunks holding 64 x `centroids` tokens) and
/// context_tokens. REQUIRES cfg validated.
template <class Result, class Config>
Workload open_context(const Config& cfg, Result& res, int centroids) {
  WorkloadOptions wo;
  wo.scale = cfg.scale;
  wo.seed = cfg.seed;
  wo.threads = cfg.threads;
  Workload w(find_model_preset(cfg.model), wo);
  res.config = cfg;
  res.preset = w.preset();
  res.layers = select_layers(res.preset.layers, cfg.layers);
  res.context_chunks = cfg.context_chunks.value_or(default_context_chunks(res.preset, centroids));
  res.context_tokens = res.context_chunks * res.preset.frames_per_chunk * res.preset.tokens_per_frame();
  return w;
}

/// 1234567 -> "1,234,567".
std::string grouped(int64_t v);
/// bytes as "12.34 MiB" (2^20), or "1,234.5 MiB" from 1000 MiB on.
std::string mib(size_t bytes);

}  // namespace qvg::sim
