// `qvg memory`: the exact memory table of a model preset's K/V cache, computed from
// the packed format (spec 1.5) and the packed-cache policy (spec 4) without
// allocating anything (include/qvg/eval/memory.h).
//
// Figures per layer and for all layers: the bf16 context, the fully encoded context,
// the dense cache of the same window (context + one chunk, what the packed cache
// replaces) and the packed cache's steady-state peak. Ratios: bf16 context / fully
// encoded context, and dense cache / policy peak. With --json exactly
//   {per_layer_bf16_mib, per_layer_packed_mib, total_bf16_mib, total_packed_mib,
//    ratio, per_layer_policy_mib, policy_ratio}
// (MiB = 2^20 bytes) preceded by the model, its layers, context frames, bits and
// centroids, followed by the policy settings and the model-level figures (every
// layer's cache + the view memory, MemoryReport::model_peak_bytes; the engine's default
// computed the same way). With --branches N (1..1024) the table adds a section for N
// sessions forked from the state at the peak (MemoryReport::branches: the encoded part
// shared, the raw part copied per branch) beside N copies and N dense caches, and the
// JSON an object "branches" at its end; without it both are as above. Defaults: the
// preset's context and sink policy, --bits 2 and the codec and cache defaults of spec
// section 2.
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "cli_util.h"
#include "codec_flags.h"
#include "command.h"
#include "qvg/error.h"
#include "qvg/eval/memory.h"
#include "qvg/eval/simulate.h"
#include "qvg/eval/workload.h"
#include "sim/report_util.h"
#include "sim/sim_common.h"
#include "workload_flags.h"

