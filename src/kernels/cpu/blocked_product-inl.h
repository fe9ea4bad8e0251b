// src/kernels/cpu/blocked_product-inl.h — the register-blocked product shared by
// the k-means assignment and the attention scores (per-target Highway code;
// include after hwy/highway.h inside a foreach_target translation unit).
//
// acc[p][v] (lane l) = sum_d rows[p][d] * colsT[d * stride + col0 + v * L + l]:
// P rows (points or queries) against NV vectors of columns (centroids or keys)
// stored transposed, so that one column load serves all P rows and the P x NV
// accumulators stay in registers.

#include <cstdint>

#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END

QVG_CPU_KERNELS_BEGIN

template <int P, int NV, class DF, class V = hwy::HWY_NAMESPACE::Vec<DF>>
HWY_INLINE void BlockedProduct(DF df, const float* const* rows, const float* colsT, int64_t stride, int64_t col0,
                               int64_t dim, V (&acc)[P][NV]) {
  namespace hn = hwy::HWY_NAMESPACE;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < NV; ++v) acc[p][v] = hn::Zero(df);
  const float* col = colsT + col0;
  for (int64_t d = 0; d < dim; ++d, col += stride) {
    V cv[NV];
    for (int v = 0; v < NV; ++v) cv[v] = hn::LoadU(df, col + v * L);
    for (int p = 0; p < P; ++p) {
      const V rv = hn::Set(df, rows[p][d]);
      for (int v = 0; v < NV; ++v) acc[p][v] = hn::MulAdd(rv, cv[v], acc[p][v]);
    }
  }
}

/// BlockedProduct with the accumulators stored to out[(p * NV + v) * L ...] at the end
/// (aligned to the vector). The caller reads them with run-time indices; were it to read
/// the accumulators themselves so (a loop over the points that stops early), the
/// compiler could keep them in memory and store every one of them on each step of the
/// product (GCC 12 did for P x NV = 4 x 2: one store per multiply-add).
template <int P, int NV, class DF>
HWY_INLINE void BlockedProductStore(DF df, const float* const* rows, const float* colsT, int64_t stride, int64_t col0,
                                    int64_t dim, float* HWY_RESTRICT out) {
  namespace hn = hwy::HWY_NAMESPACE;
  const int64_t L = int64_t(hn::Lanes(df));
  hn::Vec<DF> acc[P][NV];
  BlockedProduct<P, NV>(df, rows, colsT, stride, col0, dim, acc);
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < NV; ++v) hn::Store(acc[p][v], df, out + (p * NV + v) * L);
}

QVG_CPU_KERNELS_END
