// qvg::cuda::DenseCausalCache: the dense cache of spec 3.2 over caller-owned device
// buffers. The decisions are plan_dense_update (src/cache/dense_plan.h), the CPU
// dense cache's; this file moves the bytes on the call's stream: the chunk into the
// buffers (guarded copies: only when the call's input check passes, input_guard.h),
// and with cudaMemcpy2DAsync the eviction roll, the growth copy and the two-range
// view into the cache's view buffer.
#include <cuda_runtime_api.h>

#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cuda/device_copy.h"
#include "cache/cuda/input_guard.h"
#include "cache/dense_plan.h"
#include "cache/snapshot_io.h"
#include "cache/snapshot_records.h"
#include "cache/snapshot_state.h"
#include "core/file_impl.h"
#include "kernels/cuda/check.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"
#include "qvg/file.h"

namespace qvg::cuda {

using cache_detail::copy2d;

struct DenseCausalCache::Impl {
  const CacheOptions opt;
  const size_t esz;
  Allocator* alloc;
  int64_t capacity = 0, window = 0;
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  GrowStorage grow;
  int64_t global_end = 0, local_end = 0;
  DeviceBuffer view;         // K then V of the last two-range view
  detail::InputGuard guard;  // the deferred input check (input_guard.h)

  Impl(const CacheOptions& o, ExternalStorage s, GrowStorage g, Allocator& a)
      : opt(o),
        esz(dtype_size(o.dtype)),
        alloc(&a),
        capacity(o.cache_size),
        window(o.window()),
        k(static_cast<std::byte*>(s.k)),
        v(static_cast<std::byte*>(s.v)),
        grow(std::move(g)) {}

  size_t token_bytes() const { return size_t(opt.heads * opt.head_dim) * esz; }
  size_t batch_bytes(int64_t tokens) const { return size_t(tokens) * token_bytes(); }

  /// Writes the call's [B, n, h_in, D] rows into a buffer at token `at`, head `head0`:
  /// guarded copies, done only when the call's input check passes (else zeros at new
  /// positions, nothing for a rewrite; input_guard.h).
  void write_chunk(ConstTensorView src, std::byte* buf, int64_t at, int64_t head0, bool new_positions, Stream s) const {
    const int64_t n = src.shape.s, h_in = src.shape.h, D = opt.head_dim;
    const size_t row = size_t(h_in * D) * esz;
    for (int64_t b = 0; b < opt.batch; ++b)
      guard.copy2d(buf + size_t(b) * batch_bytes(capacity) + size_t(at) * token_bytes() + size_t(head0 * D) * esz,
                   token_bytes(), static_cast<const std::byte*>(src.data) + size_t(b * n) * row, row, row, size_t(n),
                   new_positions, s);
  }

  /// Tokens [r.begin, r.end) of heads [head0, head0 + h_in) of a buffer into the view
  /// buffer `out` ([B, T, h_in, D]) at token `out_t`.
  void gather(const std::byte* buf, qvg::detail::DenseRange r, int64_t head0, int64_t h_in, std::byte* out, int64_t T,
              int64_t out_t, Stream s) const {
    const size_t row = size_t(h_in * opt.head_dim) * esz;
    for (int64_t b = 0; b < opt.batch; ++b)
      copy2d(out + size_t(b * T + out_t) * row, row,
             buf + size_t(b) * batch_bytes(capacity) + size_t(r.begin) * token_bytes() +
                 size_t(head0 * opt.head_dim) * esz,
             token_bytes(), row, size_t(r.size()), s);
  }

