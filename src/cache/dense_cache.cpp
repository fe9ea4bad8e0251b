// DenseCausalCache (spec 3.2). Every update() first builds a DensePlan — a pure
// function of the arguments and the cursors that throws on any error
// (plan_dense_update, also the device dense cache's) — and only then touches state.
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/dense_plan.h"
#include "cache/snapshot_state.h"
#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"

namespace qvg {

namespace detail {

DensePlan plan_dense_update(const CacheOptions& opt, const DenseState& st, ConstTensorView key, ConstTensorView value,
                            int64_t chunk_start, std::optional<int64_t> head_start,
                            std::optional<int64_t> recent_window) {
  const int64_t capacity = st.capacity, window = st.window, global_end = st.global_end, local_end = st.local_end;
  DensePlan p;
  p.call = validate_call(opt, key, value, chunk_start, head_start, recent_window);
  const int64_t n = p.call.n, start = p.call.start, end = p.call.end, sink = opt.sink_tokens;
  if (!opt.allow_growth && n > capacity)
    throw OutOfRange(fmt::format("chunk of n = {} tokens is longer than the cache (cache_size = {})", n, capacity));
  p.new_capacity = capacity;
  p.new_window = window;
  const int64_t evicted_so_far = global_end - local_end;
  if (end <= global_end) {  // rewrite
    p.rewrite = true;
    p.chunk_at = start - evicted_so_far;
    if (p.chunk_at < 0)
      throw OutOfRange(fmt::format(
          "rewrite of evicted positions: current_chunk_start = {} maps to buffer index {} < 0 "
          "(global_end = {}, local_end = {}, {} tokens evicted); only chunks still in the buffer can be rewritten",
          start, p.chunk_at, global_end, local_end, evicted_so_far));
    const int64_t sink_end = std::min(sink, local_end);
    if (evicted_so_far > 0 && p.chunk_at < sink_end)
      throw OutOfRange(fmt::format(
          "rewrite of evicted positions: current_chunk_start = {} maps to buffer index {} inside the sink slots "
          "[0, {}) after {} tokens were evicted (global_end = {}, local_end = {}); only chunks at buffer index >= {} "
          "can be rewritten",
          start, p.chunk_at, sink_end, evicted_so_far, global_end, local_end, sink_end));
    p.new_global_end = global_end;
    p.new_local_end = local_end;
  } else {  // advance
    const int64_t appended = end - global_end;
    const int64_t needed = local_end + appended;
    int64_t chunk_end;
    if (needed > capacity) {
      if (opt.allow_growth) {
        p.new_capacity = std::max(needed, 2 * capacity);
        if (window == capacity) p.new_window = p.new_capacity;
        CacheOptions grown = opt;  // the grown sizes must stay within the limits
        grown.cache_size = p.new_capacity;
        grown.attention_window_size = p.new_window;
        validate_options(grown);
        chunk_end = needed;
      } else {
        const int64_t sink_end = std::min(sink, local_end);
        if (capacity - n < sink_end)
          throw OutOfRange(fmt::format(
              "chunk [{}, {}) would overwrite sink tokens: after eviction it is placed at buffer [{}, {}), which "
              "overlaps the {} sink tokens at [0, {}) (cache_size = {}, n = {}); chunks may be at most "
              "cache_size - sink = {} tokens here",
              start, end, capacity - n, capacity, sink_end, sink_end, capacity, n, capacity - sink_end));
        p.evicted = needed - capacity;
        p.rolled = std::max<int64_t>(0, local_end - p.evicted - sink);
        chunk_end = capacity;
      }
    } else {
      chunk_end = needed;
    }
    p.chunk_at = chunk_end - n;
    if (p.chunk_at < 0)  // only reachable with cursors set inconsistently from outside
      throw OutOfRange(fmt::format(
          "chunk [{}, {}) cannot be placed: it would start at buffer index {} (global_end = {}, local_end = {})", start,
          end, p.chunk_at, global_end, local_end));
    p.new_global_end = end;
    p.new_local_end = chunk_end;
  }
  if (n > p.new_window)
    throw OutOfRange(fmt::format(
        "chunk of n = {} tokens is longer than the attention window (attention_window_size = {}); the current "
        "chunk must be entirely visible",
        n, p.new_window));
  // View ranges.
  const int64_t held = p.new_local_end;
  if (!recent_window) {
    p.first = {std::max<int64_t>(0, held - p.new_window), held};
  } else {
    const int64_t sink_end = std::min(sink, held);
    const int64_t recent_from = std::max(sink_end, p.chunk_at - *recent_window);
    if (recent_from <= sink_end) {
      p.first = {0, held};
    } else {
      p.first = {0, sink_end};
      p.second = {recent_from, held};
    }
  }
  if (p.first.size() == 0) {  // a single range
    p.first = p.second;
    p.second = {};
  }
  return p;
}

void check_dense_indices(int64_t cap, int64_t global_end, int64_t local_end) {
  if (local_end < 0 || local_end > cap)
    throw InvalidArgument(fmt::format("local_end must be in [0, cache_size = {}], got {}", cap, local_end));
  if (global_end < local_end || global_end > kMaxPosition)
    throw InvalidArgument(fmt::format("global_end must be in [local_end = {}, 2^60], got {}", local_end, global_end));
  if (global_end != local_end && local_end != cap)
    throw InvalidArgument(fmt::format(
        "global_end must equal local_end = {} unless local_end == cache_size = {} (evictions happen only from a "
        "full buffer), got global_end = {}",
        local_end, cap, global_end));
}

}  // namespace detail

struct DenseCausalCache::Impl {
  const CacheOptions opt;  // batch, heads, head_dim, dtype, sink, growth: fixed
  const size_t esz;
  int64_t capacity = 0;  // current cache_size
  int64_t window = 0;    // current window
  AlignedBuffer own_k, own_v;
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  bool owns = true;
  GrowStorage grow;  // caller storage for growth (may be empty)
  int64_t global_end = 0, local_end = 0;
  std::shared_ptr<ViewScratch> scratch;  // K then V of the last copied view (maybe shared)
  size_t peak_transient = 0;

