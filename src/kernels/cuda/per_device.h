// src/kernels/cuda/per_device.h — work done once per CUDA device, thread-safely:
// the shared-memory opt-in of a kernel (cudaFuncSetAttribute), per-device limits,
// the default allocator's pool. The attribute and the limits are per device, so a
// process-wide "done" flag is wrong with several devices, and a plain static bool
// is a data race between host threads. Host code only (the .cu launchers use it).
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <utility>

#include "kernels/cuda/check.h"

namespace qvg::cuda::detail {

/// Devices with a slot of their own in per-device tables; a device past the table
/// still works, it just repeats the once-only work (every call for PerDeviceOnce).
inline constexpr int kMaxDevices = 64;

/// The calling thread's current device. Throws CudaError.
inline int current_device() {
  int d = 0;
  QVG_CUDA(cudaGetDevice(&d));
  return d;
}

/// Runs an action at most once per device (std::call_once per device slot): if the
/// action throws, a later call runs it again. Devices past kMaxDevices run it on
/// every call, so the action must be idempotent.
class PerDeviceOnce {
 public:
  template <class F>
  void run(int device, F&& f) {
    if (device < 0 || device >= kMaxDevices) {
      std::forward<F>(f)();
      return;
    }
    std::call_once(flags_[device], std::forward<F>(f));
  }

 private:
  std::once_flag flags_[kMaxDevices];
};

/// The largest dynamic shared memory per block the current device allows with the
/// opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin), queried once per device.
int max_shared_optin();

/// The current device's multiprocessor count (cudaDevAttrMultiProcessorCount),
/// queried once per device.
int multiprocessor_count();

/// The memory pool qvg owns on `device` (the default allocator's; release threshold
/// UINT64_MAX), created at the first call for that device; nullptr when the device
/// has no stream-ordered pools (the default allocator then uses cudaMalloc/cudaFree)
/// or no slot in the table. Throws CudaError when the query or the creation fails.
cudaMemPool_t default_pool(int device);

}  // namespace qvg::cuda::detail
