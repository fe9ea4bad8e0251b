// qvg._C — the binding layer of the PyTorch extension (FlashInfer style: it only
// exports). The engine-compatible classes live in qvg/torch.py; this file turns
// torch tensors into qvg views, calls the C++ caches (include/qvg/cache.h) and
// turns their views back into torch tensors. No cache logic lives here.
//
// Memory and lifetime rules (what qvg/torch.py documents to its users):
//   * Inputs (key, value) are read in place when they are CPU tensors that are
//     contiguous in [B, n, h, D] order; anything else is made contiguous first.
//   * DenseCache keeps the caller's k/v tensors as its buffers (ExternalStorage),
//     so a zero-copy view is a plain torch view (as_strided) of those tensors and
//     lives as long as any torch tensor. On growth the C++ cache (which decides
//     when and by how much, spec 3.2) asks the binding's GrowStorage hook for new
//     torch buffers before it changes anything; they become `.k`/`.v` once the call
//     succeeded, so a failing call changes nothing and `.k`/`.v` are always
//     torch-owned tensors.
//   * A copied view (the C++ cache's scratch buffer) is copied once more into a
//     fresh torch tensor owned by the caller, as the engine's packed cache returns
//     fresh tensors: the scratch is reused or freed by the next call.
//   * PackedCache zero-copy views alias the current chunk's raw segment. The
//     segment may be packed or dropped by a later call, so before every mutating
//     call the binding gives any such view that is still alive a private copy of
//     its bytes (StorageImpl::set_data_ptr): it never dangles, it just stops
//     following the cache. The tensors' deleter also holds the C++ cache, so
//     dropping the Python cache object first is safe.
//
// Error kinds map to the Python exceptions of spec 5: InvalidArgument and
// CorruptData -> ValueError, Unsupported -> NotImplementedError, OutOfRange ->
// RuntimeError, Device -> RuntimeError, with the C++ message unchanged. A tensor
// on a device this build does not support is Unsupported (NotImplementedError).
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "qvg/cache.h"
#include "qvg/config.h"
#include "qvg/error.h"
#include "qvg/tensor.h"
#include "qvg/version.h"

namespace py = pybind11;

namespace {

// ---- dtypes ---------------------------------------------------------------------
std::optional<qvg::DType> to_qvg_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return qvg::DType::F32;
    case at::kBFloat16: return qvg::DType::BF16;
    case at::kHalf: return qvg::DType::F16;
    default: return std::nullopt;
  }
}

at::ScalarType to_torch_dtype(qvg::DType t) {
  switch (t) {
    case qvg::DType::F32: return at::kFloat;
    case qvg::DType::BF16: return at::kBFloat16;
    case qvg::DType::F16: return at::kHalf;
  }
  return at::kFloat;
}

std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kDouble: return "torch.float64";
    default: return std::string("torch.") + c10::toString(t);
  }
}

