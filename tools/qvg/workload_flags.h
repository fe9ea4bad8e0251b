// tools/qvg/workload_flags.h — the workload flags shared by simulate, compare and memory.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace qvg::cli {

/// Adds `--model PRESET` (the help lists the presets of docs/workload.md) and
/// returns the option so a command can mark it required.
CLI::Option* add_model_flag(CLI::App& cmd, std::string& model);
/// Adds `--model` and `--scale S` (shrink heads, layers and frame size; the
/// command parses and validates the text).
void add_workload_flags(CLI::App& cmd, std::string& model, std::string& scale);

}  // namespace qvg::cli
