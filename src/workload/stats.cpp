// The K/V estimators of docs/workload.md (kv_stats in include/qvg/eval/workload.h).
#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "qvg/error.h"
#include "qvg/eval/workload.h"

namespace qvg {
namespace {

/// Nearest-rank percentile (q in (0, 1]) of v (partially reorders v).
double nearest_rank(std::vector<double>& v, double q) {
  const double pos = std::ceil(q * double(v.size())) - 1;
  const auto k = std::ptrdiff_t(std::clamp(pos, 0.0, double(v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[size_t(k)];
}

}  // namespace

KVStats kv_stats(ConstTensorView x) {
  const Shape4 s = x.shape;
  if (s.b < 1 || s.s < 1 || s.h < 1 || s.d < 1 || x.data == nullptr)
    throw InvalidArgument(fmt::format("kv_stats: x must be a non-empty [B, S, H, D] tensor, got {}", s.str()));
  std::vector<float> all(static_cast<size_t>(s.s * s.h * s.d));
  convert_to_f32(x.data, x.dtype, all.data(), all.size());  // batch 0
  KVStats st;
  std::vector<double> col(static_cast<size_t>(s.s)), med(static_cast<size_t>(s.d)), norms(static_cast<size_t>(s.s));
  for (int64_t h = 0; h < s.h; ++h) {
    for (int64_t t = 0; t < s.s; ++t) {
      double n2 = 0;
      for (int64_t d = 0; d < s.d; ++d) {
        const double v = all[size_t((t * s.h + h) * s.d + d)];
        n2 += v * v;
        st.abs_max = std::max(st.abs_max, std::fabs(v));
      }
      norms[size_t(t)] = std::sqrt(n2);
    }
    for (int64_t d = 0; d < s.d; ++d) {
      for (int64_t t = 0; t < s.s; ++t) col[size_t(t)] = std::fabs(all[size_t((t * s.h + h) * s.d + d)]);
      med[size_t(d)] = nearest_rank(col, 0.5);
    }
    const double mm = nearest_rank(med, 0.5);
    const double mx = *std::max_element(med.begin(), med.end());
    st.wall_ratio += mm > 0 ? mx / mm : 0.0;
    st.channel_median += mm;
    const double p1 = nearest_rank(norms, 0.01), p99 = nearest_rank(norms, 0.99);
    st.norm_spread += p1 > 0 ? p99 / p1 : 0.0;
    st.norm_median += nearest_rank(norms, 0.5);
    st.norm_max = std::max(st.norm_max, *std::max_element(norms.begin(), norms.end()));
  }
  const double hh = double(s.h);
  st.wall_ratio /= hh;
  st.channel_median /= hh;
  st.norm_spread /= hh;
  st.norm_median /= hh;
  return st;
}

}  // namespace qvg
