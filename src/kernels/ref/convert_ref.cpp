// Scalar references of the conversions and of the input-limit scan: see ref.h.
#include <cmath>

#include "kernels/ref/ref.h"
#include "qvg/numeric.h"

namespace qvg::kernels::ref {

void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = qvg::f32_to_bf16(src[i]);
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = qvg::bf16_to_f32(src[i]);
}

size_t first_out_of_limit(const void* p, DType t, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(double(load_f32(p, t, i))) <= kMaxAbsInput)) return i;
  return n;
}

}  // namespace qvg::kernels::ref
