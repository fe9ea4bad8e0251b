// The shared workload flags (see workload_flags.h).
#include "workload_flags.h"

#include "cli_util.h"
#include "qvg/workload.h"

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

}  // namespace qvg::cli
