// Tests of the streaming simulation, the comparison and their reports
// (qvg/eval/simulate.h): record counts and geometry, memory sanity and the memory
// model, quality figures (exactly zero before the first span, bounded after), wall
// times attributed to the right parts, determinism across thread counts, JSON content
// (its validation against docs/simulate.schema.json is tests/cli/simulate.sh's, with
// python3-jsonschema), SVG structure, chart helpers, configuration errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "qvg/error.h"
#include "qvg/eval/chart.h"
#include "qvg/eval/compare.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/memory.h"
#include "qvg/eval/simulate.h"
#include "qvg/version.h"
#include "qvg/view.h"

namespace qvg {
namespace {

using nlohmann::json;

// The tiny workload: self-forcing x0.05 (1 head, 2 layers, 84 tokens/frame,
// 252-token chunks), a 5-chunk context (window 6 chunks), spans of 2 chunks.
SimulationConfig tiny_config() {
  SimulationConfig c;
  c.model = "self-forcing-1.3b";
  c.scale = 0.05;
  c.context_frames = 15;
  c.chunks = 12;
  c.steps = 2;
  c.layers = 2;
  c.query_stride = 8;
  PackedConfig p = default_packed_config();
  p.quant.codec.centroids = 64;
  p.quant.span_chunks = 2;
  c.packed = {p};
  c.threads = 2;
  return c;
}

const SimulationResult& tiny_result() {
  static const SimulationResult r = simulate(tiny_config());
  return r;
}

TEST(Simulate, RecordCountsAndGeometry) {
  const SimulationResult& r = tiny_result();
  const ModelPreset& p = r.preset;
  ASSERT_EQ(p.heads, 1);
  ASSERT_EQ(p.chunk_tokens(), 252);
  ASSERT_EQ(p.cache_tokens(), 6 * 252);
  ASSERT_EQ(r.chunks.size(), 12u);
  EXPECT_EQ(r.layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.window_full_chunk, 5);
  int64_t prev_window = 0;
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const ChunkRecord& c = r.chunks[i];
    EXPECT_EQ(c.chunk.index, int64_t(i));
    EXPECT_EQ(c.global_end, int64_t(i + 1) * 252);
    EXPECT_EQ(c.window_tokens, std::min<int64_t>(c.global_end, p.cache_tokens()));
    EXPECT_GE(c.window_tokens, prev_window);
    prev_window = c.window_tokens;
    EXPECT_EQ(c.queries, (252 + 7) / 8);
    ASSERT_EQ(c.layers.size(), 2u);
    for (const LayerRecord& l : c.layers) {
      EXPECT_EQ(l.window_tokens, c.window_tokens);
      ASSERT_EQ(l.packed.size(), 1u);
    }
  }
}

// The wall times: every part that did work took time, the parts of a chunk (measured
// over disjoint calls) fit in the chunk's wall time, and the chunks in the run's.
void expect_times_attributed(const SimulationResult& r) {
  constexpr double kTol = 1e-6;  // seconds: rounding of the clock's readings
  double chunks_wall = 0;
  for (const ChunkRecord& c : r.chunks) {
    SCOPED_TRACE(testing::Message() << "chunk " << c.chunk.index);
    double parts = 0;
    for (const LayerRecord& l : c.layers) {
      EXPECT_GT(l.generate_s, 0);
      EXPECT_GT(l.dense_update_s, 0);
      EXPECT_GT(l.dense_attention_s, 0) << "the last step is scored";
      parts += l.generate_s + l.dense_update_s + l.dense_attention_s;
      for (const PackedLayerRecord& p : l.packed) {
        EXPECT_GT(p.encode_s, 0) << "the advance call";
        EXPECT_GT(p.decode_s, 0) << "the step calls";
        EXPECT_GT(p.attention_s, 0);
        parts += p.encode_s + p.decode_s + p.attention_s;
      }
    }
    EXPECT_LE(parts, c.wall_s + kTol) << "the parts of a chunk exceed its wall time";
    EXPECT_LE(c.wall_s, r.wall_s);
    chunks_wall += c.wall_s;
  }
  EXPECT_LE(chunks_wall, r.wall_s + kTol) << "the chunks exceed the run's wall time";
  for (const PackedSummary& s : r.summary) {
    EXPECT_GT(s.decode_s_per_step, 0);
    EXPECT_GT(s.attention_s_per_chunk, 0);
    if (s.spans > 0) {
      EXPECT_GT(s.encode_s_per_span, 0);
    }
  }
}

TEST(Simulate, WallTimesAttributedToTheirParts) {
  expect_times_attributed(tiny_result());
}

TEST(Simulate, MemorySanityAndModel) {
  const SimulationResult& r = tiny_result();
  const ModelPreset& p = r.preset;
  const size_t raw_chunk = 2 * size_t(p.chunk_tokens()) * size_t(p.heads) * size_t(p.head_dim) * 2;
  const size_t dense = 2 * size_t(p.cache_tokens()) * size_t(p.heads) * size_t(p.head_dim) * 2;
  bool encoded_yet = false;
  int64_t prev_encoded = 0;
  for (const ChunkRecord& c : r.chunks) {
    for (const LayerRecord& l : c.layers) {
      const PackedLayerRecord& pk = l.packed[0];
      EXPECT_EQ(l.dense_resident_bytes, dense) << "the dense cache's buffers are allocated up front";
      ASSERT_TRUE(pk.predicted_resident_bytes.has_value());
      EXPECT_EQ(pk.resident_bytes, *pk.predicted_resident_bytes) << "chunk " << c.chunk.index;
      if (pk.encoded_tokens > 0) encoded_yet = true;
      if (!encoded_yet) {
        // Before any encoding the packed cache holds exactly the raw chunks.
        EXPECT_EQ(pk.resident_bytes, size_t(c.chunk.index + 1) * raw_chunk);
      }
      if (c.chunk.index < r.window_full_chunk) {
        EXPECT_GE(pk.encoded_tokens, prev_encoded);
      }
      if (c.chunk.index >= r.window_full_chunk) {
        EXPECT_LE(pk.resident_bytes, l.dense_resident_bytes) << "int2 must not exceed dense once the window is full";
      }
      EXPECT_LE(pk.encoded_visible, pk.encoded_tokens);
      EXPECT_LE(pk.encoded_visible, c.window_tokens);
    }
    prev_encoded = c.layers.front().packed[0].encoded_tokens;
  }
  ASSERT_EQ(r.summary.size(), 1u);
  const PackedSummary& s = r.summary[0];
  EXPECT_TRUE(s.memory_model_matches);
  EXPECT_EQ(s.dense_bytes, dense);
  EXPECT_GT(s.ratio_peak, 1.0);
  EXPECT_GE(s.ratio_full, s.ratio_peak);
  ASSERT_TRUE(s.bits_per_element.has_value());
  EXPECT_GT(*s.bits_per_element, 2.0);
  EXPECT_LT(*s.bits_per_element, 16.0);
  EXPECT_GT(s.spans, 0);
  EXPECT_EQ(s.full_layers, 30);
  EXPECT_GT(s.full_dense_bytes, s.full_policy_peak_bytes);
}

// The model-level peak (docs/simulate.md). The tiny run simulates every layer of its
// scaled model; their packed caches share one ViewScratch. Right after each call the
// simulation adds up what every layer's cache and the shared scratch hold (model_bytes,
// measured); the records say what that must be (the layers are called in order: after
// layer i's calls of chunk c, layers <= i hold chunk c's state, the others chunk c-1's,
// plus the view the call copied); the memory model gives the same at the steady state
// (MemoryReport::model_peak_bytes).
TEST(Simulate, ModelLevelPeakIsWhatTheCachesAndTheSharedViewHoldAtOnce) {
  const SimulationResult& r = tiny_result();
  const ModelPreset& p = r.preset;
  ASSERT_EQ(r.layers.size(), size_t(p.layers)) << "every layer of the scaled model is simulated";
  const size_t window_view = 2 * size_t(p.cache_tokens() * p.heads * p.head_dim) * 2;  // K + V, bf16
  std::vector<size_t> resident(r.layers.size(), 0);
  size_t from_records = 0, steady = 0;
  size_t buffer = 0;  // the shared view buffer: kept, grown by ViewScratch::grown_size to the largest view
  for (const ChunkRecord& c : r.chunks)
    for (size_t i = 0; i < c.layers.size(); ++i) {
      const PackedLayerRecord& pk = c.layers[i].packed[0];
      resident[i] = pk.resident_bytes;
      if (pk.view_bytes > buffer) buffer = ViewScratch::grown_size(buffer, pk.view_bytes, window_view);
      size_t held = buffer;
      for (const size_t b : resident) held += b;
      EXPECT_EQ(pk.model_bytes, held) << "chunk " << c.chunk.index << ", layer " << i;
      EXPECT_LE(pk.view_bytes, window_view);
      from_records = std::max(from_records, held);
      if (c.chunk.index >= r.window_full_chunk + 2) steady = std::max(steady, pk.model_bytes);
    }
  const PackedSummary& s = r.summary[0];
  EXPECT_EQ(s.view_bytes, window_view) << "the full window's view";
  EXPECT_EQ(s.measured_model_peak_bytes, from_records);
  EXPECT_EQ(s.predicted_model_peak_bytes, s.measured_model_peak_bytes);
  EXPECT_TRUE(s.model_peak_matches);
  // Identical layers, all simulated: the scaled model's figure is the measured one.
  EXPECT_EQ(s.model_peak_bytes, s.measured_model_peak_bytes);
  EXPECT_EQ(s.model_peak_bytes, size_t(p.layers) * s.packed_peak_bytes + window_view);
  EXPECT_EQ(s.model_dense_bytes, size_t(p.layers) * s.dense_bytes);
  EXPECT_DOUBLE_EQ(s.ratio_model_peak, double(s.model_dense_bytes) / double(s.model_peak_bytes));
  EXPECT_LT(s.ratio_model_peak, s.ratio_peak) << "the view costs the packed side, not the dense one";
  // The memory model at the steady state, on the scaled shapes (2 layers).
  const MemoryReport mr = memory_report(MemoryShape::of(p), r.config.packed[0].quant);
  EXPECT_EQ(steady, mr.model_peak_bytes(ViewMemory::Shared));
  // The full-size model: 30 layers at the policy peak + one view of its dense window.
  EXPECT_EQ(s.full_model_peak_bytes, 30 * s.full_policy_peak_bytes + s.full_dense_bytes);
  EXPECT_EQ(s.full_model_dense_bytes, 30 * s.full_dense_bytes);
  EXPECT_DOUBLE_EQ(s.full_ratio_model_peak, double(s.full_model_dense_bytes) / double(s.full_model_peak_bytes));
}

TEST(Simulate, QualityZeroBeforeEncodingBoundedAfter) {
  const SimulationResult& r = tiny_result();
  bool seen = false;
  for (const ChunkRecord& c : r.chunks) {
    for (const LayerRecord& l : c.layers) {
      const PackedLayerRecord& pk = l.packed[0];
      if (pk.encoded_visible == 0) {
        // Identical views: the errors are exactly zero.
        EXPECT_EQ(pk.attention.err, 0.0) << "chunk " << c.chunk.index;
        EXPECT_DOUBLE_EQ(pk.attention.cosine(), 1.0);
        EXPECT_FALSE(pk.k.rel_mse().has_value());
      } else {
        seen = true;
        ASSERT_TRUE(pk.k.rel_mse() && pk.v.rel_mse());
        EXPECT_GT(*pk.k.rel_mse(), 0);
        EXPECT_LT(*pk.k.rel_mse(), 0.5);
        EXPECT_GT(*pk.v.rel_mse(), 0);
        EXPECT_LT(*pk.v.rel_mse(), 0.5);
        EXPECT_GT(pk.attention.rel_l2(), 0);
        EXPECT_LT(pk.attention.rel_l2(), 0.5);
        EXPECT_GT(pk.attention.cosine(), 0.9);
        EXPECT_EQ(pk.attention.vectors, c.queries * r.preset.heads);
      }
    }
  }
  EXPECT_TRUE(seen);
  const PackedSummary& s = r.summary[0];
  EXPECT_GT(s.quality_chunks, 0);
  ASSERT_TRUE(s.k.snr_db().has_value());
  EXPECT_GT(*s.k.snr_db(), 3.0);
  EXPECT_GE(s.worst_attention_rel_l2, s.attention.rel_l2() - 1e-12);
}

// Every figure except the wall times, as text, for determinism checks.
std::string figures(const SimulationResult& r) {
  std::ostringstream o;
  o.precision(17);
  for (const ChunkRecord& c : r.chunks)
    for (const LayerRecord& l : c.layers) {
      o << c.chunk.index << ' ' << l.layer << ' ' << l.dense_resident_bytes << ' ' << l.dense_transient_peak_bytes
        << ' ' << l.window_tokens;
      for (const PackedLayerRecord& p : l.packed)
        o << " | " << p.resident_bytes << ' ' << p.transient_peak_bytes << ' ' << p.encoded_tokens << ' '
          << p.encoded_visible << ' ' << p.encoded_bytes << ' ' << p.spans_encoded << ' ' << p.k.err << ' ' << p.k.ref
          << ' ' << p.v.err << ' ' << p.v.ref << ' ' << p.attention.err << ' ' << p.attention.ref << ' '
          << p.attention.cos_sum << ' ' << p.attention.cos_min << ' ' << p.view_bytes << ' ' << p.model_bytes;
      o << '\n';
    }
  return o.str();
}

TEST(Simulate, DeterministicAcrossThreadCounts) {
  SimulationConfig c = tiny_config();
  c.chunks = 9;
  c.threads = 1;
  const SimulationResult a = simulate(c);
  c.threads = 2;
  const SimulationResult b = simulate(c);
  EXPECT_EQ(figures(a), figures(b));
  c.seed = 7;
  const SimulationResult other = simulate(c);
  EXPECT_NE(figures(a), figures(other)) << "another seed is another video";
}

TEST(Simulate, SeveralConfigurationsAndStepNoise) {
  SimulationConfig c = tiny_config();
  c.chunks = 8;
  c.layers = 1;
  c.steps = 3;
  c.attention_every_step = true;
  PackedConfig p4 = c.packed[0];
  p4.label = "int4";
  p4.quant.enable(4);
  c.packed.push_back(p4);
  const SimulationResult r = simulate(c);
  ASSERT_EQ(r.summary.size(), 2u);
  EXPECT_EQ(r.summary[1].label, "int4");
  expect_times_attributed(r);
  for (const ChunkRecord& ch : r.chunks) {
    ASSERT_EQ(ch.layers[0].packed.size(), 2u);
    const PackedLayerRecord &a = ch.layers[0].packed[0], &b = ch.layers[0].packed[1];
    EXPECT_EQ(a.attention.vectors, 3 * ch.queries * r.preset.heads) << "attention scored at every step";
    EXPECT_EQ(b.encoded_tokens, a.encoded_tokens) << "the policy does not depend on bits";
    if (a.encoded_visible > 0) {
      EXPECT_GT(a.encoded_bytes, 0u);
      EXPECT_GT(b.encoded_bytes, a.encoded_bytes) << "int4 codes take more bytes";
      EXPECT_LT(*b.k.rel_mse(), *a.k.rel_mse()) << "int4 reconstructs K better";
    }
  }
}

// ---- JSON ---------------------------------------------------------------------
// (Validated against docs/simulate.schema.json by tests/cli/simulate.sh, which also
// runs this file's tiny configuration through `qvg simulate --json`.)

TEST(SimulateJson, Content) {
  const json doc = json::parse(simulation_json(tiny_result()));
  EXPECT_EQ(doc["format"], "qvg.simulate/1");
  EXPECT_EQ(doc["generator"], std::string("qvg ") + kVersion);
  EXPECT_EQ(doc["chunks"].size(), 12u);
  EXPECT_EQ(doc["chunks"][0]["layers"].size(), 2u);
  EXPECT_EQ(doc["summary"][0]["label"], "int2");
  EXPECT_EQ(doc["workload"]["assumed"], json({"sink", "k_norm_spread", "v_wall_ratio", "v_norm_spread", "magnitude"}));
  // The chunk aggregates pool the layers' sums.
  const ChunkRecord& last = tiny_result().chunks.back();
  AttentionSums a;
  for (const LayerRecord& l : last.layers) a.add(l.packed[0].attention);
  EXPECT_NEAR(doc["chunks"][11]["packed"][0]["attention_rel_l2"].get<double>(), a.rel_l2(), 1e-12);
  // One line when indent < 0.
  EXPECT_EQ(simulation_json(tiny_result(), -1).find('\n'), std::string::npos);
}

// ---- SVG --------------------------------------------------------------------

// Tag balance of an SVG document: every <tag> closed in order, self-closing tags
// skipped, the prolog and comments ignored. Returns the element names seen.
std::multiset<std::string> check_xml(const std::string& s) {
  std::vector<std::string> stack;
  std::multiset<std::string> seen;
  size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const size_t j = s.find('>', i);
    EXPECT_NE(j, std::string::npos);
    if (j == std::string::npos) break;
    const std::string tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      EXPECT_FALSE(stack.empty()) << "closing " << tag << " without opening";
      if (stack.empty()) continue;
      EXPECT_EQ(stack.back(), tag.substr(1));
      stack.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    seen.insert(name);
    if (tag.back() != '/') stack.push_back(name);
  }
  EXPECT_TRUE(stack.empty()) << "unclosed elements";
  for (size_t a = s.find('&'); a != std::string::npos; a = s.find('&', a + 1)) {
    const std::string ent = s.substr(a, 6);
    EXPECT_TRUE(ent.rfind("&amp;", 0) == 0 || ent.rfind("&lt;", 0) == 0 || ent.rfind("&gt;", 0) == 0 ||
                ent.rfind("&quot;", 0) == 0)
        << "raw ampersand: " << ent;
  }
  return seen;
}

