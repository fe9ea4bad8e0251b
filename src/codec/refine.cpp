// Refinement layers (docs/spans.md, "Refinement of the newest chunks"): the error of
// a decoded encoding, itself PRQ-encoded (one stage of one centroid and a narrow
// block residual), and added back at decode time. Built from encode() and
// decode_range(): no arithmetic of its own beyond the fp32 difference and sum.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "codec/encode_impl.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {

CodecConfig refinement_config(int bits, int block_size, uint64_t seed, int threads) {
  CodecConfig c;  // every other field its default: fp8 scales, two_level, symmetric, random, no scale search
  c.bits = bits;
  c.centroids = 1;
  c.stages = 1;
  c.kmeans_iters = 1;
  c.block_size = block_size;
  c.seed = seed;
  c.threads = threads;
  return c;
}

CodecConfig refinement_config(const QuantArgs& q, const CodecConfig& role) {
  CodecConfig c = refinement_config(q.refine_bits, role.block_size, role.seed, role.threads);
  c.head_offset = role.head_offset;
  return c;
}

void detail::check_refinement_inputs(ConstTensorView x, ConstTensorView decoded, const CodecConfig& cfg) {
  if (x.dtype != decoded.dtype || x.shape != decoded.shape)
    throw InvalidArgument(fmt::format("encode_refinement: decoded must have x's dtype and shape ({} {}), got {} {}",
                                      dtype_name(x.dtype), x.shape.str(), dtype_name(decoded.dtype),
                                      decoded.shape.str()));
  if (cfg.centroids != 1 || cfg.stages != 1)
    throw InvalidArgument(fmt::format(
        "encode_refinement: the config must have one stage of one centroid (refinement_config), got {} x {}",
        cfg.stages, cfg.centroids));
}

float detail::refinement_error_limit() {
  float lim = float(kMaxAbsInput);  // the largest float not above the limit
  if (double(lim) > kMaxAbsInput) lim = std::nextafter(lim, 0.0f);
  return lim;
}

EncodedTensor encode_refinement(ConstTensorView x, ConstTensorView decoded, const CodecConfig& cfg) {
  detail::check_refinement_inputs(x, decoded, cfg);
  // e = x - decoded, one fp32 subtraction per element (exact for bf16 elements whose
  // exponents differ by at most 16, as an element and its decoding's do), clamped to
  // the codec's input limit: a cache encodes layers after its state has changed, so
  // the encode must not refuse the error of an input near |x| = 1e16 (whose decoding
  // may be off by more than the limit); such an element is then refined only up to it.
  // The encoder forms e group by group as it gathers its points (no fp32 copies of
  // the tensors); the layer is encode() of e as a f32 tensor, bit for bit.
  return detail::encode_with_path(x, cfg, nullptr, nullptr, detail::AssignPath::Fast, nullptr, 0, &decoded);
}

void add_refinement(const EncodedTensor& ref, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const DecodeTarget& dst,
                    int threads) {
  QVG_CHECK(ref.dtype == DType::F32 && ref.stages == 1 && ref.centroids == 1);
  QVG_CHECK(0 <= t0 && t0 <= t1 && t1 <= ref.shape.s && 0 <= h0 && h0 < h1 && h1 <= ref.shape.h);
  const int64_t B = ref.shape.b, T = t1 - t0, H = h1 - h0, D = ref.shape.d;
  if (T == 0) return;
  std::vector<float> r(size_t(B * T * H * D));
  decode_range(ref, t0, t1, h0, h1, {r.data(), DType::F32, T * H * D, H * D}, threads);
  // Row by row (one token's H x D elements): dst = round(dst + r), once, to dst's dtype.
  const size_t esz = dtype_size(dst.dtype), row = size_t(H * D);
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> v(row);
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      std::byte* p = static_cast<std::byte*>(dst.base) + size_t(b * dst.batch_stride + t * dst.token_stride) * esz;
      convert_to_f32(p, dst.dtype, v.data(), row);
      const float* q = r.data() + size_t(bt) * row;
      for (size_t i = 0; i < row; ++i) v[i] += q[i];
      convert_from_f32(v.data(), dst.dtype, p, row);
    }
  }
}

}  // namespace qvg
