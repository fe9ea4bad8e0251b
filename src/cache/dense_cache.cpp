// DenseCausalCache (spec 3.2). Every update() first builds a Plan — a pure
// function of the arguments and the cursors that throws on any error — and
// only then touches state.
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "qvg/cache.h"
#include "qvg/error.h"

namespace qvg {

struct DenseCausalCache::Impl {
  const CacheOptions opt;  // batch, heads, head_dim, dtype, sink, growth: fixed
  const size_t esz;
  int64_t cap = 0;     // current cache_size
  int64_t window = 0;  // current window
  AlignedBuffer own_k, own_v;
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  bool owns = true;
  int64_t ge = 0, le = 0;
  std::shared_ptr<ViewScratch> scratch;  // K then V of the last copied view (maybe shared)
  size_t peak_transient = 0;

  explicit Impl(const CacheOptions& o)
      : opt(o),
        esz(dtype_size(o.dtype)),
        cap(o.cache_size),
        window(o.window()),
        scratch(o.view_scratch ? o.view_scratch : std::make_shared<ViewScratch>()) {}

  size_t buffer_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }
  size_t token_bytes() const { return size_t(opt.heads * opt.head_dim) * esz; }

  struct Plan {
    detail::CallArgs a;
    bool rewrite = false;
    int64_t new_cap = 0, new_window = 0;  // after growth (== cap, window without)
    int64_t evicted = 0, rolled = 0;       // eviction roll (advance without growth)
    int64_t ls = 0;                         // chunk's buffer index
    int64_t new_ge = 0, new_le = 0;
    // View: buffer ranges [r0, r1) ++ [r2, r3) (second may be empty).
    int64_t r0 = 0, r1 = 0, r2 = 0, r3 = 0;
  };

  Plan plan(ConstTensorView key, ConstTensorView value, int64_t c, std::optional<int64_t> hs,
            std::optional<int64_t> rw) const {
    Plan p;
    p.a = detail::validate_call(opt, key, value, c, hs, rw);
    const int64_t n = p.a.n, ce = p.a.ce, sink = opt.sink_tokens;
    if (!opt.allow_growth && n > cap)
      throw OutOfRange(fmt::format("chunk of n = {} tokens is longer than the cache (cache_size = {})", n, cap));
    p.new_cap = cap;
    p.new_window = window;
    const int64_t shift = ge - le;
    if (ce <= ge) {  // rewrite
      p.rewrite = true;
      p.ls = c - shift;
      if (p.ls < 0)
        throw OutOfRange(fmt::format(
            "rewrite of evicted positions: current_chunk_start = {} maps to buffer index {} < 0 "
            "(global_end = {}, local_end = {}, {} tokens evicted); only chunks still in the buffer can be rewritten",
            c, p.ls, ge, le, shift));
      const int64_t sink_end = std::min(sink, le);
      if (shift > 0 && p.ls < sink_end)
        throw OutOfRange(fmt::format(
            "rewrite of evicted positions: current_chunk_start = {} maps to buffer index {} inside the sink slots "
            "[0, {}) after {} tokens were evicted (global_end = {}, local_end = {}); only chunks at buffer index >= {} "
            "can be rewritten",
            c, p.ls, sink_end, shift, ge, le, sink_end));
      p.new_ge = ge;
      p.new_le = le;
    } else {  // advance
      const int64_t appended = ce - ge;
      const int64_t needed = le + appended;
      int64_t end;
      if (needed > cap) {
        if (opt.allow_growth) {
          p.new_cap = std::max(needed, 2 * cap);
          if (window == cap) p.new_window = p.new_cap;
          end = needed;
        } else {
          const int64_t sink_end = std::min(sink, le);
          if (cap - n < sink_end)
            throw OutOfRange(fmt::format(
                "chunk [{}, {}) would overwrite sink tokens: after eviction it is placed at buffer [{}, {}), which "
                "overlaps the {} sink tokens at [0, {}) (cache_size = {}, n = {}); chunks may be at most "
                "cache_size - sink = {} tokens here",
                c, ce, cap - n, cap, sink_end, sink_end, cap, n, cap - sink_end));
          p.evicted = needed - cap;
          p.rolled = std::max<int64_t>(0, le - p.evicted - sink);
          end = cap;
        }
      } else {
        end = needed;
      }
      p.ls = end - n;
      if (p.ls < 0)  // only reachable with cursors set inconsistently from outside
        throw OutOfRange(fmt::format(
            "chunk [{}, {}) cannot be placed: it would start at buffer index {} (global_end = {}, local_end = {})", c,
            ce, p.ls, ge, le));
      p.new_ge = ce;
      p.new_le = end;
    }
    if (n > p.new_window)
      throw OutOfRange(fmt::format(
          "chunk of n = {} tokens is longer than the attention window (attention_window_size = {}); the current "
          "chunk must be entirely visible",
          n, p.new_window));
    // View ranges.
    const int64_t le2 = p.new_le;
    if (!rw) {
      p.r0 = std::max<int64_t>(0, le2 - p.new_window);
      p.r1 = le2;
    } else {
      const int64_t sink_end = std::min(sink, le2);
      const int64_t start = std::max(sink_end, p.ls - *rw);
      if (start <= sink_end) {
        p.r0 = 0;
        p.r1 = le2;
      } else {
        p.r0 = 0;
        p.r1 = sink_end;
        p.r2 = start;
        p.r3 = le2;
      }
    }
    if (p.r0 == p.r1) {  // a single range
      p.r0 = p.r2;
      p.r1 = p.r3;
      p.r2 = p.r3 = 0;
    }
    detail::check_values(key, value);
    return p;
  }

