// python/src/packed_binding.h — the binding of a packed cache (spec 4), for the CPU
// (qvg::PackedCausalCache, bindings.cpp) and for CUDA (qvg::cuda::PackedCausalCache,
// cuda_caches.cpp), as dense_binding.h is for the dense caches. A Backend supplies:
//
//   using Cache;                     the C++ cache
//   struct Call { Call(device); };   what one call needs (CUDA: device guard, stream)
//   struct ViewLock;                 held while a view is produced and copied out, and
//                                    while the cache is replaced (CPU: the process-wide
//                                    view scratch's lock; CUDA: nothing)
//   at::Device resolve(device);      the cache's device (checked; CUDA: with its index)
//   std::shared_ptr<Cache> make(options, quant, device);
//   void expect(SnapshotExpectation&, options);  the backend's part of a load's expectation
//   KVView update(cache, call, key, value, start, head_start, recent_window);
//   std::pair<at::Tensor, at::Tensor> view_tensors(kv, call, keep);  K and V as torch tensors
//   void before_mutation(call);      lent views get their private copies
//   void save(cache, call, path); std::vector<uint8_t> snapshot_bytes(cache, call);
//   std::shared_ptr<Cache> load(source, from_bytes, expectation, call);
//   std::shared_ptr<Cache> fork(cache, call, options);  a branch (qvg/cache.h, "Branches")
//
// Rules: one caller at a time (BusyGuard: a second thread gets RuntimeError, spec
// 5.1), every accessor included; the GIL is released around the cache's own work;
// a lent view (a torch tensor over cache memory) gets a private copy of its bytes
// before that memory may change (before_mutation), so it never dangles.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "qvg/cache.h"

namespace qvg_py {

template <class Backend>
class PackedBinding {
 public:
  using Cache = typename Backend::Cache;

  PackedBinding(const qvg::CacheOptions& o, const qvg::QuantArgs& quant, const at::Device& device)
      : device_(backend_.resolve(device)), options_(o), quant_(quant) {
    cache_ = backend_.make(options_, quant_, device_);
  }

  ViewOut update(const at::Tensor& key, const at::Tensor& value, int64_t c, std::optional<int64_t> hs,
                 std::optional<int64_t> rw) {
    BusyGuard busy(mu_);
    const auto [ki, vi] = call_inputs(key, value, device_, options_, options_.cache_size, c, hs, rw);
    typename Backend::Call call(device_);
    backend_.before_mutation(call);
    [[maybe_unused]] const typename Backend::ViewLock view_lock;  // held until the view is copied out
    qvg::KVView kv;
    {
      py::gil_scoped_release nogil;
      kv = backend_.update(*cache_, call, ki.view, vi.view, c, hs, rw);
    }
    auto [ok, ov] = backend_.view_tensors(kv, call, cache_);
    return view_out(std::move(ok), std::move(ov), kv);
  }

  void reset_indices() {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    backend_.before_mutation(call);
    [[maybe_unused]] const typename Backend::ViewLock view_lock;  // reset releases the view memory
    cache_->reset_indices();
  }

