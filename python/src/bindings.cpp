// qvg._C — the binding layer of the PyTorch extension (FlashInfer style: it only
// exports). The engine-compatible classes live in qvg/torch/; this file turns
// torch tensors into qvg views, calls the C++ caches (include/qvg/cache.h) and
// turns their views back into torch tensors. No cache logic lives here.
//
// Memory and lifetime rules (what qvg/torch/ documents to its users):
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
// RuntimeError, Device -> RuntimeError, with the C++ message unchanged; PyTorch's
// out-of-memory error (from its allocator) stays torch.OutOfMemoryError. A tensor
// on a device this build does not support is Unsupported (NotImplementedError); one
// on a supported device other than the cache's is InvalidArgument (ValueError).
//
// CUDA tensors: with the CUDA path (QVG_TORCH_CUDA, python/cmake/QvgTorch.cmake)
// cuda_caches.cpp adds CudaDenseCache and CudaPackedCache (register_cuda).
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "common.h"
#include "dense_binding.h"
#include "packed_binding.h"
#include "qvg/cache.h"
#include "qvg/code_format.h"
#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/detail/test_access.h"
#include "qvg/encoding_layout.h"
#include "qvg/error.h"
#include "qvg/eval/workload.h"
#include "qvg/settings.h"
#include "qvg/snapshot.h"
#include "qvg/tensor.h"
#include "qvg/version.h"

namespace py = pybind11;
using namespace qvg_py;

namespace {

const at::Device kCpu(at::kCPU);

// ---- outputs ----------------------------------------------------------------------
at::TensorOptions options_of(const qvg::StridedView& v) {
  return at::TensorOptions().dtype(to_torch_dtype(v.dtype)).device(at::kCPU);
}

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

// ---- configuration ------------------------------------------------------------------
// QuantArgs <-> a dict of its fields, walking the settings table (qvg/settings.h): the
// shared settings by name with Python values (None, int, bool, float, str), the
// per-role ones as k_config / v_config text ("bits=4,asymmetric=true"), threads.

/// A Python value as the setting's value (types are checked by qvg.torch first; a
/// wrong one here is InvalidArgument naming the field).
qvg::SettingValue value_of(const qvg::Setting& s, const py::handle& o) {
  const std::string what(s.name);
  try {
    if (o.is_none()) {
      qvg::check_setting(s, {}, what);
      return {};
    }
    switch (s.kind) {
      case qvg::SettingKind::Bits:
      case qvg::SettingKind::Int:
      case qvg::SettingKind::Width:
        if (!py::isinstance<py::int_>(o) || py::isinstance<py::bool_>(o)) break;
        return o.cast<int64_t>();
      case qvg::SettingKind::Bool:
        if (!py::isinstance<py::bool_>(o)) break;
        return o.cast<bool>();
      case qvg::SettingKind::Name:
        if (!py::isinstance<py::str>(o)) break;
        return qvg::parse_setting(s, o.cast<std::string>(), what);
      case qvg::SettingKind::Real:
        if (py::isinstance<py::bool_>(o) || !(py::isinstance<py::float_>(o) || py::isinstance<py::int_>(o))) break;
        return o.cast<double>();
      case qvg::SettingKind::Seed:
        if (!py::isinstance<py::int_>(o) || py::isinstance<py::bool_>(o)) break;
        return o.cast<uint64_t>();
    }
  } catch (const py::cast_error&) {
  }
  throw qvg::InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, py::repr(o).cast<std::string>()));
}

qvg::QuantArgs quant_args_from_dict(const py::dict& d) {
  qvg::QuantArgs q;
  for (const auto& [key, value] : d) {
    const std::string k = py::str(key);
    if (k == "threads") {
      q.codec.threads = value.cast<int>();
    } else if (k == "k_config" || k == "v_config") {
      (k == "k_config" ? q.k : q.v) = qvg::parse_role_codec(value.cast<std::string>(), k);
    } else if (const qvg::Setting* s = qvg::find_setting(k); s && !s->role) {
      s->set(q, value_of(*s, value));
    } else {
      throw qvg::InvalidArgument(fmt::format("unknown quantization setting '{}'", k));
    }
  }
  return q;
}

