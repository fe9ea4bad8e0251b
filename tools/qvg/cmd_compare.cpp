// `qvg compare`: the QVG codec against the RTN, KIVI-style and QuaRot-style
// baselines on one context of a realistic workload, at the same bits and block
// size: bits per element, compression ratio, K/V SNR, attention error and cosine
// (include/qvg/simulate.h, compare(); docs/simulate.md).
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

#include "codec_flags.h"
#include "command.h"
#include "workload_flags.h"
#include "qvg/error.h"
#include "qvg/simulate.h"
#include "qvg/workload.h"

namespace qvg::cli {
namespace {

struct CompareOptions {
  std::string model = "self-forcing-1.3b";
  std::string scale = "0.25";
  std::optional<std::string> context_chunks;
  std::string layers = "2";
  std::string query_stride = "8";
  std::string seed = "0";
  std::string codec_seed = "1234";
  bool json = false;
  CodecConfig cfg;
};

void run_compare(const CompareOptions& o) {
  check_codec_flags(o.cfg);
  if (o.cfg.bits != 2 && o.cfg.bits != 4)
    throw InvalidArgument(fmt::format("--bits must be 2 or 4, got {}", o.cfg.bits));
  CompareConfig c;
  c.model = o.model;
  find_model_preset(o.model);
  size_t used = 0;
  double s = 0;
  try {
    s = std::stod(o.scale, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (o.scale.empty() || used != o.scale.size() || !(s > 0 && s <= 1))
    throw InvalidArgument(fmt::format("--scale must be a number in (0, 1], got '{}'", o.scale));
  c.scale = s;
  if (o.context_chunks) c.context_chunks = parse_int_flag("--context-chunks", *o.context_chunks, 1, 1000);
  c.layers = int(parse_int_flag("--layers", o.layers, 1, 100000));
  c.query_stride = int(parse_int_flag("--query-stride", o.query_stride, 1, 1'000'000));
  c.seed = uint64_t(parse_int_flag("--seed", o.seed, 0, INT64_MAX));
  c.codec = o.cfg;
  c.codec.seed = uint64_t(parse_int_flag("--codec-seed", o.codec_seed, 0, INT64_MAX));
  c.threads = o.cfg.threads;
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
  add_workload_flags(*cmd, o->model, o->scale);
  cmd->add_option("--context-chunks", o->context_chunks,
                  "chunks of context quantized together (default: the fewest holding 64 x centroids tokens)")
      ->type_name("N");
  cmd->add_option("--layers", o->layers, "layers scored, spread evenly over the model")
      ->type_name("N")
      ->default_str(o->layers);
  cmd->add_option("--query-stride", o->query_stride, "score every N-th query of the next chunk")
      ->type_name("N")
      ->default_str(o->query_stride);
  add_codec_flags(*cmd, o->cfg);
  cmd->remove_option(cmd->get_option("--seed"));
  o->cfg.bits = 2;
  o->cfg.centroids = 256;
  cmd->get_option("--bits")->default_str("2");
  cmd->get_option("--centroids")->default_str("256");
  cmd->add_option("--seed", o->seed, "the workload's video")->type_name("UINT")->default_str(o->seed);
  cmd->add_option("--codec-seed", o->codec_seed, "seed of the codec's random choices")
      ->type_name("UINT")
      ->default_str(o->codec_seed);
  cmd->add_flag("--json", o->json, "print the table as JSON");
  cmd->callback([o] { run_compare(*o); });
}

}  // namespace
}  // namespace qvg::cli

QVG_REGISTER_COMMAND(qvg::cli::register_compare);
