// python/src/dense_binding.h — the binding of a dense cache (spec 3.2) over the
// caller's k/v torch tensors, for the CPU (qvg::DenseCausalCache, bindings.cpp)
// and for CUDA (qvg::cuda::DenseCausalCache, cuda_caches.cpp). A Backend supplies:
//
//   using Cache;                    the C++ cache (ExternalStorage, GrowStorage)
//   struct Call { Call(device); };  what one call needs (CUDA: device guard, stream)
//   std::shared_ptr<Cache> make(options, storage, grow, device);  (checks the device)
//   KVView update(cache, call, key, value, start, head_start, recent_window);
//   copied_views(kv, call, keep) -> (k, v)        a two-range view as torch tensors
//   void before_mutation(call);     what must happen before the cache may change (lent views)
//   void retire(old, call);         an old buffer dropped after work enqueued by the call
//                                   reads it (CUDA: recorded on the call's stream)
//   snapshot_bytes(cache, call), save(cache, call, path), load(data, from_bytes,
//   expectation, storage, call): the cache's snapshots (the CUDA cache's through host memory)
//
// Memory rules (qvg/torch/ documents them): the buffers are the caller's tensors
// (no copy); a one-range view is a torch view (as_strided) of them; growth asks the
// growth hook for new torch buffers, which become .k/.v only if the call succeeds.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/MemoryOverlap.h>

#include "common.h"

namespace qvg_py {

template <class Backend>
class DenseBinding {
 public:
  DenseBinding(const at::Tensor& k, const at::Tensor& v, int64_t sink_tokens,
               std::optional<int64_t> attention_window_size, bool allow_growth) {
    const qvg::DType dt = check_buffer(k, "k");
    device_ = k.device();
    check_buffer(v, "v");
    require_device(v, "v", device_);
    if (v.sizes() != k.sizes())
      throw qvg::InvalidArgument(fmt::format("v shape must equal k shape {}, got {}", shape_str(k), shape_str(v)));
    if (v.scalar_type() != k.scalar_type())
      throw qvg::InvalidArgument(fmt::format("v dtype must equal k dtype {}, got {}", torch_dtype_name(k.scalar_type()),
                                             torch_dtype_name(v.scalar_type())));
    // The cache writes keys into k and values into v (spec 5.1, "Aliasing"): buffers
    // that share memory would overwrite one with the other.
    if (k.numel() > 0 && at::get_overlap_status(k, v) != at::MemOverlapStatus::No)
      throw qvg::InvalidArgument(
          "k and v must not share memory (the cache writes keys into k and values into v), got overlapping buffers");
    opt_.batch = k.size(0);
    opt_.cache_size = k.size(1);
    opt_.heads = k.size(2);
    opt_.head_dim = k.size(3);
    opt_.dtype = dt;
    opt_.sink_tokens = sink_tokens;
    opt_.attention_window_size = attention_window_size;
    opt_.allow_growth = allow_growth;
    k_ = k.requires_grad() ? k.detach() : k;
    v_ = v.requires_grad() ? v.detach() : v;
    // Growth (allow_growth): the cache decides when and how much (spec 3.2) and asks
    // for torch buffers of the new size (zeros, on the buffers' device and, for CUDA,
    // its current stream); they become .k/.v once the call succeeded.
    auto grow = [this](int64_t new_cache_size) { return grow_buffers(new_cache_size); };
    cache_ = backend_.make(opt_, {k_.numel() ? k_.data_ptr() : nullptr, v_.numel() ? v_.data_ptr() : nullptr},
                           std::move(grow), device_);
  }

  /// One update_and_get_attention_kv call. `ge`, `le` are the cursors the
  /// Python side holds (its source of truth); the C++ cache adopts them first.
  ViewOut update(const at::Tensor& key, const at::Tensor& value, int64_t c, std::optional<int64_t> hs,
                 std::optional<int64_t> rw, int64_t ge, int64_t le) {
    BusyGuard busy(mu_);
    check_buffers_unchanged();
    const auto [ki, vi] = call_inputs(key, value, device_, opt_, cache_->cache_size(), c, hs, rw);
    typename Backend::Call call(device_);
    backend_.before_mutation(call);  // first: adopting the cursors may free the view buffer of lent views
    if (cache_->global_end() != ge || cache_->local_end() != le) cache_->set_indices(ge, le);
    qvg::KVView kv;
    {
      py::gil_scoped_release nogil;
      try {
        kv = backend_.update(*cache_, call, ki.view, vi.view, c, hs, rw);
      } catch (...) {
        grown_k_ = at::Tensor();  // a failed call keeps the old buffers (and the cache did not switch)
        grown_v_ = at::Tensor();
        throw;
      }
    }
    if (grown_k_.defined()) {  // the call grew the cache into the buffers of the hook
      backend_.retire(k_, call);  // the growth's copies out of them are enqueued on the call's stream
      backend_.retire(v_, call);
      k_ = std::move(grown_k_);
      v_ = std::move(grown_v_);
      grown_k_ = at::Tensor();
      grown_v_ = at::Tensor();
    }
    if (kv.zero_copy) return view_out(alias_of(k_, kv.k), alias_of(v_, kv.v), kv);
    auto [ok, ov] = backend_.copied_views(kv, call, cache_);
    return view_out(std::move(ok), std::move(ov), kv);
  }

