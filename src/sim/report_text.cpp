// The terminal text of the simulation and the comparison (qvg/eval/simulate.h):
// simulation_summary_text and compare_table_text.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/eval/compare.h"
#include "qvg/eval/simulate.h"
#include "sim/report_util.h"
#include "sim/sim_common.h"

namespace qvg {
namespace {

std::string label_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += (i + 1 == v.size()) ? " and " : ", ";
    s += std::to_string(v[i]);
  }
  return s;
}

/// REQUIRES q.enabled() (SimulationConfig::validate's rule for every packed configuration).
std::string describe_quant(const QuantArgs& q) {
  const CodecConfig c = q.codec;
  std::string s = fmt::format(
      "{}-bit residuals, {} centroids, block {}, {} stage{}, {} k-means iteration{}, {} scales ({}), {}", c.bits,
      c.centroids, c.block_size, c.stages, c.stages == 1 ? "" : "s", c.kmeans_iters, c.kmeans_iters == 1 ? "" : "s",
      name(c.scale_dtype), name(c.scaling), c.asymmetric ? "asymmetric" : "symmetric");
  if (c.init != Init::Random) s += fmt::format(", init {}", name(c.init));
  if (c.scale_search != ScaleSearch::Off) s += fmt::format(", scale search {}", name(c.scale_search));
  if (!q.k.empty()) s += ", K: " + q.k.describe("");
  if (!q.v.empty()) s += ", V: " + q.v.describe("");
  return s;
}

/// "3.12x less" for a dense / packed ratio >= 1, else "1.25x more" (its inverse).
std::string less_or_more(double ratio) {
  if (ratio >= 1 || ratio <= 0) return fmt::format("{:.2f}x less", ratio);
  return fmt::format("{:.2f}x more", 1 / ratio);
}

std::string pct(double v) {
  return fmt::format("{:.2f}%", 100.0 * v);
}
std::string db(const std::optional<double>& v) {
  return v ? fmt::format("{:.1f} dB", *v) : std::string("n/a");
}

}  // namespace

// ---------------------------------------------------------------------------
// simulate

