// tests/support/codec_check.h — checks of decoded values against the error bound
// of spec 1.2, derived from the stored scales and zeros of an EncodedTensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qvg/codec.h"
#include "qvg/tensor.h"

namespace qvg::testing {

struct BoundReport {
  int64_t checked = 0;
  int64_t violations = 0;
  int64_t non_finite = 0;
  double worst_excess = 0;  ///< largest |err| - bound seen (<= 0 when all hold)
  std::string first;        ///< description of the first violation
};

/// For every element of x (the encoder's input, [B, S, H, D]) and `decoded` (any
/// dtype; elements [t0, t0 + decoded.s) of x's tokens and heads [h0, h0 + decoded.h)),
/// checks |x - decoded| <= s_eff/2 + dist(r, representable range) + half an ulp of
/// the output dtype + 8 fp32 ulps of the largest magnitude summed, where r is the
/// final residual recomputed from x and the stored centroids (spec 1.1 step 2).
BoundReport check_error_bound(ConstTensorView x, const EncodedTensor& enc, ConstTensorView decoded, int64_t t0 = 0,
                              int64_t h0 = 0);

/// Relative MSE ||a - b||^2 / ||a||^2 in fp64 (0 when both are zero).
double rel_mse(ConstTensorView a, ConstTensorView b);

/// Half an ulp of `v` in dtype t (for bf16/f16 output rounding; 0 for f32).
double half_ulp(double v, DType t);

}  // namespace qvg::testing