  void reset_indices() {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    backend_.before_mutation(call);
    cache_->reset_indices();
  }
  void set_indices(int64_t ge, int64_t le) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    backend_.before_mutation(call);
    cache_->set_indices(ge, le);
  }

  // ---- snapshots (docs/snapshot.md): the same bytes from the CPU and the CUDA cache ----
  /// The snapshot's bytes, after the C++ cache adopted the cursors the Python side holds
  /// (a CUDA cache downloads its buffers: waits for the current stream).
  /// Both hold the one-caller guard for the whole call (spec 5.1, "Threads").
  std::vector<uint8_t> snapshot_bytes(int64_t ge, int64_t le) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    adopt_for_snapshot(ge, le, call);
    py::gil_scoped_release nogil;
    return backend_.snapshot_bytes(*cache_, call);
  }
  void save(const std::string& path, int64_t ge, int64_t le) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    adopt_for_snapshot(ge, le, call);
    py::gil_scoped_release nogil;
    backend_.save(*cache_, call, path);
  }
  /// Replaces the cache by a snapshot's (a path, or bytes when from_bytes) of a cache
  /// constructed with this one's options; its buffers are new tensors (.k/.v, as after
  /// a growth) on this cache's device. On any error nothing changes.
  void restore(const py::object& source, bool from_bytes) {
    BusyGuard busy(mu_);
    qvg::SnapshotExpectation x;
    x.options = opt_;
    const std::string data = source.cast<std::string>();
    typename Backend::Call call(device_);
    std::shared_ptr<typename Backend::Cache> loaded;
    auto storage = [this](int64_t n) { return grow_buffers(n); };
    try {
      py::gil_scoped_release nogil;
      loaded = backend_.load(data, from_bytes, x, storage, call);
    } catch (...) {
      grown_k_ = at::Tensor();
      grown_v_ = at::Tensor();
      throw;
    }
    QVG_CHECK(grown_k_.defined());
    backend_.before_mutation(call);
    backend_.retire(k_, call);  // the old cache's work may still use them
    backend_.retire(v_, call);
    k_ = std::move(grown_k_);
    v_ = std::move(grown_v_);
    grown_k_ = at::Tensor();
    grown_v_ = at::Tensor();
    cache_ = std::move(loaded);
  }

  /// f(binding) under the one-caller guard: accessors never read a cache another thread
  /// is changing (spec 5.1: RuntimeError instead).
  template <class F>
  auto read(F&& f) {
    BusyGuard busy(mu_);
    return f(std::as_const(*this));
  }
  /// f(cache, call) under the one-caller guard with the call's device set up, the
  /// cache mutable (the CUDA cache's check()).
  template <class F>
  auto with_call_mut(F&& f) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    return f(*cache_, call);
  }
  const at::Tensor& k() const { return k_; }
  const at::Tensor& v() const { return v_; }
  const at::Device& device() const { return device_; }
  const typename Backend::Cache& cache() const { return *cache_; }
  bool can_direct_current_attention(int64_t n) const { return qvg::can_direct_current_attention(*cache_, n); }

 private:
  typename Backend::Cache::ExternalStorage grow_buffers(int64_t new_cache_size) {
    grown_k_ = at::zeros({opt_.batch, new_cache_size, opt_.heads, opt_.head_dim}, k_.options());
    grown_v_ = at::zeros({opt_.batch, new_cache_size, opt_.heads, opt_.head_dim}, v_.options());
    return typename Backend::Cache::ExternalStorage{grown_k_.data_ptr(), grown_v_.data_ptr()};
  }

  void adopt_for_snapshot(int64_t ge, int64_t le, typename Backend::Call& call) {
    check_buffers_unchanged();  // REQUIRES the caller's BusyGuard
    if (cache_->global_end() != ge || cache_->local_end() != le) {
      backend_.before_mutation(call);  // set_indices drops the view buffer
      cache_->set_indices(ge, le);
    }
  }

  /// The C++ cache writes through raw pointers into k_/v_: refuse to go on if the
  /// caller resized them or swapped their storage in place since.
  void check_buffers_unchanged() const {
    const auto kb = cache_->k_buffer(), vb = cache_->v_buffer();
    const std::vector<int64_t> shape = {kb.shape.b, kb.shape.s, kb.shape.h, kb.shape.d};
    if (k_.data_ptr() != kb.data || v_.data_ptr() != vb.data || k_.sizes() != at::IntArrayRef(shape) ||
        v_.sizes() != at::IntArrayRef(shape) || !k_.is_contiguous() || !v_.is_contiguous() || k_.device() != device_ ||
        v_.device() != device_)
      throw qvg::InvalidArgument(fmt::format(
          "the cache's k/v tensors must keep their storage and shape {} (they are the cache's buffers), got k shape "
          "{} after an in-place resize or set_()",
          shape_str(shape), shape_str(k_)));
    // The buffers must stay the cache's: a buffer reinterpreted in place (k.data =
    // k.view(torch.float16) on a bf16 cache) keeps its storage and shape but not its
    // dtype.
    const at::ScalarType want = to_torch_dtype(opt_.dtype);
    if (k_.scalar_type() != want || v_.scalar_type() != want)
      throw qvg::InvalidArgument(fmt::format(
          "the cache's k/v tensors must keep their dtype {} (they are the cache's buffers), got k {} and v {} after "
          "an in-place reinterpretation (.data = ....view(dtype) or set_())",
          torch_dtype_name(want), torch_dtype_name(k_.scalar_type()), torch_dtype_name(v_.scalar_type())));
  }

  Backend backend_;
  at::Device device_ = at::Device(at::kCPU);
  qvg::CacheOptions opt_;
  at::Tensor k_, v_;
  at::Tensor grown_k_, grown_v_;  // buffers handed to the cache by the growth hook during a call
  std::shared_ptr<typename Backend::Cache> cache_;
  std::mutex mu_;
};

