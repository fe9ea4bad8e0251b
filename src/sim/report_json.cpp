// The JSON reports of the simulation and the comparison (qvg/eval/simulate.h):
// simulation_json (docs/simulate.schema.json) and compare_json. Objects are written
// as initializer lists of (key, value) pairs; ordered_json keeps their order.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qvg/eval/compare.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/simulate.h"
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

/// The JSON names of the preset values that are assumptions (docs/workload.md), in order.
std::vector<std::string> assumed_fields(const PresetAssumptions& a) {
  const std::pair<bool, const char*> fields[] = {{a.layers, "layers"},
                                                 {a.heads, "heads"},
                                                 {a.head_dim, "head_dim"},
                                                 {a.grid, "grid"},
                                                 {a.frames_per_chunk, "frames_per_chunk"},
                                                 {a.context, "context"},
                                                 {a.sink, "sink"},
                                                 {a.rope, "rope"},
                                                 {a.k_wall, "k_wall_ratio"},
                                                 {a.k_norm, "k_norm_spread"},
                                                 {a.v_wall, "v_wall_ratio"},
                                                 {a.v_norm, "v_norm_spread"},
                                                 {a.magnitude, "magnitude"}};
  std::vector<std::string> v;
  for (const auto& [assumed, field] : fields)
    if (assumed) v.push_back(field);
  return v;
}

/// Appends a codec's settings in the reports' order: stages, kmeans_iters, asymmetric,
/// scale_dtype, scaling, init, seed.
void put_codec_settings(ojson& j, const CodecConfig& c) {
  j.update(ojson{{"stages", c.stages},
                 {"kmeans_iters", c.kmeans_iters},
                 {"asymmetric", c.asymmetric},
                 {"scale_dtype", std::string(name(c.scale_dtype))},
                 {"scaling", std::string(name(c.scaling))},
                 {"init", std::string(name(c.init))},
                 {"seed", c.seed}});
}

/// One packed configuration's codec and policy settings (REQUIRES q.enabled(), as
/// SimulationConfig::validate does of every packed configuration).
ojson quant_json(const std::string& label, const QuantArgs& q) {
  const CodecConfig c = q.codec;
  ojson j = {{"label", label}, {"bits", c.bits}, {"centroids", c.centroids}, {"block_size", c.block_size}};
  put_codec_settings(j, c);
  // The encoder's scale choice and K's and V's own settings over the shared ones
  // ("" when none; RoleCodec::describe, e.g. "scale_search=off").
  j.update(ojson{{"scale_search", std::string(name(c.scale_search))},
                 {"k_settings", q.k.describe("")},
                 {"v_settings", q.v.describe("")}});
  j.update(sim::policy_json(q));
  return j;
}

/// dense / packed as a JSON number; null when packed is 0.
ojson ratio_json(size_t dense, size_t packed) {
  return packed > 0 ? num(double(dense) / double(packed)) : ojson();
}

/// Appends the K and V reconstruction errors ("k_rel_mse", "k_snr_db", "v_rel_mse", "v_snr_db").
void put_kv_errors(ojson& j, const ErrorSums& k, const ErrorSums& v) {
  j["k_rel_mse"] = num(k.rel_mse());
  j["k_snr_db"] = num(k.snr_db());
  j["v_rel_mse"] = num(v.rel_mse());
  j["v_snr_db"] = num(v.snr_db());
}

/// Appends the attention error ("attention_rel_l2", "attention_cosine"), with
/// `min_cosine` also "attention_min_cosine" (null when no vector was compared).
void put_attention(ojson& j, const AttentionSums& a, bool min_cosine) {
  j["attention_rel_l2"] = num(a.rel_l2());
  j["attention_cosine"] = num(a.cosine());
  if (min_cosine) j["attention_min_cosine"] = a.vectors > 0 ? num(a.cos_min) : ojson();
}

/// One packed configuration's figures; times divided by `layers` (the pooled record of
/// a chunk sums them over its layers).
ojson packed_json(const std::string& label, size_t dense_bytes, const PackedLayerRecord& p, double layers) {
  ojson j = {{"label", label},
             {"resident_bytes", p.resident_bytes},
             {"predicted_resident_bytes", p.predicted_resident_bytes ? ojson(*p.predicted_resident_bytes) : ojson()},
             {"compression_ratio", ratio_json(dense_bytes, p.resident_bytes)},
             {"transient_peak_bytes", p.transient_peak_bytes},
             {"encoded_tokens", p.encoded_tokens},
             {"encoded_visible_tokens", p.encoded_visible},
             {"encoded_bytes", p.encoded_bytes},
             {"spans_encoded", p.spans_encoded},
             {"chunks_encoded", p.chunks_encoded},
             {"view_bytes", p.view_bytes},
             {"model_bytes", p.model_bytes}};
  put_kv_errors(j, p.k, p.v);
  put_attention(j, p.attention, true);
  j["encode_s"] = num(p.encode_s / layers);
  j["decode_s"] = num(p.decode_s / layers);
  j["attention_s"] = num(p.attention_s / layers);
  return j;
}

