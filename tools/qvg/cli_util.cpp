// Helpers shared by the subcommands (see cli_util.h).
#include "cli_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <system_error>
#include <vector>

#include <fmt/core.h>

#include "qvg/config.h"
#include "qvg/error.h"
#include "qvg/io.h"
#include "qvg/settings.h"

namespace qvg::cli {

CLI::Option* add_value(CLI::App& cmd, const std::string& flag, std::string& target, const std::string& help,
                       const std::string& type) {
  return cmd.add_option(flag, target, help)->type_name(type)->default_str(target);
}

CLI::Option* add_value(CLI::App& cmd, const std::string& flag, std::optional<std::string>& target,
                       const std::string& help, const std::string& type) {
  return cmd.add_option(flag, target, help)->type_name(type);
}

CLI::Option* add_input_tensor_flag(CLI::App& cmd, std::string& input) {
  return cmd.add_option("--input,-i", input, "input tensor: .npy (float32/float16) or .safetensors")->required();
}

CLI::Option* add_tensor_name_flag(CLI::App& cmd, std::optional<std::string>& tensor) {
  return cmd.add_option("--tensor", tensor, "tensor to read from a .safetensors input holding several");
}

int64_t parse_int_flag(const char* flag, const std::string& value, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [p, ec] = std::from_chars(value.data(), end, v);
  if (ec == std::errc::result_out_of_range)
    throw InvalidArgument(fmt::format("{} is out of range ({}..{}), got '{}'", flag, lo, hi, value));
  if (value.empty() || ec != std::errc() || p != end)
    throw InvalidArgument(fmt::format("{} must be an integer, got '{}'", flag, value));
  if (v < lo || v > hi) throw InvalidArgument(fmt::format("{} must be in {}..{}, got {}", flag, lo, hi, v));
  return v;
}

int parse_threads_flag(const char* flag, const std::string& value) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || (ec != std::errc() && ec != std::errc::result_out_of_range) || p != end)
    throw InvalidArgument(fmt::format("{} must be an integer, got '{}'", flag, value));
  if (ec == std::errc::result_out_of_range)
    throw InvalidArgument(fmt::format("{} must be in 0..{}, got '{}'", flag, max_threads(), value));
  check_threads(flag, v);
  return static_cast<int>(v);
}

uint64_t parse_seed_flag(const char* flag, const std::string& value) {
  return uint64_t(parse_int_flag(flag, value, 0, INT64_MAX));
}

std::optional<double> parse_number(const std::string& value) {
  return parse_real(value);
}

double parse_double_flag(const char* flag, const std::string& value, double lo, double hi, const char* allowed) {
  const std::optional<double> x = parse_number(value);
  if (!x) throw InvalidArgument(fmt::format("{} must be a number, got '{}'", flag, value));
  if (!(*x >= lo && *x <= hi)) throw InvalidArgument(fmt::format("{} must be {}, got {}", flag, allowed, value));
  return *x;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void write_output_file(const std::string& path, const std::string& text, const char* flag) {
  try {
    write_file_atomic(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  } catch (const InvalidArgument& e) {  // e names the path and why (not a regular file, the size limit, ...)
    throw InvalidArgument(fmt::format("{}: {}", flag, e.what()));
  }
}

void check_report_dir(const std::string& dir, const char* flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);  // follows a symlink to a directory
  if (fs::exists(st) && !fs::is_directory(st))
    throw InvalidArgument(fmt::format("{} '{}' exists and is not a directory", flag, dir));
  // The directories this check creates, deepest first: removed again at the end
  // (the report writer creates them when it writes).
  std::vector<fs::path> created;
  struct Undo {
    std::vector<fs::path>& dirs;
    ~Undo() {
      std::error_code e;
      for (const fs::path& d : dirs) fs::remove(d, e);  // only if still empty
    }
  } undo{created};
  if (!fs::exists(st)) {
    for (fs::path p = dir; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
      created.push_back(p);
      if (p == p.parent_path()) break;
    }
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir))
      throw InvalidArgument(fmt::format("{} directory '{}' cannot be created: {}", flag, dir,
                                        ec ? ec.message() : std::string("not a directory")));
  }
  const fs::path probe = fs::path(dir) / fmt::format(".qvg-report-probe.{}", static_cast<long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw InvalidArgument(fmt::format("{} directory '{}' cannot be written: {}", flag, dir, std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace qvg::cli
