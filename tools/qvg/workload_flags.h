// tools/qvg/workload_flags.h — the workload flags shared by simulate, compare and memory.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace qvg::cli {

/// Adds `--model PRESET` (the help lists the presets of docs/workload.md) and
/// returns the option so a command can mark it required.
CLI::Option* add_model_flag(CLI::App& cmd, std::string& model);

/// The text of the workload flags of simulate and compare, with their defaults.
struct WorkloadFlags {
  std::string model = "self-forcing-1.3b";
  std::string scale = "0.25";
  std::string seed = "0";  ///< the workload's video
};
/// Adds `--model` and `--scale S` (shrink heads, layers and frame size; the
/// command parses and validates the text); add_video_seed_flag adds the seed.
void add_workload_flags(CLI::App& cmd, WorkloadFlags& w);
/// Adds `--seed UINT`, the workload's video (as text; parse with parse_seed_flag).
CLI::Option* add_video_seed_flag(CLI::App& cmd, WorkloadFlags& w);
/// The workload's scale (--scale): a number in (0, 1]; else InvalidArgument naming the flag.
double parse_scale_flag(const WorkloadFlags& w);

/// The text of the scoring flags of simulate and compare: the layers scored and the
/// stride of the queries scored (each command has its own defaults).
struct ScoringFlags {
  std::string layers;
  std::string query_stride;
};
/// Adds `--layers N` and `--query-stride N` with their help texts.
void add_scoring_flags(CLI::App& cmd, ScoringFlags& f, const std::string& layers_help, const std::string& stride_help);
/// The parsed flags: layers in 1..100000, query stride in 1..1000000; else
/// InvalidArgument naming the flag.
struct Scoring {
  int layers = 0, query_stride = 0;
};
Scoring parse_scoring_flags(const ScoringFlags& f);

}  // namespace qvg::cli
