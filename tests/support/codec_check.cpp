#include "support/codec_check.h"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

namespace qvg::testing {

double half_ulp(double v, DType t) {
  double a = std::fabs(v);
  int e;
  switch (t) {
    case DType::F32: return 0.0;
    case DType::BF16:
      if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -134);
      std::frexp(a, &e);
      return std::ldexp(1.0, e - 1 - 7 - 1);
    case DType::F16:
      if (a < std::ldexp(1.0, -14)) return std::ldexp(1.0, -25);
      std::frexp(a, &e);
      return std::ldexp(1.0, e - 1 - 10 - 1);
  }
  return 0.0;
}

BoundReport check_error_bound(ConstTensorView x, const EncodedTensor& enc, ConstTensorView decoded, int64_t t0,
                              int64_t h0) {
  BoundReport rep;
  const Shape4 xs = x.shape, ds = decoded.shape;
  const int64_t D = xs.d, bs = enc.block_size;
  const bool asym = enc.asymmetric;
  const int qmax = asym ? (1 << enc.bits) - 1 : (1 << (enc.bits - 1)) - 1;
  for (int64_t b = 0; b < ds.b; ++b)
    for (int64_t t = 0; t < ds.s; ++t)
      for (int64_t h = 0; h < ds.h; ++h) {
        const int64_t st = t0 + t, hh = h0 + h;
        for (int64_t d = 0; d < D; ++d) {
          const size_t xi = size_t(((b * xs.s + st) * xs.h + hh) * D + d);
          const size_t di = size_t(((b * ds.s + t) * ds.h + h) * D + d);
          const float xv = load_f32(x.data, x.dtype, xi);
          const float out = load_f32(decoded.data, decoded.dtype, di);
          ++rep.checked;
          if (!std::isfinite(out)) {
            ++rep.non_finite;
            ++rep.violations;
            if (rep.first.empty()) rep.first = fmt::format("non-finite output at b{} t{} h{} d{}", b, st, hh, d);
            continue;
          }
          // Residual as the encoder computed it: fp32, stored centroids, stage order.
          float r = xv;
          double mag = std::fabs(xv);
          for (int s = 0; s < enc.stages; ++s) {
            int id = enc.ids[size_t(s)][size_t((b * enc.shape.h + hh) * enc.shape.s + st)];
            float c = enc.centroid_at(s, b, hh, id, d);
            r = r - c;
            mag += std::fabs(c);
          }
          const int64_t blk = d / bs;
          const double s_eff = enc.scale_eff(b, hh, st, blk);
          double lo, hi;
          if (!asym) {
            lo = -qmax * s_eff;
            hi = qmax * s_eff;
          } else {
            lo = enc.zero_eff(b, hh, st, blk);
            hi = lo + qmax * s_eff;
          }
          const double dist = r < lo ? lo - r : (r > hi ? r - hi : 0.0);
          mag += std::fabs(hi) + std::fabs(lo);
          const double bound = s_eff / 2 + dist + half_ulp(out, decoded.dtype) +
                               8 * mag * std::ldexp(1.0, -24);
          const double err = std::fabs(double(xv) - double(out));
          rep.worst_excess = std::max(rep.worst_excess, err - bound);
          if (err > bound) {
            ++rep.violations;
            if (rep.first.empty())
              rep.first = fmt::format("b{} t{} h{} d{}: x={} out={} err={} bound={} (s_eff={} r={} range=[{}, {}])",
                                      b, st, hh, d, xv, out, err, bound, s_eff, r, lo, hi);
          }
        }
      }
  return rep;
}

double rel_mse(ConstTensorView a, ConstTensorView b) {
  double num = 0, den = 0;
  const size_t n = size_t(a.shape.numel());
  for (size_t i = 0; i < n; ++i) {
    double x = load_f32(a.data, a.dtype, i), y = load_f32(b.data, b.dtype, i);
    num += (x - y) * (x - y);
    den += x * x;
  }
  return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

}  // namespace qvg::testing
