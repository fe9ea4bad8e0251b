// qvg_gpu_bench — the GPU benchmarks of the CUDA backend (qvg::perf::run_gpu_benchmarks)
// as a standalone executable that needs nothing but the library and CUDA, for
// scripts/gpu-check. Usage: qvg_gpu_bench [--quick] [--verdict] [--json FILE]
// Prints the table; writes the JSON to FILE. Exit status 2 without a CUDA device.
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
  try {
    std::string table;
    const std::string json = qvg::perf::run_gpu_benchmarks(opt, &table);
    std::fputs(table.c_str(), stdout);
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << json;
      if (!f) {
        std::fprintf(stderr, "qvg_gpu_bench: cannot write %s\n", json_path.c_str());
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qvg_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