  explicit Impl(const CacheOptions& o)
      : opt(o),
        esz(dtype_size(o.dtype)),
        capacity(o.cache_size),
        window(o.window()),
        scratch(o.view_scratch ? o.view_scratch : std::make_shared<ViewScratch>()) {}

  size_t buffer_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }

  /// The buffers become caller storage from `storage` (called once with the current
  /// capacity; it serves later growth too), as a load's and a fork's: InvalidArgument
  /// for null storage. Their content is the caller's to fill.
  void adopt_caller_storage(GrowStorage storage) {
    const ExternalStorage s = storage(capacity);
    if (s.k == nullptr || s.v == nullptr)
      throw InvalidArgument(fmt::format("storage must return non-null K and V storage for cache_size {}", capacity));
    k = static_cast<std::byte*>(s.k);
    v = static_cast<std::byte*>(s.v);
    owns = false;
    grow = std::move(storage);
  }
  size_t token_bytes() const { return size_t(opt.heads * opt.head_dim) * esz; }
  detail::Rows k_rows() const { return detail::rows_of(static_cast<void*>(k), opt, capacity); }
  detail::Rows v_rows() const { return detail::rows_of(static_cast<void*>(v), opt, capacity); }

  using Plan = detail::DensePlan;

  Plan plan(ConstTensorView key, ConstTensorView value, int64_t chunk_start, std::optional<int64_t> head_start,
            std::optional<int64_t> recent_window) const {
    Plan p = detail::plan_dense_update(opt, {capacity, window, global_end, local_end}, key, value, chunk_start,
                                       head_start, recent_window);
    detail::check_values(key, value);
    return p;
  }

  /// The new buffers of a growth: the caller's (GrowStorage) or owned ones. The
  /// only step of apply() that can fail; nothing has changed when it throws.
  struct Grown {
    AlignedBuffer own_k, own_v;
    std::byte* k = nullptr;
    std::byte* v = nullptr;
  };
  Grown allocate_grown(int64_t new_capacity) const {
    Grown g;
    if (grow) {
      const ExternalStorage s = grow(new_capacity);
      if (s.k == nullptr || s.v == nullptr)
        throw InvalidArgument(
            fmt::format("GrowStorage must return non-null K and V storage for cache_size {}", new_capacity));
      g.k = static_cast<std::byte*>(s.k);
      g.v = static_cast<std::byte*>(s.v);
    } else {
      g.own_k = AlignedBuffer(buffer_bytes(new_capacity));
      g.own_v = AlignedBuffer(buffer_bytes(new_capacity));
      g.k = g.own_k.data();
      g.v = g.own_v.data();
    }
    return g;
  }

