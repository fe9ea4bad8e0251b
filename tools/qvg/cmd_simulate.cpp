// `qvg simulate`: stream a realistic workload through a dense and a packed K/V
// cache side by side and report memory, quality and time per chunk
// (include/qvg/eval/simulate.h describes the loop and every figure; docs/simulate.md
// explains how to read the report).
//
// Defaults (the embedded default run): self-forcing-1.3b scaled x0.25, its context
// capped at 72 frames for a quick run, 40 chunks x 2 denoising steps, 2 layers,
// int2 with 256 centroids and block 64 in spans of 8 chunks (the published QVG
// configuration). Progress goes to stderr (a bar on a terminal, one line per chunk
// otherwise; --quiet silences it); the summary goes to stdout. --json FILE and
// --report DIR are written only after the whole run succeeded.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <fmt/core.h>

#include "cache_flags.h"
#include "cli_util.h"
#include "codec_flags.h"
#include "command.h"
#include "qvg/code_format.h"
#include "qvg/error.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/simulate.h"
#include "qvg/eval/workload.h"
#include "sim/report_util.h"
#include "workload_flags.h"

namespace qvg::cli {
namespace {

constexpr int64_t kDefaultContextCap = 72;  // frames: keeps the default run under two minutes

struct SimulateOptions {
  WorkloadFlags workload;
  std::optional<std::string> context_frames;
  std::string chunks = "40";
  std::string steps = "2";
  ScoringFlags scoring{"2", "16"};
  std::string step_noise = "0.05";
  bool attention_every_step = false;
  std::string bits = "2";
  std::string k_config, v_config;  // per-role codec settings (field=value,...)
  std::string codec_seed = "1234";
  CacheFlags cache{default_packed_config().quant, {}, false};  // the library's policy defaults (docs/spans.md)
  std::optional<std::string> json;
  std::optional<std::string> report;
  bool quiet = false;
  bool engine_baseline = false;
  CodecConfig cfg;
  const CLI::App* cmd = nullptr;  // to read --profile (its policy settings: apply_cache_flags)
};

/// "2" | "4" | "2,4" | "4,2" -> [2] ...: widths of qvg/code_format.h, each once.
std::vector<int> parse_bits_list(const std::string& v) {
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  const auto bad = [&] {
    return InvalidArgument(fmt::format("--bits must be {} or a list like 2,4, got '{}'", known_code_widths(), v));
  };
  while (std::getline(ss, item, ',')) {
    const int64_t b = parse_int_flag("--bits", item, 0, 64);
    if (find_code_format(int(b)) == nullptr) throw bad();
    if (std::find(out.begin(), out.end(), int(b)) != out.end())
      throw InvalidArgument(fmt::format("--bits lists {} twice: '{}'", b, v));
    out.push_back(int(b));
  }
  if (out.empty() || v.back() == ',') throw bad();
  return out;
}

SimulationConfig build_config(const SimulateOptions& o) {
  SimulationConfig c;
  c.model = o.workload.model;
  const ModelPreset& preset = find_model_preset(o.workload.model);
  c.scale = parse_scale_flag(o.workload);
  if (o.context_frames)
    c.context_frames = parse_int_flag("--context-frames", *o.context_frames, 1, 100000);
  else
    c.context_frames = std::min<int64_t>(preset.context_frames, kDefaultContextCap);
  c.chunks = parse_int_flag("--chunks", o.chunks, 1, 100000);
  c.steps = int(parse_int_flag("--steps", o.steps, 1, 64));
  const Scoring scoring = parse_scoring_flags(o.scoring);
  c.layers = scoring.layers;
  c.query_stride = scoring.query_stride;
  c.step_noise = parse_double_flag("--step-noise", o.step_noise, 0, 1, "in [0, 1]");
  c.attention_every_step = o.attention_every_step;
  c.seed = parse_seed_flag("--seed", o.workload.seed);
  c.threads = o.cfg.threads;
  check_threads("--threads", c.threads);

  // The codec flags (the profile's values where not given: add_profile_flag), with
  // --codec-seed; bits per configuration.
  CodecConfig codec = o.cfg;
  QuantArgs q;
  // The profile's per-role settings (if any) unless --k-config / --v-config replace them.
  const std::optional<std::string> profile = o.cmd ? given_profile(*o.cmd) : std::nullopt;
  if (profile) {
    QuantArgs p;
    p.apply_profile(*profile);  // a valid name: add_profile_flag checked it
    q.k = p.k;
    q.v = p.v;
  }
  if (!o.k_config.empty()) q.k = parse_role_codec(o.k_config, "--k-config");
  if (!o.v_config.empty()) q.v = parse_role_codec(o.v_config, "--v-config");
  codec.seed = parse_seed_flag("--codec-seed", o.codec_seed);
  apply_cache_flags(o.cache, preset, q, profile);
  c.packed.clear();  // replace the library's default configuration
  if (o.engine_baseline) {
    PackedConfig e = engine_default_packed_config(preset);
    e.quant.codec.seed = codec.seed;  // the engine's codec with this run's seed and threads
    e.quant.codec.threads = codec.threads;
    c.packed.push_back(e);
  }
  for (int b : parse_bits_list(o.bits)) {
    PackedConfig pc;
    pc.label = profile ? fmt::format("{} int{}", *profile, b) : fmt::format("int{}", b);
    pc.quant = q;
    pc.quant.codec = codec;
    pc.quant.enable(b);
    c.packed.push_back(pc);
  }
  c.validate();
  return c;
}

/// Progress on stderr: a redrawn bar on a terminal, one line per chunk otherwise.
class Progress {
 public:
  Progress(bool quiet, std::vector<PackedConfig> packed)
      : quiet_(quiet), tty_(::isatty(::fileno(stderr)) == 1), packed_(std::move(packed)) {}