TEST(SimulateSvg, MemoryAndAttentionChartsAreWellFormed) {
  const std::string mem = memory_chart_svg(tiny_result());
  const std::string att = attention_chart_svg(tiny_result());
  for (const std::string* s : {&mem, &att}) {
    EXPECT_EQ(s->rfind("<?xml", 0), 0u);
    EXPECT_NE(s->find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
    EXPECT_EQ(s->substr(s->size() - 7), "</svg>\n");
    const auto seen = check_xml(*s);
    EXPECT_GE(seen.count("text"), 10u) << "title, labels and ticks";
    EXPECT_GE(seen.count("line"), 8u) << "grid, axes, legend";
    EXPECT_NE(s->find("window full"), std::string::npos);
  }
  // memory, for the whole model: dense caches, packed caches + the shared view, and
  // one layer's transient, labelled as such.
  EXPECT_NE(mem.find("dense caches (bf16, 2 layers)"), std::string::npos);
  EXPECT_NE(mem.find("packed int2: 2 layers'"), std::string::npos);
  EXPECT_NE(mem.find("one shared view"), std::string::npos);
  EXPECT_NE(mem.find("one layer only; not the model's peak"), std::string::npos);
  EXPECT_NE(mem.find("MiB, all 2 layers"), std::string::npos);
  size_t n = 0;
  for (size_t i = 0; (i = mem.find("class=\"series\"", i)) != std::string::npos; ++i) ++n;
  EXPECT_EQ(n, 3u);
  // attention: two thin layer lines + the pooled line.
  n = 0;
  for (size_t i = 0; (i = att.find("class=\"series\"", i)) != std::string::npos; ++i) ++n;
  EXPECT_EQ(n, 3u);
  EXPECT_NE(att.find("first span encoded"), std::string::npos);
  EXPECT_NE(att.find("attention relative error (%)"), std::string::npos);
}

TEST(SimulateSvg, RendererEscapesAndRejectsBadInput) {
  LineChart c;
  c.title = "a < b & c";
  c.series.push_back({});
  c.series[0].name = "x>y";
  c.series[0].x = {0, 1, 2};
  c.series[0].y = {1, std::nan(""), 3};
  const std::string s = render_line_chart(c);
  check_xml(s);
  EXPECT_NE(s.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(s.find("x&gt;y"), std::string::npos);
  // The NaN breaks the line into two subpaths.
  const size_t p = s.find("class=\"series\" d=\"");
  ASSERT_NE(p, std::string::npos);
  const std::string d = s.substr(p, s.find('"', p + 18) - p);
  EXPECT_EQ(std::count(d.begin(), d.end(), 'M'), 2);

  c.series[0].y = {1, 2};
  EXPECT_THROW(render_line_chart(c), InvalidArgument);
  c.series.clear();
  c.width = 100;
  EXPECT_THROW(render_line_chart(c), InvalidArgument);
  c.width = 400;
  EXPECT_NO_THROW(render_line_chart(c));  // empty charts render axes only
}

TEST(SimulateSvg, LogAxisScatterAndCallouts) {
  LineChart c;
  c.log_y = true;
  c.x_to_ticks = true;
  // y <= 0 is not drawn on a log axis.
  c.series.push_back({.name = "points",
                      .x = {1, 2, 3},
                      .y = {0.001, 0.05, -1},
                      .markers = true,
                      .line = false,
                      .marker_fill = "none",
                      .point_titles = {"a", "b", "c"},
                      .id = "points",
                      .point_class = "pt"});
  c.callouts.push_back({"ref", "the reference", 3, 0.5, "#ff0000", 10});
  const std::string svg = render_line_chart(c);
  check_xml(svg);
  for (const char* t : {">0.001<", ">0.01<", ">0.1<", ">1<"}) EXPECT_NE(svg.find(t), std::string::npos) << t;
  EXPECT_EQ(svg.find("class=\"series\""), std::string::npos) << "a scatter has no line";
  size_t n = 0;
  for (size_t i = 0; (i = svg.find("class=\"pt\"", i)) != std::string::npos; ++i) ++n;
  EXPECT_EQ(n, 2u);
  EXPECT_NE(svg.find("<title>b</title></circle>"), std::string::npos);
  EXPECT_NE(svg.find("<g id=\"points\">"), std::string::npos);
  // The callout sits at the right edge: its text turns left.
  EXPECT_NE(svg.find("<g id=\"ref\">"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"end\">the reference</text>"), std::string::npos);
  EXPECT_NE(svg.find("id=\"x-label\""), std::string::npos);
  c.series[0].point_titles = {"a"};
  EXPECT_THROW(render_line_chart(c), InvalidArgument);
}

TEST(SimulateSvg, NiceTicks) {
  auto t = nice_ticks(0, 43.2, 6);
  ASSERT_GE(t.size(), 4u);
  EXPECT_EQ(t.front(), 0);
  const double step = t[1] - t[0];
  const double mant = step / std::pow(10.0, std::floor(std::log10(step)));
  EXPECT_TRUE(std::abs(mant - 1) < 1e-9 || std::abs(mant - 2) < 1e-9 || std::abs(mant - 2.5) < 1e-9 ||
              std::abs(mant - 5) < 1e-9)
      << step;
  for (size_t i = 1; i < t.size(); ++i) EXPECT_NEAR(t[i] - t[i - 1], step, 1e-9);
  EXPECT_LE(t.back(), 43.2);
  EXPECT_GT(t.back() + step, 43.2);
  EXPECT_EQ(nice_ticks(3, 3).size(), 1u);
  EXPECT_TRUE(nice_ticks(0, std::nan("")).empty());
  const auto small = nice_ticks(0.001, 0.0042, 5);
  EXPECT_GE(small.size(), 3u);
}

// ---- the report directory ---------------------------------------------------

TEST(SimulateReport, WritesFourFilesOrNothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("qvg_sim_report_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_simulation_report(tiny_result(), (dir / "sub").string());
  for (const char* f : {"report.json", "memory.svg", "attention.svg", "summary.txt"})
    EXPECT_TRUE(fs::is_regular_file(dir / "sub" / f)) << f;
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir / "sub")) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 4u) << "no temporaries left behind";
  std::ifstream j(dir / "sub" / "report.json");
  std::stringstream text;
  text << j.rdbuf();
  EXPECT_EQ(text.str(), simulation_json(tiny_result(), 2) + "\n");
  // A file where the directory should be: an error naming it.
  std::ofstream(dir / "file").put('x');
  try {
    write_simulation_report(tiny_result(), (dir / "file").string());
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("file"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(SimulateReport, SummaryTextSaysWhatAndHowToRead) {
  const std::string s = simulation_summary_text(tiny_result());
  for (const char* w :
       {"what was simulated", "self-forcing-1.3b", "x0.05", "context 15 frames", "(a)", "memory",
        "the whole model (2 layers at this scale, one shared view window)", "at its peak than with dense",
        "bits per element", "quality", "attention output", "K SNR", "time", "per denoising step", "wall time",
        "How to read it", "memory model", "one layer at a time"})
    EXPECT_NE(s.find(w), std::string::npos) << w << "\n" << s;
  EXPECT_EQ(s.find("nothing was encoded"), std::string::npos);
  EXPECT_EQ(tiny_result().summary[0].first_encoded_chunk, 3) << "spans of 2 after keep_recent 1: chunks 0-1 at 3";
}

// A run too short to encode anything says so instead of a saving.
TEST(SimulateReport, ShortRunSaysNothingWasEncoded) {
  SimulationConfig c = tiny_config();
  c.chunks = 3;  // spans of 2 chunks after keep_recent 1: the first encoding comes with chunk 3
  c.layers = 1;
  const SimulationResult r = simulate(c);
  EXPECT_EQ(r.summary[0].first_encoded_chunk, -1);
  const std::string s = simulation_summary_text(r);
  EXPECT_NE(s.find("nothing was encoded during these 3 chunks"), std::string::npos) << s;
  EXPECT_NE(s.find("(nothing encoded yet)"), std::string::npos) << s;
  EXPECT_EQ(s.find("memory at its peak than with dense"), std::string::npos) << "no saving claimed\n" << s;
  EXPECT_NE(memory_chart_svg(r).find("nothing encoded yet"), std::string::npos);
  const json doc = json::parse(simulation_json(r));
  EXPECT_TRUE(doc["summary"][0]["first_encoded_chunk"].is_null());
}

// Time per denoising step (docs/simulate.md) = the chunk's advance (the encoding)
// spread over its steps + one view reconstruction, over the full-window chunks, per
// layer; the side-by-side table shows it and its ratio to the first configuration's.
TEST(SimulateReport, TimePerStepInTheSideBySideTable) {
  SimulationConfig c = tiny_config();
  c.chunks = 8;
  c.layers = 1;
  PackedConfig p4 = c.packed[0];
  p4.label = "int4";
  p4.quant.enable(4);
  c.packed.push_back(p4);
  const SimulationResult r = simulate(c);
  ASSERT_GE(r.window_full_chunk, 0);
  for (size_t j = 0; j < 2; ++j) {
    double t = 0;
    int n = 0;
    for (const ChunkRecord& ch : r.chunks)
      if (ch.chunk.index >= r.window_full_chunk) {
        t += (ch.layers[0].packed[j].encode_s + ch.layers[0].packed[j].decode_s) / c.steps;
        ++n;
      }
    ASSERT_GT(n, 0);
    EXPECT_NEAR(r.summary[j].step_s, t / n, 1e-12 * (1 + t));
    EXPECT_GT(r.summary[j].step_s, 0);
  }
  const std::string s = simulation_summary_text(r);
  const size_t table = s.find("== side by side (against int2");
  ASSERT_NE(table, std::string::npos) << s;
  EXPECT_NE(s.find("time per step", table), std::string::npos);
  const std::string ratio = fmt::format("({:.2f}x)", r.summary[1].step_s / r.summary[0].step_s);
  const size_t row = s.find("\n  int4 ", table);
  ASSERT_NE(row, std::string::npos) << s;
  const std::string line = s.substr(row + 1, s.find('\n', row + 1) - row - 1);
  EXPECT_NE(line.find(fmt::format("{:.2f}x", r.summary[1].full_ratio_model_peak)), std::string::npos) << line;
  EXPECT_NE(line.find(ratio), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("{:.2f} ms", 1e3 * r.summary[1].step_s)), std::string::npos) << line;
}

// The charts' text fits: wrap_chart_text cuts lines no wider than asked (DejaVu Sans
// metrics), prefers separators, never splits a UTF-8 character, ends a cut-short last
// line with an ellipsis; chart_text_width uses the font's advances.
TEST(SimulateSvg, ChartTextWrapsToTheWidth) {
  EXPECT_DOUBLE_EQ(chart_text_width("iW", 10, false), (278 + 989) / 100.0);
  EXPECT_DOUBLE_EQ(chart_text_width("iW", 10, true), (343 + 1103) / 100.0);
  EXPECT_GT(chart_text_width("a \u00b7 b", 12, false), chart_text_width("a b", 12, false));
  const std::string text =
      "engine: model peak 1.87 MiB vs dense 1.48 MiB (0.79x);  recommended int2: model peak 1.52 MiB vs dense "
      "1.48 MiB (0.97x) \u00b7 and a longer tail of words \u2014 with non-ASCII \u00d7 characters";
  for (const double width : {120.0, 300.0, 700.0}) {
    const std::vector<std::string> lines = wrap_chart_text(text, 13, true, width, 20);
    ASSERT_FALSE(lines.empty());
    std::string joined;
    for (const std::string& l : lines) {
      EXPECT_LE(chart_text_width(l, 13, true), width) << l;
      joined += (joined.empty() ? "" : " ") + l;
    }
    // Nothing lost but the spaces at the cuts (and the separators' middle dots).
    std::string a = text, b = joined;
    for (std::string* x : {&a, &b}) {
      std::string y;
      for (size_t i = 0; i < x->size(); ++i)
        if ((*x)[i] != ' ' && x->compare(i, 2, "\u00b7") != 0)
          y += (*x)[i];
        else if ((*x)[i] != ' ')
          ++i;
      *x = y;
    }
    EXPECT_EQ(a, b) << width;
  }
  const std::vector<std::string> two = wrap_chart_text(text, 13, true, 300, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].substr(two[1].size() - 3), "\u2026");
  EXPECT_LE(chart_text_width(two[1], 13, true), 300.0);
  const std::vector<std::string> first = wrap_chart_text(text, 13, true, 700, 3);
  EXPECT_EQ(first[0].back(), ';') << "cut after the separator: " << first[0];
  EXPECT_TRUE(wrap_chart_text("", 12, false, 100, 3).empty());
  // A word wider than the line is cut inside, never inside a UTF-8 character.
  for (const std::string& l : wrap_chart_text("\u00d7\u00d7\u00d7\u00d7\u00d7\u00d7", 12, false, 30, 10))
    EXPECT_EQ(l.size() % 2, 0u) << l;
}

// ---- configuration ----------------------------------------------------------

void expect_invalid(const SimulationConfig& c, const std::string& field) {
  try {
    c.validate();
    ADD_FAILURE() << "expected InvalidArgument naming " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(SimulateConfig, ErrorsNameTheField) {
  SimulationConfig c = tiny_config();
  EXPECT_NO_THROW(c.validate());
  auto with = [&](auto f) {
    SimulationConfig x = tiny_config();
    f(x);
    return x;
  };
  expect_invalid(with([](SimulationConfig& x) { x.model = "nope"; }), "self-forcing-1.3b");
  expect_invalid(with([](SimulationConfig& x) { x.scale = 0; }), "scale");
  expect_invalid(with([](SimulationConfig& x) { x.scale = 1.5; }), "scale");
  expect_invalid(with([](SimulationConfig& x) { x.context_frames = 0; }), "context_frames");
  expect_invalid(with([](SimulationConfig& x) { x.chunks = 0; }), "chunks");
  expect_invalid(with([](SimulationConfig& x) { x.steps = 0; }), "steps");
  expect_invalid(with([](SimulationConfig& x) { x.step_noise = -0.1; }), "step_noise");
  expect_invalid(with([](SimulationConfig& x) { x.query_stride = 0; }), "query_stride");
  expect_invalid(with([](SimulationConfig& x) { x.layers = 3; }), "layers");
  expect_invalid(with([](SimulationConfig& x) { x.threads = -1; }), "threads");
  expect_invalid(with([](SimulationConfig& x) { x.packed.clear(); }), "packed");
  expect_invalid(with([](SimulationConfig& x) { x.packed.push_back(x.packed[0]); }), "unique");
  expect_invalid(with([](SimulationConfig& x) { x.packed[0].label.clear(); }), "label");
  expect_invalid(with([](SimulationConfig& x) { x.packed[0].quant.quantize = false; }), "bits");
  expect_invalid(with([](SimulationConfig& x) { x.packed[0].quant.codec.block_size = 48; }), "block_size");
  EXPECT_THROW(simulate(with([](SimulationConfig& x) { x.chunks = 0; })), InvalidArgument);
}

TEST(SimulateConfig, SelectLayers) {
  EXPECT_EQ(select_layers(8, 1), (std::vector<int>{4}));
  EXPECT_EQ(select_layers(8, 2), (std::vector<int>{2, 6}));
  EXPECT_EQ(select_layers(3, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_THROW(select_layers(8, 0), InvalidArgument);
  EXPECT_THROW(select_layers(8, 9), InvalidArgument);
}

TEST(SimulateConfig, DefaultsAreThePublishedConfiguration) {
  const PackedConfig p = default_packed_config();
  EXPECT_TRUE(p.quant.enabled());
  EXPECT_EQ(p.quant.codec.bits, 2);
  EXPECT_EQ(p.quant.codec.centroids, 256);
  EXPECT_EQ(p.quant.codec.block_size, 64);
  EXPECT_EQ(p.quant.span_chunks, 8);
  const SimulationConfig c;
  EXPECT_NO_THROW(c.validate());
  ASSERT_EQ(c.packed.size(), 1u);
  EXPECT_EQ(c.packed[0].label, "int2");
  EXPECT_EQ(c.model, "self-forcing-1.3b");
  EXPECT_EQ(simulation_preset(c).cache_tokens(), (72 + 3) * 390);
}

TEST(ErrorSums, Definitions) {
  ErrorSums e;
  EXPECT_FALSE(e.rel_mse().has_value());
  e.err = 0.01;
  e.ref = 1;
  e.tokens = 3;
  EXPECT_NEAR(*e.rel_mse(), 0.01, 1e-15);
  EXPECT_NEAR(*e.snr_db(), 20.0, 1e-12);
  e.err = 0;
  EXPECT_FALSE(e.snr_db().has_value()) << "identical: infinite SNR";

  Tensor a(DType::F32, Shape4{1, 2, 1, 2}), b(DType::F32, Shape4{1, 2, 1, 2});
  auto* pa = static_cast<float*>(a.data());
  auto* pb = static_cast<float*>(b.data());
  pa[0] = 1, pa[1] = 0, pa[2] = 0, pa[3] = 0;  // second vector zero
  pb[0] = 0, pb[1] = 1, pb[2] = 0, pb[3] = 0;
  const AttentionSums s = attention_error(a, b);
  EXPECT_EQ(s.vectors, 2);
  EXPECT_NEAR(s.cosine(), 0.5, 1e-15) << "orthogonal (0) and both-zero (1)";
  EXPECT_NEAR(s.rel_l2(), std::sqrt(2.0), 1e-15);
  EXPECT_EQ(s.cos_min, 0.0);
  EXPECT_THROW(attention_error(a, Tensor(DType::F32, Shape4{1, 1, 1, 2})), InvalidArgument);
}

// ---- compare ----------------------------------------------------------------

TEST(Compare, TinyWorkloadRowsAndSizes) {
  CompareConfig c;
  c.scale = 0.05;
  c.layers = 1;
  c.query_stride = 4;
  c.codec.bits = 2;
  c.codec.centroids = 16;
  c.codec.block_size = 64;
  c.threads = 2;
  const CompareResult r = compare(c);
  EXPECT_EQ(r.context_chunks, default_context_chunks(r.preset, 16));
  EXPECT_EQ(r.context_chunks, (64 * 16 + 251) / 252);
  EXPECT_GE(r.context_tokens, 64 * 16);
  ASSERT_EQ(r.rows.size(), 4u);
  const std::vector<std::string> names = {"qvg", "rtn", "kivi", "quarot"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.rows[i].method, names[i]);
    EXPECT_NEAR(r.rows[i].ratio, 16.0 / r.rows[i].bits_per_element, 1e-12);
    EXPECT_GT(r.rows[i].attention.cosine(), 0.5);
  }
  EXPECT_DOUBLE_EQ(r.rows[1].bits_per_element, 2.25) << "2-bit codes + one bf16 scale per 64 channels";
  EXPECT_DOUBLE_EQ(r.rows[3].bits_per_element, 2.25);
  {
    // KIVI: bf16 scale + zero per group: K per channel over 64 tokens (the last group
    // shorter), V per 64 channels of a token.
    const double S = double(r.context_tokens), D = 128;
    const double bytes = 2 * S * D * 2 / 8 + 4 * std::ceil(S / 64) * D + 4 * S * (D / 64);
    EXPECT_NEAR(r.rows[2].bits_per_element, bytes * 8 / (2 * S * D), 1e-12);
  }
  EXPECT_GT(r.rows[0].bits_per_element, 2.0);
  // Clustering beats plain rounding by far at int2, even on a tiny workload.
  EXPECT_GT(*r.rows[0].k.snr_db(), *r.rows[1].k.snr_db());
  EXPECT_GT(*r.rows[0].v.snr_db(), *r.rows[1].v.snr_db());
  EXPECT_LT(r.rows[0].attention.rel_l2(), r.rows[1].attention.rel_l2());

  const json j = json::parse(compare_json(r));
  EXPECT_EQ(j["format"], "qvg.compare/1");
  ASSERT_EQ(j["rows"].size(), 4u);
  for (const char* k : {"method", "bits_per_element", "compression_ratio", "k_snr_db", "v_snr_db", "kv_snr_db",
                        "attention_rel_l2", "attention_cosine"})
    EXPECT_TRUE(j["rows"][0].contains(k)) << k;
  const std::string t = compare_table_text(r);
  for (const char* w : {"method", "bits/elem", "qvg", "rtn", "kivi", "quarot", "attn error", "cosine"})
    EXPECT_NE(t.find(w), std::string::npos) << w;
}

TEST(Compare, ConfigErrors) {
  CompareConfig c;
  c.scale = 0.05;
  c.layers = 1;
  EXPECT_NO_THROW(c.validate());
  CompareConfig x = c;
  x.layers = 5;
  EXPECT_THROW(x.validate(), InvalidArgument);
  x = c;
  x.context_chunks = 0;
  EXPECT_THROW(x.validate(), InvalidArgument);
  x = c;
  x.codec.block_size = 48;
  EXPECT_THROW(x.validate(), InvalidArgument);
  x = c;
  x.query_stride = 0;
  EXPECT_THROW(x.validate(), InvalidArgument);
  x = c;
  x.model = "nope";
  EXPECT_THROW(compare(x), InvalidArgument);
  EXPECT_EQ(default_context_chunks(find_model_preset("self-forcing-1.3b").scaled(0.25), 256), 15);
}

}  // namespace
}  // namespace qvg