/// A RoleCodec as parse_role_codec's "field=value,..." text ("" when empty).
std::string role_spec(const qvg::QuantArgs& q, std::string_view prefix) {
  std::string o;
  for (const qvg::Setting& s : qvg::quant_settings()) {
    if (!s.role || !s.name.starts_with(prefix)) continue;
    const qvg::SettingValue v = s.get(q);
    if (std::holds_alternative<std::monostate>(v)) continue;
    // The field as k_config names it: the flag suffix without "_k_" / "_v_".
    o += fmt::format("{}{}={}", o.empty() ? "" : ",", s.flag.substr(3), qvg::setting_text(v));
  }
  return o;
}

py::object py_value(const qvg::SettingValue& v) {
  struct Py {
    py::object operator()(std::monostate) const { return py::none(); }
    py::object operator()(int64_t x) const { return py::int_(x); }
    py::object operator()(uint64_t x) const { return py::int_(x); }
    py::object operator()(bool b) const { return py::bool_(b); }
    py::object operator()(double x) const { return py::float_(x); }
    py::object operator()(const std::string& x) const { return py::str(x); }
  };
  return std::visit(Py{}, v);
}

py::dict quant_args_dict(const qvg::QuantArgs& q) {
  py::dict d;
  for (const qvg::Setting& s : qvg::quant_settings())
    if (!s.role) d[py::str(std::string(s.name))] = py_value(s.get(q));
  d["k_config"] = role_spec(q, "k_");
  d["v_config"] = role_spec(q, "v_");
  return d;
}

/// What a packed cache's snapshot (a path, or its bytes when from_bytes) says it holds,
/// read from its header, table and config section only (qvg::inspect_snapshot without
/// the checksums of the payload: a load verifies those): (the constructor's options as
/// a dict: batch_size, cache_size, num_heads, head_dim, dtype "f32"|"bf16"|"f16",
/// sink_tokens, attention_window_size (None: the cache size), allow_growth, head_offset;
/// the settings as QuantArgs.as_dict gives them). ValueError for a dense cache's
/// snapshot, an unreadable config, or a file that is not a snapshot.
py::tuple packed_snapshot_settings(const std::string& source, bool from_bytes) {
  const std::span<const uint8_t> bytes{reinterpret_cast<const uint8_t*>(source.data()), source.size()};
  // A snapshot this cannot read, or of a dense cache: the load's own error (one message
  // for every way of loading, naming the section or the kind).
  const auto load_for_its_error = [&] {
    py::gil_scoped_release nogil;
    if (from_bytes)
      (void)qvg::PackedCausalCache::from_snapshot_bytes(bytes);
    else
      (void)qvg::PackedCausalCache::load(source);
  };
  qvg::SnapshotInfo info;
  try {
    py::gil_scoped_release nogil;
    info = from_bytes ? qvg::inspect_snapshot_bytes(bytes, false) : qvg::inspect_snapshot(source, false);
  } catch (const qvg::Error&) {
    load_for_its_error();
    throw;
  }
  if (info.config.empty() || info.cache != "packed") {
    load_for_its_error();
    throw qvg::CorruptData(fmt::format("snapshot: its config is unreadable or of a {} cache, not a packed one",
                                       info.cache.empty() ? "unknown" : info.cache));
  }
  static const std::map<std::string, std::string> kOptions = {{"batch", "batch_size"},
                                                              {"cache_size", "cache_size"},
                                                              {"num_heads", "num_heads"},
                                                              {"head_dim", "head_dim"},
                                                              {"dtype", "dtype"},
                                                              {"sink_tokens", "sink_tokens"},
                                                              {"allow_growth", "allow_growth"},
                                                              {"head_offset", "head_offset"},
                                                              {"attention_window_size", "attention_window_size"}};
  py::dict options;
  options["head_offset"] = 0;  // files before the entry existed: a whole cache
  qvg::QuantArgs q;
  for (const auto& [key, text] : info.config) {
    if (const auto it = kOptions.find(key); it != kOptions.end()) {
      if (key == "dtype")
        options[py::str(it->second)] = text;
      else if (key == "allow_growth")
        options[py::str(it->second)] = text == "true";
      else if (text == "none")
        options[py::str(it->second)] = py::none();
      else
        options[py::str(it->second)] = std::stoll(text);
    } else if (const qvg::Setting* s = qvg::find_setting(key); s != nullptr && text != "none" && !text.empty()) {
      // "none" / "": an unset value (bits with quantization off, a role without its own): the default
      s->set(q, qvg::parse_setting(*s, text, fmt::format("snapshot config entry '{}'", key)));
    }
  }
  return py::make_tuple(options, quant_args_dict(q));
}

