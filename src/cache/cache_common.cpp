#include "cache/cache_common.h"

#include <algorithm>

#include <cstring>
#include <functional>
#include <limits>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg {

// ---- StridedView -------------------------------------------------------------
const void* StridedView::row(int64_t b, int64_t t, int64_t h) const {
  const int64_t off = b * stride_b + t * stride_t + h * stride_h;
  return static_cast<const std::byte*>(data) + size_t(off) * dtype_size(dtype);
}

float StridedView::at(int64_t b, int64_t t, int64_t h, int64_t d) const {
  return load_f32(row(b, t, h), dtype, size_t(d));
}

bool StridedView::is_dense() const {
  return stride_h == shape.d && stride_t == shape.h * shape.d && stride_b == shape.s * shape.h * shape.d;
}

Tensor StridedView::to_tensor() const {
  Tensor out(dtype, shape);
  const size_t esz = dtype_size(dtype);
  const size_t row_bytes = size_t(shape.d) * esz;
  auto* dst = static_cast<std::byte*>(out.data());
  for (int64_t b = 0; b < shape.b; ++b)
    for (int64_t t = 0; t < shape.s; ++t)
      for (int64_t h = 0; h < shape.h; ++h) {
        std::memcpy(dst, row(b, t, h), row_bytes);
        dst += row_bytes;
      }
  return out;
}

StridedView StridedView::of(ConstTensorView v) {
  return {v.data, v.dtype, v.shape, v.shape.s * v.shape.h * v.shape.d, v.shape.h * v.shape.d, v.shape.d};
}

// ---- check_update_shapes ------------------------------------------------------
void check_update_shapes(const CacheOptions& o, int64_t cache_size, DType key_dtype, Shape4 key, DType value_dtype,
                         Shape4 value, int64_t current_chunk_start, std::optional<int64_t> cache_head_start,
                         std::optional<int64_t> recent_window_tokens) {
  static const std::byte probe{};  // validate_call reads no element: any non-null address
  const detail::CallArgs a = detail::validate_call(o, {&probe, key_dtype, key}, {&probe, value_dtype, value},
                                                   current_chunk_start, cache_head_start, recent_window_tokens);
  if (!o.allow_growth && a.n > cache_size)
    throw OutOfRange(fmt::format("chunk of n = {} tokens is longer than the cache (cache_size = {})", a.n, cache_size));
  if (o.allow_growth && a.n > cache_size) {  // the grown cache holds at least n tokens: within the limits
    CacheOptions grown = o;
    grown.cache_size = a.n;
    grown.validate();
  }
}

// ---- CacheOptions -------------------------------------------------------------
void CacheOptions::validate() const { detail::validate_options(*this); }

