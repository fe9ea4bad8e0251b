// src/codec/decode_impl.h — decoder internals, for the kernel tests (the scalar
// reference decode is kernels::ref::decode_rows, src/kernels/ref/ref.h).
#pragma once

#include "kernels/kernels.h"
#include "qvg/codec.h"

namespace qvg::detail {

/// The decode job of group g, tokens [t0, t1) (ids, centroids, out left unset).
kernels::DecodeRows rows_job(const EncodedTensor& enc, int64_t g, int64_t t0, int64_t t1);
/// The rows of group g from token t0 on of a refinement layer (encode_refinement).
kernels::RefineRows refine_rows(const EncodedTensor& ref, int64_t g, int64_t t0);

}  // namespace qvg::detail
