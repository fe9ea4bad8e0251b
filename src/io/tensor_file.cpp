// K/V tensors from and to `.npy` / `.safetensors` files, for the CLI.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/file_impl.h"
#include "io/io_util.h"
#include "io/safetensors_impl.h"
#include "qvg/error.h"
#include "qvg/io.h"

namespace qvg {

namespace {

using io_detail::printable;

enum class FileKind { Npy, Safetensors };

FileKind kind_of(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".npy") return FileKind::Npy;
  if (ext == ".safetensors") return FileKind::Safetensors;
  throw InvalidArgument(
      fmt::format("tensor file '{}' has extension '{}'; allowed: .npy, .safetensors", detail::path_text(path), ext));
}

Shape4 shape4_of(const std::vector<int64_t>& s, const std::filesystem::path& path) {
  if (s.size() == 3) return {1, s[0], s[1], s[2]};
  if (s.size() == 4) return {s[0], s[1], s[2], s[3]};
  std::string dims;
  for (size_t i = 0; i < s.size(); ++i) dims += fmt::format("{}{}", i ? ", " : "", s[i]);
  throw InvalidArgument(
      fmt::format("tensor in '{}' has rank {} (shape [{}]); allowed: 3 ([S, H, D], read as B = 1) or 4 "
                  "([B, S, H, D])",
                  detail::path_text(path), s.size(), dims));
}

Tensor tensor_of(DType dtype, const std::vector<int64_t>& shape, const std::vector<uint8_t>& data,
                 const std::filesystem::path& path) {
  Tensor t(dtype, shape4_of(shape, path));
  QVG_CHECK(t.nbytes() == data.size());  // the parsers checked size == shape x dtype
  if (!data.empty()) std::memcpy(t.data(), data.data(), data.size());
  return t;
}

}  // namespace

Tensor read_tensor_file(const std::filesystem::path& path, const std::optional<std::string>& name) {
  const FileKind kind = kind_of(path);
  if (kind == FileKind::Npy) {
    if (name)
      throw InvalidArgument(
          fmt::format("tensor name '{}' given for '{}', but a .npy file holds one unnamed array (names "
                      "apply to .safetensors)",
                      *name, detail::path_text(path)));
    const detail::ReadOnlyFile file(path);
    const NpyArray a = detail::with_path(path, [&] { return parse_npy(io_detail::read_npy_bytes(file)); });
    return tensor_of(a.dtype, a.shape, a.data, path);
  }

  const SafetensorsFile f = read_safetensors(path);
  std::string names;
  for (const auto& t : f.tensors) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", t.name);
  const SafeTensor* t = nullptr;
  if (name) {
    t = f.find(*name);
    if (!t)
      throw InvalidArgument(fmt::format("no tensor named '{}' in '{}'; it holds: {}", *name, detail::path_text(path),
                                        f.tensors.empty() ? "nothing" : names));
  } else if (f.tensors.size() != 1) {
    throw InvalidArgument(f.tensors.empty() ? fmt::format("'{}' holds no tensors", detail::path_text(path))
                                            : fmt::format("'{}' holds {} tensors ({}); name the one to read",
                                                          detail::path_text(path), f.tensors.size(), names));
  } else {
    t = &f.tensors.front();
  }
  DType dtype;
  switch (t->dtype) {
    case StDType::F32: dtype = DType::F32; break;
    case StDType::F16: dtype = DType::F16; break;
    case StDType::BF16: dtype = DType::BF16; break;
    default:
      throw InvalidArgument(fmt::format("tensor '{}' in '{}' has dtype {}; a K/V tensor must be F32, F16 or BF16",
                                        t->name, detail::path_text(path), st_dtype_name(t->dtype)));
  }
  return tensor_of(dtype, t->shape, t->data, path);
}

void write_tensor_file(const std::filesystem::path& path, ConstTensorView t, std::string_view name) {
  const FileKind kind = kind_of(path);
  const Shape4& s = t.shape;
  if (s.b < 0 || s.s < 0 || s.h < 0 || s.d < 0)
    throw InvalidArgument(fmt::format("write_tensor_file: shape {} has a negative dimension", s.str()));
  const std::vector<int64_t> dims = {s.b, s.s, s.h, s.d};
  const auto* raw = static_cast<const uint8_t*>(t.data);
  const size_t numel = static_cast<size_t>(s.numel());
  if (kind == FileKind::Npy) {
    NpyArray a;
    a.shape = dims;
    if (t.dtype == DType::BF16) {
      // .npy has no bf16: float32 holding exactly the bf16 values (spec 1.6).
      a.dtype = DType::F32;
      std::vector<float> f32(numel);
      if (numel) convert_to_f32(t.data, DType::BF16, f32.data(), numel);
      a.data.resize(numel * 4);
      if (numel) std::memcpy(a.data.data(), f32.data(), numel * 4);
    } else {
      a.dtype = t.dtype;
      if (numel) a.data.assign(raw, raw + t.nbytes());
    }
    write_file_atomic(path, serialize_npy(a));
    return;
  }
  if (name.empty())
    throw InvalidArgument(fmt::format("tensor name for '{}' must not be empty", detail::path_text(path)));
  const StDType st = t.dtype == DType::F32 ? StDType::F32 : t.dtype == DType::F16 ? StDType::F16 : StDType::BF16;
  std::vector<io_detail::TensorRef> refs = {
      {std::string(name), st, dims, std::span<const uint8_t>(raw, numel ? t.nbytes() : 0)}};
  write_file_atomic(path, io_detail::serialize_safetensors_refs(refs, {}));
}

}  // namespace qvg
