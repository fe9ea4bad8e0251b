// tools/qvg/main.cpp — entry point of the `qvg` command-line tool.
//
// Exit status: 0 on success (and for --help / --version), 1 for every error — a bad
// command line included — with exactly one line "qvg: error: ..." on stderr.
// SIGXFSZ is ignored: a write beyond a file-size limit (ulimit -f) fails with EFBIG,
// which the writer reports as that one line and cleans up after (spec 5.1, "Files"),
// instead of the process dying with status 153 and a temporary file left. A write to
// standard output that fails (a full disk, /dev/full) is such an error too: the output
// is flushed and checked before exit.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
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

namespace {

// The subcommands, as "a, b, c".
std::string subcommand_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* c : app.get_subcommands([](const CLI::App*) { return true; }))
    names += fmt::format("{}{}", names.empty() ? "" : ", ", c->get_name());
  return names;
}

int error_exit(const std::string& message) {
  fmt::print(stderr, "qvg: error: {}\n", message);
  return 1;
}

// A command's status once its output is out: what it wrote to standard output (fmt,
// and iostreams for --help) is flushed, and a failed write — a full disk, /dev/full,
// a closed descriptor — is an error of its own (spec 5): one line, status 1.
int flushed(int status) {
  errno = 0;
  std::cout.flush();  // (synchronised with stdio: flushes stdout too)
  const bool stream_failed = !std::cout;
  int e = errno;
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  if (e == 0) e = errno;
  if (!stream_failed && !flush_failed && !std::ferror(stdout)) return status;
  if (status != 0) return status;  // the command's own error is the one line
  return error_exit(
      fmt::format("cannot write to standard output: {}", e != 0 ? std::strerror(e) : "an earlier write failed"));
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"qvg — compressed K/V caches for long video generation (Quant VideoGen / PRQ)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("qvg ") + qvg::kVersion);
  for (auto& reg : qvg::cli::registry()) reg(app);
  // A missing or unknown subcommand is named here (CLI11 reports both as "A
  // subcommand is required").
  if (argc < 2)
    return error_exit(fmt::format("a subcommand is required: {} (qvg --help lists them)", subcommand_names(app)));
  const std::string first = argv[1];
  if (first[0] != '-') {
    bool known = false;
    for (const CLI::App* c : app.get_subcommands([](const CLI::App*) { return true; }))
      known = known || c->check_name(first);
    if (!known)
      return error_exit(fmt::format("unknown subcommand '{}'; the subcommands are {}", first, subcommand_names(app)));
  } else if (first != "--help" && first != "-h" && first != "--version") {
    return error_exit(fmt::format("unknown option '{}' (usage: qvg SUBCOMMAND [OPTIONS]; the subcommands are {})",
                                  first, subcommand_names(app)));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0; every other parse error is a usage
    // error: one line, exit status 1.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return flushed(app.exit(e));
    return error_exit(e.what());
  } catch (const std::exception& e) {  // qvg::Error and the rest alike: one line
    return error_exit(e.what());
  }
  return flushed(0);
}
