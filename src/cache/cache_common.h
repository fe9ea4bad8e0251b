// src/cache/cache_common.h — pieces both caches (and the device cache) share:
// argument validation (spec 5), the row layout of cache buffers and views, and row
// copies between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "qvg/cache.h"
#include "qvg/tensor.h"

namespace qvg::detail {

/// Largest chunk start accepted: keeps start + n and the cursor arithmetic far
/// from int64 overflow.
inline constexpr int64_t kMaxPosition = int64_t(1) << 60;

/// The validated shape of one update() call.
struct CallArgs {
  int64_t n = 0;           ///< tokens in the chunk
  int64_t heads = 0;       ///< heads written (h_in)
  int64_t head_start = 0;  ///< first head written (cache_head_start, 0 when absent)
  int64_t start = 0;       ///< current_chunk_start: global position of the chunk's first token
  int64_t end = 0;         ///< start + n
};

/// Everything of spec 5 that does not depend on the cache's cursors:
/// recent_window_tokens, dtypes, shapes, key/value agreement, n, head slice, chunk
/// start. Throws InvalidArgument. Does not read the tensors' elements (check_values).
CallArgs validate_call(const CacheOptions& opt, ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                       std::optional<int64_t> head_start, std::optional<int64_t> recent_window);

/// Finite and |x| <= 1e16 for key and value (spec 1); throws InvalidArgument.
void check_values(ConstTensorView key, ConstTensorView value);

/// Size limits of a cache (spec 2/3 leave them open; docs/design.md states them):
/// batch, heads and head_dim at most 2^16 each, cache_size at most 2^40 tokens, and
/// the K and V of cache_size tokens at most 2^40 bytes (1 TiB) together.
inline constexpr int64_t kMaxBatch = int64_t(1) << 16;
inline constexpr int64_t kMaxHeads = int64_t(1) << 16;
inline constexpr int64_t kMaxHeadDim = int64_t(1) << 16;
inline constexpr int64_t kMaxCacheTokens = int64_t(1) << 40;
inline constexpr double kMaxCacheBytes = double(int64_t(1) << 40);

/// Validates options common to both caches (sizes within the limits above, sink,
/// window). Throws InvalidArgument naming the field, the value and the limit.
void validate_options(const CacheOptions& opt);

/// A byte range of memory a cache owns (a buffer, a raw segment, the view scratch).
struct ByteRange {
  const void* data = nullptr;
  size_t size = 0;
};

/// The input of one call, copied first when key or value overlaps memory the cache
/// owns (`owned`: what the call may move, overwrite or free before it has read its
/// input — e.g. a slice of the dense cache's own buffer, or the view an earlier call
/// returned). The call then reads the copies and behaves exactly as if it had been
/// given a clone (docs/design.md: a deliberate difference from the engine).
struct CallInput {
  ConstTensorView key, value;  ///< what the call reads: the arguments or the copies
  Tensor key_copy, value_copy; ///< empty unless copied
  size_t copied_bytes() const { return key_copy.nbytes() + value_copy.nbytes(); }
};
CallInput unaliased_input(ConstTensorView key, ConstTensorView value, const std::vector<ByteRange>& owned);

/// A dense [batch, tokens, heads, dim] buffer of `dtype` elements: a cache buffer,
/// a raw segment, a view buffer. `Byte` is std::byte or const std::byte.
template <class Byte>
struct BasicRows {
  Byte* data = nullptr;
  DType dtype = DType::F32;
  int64_t batch = 0, tokens = 0, heads = 0, dim = 0;

  size_t elem_size() const { return dtype_size(dtype); }
  size_t token_bytes() const { return size_t(heads * dim) * elem_size(); }
  /// Address of element (b, t, h, 0).
  Byte* row(int64_t b, int64_t t, int64_t h) const {
    return data + size_t(((b * tokens + t) * heads + h) * dim) * elem_size();
  }
  operator BasicRows<const std::byte>() const { return {data, dtype, batch, tokens, heads, dim}; }
};
using Rows = BasicRows<std::byte>;
using ConstRows = BasicRows<const std::byte>;

/// The rows of a cache with options `o` holding `tokens` tokens at `data`.
inline Rows rows_of(void* data, const CacheOptions& o, int64_t tokens) {
  return {static_cast<std::byte*>(data), o.dtype, o.batch, tokens, o.heads, o.head_dim};
}
inline ConstRows rows_of(const void* data, const CacheOptions& o, int64_t tokens) {
  return {static_cast<const std::byte*>(data), o.dtype, o.batch, tokens, o.heads, o.head_dim};
}

/// Where a chunk's rows go: token `token` and head `head` of `rows`.
struct RowsAt {
  Rows rows;
  int64_t token = 0, head = 0;
};

/// Copies the [B, n, h_in, D] rows of `src` (dense) into dst: element (b, t, h, d)
/// goes to dst.rows element (b, dst.token + t, dst.head + h, d).
/// REQUIRES matching B, D, dtype; the target range inside dst.rows.
void write_rows(ConstTensorView src, const RowsAt& dst);
/// write_rows() into two destinations, reading src once (each block of rows is
/// copied to the first and then, from cache, to the second).
void write_rows_twice(ConstTensorView src, const RowsAt& a, const RowsAt& b);

/// Copies tokens [t0, t1) of heads [head_start, head_start + out.rows.heads) of src
/// into out.rows at token out.token (out.head must be 0).
/// REQUIRES ranges inside both buffers, matching B, D, dtype; no overlap.
void gather_rows(ConstRows src, int64_t t0, int64_t t1, int64_t head_start, const RowsAt& out);

/// A strided view of tokens [t0, t0 + T) and heads [head_start, head_start + h) of `rows`.
StridedView sub_view(ConstRows rows, int64_t t0, int64_t T, int64_t head_start, int64_t h);
/// The whole of a dense buffer as a view.
StridedView dense_view(ConstRows rows);

/// A copy of n bytes at p (the caches' debug snapshots).
inline std::vector<uint8_t> bytes_copy(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return n ? std::vector<uint8_t>(b, b + n) : std::vector<uint8_t>();
}

/// Tracks the bytes a call holds beyond the resident state, and their peak.
class TransientMeter {
 public:
  void add(size_t n) {
    cur_ += n;
    if (cur_ > peak_) peak_ = cur_;
  }
  void sub(size_t n) { cur_ = n > cur_ ? 0 : cur_ - n; }
  size_t peak() const { return peak_; }

 private:
  size_t cur_ = 0, peak_ = 0;
};

}  // namespace qvg::detail