std::string simulation_summary_text(const SimulationResult& r) {
  const ModelPreset& p = r.preset;
  const SimulationConfig& c = r.config;
  const auto& a = p.assumed;
  const ModelPreset& full = find_model_preset(c.model);
  std::string o;
  o += "\n== qvg simulate: what was simulated ==\n";
  o += fmt::format("  model    {} — {}{}\n", p.name, p.model,
                   c.scale < 1 ? fmt::format(", scaled x{:g} for a quick run", c.scale) : std::string());
  o += fmt::format(
      "           {}{} layers, {}{} head{} x head_dim {}{}, {} x {} patches{} = {} tokens/frame, "
      "{}{} frames/chunk = {} tokens/chunk\n",
      p.layers, assumed_mark(a.layers), p.heads, assumed_mark(a.heads), p.heads == 1 ? "" : "s", p.head_dim,
      assumed_mark(a.head_dim), p.grid_h, p.grid_w, assumed_mark(a.grid), sim::grouped(p.tokens_per_frame()),
      p.frames_per_chunk, assumed_mark(a.frames_per_chunk), sim::grouped(p.chunk_tokens()));
  const bool ctx_over = c.context_frames && *c.context_frames != full.context_frames;
  const std::string ctx_note = ctx_over ? fmt::format(
                                              " (shortened for a quick run: the model's is {} frames{}; "
                                              "--context-frames to change)",
                                              full.context_frames, assumed_mark(a.context))
                                        : std::string(assumed_mark(a.context));
  const std::string sink = p.sink_frames == 0 ? fmt::format("no sink{}", assumed_mark(a.sink))
                                              : fmt::format("sink {} frames{} = {} tokens", p.sink_frames,
                                                            assumed_mark(a.sink), sim::grouped(p.sink_tokens()));
  o += fmt::format("  cache    context {} frames{} + the current chunk = {} tokens per layer (the window); {}\n",
                   p.context_frames, ctx_note, sim::grouped(p.cache_tokens()), sink);
  o +=
      fmt::format("  stream   {} chunks ({} frames) x {} denoising step{}; layer{} {} of {} simulated; seed {}\n",
                  c.chunks, r.chunks.empty() ? 0 : r.chunks.back().chunk.frame0 + r.chunks.back().chunk.frames, c.steps,
                  c.steps == 1 ? "" : "s", r.layers.size() == 1 ? "" : "s", label_list(r.layers), p.layers, c.seed);
  o += fmt::format("           attention scored for every {}{} query of a chunk ({} per head) at {}\n", c.query_stride,
                   c.query_stride == 1 ? "" : "th", r.chunks.empty() ? 0 : r.chunks.front().queries,
                   c.attention_every_step ? "every step" : "the last (clean) step");
  for (const PackedConfig& pc : c.packed) {
    const QuantArgs& q = pc.quant;
    o += fmt::format("  packed   {}: {}\n", pc.label, describe_quant(q));
    // The cache policy as the settings table names it (docs/spans.md explains each).
    o += fmt::format("           cache policy: {}\n", sim::policy_text(q));
  }

  for (const PackedSummary& s : r.summary) {
    o += fmt::format("\n== results: {} ==\n", s.label);
    const std::string model_what =
        fmt::format("the whole model ({} layers at this scale, one shared view window)", p.layers);
    if (s.first_encoded_chunk < 0) {
      // Nothing encoded yet: the packed cache holds raw chunks only; a ratio would
      // compare the dense cache's up-front allocation with a cache still filling.
      o += fmt::format(
          "  in short: nothing was encoded during {} (a span is encoded once its chunks have "
          "completed beyond the raw ones the policy keeps): the packed cache held raw chunks only, so no "
          "compression was measured yet; the ratios below only compare the dense cache's up-front allocation "
          "with a cache still filling. Stream more chunks (--chunks) to measure one.\n",
          c.chunks == 1 ? std::string("this one chunk") : fmt::format("these {} chunks", c.chunks));
    } else if (s.quality_chunks > 0) {
      o += fmt::format(
          "  in short: {} needed {} memory at its peak than with dense caches ({} vs {}: every layer's packed "
          "cache plus the view it attends over) and changed the attention output by {:.2f}% on average (cosine "
          "{:.5f})\n",
          model_what, less_or_more(s.ratio_model_peak), sim::mib(s.model_peak_bytes), sim::mib(s.model_dense_bytes),
          100 * s.attention.rel_l2(), s.attention.cosine());
    }
    o += fmt::format(
        "  memory   {}: dense caches {} (bf16, allocated up front; their views need no copy); packed {} at the "
        "peak = {} x {} resident + {} of shared view; dense / packed = {:.2f}x{}\n",
        model_what, sim::mib(s.model_dense_bytes), sim::mib(s.model_peak_bytes), p.layers,
        sim::mib(s.packed_peak_bytes), sim::mib(s.view_bytes), s.ratio_model_peak,
        s.first_encoded_chunk < 0 ? " (nothing encoded yet)" : "");
    o += fmt::format("           per layer, resident only: dense cache {}; packed cache {} at its peak -> {:.2f}x",
                     sim::mib(s.dense_bytes), sim::mib(s.packed_peak_bytes), s.ratio_peak);
    if (r.window_full_chunk >= 0) o += fmt::format(" ({:.2f}x on average once the window is full)", s.ratio_full);
    o += "\n";
    if (s.bits_per_element)
      o += fmt::format(
          "           encoded spans cost {:.3f} bits per element (bf16: 16; codebooks, ids and scales "
          "included)\n",
          *s.bits_per_element);
    if (s.full_layers > 0)
      o += fmt::format(
          "           full-size model ({} layers, its {}-frame context, this configuration; the memory model of "
          "`qvg memory`): dense {} -> packed {} (one shared view window included), {:.2f}x; per layer, "
          "resident only: {} -> {}, {:.2f}x\n",
          s.full_layers, full.context_frames, sim::mib(s.full_model_dense_bytes), sim::mib(s.full_model_peak_bytes),
          s.full_ratio_model_peak, sim::mib(s.full_dense_bytes), sim::mib(s.full_policy_peak_bytes),
          s.full_policy_peak_bytes > 0 ? double(s.full_dense_bytes) / double(s.full_policy_peak_bytes) : 0.0);
    o += fmt::format("           measured sizes {} the memory model's prediction at every chunk",
                     s.memory_model_matches ? "equal" : "DIFFER from");
    o += fmt::format("; the {} held at most {} at one instant ({} the memory model's {})\n",
                     r.layers.size() == 1
                         ? std::string("simulated layer's cache and its view")
                         : fmt::format("{} simulated layers' caches and their shared view", r.layers.size()),
                     sim::mib(s.measured_model_peak_bytes), s.model_peak_matches ? "equal to" : "NOT equal to",
                     sim::mib(s.predicted_model_peak_bytes));
    o += fmt::format(
        "           transient: one layer's call holds up to {} beyond its resident bytes while it runs (the view "
        "it builds, a span's encoding buffers): one layer at a time, not per layer\n",
        sim::mib(s.transient_peak_bytes));
    if (s.quality_chunks > 0) {
      o += fmt::format(
          "  quality  attention output vs the dense cache: {} relative error, cosine {:.5f} (worst chunk "
          "{}, lowest single-vector cosine {:.4f})\n",
          pct(s.attention.rel_l2()), s.attention.cosine(), pct(s.worst_attention_rel_l2), s.attention.cos_min);
      o += fmt::format(
          "           encoded tokens of the window: K SNR {}, V SNR {} (relative MSE {:.2e} / {:.2e}); "
          "over {} chunks whose window held encoded tokens\n",
          db(s.k.snr_db()), db(s.v.snr_db()), s.k.rel_mse().value_or(0), s.v.rel_mse().value_or(0), s.quality_chunks);
    } else {
      o += "  quality  no encoded token was visible during the run (too few chunks for a full span beyond the raw "
           "ones kept): packed and dense views were identical\n";
    }
    o += fmt::format(
        "  time     per layer: {:.4f} s per denoising step (the chunk's encoding spread over its {} step{} + one "
        "view reconstruction); encoding {:.4f} s per chunk encoded ({} span{}), view reconstruction {:.4f} s per "
        "step, reference attention {:.3f} s per chunk\n",
        s.step_s, c.steps, c.steps == 1 ? "" : "s", s.encode_s_per_chunk, s.spans, s.spans == 1 ? "" : "s",
        s.decode_s_per_step, s.attention_s_per_chunk);
  }
  if (r.summary.size() > 1) {
    // Side by side, each against the first configuration (`--engine-baseline` puts the
    // engine's default first): the full-size model-level peak, the time per step and
    // the attention error.
    const PackedSummary& b = r.summary.front();
    auto vs = [](double x, double base) { return base > 0 ? fmt::format("({:.2f}x)", x / base) : std::string("(-)"); };
    o += fmt::format(
        "\n== side by side (against {}; the ratio in parentheses is each figure over {}'s) ==\n"
        "  peak: the full-size model's dense caches over its packed caches plus one shared view window (higher is "
        "better); time: per layer and denoising step, encoding amortised + view reconstruction (lower is better); "
        "error: attention output vs the dense cache (lower is better)\n",
        b.label, b.label);
    o += fmt::format("  {:<20} {:>18} {:>22} {:>20}\n", "configuration", "peak ratio", "time per step",
                     "attention error");
    for (const PackedSummary& s : r.summary) {
      const double e = s.attention.rel_l2(), be = b.attention.rel_l2();
      const bool q = s.quality_chunks > 0 && b.quality_chunks > 0;
      o += fmt::format("  {:<20} {:>10} {:>7} {:>13} {:>8} {:>11} {:>8}\n", s.label,
                       s.full_layers > 0 ? fmt::format("{:.2f}x", s.full_ratio_model_peak) : std::string("-"),
                       s.full_layers > 0 && b.full_layers > 0 ? vs(s.full_ratio_model_peak, b.full_ratio_model_peak)
                                                              : std::string("(-)"),
                       fmt::format("{:.2f} ms", 1e3 * s.step_s), vs(s.step_s, b.step_s),
                       s.quality_chunks > 0 ? pct(e) : "-", q ? vs(e, be) : std::string("(-)"));
    }
  }
  const double per_chunk = r.chunks.empty() ? 0 : r.wall_s / double(r.chunks.size());
  o += fmt::format(
      "\n  run      wall time {:.1f} s ({:.2f} s per chunk for {} layer{} and {} configuration{}, "
      "including the scoring)\n",
      r.wall_s, per_chunk, r.layers.size(), r.layers.size() == 1 ? "" : "s", c.packed.size(),
      c.packed.size() == 1 ? "" : "s");
  o += "\n  How to read it: the packed cache holds the same window as the dense one in the memory shown; the smaller "
       "the attention error (and the closer the cosine to 1), the less the model's output can change — errors of a "
       "few percent with cosine above 0.999 mean the model sees nearly the same context.\n";
  o += "  (a) = an assumption where the public material is silent (docs/workload.md); MiB = 2^20 bytes.\n";
  return o;
}

