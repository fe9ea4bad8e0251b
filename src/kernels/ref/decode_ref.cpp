// Scalar reference of kernels::decode_rows (spec 1.3): see ref.h.
#include <vector>

#include "core/residual_impl.h"
#include "kernels/ref/ref.h"
#include "qvg/tensor.h"

namespace qvg::kernels::ref {

void decode_rows(const DecodeRows& j) {
  const int64_t D = j.dim, nb = D / j.block, cbytes = D * j.bits / 8;
  const int qmax = residual_impl::qmax_of(j.bits, j.asymmetric);
  const bool fp8 = j.scale_dtype == ScaleDType::FP8_E4M3;
  std::vector<float> acc(static_cast<size_t>(D));
  for (int64_t t = 0; t < j.count; ++t) {
    const uint8_t* code = j.codes + t * cbytes;
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t si = t * nb + k;
      const float s_eff = residual_impl::effective(residual_impl::stored_value(j.scales, fp8, si), j.scale_factor);
      float z_eff = 0.0f;
      if (j.asymmetric) z_eff = residual_impl::effective(residual_impl::stored_value(j.zeros, fp8, si), j.zero_factor);
      for (int64_t i = k * j.block; i < (k + 1) * j.block; ++i) {
        const int c = residual_impl::code_of_row(code, j.bits, i);
        acc[size_t(i)] = residual_impl::dequant(c, qmax, j.asymmetric, s_eff, z_eff);
      }
    }
    for (int st = 0; st < j.stages; ++st) {
      const float* c = j.centroids[st] + int64_t(j.ids[st][t]) * D;
      for (int64_t d = 0; d < D; ++d) acc[size_t(d)] = residual_impl::add_rn(acc[size_t(d)], c[d]);
    }
    void* dst = static_cast<uint8_t*>(j.out) + size_t(t * j.out_token_stride) * dtype_size(j.out_dtype);
    if (j.refine) {  // round, widen back, add the layer's value (one stage of one centroid)
      const RefineRows& r = *j.refine;
      const int64_t rnb = D / r.block;
      const int rq = residual_impl::qmax_of(r.bits, false);
      const uint8_t* rcode = r.codes + t * (D * r.bits / 8);
      for (int64_t d = 0; d < D; ++d) {
        const int64_t si = t * rnb + d / r.block;
        const float s_eff = residual_impl::effective(
            residual_impl::stored_value(r.scales, r.scale_dtype == ScaleDType::FP8_E4M3, si), r.scale_factor);
        const float layer = residual_impl::add_rn(
            residual_impl::dequant(residual_impl::code_of_row(rcode, r.bits, d), rq, false, s_eff, 0.0f),
            r.centroid[d]);
        uint8_t rounded[4];
        store_f32(rounded, j.out_dtype, 0, acc[size_t(d)]);
        acc[size_t(d)] = residual_impl::add_rn(load_f32(rounded, j.out_dtype, 0), layer);
      }
    }
    for (int64_t d = 0; d < D; ++d) store_f32(dst, j.out_dtype, size_t(d), acc[size_t(d)]);
  }
}

}  // namespace qvg::kernels::ref
