// tools/qvg/cli_util.h — helpers every subcommand may use: text flags shown with their
// default, whole-string number parsing with errors naming the flag, wall time, and
// output files written only whole.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "qvg/error.h"

namespace qvg::cli {

/// Adds `flag` as a text option bound to `target`, shown as "TYPE=<target's value>".
CLI::Option* add_value(CLI::App& cmd, const std::string& flag, std::string& target, const std::string& help,
                       const std::string& type);
/// Adds `flag` as an optional text option (no default shown), shown as TYPE.
CLI::Option* add_value(CLI::App& cmd, const std::string& flag, std::optional<std::string>& target,
                       const std::string& help, const std::string& type);

/// Adds `--input,-i` (required), the tensor file a command reads (.npy or .safetensors).
CLI::Option* add_input_tensor_flag(CLI::App& cmd, std::string& input);
/// Adds `--tensor`, the tensor to read from a .safetensors input holding several.
CLI::Option* add_tensor_name_flag(CLI::App& cmd, std::optional<std::string>& tensor);

/// Parses a whole string as a decimal integer in [lo, hi]; throws InvalidArgument
/// naming `flag` otherwise.
int64_t parse_int_flag(const char* flag, const std::string& value, int64_t lo, int64_t hi);
/// A thread count: an integer in 0..max_threads() (qvg/config.h), 0 = all cores.
int parse_threads_flag(const char* flag, const std::string& value);
/// A seed: parse_int_flag in 0..INT64_MAX.
uint64_t parse_seed_flag(const char* flag, const std::string& value);
/// The whole string as a finite number, by the one rule of every real-valued setting
/// and flag (qvg::parse_real: plain decimal or exponent form; no hex floats, blanks,
/// '+', inf or nan); nullopt otherwise.
std::optional<double> parse_number(const std::string& value);
/// parse_number in [lo, hi]; throws InvalidArgument naming `flag` ("must be a number"
/// or "must be <allowed>") otherwise.
double parse_double_flag(const char* flag, const std::string& value, double lo, double hi, const char* allowed);

/// parse() (a config.h parse_* call), its InvalidArgument prefixed with "<flag>: ".
template <class F>
auto named(const char* flag, F&& parse) {
  try {
    return parse();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(flag) + ": " + e.what());
  }
}

/// Seconds of wall time since t0.
double seconds_since(std::chrono::steady_clock::time_point t0);

/// Writes `text` to `path` through a temporary that is renamed into place
/// (write_file_atomic); throws InvalidArgument "<flag>: cannot write '<path>': <why>"
/// on any I/O error or a destination that is not a regular file (the temporary is
/// removed, `path` untouched).
void write_output_file(const std::string& path, const std::string& text, const char* flag);

/// A --report DIR checked before any work (no run is lost to a bad directory): it must
/// be a directory or creatable, and writable — the missing directories are created and
/// a probe file is created in the directory, then all of it is removed again, so that a
/// run that fails later leaves nothing (the report writer creates the directories when
/// it writes). Throws InvalidArgument "<flag> ..." naming the directory and why: it
/// exists and is not a directory, cannot be created, or cannot be written.
void check_report_dir(const std::string& dir, const char* flag);

}  // namespace qvg::cli
