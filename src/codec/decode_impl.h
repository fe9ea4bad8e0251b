// src/codec/decode_impl.h — decoder internals, for the kernel tests.
#pragma once

#include "kernels/kernels.h"
#include "qvg/codec.h"

namespace qvg::detail {

/// The decode job of group g, tokens [t0, t1) (ids, centroids, out left unset).
kernels::DecodeRows rows_job(const EncodedTensor& enc, int64_t g, int64_t t0, int64_t t1);

/// Scalar reference of kernels::decode_rows: the spec 1.3 arithmetic written out
/// plainly. Every SIMD target must match it bit for bit.
void decode_rows_reference(const kernels::DecodeRows& job);

}  // namespace qvg::detail
