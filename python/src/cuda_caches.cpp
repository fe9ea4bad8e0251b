// python/src/cuda_caches.cpp — the CUDA part of qvg._C (built with the CUDA path,
// python/cmake/QvgTorch.cmake): CudaDenseCache and CudaPackedCache over the
// device-resident caches of qvg/cuda_cache.h. Binding code only.
//
// Rules (qvg/torch/ and docs/python.md document them for users):
//   * A cache lives on one CUDA device. Every call runs under a device guard for
//     it and enqueues its work on torch.cuda.current_stream() of that device; an
//     update never waits for the device (the input-value check of spec 1 runs on
//     the device and is raised by the next call or check(): qvg/cuda_cache.h).
//   * Device memory comes from PyTorch's caching allocator (TorchCudaAllocator):
//     torch.cuda.memory_allocated() counts it and empty_cache() returns it; its
//     out-of-memory error reaches Python as torch.OutOfMemoryError, and the caches
//     allocate everything before they change (the cache is unchanged).
//   * Views are torch CUDA tensors: dense one-range views are views of the
//     caller's buffers; a copied view (packed window, dense two-range view) owns its
//     buffer (handed over by the cache: the caches of a model's layers hold one window
//     at a time, issue 37); the packed current chunk's view points into cache memory
//     and, if still alive at the next mutating call, first gets a private copy of its
//     bytes (enqueued on the stream).
//   * CUDA graph capture: update() makes no synchronizing call, so it can be
//     captured (torch.cuda.graph) once a first update() ran outside the capture
//     (it allocates the cache's pinned check record); the settings that wait
//     (a span break ratio above 0) raise NotImplementedError under a capture, before
//     anything changes (the C++ cache refuses them).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "common.h"
#include "dense_binding.h"
#include "packed_binding.h"
#include "qvg/codec.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"

namespace qvg_py {
namespace {

using qvg::cuda::Stream;

/// qvg's device memory from PyTorch's caching allocator, on the current device.
class TorchCudaAllocator final : public qvg::cuda::Allocator {
 public:
  void* allocate(size_t bytes, Stream stream) override {
    if (bytes == 0) return nullptr;
    // Throws c10::OutOfMemoryError (torch.OutOfMemoryError) when the device is full.
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
  }
  void deallocate(void* p, size_t, Stream) noexcept override {
    if (p == nullptr) return;
    try {
      c10::cuda::CUDACachingAllocator::raw_delete(p);  // stream-ordered: reusable by later work on the block's stream
    } catch (...) {  // deallocate must not throw; the allocator reports a bad pointer itself
    }
  }
};
TorchCudaAllocator& torch_allocator() {
  static TorchCudaAllocator a;
  return a;
}

/// What one call on a device cache needs: the cache's device as current device and
/// that device's current torch stream (which may be capturing a CUDA graph: the
/// caches refuse, themselves, what a capture cannot hold).
struct DeviceCall {
  c10::cuda::CUDAGuard guard;
  at::Device device;
  Stream stream;
  explicit DeviceCall(const at::Device& d)
      : guard(d), device(d), stream(c10::cuda::getCurrentCUDAStream(d.index()).stream()) {}
};

at::TensorOptions device_options(const qvg::StridedView& v, const at::Device& d) {
  return at::TensorOptions().dtype(to_torch_dtype(v.dtype)).device(d);
}

/// Lent views' private copies: caching-allocator memory, copied on `stream`.
void detach_on(Lender& lender, Stream stream) {
  lender.detach([stream](size_t n, const void* src) {
    at::DataPtr copy = c10::cuda::CUDACachingAllocator::get()->allocate(n);
    if (n) {
      const cudaError_t e = cudaMemcpyAsync(copy.get(), src, n, cudaMemcpyDeviceToDevice, stream);
      if (e != cudaSuccess)
        throw qvg::cuda::CudaError(fmt::format("cudaMemcpyAsync (detaching a view) failed: {}", cudaGetErrorString(e)));
    }
    return copy;
  });
}

at::Device require_cuda_device(const at::Device& d, const char* what) {
  if (!d.is_cuda())
    throw qvg::InvalidArgument(fmt::format("{} must be a CUDA device for a CUDA cache, got {}", what, d.str()));
  const int count = qvg::cuda::device_count();
  const int index = d.has_index() ? d.index() : int(c10::cuda::current_device());
  if (index < 0 || index >= count)
    throw qvg::InvalidArgument(fmt::format("{} {} does not exist: {} CUDA device(s) visible", what, d.str(), count));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// ---- the dense cache ----------------------------------------------------------------
/// DenseBinding's CUDA backend: copied (two-range) views are lent from the cache's
/// device view buffer.
/// A copied view (in the cache's view buffer: K then V) as two tensors that own that
/// buffer (Cache::release_view_buffer): nothing is copied when the cache changes, and the
/// cache holds no view between calls, so a model's layers hold one window of view memory
/// at a time, as the engine's fresh views do (issue 37). Under a CUDA graph capture the
/// buffer stays the cache's and the view is lent (the captured graph replays into it).
template <class Cache>
std::pair<at::Tensor, at::Tensor> owned_views(const qvg::KVView& kv, DeviceCall& call,
                                              const std::shared_ptr<Cache>& cache, Lender& lender) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(call.stream, &capture) != cudaSuccess)
    throw qvg::cuda::CudaError("cudaStreamIsCapturing failed");
  if (capture != cudaStreamCaptureStatusNone)
    return {lender.lend(kv.k, device_options(kv.k, call.device), cache),
            lender.lend(kv.v, device_options(kv.v, call.device), cache)};
  auto owner = std::make_shared<qvg::cuda::DeviceBuffer>(cache->release_view_buffer());
  QVG_CHECK(owner->size() > 0);  // a copied view lives in the cache's view buffer
  const auto own = [&](const qvg::StridedView& v) {
    return at::from_blob(
        const_cast<void*>(v.data), sizes_of(v), strides_of(v), [owner](void*) {}, device_options(v, call.device));
  };
  return {own(kv.k), own(kv.v)};
}

struct CudaDense {
  using Cache = qvg::cuda::DenseCausalCache;
  using Call = DeviceCall;
  Lender lender;

