// src/perf/cuda_bench.h — the GPU benchmarks of the CUDA backend (`qvg bench --device
// cuda`, bench/gpu/qvg_gpu_bench). Part of the evaluation layer: built only with the
// CUDA backend (target qvg_cuda_bench, which links cuBLAS for the matmul peer).
#pragma once

#include <string>

namespace qvg::perf {

struct GpuBenchOptions {
  bool quick = false;  ///< smaller shapes, fewer repetitions (smoke run)
  int repeats = 20;    ///< timed repetitions per measurement (median reported)
  bool verdict = false;  ///< what scripts/gpu-check's verdict needs only: encode of the LongCat tensor at int2
};
/// Runs the GPU benchmarks on the current device and returns a JSON document
/// (object) as text; `table` receives a human-readable table. Synchronizes.
/// Throws qvg::cuda::CudaError when a CUDA call fails (e.g. no device).
std::string run_gpu_benchmarks(const GpuBenchOptions& opt, std::string* table = nullptr);

}  // namespace qvg::perf
