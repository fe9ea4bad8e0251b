// Shared pieces of the two caches: argument validation (spec 5) and row copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "qvg/cache.h"
#include "qvg/tensor.h"

namespace qvg::detail {

/// Largest chunk start accepted: keeps c + n and the cursor arithmetic far
/// from int64 overflow.
inline constexpr int64_t kMaxPosition = int64_t(1) << 60;

/// The validated shape of one update() call.
struct CallArgs {
  int64_t n = 0;     ///< tokens in the chunk
  int64_t h_in = 0;  ///< heads written
  int64_t hs = 0;    ///< first head written
  int64_t c = 0;     ///< chunk start
  int64_t ce = 0;    ///< c + n
};

/// Everything of spec 5 that does not depend on the cache's cursors: rw,
/// dtypes, shapes, key/value agreement, n, head slice, c. Throws InvalidArgument.
/// Does not read the tensors' elements (see check_values).
CallArgs validate_call(const CacheOptions& opt, ConstTensorView key, ConstTensorView value, int64_t c,
                       std::optional<int64_t> hs, std::optional<int64_t> rw);

/// Finite and |x| <= 1e16 for key and value (spec 1); throws InvalidArgument.
void check_values(ConstTensorView key, ConstTensorView value);

/// Validates options common to both caches (sizes, sink, window) and that the
/// buffer sizes do not overflow. Throws InvalidArgument.
void validate_options(const CacheOptions& opt);

/// Copies the [B, n, h_in, D] rows of `src` (dense) to dst rows: element
/// (b, t, h, d) goes to dst + ((b * dst_batch_tokens + t0 + t) * dst_heads + hs + h) * D + d
/// (elements), i.e. into a dense [B, dst_batch_tokens, dst_heads, D] buffer at
/// token t0 and head hs.
void write_rows(ConstTensorView src, std::byte* dst, int64_t dst_batch_tokens, int64_t dst_heads, int64_t t0,
                int64_t hs);

/// Where write_rows_twice() puts a second copy: the same placement arguments.
struct RowsTarget {
  std::byte* dst;
  int64_t batch_tokens, heads, t0, hs;
};
/// write_rows() into two destinations, reading src once (each block of rows is
/// copied to the first and then, from cache, to the second).
void write_rows_twice(ConstTensorView src, const RowsTarget& a, const RowsTarget& b);

/// Copies tokens [t0, t1) of heads [hs, hs + h_out) from a dense
/// [B, src_tokens, src_heads, D] buffer into a dense [B, T_out, h_out, D]
/// buffer at token `out_t`.
void gather_rows(const std::byte* src, int64_t B, int64_t src_tokens, int64_t src_heads, int64_t D, size_t esz,
                 int64_t t0, int64_t t1, int64_t hs, int64_t h_out, std::byte* out, int64_t T_out, int64_t out_t);

/// A strided view of tokens [t0, t0 + T) and heads [hs, hs + h) of a dense
/// [B, tokens, heads, D] buffer.
StridedView sub_view(const void* base, DType dt, int64_t B, int64_t tokens, int64_t heads, int64_t D, int64_t t0,
                     int64_t T, int64_t hs, int64_t h);

/// A dense [B, T, h, D] view of a scratch buffer.
StridedView dense_view(const void* base, DType dt, int64_t B, int64_t T, int64_t h, int64_t D);

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
