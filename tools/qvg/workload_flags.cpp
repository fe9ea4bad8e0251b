// The shared workload flags (see workload_flags.h).
#include "workload_flags.h"

#include <fmt/core.h>

#include "cli_util.h"
#include "qvg/error.h"
#include "qvg/eval/workload.h"

namespace qvg::cli {

CLI::Option* add_model_flag(CLI::App& cmd, std::string& model) {
  std::string presets;
  for (const auto& p : model_presets()) presets += (presets.empty() ? "" : ", ") + p.name;
  return cmd.add_option("--model", model, "model preset: " + presets)->type_name("PRESET");
}

void add_workload_flags(CLI::App& cmd, WorkloadFlags& w) {
  add_model_flag(cmd, w.model)->default_str(w.model);
  add_value(cmd, "--scale", w.scale, "shrink heads, layers and frame size by this factor, in (0, 1]", "S");
}

CLI::Option* add_video_seed_flag(CLI::App& cmd, WorkloadFlags& w) {
  return add_value(cmd, "--seed", w.seed, "the workload's video", "UINT");
}

double parse_scale_flag(const WorkloadFlags& w) {
  const double s = parse_double_flag("--scale", w.scale, 0, 1, "in (0, 1]");
  if (s == 0) throw InvalidArgument(fmt::format("--scale must be in (0, 1], got {}", w.scale));
  return s;
}

void add_scoring_flags(CLI::App& cmd, ScoringFlags& f, const std::string& layers_help, const std::string& stride_help) {
  add_value(cmd, "--layers", f.layers, layers_help, "N");
  add_value(cmd, "--query-stride", f.query_stride, stride_help, "N");
}

Scoring parse_scoring_flags(const ScoringFlags& f) {
  return {int(parse_int_flag("--layers", f.layers, 1, 100000)),
          int(parse_int_flag("--query-stride", f.query_stride, 1, 1'000'000))};
}

}  // namespace qvg::cli
