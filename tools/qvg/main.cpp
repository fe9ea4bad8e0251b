// tools/qvg/main.cpp — entry point of the `qvg` command-line tool.
#include <cstdio>
#include <exception>
#include <string>

#include <fmt/core.h>

#include "command.h"
#include "qvg/version.h"

namespace qvg::cli {
std::vector<Registrar>& registry() {
  static std::vector<Registrar> r;
  return r;
}
}  // namespace qvg::cli

int main(int argc, char** argv) {
  CLI::App app{"qvg — compressed K/V caches for long video generation (Quant VideoGen / PRQ)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("qvg ") + qvg::kVersion);
  // Every error is one line on stderr (spec of the CLI), parse errors included.
  app.failure_message(
      [](const CLI::App*, const CLI::Error& e) { return std::string("qvg: error: ") + e.what() + "\n"; });
  for (auto& reg : qvg::cli::registry()) reg(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {  // qvg::Error and the rest alike: one line
    fmt::print(stderr, "qvg: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
