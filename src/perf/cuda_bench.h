// src/perf/cuda_bench.h — the GPU benchmarks of the CUDA backend (`qvg bench --device
// cuda`, bench/gpu/qvg_gpu_bench). Part of the evaluation layer: built only with the
// CUDA backend (target qvg_cuda_bench, which links cuBLAS for the matmul peer).
#pragma once

#include <functional>
#include <string>

namespace qvg::perf {

struct GpuBenchOptions {
  bool quick = false;  ///< smaller shapes, fewer repetitions (smoke run)
  int repeats = 20;    ///< timed repetitions per measurement (median reported)
  bool verdict = false;  ///< what scripts/gpu-check's verdict needs only: encode of the LongCat tensor at int2
  /// When set: called with the JSON document of the figures measured so far after each
  /// section (and with the final one), so that a later failure or hang keeps them.
  std::function<void(const std::string& json)> progress;
};
/// Runs the GPU benchmarks on the current device and returns a JSON document
/// (object) as text; `table` receives a human-readable table. Synchronizes.
/// Throws qvg::cuda::CudaError when a CUDA call fails (e.g. no device); the last
/// section (init kmeans++) records its failure in the document's "errors" instead.
std::string run_gpu_benchmarks(const GpuBenchOptions& opt, std::string* table = nullptr);

}  // namespace qvg::perf