  KVView apply(const Plan& p, ConstTensorView key, ConstTensorView value) {
    detail::TransientMeter meter;
    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim;
    const int64_t T = (p.r1 - p.r0) + (p.r3 - p.r2);
    const bool copy = p.r3 > p.r2;
    const size_t view_bytes = copy ? 2 * size_t(B * T * p.a.h_in * D) * esz : 0;
    if (scratch->size() != view_bytes || p.new_cap != cap) scratch->release();  // release before growth
    if (p.new_cap != cap) {
      AlignedBuffer nk(buffer_bytes(p.new_cap)), nv(buffer_bytes(p.new_cap));
      const size_t old_bytes = 2 * buffer_bytes(cap);
      meter.add(old_bytes);  // old buffers held while copying into the new ones
      const size_t old_b = buffer_bytes(cap) / size_t(B), new_b = buffer_bytes(p.new_cap) / size_t(B);
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(nk.data() + size_t(b) * new_b, k + size_t(b) * old_b, old_b);
        std::memcpy(nv.data() + size_t(b) * new_b, v + size_t(b) * old_b, old_b);
      }
      own_k = std::move(nk);
      own_v = std::move(nv);
      k = own_k.data();
      v = own_v.data();
      owns = true;
      meter.sub(old_bytes);
      cap = p.new_cap;
      window = p.new_window;
    }
    if (p.rolled > 0) {
      const size_t tb = token_bytes(), bb = size_t(cap) * tb;
      const int64_t sink = opt.sink_tokens;
      for (int64_t b = 0; b < B; ++b) {
        std::memmove(k + size_t(b) * bb + size_t(sink) * tb, k + size_t(b) * bb + size_t(sink + p.evicted) * tb,
                     size_t(p.rolled) * tb);
        std::memmove(v + size_t(b) * bb + size_t(sink) * tb, v + size_t(b) * bb + size_t(sink + p.evicted) * tb,
                     size_t(p.rolled) * tb);
      }
    }
    detail::write_rows(key, k, cap, H, p.ls, p.a.hs);
    detail::write_rows(value, v, cap, H, p.ls, p.a.hs);
    ge = p.new_ge;
    le = p.new_le;

    KVView out;
    if (!copy) {
      out.k = detail::sub_view(k, opt.dtype, B, cap, H, D, p.r0, T, p.a.hs, p.a.h_in);
      out.v = detail::sub_view(v, opt.dtype, B, cap, H, D, p.r0, T, p.a.hs, p.a.h_in);
      out.zero_copy = true;
    } else {
      if (scratch->size() != view_bytes) scratch->resize(view_bytes);
      meter.add(view_bytes);
      std::byte* sk = scratch->data();
      std::byte* sv = scratch->data() + view_bytes / 2;
      const int64_t len0 = p.r1 - p.r0;
      detail::gather_rows(k, B, cap, H, D, esz, p.r0, p.r1, p.a.hs, p.a.h_in, sk, T, 0);
      detail::gather_rows(k, B, cap, H, D, esz, p.r2, p.r3, p.a.hs, p.a.h_in, sk, T, len0);
      detail::gather_rows(v, B, cap, H, D, esz, p.r0, p.r1, p.a.hs, p.a.h_in, sv, T, 0);
      detail::gather_rows(v, B, cap, H, D, esz, p.r2, p.r3, p.a.hs, p.a.h_in, sv, T, len0);
      out.k = detail::dense_view(sk, opt.dtype, B, T, p.a.h_in, D);
      out.v = detail::dense_view(sv, opt.dtype, B, T, p.a.h_in, D);
    }
    out.local_start_index = p.ls;
    out.local_end_index = p.ls + p.a.n;
    out.visible_local_end = le;
    out.visible_global_end = ge;
    peak_transient = meter.peak();
    return out;
  }
};

DenseCausalCache::DenseCausalCache(const CacheOptions& options) {
  detail::validate_options(options);
  impl_ = std::make_unique<Impl>(options);
  impl_->own_k = AlignedBuffer(impl_->buffer_bytes(impl_->cap));
  impl_->own_v = AlignedBuffer(impl_->buffer_bytes(impl_->cap));
  impl_->k = impl_->own_k.data();
  impl_->v = impl_->own_v.data();
}

