// src/cache/cuda/device_copy.h — the byte copies of the device caches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/check.h"
#include "qvg/cuda.h"

namespace qvg::cuda::cache_detail {

/// Copies `rows` rows of `width` bytes (rows src_pitch / dst_pitch bytes apart),
/// device to device, on `s`; nothing when width or rows is 0. Throws CudaError.
inline void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                   Stream s) {
  if (width == 0 || rows == 0) return;
  QVG_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, s));
}

}  // namespace qvg::cuda::cache_detail
