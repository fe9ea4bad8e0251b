// The reports of the rate-distortion frontier (qvg/eval/simulate.h): frontier.json,
// summary.txt and frontier.svg (drawn with render_line_chart, chart.cpp).
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "qvg/eval/chart.h"
#include "qvg/eval/frontier.h"
#include "sim/report_util.h"

namespace qvg {

namespace {

nlohmann::ordered_json codec_json(const CodecConfig& c) {
  nlohmann::ordered_json j;
  j["bits"] = c.bits;
  j["centroids"] = c.centroids;
  j["stages"] = c.stages;
  j["kmeans_iters"] = c.kmeans_iters;
  j["block_size"] = c.block_size;
  j["asymmetric"] = c.asymmetric;
  j["scale_dtype"] = std::string(name(c.scale_dtype));
  j["scaling"] = std::string(name(c.scaling));
  j["scale_search"] = std::string(name(c.scale_search));
  j["init"] = std::string(name(c.init));
  return j;
}

nlohmann::ordered_json opt_json(std::optional<double> v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

/// The Pareto set in ascending bits per element (equal rates in index order).
std::vector<const FrontierPoint*> pareto_by_rate(const FrontierResult& r) {
  std::vector<const FrontierPoint*> par;
  for (const FrontierPoint& q : r.points)
    if (q.pareto) par.push_back(&q);
  std::stable_sort(par.begin(), par.end(), [](const FrontierPoint* a, const FrontierPoint* b) {
    return a->bits_per_element < b->bits_per_element;
  });
  return par;
}

}  // namespace

std::string frontier_json(const FrontierResult& r, int indent) {
  nlohmann::ordered_json j;
  j["format"] = "qvg.frontier/1";
  j["workload"] = sim::scored_context_json(r, r.config.model, r.query_stride);
  j["search"] = {{"strategy",
                  "coordinate descent from the reference default: per round, each knob's values with the others "
                  "fixed, keeping the least attention error within the budget; until a round changes nothing"},
                 {"budget_bpe", r.budget_bpe},
                 {"bpe_slack", r.config.bpe_slack},
                 {"max_rounds", r.config.max_rounds},
                 {"codec_seed", r.config.codec_seed},
                 {"trace", r.trace},
                 {"wall_s", r.wall_s}};
  auto pj = [&](size_t i) {
    const FrontierPoint& q = r.points[i];
    nlohmann::ordered_json o;
    o["index"] = i;
    o["method"] = q.method;
    o["label"] = q.label;
    o["stage"] = q.stage;
    o["bits_per_element"] = q.bits_per_element;
    o["attention_rel_l2"] = q.attention.rel_l2();
    o["attention_cosine"] = q.attention.cosine();
    o["k_snr_db"] = opt_json(q.k.snr_db());
    o["v_snr_db"] = opt_json(q.v.snr_db());
    o["pareto"] = q.pareto;
    if (q.method == "qvg") {
      o["config"] = q.codec.describe(true);
      o["k"] = codec_json(q.codec.k);
      o["v"] = codec_json(q.codec.v);
      o["chunks_per_span"] =
          q.codec.chunks_per_span == 0 ? nlohmann::ordered_json("all") : nlohmann::ordered_json(q.codec.chunks_per_span);
      o["refinement_layer_bits"] = q.codec.refinement_layer_bits;
      o["encode_s"] = q.encode_s;
      o["decode_s"] = q.decode_s;
    } else {
      o["bits"] = q.baseline.bits;
      o["group"] = q.baseline.block_size;
    }
    return o;
  };
  const FrontierPoint& ref = r.points[r.reference];
  const FrontierPoint& hq = r.points[r.profile];
  nlohmann::ordered_json s;
  s["reference"] = pj(r.reference);
  s["best"] = pj(r.best);
  s["hq"] = pj(r.profile);
  s["hq_vs_reference"] = {{"bpe_delta", hq.bits_per_element - ref.bits_per_element},
                          {"attention_error_ratio", ref.attention.rel_l2() / hq.attention.rel_l2()},
                          {"encode_throughput_ratio", r.ref_encode_eps > 0 ? r.hq_encode_eps / r.ref_encode_eps : 0.0},
                          {"decode_throughput_ratio", r.ref_decode_eps > 0 ? r.hq_decode_eps / r.ref_decode_eps : 0.0},
                          {"reference_encode_elements_per_s", r.ref_encode_eps},
                          {"reference_decode_elements_per_s", r.ref_decode_eps},
                          {"hq_encode_elements_per_s", r.hq_encode_eps},
                          {"hq_decode_elements_per_s", r.hq_decode_eps}};
  nlohmann::ordered_json cv = nlohmann::ordered_json::array();
  for (const FrontierCurveAt& c : r.curves)
    cv.push_back({{"method", c.method},
                  {"group", c.group},
                  {"error_at_hq_bpe", c.error},
                  {"clamped", c.clamped},
                  {"ratio_to_hq", c.error / hq.attention.rel_l2()}});
  s["baseline_curves_at_hq_bpe"] = cv;
  j["summary"] = s;
  nlohmann::ordered_json pts = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.points.size(); ++i) pts.push_back(pj(i));
  j["points"] = pts;
  return j.dump(indent);
}

std::string frontier_text(const FrontierResult& r) {
  const FrontierPoint& ref = r.points[r.reference];
  const FrontierPoint& hq = r.points[r.profile];
  const FrontierPoint& best = r.points[r.best];
  std::string o = fmt::format("frontier of {} (scale {}): {} points, {:.1f} s\n", r.preset.name, r.config.scale,
                              r.points.size(), r.wall_s);
  o += fmt::format("  reference default  bpe {:.3f}  attention rel. error {:.5f}\n", ref.bits_per_element,
                   ref.attention.rel_l2());
  o += fmt::format("  descent result     bpe {:.3f}  attention rel. error {:.5f}  ({})\n", best.bits_per_element,
                   best.attention.rel_l2(), best.codec.describe(true));
  o += fmt::format("  hq profile         bpe {:.3f}  attention rel. error {:.5f}  ({})\n", hq.bits_per_element,
                   hq.attention.rel_l2(), hq.codec.describe(true));
  o += fmt::format(
      "  hq vs reference: {:.2f}x lower error at {:+.3f} bits per element; encode {:.2f}x, decode {:.2f}x "
      "the reference's throughput\n",
      ref.attention.rel_l2() / hq.attention.rel_l2(), hq.bits_per_element - ref.bits_per_element,
      r.ref_encode_eps > 0 ? r.hq_encode_eps / r.ref_encode_eps : 0.0,
      r.ref_decode_eps > 0 ? r.hq_decode_eps / r.ref_decode_eps : 0.0);
  for (const FrontierCurveAt& c : r.curves)
    o += fmt::format("  {:6} g{:<2} at {:.3f} bpe: error {:.5f} = {:.2f}x hq's{}\n", c.method, c.group,
                     hq.bits_per_element, c.error, c.error / hq.attention.rel_l2(),
                     c.clamped ? " (its lowest rate is above hq's: that rate's error)" : "");
  o += "  pareto set:\n";
  for (const FrontierPoint* qp : pareto_by_rate(r))
    if (const FrontierPoint& q = *qp; q.pareto)
      o += fmt::format("    bpe {:.3f}  attn {:.5f}  {} {}\n", q.bits_per_element, q.attention.rel_l2(), q.method,
                       q.method == "qvg" ? q.codec.describe(true) : q.label);
  for (const std::string& t : r.trace) o += "  " + t + "\n";
  return o;
}

/// The frontier chart: x bits per element, y attention relative error (log scale);
/// the qvg configurations, each baseline's curve over its rates (groups of 64 solid,
/// 32 dashed), the Pareto set joined and ringed, the reference default and the hq
/// profile labelled.
std::string frontier_svg(const FrontierResult& r) {
  LineChart ch;
  ch.title = fmt::format("Rate-distortion frontier: {} (scale {})", r.preset.name, r.config.scale);
  ch.subtitle =
      fmt::format("{} context tokens, {} layers; coordinate descent from the reference default, budget {:.2f} bpe",
                  r.context_tokens, r.layers.size(), r.budget_bpe);
  ch.x_label = "bits per element (everything stored: codebooks, ids, codes, scales, zeros)";
  ch.y_label = "attention relative L2 error (log scale)";
  ch.log_y = true;
  ch.x_to_ticks = true;
  ch.height = 600;
  const std::map<std::string, std::string> colour = {{"rtn", "#c0392b"}, {"kivi", "#27ae60"}, {"quarot", "#e67e22"}};
  for (const std::string m : {"rtn", "kivi", "quarot"})
    for (const int group : {64, 32}) {
      std::vector<std::pair<double, double>> pts;
      for (const FrontierPoint& q : r.points)
        if (q.method == m && q.baseline.block_size == group) pts.emplace_back(q.bits_per_element, q.attention.rel_l2());
      std::sort(pts.begin(), pts.end());
      ChartSeries s;
      s.name = group == 64 ? fmt::format("{} g64 (2, 3, 4 bits)", m) : fmt::format("{} g32", m);
      s.id = fmt::format("{}-g{}", m, group);
      s.color = colour.at(m);
      s.width = 1.2;
      s.dashed = group == 32;
      s.markers = true;
      s.marker_radius = 3;
      for (const auto& [x, y] : pts) s.x.push_back(x), s.y.push_back(y);
      ch.series.push_back(std::move(s));
    }
  ChartSeries qvg;
  qvg.name = "qvg configuration";
  qvg.id = "qvg-points";
  qvg.color = "#1f4e9c";
  qvg.line = false;
  qvg.markers = true;
  qvg.marker_radius = 3;
  qvg.marker_fill = "#9db4dd";
  for (const FrontierPoint& q : r.points)
    if (q.method == "qvg") {
      qvg.x.push_back(q.bits_per_element);
      qvg.y.push_back(q.attention.rel_l2());
      qvg.point_titles.push_back(
          fmt::format("{}: {:.3f} bpe, {:.5f}", q.codec.describe(true), q.bits_per_element, q.attention.rel_l2()));
    }
  ch.series.push_back(std::move(qvg));
  ChartSeries pareto;
  pareto.name = "Pareto set";
  pareto.id = "pareto";
  pareto.point_class = "pareto-point";
  pareto.color = "#111111";
  pareto.markers = true;
  pareto.marker_radius = 5;
  pareto.marker_fill = "none";
  for (const FrontierPoint* q : pareto_by_rate(r))
    pareto.x.push_back(q->bits_per_element), pareto.y.push_back(q->attention.rel_l2());
  ch.series.push_back(std::move(pareto));
  auto callout = [&](const char* id, const FrontierPoint& q, const char* text, const char* fill, double dy) {
    ch.callouts.push_back({id, fmt::format("{} ({:.2f} bpe, {:.4f})", text, q.bits_per_element, q.attention.rel_l2()),
                           q.bits_per_element, q.attention.rel_l2(), fill, dy});
  };
  callout("reference", r.points[r.reference], "reference default", "#f1c40f", -28);
  callout("hq", r.points[r.profile], "hq profile", "#8e44ad", 28);
  return render_line_chart(ch);
}

void write_frontier_report(const FrontierResult& r, const std::string& dir) {
  write_report_files(dir, {{"frontier.json", frontier_json(r, 2) + "\n"},
                           {"frontier.svg", frontier_svg(r)},
                           {"summary.txt", frontier_text(r)}});
}

}  // namespace qvg
