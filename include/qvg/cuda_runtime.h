// qvg/cuda_runtime.h — the CUDA backend's device runtime: streams, errors, device
// memory (docs/cuda.md). The kernels layer: the codec's device functions (qvg/cuda.h)
// and the device caches (qvg/cuda_cache.h) are built on it.
//
// Available when the library was built with the CUDA backend (CMake option
// QVG_ENABLE_CUDA; the target `qvg_cuda` defines QVG_HAVE_CUDA=1). Link `qvg_cuda`.
//
// Contracts: streams are explicit (a function taking a `Stream` enqueues on it and
// returns without waiting unless its comment says it synchronizes). Memory comes
// from an Allocator, stream-ordered: a buffer allocated on stream s is freed on s
// when its owner is destroyed. CUDA errors throw CudaError naming the failing call.
#pragma once

#include <cstddef>
#include <string>

#include "qvg/error.h"

struct CUstream_st;

namespace qvg::cuda {

/// The same type as cudaStream_t (nullptr = the legacy default stream).
using Stream = CUstream_st*;

/// A failed CUDA runtime call or kernel launch (error kind Device, RuntimeError in
/// Python); the message names the call and the error.
class CudaError : public DeviceError {
 public:
  explicit CudaError(const std::string& m) : DeviceError(m) {}
};

/// Number of CUDA devices visible (0 when there is no driver or no device; never throws).
int device_count();

/// Stream-ordered device memory. An embedding framework (the PyTorch extension's
/// caching allocator, say) implements this to supply qvg's device memory.
struct Allocator {
  virtual ~Allocator() = default;
  /// `bytes` of device memory usable by work enqueued on `stream` after this call;
  /// at least 256-byte aligned. Throws on failure (CudaError for CUDA failures).
  virtual void* allocate(size_t bytes, Stream stream) = 0;
  /// Returns memory from allocate(bytes, ...) once the work enqueued on `stream`
  /// so far has finished with it. Must not throw.
  virtual void deallocate(void* p, size_t bytes, Stream stream) noexcept = 0;
};
/// The default allocator. On a device with stream-ordered pools
/// (cudaDevAttrMemoryPoolsSupported, queried once per device): a pool qvg creates
/// for that device at its first use (never the device's default pool, which other
/// libraries share), with release threshold UINT64_MAX, so freed memory is kept for
/// reuse across synchronizations; cudaMallocFromPoolAsync / cudaFreeAsync. Without
/// pools (some virtualised GPUs and sandboxes): cudaMalloc, and a free synchronizes
/// the buffer's stream before cudaFree (it blocks the host). Thread-safe.
Allocator& default_allocator();
/// Returns the default allocator's unused pool memory of the current device to the
/// OS, keeping at least `keep_bytes` reserved (cudaMemPoolTrimTo). A no-op without
/// pools. Does not synchronize.
void release_pool_memory(size_t keep_bytes = 0);

/// One owning allocation from an Allocator, freed on the stream it was made on.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, Stream stream, Allocator& alloc = default_allocator());
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* data() const { return p_; }
  size_t size() const { return n_; }
  Stream stream() const { return stream_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  Stream stream_ = nullptr;
  Allocator* alloc_ = nullptr;
};

}  // namespace qvg::cuda
