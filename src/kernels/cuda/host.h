// src/kernels/cuda/host.h — helpers of the CUDA backend's host code (C++20; the .cu
// files do not include it).
#pragma once

#include "kernels/cuda/arith.cuh"
#include "qvg/tensor.h"

namespace qvg::cuda {

/// qvg::DType as the kernels' small integer (cuda_arith::kBF16 / kF16 / kF32).
inline int arith_dtype(DType t) {
  static_assert(int(DType::BF16) == cuda_arith::kBF16 && int(DType::F16) == cuda_arith::kF16 &&
                int(DType::F32) == cuda_arith::kF32);
  return int(t);
}

}  // namespace qvg::cuda