// ---------------------------------------------------------------------------
// compare

std::string compare_table_text(const CompareResult& r) {
  const ModelPreset& p = r.preset;
  const CodecConfig& cc = r.config.codec;
  const auto& a = p.assumed;
  std::string o;
  o += fmt::format("qvg compare: {} — {}{}\n", p.name, p.model,
                   r.config.scale < 1 ? fmt::format(", scaled x{:g}", r.config.scale) : std::string());
  o += fmt::format("  workload  {}{} heads x head_dim {}{}, {}{} tokens/chunk; layer{} {} of {}; seed {}\n", p.heads,
                   assumed_mark(a.heads), p.head_dim, assumed_mark(a.head_dim), sim::grouped(p.chunk_tokens()),
                   assumed_mark(a.frames_per_chunk || a.grid), r.layers.size() == 1 ? "" : "s", label_list(r.layers),
                   p.layers, r.config.seed);
  o += fmt::format(
      "  context   {} chunks = {} tokens quantized by each method (qvg: one span, {:.3f} bits/element of "
      "codebooks = {} x 16 bits / {} tokens)\n",
      r.context_chunks, sim::grouped(r.context_tokens),
      double(cc.centroids) * 16.0 * double(cc.stages) / double(r.context_tokens), cc.centroids,
      sim::grouped(r.context_tokens));
  o += fmt::format(
      "  queries   {} of the next chunk (every {}{} token, all heads) attend over the context + the next "
      "chunk (raw)\n",
      r.queries, r.config.query_stride, r.config.query_stride == 1 ? "" : "th");
  o += fmt::format(
      "  all methods: {}-bit codes, block {}; qvg {} centroids, {} stage{}, {} iters, {} scales ({}); "
      "kivi K per channel over {}-token groups, V per token\n\n",
      cc.bits, cc.block_size, cc.centroids, cc.stages, cc.stages == 1 ? "" : "s", cc.kmeans_iters, name(cc.scale_dtype),
      name(cc.scaling), cc.block_size);
  o += fmt::format("  {:<8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>11} {:>9}\n", "method", "bits/elem", "ratio", "K SNR",
                   "V SNR", "KV SNR", "attn error", "cosine");
  auto snr = [](const std::optional<double>& v) { return v ? fmt::format("{:.2f}", *v) : std::string("inf"); };
  for (const CompareRow& row : r.rows)
    o += fmt::format("  {:<8} {:>10.3f} {:>7.2f}x {:>9} {:>9} {:>9} {:>10.3f}% {:>9.5f}\n", row.method,
                     row.bits_per_element, row.ratio, snr(row.k.snr_db()), snr(row.v.snr_db()), snr(sim::kv_snr(row)),
                     100.0 * row.attention.rel_l2(), row.attention.cosine());
  o += "\n  bits/elem: everything stored for K and V (codes, scales, zeros, codebooks, ids) per element; ratio = 16 / "
       "bits (vs bf16).\n"
       "  SNR in dB over the context = -10 log10(||X - X'||^2 / ||X||^2); KV SNR uses the mean of the K and V relative "
       "MSEs.\n"
       "  attn error = ||O' - O|| / ||O|| of the attention outputs (pooled over queries, heads and layers); cosine = "
       "mean over (query, head) vectors.\n";
  if (a.k_norm || a.v_norm || a.v_wall || a.magnitude)
    o += "  (a) = an assumption where the public material is silent (docs/workload.md).\n";
  return o;
}

}  // namespace qvg