DenseCausalCache::DenseCausalCache(const CacheOptions& options, ExternalStorage storage) {
  detail::validate_options(options);
  if (storage.k == nullptr || storage.v == nullptr)
    throw InvalidArgument(fmt::format("external K and V storage must not be null, got k={} v={}",
                                      storage.k ? "non-null" : "null", storage.v ? "non-null" : "null"));
  impl_ = std::make_unique<Impl>(options);
  impl_->k = static_cast<std::byte*>(storage.k);
  impl_->v = static_cast<std::byte*>(storage.v);
  impl_->owns = false;
}

DenseCausalCache::~DenseCausalCache() = default;
DenseCausalCache::DenseCausalCache(DenseCausalCache&&) noexcept = default;
DenseCausalCache& DenseCausalCache::operator=(DenseCausalCache&&) noexcept = default;

KVView DenseCausalCache::do_update(ConstTensorView key, ConstTensorView value, int64_t c, std::optional<int64_t> hs,
                                   std::optional<int64_t> rw) {
  const Impl::Plan p = impl_->plan(key, value, c, hs, rw);
  return impl_->apply(p, key, value);
}

void DenseCausalCache::reset_indices() {
  impl_->ge = 0;
  impl_->le = 0;
  impl_->scratch->release();
  impl_->peak_transient = 0;
}

void DenseCausalCache::set_indices(int64_t global_end, int64_t local_end) {
  const int64_t cap = impl_->cap;
  if (local_end < 0 || local_end > cap)
    throw InvalidArgument(fmt::format("local_end must be in [0, cache_size = {}], got {}", cap, local_end));
  if (global_end < local_end || global_end > detail::kMaxPosition)
    throw InvalidArgument(
        fmt::format("global_end must be in [local_end = {}, 2^60], got {}", local_end, global_end));
  if (global_end != local_end && local_end != cap)
    throw InvalidArgument(fmt::format(
        "global_end must equal local_end = {} unless local_end == cache_size = {} (evictions happen only from a "
        "full buffer), got global_end = {}",
        local_end, cap, global_end));
  impl_->ge = global_end;
  impl_->le = local_end;
  impl_->scratch->release();
}

size_t DenseCausalCache::resident_nbytes() const { return 2 * impl_->buffer_bytes(impl_->cap); }
size_t DenseCausalCache::peak_transient_nbytes() const { return impl_->peak_transient; }
int64_t DenseCausalCache::global_end() const { return impl_->ge; }
int64_t DenseCausalCache::local_end() const { return impl_->le; }
int64_t DenseCausalCache::cache_size() const { return impl_->cap; }
int64_t DenseCausalCache::attention_window_size() const { return impl_->window; }
int64_t DenseCausalCache::sink_tokens() const { return impl_->opt.sink_tokens; }
int64_t DenseCausalCache::batch() const { return impl_->opt.batch; }
int64_t DenseCausalCache::num_heads() const { return impl_->opt.heads; }
int64_t DenseCausalCache::head_dim() const { return impl_->opt.head_dim; }
DType DenseCausalCache::dtype() const { return impl_->opt.dtype; }
bool DenseCausalCache::allow_growth() const { return impl_->opt.allow_growth; }
bool DenseCausalCache::owns_storage() const { return impl_->owns; }

ConstTensorView DenseCausalCache::k_buffer() const {
  return {impl_->k, impl_->opt.dtype, {impl_->opt.batch, impl_->cap, impl_->opt.heads, impl_->opt.head_dim}};
}
ConstTensorView DenseCausalCache::v_buffer() const {
  return {impl_->v, impl_->opt.dtype, {impl_->opt.batch, impl_->cap, impl_->opt.heads, impl_->opt.head_dim}};
}

DenseCausalCache::DebugState DenseCausalCache::debug_state() const {
  DebugState s;
  const size_t n = impl_->buffer_bytes(impl_->cap);
  const auto* kb = reinterpret_cast<const uint8_t*>(impl_->k);
  const auto* vb = reinterpret_cast<const uint8_t*>(impl_->v);
  s.k.assign(kb, kb + n);
  s.v.assign(vb, vb + n);
  s.cache_size = impl_->cap;
  s.window = impl_->window;
  s.global_end = impl_->ge;
  s.local_end = impl_->le;
  s.resident_nbytes = resident_nbytes();
  s.peak_transient_nbytes = impl_->peak_transient;
  const auto* sb = reinterpret_cast<const uint8_t*>(impl_->scratch->data());
  s.view_scratch.assign(sb, sb + impl_->scratch->size());
  s.owns_storage = impl_->owns;
  return s;
}

}  // namespace qvg
