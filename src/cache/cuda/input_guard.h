// src/cache/cuda/input_guard.h — the deferred input check of the device caches
// (docs/cuda.md, "update() does not wait"). Spec 1's input limits are
// checked on the device, and the result never travels back inside the call:
//   * enqueue() scans the call's key and value into device flags;
//   * copy2d() writes the call's rows into the cache only when the scan found nothing
//     (a bad call's rows are never stored, so nothing outside the limits is ever
//     encoded; a new chunk's rows become zeros instead);
//   * the device then publishes a bad call into a ring of slots in pinned host memory,
//     which raise_published() reads at the cache's next call — no synchronization, no
//     copy back — and wait_and_raise() after synchronizing the stream (check()).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/guard_bodies.cuh"
#include "qvg/cuda.h"
#include "qvg/tensor.h"

namespace qvg::cuda::detail {

class InputGuard {
 public:
  /// No CUDA call: the first prepare() allocates the pinned ring (cudaHostAlloc, mapped)
  /// and the flags.
  InputGuard() = default;
  ~InputGuard();
  InputGuard(InputGuard&& o) noexcept;
  InputGuard& operator=(InputGuard&& o) noexcept;
  InputGuard(const InputGuard&) = delete;
  InputGuard& operator=(const InputGuard&) = delete;

  /// Throws InvalidArgument for the oldest bad call the device has published that no
  /// earlier raise reported: the CPU cache's message (the tensor, the first bad value,
  /// its [b, t, h, d] in the call's chunk) naming the call's chunk. Reads host memory
  /// only: makes no CUDA call and never waits. A call still running on the device is
  /// not seen yet; a later raise sees it.
  void raise_published();
  /// Synchronizes `s` (the stream of the cache's calls), then raise_published().
  void wait_and_raise(Stream s);
  /// Before a call changes anything: the first call allocates the pinned ring
  /// (cudaHostAlloc) and the flags (device memory from `alloc`, zeroed on `s`), which a
  /// CUDA graph capture cannot hold — Unsupported then, on a capturing `s` (also when
  /// an earlier first call failed before both existed); later calls make no CUDA call
  /// here. Throws CudaError.
  void prepare(Stream s, Allocator& alloc);
  /// Enqueues on `s` the limit scans of key and value (dense [B, n, h, D] device
  /// tensors of one dtype) of the call of chunk `chunk_start`, and the publication
  /// of a bad call. REQUIRES prepare() before. Throws CudaError.
  void enqueue(ConstTensorView key, ConstTensorView value, int64_t chunk_start, Stream s);
  /// cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows), device to device, done
  /// on the device only when the last enqueue()'s scans found nothing; else zeros
  /// (zero_if_bad) or nothing written. REQUIRES enqueue() before, on `s`.
  void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, bool zero_if_bad,
              Stream s) const;

 private:
  kernels::CheckSlot* slots_ = nullptr;      ///< host address of the ring
  kernels::CheckSlot* dev_slots_ = nullptr;  ///< its device address
  DeviceBuffer flags_;                       ///< kernels::CheckFlags
  unsigned long long reported_ = 0;          ///< the last bad call raised
  uint64_t n_key_ = 0, n_value_ = 0;         ///< the last enqueue()'s element counts
};

}  // namespace qvg::cuda::detail