  void operator()(const SimulationProgress& p) {
    if (quiet_) return;
    const double done = (double(p.chunk) + (p.layers > 0 ? double(p.layer) / double(p.layers) : 0)) /
                        double(std::max<int64_t>(1, p.chunks));
    if (p.last) last_ = describe(*p.last, packed_);
    if (tty_) {
      constexpr int kWidth = 28;
      const int filled = std::clamp(int(std::lround(done * kWidth)), 0, kWidth);
      std::string bar;
      for (int i = 0; i < kWidth; ++i) bar += i < filled ? "\u2588" : "\u2591";
      const std::string eta =
          done > 0.02 ? fmt::format(", ~{:.0f} s left", p.elapsed_s * (1 - done) / done) : std::string();
      // The text after the bar is ASCII; cut it to the terminal's width so that the
      // line never wraps (a wrapped line cannot be redrawn with \r).
      std::string text = fmt::format(" {:3.0f}%  chunk {}/{}  {:.0f} s{}{}", 100 * done,
                                     std::min(p.chunk + (p.layer > 0 ? 1 : 0), p.chunks), p.chunks, p.elapsed_s, eta,
                                     last_.empty() ? "" : "  | " + last_);
      winsize ws{};
      const int cols = ::ioctl(::fileno(stderr), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
      const size_t room = size_t(std::max(0, cols - kWidth - 1));
      if (text.size() > room) text.resize(room);
      fmt::print(stderr, "\r\033[K{}{}", bar, text);
      std::fflush(stderr);
      drawn_ = true;
    } else if (p.last) {
      fmt::print(stderr, "qvg simulate: chunk {}/{} done after {:.1f} s: {}\n", p.chunk, p.chunks, p.elapsed_s, last_);
    }
  }

  void finish() {
    if (drawn_) {
      fmt::print(stderr, "\r\033[K");
      std::fflush(stderr);
    }
  }

 private:
  /// Every configuration's figures after the chunk, each under its label (the layers
  /// pooled): "dense 42.9 MiB per layer; engine: packed 8.1 MiB, error 2.10%; ...".
  static std::string describe(const ChunkRecord& c, const std::vector<PackedConfig>& packed) {
    if (c.layers.empty() || c.layers.front().packed.empty()) return {};
    const LayerRecord& l = c.layers.front();
    std::string s = fmt::format("dense {:.1f} MiB per layer", double(l.dense_resident_bytes) / double(1 << 20));
    for (size_t j = 0; j < packed.size() && j < l.packed.size(); ++j) {
      const PackedLayerRecord a = sim::pooled(c, j);
      s += fmt::format("; {}: packed {:.1f} MiB, attention error {:.2f}%", packed[j].label,
                       double(a.resident_bytes) / double(1 << 20), 100 * a.attention.rel_l2());
    }
    return s;
  }

  bool quiet_, tty_;
  bool drawn_ = false;
  std::vector<PackedConfig> packed_;
  std::string last_;
};

void run_simulate(const SimulateOptions& o) {
  check_codec_flags(o.cfg);
  const SimulationConfig cfg = build_config(o);
  // Fail early on unwritable outputs, before minutes of work.
  if (o.json) {
    const auto parent = std::filesystem::absolute(*o.json).parent_path();
    if (!std::filesystem::is_directory(parent))
      throw InvalidArgument(fmt::format("--json file '{}': directory '{}' does not exist", *o.json, parent.string()));
  }
  if (o.report) check_report_dir(*o.report, "--report");  // checked now (nothing left), written at the end

  Progress progress(o.quiet, cfg.packed);
  SimulationResult r;
  try {
    r = simulate(cfg, [&](const SimulationProgress& p) { progress(p); });
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
  if (o.report) write_simulation_report(r, *o.report);
  if (o.json) write_output_file(*o.json, simulation_json(r, 2) + "\n", "--json");
  fmt::print("{}", simulation_summary_text(r));
  if (o.json) fmt::print("  JSON report: {}\n", *o.json);
  if (o.report)
    fmt::print("  report: {}, memory.svg, attention.svg, summary.txt (open the SVGs in a browser)\n",
               (std::filesystem::path(*o.report) / "report.json").lexically_normal().string());
}

void register_simulate(CLI::App& root) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = root.add_subcommand(
      "simulate",
      "Stream a realistic workload through a dense and a packed K/V cache side by side; memory, quality and time "
      "per chunk");
  o->cmd = cmd;
  add_workload_flags(*cmd, o->workload);
  add_value(*cmd, "--context-frames", o->context_frames,
            "frames of history a layer keeps (default: the preset's, capped at 72 for a quick run)", "N");
  add_value(*cmd, "--chunks", o->chunks, "chunks to stream", "N");
  add_value(*cmd, "--steps", o->steps, "denoising steps per chunk (each calls both caches)", "N");
  add_scoring_flags(*cmd, o->scoring, "layers simulated, spread evenly over the model",
                    "score every N-th query of a chunk (attention is the slow part)");
  add_value(*cmd, "--step-noise", o->step_noise,
            "relative noise on the first step's K/V/Q, shrinking to 0 at the last step: [0, 1]", "F");
  cmd->add_flag("--attention-every-step", o->attention_every_step,
                "score attention at every denoising step (default: the last, clean step)");

  // The codec flags but --bits (a list here) and --seed (the video's: --codec-seed is
  // the codec's); a cache, so init=warm is accepted.
  static constexpr std::string_view kOwnFlags[] = {"bits", "seed"};
  add_codec_flags(*cmd, o->cfg, {CodecDefaults::Stream, true, kOwnFlags});
  add_value(*cmd, "--bits", o->bits,
            fmt::format("residual code width: {}, or a list (2,4) to stream several packed caches (default 2: the "
                        "published QVG runs' width, which this workload reproduces; encode and eval default to 4)",
                        known_code_widths()),
            "LIST");
  add_video_seed_flag(*cmd, o->workload);
  add_codec_seed_flag(*cmd, o->codec_seed);
  add_role_config_flags(*cmd, o->k_config, o->v_config);

  add_cache_flags(*cmd, o->cache, "keep the sink chunks bf16 (sink = false)");
  add_value(*cmd, "--json", o->json, "write the report JSON (docs/simulate.schema.json) to FILE", "FILE");
  add_value(*cmd, "--report", o->report, "write report.json, memory.svg, attention.svg and summary.txt into DIR",
            "DIR");
  cmd->add_flag("--engine-baseline", o->engine_baseline,
                "also stream the engine's default configuration (int2, 128 centroids, compat scaling, spans of one "
                "chunk, keep_recent 1; label 'engine'), first, and compare every configuration with it");
  cmd->add_flag("--quiet,-q", o->quiet, "no progress on stderr");
  cmd->callback([o] { run_simulate(*o); });
}

}  // namespace
}  // namespace qvg::cli

QVG_REGISTER_COMMAND(qvg::cli::register_simulate);
