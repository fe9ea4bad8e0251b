// python/src/common.h — what the CPU (bindings.cpp) and CUDA (cuda_caches.cpp)
// parts of qvg._C share: dtype and device rules, input conversion, the view tuple,
// the one-caller guard. Binding code only: no cache logic.
#pragma once

// Only the tensor type and the three factories used (ATen/ATen.h would parse every op).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "qvg/cache.h"
#include "qvg/config.h"
#include "qvg/error.h"
#include "qvg/tensor.h"

namespace qvg_py {

namespace py = pybind11;

/// True when this build has the CUDA path (device caches).
inline constexpr bool kHasCuda = QVG_TORCH_CUDA != 0;

// ---- dtypes ---------------------------------------------------------------------
inline std::optional<qvg::DType> to_qvg_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return qvg::DType::F32;
    case at::kBFloat16: return qvg::DType::BF16;
    case at::kHalf: return qvg::DType::F16;
    default: return std::nullopt;
  }
}

inline at::ScalarType to_torch_dtype(qvg::DType t) {
  switch (t) {
    case qvg::DType::F32: return at::kFloat;
    case qvg::DType::BF16: return at::kBFloat16;
    case qvg::DType::F16: return at::kHalf;
  }
  return at::kFloat;
}

inline std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kDouble: return "torch.float64";
    default: return std::string("torch.") + c10::toString(t);
  }
}

