// Scalar references of the encoder's kernels (quantize_rows, block_absmax,
// block_minmax, accumulate_clusters): see ref.h.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/residual_impl.h"
#include "kernels/ref/ref.h"
#include "qvg/code_format.h"

namespace qvg::kernels::ref {

void quantize_rows(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym, const float* s_eff,
                   const float* z_eff, uint8_t* codes) {
  dispatch_width(bits, [&](auto w) {
    using W = decltype(w);
    // Spec 1.5 as written: code d is code i = d mod G of group g = d / G, whose value
    // V = sum code[i] << shift(i) is stored in the group's B bytes, most significant first.
    const int64_t nb = dim / block, cb = dim / W::kGroupCodes * W::kGroupBytes;
    const int qmax = residual_impl::qmax_of<W>(asym);
    for (int64_t t = 0; t < count; ++t)
      for (int64_t g = 0; g < dim / W::kGroupCodes; ++g) {
        uint32_t v = 0;
        for (int i = 0; i < W::kGroupCodes; ++i) {
          const int64_t d = g * W::kGroupCodes + i, k = t * nb + d / block;
          const int q = residual_impl::quantize_code(r[t * dim + d], qmax, asym, s_eff[k], asym ? z_eff[k] : 0.0f);
          v |= uint32_t(q) << W::shift(i);
        }
        for (int b = 0; b < W::kGroupBytes; ++b)
          codes[t * cb + g * W::kGroupBytes + b] = uint8_t(v >> (8 * (W::kGroupBytes - 1 - b)));
      }
  });
}

void block_errors(const float* x, int64_t n, int qmax, bool asym, const float* s_eff, const float* z_eff, int ncand,
                  float* err) {
  for (int c = 0; c < ncand; ++c)
    err[c] = residual_impl::block_sq_error(x, n, qmax, asym, s_eff[c], asym ? z_eff[c] : 0.0f);
}

void block_absmax(const float* x, int64_t nblocks, int64_t bs, float* amax) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* p = x + b * bs;
    float a = 0;
    for (int64_t i = 0; i < bs; ++i) a = std::max(a, std::fabs(p[i]));
    amax[b] = a;
  }
}

void block_minmax(const float* x, int64_t nblocks, int64_t bs, float* lo, float* hi) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* p = x + b * bs;
    float l = p[0], h = p[0];
    for (int64_t i = 1; i < bs; ++i) {
      l = std::min(l, p[i]);
      h = std::max(h, p[i]);
    }
    lo[b] = l;
    hi[b] = h;
  }
}

void accumulate_clusters(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum, int64_t* cnt) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < dim; ++d) sum[int64_t(ids[i]) * dim + d] += double(x[i * dim + d]);
    ++cnt[ids[i]];
  }
}

}  // namespace qvg::kernels::ref
