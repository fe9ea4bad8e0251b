// qvg/view.h — what a cache's update() shows: the views of the visible K/V.
//
// StridedView is a non-owning [B, T, H, D] view with channels contiguous; KVView is
// the result of CausalCache::update() (qvg/cache.h) and of the device caches
// (qvg/cuda_cache.h); ViewScratch is the memory behind copied views, owned by a
// cache or shared by several (CacheOptions::view_scratch). None of them owns the
// tokens it shows: how long a view lives is the cache's contract (qvg/cache.h).
// qvg/cache.h includes this header, so code that includes the cache sees these too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "qvg/tensor.h"

namespace qvg {

/// Non-owning read-only view of a [B, T, H, D] tensor whose channels (d) are
/// contiguous: element (b, t, h, d) is at
///   data + (b * stride_b + t * stride_t + h * stride_h + d) elements of `dtype`.
/// A dense tensor has stride_h = D, stride_t = H * D, stride_b = T * H * D.
struct StridedView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  Shape4 shape;          ///< [B, T, H, D]
  int64_t stride_b = 0;  ///< elements between batches
  int64_t stride_t = 0;  ///< elements between tokens
  int64_t stride_h = 0;  ///< elements between heads

  /// Pointer to element (b, t, h, 0). REQUIRES: indices inside shape.
  const void* row(int64_t b, int64_t t, int64_t h) const;
  /// Element (b, t, h, d) as fp32 (exact). REQUIRES: indices inside shape.
  float at(int64_t b, int64_t t, int64_t h, int64_t d) const;
  /// True when the strides are those of a dense [B, T, H, D] tensor.
  bool is_dense() const;
  /// A dense copy in the same dtype.
  Tensor to_tensor() const;
  /// A dense tensor seen as a strided view.
  static StridedView of(ConstTensorView v);
};

/// What update() returns (spec 3.1). The views k and v are valid until the next
/// mutating call (update() that succeeds, reset_indices(), set_indices()) on the
/// same cache, or the cache's destruction; a call that throws does not
/// invalidate them. They point either into the cache's resident storage
/// (zero_copy: no bytes were copied) or into a scratch buffer the cache owns.
struct KVView {
  StridedView k;  ///< [B, T, h_in, D]: the visible tokens in global order, heads [hs, hs + h_in)
  StridedView v;  ///< same shape and strides as k
  /// Where the written chunk lies: dense — its position in the cache's buffer;
  /// packed — its position in k/v, i.e. [T - n, T).
  int64_t local_start_index = 0;
  int64_t local_end_index = 0;
  int64_t visible_local_end = 0;   ///< tokens held in the buffer: min(global_end, cache_size)
  int64_t visible_global_end = 0;  ///< global_end after the call
  bool zero_copy = false;          ///< k/v alias resident storage (no copy, no decode)
};

/// Memory that backs copied views (dense two-range views, packed windows that
/// need decoding). Each cache owns one unless CacheOptions::view_scratch names a
/// shared one. Several caches — typically the layers of one model — may share a
/// ViewScratch: a copied view is then valid only until the next successful
/// mutating call on *any* cache sharing it (the usual pattern: layer i attends
/// before layer i+1 updates), and the model holds one window of view memory
/// instead of one per layer. Not thread-safe: caches sharing it are used from one
/// thread at a time.
class ViewScratch {
 public:
  size_t size() const { return buf_.size(); }  ///< bytes held now
  std::byte* data() { return buf_.data(); }
  const std::byte* data() const { return buf_.data(); }
  /// Makes the buffer exactly n bytes (content unspecified when it changes size).
  void resize(size_t n) {
    if (n != buf_.size()) buf_ = AlignedBuffer::uninitialized(n);
  }
  void release() { buf_ = AlignedBuffer(); }  ///< frees the memory (views into it die)
  /// The size a packed cache gives its view buffer when it holds `had` bytes and needs
  /// `need` (more): twice `had`, at most `limit` (the cache's window of K and V), at
  /// least `need`. A window that grows chunk by chunk is then allocated O(log) times,
  /// each page faulted in once per allocation rather than once per call. A packed cache
  /// keeps the buffer between calls and never shrinks it, except that an unshared one
  /// is freed by an advance that encodes (lower peak while encoding); a dense cache
  /// sizes it to each copied view (its copies, sink plus a wrapped tail, keep one size).
  static size_t grown_size(size_t had, size_t need, size_t limit) { return std::max(need, std::min(limit, 2 * had)); }

 private:
  AlignedBuffer buf_;
};

}  // namespace qvg