std::string shape_str(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
std::string shape_str(const at::Tensor& t) { return shape_str(t.sizes()); }

// ---- inputs -----------------------------------------------------------------------
/// A key or value tensor seen as a qvg view; `owner` keeps a contiguous copy alive
/// when one had to be made.
struct Input {
  at::Tensor owner;
  qvg::ConstTensorView view;
};

/// A device this build does not support is Unsupported (NotImplementedError, spec 5).
void require_cpu(const at::Tensor& t, const char* what) {
  if (!t.device().is_cpu())
    throw qvg::Unsupported(fmt::format("{} must be a CPU tensor (qvg.torch runs on the CPU in this build), got device {}",
                                       what, t.device().str()));
}

Input as_input(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw qvg::InvalidArgument(fmt::format("{} must be a tensor, got None", what));
  require_cpu(t, what);
  if (t.dim() != 4)
    throw qvg::InvalidArgument(fmt::format("{} must be a 4-D tensor [B, n, h, D], got shape {}", what, shape_str(t)));
  const auto dt = to_qvg_dtype(t.scalar_type());
  if (!dt)
    throw qvg::InvalidArgument(fmt::format(
        "{} dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {}", what,
        torch_dtype_name(t.scalar_type())));
  Input in;
  in.owner = t.is_contiguous() ? t : t.contiguous();
  in.view.data = in.owner.numel() > 0 ? in.owner.data_ptr() : nullptr;
  in.view.dtype = *dt;
  in.view.shape = {in.owner.size(0), in.owner.size(1), in.owner.size(2), in.owner.size(3)};
  return in;
}

/// Checks a dense cache buffer handed in by the caller ([B, cache_size, H, D]).
qvg::DType check_buffer(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw qvg::InvalidArgument(fmt::format("{} must be a tensor, got None", what));
  require_cpu(t, what);
  if (t.dim() != 4)
    throw qvg::InvalidArgument(
        fmt::format("{} must be a 4-D tensor [B, cache_size, H, D], got shape {}", what, shape_str(t)));
  const auto dt = to_qvg_dtype(t.scalar_type());
  if (!dt)
    throw qvg::InvalidArgument(fmt::format(
        "{} dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {}", what,
        torch_dtype_name(t.scalar_type())));
  if (!t.is_contiguous())
    throw qvg::InvalidArgument(fmt::format(
        "{} must be contiguous (the cache writes into it in place), got strides that are not [B, cache_size, H, D] "
        "row-major for shape {}",
        what, shape_str(t)));
  return *dt;
}

// ---- outputs ----------------------------------------------------------------------
at::TensorOptions options_of(const qvg::StridedView& v) {
  return at::TensorOptions().dtype(to_torch_dtype(v.dtype)).device(at::kCPU);
}

std::vector<int64_t> sizes_of(const qvg::StridedView& v) { return {v.shape.b, v.shape.s, v.shape.h, v.shape.d}; }
std::vector<int64_t> strides_of(const qvg::StridedView& v) { return {v.stride_b, v.stride_t, v.stride_h, 1}; }

/// A fresh torch tensor holding a copy of `v` (for views in the cache's scratch).
at::Tensor copy_out(const qvg::StridedView& v) {
  at::Tensor out = at::empty(sizes_of(v), options_of(v));
  if (out.numel() == 0) return out;
  if (v.is_dense()) {
    std::memcpy(out.data_ptr(), v.data, out.nbytes());
  } else {
    at::Tensor src = at::from_blob(const_cast<void*>(v.data), sizes_of(v), strides_of(v), options_of(v));
    out.copy_(src);
  }
  return out;
}

/// A torch view of `buffer` (one of the dense cache's k/v tensors) covering `v`.
at::Tensor alias_of(const at::Tensor& buffer, const qvg::StridedView& v) {
  const auto esz = int64_t(qvg::dtype_size(v.dtype));
  const auto off = (static_cast<const char*>(v.data) - static_cast<const char*>(buffer.data_ptr())) / esz;
  return buffer.as_strided(sizes_of(v), strides_of(v), buffer.storage_offset() + off);
}

py::tuple view_tuple(at::Tensor k, at::Tensor v, const qvg::KVView& kv) {
  return py::make_tuple(std::move(k), std::move(v), kv.local_start_index, kv.local_end_index, kv.visible_local_end,
                        kv.visible_global_end, kv.zero_copy);
}

/// Fails fast when two Python threads use one cache at the same time (the C++
/// caches are not thread-safe and the GIL is released during update()).
class BusyGuard {
 public:
  explicit BusyGuard(std::mutex& m) : lock_(m, std::try_to_lock) {
    if (!lock_.owns_lock())
      throw std::runtime_error("qvg cache is being used by another thread; a cache takes one caller at a time");
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// ---- configuration ------------------------------------------------------------------
qvg::QuantArgs make_quant_args(std::optional<int> bits, int centroids, int block_size, int stages, int kmeans_iters,
                               bool asymmetric, int keep_recent_chunks, bool sink, const std::string& sink_span,
                               int sink_keep_chunks, int span_chunks, const std::string& scaling,
                               const std::string& scale_dtype, const std::string& init, uint64_t seed, int threads) {
  return {.bits = bits, .centroids = centroids, .block_size = block_size, .stages = stages, .kmeans_iters = kmeans_iters,
          .asymmetric = asymmetric, .keep_recent_chunks = keep_recent_chunks, .sink = sink,
          .sink_span = qvg::parse_sink_span(sink_span), .sink_keep_chunks = sink_keep_chunks,
          .span_chunks = span_chunks, .scaling = qvg::parse_scaling(scaling),
          .scale_dtype = qvg::parse_scale_dtype(scale_dtype), .init = qvg::parse_init(init), .seed = seed,
          .threads = threads};
}

py::dict quant_args_dict(const qvg::QuantArgs& q) {
  py::dict d;
  d["bits"] = q.bits ? py::object(py::int_(*q.bits)) : py::object(py::none());
  d["centroids"] = q.centroids;
  d["block_size"] = q.block_size;
  d["stages"] = q.stages;
  d["kmeans_iters"] = q.kmeans_iters;
  d["asymmetric"] = q.asymmetric;
  d["keep_recent_chunks"] = q.keep_recent_chunks;
  d["sink"] = q.sink;
  d["sink_span"] = std::string(qvg::name(q.sink_span));
  d["sink_keep_chunks"] = q.sink_keep_chunks;
  d["span_chunks"] = q.span_chunks;
  d["scaling"] = std::string(qvg::name(q.scaling));
  d["scale_dtype"] = std::string(qvg::name(q.scale_dtype));
  d["init"] = std::string(qvg::name(q.init));
  d["seed"] = q.seed;
  return d;
}

// ---- the dense cache ----------------------------------------------------------------
class DenseCache {
 public:
  DenseCache(const at::Tensor& k, const at::Tensor& v, int64_t sink_tokens,
             std::optional<int64_t> attention_window_size, bool allow_growth) {
    const qvg::DType dt = check_buffer(k, "k");
    check_buffer(v, "v");
    if (v.sizes() != k.sizes())
      throw qvg::InvalidArgument(fmt::format("v shape must equal k shape {}, got {}", shape_str(k), shape_str(v)));
    if (v.scalar_type() != k.scalar_type())
      throw qvg::InvalidArgument(fmt::format("v dtype must equal k dtype {}, got {}",
                                             torch_dtype_name(k.scalar_type()), torch_dtype_name(v.scalar_type())));
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
    // for torch buffers of the new size; they become .k/.v once the call succeeded.
    auto grow = [this](int64_t new_cache_size) {
      grown_k_ = at::zeros({opt_.batch, new_cache_size, opt_.heads, opt_.head_dim}, k_.options());
      grown_v_ = at::zeros({opt_.batch, new_cache_size, opt_.heads, opt_.head_dim}, v_.options());
      return qvg::DenseCausalCache::ExternalStorage{grown_k_.data_ptr(), grown_v_.data_ptr()};
    };
    cache_ = std::make_unique<qvg::DenseCausalCache>(
        opt_,
        qvg::DenseCausalCache::ExternalStorage{k_.numel() ? k_.data_ptr() : nullptr,
                                               v_.numel() ? v_.data_ptr() : nullptr},
        grow);
  }

  /// One update_and_get_attention_kv call. `ge`, `le` are the cursors the
  /// Python side holds (its source of truth); the C++ cache adopts them first.
  py::tuple update(const at::Tensor& key, const at::Tensor& value, int64_t c, std::optional<int64_t> hs,
                   std::optional<int64_t> rw, int64_t ge, int64_t le) {
    BusyGuard busy(mu_);
    check_buffers_unchanged();
    const Input ki = as_input(key, "key"), vi = as_input(value, "value");
    if (cache_->global_end() != ge || cache_->local_end() != le) cache_->set_indices(ge, le);
    qvg::KVView kv;
    {
      py::gil_scoped_release nogil;
      try {
        kv = cache_->update(ki.view, vi.view, c, hs, rw);
      } catch (...) {
        grown_k_ = at::Tensor();  // a failed call keeps the old buffers (and the cache did not switch)
        grown_v_ = at::Tensor();
        throw;
      }
    }
    if (grown_k_.defined()) {  // the call grew the cache into the buffers of the hook
      k_ = std::move(grown_k_);
      v_ = std::move(grown_v_);
      grown_k_ = at::Tensor();
      grown_v_ = at::Tensor();
    }
    at::Tensor ok = kv.zero_copy ? alias_of(k_, kv.k) : copy_out(kv.k);
    at::Tensor ov = kv.zero_copy ? alias_of(v_, kv.v) : copy_out(kv.v);
    return view_tuple(std::move(ok), std::move(ov), kv);
  }

  void reset_indices() {
    BusyGuard busy(mu_);
    cache_->reset_indices();
  }
  void set_indices(int64_t ge, int64_t le) {
    BusyGuard busy(mu_);
    cache_->set_indices(ge, le);
  }

  const at::Tensor& k() const { return k_; }
  const at::Tensor& v() const { return v_; }
  const qvg::DenseCausalCache& cache() const { return *cache_; }

 private:
  /// The C++ cache writes through raw pointers into k_/v_: refuse to go on if the
  /// caller resized them or swapped their storage in place since.
  void check_buffers_unchanged() const {
    const auto kb = cache_->k_buffer(), vb = cache_->v_buffer();
    const std::vector<int64_t> shape = {kb.shape.b, kb.shape.s, kb.shape.h, kb.shape.d};
    if (k_.data_ptr() != kb.data || v_.data_ptr() != vb.data || k_.sizes() != at::IntArrayRef(shape) ||
        v_.sizes() != at::IntArrayRef(shape) || !k_.is_contiguous() || !v_.is_contiguous())
      throw qvg::InvalidArgument(fmt::format(
          "the cache's k/v tensors must keep their storage and shape {} (they are the cache's buffers), got k shape "
          "{} after an in-place resize or set_()",
          shape_str(shape), shape_str(k_)));
  }

  qvg::CacheOptions opt_;
  at::Tensor k_, v_;
  at::Tensor grown_k_, grown_v_;  // buffers handed to the cache by the growth hook during a call
  std::unique_ptr<qvg::DenseCausalCache> cache_;
  std::mutex mu_;
};

// ---- the packed cache ---------------------------------------------------------------
// Every packed cache of the process assembles its copied views in one shared
// ViewScratch: the binding copies each view out into a fresh tensor right away,
// so the scratch only has to outlive one call, and a model with L layers holds
// one window of view memory instead of L. A process-wide mutex serialises the
// update + copy-out of packed caches that share it.
std::shared_ptr<qvg::ViewScratch> shared_view_scratch() {
  static const auto s = std::make_shared<qvg::ViewScratch>();
  return s;
}
std::mutex& shared_view_mutex() {
  static std::mutex m;
  return m;
}

class PackedCache {
 public:
  PackedCache(int64_t batch, int64_t cache_size, int64_t heads, int64_t head_dim, const std::string& dtype,
              int64_t sink_tokens, std::optional<int64_t> attention_window_size, bool allow_growth,
              const qvg::QuantArgs& quant) {
    qvg::CacheOptions o;
    o.batch = batch;
    o.cache_size = cache_size;
    o.heads = heads;
    o.head_dim = head_dim;
    o.dtype = qvg::parse_dtype(dtype);
    o.sink_tokens = sink_tokens;
    o.attention_window_size = attention_window_size;
    o.allow_growth = allow_growth;
    o.view_scratch = shared_view_scratch();
    cache_ = std::make_shared<qvg::PackedCausalCache>(o, quant);
  }

  py::tuple update(const at::Tensor& key, const at::Tensor& value, int64_t c, std::optional<int64_t> hs,
                   std::optional<int64_t> rw) {
    BusyGuard busy(mu_);
    const Input ki = as_input(key, "key"), vi = as_input(value, "value");
    detach_lent_views();
    qvg::KVView kv;
    std::unique_lock<std::mutex> shared_lock;
    {
      py::gil_scoped_release nogil;
      shared_lock = std::unique_lock<std::mutex>(shared_view_mutex());
      kv = cache_->update(ki.view, vi.view, c, hs, rw);
    }
    at::Tensor ok, ov;
    if (kv.zero_copy) {
      ok = lend(kv.k);
      ov = lend(kv.v);
    } else {
      ok = copy_out(kv.k);
      ov = copy_out(kv.v);
    }
    return view_tuple(std::move(ok), std::move(ov), kv);
  }

  void reset_indices() {
    BusyGuard busy(mu_);
    detach_lent_views();
    std::lock_guard<std::mutex> shared_lock(shared_view_mutex());  // reset releases the shared scratch
    cache_->reset_indices();
  }

  const qvg::PackedCausalCache& cache() const { return *cache_; }

  /// (g0, g1, is_sink, packed, current, chunks, k_ptr, v_ptr, nbytes) per segment;
  /// k_ptr/v_ptr are the raw buffers' addresses (0 for packed segments).
  py::list segments() const {
    py::list out;
    for (size_t i = 0; i < cache_->num_segments(); ++i) {
      const auto s = cache_->segment(i);
      out.append(py::make_tuple(s.g0, s.g1, s.is_sink, s.packed, s.current, s.chunks,
                                reinterpret_cast<uintptr_t>(s.packed ? nullptr : s.k_raw.data),
                                reinterpret_cast<uintptr_t>(s.packed ? nullptr : s.v_raw.data), s.nbytes));
    }
    return out;
  }

 private:
  /// A torch tensor over cache memory; remembered so that it can be detached
  /// before the memory may go away.
  at::Tensor lend(const qvg::StridedView& v) {
    std::shared_ptr<qvg::PackedCausalCache> keep = cache_;
    at::Tensor t = at::from_blob(
        const_cast<void*>(v.data), sizes_of(v), strides_of(v), [keep](void*) {}, options_of(v));
    lent_.push_back(t.storage().getWeakStorageImpl());
    return t;
  }

  void detach_lent_views() {
    for (auto& w : lent_) {
      c10::intrusive_ptr<c10::StorageImpl> s = w.lock();
      if (!s) continue;
      const size_t n = s->nbytes();
      at::DataPtr copy = c10::GetCPUAllocator()->allocate(n);
      if (n) std::memcpy(copy.get(), s->data(), n);
      s->set_data_ptr(std::move(copy));  // the old DataPtr (and its hold on the cache) is released here
    }
    lent_.clear();
  }

  std::shared_ptr<qvg::PackedCausalCache> cache_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> lent_;
  std::mutex mu_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "qvg C++ caches over torch tensors (binding layer of qvg.torch; use qvg.torch instead)";
  m.attr("__version__") = qvg::kVersion;  // the library's version (project(VERSION))

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qvg::Error& e) {
      switch (e.kind()) {
        case qvg::ErrorKind::InvalidArgument:
        case qvg::ErrorKind::CorruptData: PyErr_SetString(PyExc_ValueError, e.what()); return;
        case qvg::ErrorKind::Unsupported: PyErr_SetString(PyExc_NotImplementedError, e.what()); return;
        case qvg::ErrorKind::OutOfRange:
        case qvg::ErrorKind::Device: PyErr_SetString(PyExc_RuntimeError, e.what()); return;
      }
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<qvg::QuantArgs>(m, "QuantArgs")
      .def(py::init(&make_quant_args), py::arg("bits"), py::arg("centroids"), py::arg("block_size"),
           py::arg("stages"), py::arg("kmeans_iters"), py::arg("asymmetric"), py::arg("keep_recent_chunks"),
           py::arg("sink"), py::arg("sink_span"), py::arg("sink_keep_chunks"), py::arg("span_chunks"),
           py::arg("scaling"), py::arg("scale_dtype"), py::arg("init"), py::arg("seed"), py::arg("threads") = 0)
      .def("validate", &qvg::QuantArgs::validate)
      .def("validate_for_head_dim", &qvg::QuantArgs::validate_for_head_dim)
      .def("describe", &qvg::QuantArgs::describe)
      .def("as_dict", &quant_args_dict)
      .def_property_readonly("enabled", &qvg::QuantArgs::enabled);

  m.def(
      "quant_args_from_flags",
      [](const std::map<std::string, std::string>& flags) { return quant_args_dict(qvg::QuantArgs::from_flags(flags)); },
      "The engine's flat kv_cache_quant* flags (strings) -> validated fields (spec 2).");

  py::class_<qvg::DenseCausalCache::DebugState>(m, "DenseDebugState")
      .def("__eq__", [](const qvg::DenseCausalCache::DebugState& a, const qvg::DenseCausalCache::DebugState& b) {
        return a == b;
      });
  py::class_<qvg::PackedCausalCache::DebugState>(m, "PackedDebugState")
      .def("__eq__", [](const qvg::PackedCausalCache::DebugState& a, const qvg::PackedCausalCache::DebugState& b) {
        return a == b;
      });

  py::class_<DenseCache>(m, "DenseCache")
      .def(py::init<const at::Tensor&, const at::Tensor&, int64_t, std::optional<int64_t>, bool>(), py::arg("k"),
           py::arg("v"), py::arg("sink_tokens"), py::arg("attention_window_size"), py::arg("allow_growth"))
      .def("update", &DenseCache::update)
      .def("reset_indices", &DenseCache::reset_indices)
      .def("set_indices", &DenseCache::set_indices)
      .def_property_readonly("k", &DenseCache::k)
      .def_property_readonly("v", &DenseCache::v)
      .def_property_readonly("global_end", [](const DenseCache& d) { return d.cache().global_end(); })
      .def_property_readonly("local_end", [](const DenseCache& d) { return d.cache().local_end(); })
      .def_property_readonly("cache_size", [](const DenseCache& d) { return d.cache().cache_size(); })
      .def_property_readonly("attention_window_size",
                             [](const DenseCache& d) { return d.cache().attention_window_size(); })
      .def_property_readonly("sink_tokens", [](const DenseCache& d) { return d.cache().sink_tokens(); })
      .def_property_readonly("num_heads", [](const DenseCache& d) { return d.cache().num_heads(); })
      .def_property_readonly("allow_growth", [](const DenseCache& d) { return d.cache().allow_growth(); })
      .def("can_direct_current_attention",
           [](const DenseCache& d, int64_t n) { return d.cache().can_direct_current_attention(n); })
      .def("resident_nbytes", [](const DenseCache& d) { return d.cache().resident_nbytes(); })
      .def("peak_transient_nbytes", [](const DenseCache& d) { return d.cache().peak_transient_nbytes(); })
      .def("debug_state", [](const DenseCache& d) { return d.cache().debug_state(); });

  py::class_<PackedCache>(m, "PackedCache")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, const std::string&, int64_t, std::optional<int64_t>, bool,
                    const qvg::QuantArgs&>(),
           py::arg("batch"), py::arg("cache_size"), py::arg("heads"), py::arg("head_dim"), py::arg("dtype"),
           py::arg("sink_tokens"), py::arg("attention_window_size"), py::arg("allow_growth"), py::arg("quant"))
      .def("update", &PackedCache::update)
      .def("reset_indices", &PackedCache::reset_indices)
      .def("segments", &PackedCache::segments)
      .def_property_readonly("global_end", [](const PackedCache& p) { return p.cache().global_end(); })
      .def_property_readonly("local_end", [](const PackedCache& p) { return p.cache().local_end(); })
      .def_property_readonly("chunk_tokens", [](const PackedCache& p) { return p.cache().chunk_tokens(); })
      .def("can_direct_current_attention",
           [](const PackedCache& p, int64_t n) { return p.cache().can_direct_current_attention(n); })
      .def("resident_nbytes", [](const PackedCache& p) { return p.cache().resident_nbytes(); })
      .def("peak_transient_nbytes", [](const PackedCache& p) { return p.cache().peak_transient_nbytes(); })
      .def("warm_state_nbytes", [](const PackedCache& p) { return p.cache().warm_state_nbytes(); })
      .def("debug_state", [](const PackedCache& p) { return p.cache().debug_state(); });
}