/// The table for qvg.torch: (name, flag suffix, kind, per-role, default, allowed) per setting.
py::list quant_settings_list() {
  static const char* const kinds[] = {"bits", "int", "width", "bool", "name", "real", "seed"};
  const qvg::QuantArgs d;
  py::list out;
  for (const qvg::Setting& s : qvg::quant_settings())
    out.append(py::make_tuple(std::string(s.name), std::string(s.flag), kinds[int(s.kind)], s.role, py_value(s.get(d)),
                              std::string(s.allowed)));
  return out;
}

// ---- the dense cache ----------------------------------------------------------------
/// DenseBinding's CPU backend: copied (two-range) views are copied once more into a
/// fresh tensor owned by the caller (the scratch is reused by the next call).
struct CpuDense {
  using Cache = qvg::DenseCausalCache;
  struct Call {
    explicit Call(const at::Device&) {}
  };
  std::shared_ptr<Cache> make(const qvg::CacheOptions& o, Cache::ExternalStorage s, Cache::GrowStorage g,
                              const at::Device& device) {
    if (!device.is_cpu())
      throw qvg::InvalidArgument(
          fmt::format("k must be a CPU tensor for DenseCache (CUDA buffers: CudaDenseCache), "
                      "got device {}",
                      device.str()));
    return std::make_shared<Cache>(o, s, std::move(g));
  }
  qvg::KVView update(Cache& c, Call&, qvg::ConstTensorView k, qvg::ConstTensorView v, int64_t start,
                     std::optional<int64_t> hs, std::optional<int64_t> rw) {
    return c.update(k, v, start, hs, rw);
  }
  std::pair<at::Tensor, at::Tensor> copied_views(const qvg::KVView& kv, Call&, const std::shared_ptr<Cache>&) {
    return {copy_out(kv.k), copy_out(kv.v)};
  }
  void before_mutation(Call&) {}
  void retire(const at::Tensor&, Call&) {}  // host work is done when the call returns
  std::vector<uint8_t> snapshot_bytes(const Cache& c, Call&) { return c.snapshot_bytes(); }
  void save(const Cache& c, Call&, const std::string& path) { c.save(path); }
  std::shared_ptr<Cache> load(const std::string& data, bool from_bytes, const qvg::SnapshotExpectation& x,
                              Cache::GrowStorage storage, Call&) {
    return std::make_shared<Cache>(
        from_bytes ? Cache::from_snapshot_bytes({reinterpret_cast<const uint8_t*>(data.data()), data.size()}, x,
                                                std::move(storage))
                   : Cache::load(data, x, std::move(storage)));
  }
};
using DenseCache = DenseBinding<CpuDense>;

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

