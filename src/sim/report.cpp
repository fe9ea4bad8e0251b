// Reports of the simulation and the comparison (qvg/simulate.h): JSON, terminal
// text, SVG charts, and the --report directory.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "qvg/error.h"
#include "qvg/simulate.h"
#include "sim/sim_common.h"

namespace qvg {
namespace {

using ojson = nlohmann::ordered_json;

ojson num(double v) {
  return std::isfinite(v) ? ojson(v) : ojson();
}
ojson num(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? ojson(*v) : ojson();
}

std::vector<std::string> assumed_fields(const PresetAssumptions& a) {
  std::vector<std::string> v;
  auto add = [&](bool b, const char* n) {
    if (b) v.push_back(n);
  };
  add(a.layers, "layers");
  add(a.heads, "heads");
  add(a.head_dim, "head_dim");
  add(a.grid, "grid");
  add(a.frames_per_chunk, "frames_per_chunk");
  add(a.context, "context");
  add(a.sink, "sink");
  add(a.rope, "rope");
  add(a.k_wall, "k_wall_ratio");
  add(a.k_norm, "k_norm_spread");
  add(a.v_wall, "v_wall_ratio");
  add(a.v_norm, "v_norm_spread");
  add(a.magnitude, "magnitude");
  return v;
}

ojson quant_json(const std::string& label, const QuantArgs& q) {
  ojson j;
  j["label"] = label;
  j["bits"] = q.bits ? ojson(*q.bits) : ojson();
  j["centroids"] = q.centroids;
  j["block_size"] = q.block_size;
  j["stages"] = q.stages;
  j["kmeans_iters"] = q.kmeans_iters;
  j["asymmetric"] = q.asymmetric;
  j["scale_dtype"] = std::string(name(q.scale_dtype));
  j["scaling"] = std::string(name(q.scaling));
  j["init"] = std::string(name(q.init));
  j["seed"] = q.seed;
  j["span_chunks"] = q.span_chunks;
  j["keep_recent_chunks"] = q.keep_recent_chunks;
  j["sink"] = q.sink;
  j["sink_span"] = std::string(name(q.sink_span));
  j["sink_keep_chunks"] = q.sink_keep_chunks;
  return j;
}

ojson packed_json(const std::string& label, size_t dense_bytes, const PackedLayerRecord& p, double layers) {
  ojson j;
  j["label"] = label;
  j["resident_bytes"] = p.resident_bytes;
  j["predicted_resident_bytes"] = p.predicted_resident_bytes ? ojson(*p.predicted_resident_bytes) : ojson();
  j["compression_ratio"] = p.resident_bytes > 0 ? num(double(dense_bytes) / double(p.resident_bytes)) : ojson();
  j["transient_peak_bytes"] = p.transient_peak_bytes;
  j["encoded_tokens"] = p.encoded_tokens;
  j["encoded_visible_tokens"] = p.encoded_visible;
  j["encoded_bytes"] = p.encoded_bytes;
  j["spans_encoded"] = p.spans_encoded;
  j["k_rel_mse"] = num(p.k.rel_mse());
  j["k_snr_db"] = num(p.k.snr_db());
  j["v_rel_mse"] = num(p.v.rel_mse());
  j["v_snr_db"] = num(p.v.snr_db());
  j["attention_rel_l2"] = num(p.attention.rel_l2());
  j["attention_cosine"] = num(p.attention.cosine());
  j["attention_min_cosine"] = p.attention.vectors > 0 ? num(p.attention.cos_min) : ojson();
  j["encode_s"] = num(p.encode_s / layers);
  j["decode_s"] = num(p.decode_s / layers);
  j["attention_s"] = num(p.attention_s / layers);
  return j;
}

/// The chunk-level aggregate of configuration j: bytes and times are means over
/// the layers, token counts per layer (mean), errors pooled.
PackedLayerRecord pooled(const ChunkRecord& c, size_t j) {
  PackedLayerRecord a;
  const size_t n = c.layers.size();
  double res = 0, enc_b = 0, enc_t = 0, vis = 0, tr = 0;
  std::optional<double> pred = 0.0;
  int spans = 0;
  for (const LayerRecord& l : c.layers) {
    const PackedLayerRecord& p = l.packed[j];
    res += double(p.resident_bytes);
    enc_b += double(p.encoded_bytes);
    enc_t += double(p.encoded_tokens);
    vis += double(p.encoded_visible);
    tr = std::max(tr, double(p.transient_peak_bytes));
    if (pred && p.predicted_resident_bytes)
      *pred += double(*p.predicted_resident_bytes);
    else
      pred.reset();
    spans = std::max(spans, p.spans_encoded);
    a.k.add(p.k);
    a.v.add(p.v);
    a.attention.add(p.attention);
    a.encode_s += p.encode_s;
    a.decode_s += p.decode_s;
    a.attention_s += p.attention_s;
  }
  const double dn = double(std::max<size_t>(1, n));
  a.resident_bytes = size_t(std::llround(res / dn));
  a.encoded_bytes = size_t(std::llround(enc_b / dn));
  a.encoded_tokens = int64_t(std::llround(enc_t / dn));
  a.encoded_visible = int64_t(std::llround(vis / dn));
  a.transient_peak_bytes = size_t(tr);
  if (pred) a.predicted_resident_bytes = size_t(std::llround(*pred / dn));
  a.spans_encoded = spans;
  return a;
}

ojson dense_json(size_t resident, size_t transient, double update_s, double attention_s, double generate_s) {
  ojson j;
  j["resident_bytes"] = resident;
  j["transient_peak_bytes"] = transient;
  j["update_s"] = num(update_s);
  j["attention_s"] = num(attention_s);
  j["generate_s"] = num(generate_s);
  return j;
}

std::string label_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += (i + 1 == v.size()) ? " and " : ", ";
    s += std::to_string(v[i]);
  }
  return s;
}