  /// `held`: bytes the call already holds (copies of an aliased input).
  KVView apply(const Plan& p, ConstTensorView key, ConstTensorView value, size_t held) {
    detail::TransientMeter meter;
    meter.add(held);
    const int64_t B = opt.batch, h_in = p.call.heads;
    const bool growing = p.new_capacity != capacity;
    Grown grown;
    if (growing) grown = allocate_grown(p.new_capacity);
    // --- from here on state changes; nothing can fail ---
    const int64_t T = p.view_tokens();
    const bool copy = p.second.size() > 0;
    const size_t view_bytes = copy ? 2 * size_t(B * T * h_in * opt.head_dim) * esz : 0;
    if (scratch->size() != view_bytes || growing) scratch->release();  // release before growth
    if (growing) {
      const size_t old_bytes = 2 * buffer_bytes(capacity);
      meter.add(old_bytes);  // old buffers held while copying into the new ones
      const size_t old_b = buffer_bytes(capacity) / size_t(B), new_b = buffer_bytes(p.new_capacity) / size_t(B);
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(grown.k + size_t(b) * new_b, k + size_t(b) * old_b, old_b);
        std::memcpy(grown.v + size_t(b) * new_b, v + size_t(b) * old_b, old_b);
      }
      owns = !grow;
      own_k = std::move(grown.own_k);
      own_v = std::move(grown.own_v);
      k = grown.k;
      v = grown.v;
      meter.sub(old_bytes);
      capacity = p.new_capacity;
      window = p.new_window;
    }
    if (p.rolled > 0) {
      const size_t tb = token_bytes(), bb = size_t(capacity) * tb;
      const int64_t sink = opt.sink_tokens;
      for (int64_t b = 0; b < B; ++b) {
        std::memmove(k + size_t(b) * bb + size_t(sink) * tb, k + size_t(b) * bb + size_t(sink + p.evicted) * tb,
                     size_t(p.rolled) * tb);
        std::memmove(v + size_t(b) * bb + size_t(sink) * tb, v + size_t(b) * bb + size_t(sink + p.evicted) * tb,
                     size_t(p.rolled) * tb);
      }
    }
    detail::write_rows(key, {k_rows(), p.chunk_at, p.call.head_start});
    detail::write_rows(value, {v_rows(), p.chunk_at, p.call.head_start});
    global_end = p.new_global_end;
    local_end = p.new_local_end;

    KVView out;
    if (!copy) {
      out.k = detail::sub_view(k_rows(), p.first.begin, T, p.call.head_start, h_in);
      out.v = detail::sub_view(v_rows(), p.first.begin, T, p.call.head_start, h_in);
      out.zero_copy = true;
    } else {
      if (scratch->size() != view_bytes) scratch->resize(view_bytes);
      meter.add(view_bytes);
      const detail::Rows vk{scratch->data(), opt.dtype, B, T, h_in, opt.head_dim};
      const detail::Rows vv{scratch->data() + view_bytes / 2, opt.dtype, B, T, h_in, opt.head_dim};
      const int64_t head0 = p.call.head_start;
      detail::gather_rows(k_rows(), p.first.begin, p.first.end, head0, {vk, 0, 0});
      detail::gather_rows(k_rows(), p.second.begin, p.second.end, head0, {vk, p.first.size(), 0});
      detail::gather_rows(v_rows(), p.first.begin, p.first.end, head0, {vv, 0, 0});
      detail::gather_rows(v_rows(), p.second.begin, p.second.end, head0, {vv, p.first.size(), 0});
      out.k = detail::dense_view(vk);
      out.v = detail::dense_view(vv);
    }
    out.local_start_index = p.chunk_at;
    out.local_end_index = p.chunk_at + p.call.n;
    out.visible_local_end = local_end;
    out.visible_global_end = global_end;
    peak_transient = meter.peak();
    return out;
  }
};

DenseCausalCache::DenseCausalCache(const CacheOptions& options) : CausalCache(options) {
  detail::validate_options(options);
  impl_ = std::make_unique<Impl>(options);
  impl_->own_k = AlignedBuffer(impl_->buffer_bytes(impl_->capacity));
  impl_->own_v = AlignedBuffer(impl_->buffer_bytes(impl_->capacity));
  impl_->k = impl_->own_k.data();
  impl_->v = impl_->own_v.data();
}

DenseCausalCache::DenseCausalCache(const CacheOptions& options, ExternalStorage storage, GrowStorage grow)
    : CausalCache(options) {
  detail::validate_options(options);
  if (storage.k == nullptr || storage.v == nullptr)
    throw InvalidArgument(fmt::format("external K and V storage must not be null, got k={} v={}",
                                      storage.k ? "non-null" : "null", storage.v ? "non-null" : "null"));
  impl_ = std::make_unique<Impl>(options);
  impl_->k = static_cast<std::byte*>(storage.k);
  impl_->v = static_cast<std::byte*>(storage.v);
  impl_->owns = false;
  impl_->grow = std::move(grow);
}

DenseCausalCache::DenseCausalCache(std::unique_ptr<Impl> impl) : CausalCache(impl->opt), impl_(std::move(impl)) {}

DenseCausalCache::~DenseCausalCache() = default;
DenseCausalCache::DenseCausalCache(DenseCausalCache&&) noexcept = default;
DenseCausalCache& DenseCausalCache::operator=(DenseCausalCache&&) noexcept = default;