/// The dense cache's figures.
ojson dense_json(size_t resident, size_t transient, double update_s, double attention_s, double generate_s) {
  return {{"resident_bytes", resident},
          {"transient_peak_bytes", transient},
          {"update_s", num(update_s)},
          {"attention_s", num(attention_s)},
          {"generate_s", num(generate_s)}};
}

}  // namespace

// ---------------------------------------------------------------------------
// simulate

namespace {

/// The "workload" object: the scaled preset and the simulated layers.
ojson workload_json(const SimulationResult& r) {
  const ModelPreset& p = r.preset;
  const SimulationConfig& c = r.config;
  const bool overridden =
      c.context_frames.has_value() && *c.context_frames != find_model_preset(c.model).context_frames;
  return {{"model", p.name},
          {"description", p.model},
          {"scale", c.scale},
          {"seed", c.seed},
          {"layers_total", p.layers},
          {"layers_simulated", r.layers},
          {"heads", p.heads},
          {"head_dim", p.head_dim},
          {"grid", {p.grid_h, p.grid_w}},
          {"tokens_per_frame", p.tokens_per_frame()},
          {"frames_per_chunk", p.frames_per_chunk},
          {"chunk_tokens", p.chunk_tokens()},
          {"context_frames", p.context_frames},
          {"context_frames_overridden", overridden},
          {"context_tokens", p.context_tokens()},
          {"sink_frames", p.sink_frames},
          {"sink_tokens", p.sink_tokens()},
          {"cache_tokens", p.cache_tokens()},
          {"assumed", assumed_fields(p.assumed)}};
}

/// The "run" object: the stream's settings and wall time.
ojson run_json(const SimulationResult& r) {
  const SimulationConfig& c = r.config;
  return {{"chunks", c.chunks},
          {"steps", c.steps},
          {"step_noise", c.step_noise},
          {"query_stride", c.query_stride},
          {"queries_per_chunk", r.chunks.empty() ? 0 : r.chunks.front().queries},
          {"attention_steps", c.attention_every_step ? "all" : "last"},
          {"threads", c.threads},
          {"window_full_chunk", r.window_full_chunk >= 0 ? ojson(r.window_full_chunk) : ojson()},
          {"wall_s", num(r.wall_s)}};
}

/// One simulated layer of a chunk: its dense cache and each packed configuration.
ojson layer_json(const LayerRecord& l, const std::vector<PackedConfig>& packed) {
  ojson lp = ojson::array();
  for (size_t k = 0; k < packed.size(); ++k)
    lp.push_back(packed_json(packed[k].label, l.dense_resident_bytes, l.packed[k], 1.0));
  return {{"layer", l.layer},
          {"window_tokens", l.window_tokens},
          {"dense", dense_json(l.dense_resident_bytes, l.dense_transient_peak_bytes, l.dense_update_s,
                               l.dense_attention_s, l.generate_s)},
          {"packed", lp}};
}

/// One chunk: where it lies, the layers pooled (dense: largest bytes, mean times;
/// packed: sim::pooled, times per layer), and each layer.
ojson chunk_json(const ChunkRecord& ch, const std::vector<PackedConfig>& packed) {
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
  ojson pj = ojson::array();
  for (size_t k = 0; k < packed.size(); ++k) pj.push_back(packed_json(packed[k].label, dres, sim::pooled(ch, k), nl));
  ojson layers = ojson::array();
  for (const LayerRecord& l : ch.layers) layers.push_back(layer_json(l, packed));
  return {{"index", ch.chunk.index},
          {"frame0", ch.chunk.frame0},
          {"frames", ch.chunk.frames},
          {"token0", ch.chunk.token0},
          {"tokens", ch.chunk.tokens},
          {"sink", ch.chunk.sink},
          {"global_end", ch.global_end},
          {"window_tokens", ch.window_tokens},
          {"queries", ch.queries},
          {"wall_s", num(ch.wall_s)},
          {"dense", dense_json(dres, dtr, du / nl, da / nl, dg / nl)},
          {"packed", pj},
          {"layers", layers}};
}

/// One configuration's summary over the run, with the full-size model's figures
/// (null when the memory model does not cover it).
ojson summary_json(const PackedSummary& s) {
  ojson sj = {{"label", s.label},
              {"dense_bytes", s.dense_bytes},
              {"packed_last_bytes", s.packed_last_bytes},
              {"packed_peak_bytes", s.packed_peak_bytes},
              {"packed_mean_full_bytes", s.packed_mean_full_bytes},
              {"transient_peak_bytes", s.transient_peak_bytes},
              {"ratio_peak", num(s.ratio_peak)},
              {"ratio_full", num(s.ratio_full)},
              {"bits_per_element", num(s.bits_per_element)}};
  put_kv_errors(sj, s.k, s.v);
  put_attention(sj, s.attention, true);
  sj.update(ojson{{"worst_attention_rel_l2", num(s.worst_attention_rel_l2)},
                  {"quality_chunks", s.quality_chunks},
                  {"spans", s.spans},
                  {"encode_s_per_span", num(s.encode_s_per_span)},
                  {"encode_s_per_chunk", num(s.encode_s_per_chunk)},
                  {"span_breaks", s.span_breaks},
                  {"decode_s_per_step", num(s.decode_s_per_step)},
                  {"attention_s_per_chunk", num(s.attention_s_per_chunk)},
                  {"memory_model_matches", s.memory_model_matches},
                  {"step_s", num(s.step_s)},
                  {"first_encoded_chunk", s.first_encoded_chunk >= 0 ? ojson(s.first_encoded_chunk) : ojson()},
                  {"view_bytes", s.view_bytes}});
  sj["model"] = {
      {"dense_bytes", s.model_dense_bytes},
      {"peak_bytes", s.model_peak_bytes},
      {"ratio", ratio_json(s.model_dense_bytes, s.model_peak_bytes)},
      {"measured_peak_bytes", s.measured_model_peak_bytes},
      {"predicted_peak_bytes", s.predicted_model_peak_bytes > 0 ? ojson(s.predicted_model_peak_bytes) : ojson()},
      {"matches", s.model_peak_matches}};
  sj["full_size"] = s.full_layers > 0 ? ojson{{"layers", s.full_layers},
                                              {"dense_bytes_per_layer", s.full_dense_bytes},
                                              {"policy_peak_bytes_per_layer", s.full_policy_peak_bytes},
                                              {"ratio", ratio_json(s.full_dense_bytes, s.full_policy_peak_bytes)},
                                              {"model_dense_bytes", s.full_model_dense_bytes},
                                              {"model_peak_bytes", s.full_model_peak_bytes},
                                              {"model_ratio", num(s.full_ratio_model_peak)}}
                                      : ojson();
  return sj;
}

/// An array of f(x) for each x of xs.
template <class Xs, class F>
ojson array_of(const Xs& xs, F&& f) {
  ojson a = ojson::array();
  for (const auto& x : xs) a.push_back(f(x));
  return a;
}

}  // namespace

