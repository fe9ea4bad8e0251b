// qvg/attention.h — reference attention over a cache view.
//
// out[b, i, h, :] = softmax_j(q[b, i, h, :] . k[b, j, h, :] * (1 / sqrt(D))) v[b, j, h, :]
// for the n queries of the current chunk over all T tokens of the view (every
// view token is visible: the view already is the causal window). fp32
// arithmetic throughout: K and V are converted exactly to fp32, dot products
// and weighted sums accumulate in fp32 in token order, the softmax subtracts
// the row maximum before exp. It is the yardstick for quality (packed vs dense
// views) and for faster attention kernels; it favours being simple and exact
// over being fast. Work is split over (b, h) pairs with OpenMP; the result does
// not depend on the thread count.
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
