// tools/qvg/command.h — how CLI subcommands plug into `qvg`.
//
// Each subcommand lives in its own file and registers itself with a static
// QVG_REGISTER_COMMAND(fn) where fn(CLI::App& root) adds the subcommand and sets
// its callback. The callback returns normally on success; it throws (qvg::Error,
// CLI::Error, std::exception) on failure and main() prints one line to stderr and
// exits non-zero. Commands write output files only after all work succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace qvg::cli {

using Registrar = std::function<void(CLI::App&)>;
std::vector<Registrar>& registry();

struct RegisterCommand {
  explicit RegisterCommand(Registrar r) { registry().push_back(std::move(r)); }
};

}  // namespace qvg::cli

#define QVG_CLI_CONCAT2(a, b) a##b
#define QVG_CLI_CONCAT(a, b) QVG_CLI_CONCAT2(a, b)
#define QVG_REGISTER_COMMAND(fn) \
  static ::qvg::cli::RegisterCommand QVG_CLI_CONCAT(qvg_register_, __LINE__)(fn)
