// Scalar reference conversions of spec 1.4, with integer operations only, so the
// result never depends on the FPU's rounding mode or on compiler contraction.
#include "qvg/numeric.h"

#include "core/numeric_impl.h"

namespace qvg {

uint16_t f32_to_bf16(float f) { return numeric_impl::f32_to_bf16(f); }
float f16_to_f32(uint16_t h) { return numeric_impl::f16_to_f32(h); }
uint16_t f32_to_f16(float f) { return numeric_impl::f32_to_f16(f); }
uint16_t f32_to_f16_sat(float f) { return numeric_impl::f32_to_f16_sat(f); }
float fp8e4m3_to_f32(uint8_t v) { return numeric_impl::fp8e4m3_to_f32(v); }
uint8_t f32_to_fp8e4m3(float f) { return numeric_impl::f32_to_fp8e4m3(f); }

}  // namespace qvg