/// The shared view mutex, taken in the one lock order of the module (spec 5.1, "Threads":
/// calls on different caches never deadlock):
/// the mutex first, then the GIL. It is waited for with the GIL released (a thread
/// holding the mutex may need the GIL to finish: update copies its view out into torch
/// tensors), and the GIL is taken back once it is held. Constructed with the GIL held.
class SharedViewLock {
 public:
  SharedViewLock() {
    py::gil_scoped_release nogil;
    lock_ = std::unique_lock<std::mutex>(shared_view_mutex());
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

/// PackedBinding's CPU backend: a zero-copy view is lent (a torch tensor over the
/// current chunk's bytes, copied privately before they change); a copied view is
/// copied out of the shared scratch into a fresh tensor owned by the caller.
struct CpuPacked {
  using Cache = qvg::PackedCausalCache;
  struct Call {
    explicit Call(const at::Device&) {}
  };
  using ViewLock = SharedViewLock;
  Lender lender;

  at::Device resolve(const at::Device& device) {
    if (!device.is_cpu())
      throw qvg::InvalidArgument(
          fmt::format("device must be the CPU for PackedCache (CUDA: CudaPackedCache), got {}", device.str()));
    return device;
  }
  std::shared_ptr<Cache> make(const qvg::CacheOptions& o, const qvg::QuantArgs& quant, const at::Device&) {
    return std::make_shared<Cache>(o, quant);
  }
  void expect(qvg::SnapshotExpectation& x, const qvg::CacheOptions& o) { x.view_scratch = o.view_scratch; }
  qvg::KVView update(Cache& c, Call&, qvg::ConstTensorView k, qvg::ConstTensorView v, int64_t start,
                     std::optional<int64_t> hs, std::optional<int64_t> rw) {
    return c.update(k, v, start, hs, rw);
  }
  std::pair<at::Tensor, at::Tensor> view_tensors(const qvg::KVView& kv, Call&, const std::shared_ptr<Cache>& keep) {
    const auto one = [&](const qvg::StridedView& v) {
      return kv.zero_copy ? lender.lend(v, options_of(v), keep) : copy_out(v);
    };
    return {one(kv.k), one(kv.v)};
  }
  void before_mutation(Call&) {
    lender.detach([](size_t n, const void* src) {
      at::DataPtr copy = c10::GetCPUAllocator()->allocate(n);
      if (n) std::memcpy(copy.get(), src, n);
      return copy;
    });
  }
  void save(const Cache& c, Call&, const std::string& path) { c.save(path); }
  std::vector<uint8_t> snapshot_bytes(const Cache& c, Call&) { return c.snapshot_bytes(); }
  std::shared_ptr<Cache> load(const std::string& src, bool from_bytes, const qvg::SnapshotExpectation& x, Call&) {
    return std::make_shared<Cache>(
        from_bytes ? Cache::from_snapshot_bytes({reinterpret_cast<const uint8_t*>(src.data()), src.size()}, x)
                   : Cache::load(src, x));
  }
  std::shared_ptr<Cache> fork(Cache& c, Call&, const qvg::CacheOptions& o) {
    return std::make_shared<Cache>(c.fork(o.view_scratch));
  }
};
using PackedCache = PackedBinding<CpuPacked>;

// ---- the codec (qvg.torch.encode / decode and the reference interop) -------------

const char* dtype_text(qvg::DType t) {
  switch (t) {
    case qvg::DType::F32: return "f32";
    case qvg::DType::BF16: return "bf16";
    case qvg::DType::F16: return "f16";
  }
  return "f32";
}

qvg::DType parse_dtype_text(const std::string& s) {
  if (s == "f32") return qvg::DType::F32;
  if (s == "bf16") return qvg::DType::BF16;
  if (s == "f16") return qvg::DType::F16;
  throw qvg::InvalidArgument(fmt::format("dtype must be one of f32, bf16, f16, got '{}'", s));
}

py::dict layout_dict(const qvg::EncodingLayout& l) {
  py::dict d;
  d["dtype"] = dtype_text(l.dtype);
  d["shape"] = py::make_tuple(l.shape.b, l.shape.s, l.shape.h, l.shape.d);
  d["bits"] = l.bits;
  d["block_size"] = l.block_size;
  d["stages"] = l.stages;
  d["centroids"] = l.centroids;
  d["asymmetric"] = l.asymmetric;
  d["scale_dtype"] = l.scale_dtype == qvg::ScaleDType::FP8_E4M3 ? "fp8_e4m3" : "bf16";
  d["scaling"] = l.scaling == qvg::Scaling::Compat ? "compat" : "two_level";
  return d;
}

/// x [B, S, H, D] (CPU; bf16, f16 or f32) encoded with the codec parameters of
/// `quant` (bits required) -> (layout dict, {array name: raw bytes as a 1-D uint8 tensor}).
py::tuple encode_tensor(const at::Tensor& x, const qvg::QuantArgs& quant, int64_t head_offset) {
  if (!quant.enabled())
    throw qvg::InvalidArgument(
        fmt::format("encode needs quantization settings with bits {}, got bits None", qvg::known_code_widths()));
  // A call refused by its shapes takes no memory: what encode() refuses by shape is
  // refused before x is copied (an expanded or strided x is copied to contiguous memory
  // first).
  const qvg::DType dt = check_input(x, "x", at::Device(at::kCPU));
  if (quant.per_role())
    throw qvg::InvalidArgument(
        "encode encodes one tensor: per-role settings (k_config, v_config) do not apply; use the shared fields");
  qvg::CodecConfig cfg = quant.codec;
  const qvg::Shape4 sh = shape4(x);
  if (sh.b >= 1 && sh.s >= 1 && sh.h >= 1 && sh.d >= 1) {
    cfg.validate_for_head_dim(sh.d);
    if (sh.s > (int64_t(1) << 31) || sh.b * sh.h > (int64_t(1) << 31))
      throw qvg::InvalidArgument(fmt::format("x shape {} is too large (tokens and groups must be < 2^31)", sh.str()));
  }
  const Input in = to_input(x, dt);
  cfg.head_offset = head_offset;
  qvg::EncodedTensor enc;
  {
    py::gil_scoped_release release;
    enc = qvg::encode(in.view, cfg);
  }
  py::dict arrays;
  for (const qvg::ArrayDesc& a : enc.arrays()) {
    const auto bytes = enc.array(a);
    at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte));
    if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    arrays[py::str(a.name())] = t;
  }
  return py::make_tuple(layout_dict(enc.layout()), arrays);
}

