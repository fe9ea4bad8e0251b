// src/kernels/cuda/arith.cuh — the per-element arithmetic of the CUDA kernels.
//
// The rules themselves are written once, for host and device, in src/core:
// numeric_impl.h (spec 1.4 conversions, separately rounded fp32 operations),
// residual_impl.h (spec 1.2-1.4 residual quantizer and decode) and rng_impl.h (the
// codec's PRNG). This header makes them visible as qvg::cuda_arith and adds what
// only the kernels need: element types as small integers and element loads/stores.
// tests/gpu/host_arith_test.cpp compiles the kernel bodies built on it with the
// host compiler and checks them bit for bit against the CPU codec.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numeric_impl.h"  // QVG_HD, the spec 1.4 conversions, mul_rn/add_rn/...
#include "core/residual_impl.h"
#include "core/rng_impl.h"

// Loop unrolling hint for the device pass only (the host compiler warns on it).
#if defined(__CUDA_ARCH__)
#define QVG_UNROLL _Pragma("unroll")
#else
#define QVG_UNROLL
#endif

namespace qvg::cuda_arith {

using namespace qvg::numeric_impl;   // NOLINT(google-build-using-namespace): re-export
using namespace qvg::residual_impl;  // NOLINT(google-build-using-namespace): re-export
using namespace qvg::rng_impl;       // NOLINT(google-build-using-namespace): re-export

// ---- element types ------------------------------------------------------------

/// Element types as small integers (the order of qvg::DType: BF16, F16, F32).
enum : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

/// Element i of a buffer of type t as fp32 (exact).
QVG_HD float load_elem(const void* p, int t, int64_t i) {
  if (t == kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
/// The storage bits of v in type t (nearest even; fp16 saturating): 16 low bits
/// for bf16/f16, all 32 for f32.
QVG_HD uint32_t encode_elem(float v, int t) {
  if (t == kF32) return bits_of(v);
  return t == kBF16 ? uint32_t(f32_to_bf16(v)) : uint32_t(f32_to_f16_sat(v));
}
/// Rounds v to type t and back to fp32 (the "stored value" of a centroid).
QVG_HD float round_trip(float v, int t) {
  if (t == kF32) return v;
  return t == kBF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16_sat(v));
}

}  // namespace qvg::cuda_arith