  KVView update(ConstTensorView key, ConstTensorView value, int64_t chunk_start, Stream s,
                std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
    // --- validation: throws, changes nothing ---------------------------------
    guard.raise_published();  // an earlier call's input found out of limits (no waiting)
    const qvg::detail::DensePlan p = qvg::detail::plan_dense_update(opt, {capacity, window, global_end, local_end}, key,
                                                                    value, chunk_start, head_start, recent_window);
    // The first call: the pinned ring and the flags (after the argument checks: no CUDA call).
    guard.prepare(s, *alloc);
    const int64_t B = opt.batch, h_in = p.call.heads, head0 = p.call.head_start, T = p.view_tokens();
    const bool copy = p.second.size() > 0;
    const size_t view_bytes = copy ? 2 * size_t(B * T * h_in * opt.head_dim) * esz : 0;

    const bool growing = p.new_capacity != capacity;
    cache_detail::refuse_freeing_under_capture(growing, s, "grow the cache (the caller drops the old storage)");
    cache_detail::refuse_freeing_under_capture(view.size() != 0 && view.size() != view_bytes, s,
                                               "change the size of the view (its buffer replaced or dropped)");

    // --- allocations: a failure here still changes nothing -------------------
    ExternalStorage grown;
    if (growing) {
      grown = grow(p.new_capacity);
      if (grown.k == nullptr || grown.v == nullptr)
        throw InvalidArgument(
            fmt::format("GrowStorage must return non-null K and V storage for cache_size {}", p.new_capacity));
    }
    // The roll moves buffer[sink + evicted, +rolled) to buffer[sink, +rolled): the two
    // overlap when rolled > evicted, and device copies must not overlap.
    const bool roll_via_temp = p.rolled > p.evicted;
    DeviceBuffer roll_tmp;
    if (p.rolled > 0 && roll_via_temp) roll_tmp = DeviceBuffer(size_t(B) * batch_bytes(p.rolled), s, *alloc);
    DeviceBuffer new_view;
    if (copy && view.size() != view_bytes) new_view = DeviceBuffer(view_bytes, s, *alloc);

    // --- from here on state changes; only CUDA errors can interrupt it -------
    guard.enqueue(key, value, chunk_start, s);  // the chunk is written only if it passes
    if (growing) {
      const size_t old_b = batch_bytes(capacity), new_b = batch_bytes(p.new_capacity);
      copy2d(grown.k, new_b, k, old_b, old_b, size_t(B), s);
      copy2d(grown.v, new_b, v, old_b, old_b, size_t(B), s);
      k = static_cast<std::byte*>(grown.k);
      v = static_cast<std::byte*>(grown.v);
      capacity = p.new_capacity;
      window = p.new_window;
    }
    if (p.rolled > 0) {
      const size_t bb = batch_bytes(capacity), width = batch_bytes(p.rolled);
      const size_t from = size_t(opt.sink_tokens + p.evicted) * token_bytes(),
                   to = size_t(opt.sink_tokens) * token_bytes();
      for (std::byte* buf : {k, v}) {
        if (roll_via_temp) {
          copy2d(roll_tmp.data(), width, buf + from, bb, width, size_t(B), s);
          copy2d(buf + to, bb, roll_tmp.data(), width, width, size_t(B), s);
        } else {
          copy2d(buf + to, bb, buf + from, bb, width, size_t(B), s);
        }
      }
    }
    write_chunk(key, k, p.chunk_at, head0, !p.rewrite, s);
    write_chunk(value, v, p.chunk_at, head0, !p.rewrite, s);
    global_end = p.new_global_end;
    local_end = p.new_local_end;

    KVView out;
    if (!copy) {
      view = DeviceBuffer();
      out.k = qvg::detail::sub_view(qvg::detail::rows_of(static_cast<const void*>(k), opt, capacity), p.first.begin, T,
                                    head0, h_in);
      out.v = qvg::detail::sub_view(qvg::detail::rows_of(static_cast<const void*>(v), opt, capacity), p.first.begin, T,
                                    head0, h_in);
      out.zero_copy = true;
    } else {
      if (new_view.size()) view = std::move(new_view);
      auto* vk = static_cast<std::byte*>(view.data());
      std::byte* vv = vk + view_bytes / 2;
      gather(k, p.first, head0, h_in, vk, T, 0, s);
      gather(k, p.second, head0, h_in, vk, T, p.first.size(), s);
      gather(v, p.first, head0, h_in, vv, T, 0, s);
      gather(v, p.second, head0, h_in, vv, T, p.first.size(), s);
      const qvg::detail::ConstRows rk{vk, opt.dtype, B, T, h_in, opt.head_dim},
          rv{vv, opt.dtype, B, T, h_in, opt.head_dim};
      out.k = qvg::detail::dense_view(rk);
      out.v = qvg::detail::dense_view(rv);
    }
    out.local_start_index = p.chunk_at;
    out.local_end_index = p.chunk_at + p.call.n;
    out.visible_local_end = local_end;
    out.visible_global_end = global_end;
    return out;
  }
};

DenseCausalCache::DenseCausalCache(const CacheOptions& options, ExternalStorage storage, GrowStorage grow,
                                   Allocator& alloc)
    : CacheDims(options) {
  qvg::detail::validate_options(options);
  if (storage.k == nullptr || storage.v == nullptr)
    throw InvalidArgument(fmt::format("external K and V storage must not be null, got k={} v={}",
                                      storage.k ? "non-null" : "null", storage.v ? "non-null" : "null"));
  if (options.allow_growth && !grow)
    throw Unsupported(
        "allow_growth needs a GrowStorage for the device dense cache (it does not own its buffers), got none");
  impl_ = std::make_unique<Impl>(options, storage, std::move(grow), alloc);
}

DenseCausalCache::~DenseCausalCache() = default;
DenseCausalCache::DenseCausalCache(DenseCausalCache&&) noexcept = default;
DenseCausalCache& DenseCausalCache::operator=(DenseCausalCache&&) noexcept = default;

KVView DenseCausalCache::update(ConstTensorView key, ConstTensorView value, int64_t current_chunk_start, Stream stream,
                                std::optional<int64_t> cache_head_start, std::optional<int64_t> recent_window_tokens) {
  return impl_->update(key, value, current_chunk_start, stream, cache_head_start, recent_window_tokens);
}

void DenseCausalCache::check(Stream stream) {
  impl_->guard.wait_and_raise(stream);
}

void DenseCausalCache::reset_indices() {
  impl_->global_end = 0;
  impl_->local_end = 0;
  impl_->view = DeviceBuffer();
}

void DenseCausalCache::set_indices(int64_t global_end, int64_t local_end) {
  qvg::detail::check_dense_indices(impl_->capacity, global_end, local_end);
  impl_->global_end = global_end;
  impl_->local_end = local_end;
  impl_->view = DeviceBuffer();
}

size_t DenseCausalCache::resident_nbytes() const {
  return 2 * size_t(impl_->opt.batch) * impl_->batch_bytes(impl_->capacity);
}
size_t DenseCausalCache::view_buffer_nbytes() const {
  return impl_->view.size();
}
DeviceBuffer DenseCausalCache::release_view_buffer() {
  return std::move(impl_->view);
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

DenseCausalCache::DenseCausalCache(std::unique_ptr<Impl> impl) : CacheDims(impl->opt), impl_(std::move(impl)) {}

namespace {

/// Caller storage from `storage` for `cache_size` tokens (non-null, else InvalidArgument).
DenseCausalCache::ExternalStorage storage_for(const DenseCausalCache::GrowStorage& storage, int64_t cache_size,
                                              const char* what) {
  if (!storage)
    throw InvalidArgument(
        fmt::format("{}: storage must be given (the device dense cache does not own its "
                    "buffers), got none",
                    what));
  const DenseCausalCache::ExternalStorage s = storage(cache_size);
  if (s.k == nullptr || s.v == nullptr)
    throw InvalidArgument(
        fmt::format("{}: storage must return non-null K and V storage for cache_size {}", what, cache_size));
  return s;
}

}  // namespace

DenseCausalCache DenseCausalCache::fork(GrowStorage storage, Stream stream) {
  const Impl& m = *impl_;
  impl_->guard.raise_published();
  const ExternalStorage s = storage_for(storage, m.capacity, "fork");
  auto f = std::make_unique<Impl>(m.opt, s, std::move(storage), *m.alloc);
  f->capacity = m.capacity;
  f->window = m.window;
  f->global_end = m.global_end;
  f->local_end = m.local_end;
  const size_t n = size_t(m.opt.batch) * m.batch_bytes(m.capacity);
  copy2d(f->k, n, m.k, n, n, 1, stream);
  copy2d(f->v, n, m.v, n, n, 1, stream);
  return DenseCausalCache(std::move(f));
}

// ---- snapshots: the CPU dense cache's records, through host memory -------------------

std::vector<uint8_t> DenseCausalCache::snapshot_bytes(Stream stream) const {
  const Impl& m = *impl_;
  const size_t n = size_t(m.opt.batch) * m.batch_bytes(m.capacity);
  AlignedBuffer k = AlignedBuffer::uninitialized(n), v = AlignedBuffer::uninitialized(n);
  QVG_CUDA(cudaMemcpyAsync(k.data(), m.k, n, cudaMemcpyDeviceToHost, stream));
  QVG_CUDA(cudaMemcpyAsync(v.data(), m.v, n, cudaMemcpyDeviceToHost, stream));
  QVG_CUDA(cudaStreamSynchronize(stream));
  const qvg::detail::DenseStateRef st{m.opt,       m.capacity,    m.window,     m.global_end,
                                      m.local_end, {k.data(), n}, {v.data(), n}};
  const qvg::detail::snap::Written w = qvg::detail::snap::write_dense(st);
  return qvg::detail::snap::snapshot_file_bytes(w.sections, w.minor);
}

void DenseCausalCache::save(const std::filesystem::path& path, Stream stream) const {
  write_file_atomic(path, snapshot_bytes(stream));  // the bytes snapshot_bytes() returns, or nothing
}

DenseCausalCache DenseCausalCache::restored(qvg::detail::DenseStateData&& d, GrowStorage storage, Stream stream,
                                            Allocator& alloc) {
  if (d.options.allow_growth && !storage)
    throw Unsupported("allow_growth needs a GrowStorage for the device dense cache, got none");
  const ExternalStorage s = storage_for(storage, d.cache_size, "load");
  auto m = std::make_unique<Impl>(d.options, s, std::move(storage), alloc);
  m->capacity = d.cache_size;
  m->window = d.window;
  m->global_end = d.global_end;
  m->local_end = d.local_end;
  // From pageable host memory, which `d` frees on return: a copy from it is not promised
  // to have read its source when cudaMemcpyAsync returns, so wait for both.
  QVG_CUDA(cudaMemcpyAsync(s.k, d.k.data(), d.k.size(), cudaMemcpyHostToDevice, stream));
  QVG_CUDA(cudaMemcpyAsync(s.v, d.v.data(), d.v.size(), cudaMemcpyHostToDevice, stream));
  QVG_CUDA(cudaStreamSynchronize(stream));
  return DenseCausalCache(std::move(m));
}

DenseCausalCache DenseCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                       const SnapshotExpectation& expect, GrowStorage storage,
                                                       Stream stream, Allocator& alloc) {
  return restored(qvg::detail::snap::read_dense(qvg::detail::snap::MemorySource(bytes), expect), std::move(storage),
                  stream, alloc);
}

DenseCausalCache DenseCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect,
                                        GrowStorage storage, Stream stream, Allocator& alloc) {
  return qvg::detail::with_path(path, [&] {
    const qvg::detail::snap::FileSource src(path);
    return restored(qvg::detail::snap::read_dense(src, expect), std::move(storage), stream, alloc);
  });
}

ConstTensorView DenseCausalCache::k_buffer() const {
  const CacheOptions& o = impl_->opt;
  return {impl_->k, o.dtype, {o.batch, impl_->capacity, o.heads, o.head_dim}};
}
ConstTensorView DenseCausalCache::v_buffer() const {
  const CacheOptions& o = impl_->opt;
  return {impl_->v, o.dtype, {o.batch, impl_->capacity, o.heads, o.head_dim}};
}

}  // namespace qvg::cuda
