#include "qvg/tensor.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include <fmt/core.h>

#include "core/enum_names.h"
#include "core/input_limits.h"
#include "qvg/error.h"
#include "qvg/numeric.h"

namespace qvg {

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

namespace {
constexpr detail::EnumName<DType> kDTypes[] = {
    {DType::BF16, "bf16"},    {DType::BF16, "bfloat16"}, {DType::F16, "f16"},   {DType::F16, "fp16"},
    {DType::F16, "float16"},  {DType::F16, "half"},      {DType::F32, "f32"},   {DType::F32, "fp32"},
    {DType::F32, "float32"},  {DType::F32, "float"}};
}  // namespace

std::string_view dtype_name(DType t) { return detail::name_in(kDTypes, t); }

DType parse_dtype(std::string_view s, std::string_view what) {
  return detail::parse_in(kDTypes, s, what, "bf16, f16, f32");
}

std::string Shape4::str() const { return fmt::format("[{}, {}, {}, {}]", b, s, h, d); }

// ---- AlignedBuffer ---------------------------------------------------------
AlignedBuffer::AlignedBuffer(size_t n) : AlignedBuffer(n, true) {}
AlignedBuffer AlignedBuffer::uninitialized(size_t n) { return AlignedBuffer(n, false); }
AlignedBuffer::AlignedBuffer(size_t n, bool zero) : n_(n) {
  if (n == 0) return;
  // Large buffers (cache segments, decoded windows) are 2 MiB aligned and asked to
  // be backed by transparent huge pages: a decode writes rows of one head at a
  // stride of H * D elements, touching a new 4 KiB page every token or so, and the
  // TLB misses cost about 10 % of a window's decode (measured on a 288 MB target).
  constexpr size_t kHuge = size_t(2) << 20;
  const bool huge = n >= 2 * kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t rounded = (n + align - 1) / align * align;
  p_ = static_cast<std::byte*>(std::aligned_alloc(align, rounded));
  if (!p_) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge) (void)madvise(p_, rounded, MADV_HUGEPAGE);  // advice only: ignored where unsupported
#endif
  if (zero) std::memset(p_, 0, rounded);
}
AlignedBuffer::AlignedBuffer(const AlignedBuffer& o) : AlignedBuffer(o.n_) {
  if (n_) std::memcpy(p_, o.p_, n_);
}
AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}
AlignedBuffer::~AlignedBuffer() { std::free(p_); }

// ---- element access --------------------------------------------------------
float load_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

void store_f32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16_sat(v); break;
  }
}

// ---- Tensor ----------------------------------------------------------------
Tensor::Tensor(DType dtype, Shape4 shape) : dtype_(dtype), shape_(shape) {
  if (shape.b < 0 || shape.s < 0 || shape.h < 0 || shape.d < 0)
    throw InvalidArgument(fmt::format("tensor shape must be non-negative, got {}", shape.str()));
  storage_ = AlignedBuffer(size_t(shape.numel()) * dtype_size(dtype));
}

float Tensor::at(int64_t b, int64_t s, int64_t h, int64_t d) const {
  size_t i = size_t(((b * shape_.s + s) * shape_.h + h) * shape_.d + d);
  return load_f32(data(), dtype_, i);
}

void Tensor::set(int64_t b, int64_t s, int64_t h, int64_t d, float v) {
  size_t i = size_t(((b * shape_.s + s) * shape_.h + h) * shape_.d + d);
  store_f32(data(), dtype_, i, v);
}

Tensor Tensor::copy_of(ConstTensorView v) {
  Tensor t(v.dtype, v.shape);
  if (t.nbytes()) std::memcpy(t.data(), v.data, t.nbytes());
  return t;
}

// to() and to_f32() convert element by element with the scalar conversions of
// qvg/numeric.h (core calls no kernel); the SIMD bulk conversions
// (convert_to_f32, convert_from_f32) give the same bits.
Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t(dtype, shape_);
  const size_t n = size_t(shape_.numel());
  for (size_t i = 0; i < n; ++i) store_f32(t.data(), dtype, i, load_f32(data(), dtype_, i));
  return t;
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> f(static_cast<size_t>(shape_.numel()));
  for (size_t i = 0; i < f.size(); ++i) f[i] = load_f32(data(), dtype_, i);
  return f;
}

namespace detail {

std::string limit_value_text(float x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string t = fmt::format("{}", x);  // the shortest text that reads back as x
  // Out of the limit but printed as if inside it (the shortest form of float32(1e16)
  // is "1e+16"): every digit of the double, so that it visibly exceeds 1e16.
  if (std::fabs(double(x)) > kMaxAbsInput && std::fabs(std::strtod(t.c_str(), nullptr)) <= kMaxAbsInput)
    t = fmt::format("{:.17g}", double(x));
  return t;
}

std::string input_limit_message(std::string_view what, float x, int64_t b, int64_t t, int64_t h, int64_t d) {
  return fmt::format("{} must hold finite values with |x| <= 1e16, got {} at [{}, {}, {}, {}]", what,
                     limit_value_text(x), b, t, h, d);
}

std::string input_limit_message(std::string_view what, float x, Shape4 s, int64_t i) {
  return input_limit_message(what, x, i / (s.d * s.h * s.s), (i / (s.d * s.h)) % s.s, (i / s.d) % s.h, i % s.d);
}

}  // namespace detail
}  // namespace qvg
