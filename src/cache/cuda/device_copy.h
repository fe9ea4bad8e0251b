// src/cache/cuda/device_copy.h — the byte copies of the device caches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "kernels/cuda/check.h"
#include "qvg/cuda.h"
#include "qvg/error.h"

namespace qvg::cuda::cache_detail {

/// Copies `rows` rows of `width` bytes (rows src_pitch / dst_pitch bytes apart),
/// device to device, on `s`; nothing when width or rows is 0. Throws CudaError.
inline void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                   Stream s) {
  if (width == 0 || rows == 0) return;
  QVG_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, s));
}

/// Throws Unsupported, before the call changes anything, when `s` is capturing a CUDA
/// graph and the call would free memory allocated before the capture (`what`: what
/// it would free, and why). A graph can free only its own allocations: the default
/// allocator's cudaFreeAsync of an older buffer fails inside a capture, and a caching
/// allocator would hand the buffer out again at capture time while the graph still
/// reads it at replay. Throws CudaError.
inline void refuse_freeing_under_capture(bool frees, Stream s, const char* what) {
  if (!frees) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  QVG_CUDA(cudaStreamIsCapturing(s, &st));
  if (st == cudaStreamCaptureStatusNone) return;
  throw Unsupported(std::string("update() under CUDA graph capture would ") + what +
                    ", freeing buffers allocated before the capture, which a graph cannot free: run this update() "
                    "outside the capture (capture the steps that rewrite the current chunk with a view of the same "
                    "size)");
}

}  // namespace qvg::cuda::cache_detail