inline std::string shape_str(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
inline std::string shape_str(const at::Tensor& t) {
  return shape_str(t.sizes());
}

// ---- devices (spec 5) -------------------------------------------------------------
/// Throws Unsupported (NotImplementedError) unless `what` is on a device this build
/// supports: the CPU, and CUDA devices with the CUDA path.
inline void require_supported(const at::Tensor& t, const char* what) {
  const at::Device d = t.device();
  if (d.is_cpu() || (kHasCuda && d.is_cuda())) return;
  if (!kHasCuda)
    throw qvg::Unsupported(
        fmt::format("{} must be a CPU tensor (qvg.torch runs on the CPU in this build), got device {}", what, d.str()));
  throw qvg::Unsupported(fmt::format(
      "{} must be a CPU or CUDA tensor (the devices of this build of qvg.torch), got device {}", what, d.str()));
}

/// Spec 5's device rules for a tensor `what` handed to a cache on `cache_device`:
/// a device this build does not support is Unsupported (NotImplementedError); a
/// supported device other than the cache's is InvalidArgument (ValueError) naming both.
inline void require_device(const at::Tensor& t, const char* what, const at::Device& cache_device) {
  const at::Device d = t.device();
  if (d == cache_device) return;
  require_supported(t, what);
  throw qvg::InvalidArgument(
      fmt::format("{} must be on the cache's device {}, got {}", what, cache_device.str(), d.str()));
}

// ---- inputs -----------------------------------------------------------------------
/// A key or value tensor seen as a qvg view; `owner` keeps a contiguous copy alive
/// when one had to be made.
struct Input {
  at::Tensor owner;
  qvg::ConstTensorView view;
};

inline qvg::DType require_dtype(const at::Tensor& t, const char* what) {
  const auto dt = to_qvg_dtype(t.scalar_type());
  if (!dt)
    throw qvg::InvalidArgument(
        fmt::format("{} dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {}", what,
                    torch_dtype_name(t.scalar_type())));
  return *dt;
}

/// What can be checked of a key/value tensor `what` of an update on a cache on
/// `device` without reading its elements: defined, strided, the device, 4-D, a dtype
/// qvg supports (returned).
inline qvg::DType check_input(const at::Tensor& t, const char* what, const at::Device& device) {
  if (!t.defined()) throw qvg::InvalidArgument(fmt::format("{} must be a tensor, got None", what));
  if (t.layout() != at::kStrided)
    throw qvg::InvalidArgument(
        fmt::format("{} must be a dense (strided) tensor, got layout {}", what, c10::str(t.layout())));
  require_device(t, what, device);
  if (t.dim() != 4)
    throw qvg::InvalidArgument(fmt::format("{} must be a 4-D tensor [B, n, h, D], got shape {}", what, shape_str(t)));
  return require_dtype(t, what);
}

/// key/value (which passed check_input, of dtype `dt`) as a qvg view: read in place
/// when contiguous [B, n, h, D], else a contiguous copy (made by torch on the current
/// stream): memory proportional to the tensor's shape, whatever its storage (a
/// stride-0 expanded tensor), so the call's shapes must have been checked first
/// (check_call_shapes: a call refused by its shapes takes no memory first).
inline Input to_input(const at::Tensor& t, qvg::DType dt) {
  Input in;
  // A tensor with torch's negative or conjugate bit is a lazy view: its values are
  // not its raw storage, so it is resolved first.
  const at::Tensor r = (t.is_neg() || t.is_conj()) ? t.resolve_conj().resolve_neg() : t;
  in.owner = r.is_contiguous() ? r : r.contiguous();
  in.view.data = in.owner.numel() > 0 ? in.owner.data_ptr() : nullptr;
  in.view.dtype = dt;
  in.view.shape = {in.owner.size(0), in.owner.size(1), in.owner.size(2), in.owner.size(3)};
  return in;
}

/// A tensor's sizes as qvg's [B, S, H, D] (REQUIRES a 4-D tensor).
inline qvg::Shape4 shape4(const at::Tensor& t) {
  return {t.size(0), t.size(1), t.size(2), t.size(3)};
}

/// An update's key and value as qvg views, for a cache of `options` holding
/// `cache_size` tokens: everything update() would refuse by the arguments' metadata
/// (check_input, then qvg::check_update_shapes: shapes, dtypes, head slice, chunk
/// start, recent_window_tokens, the chunk's length) is refused before either tensor
/// is copied (spec 5.1: an expanded key of 16M tokens over 8 bytes of storage is
/// refused taking no memory).
inline std::pair<Input, Input> call_inputs(const at::Tensor& key, const at::Tensor& value, const at::Device& device,
                                           const qvg::CacheOptions& options, int64_t cache_size, int64_t c,
                                           std::optional<int64_t> hs, std::optional<int64_t> rw) {
  const qvg::DType kd = check_input(key, "key", device), vd = check_input(value, "value", device);
  qvg::check_update_shapes(options, cache_size, kd, shape4(key), vd, shape4(value), c, hs, rw);
  return {to_input(key, kd), to_input(value, vd)};
}

/// Checks a dense cache buffer handed in by the caller ([B, cache_size, H, D]) on a
/// supported device; returns its dtype.
inline qvg::DType check_buffer(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw qvg::InvalidArgument(fmt::format("{} must be a tensor, got None", what));
  if (t.layout() != at::kStrided)
    throw qvg::InvalidArgument(
        fmt::format("{} must be a dense (strided) tensor, got layout {}", what, c10::str(t.layout())));
  require_supported(t, what);
  if (t.dim() != 4)
    throw qvg::InvalidArgument(
        fmt::format("{} must be a 4-D tensor [B, cache_size, H, D], got shape {}", what, shape_str(t)));
  if (t.is_neg() || t.is_conj())
    throw qvg::InvalidArgument(
        fmt::format("{} must not carry torch's negative or conjugate bit (the cache writes its raw storage), call "
                    "resolve_neg()/resolve_conj() first",
                    what));
  const qvg::DType dt = require_dtype(t, what);
  if (!t.is_contiguous())
    throw qvg::InvalidArgument(fmt::format(
        "{} must be contiguous (the cache writes into it in place), got strides that are not [B, cache_size, H, D] "
        "row-major for shape {}",
        what, shape_str(t)));
  return dt;
}

// ---- outputs ----------------------------------------------------------------------
inline std::vector<int64_t> sizes_of(const qvg::StridedView& v) {
  return {v.shape.b, v.shape.s, v.shape.h, v.shape.d};
}
inline std::vector<int64_t> strides_of(const qvg::StridedView& v) {
  return {v.stride_b, v.stride_t, v.stride_h, 1};
}

/// A torch view of `buffer` (one of the dense cache's k/v tensors) covering `v`.
inline at::Tensor alias_of(const at::Tensor& buffer, const qvg::StridedView& v) {
  const auto esz = int64_t(qvg::dtype_size(v.dtype));
  const auto off = (static_cast<const char*>(v.data) - static_cast<const char*>(buffer.data_ptr())) / esz;
  return buffer.as_strided(sizes_of(v), strides_of(v), buffer.storage_offset() + off);
}

/// What an update returns to qvg.torch (qvg._C.View): the view's tensors and cursors
/// by name, as spec 3.1's CausalAttentionKVView holds them.
struct ViewOut {
  at::Tensor k, v;
  int64_t local_start_index = 0, local_end_index = 0, visible_local_end = 0, visible_global_end = 0;
  bool zero_copy = false;
};

inline ViewOut view_out(at::Tensor k, at::Tensor v, const qvg::KVView& kv) {
  return {std::move(k),         std::move(v),          kv.local_start_index, kv.local_end_index,
          kv.visible_local_end, kv.visible_global_end, kv.zero_copy};
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

/// Torch tensors over a cache's memory (its views), remembered so that each one
/// still alive gets a private copy of its bytes before that memory may change or go
/// away (detach): a lent view never dangles, it just stops following the cache.
class Lender {
 public:
  /// A tensor over `v` (cache memory on options.device()); its deleter holds `keep`
  /// (the cache), so dropping the Python cache first is safe.
  template <class Keep>
  at::Tensor lend(const qvg::StridedView& v, const at::TensorOptions& options, Keep keep) {
    at::Tensor t = at::from_blob(
        const_cast<void*>(v.data), sizes_of(v), strides_of(v), [keep](void*) {}, options);
    lent_.push_back(t.storage().getWeakStorageImpl());
    return t;
  }
  /// For every lent tensor still alive: `copy(nbytes, src)` returns a DataPtr holding
  /// a copy of its bytes, which replaces its memory (and releases its hold on the cache).
  template <class Copy>
  void detach(Copy&& copy) {
    for (auto& w : lent_) {
      c10::intrusive_ptr<c10::StorageImpl> s = w.lock();
      if (!s) continue;
      s->set_data_ptr(copy(s->nbytes(), s->data()));  // the old DataPtr is released here
    }
    lent_.clear();
  }

 private:
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> lent_;
};

/// The segments of a packed cache (CPU or CUDA), in global order, for tests and
/// diagnostics: a dict per segment (g0, g1, is_sink, packed, current, chunks, k_ptr,
/// v_ptr: the raw buffers' addresses, device addresses for CUDA, 0 when packed; nbytes).
template <class PackedCache>
py::list segment_list(const PackedCache& c) {
  py::list out;
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto s = c.segment(i);
    out.append(py::dict(py::arg("g0") = s.g0, py::arg("g1") = s.g1, py::arg("is_sink") = s.is_sink,
                        py::arg("packed") = s.packed, py::arg("current") = s.current, py::arg("chunks") = s.chunks,
                        py::arg("k_ptr") = reinterpret_cast<uintptr_t>(s.packed ? nullptr : s.k_raw.data),
                        py::arg("v_ptr") = reinterpret_cast<uintptr_t>(s.packed ? nullptr : s.v_raw.data),
                        py::arg("nbytes") = s.nbytes));
  }
  return out;
}

/// Registers qvg._C.View (read-only fields).
inline void register_view_types(py::module_& m) {
  py::class_<ViewOut>(m, "View")
      .def_readonly("k", &ViewOut::k)
      .def_readonly("v", &ViewOut::v)
      .def_readonly("local_start_index", &ViewOut::local_start_index)
      .def_readonly("local_end_index", &ViewOut::local_end_index)
      .def_readonly("visible_local_end", &ViewOut::visible_local_end)
      .def_readonly("visible_global_end", &ViewOut::visible_global_end)
      .def_readonly("zero_copy", &ViewOut::zero_copy);
}

/// The options every cache is built from (the packed caches' constructor arguments).
inline qvg::CacheOptions cache_options(int64_t batch, int64_t cache_size, int64_t heads, int64_t head_dim,
                                       const std::string& dtype, int64_t sink_tokens,
                                       std::optional<int64_t> attention_window_size, bool allow_growth,
                                       int64_t head_offset) {
  qvg::CacheOptions o;
  o.batch = batch;
  o.cache_size = cache_size;
  o.heads = heads;
  o.head_dim = head_dim;
  o.dtype = qvg::parse_dtype(dtype);
  o.sink_tokens = sink_tokens;
  o.attention_window_size = attention_window_size;
  o.allow_growth = allow_growth;
  o.head_offset = head_offset;
  return o;
}

/// The CUDA part of the module (cuda_caches.cpp): CudaDenseCache, CudaPackedCache.
void register_cuda(py::module_& m);

}  // namespace qvg_py
