// `qvg bench`: the performance suite of src/perf, as a table and as JSON.

#include <fmt/core.h>

#include "cli_util.h"
#include "command.h"
#include "perf/perf.h"
#include "qvg/error.h"
#ifdef QVG_HAVE_CUDA
#include "perf/cuda_bench.h"
#endif

namespace qvg::cli {
namespace {

struct BenchArgs {
  std::string json;
  bool quick = false;
  std::string threads = "0";
  std::string device = "cpu";
};

void run(const BenchArgs& a) {
  const int threads = parse_threads_flag("--threads", a.threads);
  if (a.device == "cuda") {  // the GPU benchmarks of the CUDA backend (docs/cuda.md)
#ifdef QVG_HAVE_CUDA
    std::string table;
    perf::GpuBenchOptions opt;
    opt.quick = a.quick;
    const std::string json = perf::run_gpu_benchmarks(opt, &table);
    fmt::print("qvg bench --device cuda{}\n{}", a.quick ? " (quick: reduced shapes)" : "", table);
    if (!a.json.empty()) {
      write_output_file(a.json, json, "--json");
      fmt::print("wrote {}\n", a.json);
    }
    return;
#else
    throw InvalidArgument("--device cuda: this build has no CUDA backend (configure with QVG_ENABLE_CUDA=ON and nvcc)");
#endif
  }
  if (a.device != "cpu") throw InvalidArgument(fmt::format("--device must be cpu or cuda, got '{}'", a.device));
  perf::BenchOptions opt;
  opt.quick = a.quick;
  opt.threads = threads;
#ifdef QVG_HAVE_FAISS
  opt.faiss = perf::faiss_kmeans();
#endif
  opt.progress = [](const std::string& s) { fmt::print(stderr, "qvg bench: {} ...\n", s); };
  fmt::print("qvg bench — CPU target {}{}\n", perf::cpu_target_name(), a.quick ? " (quick: reduced shapes)" : "");
  perf::LoadCheck load;
  auto ms = perf::run_suite(opt, &load);
  const perf::BenchReport report = perf::bench_report(ms, load, perf::cpu_target_name(), a.quick);
  fmt::print("{}", report.table);
  if (!a.json.empty()) {
    write_output_file(a.json, report.json, "--json");
    fmt::print("wrote {}\n", a.json);
  }
}

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Measure decode, k-means (vs faiss), encode, window reconstruction and "
                                            "attention against this machine's copy bandwidth and FMA peak");
  c->add_option("--json", args->json, "write the measurements as one JSON object to this file");
  c->add_flag("--quick", args->quick, "reduced shapes and repetitions (seconds, for smoke tests)");
  add_value(*c, "--threads", args->threads, "threads (0 = all cores; at most max(16, 4 x cores))", "INT");
  c->add_option("--device", args->device, "cpu (cuda when the CUDA backend is built)");
  c->callback([args] { run(*args); });
}

QVG_REGISTER_COMMAND(register_bench);

}  // namespace
}  // namespace qvg::cli
