// qvg/attention.h — reference attention over a cache view.
//
// out[b, i, h, :] = softmax_j(q[b, i, h, :] . k[b, j, h, :] * (1 / sqrt(D))) v[b, j, h, :]
// for the n queries of the current chunk over all T tokens of the view (every
// view token is visible: the view already is the causal window). fp32
// arithmetic throughout: K, V and Q are converted exactly to fp32, scores and
// weighted sums accumulate in fp32 (fused multiply-adds, SIMD lanes), the
// softmax subtracts the row maximum before exp. It is the yardstick for quality
// (packed vs dense views) and the baseline for fused attention kernels; it is
// accurate to about 1e-6 relative against an fp64 evaluation. Work is split over
// blocks of queries with OpenMP; each output element is computed by one thread in
// a fixed order, so the result does not depend on the thread count.
// Scratch: (T x D) x 2 fp32 per call plus 4 x T floats per thread.
#pragma once

#include "qvg/cache.h"
#include "qvg/tensor.h"

namespace qvg {

/// q: [B, n, h, D] dense (bf16, f16 or f32); k, v: [B, T, h, D] strided views
/// (any dtype) with identical shapes. Returns fp32 [B, n, h, D].
/// Throws InvalidArgument when shapes disagree, T or n is 0, or data is null.
/// threads: 0 = all cores.
Tensor attention(ConstTensorView q, const StridedView& k, const StridedView& v, int threads = 0);

/// The same over a cache view (kv.k, kv.v).
inline Tensor attention(ConstTensorView q, const KVView& kv, int threads = 0) {
  return attention(q, kv.k, kv.v, threads);
}

}  // namespace qvg