  std::shared_ptr<Cache> make(const qvg::CacheOptions& o, Cache::ExternalStorage s, Cache::GrowStorage g,
                              const at::Device& device) {
    require_cuda_device(device, "k's device");
    c10::cuda::CUDAGuard guard(device);
    return std::make_shared<Cache>(o, s, std::move(g), torch_allocator());
  }
  qvg::KVView update(Cache& c, Call& call, qvg::ConstTensorView k, qvg::ConstTensorView v, int64_t start,
                     std::optional<int64_t> hs, std::optional<int64_t> rw) {
    return c.update(k, v, start, call.stream, hs, rw);
  }
  /// A two-range view owns its buffer, as the packed cache's copied views (owned_views).
  std::pair<at::Tensor, at::Tensor> copied_views(const qvg::KVView& kv, Call& call,
                                                 const std::shared_ptr<Cache>& keep) {
    return owned_views(kv, call, keep, lender);
  }
  void before_mutation(Call& call) { detach_on(lender, call.stream); }
  /// The caching allocator frees a block for reuse on the stream it was allocated on;
  /// the caller's buffer may come from another stream than the call's, whose copies out
  /// of it may still run: recorded, the block waits for them (a no-op for memory the
  /// caching allocator did not give).
  void retire(const at::Tensor& old, Call& call) {
    if (old.defined() && old.is_cuda() && old.numel() > 0)
      c10::cuda::CUDACachingAllocator::recordStream(old.storage().data_ptr(),
                                                    c10::cuda::getStreamFromExternal(call.stream, call.device.index()));
  }
  std::vector<uint8_t> snapshot_bytes(const Cache& c, Call& call) { return c.snapshot_bytes(call.stream); }
  void save(const Cache& c, Call& call, const std::string& path) { c.save(path, call.stream); }
  std::shared_ptr<Cache> load(const std::string& data, bool from_bytes, const qvg::SnapshotExpectation& x,
                              Cache::GrowStorage storage, Call& call) {
    return std::make_shared<Cache>(
        from_bytes ? Cache::from_snapshot_bytes({reinterpret_cast<const uint8_t*>(data.data()), data.size()}, x,
                                                std::move(storage), call.stream, torch_allocator())
                   : Cache::load(data, x, std::move(storage), call.stream, torch_allocator()));
  }
};
using CudaDenseCache = DenseBinding<CudaDense>;

// ---- the packed cache ---------------------------------------------------------------
/// PackedBinding's CUDA backend: every view is lent (a torch CUDA tensor over the
/// packed current chunk or the cache's view buffer), copied privately on the stream
/// before that memory may change.
struct CudaPacked {
  using Cache = qvg::cuda::PackedCausalCache;
  using Call = DeviceCall;
  struct ViewLock {};  // each device cache has its own view buffer
  Lender lender;

