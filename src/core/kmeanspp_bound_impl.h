// src/core/kmeanspp_bound_impl.h — the exact pruning of kmeans++'s d2 update (spec 1.1:
// the picks do not change). Each round every point takes d2 = min(d2, sqdist(x, c)) for
// the new pick c. With c_near the pick that last lowered the point's d2, a = |x - c_near|
// and b = |c - c_near|, the triangle inequality gives |x - c| >= b - a >= a when b >= 2a:
// then the new distance is not below d2 and the update can be skipped. may_skip makes that
// test on the computed values (sqdist: fp32, 8 lanes, kmeans.cpp) with a margin that
// covers their rounding, so a skipped point's computed distance is never below its d2.
// Used by the CPU codec (kmeans.cpp, kmeanspp_picks) and the CUDA kernel
// (src/kernels/cuda/kmeanspp.cuh) alike; tests/gpu/host_kmeanspp_test.cpp audits every
// skip against the distance it avoided.
#pragma once

#include <cfloat>
#include <cstdint>

#include "qvg/host_device.h"

namespace qvg::kmeanspp_bound {

/// The factor of may_skip for D channels: 4 (1 + eps), eps = max(2^-10, (D/2 + 24)
/// 2^-24). Each sqdist is within a relative gamma <= (D/8 + 5) 2^-24 (1 + tiny) of its
/// exact value (a rounded subtraction and square per term, at most D/8 additions per
/// lane, 3 to combine the lanes; all terms >= 0) plus an absolute D 2^-150 (squares
/// below the normal range), and the test is sound for eps >= 2 gamma.
QVG_HD double skip_factor(int64_t D) {
  const double eps = double(D / 2 + 24) * 0x1p-24;
  return 4.0 * (1.0 + (eps > 0x1p-10 ? eps : 0x1p-10));
}

/// Whether a point with d2 (its computed distance to its nearest pick so far, c_near)
/// keeps it for the new pick c, given cc = the computed sqdist of c and c_near and
/// factor = skip_factor(D): true only where c's computed distance cannot be below d2.
/// - d2 == 0: no distance is below it (a sum of squares is >= +0).
/// - d2 or cc not finite (+inf before the first pick, an overflow, a NaN): false.
/// - else cc >= factor d2 + 2^-100. With the computed values (a^2 and b^2 within gamma
///   relative and D 2^-150 absolute, skip_factor): b >= 2 a sqrt((1 + eps)(1 - gamma) /
///   (1 + gamma)), so the computed |x - c|^2 >= (1 - gamma)(b - a)^2 - D 2^-150 >= d2
///   when eps >= 2 gamma, 2^-100 covering the absolute parts (D < 2^47). Evaluated in
///   double (factor d2 within 2^-52 relative).
QVG_HD bool may_skip(float cc, float d2, double factor) {
  if (d2 == 0.0f) return true;
  if (!(d2 <= FLT_MAX) || !(cc <= FLT_MAX)) return false;
  return double(cc) >= factor * double(d2) + 0x1p-100;
}

}  // namespace qvg::kmeanspp_bound
