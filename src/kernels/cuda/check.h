// src/kernels/cuda/check.h — CUDA errors as qvg exceptions (qvg::cuda::CudaError).
// Included by .cu files, so it uses no qvg public header (those need C++20).
#pragma once

#include <cuda_runtime_api.h>

namespace qvg::cuda::detail {

/// Throws CudaError "<call> failed: <error name> (<error string>)" unless e is cudaSuccess.
void throw_cuda(cudaError_t e, const char* call, const char* file, int line);
/// After a kernel launch: throws CudaError naming `kernel` if the launch failed.
void check_launch(const char* kernel);

}  // namespace qvg::cuda::detail

#define QVG_CUDA(call) \
  do { \
    cudaError_t qvg_cuda_err_ = (call); \
    if (qvg_cuda_err_ != cudaSuccess) ::qvg::cuda::detail::throw_cuda(qvg_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