  at::Device resolve(const at::Device& device) { return require_cuda_device(device, "device"); }
  std::shared_ptr<Cache> make(const qvg::CacheOptions& o, const qvg::QuantArgs& quant, const at::Device& device) {
    c10::cuda::CUDAGuard guard(device);
    return std::make_shared<Cache>(o, quant, torch_allocator());
  }
  void expect(qvg::SnapshotExpectation&, const qvg::CacheOptions&) {}
  qvg::KVView update(Cache& c, Call& call, qvg::ConstTensorView k, qvg::ConstTensorView v, int64_t start,
                     std::optional<int64_t> hs, std::optional<int64_t> rw) {
    return c.update(k, v, start, call.stream, hs, rw);
  }
  /// A zero-copy view (the current chunk) is lent; a copied one owns its buffer (owned_views).
  std::pair<at::Tensor, at::Tensor> view_tensors(const qvg::KVView& kv, Call& call,
                                                 const std::shared_ptr<Cache>& keep) {
    if (kv.zero_copy)
      return {lender.lend(kv.k, device_options(kv.k, call.device), keep),
              lender.lend(kv.v, device_options(kv.v, call.device), keep)};
    return owned_views(kv, call, keep, lender);
  }
  void before_mutation(Call& call) { detach_on(lender, call.stream); }
  void save(const Cache& c, Call& call, const std::string& path) { c.save(path, call.stream); }
  std::vector<uint8_t> snapshot_bytes(const Cache& c, Call& call) { return c.snapshot_bytes(call.stream); }
  std::shared_ptr<Cache> load(const std::string& src, bool from_bytes, const qvg::SnapshotExpectation& x, Call& call) {
    return std::make_shared<Cache>(
        from_bytes ? Cache::from_snapshot_bytes({reinterpret_cast<const uint8_t*>(src.data()), src.size()}, x,
                                                call.stream, torch_allocator())
                   : Cache::load(src, x, call.stream, torch_allocator()));
  }
  std::shared_ptr<Cache> fork(Cache& c, Call& call, const qvg::CacheOptions&) {
    return std::make_shared<Cache>(c.fork(call.stream));
  }
};
using CudaPackedCache = PackedBinding<CudaPacked>;

/// Segment i's K and V as the CPU sees them: raw segments copied to the host, packed
/// ones downloaded and decoded by the CPU decoder (spec 1.3; with the span's codebook
/// and the refinement layers the segment holds, as the view shows it), as CPU tensors
/// [B, g1 - g0, H, D]. Synchronizes the current stream. For tests.
py::tuple segment_on_host(const qvg::cuda::PackedCausalCache& cache, DeviceCall& call, size_t i) {
  const auto s = cache.segment(i);
  const auto host = [&](const qvg::StridedView& raw, const qvg::cuda::DeviceEncodedTensor* enc,
                        const qvg::cuda::DeviceEncodedTensor* book, const qvg::cuda::DeviceEncodedTensor* ref) {
    if (enc) {
      const qvg::EncodedTensor e = enc->download(call.stream);
      std::optional<qvg::EncodedTensor> b, r;
      if (book) b = book->download(call.stream);
      if (ref) r = ref->download(call.stream);
      qvg::Tensor dec(e.dtype, e.shape);
      const int64_t S = e.shape.s, H = e.shape.h, D = e.shape.d;
      const qvg::DecodeTarget dst{dec.data(), e.dtype, S * H * D, H * D};
      qvg::decode_ranges({{&e, 0, S, 0, H, dst, b ? &*b : nullptr}});
      if (r) qvg::add_refinement(*r, 0, S, 0, H, dst);
      at::Tensor t = at::empty({dec.shape().b, dec.shape().s, dec.shape().h, dec.shape().d},
                               at::TensorOptions().dtype(to_torch_dtype(dec.dtype())));
      std::memcpy(t.data_ptr(), dec.data(), dec.nbytes());
      return t;
    }
    const at::Tensor dev =
        at::from_blob(const_cast<void*>(raw.data), sizes_of(raw), strides_of(raw), device_options(raw, call.device));
    return dev.to(at::kCPU);  // a copy on the current stream, waited for
  };
  return py::make_tuple(host(s.k_raw, s.packed ? s.k_enc : nullptr, s.k_codebook, s.k_ref),
                        host(s.v_raw, s.packed ? s.v_enc : nullptr, s.v_codebook, s.v_ref));
}

}  // namespace

