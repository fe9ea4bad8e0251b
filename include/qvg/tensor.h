// qvg/tensor.h — element types and the [B, S, H, D] tensors that cross the API.
//
// Tensors are dense, row-major, in the layout of the spec: batch, tokens, heads,
// head_dim. A view never owns memory; its lifetime is the caller's business.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qvg {

/// Element type of K/V tensors and of codebooks. Values persisted in `.qvgt`
/// metadata by name (`bf16`, `f16`, `f32`), never by number.
enum class DType : uint8_t { BF16, F16, F32 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  ///< "bf16", "f16", "f32"
/// Parses "bf16" | "f16" | "f32" (also "bfloat16", "float16", "fp16", "float32", "fp32");
/// throws InvalidArgument naming `what`.
DType parse_dtype(std::string_view s, std::string_view what = "dtype");

/// Shape [B, S, H, D].
struct Shape4 {
  int64_t b = 0, s = 0, h = 0, d = 0;
  int64_t numel() const { return b * s * h * d; }
  bool operator==(const Shape4&) const = default;
  std::string str() const;  ///< "[B, S, H, D]"
};

/// Non-owning read-only view of a dense [B, S, H, D] tensor.
struct ConstTensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  Shape4 shape;
  size_t nbytes() const { return size_t(shape.numel()) * dtype_size(dtype); }
};

/// Non-owning writable view of a dense [B, S, H, D] tensor.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape4 shape;
  size_t nbytes() const { return size_t(shape.numel()) * dtype_size(dtype); }
  operator ConstTensorView() const { return {data, dtype, shape}; }
};

/// Owning, 64-byte aligned, zero-initialised byte buffer with value semantics.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n);  ///< zero-filled
  /// n bytes of unspecified content (for buffers that are fully overwritten).
  static AlignedBuffer uninitialized(size_t n);
  AlignedBuffer(const AlignedBuffer& o);
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer o) noexcept;
  ~AlignedBuffer();
  std::byte* data() { return p_; }
  const std::byte* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  AlignedBuffer(size_t n, bool zero);
  std::byte* p_ = nullptr;
  size_t n_ = 0;
};

/// An owning dense [B, S, H, D] tensor (64-byte aligned storage).
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape4 shape);  ///< zero-filled
  DType dtype() const { return dtype_; }
  const Shape4& shape() const { return shape_; }
  size_t nbytes() const { return size_t(shape_.numel()) * dtype_size(dtype_); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  TensorView view() { return {data(), dtype_, shape_}; }
  ConstTensorView view() const { return {data(), dtype_, shape_}; }
  operator ConstTensorView() const { return view(); }

  /// Element (b, s, h, d) converted to fp32.
  float at(int64_t b, int64_t s, int64_t h, int64_t d) const;
  /// Stores v rounded (nearest even) to the tensor's dtype.
  void set(int64_t b, int64_t s, int64_t h, int64_t d, float v);

  /// Copies a view's bytes.
  static Tensor copy_of(ConstTensorView v);
  /// The tensor converted element-wise (nearest even) to `dtype`.
  Tensor to(DType dtype) const;
  /// All elements as fp32, row-major.
  std::vector<float> to_f32() const;

 private:
  DType dtype_ = DType::F32;
  Shape4 shape_;
  AlignedBuffer storage_;
};

/// Reads element i (flat index) of a buffer of dtype t as fp32.
float load_f32(const void* p, DType t, size_t i);
/// Writes v rounded (nearest even; fp16 saturating at +-65504) as dtype t at index i.
void store_f32(void* p, DType t, size_t i, float v);
// The next three functions are implemented by the SIMD CPU kernels (src/kernels/cpu/convert.cpp).
/// Converts n elements to fp32 (exact for every DType).
void convert_to_f32(const void* src, DType t, float* dst, size_t n);
/// Converts n fp32 values to dtype t, nearest even (fp16 saturates at +-65504).
void convert_from_f32(const float* src, DType t, void* dst, size_t n);

/// Throws InvalidArgument naming `what` unless every element is finite and
/// |x| <= kMaxAbsInput (spec 1, input limits).
void check_finite_and_bounded(ConstTensorView v, std::string_view what);
inline constexpr double kMaxAbsInput = 1e16;

}  // namespace qvg
