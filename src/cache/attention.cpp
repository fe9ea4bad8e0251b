// Reference attention (qvg/attention.h): simple, exact fp32, OpenMP over (b, h).
#include "qvg/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg {

Tensor attention(ConstTensorView q, const StridedView& k, const StridedView& v, int threads) {
  const Shape4 qs = q.shape, ks = k.shape;
  if (qs.b < 1 || qs.s < 1 || qs.h < 1 || qs.d < 1)
    throw InvalidArgument(fmt::format("q shape must be [B, n, h, D] with every dimension >= 1, got {}", qs.str()));
  if (ks.s < 1) throw InvalidArgument(fmt::format("k must hold at least one token, got shape {}", ks.str()));
  if (ks.b != qs.b || ks.h != qs.h || ks.d != qs.d)
    throw InvalidArgument(
        fmt::format("k shape {} must be [B, T, h, D] with B, h, D of q shape {}", ks.str(), qs.str()));
  if (!(v.shape == ks)) throw InvalidArgument(fmt::format("v shape must equal k shape {}, got {}", ks.str(), v.shape.str()));
  if (q.data == nullptr || k.data == nullptr || v.data == nullptr)
    throw InvalidArgument("q, k and v data must not be null");
  if (threads < 0) throw InvalidArgument(fmt::format("threads must be >= 0 (0 = all cores), got {}", threads));

  const int64_t B = qs.b, n = qs.s, H = qs.h, D = qs.d, T = ks.s;
  Tensor out(DType::F32, qs);
  float* o = static_cast<float*>(out.data());
  const float scale = 1.0f / std::sqrt(float(D));
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
  const size_t qesz = dtype_size(q.dtype);

#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      // K and V of this (b, h) as fp32 token rows.
      const size_t td = size_t(T * D), dd = size_t(D), tt = size_t(T);
      std::vector<float> kf(td), vf(td), qf(dd), s(tt), acc(dd);
      for (int64_t t = 0; t < T; ++t) {
        convert_to_f32(k.row(b, t, h), k.dtype, kf.data() + t * D, size_t(D));
        convert_to_f32(v.row(b, t, h), v.dtype, vf.data() + t * D, size_t(D));
      }
      for (int64_t i = 0; i < n; ++i) {
        const auto* qrow = static_cast<const std::byte*>(q.data) + size_t(((b * n + i) * H + h) * D) * qesz;
        convert_to_f32(qrow, q.dtype, qf.data(), size_t(D));
        float m = -INFINITY;
        for (int64_t t = 0; t < T; ++t) {
          const float* kt = kf.data() + t * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qf[size_t(d)] * kt[d];
          s[size_t(t)] = dot * scale;
          m = std::max(m, s[size_t(t)]);
        }
        float l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t < T; ++t) {
          const float p = std::exp(s[size_t(t)] - m);
          l += p;
          const float* vt = vf.data() + t * D;
          for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * vt[d];
        }
        float* orow = o + ((b * n + i) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) orow[d] = acc[size_t(d)] / l;
      }
    }
  }
  return out;
}

}  // namespace qvg
