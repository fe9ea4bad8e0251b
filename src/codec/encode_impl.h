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
/// slices of enc.codes / scales / zeros and its factors (spec 1.2, 1.4).
void quantize_residual_group(const float* r, int64_t group, EncodedTensor& enc);

}  // namespace qvg::detail
