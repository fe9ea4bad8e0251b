// The PRQ decoder (spec 1.3) with pinned arithmetic: residual = (code - qmax) * s_eff
// or code * s_eff + z_eff, then stage 0, 1, ... centroids added in that order, each
// operation a separately rounded fp32 operation (the library is built with
// -ffp-contract=off), then one rounding to the output dtype.
#include <omp.h>

#include <algorithm>

#include <fmt/core.h>

#include "codec/residual.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {
namespace {

// Decodes tokens [t0, t1) of group (b, h) into rows of fp32 `tmp` (D per token),
// then rounds into the destination.
void decode_group_tokens(const EncodedTensor& enc, int64_t b, int64_t h, int64_t t0, int64_t t1,
                         const std::vector<std::vector<float>>& cent, const DecodeTarget& dst, int64_t h_out,
                         int64_t dst_t0, std::vector<float>& tmp) {
  const int64_t D = enc.shape.d, S = enc.shape.s, bs = enc.block_size, nb = D / bs;
  const int64_t g = b * enc.shape.h + h;
  const bool asym = enc.asymmetric;
  const int qmax = detail::qmax_of(enc.bits, asym);
  const bool two = enc.scaling == Scaling::TwoLevel;
  const float gs = two ? enc.scale_factor[size_t(g)] : 1.0f;
  const float gz = two && asym ? enc.zero_factor[size_t(g)] : 1.0f;
  const int64_t cbytes = enc.code_bytes_per_token();
  tmp.resize(size_t(D));
  float* acc = tmp.data();
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* code = enc.codes.data() + size_t((g * S + t) * cbytes);
    const size_t sbase = size_t((g * S + t) * nb);
    for (int64_t k = 0; k < nb; ++k) {
      const float s_eff = detail::stored_value(enc.scales.data(), enc.scale_dtype, sbase + size_t(k)) * gs;
      float z_eff = 0.0f;
      if (asym) z_eff = detail::stored_value(enc.zeros.data(), enc.scale_dtype, sbase + size_t(k)) * gz;
      for (int64_t i = k * bs; i < (k + 1) * bs; ++i) {
        int c;
        if (enc.bits == 4) {
          uint8_t byte = code[i >> 1];
          c = (i & 1) ? (byte & 0xF) : (byte >> 4);
        } else {
          uint8_t byte = code[i >> 2];
          c = (byte >> (6 - 2 * (i & 3))) & 0x3;
        }
        float v;
        if (!asym) {
          v = float(c - qmax) * s_eff;
        } else {
          float m = float(c) * s_eff;
          v = m + z_eff;
        }
        acc[i] = v;
      }
    }
    for (int st = 0; st < enc.stages; ++st) {
      const uint8_t id = enc.ids[size_t(st)][size_t(g * S + t)];
      const float* c = cent[size_t(st)].data() + int64_t(id) * D;
      for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] + c[d];
    }
    const size_t off = size_t(b * dst.batch_stride + (dst_t0 + (t - t0)) * dst.token_stride + h_out * D);
    convert_from_f32(acc, dst.dtype, static_cast<uint8_t*>(dst.base) + off * dtype_size(dst.dtype), size_t(D));
  }
}

}  // namespace

void decode_range(const EncodedTensor& enc, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const DecodeTarget& dst,
                  int threads) {
  QVG_CHECK(0 <= t0 && t0 <= t1 && t1 <= enc.shape.s && 0 <= h0 && h0 < h1 && h1 <= enc.shape.h);
  if (t0 == t1) return;
  const int64_t B = enc.shape.b, H = h1 - h0, D = enc.shape.d, K = enc.centroids;
  // Work items: (b, h, token block). Token blocks keep both cores busy when B*H is small.
  constexpr int64_t kTokBlock = 256;
  const int64_t nblk = (t1 - t0 + kTokBlock - 1) / kTokBlock;
  const int64_t items = B * H * nblk;
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<std::vector<float>> cent(size_t(enc.stages));
    std::vector<float> tmp;
    int64_t cached_group = -1;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bh = it / nblk, blk = it % nblk;
      const int64_t b = bh / H, h = h0 + bh % H;
      const int64_t g = b * enc.shape.h + h;
      if (g != cached_group) {  // codebooks of this group as fp32
        for (int st = 0; st < enc.stages; ++st) {
          cent[size_t(st)].resize(size_t(K * D));
          convert_to_f32(enc.centroid[size_t(st)].data() + size_t(g * K * D) * dtype_size(enc.dtype), enc.dtype,
                         cent[size_t(st)].data(), size_t(K * D));
        }
        cached_group = g;
      }
      const int64_t a = t0 + blk * kTokBlock, e = std::min(t1, a + kTokBlock);
      decode_group_tokens(enc, b, h, a, e, cent, dst, h - h0, a - t0, tmp);
    }
  }
}

void decode(const EncodedTensor& enc, TensorView out, int threads) {
  if (!(out.shape == enc.shape))
    throw InvalidArgument(fmt::format("decode output shape must be {}, got {}", enc.shape.str(), out.shape.str()));
  DecodeTarget dst{out.data, out.dtype, enc.shape.s * enc.shape.h * enc.shape.d, enc.shape.h * enc.shape.d};
  decode_range(enc, 0, enc.shape.s, 0, enc.shape.h, dst, threads);
}

Tensor decode(const EncodedTensor& enc, int threads) {
  Tensor t(enc.dtype, enc.shape);
  decode(enc, t.view(), threads);
  return t;
}

double inertia_fp64(const float* points, int64_t n, const float* centroids, int64_t k, int64_t dim) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    double best = -1;
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t d = 0; d < dim; ++d) {
        double t = double(points[i * dim + d]) - double(centroids[j * dim + d]);
        s += t * t;
      }
      if (best < 0 || s < best) best = s;
    }
    total += best;
  }
  return total;
}

}  // namespace qvg
