// qvg_gpu_bench — the GPU benchmarks of the CUDA backend (qvg::perf::run_gpu_benchmarks)
// as a standalone executable that needs nothing but the library and CUDA, for
// scripts/gpu-check. Usage: qvg_gpu_bench [--quick] [--verdict] [--json FILE]
// Prints the table; writes the JSON to FILE (after each section, so that a failure
// keeps what was measured). Exit status 2 without a CUDA device.
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>

#include "perf/cuda_bench.h"
#include "qvg/cuda.h"

int main(int argc, char** argv) {
  qvg::perf::GpuBenchOptions opt;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      opt.quick = true;
    } else if (std::strcmp(argv[i], "--verdict") == 0) {
      opt.verdict = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: qvg_gpu_bench [--quick] [--verdict] [--json FILE]\n");
      return 1;
    }
  }
  if (qvg::cuda::device_count() == 0) {
    std::fprintf(stderr, "qvg_gpu_bench: no CUDA device; nothing measured\n");
    return 2;
  }
  // The JSON is rewritten after each section (written to FILE.tmp, then renamed): a
  // failure or a timeout later in the run keeps the figures measured before it.
  bool written = true;
  if (!json_path.empty())
    opt.progress = [&](const std::string& json) {
      const std::string tmp = json_path + ".tmp";
      {
        std::ofstream f(tmp);
        f << json;
        written = written && bool(f);
      }
      written = written && std::rename(tmp.c_str(), json_path.c_str()) == 0;
    };
  try {
    std::string table;
    (void)qvg::perf::run_gpu_benchmarks(opt, &table);
    std::fputs(table.c_str(), stdout);
    if (!written) {
      std::fprintf(stderr, "qvg_gpu_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qvg_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
