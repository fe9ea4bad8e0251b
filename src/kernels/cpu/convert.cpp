// src/kernels/cpu/convert.cpp — the bulk conversions and the input-limit check of
// qvg/tensor.h (convert_to_f32, convert_from_f32, check_finite_and_bounded),
// implemented with the SIMD CPU kernels (dispatched, src/kernels/kernels.h).
#include <algorithm>
#include <cstring>

#include <fmt/core.h>

#include "core/input_limits.h"
#include "kernels/kernels.h"
#include "qvg/error.h"
#include "qvg/numeric.h"
#include "qvg/tensor.h"

namespace qvg {

void convert_to_f32(const void* src, DType t, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); break;
    case DType::BF16: kernels::bf16_to_f32(static_cast<const uint16_t*>(src), dst, n); break;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      break;
    }
  }
}

void convert_from_f32(const float* src, DType t, void* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); break;
    case DType::BF16: kernels::f32_to_bf16(src, static_cast<uint16_t*>(dst), n); break;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16_sat(src[i]);
      break;
    }
  }
}

void check_finite_and_bounded(ConstTensorView v, std::string_view what) {
  const size_t n = size_t(v.shape.numel());
  if (n > 0 && v.data == nullptr)
    throw InvalidArgument(fmt::format("{} has no data (null pointer) for shape {}", what, v.shape.str()));
  // SIMD scan (integer compares on magnitude bits), in parallel chunks; the
  // first offending flat index is reported whatever the thread count.
  constexpr size_t kChunk = size_t(1) << 16;
  const int64_t chunks = int64_t((n + kChunk - 1) / kChunk);
  size_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static) if (chunks > 8)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t lo = size_t(c) * kChunk, len = std::min(n, lo + kChunk) - lo;
    const size_t i =
        kernels::first_out_of_limit(static_cast<const uint8_t*>(v.data) + lo * dtype_size(v.dtype), v.dtype, len);
    if (i < len) bad = std::min(bad, lo + i);
  }
  if (bad < n)
    throw InvalidArgument(detail::input_limit_message(what, load_f32(v.data, v.dtype, bad), v.shape, int64_t(bad)));
}

}  // namespace qvg
