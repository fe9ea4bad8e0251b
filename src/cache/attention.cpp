// Reference attention (qvg/attention.h): fp32, SIMD kernel per (b, h) and query block.
#include "qvg/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/core.h>

#include "kernels/kernels.h"
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
  check_threads("threads", threads);

  const int64_t B = qs.b, n = qs.s, H = qs.h, D = qs.d, T = ks.s;
  Tensor out(DType::F32, qs);
  float* o = static_cast<float*>(out.data());
  const float scale = 1.0f / std::sqrt(float(D));
  const int nthreads = resolve_threads(threads);
  const size_t qesz = dtype_size(q.dtype);

  // Per (b, h): K transposed and V as fp32 (converted in parallel over tokens),
  // then the queries in blocks over the threads (SIMD kernel, src/kernels).
  const int64_t pad = kernels::attention_key_padding();
  const int64_t tpad = (T + pad - 1) / pad * pad;
  std::vector<float> kT(static_cast<size_t>(D * tpad), 0.0f), vf(static_cast<size_t>(T * D)),
      qf(static_cast<size_t>(n * D));
  constexpr int64_t kQueryBlock = 16;
  const int64_t nqb = (n + kQueryBlock - 1) / kQueryBlock;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
#pragma omp parallel num_threads(nthreads)
      {
        // Blocked transpose: a tile of kTile key rows is converted, then written
        // out as D runs of kTile contiguous floats (a per-element scatter with
        // stride tpad would miss the cache on every store).
        constexpr int64_t kTile = 64;
        std::vector<float> tile(static_cast<size_t>(kTile * D));
        const int64_t ntiles = (T + kTile - 1) / kTile;
#pragma omp for schedule(static)
        for (int64_t tb = 0; tb < ntiles; ++tb) {
          const int64_t t0 = tb * kTile, cnt = std::min(kTile, T - t0);
          for (int64_t j = 0; j < cnt; ++j) {
            convert_to_f32(k.row(b, t0 + j, h), k.dtype, tile.data() + j * D, size_t(D));
            convert_to_f32(v.row(b, t0 + j, h), v.dtype, vf.data() + (t0 + j) * D, size_t(D));
          }
          for (int64_t d = 0; d < D; ++d) {
            float* dst = kT.data() + d * tpad + t0;
            for (int64_t j = 0; j < cnt; ++j) dst[j] = tile[size_t(j * D + d)];
          }
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          const auto* qrow = static_cast<const std::byte*>(q.data) + size_t(((b * n + i) * H + h) * D) * qesz;
          convert_to_f32(qrow, q.dtype, qf.data() + i * D, size_t(D));
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t i0 = qb * kQueryBlock, cnt = std::min(kQueryBlock, n - i0);
          kernels::attention_head(qf.data() + i0 * D, cnt, kT.data(), tpad, T, vf.data(), D, scale,
                                  o + ((b * n + i0) * H + h) * D, H * D);
        }
      }
    }
  }
  return out;
}

}  // namespace qvg