  // ---- snapshots (docs/snapshot.md): the same bytes from either cache ----
  void save(const std::string& path) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    py::gil_scoped_release nogil;
    backend_.save(*cache_, call, path);
  }
  py::bytes snapshot_bytes() {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    std::vector<uint8_t> b;
    {
      py::gil_scoped_release nogil;
      b = backend_.snapshot_bytes(*cache_, call);
    }
    return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
  /// Replaces this cache's state by a snapshot's (a path, or bytes when from_bytes; a
  /// CPU or a CUDA cache's), which must hold a cache of this cache's options and quant
  /// args; on any error nothing changes. Lent views get their private copies first.
  void restore(const py::object& source, bool from_bytes) {
    BusyGuard busy(mu_);
    qvg::SnapshotExpectation x;
    x.options = options_;
    x.quant = quant_;
    x.threads = quant_.codec.threads;
    backend_.expect(x, options_);
    typename Backend::Call call(device_);
    const std::string src = source.cast<std::string>();
    std::shared_ptr<Cache> loaded;
    {
      py::gil_scoped_release nogil;
      loaded = backend_.load(src, from_bytes, x, call);
    }
    backend_.before_mutation(call);
    [[maybe_unused]] const typename Backend::ViewLock view_lock;  // the old cache's views share the view memory
    cache_ = std::move(loaded);
  }

  /// A new binding over a fork of this cache (qvg/cache.h, "Branches"): the same
  /// options (on the CPU the process-wide view scratch, as every packed cache of the
  /// process), quant args and device. This cache is unchanged; its lent views stay lent.
  std::unique_ptr<PackedBinding> fork() {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    std::shared_ptr<Cache> f;
    {
      py::gil_scoped_release nogil;
      f = backend_.fork(*cache_, call, options_);
    }
    return std::unique_ptr<PackedBinding>(new PackedBinding(device_, options_, quant_, std::move(f)));
  }

  /// f(cache) under the one-caller guard: an accessor never reads a cache that another
  /// thread is changing (spec 5.1; RuntimeError instead).
  template <class F>
  auto read(F&& f) {
    BusyGuard busy(mu_);
    return f(std::as_const(*cache_));
  }
  /// f(cache, call) under the one-caller guard with the call's device set up (for the
  /// backend's own members that copy from the device).
  template <class F>
  auto with_call(F&& f) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    return f(std::as_const(*cache_), call);
  }
  /// with_call() with the cache mutable (check(): it records what it reported).
  template <class F>
  auto with_call_mut(F&& f) {
    BusyGuard busy(mu_);
    typename Backend::Call call(device_);
    return f(*cache_, call);
  }
  const at::Device& device() const { return device_; }

 private:
  PackedBinding(const at::Device& device, const qvg::CacheOptions& o, const qvg::QuantArgs& quant,
                std::shared_ptr<Cache> cache)
      : device_(device), options_(o), quant_(quant), cache_(std::move(cache)) {}

  Backend backend_;
  at::Device device_;
  qvg::CacheOptions options_;  // as constructed: what a restored snapshot must hold
  qvg::QuantArgs quant_;
  std::shared_ptr<Cache> cache_;
  std::mutex mu_;
};

/// The Python class of a PackedBinding<Backend> with the members both caches have;
/// `extra` adds the constructor and the backend's own members.
template <class Backend, class Extra>
void def_packed(py::module_& m, const char* name, Extra&& extra) {
  using P = PackedBinding<Backend>;
  auto c =
      py::class_<P>(m, name)
          .def("update", &P::update)
          .def("reset_indices", &P::reset_indices)
          .def("save", &P::save, py::arg("path"))
          .def("snapshot_bytes", &P::snapshot_bytes)
          .def("restore", &P::restore, py::arg("source"), py::arg("from_bytes"))
          .def("segments", [](P& p) { return p.read([](const auto& x) { return segment_list(x); }); })
          .def("can_direct_current_attention",
               [](P& p, int64_t n) {
                 return p.read([n](const auto& x) { return qvg::can_direct_current_attention(x, n); });
               })
          // The cache's cursors and sizes, each read under the binding's lock.
          .def_property_readonly("global_end",
                                 [](P& p) { return p.read([](const auto& x) { return x.global_end(); }); })
          .def_property_readonly("local_end", [](P& p) { return p.read([](const auto& x) { return x.local_end(); }); })
          .def_property_readonly("chunk_tokens",
                                 [](P& p) { return p.read([](const auto& x) { return x.chunk_tokens(); }); })
          .def("fork", &P::fork)
          .def("resident_nbytes", [](P& p) { return p.read([](const auto& x) { return x.resident_nbytes(); }); })
          .def("shared_nbytes", [](P& p) { return p.read([](const auto& x) { return x.shared_nbytes(); }); })
          .def("warm_state_nbytes", [](P& p) { return p.read([](const auto& x) { return x.warm_state_nbytes(); }); })
          .def("span_breaks", [](P& p) { return p.read([](const auto& x) { return x.span_breaks(); }); });
  extra(c);
}

}  // namespace qvg_py