/// The inverse: a layout dict and its arrays (raw bytes, 1-D uint8 CPU tensors, named
/// as encode returns them) -> the decoded [B, S, H, D] tensor. Checks every array's
/// presence and size and the values (validate, validate_values) before decoding.
at::Tensor decode_tensor(const py::dict& layout, const py::dict& arrays) {
  qvg::EncodingLayout l;
  try {
    l.dtype = parse_dtype_text(layout["dtype"].cast<std::string>());
    const auto shape = layout["shape"].cast<std::vector<int64_t>>();
    if (shape.size() != 4) throw qvg::InvalidArgument("layout shape must have 4 entries [B, S, H, D]");
    l.shape = {shape[0], shape[1], shape[2], shape[3]};
    l.bits = layout["bits"].cast<int>();
    l.block_size = layout["block_size"].cast<int>();
    l.stages = layout["stages"].cast<int>();
    l.centroids = layout["centroids"].cast<int>();
    l.asymmetric = layout["asymmetric"].cast<bool>();
    l.scale_dtype = qvg::parse_scale_dtype(layout["scale_dtype"].cast<std::string>());
    l.scaling = qvg::parse_scaling(layout["scaling"].cast<std::string>());
  } catch (const py::error_already_set& e) {
    throw qvg::InvalidArgument(fmt::format("bad encoding layout: {}", e.what()));
  } catch (const py::cast_error& e) {
    throw qvg::InvalidArgument(fmt::format("bad encoding layout: {}", e.what()));
  }
  l.check();
  // Every array's presence, type and size against the layout first, before anything
  // of the claimed size is allocated (spec 5.1, "Files": a layout claiming a huge shape
  // over small arrays is refused without growing the process).
  std::vector<at::Tensor> given;
  for (const qvg::ArrayDesc& a : l.arrays()) {
    const std::string name = a.name();
    if (!arrays.contains(name)) throw qvg::InvalidArgument(fmt::format("encoding array '{}' is missing", name));
    at::Tensor t;
    try {
      t = arrays[py::str(name)].cast<at::Tensor>();
    } catch (const py::cast_error&) {
      throw qvg::InvalidArgument(fmt::format("encoding array '{}' must be a 1-D uint8 CPU tensor of raw bytes", name));
    }
    if (t.scalar_type() != at::kByte || t.dim() != 1 || t.device().type() != at::kCPU || t.layout() != at::kStrided)
      throw qvg::InvalidArgument(fmt::format("encoding array '{}' must be a 1-D uint8 CPU tensor of raw bytes", name));
    if (static_cast<size_t>(t.numel()) != a.bytes())
      throw qvg::InvalidArgument(
          fmt::format("encoding array '{}' must hold {} bytes for this layout, got {}", name, a.bytes(), t.numel()));
    given.push_back(t.contiguous());
  }
  qvg::EncodedTensor enc = qvg::EncodedTensor::allocate(l);
  size_t i = 0;
  for (const qvg::ArrayDesc& a : l.arrays()) {
    auto dst = enc.array(a);
    const at::Tensor& c = given[i++];
    QVG_CHECK(static_cast<size_t>(c.numel()) == dst.size());
    if (!dst.empty()) std::memcpy(dst.data(), c.data_ptr(), dst.size());
  }
  enc.validate();
  enc.validate_values();
  at::Tensor out =
      at::empty({l.shape.b, l.shape.s, l.shape.h, l.shape.d}, at::TensorOptions().dtype(to_torch_dtype(l.dtype)));
  qvg::TensorView v{out.data_ptr(), l.dtype, l.shape};
  {
    py::gil_scoped_release release;
    qvg::decode(enc, v);
  }
  return out;
}