/// The Python class of a DenseBinding<Backend>; `extra` adds the backend's own members.
template <class Backend, class Extra>
void def_dense(py::module_& m, const char* name, Extra&& extra) {
  using D = DenseBinding<Backend>;
  auto c =
      py::class_<D>(m, name)
          .def(py::init<const at::Tensor&, const at::Tensor&, int64_t, std::optional<int64_t>, bool>(), py::arg("k"),
               py::arg("v"), py::arg("sink_tokens"), py::arg("attention_window_size"), py::arg("allow_growth"))
          .def("update", &D::update)
          .def("reset_indices", &D::reset_indices)
          .def("set_indices", &D::set_indices)
          .def_property_readonly("k", [](D& d) { return d.read([](const D& x) { return x.k(); }); })
          .def_property_readonly("v", [](D& d) { return d.read([](const D& x) { return x.v(); }); })
          .def_property_readonly("device", [](const D& d) { return d.device().str(); })
          .def_property_readonly("allow_growth",
                                 [](D& d) { return d.read([](const D& x) { return x.cache().allow_growth(); }); })
          .def("can_direct_current_attention",
               [](D& d, int64_t n) { return d.read([n](const D& x) { return x.can_direct_current_attention(n); }); })
          .def("resident_nbytes", [](D& d) { return d.read([](const D& x) { return x.cache().resident_nbytes(); }); })
          .def("save", &D::save, py::arg("path"), py::arg("global_end"), py::arg("local_end"))
          .def("snapshot_bytes",
               [](D& d, int64_t ge, int64_t le) {
                 const std::vector<uint8_t> b = d.snapshot_bytes(ge, le);
                 return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
               })
          .def("restore", &D::restore, py::arg("source"), py::arg("from_bytes"));
  // The cache's cursors and sizes, each read under the binding's lock.
  using Cache = typename Backend::Cache;
  using Figure = int64_t (Cache::*)() const;
  const std::pair<const char*, Figure> figures[] = {
      {"global_end", &Cache::global_end},   {"local_end", &Cache::local_end},
      {"cache_size", &Cache::cache_size},   {"attention_window_size", &Cache::attention_window_size},
      {"sink_tokens", &Cache::sink_tokens}, {"num_heads", &Cache::num_heads}};
  for (const auto& [prop, get] : figures)
    c.def_property_readonly(prop, [get](D& d) { return d.read([get](const D& x) { return (x.cache().*get)(); }); });
  extra(c);
}

}  // namespace qvg_py
