// src/codec/encode_impl.h — encoder entry point with internal knobs, for tests.
#pragma once

#include "codec/kmeans.h"
#include "qvg/codec.h"

namespace qvg::detail {

/// encode() (span == nullptr) or encode_span_chunk() (*span, `add`) with the k-means
/// assignment path chosen explicitly (the public functions use Fast).
EncodedTensor encode_with_path(ConstTensorView x, const CodecConfig& cfg, const EncodedTensor* warm,
                               EncodeStats* stats, AssignPath path, SpanCodebook* span = nullptr, int add = 0);

/// Quantizes one group's final residual r (S x D fp32, token rows) into the group's
/// slices of enc.codes / scales / zeros and its factors (spec 1.2, 1.4). With
/// ScaleSearch::Mse each block's stored scale (and zero) is the candidate of least
/// squared error (residual_impl::block_sq_error; ties keep the earlier, the first
/// being the `off` choice), so the residual's squared error is never above `off`'s.
void quantize_residual_group(const float* r, int64_t group, EncodedTensor& enc, ScaleSearch search = ScaleSearch::Off);

}  // namespace qvg::detail
