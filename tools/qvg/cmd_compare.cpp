// `qvg compare`: the QVG codec against the RTN, KIVI-style and QuaRot-style
// baselines on one context of a realistic workload, at the same bits and block
// size: bits per element, compression ratio, K/V SNR, attention error and cosine
// (include/qvg/eval/compare.h, compare(); docs/simulate.md).
//
// Defaults: self-forcing-1.3b scaled x0.25 (the default workload of `qvg simulate`),
// --bits 2, 256 centroids, block 64 (the published QVG configuration); the context
// is the fewest chunks holding at least 64 x centroids tokens, so QVG's codebooks
// cost at most 0.25 bits per element.
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include <fmt/core.h>

#include "cli_util.h"
#include "codec_flags.h"
#include "command.h"
#include "qvg/error.h"
#include "qvg/eval/compare.h"
#include "qvg/eval/frontier.h"
#include "qvg/eval/workload.h"
#include "workload_flags.h"

namespace qvg::cli {
namespace {

struct CompareOptions {
  WorkloadFlags workload;
  std::optional<std::string> context_chunks;
  ScoringFlags scoring{"2", "8"};
  std::string codec_seed = "1234";
  std::string spans = "deferred";
  bool json = false;
  bool frontier = false;
  bool frontier_quick = false;
  bool warm_start = false;
  std::string bpe_slack = "0.15";
  std::string rounds = "3";
  std::string max_queries = "160";
  std::optional<std::string> report;
  CodecConfig cfg;
};

void run_frontier(const CompareOptions& o, const CompareConfig& c) {
  const int max_queries = int(parse_int_flag("--max-queries", o.max_queries, 0, 1'000'000));
  const std::optional<double> slack = parse_number(o.bpe_slack);
  if (!slack || !(*slack >= 0 && *slack <= 16))
    throw InvalidArgument(fmt::format("--bpe-slack must be a number in [0, 16], got '{}'", o.bpe_slack));
  const FrontierConfig f{.model = c.model,
                         .scale = c.scale,
                         .seed = c.seed,
                         .context_chunks = c.context_chunks,
                         .layers = c.layers,
                         .query_stride = c.query_stride,
                         .max_queries = max_queries,
                         .codec_seed = c.codec.seed,
                         .bpe_slack = *slack,
                         .max_rounds = int(parse_int_flag("--rounds", o.rounds, 1, 10)),
                         .quick = o.frontier_quick,
                         .threads = c.threads};
  f.validate();
  if (o.report) check_report_dir(*o.report, "--report");  // before the sweep (minutes), not after it
  const FrontierResult r = frontier(f, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
  if (o.report) write_frontier_report(r, *o.report);
  if (o.json) {
    fmt::print("{}\n", frontier_json(r, 2));
    return;
  }
  fmt::print("{}", frontier_text(r));
}

void run_warm_start(const CompareConfig& c) {
  const int64_t chunks = c.context_chunks.value_or(8);
  const WarmStartFigures w =
      warm_start_figures(c.model, c.scale, c.layers, c.codec.centroids, chunks, c.seed, c.threads);
  fmt::print(
      "warm start on {} (scale {}), {} centroids, one-chunk spans of {} chunks, {} k-means runs (K and V):\n"
      "  random init, 2 iterations: {:.3f} s (the target inertia)\n"
      "  warm init: reaches it in {} of {} runs ({} never within 8 iterations), in {:.2f} iterations on average, "
      "{:.3f} s where random took {:.3f} s on those runs\n"
      "  equal iterations (2, about equal time: warm {:.3f} s): inertia warm / random = {:.4f}; warm after 1 "
      "iteration / random after 2 = {:.4f}\n",
      c.model, c.scale, c.codec.centroids, chunks, w.groups, w.random_s, w.groups - w.warm_never, w.groups,
      w.warm_never, w.warm_iters_to_target, w.warm_s_to_target, w.random_s_reached, w.warm_s_equal_iters,
      w.inertia_ratio_equal_iters, w.inertia_ratio_one_iter);
}

// Flag combinations, checked before anything else, so that a run that fails does so
// before minutes of work (docs/reliability.md, finding 17): a flag
// that only means something with --frontier, given without it, is an error naming
// both; --frontier and --warm-start are two different runs.
void check_flag_combinations(const CompareOptions& o, const CLI::App& cmd) {
  if (o.frontier && o.warm_start)
    throw InvalidArgument("--warm-start and --frontier are two different runs: give one of them, not both");
  if (o.frontier) return;
  for (const char* flag : {"--frontier-quick", "--bpe-slack", "--max-queries", "--rounds", "--report"})
    if (cmd.count(flag) > 0)
      throw InvalidArgument(
          fmt::format("{} applies only with --frontier (the frontier sweep), which was not given; "
                      "add --frontier or drop {}",
                      flag, flag));
}

void run_compare(const CompareOptions& o) {
  check_codec_flags(o.cfg);  // a width of qvg/code_format.h: the baselines take any
  CompareConfig c;
  c.model = o.workload.model;
  find_model_preset(o.workload.model);
  c.scale = parse_scale_flag(o.workload);
  if (o.context_chunks) c.context_chunks = parse_int_flag("--context-chunks", *o.context_chunks, 1, 1000);
  const Scoring scoring = parse_scoring_flags(o.scoring);
  c.layers = scoring.layers;
  c.query_stride = scoring.query_stride;
  c.seed = parse_seed_flag("--seed", o.workload.seed);
  c.codec = o.cfg;
  c.codec.seed = parse_seed_flag("--codec-seed", o.codec_seed);
  c.spans = named("--span-mode", [&] { return parse_span_mode(o.spans); });
  c.threads = o.cfg.threads;
  if (o.frontier) return run_frontier(o, c);
  if (o.warm_start) return run_warm_start(c);
  c.validate();
  const CompareResult r = compare(c);
  if (o.json) {
    fmt::print("{}\n", compare_json(r, 2));
    return;
  }
  fmt::print("{}", compare_table_text(r));
}

void register_compare(CLI::App& root) {
  auto o = std::make_shared<CompareOptions>();
  CLI::App* cmd = root.add_subcommand(
      "compare", "QVG vs RTN, KIVI-style and QuaRot-style quantization on a realistic workload, same bits and block");
  add_workload_flags(*cmd, o->workload);
  add_value(*cmd, "--context-chunks", o->context_chunks,
            "chunks of context quantized together (default: the fewest holding 64 x centroids tokens)", "N");
  add_scoring_flags(*cmd, o->scoring, "layers scored, spread evenly over the model",
                    "score every N-th query of the next chunk");
  // The codec flags but --seed (the video's: --codec-seed is the codec's).
  static constexpr std::string_view kOwnFlags[] = {"seed"};
  add_codec_flags(*cmd, o->cfg, {CodecDefaults::Stream, false, kOwnFlags});
  add_video_seed_flag(*cmd, o->workload);
  add_value(*cmd, "--span-mode", o->spans,
            "how qvg encodes the context's chunks: deferred (one span, one codebook trained on all) | incremental "
            "(chunk by chunk into one growing span codebook, as the packed cache; docs/spans.md)",
            "NAME");
  add_codec_seed_flag(*cmd, o->codec_seed);
  cmd->add_flag("--json", o->json, "print the table as JSON");
  cmd->add_flag("--frontier", o->frontier,
                "sweep qvg configurations (coordinate descent from the reference default) and the baselines at "
                "2, 3 and 4 bits: the rate-distortion frontier (docs/quality.md); the codec flags are ignored");
  cmd->add_flag("--frontier-quick", o->frontier_quick, "with --frontier: a reduced knob set (tests)");
  add_value(*cmd, "--bpe-slack", o->bpe_slack,
            "with --frontier: the descent's budget is the reference's bits per element + this", "X");
  add_value(*cmd, "--max-queries", o->max_queries,
            "with --frontier: at most this many queries per layer (the stride grows from --query-stride); 0 = no cap",
            "N");
  add_value(*cmd, "--rounds", o->rounds, "with --frontier: at most this many descent rounds (1..10)", "N");
  add_value(*cmd, "--report", o->report, "with --frontier: write frontier.json, frontier.svg and summary.txt into DIR",
            "DIR");
  cmd->add_flag("--warm-start", o->warm_start,
                "measure k-means warm start against random init on one-chunk spans of the context (docs/quality.md)");
  cmd->callback([o, cmd] {
    check_flag_combinations(*o, *cmd);
    run_compare(*o);
  });
}

}  // namespace
}  // namespace qvg::cli

QVG_REGISTER_COMMAND(qvg::cli::register_compare);