namespace qvg::cli {
namespace {

struct MemoryOptions {
  std::string model;
  std::optional<std::string> frames;
  CodecConfig codec;  // the codec flags (the profile's values where not given: add_profile_flag)
  CacheFlags cache;
  std::string k_config, v_config;       // per-role codec settings (field=value,...)
  std::optional<std::string> branches;  // --branches N
  bool json = false;
  CLI::App* cmd = nullptr;  // to read --profile (its per-role and policy settings)
};

using sim::grouped;
using sim::mib;

/// "2 sink spans of 4,680 tokens, 20 spans of 4,680 tokens, 1 span of 3,120 tokens".
std::string describe_layout(const std::vector<SegmentSize>& segs) {
  std::string out;
  size_t i = 0;
  while (i < segs.size()) {
    size_t j = i;
    while (j < segs.size() && segs[j].sink == segs[i].sink && segs[j].packed == segs[i].packed &&
           segs[j].tokens() == segs[i].tokens())
      ++j;
    const size_t n = j - i;
    const std::string what = segs[i].packed ? (n == 1 ? "span" : "spans") : (n == 1 ? "raw chunk" : "raw chunks");
    out += fmt::format("{}{} {}{} of {} tokens", out.empty() ? "" : ", ", n, segs[i].sink ? "sink " : "", what,
                       grouped(segs[i].tokens()));
    i = j;
  }
  return out;
}

QuantArgs build_args(const MemoryOptions& o, const ModelPreset& p) {
  QuantArgs a;
  // The profile first (its per-role settings); the codec flags given override its codec
  // (add_profile_flag), and the policy flags its policy (apply_cache_flags).
  const std::optional<std::string> profile = o.cmd ? given_profile(*o.cmd) : std::nullopt;
  if (profile) a.apply_profile(*profile);  // a valid name: add_profile_flag checked it
  check_codec_flags(o.codec);
  a.codec = o.codec;
  a.quantize = true;
  apply_cache_flags(o.cache, p, a, profile);
  if (!o.k_config.empty()) a.k = parse_role_codec(o.k_config, "--k-config");
  if (!o.v_config.empty()) a.v = parse_role_codec(o.v_config, "--v-config");
  a.validate_for_head_dim(p.head_dim);
  return a;
}

/// The engine's default configuration (qvg/eval/simulate.h) on the same shapes, for the
/// model-level comparison.
MemoryReport engine_report(const ModelPreset& p, const MemoryShape& s) {
  return memory_report(s, engine_default_packed_config(p).quant);
}

void print_table(const ModelPreset& p, const MemoryShape& s, const MemoryReport& r, const MemoryReport& engine,
                 bool frames_overridden) {
  const QuantArgs& a = r.args;
  const auto& as = p.assumed;
  const std::string_view A = assumed_mark(true);
  fmt::print("qvg memory: {} — {}\n", p.name, p.model);
  fmt::print(
      "  model    {}{} layers, {}{} heads x head_dim {}{}, {} tokens/frame ({} x {} patches{}), "
      "{}{} frames/chunk = {} tokens\n",
      p.layers, assumed_mark(as.layers), p.heads, assumed_mark(as.heads), p.head_dim, assumed_mark(as.head_dim),
      grouped(p.tokens_per_frame()), p.grid_h, p.grid_w, assumed_mark(as.grid), p.frames_per_chunk,
      assumed_mark(as.frames_per_chunk), grouped(s.chunk_tokens));
  const int64_t ctx_frames = s.context_tokens / p.tokens_per_frame();
  const int64_t sink_frames = s.sink_tokens / p.tokens_per_frame();
  const std::string sink_mark(frames_overridden ? "" : assumed_mark(as.sink));
  const std::string sink =
      sink_frames == 0 ? fmt::format("no sink{}", sink_mark)
                       : fmt::format("sink {} frames{} = {} tokens", sink_frames, sink_mark, grouped(s.sink_tokens));
  fmt::print("  context  {} frames = {} tokens{}, {}; window = context + 1 chunk = {} tokens\n", ctx_frames,
             grouped(s.context_tokens), frames_overridden ? " (--frames)" : assumed_mark(as.context), sink,
             grouped(s.cache_tokens()));
  const CodecConfig c = a.codec;
  fmt::print("  codec    int{}, {} centroids, block {}, {} stage{}, {} scales, {} scaling, {}{}\n", c.bits,
             c.centroids, c.block_size, c.stages, c.stages == 1 ? "" : "s", name(c.scale_dtype), name(c.scaling),
             c.asymmetric ? "asymmetric" : "symmetric", c.scale_search == ScaleSearch::Mse ? ", scale search mse" : "");
  if (a.per_role())
    fmt::print("  per role {}{}{}\n", a.k.describe("k_"), !a.k.empty() && !a.v.empty() ? " " : "", a.v.describe("v_"));
  // The policy as the settings table names it, then what refinement layers cost.
  fmt::print("  cache    {}{}\n\n", sim::policy_text(a, kSettingsNotModelled),
             r.peak_step.refine_bytes > 0
                 ? fmt::format(" (refinement layers: {} at the peak)", mib(r.peak_step.refine_bytes))
                 : std::string());

  const std::string all = fmt::format("all {} layers", s.layers);
  fmt::print("  {:<40} {:>16} {:>18} {:>9}\n", "", "per layer", all, "ratio");
  auto row = [&](const std::string& label, size_t per_layer, const std::string& ratio) {
    fmt::print("  {:<40} {:>16} {:>18} {:>9}\n", label, mib(per_layer), mib(r.total(per_layer)), ratio);
  };
  row("bf16 context (K+V)", r.raw_context_bytes, "1.00x");
  row("fully encoded context", r.packed_context_bytes, fmt::format("{:.2f}x", r.ratio()));
  row("dense cache: context + chunk, bf16", r.dense_window_bytes, "");
  row("packed cache: policy peak", r.policy_peak_bytes, fmt::format("{:.2f}x", r.policy_ratio()));
  fmt::print("  {:<40} {:>16} {:>18} {:>9}\n", "one decoded view of the window (K+V)", mib(r.view_window_bytes),
             "shared: one", "");
  // The model level: what the device holds at once (MemoryReport::model_peak_bytes).
  fmt::print("\n  the model, all {} layers at once (every layer's cache + the view memory):\n", s.layers);
  auto model_row = [&](const std::string& label, size_t bytes, const std::string& ratio) {
    fmt::print("  {:<58} {:>18} {:>9}\n", label, mib(bytes), ratio);
  };
  model_row("dense caches (views are ranges of the buffers: no copy)", r.dense_model_bytes(), "1.00x");
  model_row("packed caches + one shared view (the headline)", r.model_peak_bytes(ViewMemory::Shared),
            fmt::format("{:.2f}x", r.model_peak_ratio(ViewMemory::Shared)));
  model_row("packed caches + one view per layer (no shared scratch)", r.model_peak_bytes(ViewMemory::PerLayer),
            fmt::format("{:.2f}x", r.model_peak_ratio(ViewMemory::PerLayer)));
  model_row("the engine's default, computed the same way (one view)", engine.model_peak_bytes(ViewMemory::Shared),
            fmt::format("{:.2f}x", engine.model_peak_ratio(ViewMemory::Shared)));
  fmt::print("\n  fully encoded context: {}\n", describe_layout(r.context_layout));
  fmt::print(
      "  policy peak: {} encoded + {} raw tokens resident ({} segments) at the steady-state peak; its ratio "
      "is vs the bf16 context (vs the dense cache of the same window, context + chunk: {:.2f}x)\n",
      grouped(r.peak_step.packed_tokens), grouped(r.peak_step.raw_tokens), r.peak_step.segments,
      r.policy_ratio_vs_dense_window());
  fmt::print(
      "  model level: ratios are the dense caches over the packed ones; the layers share one view when their caches "
      "share a ViewScratch (qvg.torch does; the engine frees its view after each layer's attention), else each "
      "keeps one; a call that encodes holds a span's buffers beyond this for the one layer running it "
      "(docs/simulate.md). The engine's default: int2, 128 centroids, compat scaling, spans of one chunk, "
      "keep_recent 1.\n");
  fmt::print("  MiB = 2^20 bytes; {} = an assumption where the public material is silent (docs/workload.md)\n",
             A.substr(1));
}

/// The --branches section of the table: N sessions forked from the state at the peak.
void print_branches(const MemoryShape& s, const BranchesMemory& b) {
  fmt::print(
      "\n  {} branch{} from one state (fork at the policy peak: the encoded part shared, the raw part "
      "copied by each branch):\n",
      b.n, b.n == 1 ? "" : "es");
  const std::string all = fmt::format("all {} layers", s.layers);
  fmt::print("  {:<40} {:>16} {:>18} {:>9}\n", "", "per layer", all, "ratio");
  auto row = [&](const std::string& label, size_t per_layer, size_t model, const std::string& ratio) {
    fmt::print("  {:<40} {:>16} {:>18} {:>9}\n", label, mib(per_layer), mib(model), ratio);
  };
  row("encoded part, held once (shared)", b.shared_bytes, b.shared_bytes * size_t(s.layers), "");
  row("raw part, one per branch", b.own_bytes, b.own_bytes * size_t(s.layers), "");
  row(fmt::format("{} forked branches", b.n), b.forked_bytes, b.model_forked_bytes, "1.00x");
  row(fmt::format("{} copies of the packed cache", b.n), b.copies_bytes, b.model_copies_bytes,
      fmt::format("{:.2f}x", b.ratio_vs_copies()));
  row(fmt::format("{} dense caches", b.n), b.dense_bytes, b.model_dense_bytes,
      fmt::format("{:.2f}x", b.ratio_vs_dense()));
  fmt::print(
      "  branches: the model column of the last three rows adds one view window per branch (none for the dense "
      "caches); ratios are each row over the forked branches. At the fork: each branch then encodes its own chunks "
      "and the shared spans leave the window, so one window of chunks later the branches hold as much as {} "
      "copies.\n",
      b.n);
}

void run_memory(const MemoryOptions& o) {
  const ModelPreset& p = find_model_preset(o.model);
  std::optional<int64_t> frames;
  if (o.frames) frames = parse_int_flag("--frames", *o.frames, 1, 10'000'000);
  const int64_t branches = o.branches ? parse_int_flag("--branches", *o.branches, 1, 1024) : 1;
  const QuantArgs args = build_args(o, p);
  const MemoryShape shape = MemoryShape::of(p, frames);
  const MemoryReport r = memory_report(shape, args);
  const MemoryReport engine = engine_report(p, shape);
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = p.name;
    j["layers"] = shape.layers;
    j["context_frames"] = shape.context_tokens / p.tokens_per_frame();
    j["bits"] = r.args.codec.bits;
    j["centroids"] = r.args.codec.centroids;
    j["per_layer_bf16_mib"] = to_mib(r.raw_context_bytes);
    j["per_layer_packed_mib"] = to_mib(r.packed_context_bytes);
    j["total_bf16_mib"] = to_mib(r.total(r.raw_context_bytes));
    j["total_packed_mib"] = to_mib(r.total(r.packed_context_bytes));
    j["ratio"] = r.ratio();
    j["per_layer_policy_mib"] = to_mib(r.policy_peak_bytes);
    j["policy_ratio"] = r.policy_ratio();
    j["policy_ratio_vs_dense_window"] = r.policy_ratio_vs_dense_window();
    j.update(sim::policy_json(r.args, kSettingsNotModelled));  // the policy settings memory takes
    j["per_layer_policy_refine_mib"] = to_mib(r.peak_step.refine_bytes);
    j["per_layer_view_mib"] = to_mib(r.view_window_bytes);
    j["model_dense_mib"] = to_mib(r.dense_model_bytes());
    j["model_peak_mib"] = to_mib(r.model_peak_bytes(ViewMemory::Shared));
    j["model_peak_ratio"] = r.model_peak_ratio(ViewMemory::Shared);
    j["model_peak_views_per_layer_mib"] = to_mib(r.model_peak_bytes(ViewMemory::PerLayer));
    j["model_peak_ratio_views_per_layer"] = r.model_peak_ratio(ViewMemory::PerLayer);
    j["engine_model_peak_mib"] = to_mib(engine.model_peak_bytes(ViewMemory::Shared));
    j["engine_model_peak_ratio"] = engine.model_peak_ratio(ViewMemory::Shared);
    if (o.branches) {
      const BranchesMemory b = r.branches(branches);
      nlohmann::ordered_json& jb = j["branches"];
      jb["n"] = b.n;
      jb["per_layer_shared_mib"] = to_mib(b.shared_bytes);
      jb["per_layer_own_mib"] = to_mib(b.own_bytes);
      jb["per_layer_forked_mib"] = to_mib(b.forked_bytes);
      jb["per_layer_copies_mib"] = to_mib(b.copies_bytes);
      jb["per_layer_dense_mib"] = to_mib(b.dense_bytes);
      jb["model_forked_mib"] = to_mib(b.model_forked_bytes);
      jb["model_copies_mib"] = to_mib(b.model_copies_bytes);
      jb["model_dense_mib"] = to_mib(b.model_dense_bytes);
      jb["ratio_vs_copies"] = b.ratio_vs_copies();
      jb["ratio_vs_dense"] = b.ratio_vs_dense();
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  print_table(p, shape, r, engine, frames.has_value());
  if (o.branches) print_branches(shape, r.branches(branches));
}

void register_memory(CLI::App& root) {
  auto o = std::make_shared<MemoryOptions>();
  CLI::App* cmd = root.add_subcommand(
      "memory", "Exact K/V cache memory of a model preset: bf16 vs packed (spec 1.5), and the packed cache's peak");
  o->cmd = cmd;
  add_model_flag(*cmd, o->model)->required();
  add_value(*cmd, "--frames", o->frames, "context length in frames (default: the preset's)", "INT");
  // The codec flags but those memory does not model (the encoder's choices, --threads).
  static constexpr std::string_view kNotModelled[] = {"kmeans_iters", "init", "seed", "threads"};
  add_codec_flags(*cmd, o->codec, {CodecDefaults::Engine, true, kNotModelled});
  // The policy flags of the settings table but those the model does not take.
  add_cache_flags(*cmd, o->cache, "keep the sink chunks raw (sink = false)", kSettingsNotModelled);
  add_role_config_flags(*cmd, o->k_config, o->v_config);
  add_value(*cmd, "--branches", o->branches,
            "also show N sessions forked from the state at the peak (the encoded part shared, the raw part "
            "copied per branch) beside N copies and N dense caches; 1..1024",
            "INT");
  cmd->add_flag("--json", o->json, "print the figures as JSON");
  cmd->callback([o] { run_memory(*o); });
}

}  // namespace
}  // namespace qvg::cli

QVG_REGISTER_COMMAND(qvg::cli::register_memory);
