// The SVG charts of the simulation (qvg/eval/simulate.h): memory_chart_svg and
// attention_chart_svg, drawn with render_line_chart (chart.cpp).
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_policy.h"
#include "qvg/eval/chart.h"
#include "qvg/eval/simulate.h"
#include "sim/report_util.h"
#include "sim/sim_common.h"

namespace qvg {
namespace {

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

std::string memory_chart_svg(const SimulationResult& r) {
  LineChart ch;
  const ModelPreset& p = r.preset;
  ch.title = fmt::format("K/V memory of the model ({} layers at this scale): dense vs packed", p.layers);
  ch.height = 540;  // room for the legend's two rows per configuration
  std::string cfgs;
  for (const PackedConfig& pc : r.config.packed) {
    if (!cfgs.empty()) cfgs += "; ";
    const CodecConfig c = pc.quant.codec;  // packed: bits are set (SimulationConfig::validate)
    cfgs += fmt::format("{}: {} centroids, block {}, spans of {} chunks", pc.label, c.centroids, c.block_size,
                        detail::span_capacity(pc.quant));
  }
  ch.subtitle =
      fmt::format("{} · window {} tokens · {}", preset_line(p, r.config.scale), sim::grouped(p.cache_tokens()), cfgs);
  ch.x_label = fmt::format("chunk ({} frames = {} tokens each), numbered from 1 as the progress lines count",
                           p.frames_per_chunk, sim::grouped(p.chunk_tokens()));
  ch.y_label = fmt::format("MiB, all {} layers", p.layers);
  const double MiB = double(1 << 20);
  const double layers = double(p.layers);
  ChartSeries dense;
  dense.name = fmt::format("dense caches (bf16, {} layers)", p.layers);
  dense.color = "#444444";
  dense.width = 2.5;
  const size_t n = r.config.packed.size();
  std::vector<ChartSeries> model(n), trans(n);
  for (size_t j = 0; j < n; ++j) {
    model[j].name = fmt::format("packed {}: {} layers' caches + one shared view", r.config.packed[j].label, p.layers);
    model[j].color = color_of(j);
    model[j].width = 2.5;
    trans[j].name = fmt::format("packed {}: transient of one layer's call (one layer only; not the model's peak)",
                                r.config.packed[j].label);
    trans[j].color = color_of(j);
    trans[j].dashed = true;
    trans[j].width = 1.5;
    trans[j].opacity = 0.55;
  }
  for (const ChunkRecord& c : r.chunks) {
    if (c.layers.empty()) continue;
    const double x = double(c.chunk.index + 1);
    dense.x.push_back(x);
    dense.y.push_back(layers * double(c.layers.front().dense_resident_bytes) / MiB);
    for (size_t j = 0; j < n; ++j) {
      const PackedLayerRecord a = sim::pooled(c, j);
      model[j].x.push_back(x);
      model[j].y.push_back((layers * double(a.resident_bytes) + double(a.view_bytes)) / MiB);
      trans[j].x.push_back(x);
      trans[j].y.push_back(double(a.transient_peak_bytes) / MiB);
    }
  }
  ch.series.push_back(dense);
  for (size_t j = 0; j < n; ++j) ch.series.push_back(model[j]);
  for (size_t j = 0; j < n; ++j) ch.series.push_back(trans[j]);
  if (r.window_full_chunk >= 0) ch.markers.push_back({double(r.window_full_chunk + 1), "window full"});
  for (const PackedSummary& s : r.summary)
    ch.note += fmt::format("{}{}: model peak {} vs dense {} ({:.2f}x{})", ch.note.empty() ? "" : ";  ", s.label,
                           sim::mib(s.model_peak_bytes), sim::mib(s.model_dense_bytes), s.ratio_model_peak,
                           s.first_encoded_chunk < 0 ? ", nothing encoded yet" : "");
  return render_line_chart(ch);
}

std::string attention_chart_svg(const SimulationResult& r) {
  LineChart ch;
  ch.title = "Attention output error: packed view vs dense view";
  const ModelPreset& p = r.preset;
  ch.subtitle = fmt::format("{} · {} queries per chunk and head (every {}{}) · relative L2 error, pooled over heads",
                            preset_line(p, r.config.scale), r.chunks.empty() ? 0 : r.chunks.front().queries,
                            r.config.query_stride, r.config.query_stride == 1 ? "" : "th");
  ch.x_label = fmt::format("chunk ({} frames = {} tokens each), numbered from 1 as the progress lines count",
                           p.frames_per_chunk, sim::grouped(p.chunk_tokens()));
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
        s.x.push_back(double(c.chunk.index + 1));
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
      s.x.push_back(double(c.chunk.index + 1));
      s.y.push_back(100.0 * sim::pooled(c, j).attention.rel_l2());
    }
    ch.series.push_back(s);
  }
  // The first chunk whose view held encoded tokens (any configuration).
  for (const ChunkRecord& c : r.chunks) {
    bool enc = false;
    for (size_t j = 0; j < ncfg && !enc; ++j) enc = sim::pooled(c, j).encoded_visible > 0;
    if (enc) {
      ch.markers.push_back({double(c.chunk.index + 1), "first span encoded"});
      break;
    }
  }
  if (r.window_full_chunk >= 0) ch.markers.push_back({double(r.window_full_chunk + 1), "window full"});
  for (const PackedSummary& s : r.summary)
    if (s.quality_chunks > 0)
      ch.note += fmt::format("{}{}: {:.2f}% on average, cosine {:.5f}", ch.note.empty() ? "" : ";  ", s.label,
                             100 * s.attention.rel_l2(), s.attention.cosine());
  return render_line_chart(ch);
}

}  // namespace qvg
