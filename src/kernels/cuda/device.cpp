// Host side of the CUDA backend: errors, the default allocator, device buffers,
// device-resident encoded tensors (upload / download) and the decode entry points.
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
#include "qvg/cuda.h"

namespace qvg::cuda {
namespace detail {

void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw CudaError(fmt::format("CUDA call {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(e),
                              cudaGetErrorString(e), file, line));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw CudaError(fmt::format("CUDA kernel launch {} failed: {} ({})", kernel, cudaGetErrorName(e),
                                cudaGetErrorString(e)));
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
// (issue 24, item 6: an attribute that promises pools is not proof that they work)
// is switched to cudaMalloc from then on; the pointers cudaMalloc gave on such a
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
      if (e == cudaErrorMemoryAllocation) detail::throw_cuda(e, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
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
    if (pooled) {
      (void)cudaFreeAsync(p, stream);
    } else {
      (void)cudaStreamSynchronize(stream);  // the work enqueued on `stream` is done with p
      (void)cudaFree(p);
    }
  }
};

size_t align256(size_t v) { return (v + 255) & ~size_t(255); }

}  // namespace

Allocator& default_allocator() {
  static DefaultAllocator a;
  return a;
}

namespace detail {

cudaMemPool_t default_pool(int device) {
  return device_pool(device);
}

int max_shared_optin() {
  struct Slot {
    std::once_flag once;
    int bytes = 0;
  };
  static Slot slots[kMaxDevices];
  const int dev = current_device();
  auto query = [dev] {
    int v = 0;
    QVG_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return v;
  };
  if (dev < 0 || dev >= kMaxDevices) return query();
  Slot& s = slots[dev];
  std::call_once(s.once, [&] { s.bytes = query(); });
  return s.bytes;
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

// ---- DeviceEncodedTensor --------------------------------------------------------

namespace {
/// Whether an encoding with `parts` holds arrays of `kind`.
bool holds(EncodedParts parts, EncodedArray kind) {
  if (parts == EncodedParts::All) return true;
  return (kind == EncodedArray::Centroids) == (parts == EncodedParts::CentroidsOnly);
}
}  // namespace

DeviceEncodedTensor DeviceEncodedTensor::allocate(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                                  Allocator& alloc, EncodedParts parts) {
  if (shape.b < 1 || shape.s < 1 || shape.h < 1 || shape.d < 1)
    throw InvalidArgument(
        fmt::format("input shape must be [B, S, H, D] with every dimension >= 1, got {}", shape.str()));
  cfg.validate_for_head_dim(shape.d);
  if (shape.s >= (int64_t(1) << 31) || shape.b * shape.h >= (int64_t(1) << 31))
    throw InvalidArgument(fmt::format("input shape {} is too large (tokens and groups must be < 2^31)", shape.str()));
  DeviceEncodedTensor e;
  static_cast<EncodingLayout&>(e) = EncodingLayout::of(shape, dtype, cfg);
  e.parts_ = parts;
  // One allocation: each kind of array 256-byte aligned, the stages of a kind contiguous.
  size_t off = 0;
  for (const ArrayDesc& a : e.arrays()) {
    if (!holds(parts, a.kind)) continue;
    size_t& kind_off = e.offset_[size_t(a.kind)];
    if (a.stage == 0) kind_off = off = align256(off);
    off += a.bytes();
  }
  e.buf_ = DeviceBuffer(align256(off), stream, alloc);
  return e;
}

const uint8_t* DeviceEncodedTensor::data(EncodedArray kind) const {
  const size_t off = offset_[size_t(kind)];
  return off == kAbsent ? nullptr : static_cast<const uint8_t*>(buf_.data()) + off;
}
uint8_t* DeviceEncodedTensor::mutable_data(EncodedArray kind) { return const_cast<uint8_t*>(std::as_const(*this).data(kind)); }

namespace {
/// Device address of one array of `e` (stage s of centroids/ids after stage 0's).
const uint8_t* array_address(const DeviceEncodedTensor& e, const ArrayDesc& a) {
  return e.data(a.kind) + size_t(a.stage) * a.bytes();
}
}  // namespace

size_t DeviceEncodedTensor::nbytes() const {
  size_t n = 0;
  for (const ArrayDesc& a : arrays())
    if (holds(parts_, a.kind)) n += a.bytes();
  return n;
}

DeviceEncodedTensor DeviceEncodedTensor::upload(const EncodedTensor& enc, Stream stream, Allocator& alloc) {
  // A span chunk's encoding has no centroids, a codebook nothing but centroids.
  const bool no_centroids =
      std::all_of(enc.centroid.begin(), enc.centroid.end(), [](const auto& c) { return c.empty(); });
  const bool only_centroids = enc.codes.empty() && enc.scales.empty();
  const EncodedParts parts = no_centroids     ? EncodedParts::WithoutCentroids
                             : only_centroids ? EncodedParts::CentroidsOnly
                                              : EncodedParts::All;
  if (parts == EncodedParts::All)
    enc.validate();
  else
    enc.check();
  DeviceEncodedTensor e = allocate(enc.shape, enc.dtype, enc.config(), stream, alloc, parts);
  for (const ArrayDesc& a : e.arrays()) {
    if (!holds(parts, a.kind)) continue;
    const std::span<const uint8_t> src = enc.array(a);
    if (src.size() != a.bytes())
      throw InvalidArgument(
          fmt::format("upload: array {} must hold {} bytes, got {}", a.name(), a.bytes(), src.size()));
    if (!src.empty())
      QVG_CUDA(cudaMemcpyAsync(const_cast<uint8_t*>(array_address(e, a)), src.data(), src.size(),
                               cudaMemcpyHostToDevice, stream));
  }
  return e;
}

EncodedTensor DeviceEncodedTensor::download(Stream stream) const {
  EncodedTensor enc = EncodedTensor::allocate(*this);
  if (parts_ != EncodedParts::All) {  // as the host span chunks and codebooks: absent arrays empty
    const EncodedTensor full = std::move(enc);
    enc = parts_ == EncodedParts::CentroidsOnly ? full.codebooks_only() : full;
    if (parts_ == EncodedParts::WithoutCentroids)
      for (auto& c : enc.centroid) c = std::vector<uint8_t>();
  }
  for (const ArrayDesc& a : arrays()) {
    if (!holds(parts_, a.kind)) continue;
    const std::span<uint8_t> dst = enc.array(a);
    if (!dst.empty())
      QVG_CUDA(cudaMemcpyAsync(dst.data(), array_address(*this, a), dst.size(), cudaMemcpyDeviceToHost, stream));
  }
  QVG_CUDA(cudaStreamSynchronize(stream));
  return enc;
}

// ---- decode ---------------------------------------------------------------------

void decode_ranges(const std::vector<DeviceDecodeTask>& tasks, Stream stream) {
  std::vector<kernels::DecodeArgs> kt;
  kt.reserve(tasks.size());
  for (const DeviceDecodeTask& tk : tasks) {
    if (tk.enc == nullptr) throw InvalidArgument("decode task without an encoded tensor");
    const DeviceEncodedTensor& e = *tk.enc;
    if (!(0 <= tk.t0 && tk.t0 <= tk.t1 && tk.t1 <= e.shape.s && 0 <= tk.h0 && tk.h0 < tk.h1 && tk.h1 <= e.shape.h))
      throw InvalidArgument(fmt::format("decode range tokens [{}, {}) heads [{}, {}) is outside the tensor {}", tk.t0,
                                        tk.t1, tk.h0, tk.h1, e.shape.str()));
    if (tk.dst.base == nullptr) throw InvalidArgument("decode target base is null");
    const DeviceEncodedTensor& book = tk.codebook ? *tk.codebook : e;
    if (book.centroid_data() == nullptr || e.codes_data() == nullptr)
      throw InvalidArgument("decode task: the encoding has no centroids and no codebook was given, or no codes");
    if (tk.codebook && (book.shape.b != e.shape.b || book.shape.h != e.shape.h || book.shape.d != e.shape.d ||
                        book.centroids != e.centroids || book.stages != e.stages || book.dtype != e.dtype))
      throw InvalidArgument("decode task: the codebook must match the encoding's B, H, D, K, stages and dtype");
    kernels::DecodeArgs t = decode_args(e, {e.codes_data(), e.scales_data(), e.zeros_data(), e.scale_factor_data(),
                                            e.zero_factor_data(), e.ids_data(), book.centroid_data()});
    t.t0 = int32_t(tk.t0);
    t.t1 = int32_t(tk.t1);
    t.h0 = int32_t(tk.h0);
    t.h1 = int32_t(tk.h1);
    t.out_dtype = int8_t(arith_dtype(tk.dst.dtype));
    t.out = tk.dst.base;
    t.batch_stride = tk.dst.batch_stride;
    t.token_stride = tk.dst.token_stride;
    kt.push_back(t);
  }
  kernels::decode_tasks(kt.data(), int(kt.size()), stream);
}

void decode(const DeviceEncodedTensor& enc, TensorView out, Stream stream) {
  if (!(out.shape == enc.shape))
    throw InvalidArgument(fmt::format("decode output shape must be {}, got {}", enc.shape.str(), out.shape.str()));
  DeviceDecodeTask t;
  t.enc = &enc;
  t.t0 = 0;
  t.t1 = enc.shape.s;
  t.h0 = 0;
  t.h1 = enc.shape.h;
  t.dst = DecodeTarget{out.data, out.dtype, enc.shape.s * enc.shape.h * enc.shape.d, enc.shape.h * enc.shape.d};
  decode_ranges({t}, stream);
}

// ---- span codebooks --------------------------------------------------------------

DeviceSpanCodebook DeviceSpanCodebook::empty(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                             Allocator& alloc) {
  DeviceSpanCodebook s;
  s.book = DeviceEncodedTensor::allocate(shape, dtype, cfg, stream, alloc, EncodedParts::CentroidsOnly);
  const size_t n = size_t(shape.b * shape.h * cfg.centroids * shape.d) * dtype_size(dtype) * size_t(cfg.stages);
  QVG_CUDA(cudaMemsetAsync(s.book.mutable_data(EncodedArray::Centroids), 0, n, stream));
  return s;
}
DeviceSpanCodebook DeviceSpanCodebook::upload(const SpanCodebook& h, Stream stream, Allocator& alloc) {
  DeviceSpanCodebook s;
  s.book = DeviceEncodedTensor::upload(h.book, stream, alloc);
  if (s.book.parts() != EncodedParts::CentroidsOnly)
    throw InvalidArgument("span codebook upload: the book must hold centroid arrays only");
  s.filled = h.filled;
  return s;
}
SpanCodebook DeviceSpanCodebook::download(Stream stream) const {
  SpanCodebook h;
  h.book = book.download(stream);
  h.filled = filled;
  return h;
}
DeviceSpanCodebook DeviceSpanCodebook::copy(Stream stream, Allocator& alloc) const {
  DeviceSpanCodebook s;
  s.book =
      DeviceEncodedTensor::allocate(book.shape, book.dtype, book.config(), stream, alloc, EncodedParts::CentroidsOnly);
  QVG_CUDA(cudaMemcpyAsync(s.book.mutable_data(EncodedArray::Centroids), book.centroid_data(), book.nbytes(),
                           cudaMemcpyDeviceToDevice, stream));
  s.filled = filled;
  return s;
}

}  // namespace qvg::cuda