KVView DenseCausalCache::do_update(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                                   std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
  Impl& m = *impl_;
  const Impl::Plan p = m.plan(key, value, chunk_start, head_start, recent_window);
  const size_t buf = m.buffer_bytes(m.capacity);
  const detail::CallInput in =
      detail::unaliased_input(key, value, {{m.k, buf}, {m.v, buf}, {m.scratch->data(), m.scratch->size()}});
  return m.apply(p, in.key, in.value, in.copied_bytes());
}

void DenseCausalCache::reset_indices() {
  impl_->global_end = 0;
  impl_->local_end = 0;
  impl_->scratch->release();
  impl_->peak_transient = 0;
}

void DenseCausalCache::set_indices(int64_t global_end, int64_t local_end) {
  detail::check_dense_indices(impl_->capacity, global_end, local_end);
  impl_->global_end = global_end;
  impl_->local_end = local_end;
  impl_->scratch->release();
}

DenseCausalCache DenseCausalCache::fork(GrowStorage storage, std::shared_ptr<ViewScratch> view_scratch) const {
  const Impl& m = *impl_;
  CacheOptions o = m.opt;
  o.view_scratch = std::move(view_scratch);
  auto f = std::make_unique<Impl>(o);
  f->capacity = m.capacity;
  f->window = m.window;
  f->global_end = m.global_end;
  f->local_end = m.local_end;
  const size_t n = m.buffer_bytes(m.capacity);
  if (storage) {
    f->adopt_caller_storage(std::move(storage));
  } else {
    f->own_k = AlignedBuffer::uninitialized(n);
    f->own_v = AlignedBuffer::uninitialized(n);
    f->k = f->own_k.data();
    f->v = f->own_v.data();
  }
  std::memcpy(f->k, m.k, n);
  std::memcpy(f->v, m.v, n);
  return DenseCausalCache(std::move(f));
}

size_t DenseCausalCache::resident_nbytes() const {
  return 2 * impl_->buffer_bytes(impl_->capacity);
}
size_t DenseCausalCache::peak_transient_nbytes() const {
  return impl_->peak_transient;
}
int64_t DenseCausalCache::global_end() const {
  return impl_->global_end;
}
int64_t DenseCausalCache::local_end() const {
  return impl_->local_end;
}
int64_t DenseCausalCache::cache_size() const {
  return impl_->capacity;
}
int64_t DenseCausalCache::attention_window_size() const {
  return impl_->window;
}
bool DenseCausalCache::allow_growth() const {
  return impl_->opt.allow_growth;
}
bool DenseCausalCache::owns_storage() const {
  return impl_->owns;
}

ConstTensorView DenseCausalCache::k_buffer() const {
  return {impl_->k, impl_->opt.dtype, {impl_->opt.batch, impl_->capacity, impl_->opt.heads, impl_->opt.head_dim}};
}
ConstTensorView DenseCausalCache::v_buffer() const {
  return {impl_->v, impl_->opt.dtype, {impl_->opt.batch, impl_->capacity, impl_->opt.heads, impl_->opt.head_dim}};
}

detail::DenseDebugState detail::TestAccess::state(const DenseCausalCache& c) {
  const DenseCausalCache::Impl& m = *c.impl_;
  const size_t n = m.buffer_bytes(m.capacity);
  return {detail::bytes_copy(m.k, n),
          detail::bytes_copy(m.v, n),
          m.capacity,
          m.window,
          m.global_end,
          m.local_end,
          c.resident_nbytes(),
          m.peak_transient,
          detail::bytes_copy(m.scratch->data(), m.scratch->size()),
          m.owns};
}

// ---- snapshots (src/cache/snapshot.cpp): the state out and in ------------------
detail::DenseStateRef detail::SnapshotAccess::state(const DenseCausalCache& c) {
  const DenseCausalCache::Impl& m = *c.impl_;
  const size_t n = m.buffer_bytes(m.capacity);
  return {m.opt, m.capacity, m.window, m.global_end, m.local_end, {m.k, n}, {m.v, n}};
}

DenseCausalCache detail::SnapshotAccess::make(DenseStateData&& d, DenseCausalCache::GrowStorage storage) {
  auto m = std::make_unique<DenseCausalCache::Impl>(d.options);
  m->capacity = d.cache_size;
  m->window = d.window;
  m->global_end = d.global_end;
  m->local_end = d.local_end;
  if (storage) {
    m->adopt_caller_storage(std::move(storage));
    std::memcpy(m->k, d.k.data(), d.k.size());
    std::memcpy(m->v, d.v.data(), d.v.size());
  } else {
    m->own_k = std::move(d.k);
    m->own_v = std::move(d.v);
    m->k = m->own_k.data();
    m->v = m->own_v.data();
  }
  return DenseCausalCache(std::move(m));
}

}  // namespace qvg
