// src/kernels/ref/ref.h — the scalar reference of each CPU kernel op (one per op,
// ggml style): plain loops that write out the op's definition, with the shared
// scalar rules of src/core (numeric_impl.h, residual_impl.h) and no SIMD. The
// contracts are those of the same-named functions in src/kernels/kernels.h;
// tests/test_kernels.cpp compares every SIMD target against these, bit for bit
// where kernels.h promises the scalar bits. Slow; for tests and checks only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "qvg/tensor.h"

namespace qvg::kernels::ref {

/// Spec 1.3 decode: per token, residual = (code - qmax) * s_eff or code * s_eff +
/// z_eff, then stage 0, 1, ... centroids added in order, each a separately rounded
/// fp32 operation, then one rounding to out_dtype (qvg/numeric.h); with a refinement
/// layer, that value widened back, the layer's value added, rounded again.
void decode_rows(const DecodeRows& job);

/// Residual codes: residual_impl::quantize_code of every element, packed in the
/// order of spec 1.5. Writes every byte of codes (count x dim*bits/8).
void quantize_rows(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym, const float* s_eff,
                   const float* z_eff, uint8_t* codes);

/// err[c] = residual_impl::block_sq_error of candidate c.
void block_errors(const float* x, int64_t n, int qmax, bool asym, const float* s_eff, const float* z_eff, int ncand,
                  float* err);

/// amax[b] = std::max over the block of std::fabs, from 0.
void block_absmax(const float* x, int64_t nblocks, int64_t bs, float* amax);
/// The sequential scan lo = std::min(lo, x[i]), hi = std::max(hi, x[i]) from x[0].
void block_minmax(const float* x, int64_t nblocks, int64_t bs, float* lo, float* hi);

/// sum[ids[i] * dim + d] += double(x[i * dim + d]), ++cnt[ids[i]], point by point.
void accumulate_clusters(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum, int64_t* cnt);

/// qvg::f32_to_bf16 / qvg::bf16_to_f32 (qvg/numeric.h) element by element.
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);

/// The first i with !(|x_i| <= 1e16) (NaN included), x_i read as fp32 (load_f32)
/// and compared in fp64; n when there is none.
size_t first_out_of_limit(const void* p, DType t, size_t n);

}  // namespace qvg::kernels::ref