/// K and V ([1, n, H, D] bf16) of one chunk of one layer from the workload generator
/// (docs/workload.md): for codec comparisons (python/gpu/compat_check.py).
py::tuple workload_kv(const std::string& preset, int layer, int64_t chunk_index, uint64_t seed, double scale) {
  qvg::WorkloadOptions opt;
  opt.seed = seed;
  opt.scale = scale;
  opt.dtype = qvg::DType::BF16;
  qvg::LayerChunk lc;
  {
    py::gil_scoped_release release;
    const qvg::Workload w(qvg::find_model_preset(preset), opt);
    lc = w.generate(layer, chunk_index, qvg::GenerateParts{false, false});
  }
  auto to_torch = [](const qvg::Tensor& t) {
    const auto& sh = t.shape();
    at::Tensor out = at::empty({sh.b, sh.s, sh.h, sh.d}, at::TensorOptions().dtype(to_torch_dtype(t.dtype())));
    if (t.nbytes()) std::memcpy(out.data_ptr(), t.data(), t.nbytes());
    return out;
  };
  return py::make_tuple(to_torch(lc.k), to_torch(lc.v));
}

py::list workload_presets() {
  py::list out;
  for (const auto& p : qvg::model_presets()) out.append(p.name);
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "qvg C++ caches over torch tensors (binding layer of qvg.torch; use qvg.torch instead)";
  m.attr("__version__") = qvg::kVersion;  // the library's version (project(VERSION))
  m.attr("HAS_CUDA") = kHasCuda;          // the CUDA path (CudaDenseCache, CudaPackedCache) is compiled in

  // torch.OutOfMemoryError, looked up once (libtorch_python does not export its C handle).
  static PyObject* const torch_oom = py::object(py::module_::import("torch").attr("OutOfMemoryError")).release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::OutOfMemoryError& e) {
      // From PyTorch's caching allocator (the device caches' memory): the error
      // torch raises for it (the cache is unchanged).
      PyErr_SetString(torch_oom, e.what_without_backtrace());
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

  register_view_types(m);
  py::class_<qvg::QuantArgs>(m, "QuantArgs")
      .def(py::init(&quant_args_from_dict), py::arg("fields"),
           "From a dict of fields (names of the settings table, k_config/v_config, threads); not yet validated.")
      .def("validate", &qvg::QuantArgs::validate)
      .def("validate_for_head_dim", &qvg::QuantArgs::validate_for_head_dim)
      .def("describe", &qvg::QuantArgs::describe)
      .def("as_dict", &quant_args_dict)
      .def_property_readonly("enabled", &qvg::QuantArgs::enabled);

  m.def(
      "quant_args_from_flags",
      [](const std::map<std::string, std::string>& flags) {
        return quant_args_dict(qvg::QuantArgs::from_flags(flags));
      },
      "The engine's flat kv_cache_quant* flags (strings) -> validated fields (spec 2).");
  m.def("packed_snapshot_settings", &packed_snapshot_settings, py::arg("source"), py::arg("from_bytes"),
        "(options dict, settings dict) of the packed cache a snapshot holds, from its config section only.");
  m.def("quant_settings", &quant_settings_list,
        "The settings table (qvg/settings.h): (name, flag suffix, kind, per_role, default, allowed) per setting.");
  m.def(
      "engine_quant_fields",
      [] {
        std::vector<std::string> out;
        for (const std::string_view f : qvg::engine_quant_fields()) out.emplace_back(f);
        return out;
      },
      "The settings that are also fields of the engine's (SGLang's) QVGKVQuantArgs.");
  m.def(
      "engine_code_widths",
      [] {
        std::vector<int> out;
        for (const qvg::CodeFormat& f : qvg::kCodeFormats)
          if (f.engine) out.push_back(f.bits);
        return out;
      },
      "The residual code widths of the engine's own kv_cache_quant (qvg/code_format.h): [2, 4].");

  py::class_<qvg::detail::DenseDebugState>(m, "DenseDebugState")
      .def("__eq__",
           [](const qvg::detail::DenseDebugState& a, const qvg::detail::DenseDebugState& b) { return a == b; });
  py::class_<qvg::detail::PackedDebugState>(m, "PackedDebugState")
      .def("__eq__",
           [](const qvg::detail::PackedDebugState& a, const qvg::detail::PackedDebugState& b) { return a == b; });

  def_dense<CpuDense>(m, "DenseCache", [](auto& c) {
    using D = DenseCache;
    c.def("peak_transient_nbytes", [](D& d) {
       return d.read([](const D& x) { return x.cache().peak_transient_nbytes(); });
     }).def("debug_state", [](D& d) { return d.read([](const D& x) { return qvg::detail::debug_state(x.cache()); }); });
  });

  def_packed<CpuPacked>(m, "PackedCache", [](auto& c) {
    using P = PackedCache;
    c.def(py::init([](int64_t batch, int64_t cache_size, int64_t heads, int64_t head_dim, const std::string& dtype,
                      int64_t sink_tokens, std::optional<int64_t> attention_window_size, bool allow_growth,
                      const qvg::QuantArgs& quant, int64_t head_offset) {
            qvg::CacheOptions o = cache_options(batch, cache_size, heads, head_dim, dtype, sink_tokens,
                                                attention_window_size, allow_growth, head_offset);
            o.view_scratch = shared_view_scratch();
            return std::make_unique<P>(o, quant, at::Device(at::kCPU));
          }),
          py::arg("batch"), py::arg("cache_size"), py::arg("heads"), py::arg("head_dim"), py::arg("dtype"),
          py::arg("sink_tokens"), py::arg("attention_window_size"), py::arg("allow_growth"), py::arg("quant"),
          py::arg("head_offset") = 0)
        .def("peak_transient_nbytes",
             [](P& p) { return p.read([](const auto& x) { return x.peak_transient_nbytes(); }); })
        .def("debug_state", [](P& p) { return p.read([](const auto& x) { return qvg::detail::debug_state(x); }); });
  });

  m.def("encode", &encode_tensor, py::arg("x"), py::arg("quant"), py::arg("head_offset") = 0,
        "x [B, S, H, D] (CPU) -> (layout dict, {array name: raw bytes, 1-D uint8}) (spec 1.5).");
  m.def("decode", &decode_tensor, py::arg("layout"), py::arg("arrays"),
        "(layout dict, arrays) as encode returns them -> the decoded [B, S, H, D] tensor (spec 1.3).");

  m.def("workload_kv", &workload_kv, py::arg("preset"), py::arg("layer"), py::arg("chunk_index"), py::arg("seed"),
        py::arg("scale") = 1.0, "(k, v) [1, n, H, D] bf16 of one chunk of one layer from the workload generator.");
  m.def("workload_presets", &workload_presets, "The workload generator's preset names.");

  register_cuda(m);  // a no-op without the CUDA path
}

#if !QVG_TORCH_CUDA
void qvg_py::register_cuda(py::module_&) {}  // CPU-only build: no device caches
#endif
