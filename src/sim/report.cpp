// The --report directory of the simulation (qvg/eval/simulate.h,
// write_simulation_report): report.json, memory.svg, attention.svg and summary.txt,
// written to temporaries first and then renamed.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "qvg/error.h"
#include "qvg/eval/frontier.h"
#include "qvg/eval/simulate.h"

namespace qvg {

void write_simulation_report(const SimulationResult& r, const std::string& dir) {
  write_report_files(dir, {
                              {"report.json", simulation_json(r, 2) + "\n"},
                              {"memory.svg", memory_chart_svg(r)},
                              {"attention.svg", attention_chart_svg(r)},
                              {"summary.txt", simulation_summary_text(r)},
                          });
}

void write_report_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw InvalidArgument(fmt::format("--report directory '{}' cannot be created: {}", dir,
                                      ec ? ec.message() : std::string("not a directory")));
  std::vector<fs::path> tmps;
  auto cleanup = [&] {
    for (const auto& t : tmps) fs::remove(t, ec);
  };
  for (const auto& [name, text] : files) {
    const fs::path final_path = fs::path(dir) / name;
    const fs::path tmp = fs::path(dir) / fmt::format(".{}.tmp.{}", name, ::getpid());
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) tmps.push_back(tmp);
    if (f) f.write(text.data(), std::streamsize(text.size()));
    if (f) f.close();
    if (!f) {
      cleanup();
      throw InvalidArgument(fmt::format("report file '{}' cannot be written", final_path.string()));
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    fs::rename(tmps[i], fs::path(dir) / files[i].first, ec);
    if (ec) {
      cleanup();
      throw InvalidArgument(fmt::format("report file '{}' cannot be written: {}",
                                        (fs::path(dir) / files[i].first).string(), ec.message()));
    }
  }
}

}  // namespace qvg
