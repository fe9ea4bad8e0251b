// The JSON reports of the simulation and the comparison (qvg/simulate.h):
// simulation_json (docs/simulate.schema.json) and compare_json.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qvg/simulate.h"
#include "qvg/version.h"
#include "sim/report_util.h"

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

/// dense / packed as a JSON number; null when packed is 0.
ojson ratio_json(size_t dense, size_t packed) {
  return packed > 0 ? num(double(dense) / double(packed)) : ojson();
}

/// The K and V reconstruction errors ("k_rel_mse", "k_snr_db", "v_rel_mse", "v_snr_db").
void put_kv_errors(ojson& j, const ErrorSums& k, const ErrorSums& v) {
  j["k_rel_mse"] = num(k.rel_mse());
  j["k_snr_db"] = num(k.snr_db());
  j["v_rel_mse"] = num(v.rel_mse());
  j["v_snr_db"] = num(v.snr_db());
}

/// The attention error ("attention_rel_l2", "attention_cosine"), with `min_cosine` also
/// "attention_min_cosine" (null when no vector was compared).
void put_attention(ojson& j, const AttentionSums& a, bool min_cosine) {
  j["attention_rel_l2"] = num(a.rel_l2());
  j["attention_cosine"] = num(a.cosine());
  if (min_cosine) j["attention_min_cosine"] = a.vectors > 0 ? num(a.cos_min) : ojson();
}

/// One packed configuration's figures; times divided by `layers` (the pooled record of
/// a chunk sums them over its layers).
ojson packed_json(const std::string& label, size_t dense_bytes, const PackedLayerRecord& p, double layers) {
  ojson j;
  j["label"] = label;
  j["resident_bytes"] = p.resident_bytes;
  j["predicted_resident_bytes"] = p.predicted_resident_bytes ? ojson(*p.predicted_resident_bytes) : ojson();
  j["compression_ratio"] = ratio_json(dense_bytes, p.resident_bytes);
  j["transient_peak_bytes"] = p.transient_peak_bytes;
  j["encoded_tokens"] = p.encoded_tokens;
  j["encoded_visible_tokens"] = p.encoded_visible;
  j["encoded_bytes"] = p.encoded_bytes;
  j["spans_encoded"] = p.spans_encoded;
  put_kv_errors(j, p.k, p.v);
  put_attention(j, p.attention, true);
  j["encode_s"] = num(p.encode_s / layers);
  j["decode_s"] = num(p.decode_s / layers);
  j["attention_s"] = num(p.attention_s / layers);
  return j;
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

}  // namespace

// ---------------------------------------------------------------------------
// simulate

namespace {

/// The "workload" object: the scaled preset and the simulated layers.
ojson workload_json(const SimulationResult& r) {
  const ModelPreset& p = r.preset;
  const SimulationConfig& c = r.config;
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
  return w;
}

/// The "run" object: the stream's settings and wall time.
ojson run_json(const SimulationResult& r) {
  const SimulationConfig& c = r.config;
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
  return run;
}

/// One simulated layer of a chunk: its dense cache and each packed configuration.
ojson layer_json(const LayerRecord& l, const std::vector<PackedConfig>& packed) {
  ojson lj;
  lj["layer"] = l.layer;
  lj["window_tokens"] = l.window_tokens;
  lj["dense"] = dense_json(l.dense_resident_bytes, l.dense_transient_peak_bytes, l.dense_update_s, l.dense_attention_s,
                           l.generate_s);
  ojson lp = ojson::array();
  for (size_t k = 0; k < packed.size(); ++k)
    lp.push_back(packed_json(packed[k].label, l.dense_resident_bytes, l.packed[k], 1.0));
  lj["packed"] = lp;
  return lj;
}

/// One chunk: where it lies, the layers pooled (dense: largest bytes, mean times;
/// packed: sim::pooled, times per layer), and each layer.
ojson chunk_json(const ChunkRecord& ch, const std::vector<PackedConfig>& packed) {
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
  ojson pj = ojson::array();
  for (size_t k = 0; k < packed.size(); ++k) pj.push_back(packed_json(packed[k].label, dres, sim::pooled(ch, k), nl));
  cj["packed"] = pj;
  ojson layers = ojson::array();
  for (const LayerRecord& l : ch.layers) layers.push_back(layer_json(l, packed));
  cj["layers"] = layers;
  return cj;
}

/// One configuration's summary over the run, with the full-size model's figures
/// (null when the memory model does not cover it).
ojson summary_json(const PackedSummary& s) {
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
  put_kv_errors(sj, s.k, s.v);
  put_attention(sj, s.attention, true);
  sj["worst_attention_rel_l2"] = num(s.worst_attention_rel_l2);
  sj["quality_chunks"] = s.quality_chunks;
  sj["spans"] = s.spans;
  sj["encode_s_per_span"] = num(s.encode_s_per_span);
  sj["decode_s_per_step"] = num(s.decode_s_per_step);
  sj["attention_s_per_chunk"] = num(s.attention_s_per_chunk);
  sj["memory_model_matches"] = s.memory_model_matches;
  sj["full_size"] = ojson();
  if (s.full_layers > 0) {
    ojson& f = sj["full_size"];
    f["layers"] = s.full_layers;
    f["dense_bytes_per_layer"] = s.full_dense_bytes;
    f["policy_peak_bytes_per_layer"] = s.full_policy_peak_bytes;
    f["ratio"] = ratio_json(s.full_dense_bytes, s.full_policy_peak_bytes);
  }
  return sj;
}

}  // namespace

std::string simulation_json(const SimulationResult& r, int indent) {
  ojson j;
  j["format"] = "qvg.simulate/1";
  j["generator"] = std::string("qvg ") + kVersion;
  j["workload"] = workload_json(r);
  j["run"] = run_json(r);
  ojson& cfgs = j["configs"] = ojson::array();
  for (const PackedConfig& pc : r.config.packed) cfgs.push_back(quant_json(pc.label, pc.quant));
  ojson& chunks = j["chunks"] = ojson::array();
  for (const ChunkRecord& ch : r.chunks) chunks.push_back(chunk_json(ch, r.config.packed));
  ojson& sum = j["summary"] = ojson::array();
  for (const PackedSummary& s : r.summary) sum.push_back(summary_json(s));
  return j.dump(indent);
}

// ---------------------------------------------------------------------------
// compare

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
    put_kv_errors(rj, row.k, row.v);
    rj["kv_snr_db"] = num(sim::kv_snr(row));
    put_attention(rj, row.attention, false);
    rj["seconds"] = num(row.seconds);
    rows.push_back(rj);
  }
  j["rows"] = rows;
  j["wall_s"] = num(r.wall_s);
  return j.dump(indent);
}

}  // namespace qvg