std::string simulation_json(const SimulationResult& r, int indent) {
  const std::vector<PackedConfig>& packed = r.config.packed;
  const ojson j = {{"format", "qvg.simulate/1"},
                   {"generator", std::string("qvg ") + kVersion},
                   {"workload", workload_json(r)},
                   {"run", run_json(r)},
                   {"configs", array_of(packed, [](const PackedConfig& pc) { return quant_json(pc.label, pc.quant); })},
                   {"chunks", array_of(r.chunks, [&](const ChunkRecord& ch) { return chunk_json(ch, packed); })},
                   {"summary", array_of(r.summary, summary_json)}};
  return j.dump(indent);
}

// ---------------------------------------------------------------------------
// compare

std::string compare_json(const CompareResult& r, int indent) {
  const ModelPreset& p = r.preset;
  const CodecConfig& cc = r.config.codec;
  ojson workload = sim::scored_context_json(r, p.name, r.config.query_stride);
  workload["assumed"] = assumed_fields(p.assumed);
  ojson codec = {{"bits", cc.bits}, {"block_size", cc.block_size}, {"centroids", cc.centroids}};
  put_codec_settings(codec, cc);
  codec["kivi_group_tokens"] = cc.block_size;
  codec["spans"] = std::string(name(r.config.spans));
  const ojson rows = array_of(r.rows, [](const CompareRow& row) {
    ojson rj = {
        {"method", row.method}, {"bits_per_element", num(row.bits_per_element)}, {"compression_ratio", num(row.ratio)}};
    put_kv_errors(rj, row.k, row.v);
    rj["kv_snr_db"] = num(sim::kv_snr(row));
    put_attention(rj, row.attention, false);
    rj["seconds"] = num(row.seconds);
    return rj;
  });
  const ojson j = {
      {"format", "qvg.compare/1"}, {"workload", workload}, {"codec", codec}, {"rows", rows}, {"wall_s", num(r.wall_s)}};
  return j.dump(indent);
}

}  // namespace qvg
