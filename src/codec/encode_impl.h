// src/codec/encode_impl.h — encoder entry point with internal knobs, for tests.
#pragma once

#include "codec/kmeans.h"
#include "qvg/codec.h"

namespace qvg::detail {

/// encode() (span == nullptr) or encode_span_chunk() (*span, `add`) with the k-means
/// assignment path chosen explicitly (the public functions use Fast). With `minus`
/// (x's shape and dtype), the points encoded are encode_refinement's errors
/// clamp(x - minus, +-refinement_error_limit()) in fp32, made group by group as the
/// points are gathered (no copy of the whole tensor): encode() of that error tensor,
/// bit for bit, its input check and message included.
EncodedTensor encode_with_path(ConstTensorView x, const CodecConfig& cfg, const EncodedTensor* warm, EncodeStats* stats,
                               AssignPath path, SpanCodebook* span = nullptr, int add = 0,
                               const ConstTensorView* minus = nullptr);

/// encode_refinement(x, decode(with_codebook(enc, *codebook or enc)), cfg), bit for bit,
/// without the decoded tensor: each group's rows are decoded, and their errors formed,
/// as the encoder gathers that group's points (one pass, in cache). The CPU packed
/// cache's refinement layers. InvalidArgument as encode_refinement.
EncodedTensor encode_refinement_of(ConstTensorView x, const EncodedTensor& enc, const EncodedTensor* codebook,
                                   const CodecConfig& cfg);

/// Quantizes one group's final residual r (S x D fp32, token rows) into the group's
/// slices of enc.codes / scales / zeros and its factors (spec 1.2, 1.4). With
/// ScaleSearch::Mse each block's stored scale (and zero) is the candidate of least
/// squared error (residual_impl::block_sq_error; ties keep the earlier, the first
/// being the `off` choice), so the residual's squared error is never above `off`'s.
void quantize_residual_group(const float* r, int64_t group, EncodedTensor& enc, ScaleSearch search = ScaleSearch::Off);

/// encode_refinement's argument checks, for the host and the device encoder: throws
/// InvalidArgument unless `decoded` has x's dtype and shape and `cfg` is one stage of
/// one centroid (refinement_config).
void check_refinement_inputs(ConstTensorView x, ConstTensorView decoded, const CodecConfig& cfg);
/// The clamp of a refinement error e = x - decoded: the largest float not above the
/// codec's input limit (kMaxAbsInput), so the layer's encode never refuses it.
float refinement_error_limit();

}  // namespace qvg::detail