void register_cuda(py::module_& m) {
  m.def("cuda_device_count", &qvg::cuda::device_count,
        "CUDA devices visible to qvg's CUDA backend (0 without a driver)");

  def_dense<CudaDense>(m, "CudaDenseCache", [](auto& c) {
    using D = CudaDenseCache;
    c.def("view_buffer_nbytes", [](const D& d) { return d.cache().view_buffer_nbytes(); })
        .def("check", [](D& d) { d.with_call_mut([](auto& x, DeviceCall& call) { x.check(call.stream); }); })
        .def("debug_state", [](const D& d) {
          return py::make_tuple(d.k().to(at::kCPU), d.v().to(at::kCPU), d.cache().cache_size(),
                                d.cache().attention_window_size(), d.cache().global_end(), d.cache().local_end(),
                                d.cache().resident_nbytes(), d.cache().view_buffer_nbytes());
        });
  });

  def_packed<CudaPacked>(m, "CudaPackedCache", [](auto& c) {
    using P = CudaPackedCache;
    c.def(py::init([](int64_t batch, int64_t cache_size, int64_t heads, int64_t head_dim, const std::string& dtype,
                      int64_t sink_tokens, std::optional<int64_t> attention_window_size, bool allow_growth,
                      const qvg::QuantArgs& quant, int64_t head_offset, const std::string& device) {
            return std::make_unique<P>(cache_options(batch, cache_size, heads, head_dim, dtype, sink_tokens,
                                                     attention_window_size, allow_growth, head_offset),
                                       quant, at::Device(device));
          }),
          py::arg("batch"), py::arg("cache_size"), py::arg("heads"), py::arg("head_dim"), py::arg("dtype"),
          py::arg("sink_tokens"), py::arg("attention_window_size"), py::arg("allow_growth"), py::arg("quant"),
          py::arg("head_offset"), py::arg("device"))
        .def("segment_on_host",
             [](P& p, size_t i) {
               return p.with_call([i](const auto& x, DeviceCall& call) { return segment_on_host(x, call, i); });
             })
        // A snapshot for tests: cursors, segments, byte counts (equal snapshots mean an
        // unchanged structure; segment bytes are compared through segment_on_host).
        .def("debug_state",
             [](P& p) {
               return p.read([](const auto& x) {
                 return py::make_tuple(x.global_end(), x.local_end(), x.chunk_tokens(), segment_list(x),
                                       x.resident_nbytes(), x.allocated_nbytes(), x.view_buffer_nbytes());
               });
             })
        .def("check", [](P& p) { p.with_call_mut([](auto& x, DeviceCall& call) { x.check(call.stream); }); })
        .def_property_readonly("device", [](const P& p) { return p.device().str(); })
        .def("allocated_nbytes", [](P& p) { return p.read([](const auto& x) { return x.allocated_nbytes(); }); })
        .def("view_buffer_nbytes", [](P& p) { return p.read([](const auto& x) { return x.view_buffer_nbytes(); }); });
  });
}

}  // namespace qvg_py
