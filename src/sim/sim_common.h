// src/sim/sim_common.h — helpers shared by the simulation, the comparison and their
// reports (internal; not part of the public API).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "qvg/cache.h"
#include "qvg/tensor.h"

namespace qvg::sim {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Rows 0, stride, 2*stride, ... of x ([1, n, H, D]) as a new dense tensor of x's dtype.
/// REQUIRES stride >= 1, x.shape.b == 1 (checked).
Tensor subsample_tokens(ConstTensorView x, int64_t stride);

/// [a ++ b] along tokens (both [1, *, H, D], same H, D and dtype; checked).
Tensor concat_tokens(ConstTensorView a, ConstTensorView b);

/// 1234567 -> "1,234,567".
std::string grouped(int64_t v);
/// bytes as "12.34 MiB" (2^20), or "1,234.5 MiB" from 1000 MiB on.
std::string mib(size_t bytes);

}  // namespace qvg::sim
