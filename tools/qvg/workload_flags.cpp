#include "workload_flags.h"

#include "qvg/workload.h"

namespace qvg::cli {

CLI::Option* add_model_flag(CLI::App& cmd, std::string& model) {
  std::string presets;
  for (const auto& p : model_presets()) presets += (presets.empty() ? "" : ", ") + p.name;
  return cmd.add_option("--model", model, "model preset: " + presets)->type_name("PRESET");
}

void add_workload_flags(CLI::App& cmd, std::string& model, std::string& scale) {
  add_model_flag(cmd, model)->default_str(model);
  cmd.add_option("--scale", scale, "shrink heads, layers and frame size by this factor, in (0, 1]")
      ->type_name("S")
      ->default_str(scale);
}

}  // namespace qvg::cli
