// Host side of the CUDA backend's device runtime (qvg/cuda_runtime.h): errors, the
// default allocator, device buffers. The codec's device functions are in src/codec/cuda.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <span>
#include <unordered_set>
#include <utility>

#include <fmt/core.h>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "kernels/cuda/per_device.h"
#include "qvg/cuda_runtime.h"

namespace qvg::cuda {
namespace detail {

void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // not reported again by the next check_launch (a sticky error stays)
  throw CudaError(fmt::format("CUDA call {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(e), cudaGetErrorString(e),
                              file, line));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw CudaError(
        fmt::format("CUDA kernel launch {} failed: {} ({})", kernel, cudaGetErrorName(e), cudaGetErrorString(e)));
}

}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device/driver" error
    return 0;
  }
  return n;
}

namespace {

// ---- the default allocator ---------------------------------------------------------
//
// Per device, decided once (thread-safe, lazily, at the first allocation there):
// - stream-ordered pools supported (cudaDevAttrMemoryPoolsSupported) and a pool
//   qvg owns created (cudaMemPoolCreate), with release threshold UINT64_MAX so that
//   freed memory stays in the pool across synchronizations instead of going back to
//   the OS at every sync; allocations are cudaMallocFromPoolAsync / cudaFreeAsync.
//   The device's default pool (process-wide state other libraries share) is left
//   alone.
// - otherwise (some virtualised GPUs, gVisor/Firecracker sandboxes, where every
//   cudaMallocAsync fails; or the attribute says yes but the pool cannot be made):
//   cudaMalloc, and cudaFree after synchronizing the buffer's stream (so the free
//   is stream-ordered; it blocks the host).
// A device whose pool allocation fails at run time with anything but out-of-memory
// outside a capture (an attribute that promises pools is not proof that they work)
// is switched to cudaMalloc from then on (pool_failed); the pointers cudaMalloc gave on such a
// device are remembered, so that each is freed the way it was allocated.
// The pools are never destroyed: they live as long as the process (destroying them
// in a static destructor could run after the CUDA runtime has shut down).
struct DevicePool {
  std::once_flag once;
  bool pools = false;
  cudaMemPool_t pool = nullptr;
  std::atomic<bool> broken{false};  ///< a pool allocation failed: cudaMalloc from now on
};
DevicePool g_pools[detail::kMaxDevices];
std::mutex g_fallback_mutex;
std::unordered_set<void*> g_fallback_ptrs;  ///< cudaMalloc'd on a device with a broken pool

/// The pool of `device` (nullptr when the device does not support pools, its pool
/// could not be created, or it has no slot in the table); decided at the first call
/// for that device.
cudaMemPool_t device_pool(int device) {
  if (device < 0 || device >= detail::kMaxDevices) return nullptr;
  DevicePool& d = g_pools[device];
  std::call_once(d.once, [&] {
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (supported == 0) return;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {  // cudaMalloc instead
      (void)cudaGetLastError();
      return;
    }
    uint64_t threshold = ~uint64_t(0);  // cuuint64_t
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaMemPoolDestroy(pool);
      return;
    }
    d.pool = pool;
    d.pools = true;
  });
  return d.pools ? d.pool : nullptr;
}

/// Whether a failed pool allocation (error e on `stream`) says that the device's pool
/// does not work, so that cudaMalloc should serve the device from now on. Not for
/// out-of-memory, nor on a capturing stream (cudaMalloc cannot run in a capture and a
/// capture's own failure says nothing of the pool), nor when the stream cannot be
/// queried (a sticky fault of the context fails every later call too): those are
/// thrown, and the next allocation tries the pool again.
bool pool_failed(cudaError_t e, Stream stream) {
  if (e == cudaErrorMemoryAllocation) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st == cudaStreamCaptureStatusNone;
}

class DefaultAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Stream stream) override {
    const size_t n = std::max<size_t>(bytes, 1);
    const int device = detail::current_device();
    void* p = nullptr;
    cudaMemPool_t pool = device_pool(device);
    if (pool != nullptr && !g_pools[device].broken.load(std::memory_order_acquire)) {
      const cudaError_t e = cudaMallocFromPoolAsync(&p, n, pool, stream);
      if (e == cudaSuccess) return p;
      (void)cudaGetLastError();
      if (!pool_failed(e, stream)) detail::throw_cuda(e, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
      g_pools[device].broken.store(true, std::memory_order_release);
    }
    QVG_CUDA(cudaMalloc(&p, n));
    if (pool != nullptr) {  // a broken pool's device: remember how p was allocated
      try {
        const std::lock_guard<std::mutex> lock(g_fallback_mutex);
        g_fallback_ptrs.insert(p);
      } catch (...) {
        (void)cudaFree(p);
        throw;
      }
    }
    return p;
  }
  void deallocate(void* p, size_t, Stream stream) noexcept override {
    if (p == nullptr) return;
    // The device the memory belongs to (the current device may have changed since).
    cudaPointerAttributes attr{};
    int device = -1;
    if (cudaPointerGetAttributes(&attr, p) == cudaSuccess)
      device = attr.device;
    else
      (void)cudaGetLastError();
    bool pooled = false;
    try {
      pooled = device >= 0 && device_pool(device) != nullptr;  // already decided when it was allocated
      if (pooled && g_pools[device].broken.load(std::memory_order_acquire)) {
        const std::lock_guard<std::mutex> lock(g_fallback_mutex);
        pooled = g_fallback_ptrs.erase(p) == 0;
      }
    } catch (...) {
      pooled = false;
    }
    // A failure here cannot be thrown (noexcept); it is cleared so that the next
    // check_launch does not report it against an unrelated kernel.
    if (pooled) {
      if (cudaFreeAsync(p, stream) != cudaSuccess) (void)cudaGetLastError();
    } else {
      if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();  // enqueued work done with p
      if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    }
  }
};

}  // namespace

Allocator& default_allocator() {
  static DefaultAllocator a;
  return a;
}

namespace detail {

cudaMemPool_t default_pool(int device) {
  return device_pool(device);
}

namespace {
/// The current device's attribute `Attr`, queried once per device (thread-safe).
template <cudaDeviceAttr Attr>
int device_attribute_once() {
  struct Slot {
    std::once_flag once;
    int value = 0;
  };
  static Slot slots[kMaxDevices];
  const int dev = current_device();
  auto query = [dev] {
    int v = 0;
    QVG_CUDA(cudaDeviceGetAttribute(&v, Attr, dev));
    return v;
  };
  if (dev < 0 || dev >= kMaxDevices) return query();
  Slot& s = slots[dev];
  std::call_once(s.once, [&] { s.value = query(); });
  return s.value;
}
}  // namespace

int max_shared_optin() {
  return device_attribute_once<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
}

int multiprocessor_count() {
  return device_attribute_once<cudaDevAttrMultiProcessorCount>();
}

}  // namespace detail

void release_pool_memory(size_t keep_bytes) {
  if (cudaMemPool_t pool = device_pool(detail::current_device())) QVG_CUDA(cudaMemPoolTrimTo(pool, keep_bytes));
}

// ---- DeviceBuffer -------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes, Stream stream, Allocator& alloc)
    : p_(alloc.allocate(bytes, stream)), n_(bytes), stream_(stream), alloc_(&alloc) {}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_), stream_(o.stream_), alloc_(o.alloc_) {
  o.p_ = nullptr;
  o.n_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) alloc_->deallocate(p_, n_, stream_);
    p_ = o.p_;
    n_ = o.n_;
    stream_ = o.stream_;
    alloc_ = o.alloc_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) alloc_->deallocate(p_, n_, stream_);
}

}  // namespace qvg::cuda