std::string describe_quant(const QuantArgs& q) {
  std::string s = fmt::format(
      "{}-bit residuals, {} centroids, block {}, {} stage{}, {} k-means iteration{}, {} scales ({}), {}",
      q.bits.value_or(0), q.centroids, q.block_size, q.stages, q.stages == 1 ? "" : "s", q.kmeans_iters,
      q.kmeans_iters == 1 ? "" : "s", name(q.scale_dtype), name(q.scaling), q.asymmetric ? "asymmetric" : "symmetric");
  if (q.init != Init::Random) s += fmt::format(", init {}", name(q.init));
  return s;
}

std::string pct(double v) {
  return fmt::format("{:.2f}%", 100.0 * v);
}
std::string db(const std::optional<double>& v) {
  return v ? fmt::format("{:.1f} dB", *v) : std::string("n/a");
}

const char* kPalette[] = {"#1f6fb4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"};
const char* color_of(size_t j) {
  return kPalette[j % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::string preset_line(const ModelPreset& p, double scale) {
  const auto& a = p.assumed;
  return fmt::format("{} x{:g} · {}{} head{} x {}{} · {}{} tokens/chunk", p.name, scale, p.heads, assumed_mark(a.heads),
                     p.heads == 1 ? "" : "s", p.head_dim, assumed_mark(a.head_dim), sim::grouped(p.chunk_tokens()),
                     assumed_mark(a.frames_per_chunk || a.grid));
}

}  // namespace

// ---------------------------------------------------------------------------
// simulate: JSON

std::string simulation_json(const SimulationResult& r, int indent) {
  const ModelPreset& p = r.preset;
  const SimulationConfig& c = r.config;
  ojson j;
  j["format"] = "qvg.simulate/1";
  j["generator"] = "qvg 0.1.0";
  ojson w;
  w["model"] = p.name;
  w["description"] = p.model;
  w["scale"] = c.scale;
  w["seed"] = c.seed;
  w["layers_total"] = p.layers;
  w["layers_simulated"] = r.layers;
  w["heads"] = p.heads;
  w["head_dim"] = p.head_dim;
  w["grid"] = {p.grid_h, p.grid_w};
  w["tokens_per_frame"] = p.tokens_per_frame();
  w["frames_per_chunk"] = p.frames_per_chunk;
  w["chunk_tokens"] = p.chunk_tokens();
  w["context_frames"] = p.context_frames;
  w["context_frames_overridden"] =
      c.context_frames.has_value() && *c.context_frames != find_model_preset(c.model).context_frames;
  w["context_tokens"] = p.context_tokens();
  w["sink_frames"] = p.sink_frames;
  w["sink_tokens"] = p.sink_tokens();
  w["cache_tokens"] = p.cache_tokens();
  w["assumed"] = assumed_fields(p.assumed);
  j["workload"] = w;

  ojson run;
  run["chunks"] = c.chunks;
  run["steps"] = c.steps;
  run["step_noise"] = c.step_noise;
  run["query_stride"] = c.query_stride;
  run["queries_per_chunk"] = r.chunks.empty() ? 0 : r.chunks.front().queries;
  run["attention_steps"] = c.attention_every_step ? "all" : "last";
  run["threads"] = c.threads;
  run["window_full_chunk"] = r.window_full_chunk >= 0 ? ojson(r.window_full_chunk) : ojson();
  run["wall_s"] = num(r.wall_s);
  j["run"] = run;

  ojson cfgs = ojson::array();
  for (const PackedConfig& pc : c.packed) cfgs.push_back(quant_json(pc.label, pc.quant));
  j["configs"] = cfgs;

  ojson chunks = ojson::array();
  for (const ChunkRecord& ch : r.chunks) {
    ojson cj;
    cj["index"] = ch.chunk.index;
    cj["frame0"] = ch.chunk.frame0;
    cj["frames"] = ch.chunk.frames;
    cj["token0"] = ch.chunk.token0;
    cj["tokens"] = ch.chunk.tokens;
    cj["sink"] = ch.chunk.sink;
    cj["global_end"] = ch.global_end;
    cj["window_tokens"] = ch.window_tokens;
    cj["queries"] = ch.queries;
    cj["wall_s"] = num(ch.wall_s);
    const double nl = double(std::max<size_t>(1, ch.layers.size()));
    size_t dres = 0, dtr = 0;
    double du = 0, da = 0, dg = 0;
    for (const LayerRecord& l : ch.layers) {
      dres = std::max(dres, l.dense_resident_bytes);
      dtr = std::max(dtr, l.dense_transient_peak_bytes);
      du += l.dense_update_s;
      da += l.dense_attention_s;
      dg += l.generate_s;
    }
    cj["dense"] = dense_json(dres, dtr, du / nl, da / nl, dg / nl);
    ojson packed = ojson::array();
    for (size_t k = 0; k < c.packed.size(); ++k) {
      const PackedLayerRecord a = pooled(ch, k);
      packed.push_back(packed_json(c.packed[k].label, dres, a, nl));
    }
    cj["packed"] = packed;
    ojson layers = ojson::array();
    for (const LayerRecord& l : ch.layers) {
      ojson lj;
      lj["layer"] = l.layer;
      lj["window_tokens"] = l.window_tokens;
      lj["dense"] = dense_json(l.dense_resident_bytes, l.dense_transient_peak_bytes, l.dense_update_s,
                               l.dense_attention_s, l.generate_s);
      ojson lp = ojson::array();
      for (size_t k = 0; k < c.packed.size(); ++k)
        lp.push_back(packed_json(c.packed[k].label, l.dense_resident_bytes, l.packed[k], 1.0));
      lj["packed"] = lp;
      layers.push_back(lj);
    }
    cj["layers"] = layers;
    chunks.push_back(cj);
  }
  j["chunks"] = chunks;

  ojson sum = ojson::array();
  for (const PackedSummary& s : r.summary) {
    ojson sj;
    sj["label"] = s.label;
    sj["dense_bytes"] = s.dense_bytes;
    sj["packed_last_bytes"] = s.packed_last_bytes;
    sj["packed_peak_bytes"] = s.packed_peak_bytes;
    sj["packed_mean_full_bytes"] = s.packed_mean_full_bytes;
    sj["transient_peak_bytes"] = s.transient_peak_bytes;
    sj["ratio_peak"] = num(s.ratio_peak);
    sj["ratio_full"] = num(s.ratio_full);
    sj["bits_per_element"] = num(s.bits_per_element);
    sj["k_rel_mse"] = num(s.k.rel_mse());
    sj["k_snr_db"] = num(s.k.snr_db());
    sj["v_rel_mse"] = num(s.v.rel_mse());
    sj["v_snr_db"] = num(s.v.snr_db());
    sj["attention_rel_l2"] = num(s.attention.rel_l2());
    sj["attention_cosine"] = num(s.attention.cosine());
    sj["attention_min_cosine"] = s.attention.vectors > 0 ? num(s.attention.cos_min) : ojson();
    sj["worst_attention_rel_l2"] = num(s.worst_attention_rel_l2);
    sj["quality_chunks"] = s.quality_chunks;
    sj["spans"] = s.spans;
    sj["encode_s_per_span"] = num(s.encode_s_per_span);
    sj["decode_s_per_step"] = num(s.decode_s_per_step);
    sj["attention_s_per_chunk"] = num(s.attention_s_per_chunk);
    sj["memory_model_matches"] = s.memory_model_matches;
    if (s.full_layers > 0) {
      ojson f;
      f["layers"] = s.full_layers;
      f["dense_bytes_per_layer"] = s.full_dense_bytes;
      f["policy_peak_bytes_per_layer"] = s.full_policy_peak_bytes;
      f["ratio"] =
          s.full_policy_peak_bytes > 0 ? num(double(s.full_dense_bytes) / double(s.full_policy_peak_bytes)) : ojson();
      sj["full_size"] = f;
    } else {
      sj["full_size"] = ojson();
    }
    sum.push_back(sj);
  }
  j["summary"] = sum;
  return j.dump(indent);
}

// ---------------------------------------------------------------------------
// simulate: terminal summary

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
    o += fmt::format(
        "           spans of {} chunk{} share a codebook; the current chunk and the newest {} completed "
        "chunk{} stay bf16{}\n",
        q.span_chunks, q.span_chunks == 1 ? "" : "s", q.keep_recent_chunks, q.keep_recent_chunks == 1 ? "" : "s",
        p.sink_frames > 0 ? fmt::format("; sink {} (sink_span {})", q.sink ? "packed" : "kept raw", name(q.sink_span))
                          : std::string());
  }

  for (const PackedSummary& s : r.summary) {
    o += fmt::format("\n== results: {} ==\n", s.label);
    if (s.quality_chunks > 0)
      o += fmt::format(
          "  in short: the packed cache needed {:.1f}x less memory than the dense cache at its peak ({} vs {} "
          "per layer) and changed the attention output by {:.2f}% on average (cosine {:.5f})\n",
          s.ratio_peak, sim::mib(s.packed_peak_bytes), sim::mib(s.dense_bytes), 100 * s.attention.rel_l2(),
          s.attention.cosine());
    o += fmt::format(
        "  memory   dense cache {} per layer (bf16, allocated up front); packed cache {} at its peak "
        "-> {:.2f}x smaller",
        sim::mib(s.dense_bytes), sim::mib(s.packed_peak_bytes), s.ratio_peak);
    if (r.window_full_chunk >= 0) o += fmt::format(" ({:.2f}x on average once the window is full)", s.ratio_full);
    o += "\n";
    o += fmt::format("           all {} layers at this scale: {} -> {} (saves {})\n", p.layers,
                     sim::mib(s.dense_bytes * size_t(p.layers)), sim::mib(s.packed_peak_bytes * size_t(p.layers)),
                     sim::mib((s.dense_bytes - std::min(s.dense_bytes, s.packed_peak_bytes)) * size_t(p.layers)));
    if (s.bits_per_element)
      o += fmt::format(
          "           encoded spans cost {:.3f} bits per element (bf16: 16; codebooks, ids and scales "
          "included)\n",
          *s.bits_per_element);
    if (s.full_layers > 0)
      o += fmt::format(
          "           full-size model ({} layers, its {}-frame context, this configuration; the memory "
          "model of `qvg memory`): {} -> {} per layer, {:.2f}x\n",
          s.full_layers, full.context_frames, sim::mib(s.full_dense_bytes), sim::mib(s.full_policy_peak_bytes),
          s.full_policy_peak_bytes > 0 ? double(s.full_dense_bytes) / double(s.full_policy_peak_bytes) : 0.0);
    o += fmt::format("           measured sizes {} the memory model's prediction at every chunk\n",
                     s.memory_model_matches ? "equal" : "DIFFER from");
    o += fmt::format(
        "           transient: up to {} per layer beyond the resident bytes while a call runs (the "
        "decoded bf16 view, encoding buffers)\n",
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
      o += "  quality  no span was encoded during the run (too few chunks for a full span beyond keep_recent): "
           "packed and dense views were identical\n";
    }
    o += fmt::format(
        "  time     per layer: encoding {:.3f} s per span ({} span{}), view reconstruction {:.4f} s per "
        "step, reference attention {:.3f} s per chunk\n",
        s.encode_s_per_span, s.spans, s.spans == 1 ? "" : "s", s.decode_s_per_step, s.attention_s_per_chunk);
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
// simulate: charts

std::string memory_chart_svg(const SimulationResult& r) {
  LineChart ch;
  ch.title = "K/V cache memory per layer: dense vs packed";
  const ModelPreset& p = r.preset;
  std::string cfgs;
  for (const PackedConfig& pc : r.config.packed) {
    if (!cfgs.empty()) cfgs += "; ";
    cfgs += fmt::format("{}: {} centroids, block {}, spans of {} chunks", pc.label, pc.quant.centroids,
                        pc.quant.block_size, pc.quant.span_chunks);
  }
  ch.subtitle =
      fmt::format("{} · window {} tokens · {}", preset_line(p, r.config.scale), sim::grouped(p.cache_tokens()), cfgs);
  ch.x_label = fmt::format("chunk ({} frames = {} tokens each)", p.frames_per_chunk, sim::grouped(p.chunk_tokens()));
  ch.y_label = "resident MiB per layer";
  const double MiB = double(1 << 20);
  ChartSeries dense;
  dense.name = "dense cache (bf16)";
  dense.color = "#444444";
  dense.steps = true;
  dense.width = 2.5;
  std::vector<ChartSeries> packed(r.config.packed.size()), trans(r.config.packed.size());
  for (size_t j = 0; j < packed.size(); ++j) {
    packed[j].name = "packed " + r.config.packed[j].label;
    packed[j].color = color_of(j);
    packed[j].steps = true;
    packed[j].width = 2.5;
    trans[j].name = "packed " + r.config.packed[j].label + " + transient peak of a call (decoded bf16 view)";
    trans[j].color = color_of(j);
    trans[j].steps = true;
    trans[j].dashed = true;
    trans[j].width = 1.5;
    trans[j].opacity = 0.55;
  }
  for (const ChunkRecord& c : r.chunks) {
    if (c.layers.empty()) continue;
    const double x = double(c.chunk.index);
    dense.x.push_back(x);
    dense.y.push_back(double(c.layers.front().dense_resident_bytes) / MiB);
    for (size_t j = 0; j < packed.size(); ++j) {
      const PackedLayerRecord a = pooled(c, j);
      packed[j].x.push_back(x);
      packed[j].y.push_back(double(a.resident_bytes) / MiB);
      trans[j].x.push_back(x);
      trans[j].y.push_back(double(a.resident_bytes + a.transient_peak_bytes) / MiB);
    }
  }
  ch.series.push_back(dense);
  for (size_t j = 0; j < packed.size(); ++j) ch.series.push_back(packed[j]);
  for (size_t j = 0; j < packed.size(); ++j) ch.series.push_back(trans[j]);
  if (r.window_full_chunk >= 0) ch.markers.push_back({double(r.window_full_chunk), "window full"});
  for (const PackedSummary& s : r.summary)
    ch.note += fmt::format("{}{}: peak {} vs dense {} (dense / packed = {:.2f}x)", ch.note.empty() ? "" : ";  ",
                           s.label, sim::mib(s.packed_peak_bytes), sim::mib(s.dense_bytes), s.ratio_peak);
  return render_line_chart(ch);
}

std::string attention_chart_svg(const SimulationResult& r) {
  LineChart ch;
  ch.title = "Attention output error: packed view vs dense view";
  const ModelPreset& p = r.preset;
  ch.subtitle = fmt::format("{} · {} queries per chunk and head (every {}{}) · relative L2 error, pooled over heads",
                            preset_line(p, r.config.scale), r.chunks.empty() ? 0 : r.chunks.front().queries,
                            r.config.query_stride, r.config.query_stride == 1 ? "" : "th");
  ch.x_label = fmt::format("chunk ({} frames = {} tokens each)", p.frames_per_chunk, sim::grouped(p.chunk_tokens()));
  ch.y_label = "attention relative error (%)";
  const size_t ncfg = r.config.packed.size();
  // Per-layer lines (thin) when there is one configuration and several layers.
  if (ncfg == 1 && r.layers.size() > 1) {
    static const char* shades[] = {"#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#c7c7c7"};
    for (size_t li = 0; li < r.layers.size(); ++li) {
      ChartSeries s;
      s.name = fmt::format("layer {}", r.layers[li]);
      s.color = shades[li % 6];
      s.width = 1.5;
      for (const ChunkRecord& c : r.chunks) {
        if (li >= c.layers.size()) continue;
        s.x.push_back(double(c.chunk.index));
        s.y.push_back(100.0 * c.layers[li].packed[0].attention.rel_l2());
      }
      ch.series.push_back(s);
    }
  }
  for (size_t j = 0; j < ncfg; ++j) {
    ChartSeries s;
    s.name = r.config.packed[j].label + (r.layers.size() > 1 ? " (all simulated layers)" : "");
    s.color = color_of(j);
    s.width = 2.5;
    s.markers = true;
    for (const ChunkRecord& c : r.chunks) {
      if (c.layers.empty()) continue;
      s.x.push_back(double(c.chunk.index));
      s.y.push_back(100.0 * pooled(c, j).attention.rel_l2());
    }
    ch.series.push_back(s);
  }
  // The first chunk whose view held encoded tokens (any configuration).
  for (const ChunkRecord& c : r.chunks) {
    bool enc = false;
    for (size_t j = 0; j < ncfg && !enc; ++j) enc = pooled(c, j).encoded_visible > 0;
    if (enc) {
      ch.markers.push_back({double(c.chunk.index), "first span encoded"});
      break;
    }
  }
  if (r.window_full_chunk >= 0) ch.markers.push_back({double(r.window_full_chunk), "window full"});
  for (const PackedSummary& s : r.summary)
    if (s.quality_chunks > 0)
      ch.note += fmt::format("{}{}: {:.2f}% on average, cosine {:.5f}", ch.note.empty() ? "" : ";  ", s.label,
                             100 * s.attention.rel_l2(), s.attention.cosine());
  return render_line_chart(ch);
}

void write_simulation_report(const SimulationResult& r, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw InvalidArgument(fmt::format("--report directory '{}' cannot be created: {}", dir,
                                      ec ? ec.message() : std::string("not a directory")));
  const std::vector<std::pair<std::string, std::string>> files = {
      {"report.json", simulation_json(r, 2) + "\n"},
      {"memory.svg", memory_chart_svg(r)},
      {"attention.svg", attention_chart_svg(r)},
      {"summary.txt", simulation_summary_text(r)},
  };
  std::vector<fs::path> tmps;
  auto cleanup = [&] {
    for (const auto& t : tmps) fs::remove(t, ec);
  };
  for (const auto& [name, text] : files) {
    const fs::path final_path = fs::path(dir) / name;
    const fs::path tmp = fs::path(dir) / fmt::format(".{}.tmp.{}", name, ::getpid());
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) tmps.push_back(tmp);
    if (f) f.write(text.data(), std::streamsize(text.size()));
    if (f) f.close();
    if (!f) {
      cleanup();
      throw InvalidArgument(fmt::format("report file '{}' cannot be written", final_path.string()));
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    fs::rename(tmps[i], fs::path(dir) / files[i].first, ec);
    if (ec) {
      cleanup();
      throw InvalidArgument(fmt::format("report file '{}' cannot be written: {}",
                                        (fs::path(dir) / files[i].first).string(), ec.message()));
    }
  }
}

// ---------------------------------------------------------------------------
// compare

namespace {
std::optional<double> kv_rel_mse(const CompareRow& row) {
  const auto k = row.k.rel_mse(), v = row.v.rel_mse();
  if (!k || !v) return std::nullopt;
  return (*k + *v) / 2;
}
std::optional<double> kv_snr(const CompareRow& row) {
  const auto m = kv_rel_mse(row);
  if (!m || *m <= 0) return std::nullopt;
  return -10.0 * std::log10(*m);
}
}  // namespace

std::string compare_json(const CompareResult& r, int indent) {
  const ModelPreset& p = r.preset;
  ojson j;
  j["format"] = "qvg.compare/1";
  ojson w;
  w["model"] = p.name;
  w["scale"] = r.config.scale;
  w["seed"] = r.config.seed;
  w["layers_scored"] = r.layers;
  w["heads"] = p.heads;
  w["head_dim"] = p.head_dim;
  w["chunk_tokens"] = p.chunk_tokens();
  w["context_chunks"] = r.context_chunks;
  w["context_tokens"] = r.context_tokens;
  w["query_stride"] = r.config.query_stride;
  w["queries"] = r.queries;
  w["assumed"] = assumed_fields(p.assumed);
  j["workload"] = w;
  const CodecConfig& cc = r.config.codec;
  j["codec"] = {{"bits", cc.bits},
                {"block_size", cc.block_size},
                {"centroids", cc.centroids},
                {"stages", cc.stages},
                {"kmeans_iters", cc.kmeans_iters},
                {"asymmetric", cc.asymmetric},
                {"scale_dtype", std::string(name(cc.scale_dtype))},
                {"scaling", std::string(name(cc.scaling))},
                {"init", std::string(name(cc.init))},
                {"seed", cc.seed},
                {"kivi_group_tokens", cc.block_size}};
  ojson rows = ojson::array();
  for (const CompareRow& row : r.rows) {
    ojson rj;
    rj["method"] = row.method;
    rj["bits_per_element"] = num(row.bits_per_element);
    rj["compression_ratio"] = num(row.ratio);
    rj["k_rel_mse"] = num(row.k.rel_mse());
    rj["k_snr_db"] = num(row.k.snr_db());
    rj["v_rel_mse"] = num(row.v.rel_mse());
    rj["v_snr_db"] = num(row.v.snr_db());
    rj["kv_snr_db"] = num(kv_snr(row));
    rj["attention_rel_l2"] = num(row.attention.rel_l2());
    rj["attention_cosine"] = num(row.attention.cosine());
    rj["seconds"] = num(row.seconds);
    rows.push_back(rj);
  }
  j["rows"] = rows;
  j["wall_s"] = num(r.wall_s);
  return j.dump(indent);
}

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
                     row.bits_per_element, row.ratio, snr(row.k.snr_db()), snr(row.v.snr_db()), snr(kv_snr(row)),
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