namespace detail {

void validate_options(const CacheOptions& o) {
  if (o.batch < 1) throw InvalidArgument(fmt::format("batch must be >= 1, got {}", o.batch));
  if (o.cache_size < 1) throw InvalidArgument(fmt::format("cache_size must be >= 1, got {}", o.cache_size));
  if (o.heads < 1) throw InvalidArgument(fmt::format("num_heads must be >= 1, got {}", o.heads));
  if (o.head_dim < 1) throw InvalidArgument(fmt::format("head_dim must be >= 1, got {}", o.head_dim));
  if (o.sink_tokens < 0 || o.sink_tokens > o.cache_size)
    throw InvalidArgument(fmt::format("sink_tokens must be in [0, cache_size = {}], got {}", o.cache_size,
                                      o.sink_tokens));
  if (o.attention_window_size && (*o.attention_window_size < 1 || *o.attention_window_size > o.cache_size))
    throw InvalidArgument(fmt::format("attention_window_size must be in [1, cache_size = {}] or None, got {}",
                                      o.cache_size, *o.attention_window_size));
  if (o.head_offset < 0 || o.head_offset > (int64_t(1) << 40))
    throw InvalidArgument(fmt::format("head_offset must be in [0, 2^40], got {}", o.head_offset));
  auto at_most = [](const char* what, int64_t v, int64_t limit, const char* limit_text) {
    if (v > limit) throw InvalidArgument(fmt::format("{} must be at most {} ({}), got {}", what, limit, limit_text, v));
  };
  at_most("batch", o.batch, kMaxBatch, "2^16");
  at_most("num_heads", o.heads, kMaxHeads, "2^16");
  at_most("head_dim", o.head_dim, kMaxHeadDim, "2^16");
  at_most("cache_size", o.cache_size, kMaxCacheTokens, "2^40 tokens");
  const double bytes =
      2.0 * double(o.batch) * double(o.cache_size) * double(o.heads) * double(o.head_dim) * double(dtype_size(o.dtype));
  if (bytes > kMaxCacheBytes)
    throw InvalidArgument(fmt::format(
        "cache of batch={} cache_size={} num_heads={} head_dim={} {} is too large: its K and V would take {:.4g} "
        "bytes, at most 2^40 (1 TiB) are allowed",
        o.batch, o.cache_size, o.heads, o.head_dim, dtype_name(o.dtype), bytes));
}

CallInput unaliased_input(ConstTensorView key, ConstTensorView value, const std::vector<ByteRange>& owned) {
  auto overlaps = [&](ConstTensorView t) {
    const auto* lo = static_cast<const std::byte*>(t.data);
    const auto* hi = lo + t.nbytes();
    for (const ByteRange& r : owned) {
      const auto* rlo = static_cast<const std::byte*>(r.data);
      if (r.size > 0 && rlo != nullptr && std::less<>()(lo, rlo + r.size) && std::less<>()(rlo, hi)) return true;
    }
    return false;
  };
  CallInput in;
  in.key = key;
  in.value = value;
  if (overlaps(key) || overlaps(value)) {
    in.key_copy = Tensor::copy_of(key);
    in.value_copy = Tensor::copy_of(value);
    in.key = in.key_copy.view();
    in.value = in.value_copy.view();
  }
  return in;
}

CallArgs validate_call(const CacheOptions& o, ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                       std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
  if (recent_window && *recent_window < 0)
    throw InvalidArgument(fmt::format("recent_window_tokens must be >= 0 or None, got {}", *recent_window));
  const Shape4 ks = key.shape;
  if (key.dtype != o.dtype)
    throw InvalidArgument(
        fmt::format("key dtype must be the cache dtype {}, got {}", dtype_name(o.dtype), dtype_name(key.dtype)));
  if (value.dtype != key.dtype)
    throw InvalidArgument(fmt::format("value dtype must equal key dtype {}, got {}", dtype_name(key.dtype),
                                      dtype_name(value.dtype)));
  if (ks.b != o.batch)
    throw InvalidArgument(fmt::format("key batch (dim 0 of [B, n, h, D]) must be the cache batch {}, got {} (key shape {})",
                                      o.batch, ks.b, ks.str()));
  if (ks.d != o.head_dim)
    throw InvalidArgument(fmt::format("key head_dim (dim 3 of [B, n, h, D]) must be {}, got {} (key shape {})",
                                      o.head_dim, ks.d, ks.str()));
  if (ks.h < 1 || ks.h > o.heads)
    throw InvalidArgument(fmt::format("key heads (dim 2 of [B, n, h, D]) must be in 1..{}, got {} (key shape {})",
                                      o.heads, ks.h, ks.str()));
  if (ks.s < 1)
    throw InvalidArgument(fmt::format("key tokens n (dim 1 of [B, n, h, D]) must be >= 1, got {} (key shape {})",
                                      ks.s, ks.str()));
  if (!(value.shape == ks))
    throw InvalidArgument(fmt::format("value shape must equal key shape {}, got {}", ks.str(), value.shape.str()));
  if (key.data == nullptr || value.data == nullptr)
    throw InvalidArgument(fmt::format("key and value data must not be null, got key={} value={}",
                                      key.data ? "non-null" : "null", value.data ? "non-null" : "null"));
  CallArgs a;
  a.n = ks.s;
  a.heads = ks.h;
  if (ks.h != o.heads && !head_start)
    throw InvalidArgument(fmt::format(
        "cache_head_start is required when key has {} of the cache's {} heads (head slice), got None", ks.h,
        o.heads));
  a.head_start = head_start.value_or(0);
  if (a.head_start < 0 || a.head_start > o.heads - ks.h)
    throw InvalidArgument(fmt::format(
        "cache_head_start must be in [0, {}] so that heads [cache_head_start, cache_head_start + {}) lie in [0, {}), "
        "got {}",
        o.heads - ks.h, ks.h, o.heads, a.head_start));
  if (chunk_start < 0 || chunk_start > kMaxPosition)
    throw InvalidArgument(fmt::format("current_chunk_start must be in [0, 2^60], got {}", chunk_start));
  a.start = chunk_start;
  a.end = chunk_start + a.n;
  return a;
}

void check_values(ConstTensorView key, ConstTensorView value) {
  check_finite_and_bounded(key, "key");
  check_finite_and_bounded(value, "value");
}

namespace {

// Copies `rows` rows of `row_bytes` from src (rows src_stride bytes apart) to dst
// (dst_stride apart). Contiguous runs become one memcpy; large copies are split
// over the OpenMP threads (one thread's memcpy does not reach the machine's copy
// bandwidth). REQUIRES non-overlapping ranges.
void copy_rows(std::byte* dst, size_t dst_stride, const std::byte* src, size_t src_stride, int64_t rows,
               size_t row_bytes) {
  if (rows <= 0 || row_bytes == 0) return;
  const size_t total = size_t(rows) * row_bytes;
  constexpr size_t kParallelBytes = size_t(4) << 20;
  if (dst_stride == row_bytes && src_stride == row_bytes) {
    constexpr size_t kChunk = size_t(1) << 20;
    const int64_t chunks = int64_t((total + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (total >= kParallelBytes)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t lo = size_t(c) * kChunk, len = std::min(kChunk, total - lo);
      std::memcpy(dst + lo, src + lo, len);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (total >= kParallelBytes)
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + size_t(r) * dst_stride, src + size_t(r) * src_stride, row_bytes);
}

}  // namespace

void write_rows(ConstTensorView src, const RowsAt& dst) {
  const int64_t B = src.shape.b, n = src.shape.s, h = src.shape.h, D = src.shape.d;
  const size_t esz = dtype_size(src.dtype);
  const size_t bytes = size_t(h * D) * esz;
  const auto* s = static_cast<const std::byte*>(src.data);
  for (int64_t b = 0; b < B; ++b)
    copy_rows(dst.rows.row(b, dst.token, dst.head), dst.rows.token_bytes(), s + size_t(b * n * h * D) * esz, bytes, n,
              bytes);
}

void write_rows_twice(ConstTensorView src, const RowsAt& x, const RowsAt& y) {
  const int64_t B = src.shape.b, n = src.shape.s, h = src.shape.h, D = src.shape.d;
  const size_t esz = dtype_size(src.dtype), row = size_t(h * D) * esz;
  const auto* s = static_cast<const std::byte*>(src.data);
  // Blocks of rows small enough to stay in L2 between the two copies.
  const int64_t rows_per_block = std::max<int64_t>(1, int64_t((size_t(128) << 10) / row));
  const int64_t blocks_per_batch = (n + rows_per_block - 1) / rows_per_block;
  const int64_t blocks = B * blocks_per_batch;
  const bool par = size_t(B * n) * row >= (size_t(4) << 20);
#pragma omp parallel for schedule(dynamic, 4) if (par)
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t b = i / blocks_per_batch, r0 = (i % blocks_per_batch) * rows_per_block;
    const int64_t r1 = std::min(n, r0 + rows_per_block);
    for (const RowsAt* t : {&x, &y}) {
      std::byte* d = t->rows.row(b, t->token + r0, t->head);
      const std::byte* p = s + size_t((b * n + r0) * h * D) * esz;
      const size_t dstride = t->rows.token_bytes();
      if (dstride == row) {
        std::memcpy(d, p, size_t(r1 - r0) * row);
      } else {
        for (int64_t r = r0; r < r1; ++r, d += dstride, p += row) std::memcpy(d, p, row);
      }
    }
  }
}

void gather_rows(ConstRows src, int64_t t0, int64_t t1, int64_t head_start, const RowsAt& out) {
  QVG_CHECK(out.head == 0);
  const size_t bytes = out.rows.token_bytes();
  for (int64_t b = 0; b < src.batch; ++b)
    copy_rows(out.rows.row(b, out.token, 0), bytes, src.row(b, t0, head_start), src.token_bytes(), t1 - t0, bytes);
}

StridedView sub_view(ConstRows rows, int64_t t0, int64_t T, int64_t head_start, int64_t h) {
  StridedView v;
  v.dtype = rows.dtype;
  v.shape = {rows.batch, T, h, rows.dim};
  v.stride_h = rows.dim;
  v.stride_t = rows.heads * rows.dim;
  v.stride_b = rows.tokens * rows.heads * rows.dim;
  v.data = rows.row(0, t0, head_start);
  return v;
}

StridedView dense_view(ConstRows rows) { return sub_view(rows, 0, rows.tokens, 0, rows.heads); }

}  // namespace detail
}  // namespace qvg
