// src/core/input_limits.h — private: the message of a value refused by the input
// limits of spec 1 (finite, |x| <= 1e16), written once for every check of them (the
// CPU scan check_finite_and_bounded, src/kernels/cpu/convert.cpp, and the device
// encoder's check).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "qvg/tensor.h"

namespace qvg::detail {

/// The text of a refused value such that it visibly breaks the limit (spec 1's input
/// limits; a message must not read as allowed): NaN and infinities as "nan", "inf",
/// "-inf"; a finite value in its shortest form unless that form reads as allowed
/// (float32(1e16) = 10000000272564224 is "1e+16" at its shortest), then with 17
/// significant digits ("10000000272564224").
std::string limit_value_text(float x);

/// "<what> must hold finite values with |x| <= 1e16, got <limit_value_text(x)> at
/// [b, t, h, d]" for the element at flat index i of a [B, S, H, D] tensor of shape s.
std::string input_limit_message(std::string_view what, float x, Shape4 s, int64_t i);
/// The same for the element at [b, t, h, d].
std::string input_limit_message(std::string_view what, float x, int64_t b, int64_t t, int64_t h, int64_t d);

}  // namespace qvg::detail
