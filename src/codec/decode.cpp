// The PRQ decoder (spec 1.3) with pinned arithmetic: residual = (code - qmax) * s_eff
// or code * s_eff + z_eff, then stage 0, 1, ... centroids added in that order, each
// operation a separately rounded fp32 operation (the library is built with
// -ffp-contract=off), then one rounding to the output dtype.
#include <omp.h>

#include <algorithm>

#include <fmt/core.h>

#include "codec/decode_impl.h"
#include "kernels/kernels.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {
namespace detail {

kernels::DecodeRows rows_job(const EncodedTensor& enc, int64_t g, int64_t t0, int64_t t1) {
  kernels::DecodeRows j;
  const int64_t S = enc.shape.s, nb = enc.blocks_per_token();
  j.codes = enc.codes.data() + size_t((g * S + t0) * enc.code_bytes_per_token());
  j.scales = enc.scales.data() + size_t((g * S + t0) * nb) * enc.scale_elem_size();
  if (enc.asymmetric) j.zeros = enc.zeros.data() + size_t((g * S + t0) * nb) * enc.scale_elem_size();
  j.scale_dtype = enc.scale_dtype;
  const bool two = enc.scaling == Scaling::TwoLevel;
  j.scale_factor = two ? enc.scale_factor[size_t(g)] : 1.0f;
  j.zero_factor = two && enc.asymmetric ? enc.zero_factor[size_t(g)] : 1.0f;
  j.bits = enc.bits;
  j.asymmetric = enc.asymmetric;
  j.block = enc.block_size;
  j.dim = enc.shape.d;
  j.stages = enc.stages;
  j.count = t1 - t0;
  return j;
}

kernels::RefineRows refine_rows(const EncodedTensor& ref, int64_t g, int64_t t0) {
  // A refinement layer is symmetric, one stage, one centroid: the decode job's codes
  // and scales with the group's centroid row.
  const kernels::DecodeRows r = rows_job(ref, g, t0, t0);
  const float* centroid = reinterpret_cast<const float*>(ref.centroid[0].data()) + g * ref.shape.d;
  return {r.codes, r.scales, r.scale_dtype, r.scale_factor, r.bits, r.block, centroid};  // RefineRows' order
}

}  // namespace detail

void decode_ranges(const std::vector<DecodeTask>& tasks, int threads) {
  // Work items over all tasks: (task, b, h, token block), so one parallel region
  // serves every range (a window of many spans costs one fork/join, and threads
  // balance across spans). Token blocks keep both cores busy when B*H is small.
  check_threads("threads", threads);
  constexpr int64_t kTokBlock = 256;
  std::vector<int64_t> first_item(tasks.size() + 1, 0);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const DecodeTask& tk = tasks[i];
    QVG_CHECK(tk.enc != nullptr);
    const EncodedTensor& enc = *tk.enc;
    const EncodedTensor& book = tk.codebook ? *tk.codebook : enc;
    QVG_CHECK(book.centroid.size() == size_t(enc.stages) && book.dtype == enc.dtype && book.centroids == enc.centroids &&
              book.shape.h == enc.shape.h && book.shape.b == enc.shape.b && book.shape.d == enc.shape.d);
    for (const auto& c : book.centroid)
      QVG_CHECK(c.size() == size_t(enc.groups() * enc.centroids * enc.shape.d) * dtype_size(enc.dtype));
    QVG_CHECK(0 <= tk.t0 && tk.t0 <= tk.t1 && tk.t1 <= enc.shape.s && 0 <= tk.h0 && tk.h0 < tk.h1 &&
              tk.h1 <= enc.shape.h);
    if (const EncodedTensor* r = tk.refinement)  // a layer of this encoding (encode_refinement)
      QVG_CHECK(r->dtype == DType::F32 && r->stages == 1 && r->centroids == 1 && !r->asymmetric &&
                r->shape == enc.shape && r->centroid.size() == 1 &&
                r->centroid[0].size() == size_t(r->groups() * r->shape.d) * 4);
    const int64_t nblk = (tk.t1 - tk.t0 + kTokBlock - 1) / kTokBlock;
    first_item[i + 1] = first_item[i] + enc.shape.b * (tk.h1 - tk.h0) * nblk;
  }
  const int64_t items = first_item.back();
  if (items == 0) return;
  const int nthreads = resolve_threads(threads);
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<std::vector<float>> cent;
    std::vector<const float*> cptr;
    std::vector<const uint8_t*> iptr;
    const EncodedTensor* cached_enc = nullptr;
    int64_t cached_group = -1;
    size_t task = 0;
    // Dynamic: on a shared host one core can run much slower than the other for a
    // while (measured here: 2 threads 0.43 ms or 0.69 ms for the same decode); an
    // equal static split then waits for the slow one. Items handed to one thread
    // mostly stay in one group, so its codebook conversion is reused.
#pragma omp for schedule(dynamic, 2)
    for (int64_t it = 0; it < items; ++it) {
      while (it >= first_item[task + 1]) ++task;
      while (it < first_item[task]) --task;
      const DecodeTask& tk = tasks[task];
      const EncodedTensor& enc = *tk.enc;
      const int64_t H = tk.h1 - tk.h0, D = enc.shape.d, K = enc.centroids, S = enc.shape.s;
      const int64_t nblk = (tk.t1 - tk.t0 + kTokBlock - 1) / kTokBlock;
      const int64_t local = it - first_item[task];
      const int64_t bh = local / nblk, blk = local % nblk;
      const int64_t b = bh / H, h = tk.h0 + bh % H;
      const int64_t g = b * enc.shape.h + h;
      const EncodedTensor& book = tk.codebook ? *tk.codebook : enc;  // where the centroids are
      if (&book != cached_enc || g != cached_group) {  // codebooks of this group as fp32
        cent.resize(size_t(enc.stages));
        cptr.resize(size_t(enc.stages));
        iptr.resize(size_t(enc.stages));
        for (int st = 0; st < enc.stages; ++st) {
          cent[size_t(st)].resize(size_t(K * D));
          convert_to_f32(book.centroid[size_t(st)].data() + size_t(g * K * D) * dtype_size(book.dtype), book.dtype,
                         cent[size_t(st)].data(), size_t(K * D));
          cptr[size_t(st)] = cent[size_t(st)].data();
        }
        cached_enc = &book;
        cached_group = g;
      }
      const int64_t a = tk.t0 + blk * kTokBlock, e = std::min(tk.t1, a + kTokBlock);
      kernels::DecodeRows job = detail::rows_job(enc, g, a, e);
      for (int st = 0; st < enc.stages; ++st) iptr[size_t(st)] = enc.ids[size_t(st)].data() + size_t(g * S + a);
      job.ids = iptr.data();
      job.centroids = cptr.data();
      const DecodeTarget& dst = tk.dst;
      job.out = static_cast<uint8_t*>(dst.base) +
                size_t(b * dst.batch_stride + (a - tk.t0) * dst.token_stride + (h - tk.h0) * D) *
                    dtype_size(dst.dtype);
      job.out_dtype = dst.dtype;
      job.out_token_stride = dst.token_stride;
      kernels::RefineRows layer;
      if (tk.refinement) {
        layer = detail::refine_rows(*tk.refinement, g, a);
        job.refine = &layer;
      }
      kernels::decode_rows(job);
    }
  }
}

void decode_range(const EncodedTensor& enc, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const DecodeTarget& dst,
                  int threads) {
  decode_ranges({DecodeTask{&enc, t0, t1, h0, h1, dst}}, threads);
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
