// qvg/cuda_cache.h — the device-resident K/V caches (docs/cuda.md): the packed
// cache and the dense cache over caller-owned device buffers.
//
// qvg::cuda::PackedCausalCache is the CUDA counterpart of qvg::PackedCausalCache
// (qvg/cache.h, spec 4): the same constructor arguments, the same update()
// contract and the same segment policy (sink, keep_recent, spans, eviction, the
// view's ranges and indices), but its segments live in device memory (raw chunks
// as DeviceBuffer, packed spans as DeviceEncodedTensor, encoded by the device
// encoder), its inputs are device tensors and its views point to device memory.
// The bookkeeping is src/cache/cache_policy.h, the policy the CPU cache runs too
// (one implementation), which a host test also drives with an empty payload.
//
// Streams: every call that enqueues work takes an explicit Stream and returns without
// waiting for the device; update() makes no synchronizing call and no copy back to the
// host (docs/cuda.md, "update() does not wait"), so the host runs ahead across a
// model's layers and an update() that rewrites the current chunk with a view of the
// same size can be captured into a CUDA graph (after a first update() outside the
// capture, which allocates the cache's pinned check record). Under a capture, an
// advance to a new chunk, a view of another size and a dense growth throw Unsupported
// before any change (each would free buffers allocated before the capture, which a
// graph cannot free). Destroy a graph before its cache, and the cache before its
// stream (its buffers are freed on the stream they were allocated on).
//
// The input check of spec 1 (finite, |x| <= 1e16) runs on the device and is reported
// one call later: update() enqueues a scan of key and value, and the call's rows are
// written into the cache only if the scan passes — a bad call's rows are never
// stored, so nothing outside the limits is ever encoded; the rows of a new chunk
// (an advance) become zeros instead. The device then writes the bad call into pinned
// host memory, and the next call on the cache that finds it there raises the CPU
// cache's InvalidArgument (the tensor, the value, its [b, t, h, d]) naming the bad
// call's chunk, before doing anything; check(stream) waits for the stream and raises
// it at once. Between the bad call and the report, the cache behaves as if the bad
// call had not written its chunk (an advance's positions did advance: its chunk holds
// zeros until rewritten) — except the packed cache's view returned by the bad call
// itself when it is a copy: its last n tokens are copied from the call's input, bad
// values included (a zero-copy view shows the cache's rows). Buffers are allocated from the cache's
// Allocator on the stream of the call that creates them and are freed on that same
// stream. REQUIRES: all calls on one cache, and all reads of its views, are
// ordered on the device — in practice one stream per cache; to switch streams,
// synchronize the old one first. Inputs must stay valid until the work enqueued on
// `stream` has read them.
//
// Allocation failures: every buffer an update() needs (new raw chunks, the spans
// it encodes with their encoder scratch, the view buffer) is allocated before the
// cache changes, so a failing allocation (the Allocator's exception, e.g. PyTorch's
// out-of-memory error) leaves the cache exactly as it was.
//
// Every QuantArgs setting the CPU cache accepts is accepted: incremental
// spans with adaptive breaks, refinement layers, init warm, scale_search mse,
// per-role K/V settings. Not supported (typed errors, raised before any state
// change): a shared CacheOptions::view_scratch (host memory; Unsupported),
// allow_growth (Unsupported, as on the CPU). The one setting that makes update()
// wait: incremental spans with adaptive breaks (a span break ratio above 0) read each
// encoded chunk's residual energy on the host to decide its span — the advance
// synchronizes `stream` once per chunk (not capturable). Without a break ratio the
// energies stay on the device until a snapshot reads them.
//
// Run on an H200 (2026-12-04, docs/gpu-runs/): equal to the CPU caches' decode of
// its state on every tested setting; the bookkeeping is also tested on the host
// against the CPU cache. Changed since that run and not yet run on a GPU: see
// docs/cuda.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "qvg/cache.h"
#include "qvg/config.h"
#include "qvg/cuda.h"
#include "qvg/snapshot.h"
#include "qvg/tensor.h"

namespace qvg::detail {
struct PackedStateData;
struct DenseStateData;
}  // namespace qvg::detail

namespace qvg::cuda {

/// The packed causal cache of spec 4 with device-resident segments.
///
/// State and invariants: those of qvg::PackedCausalCache (qvg/cache.h), with raw
/// segments held as DeviceBuffers ([B, g1 - g0, H, D] of the cache dtype, dense)
/// and packed spans as DeviceEncodedTensors (one for K, one for V).
/// Differences from the CPU cache: the spans are encoded by qvg::cuda::encode
/// (its encodings may differ from the CPU encoder's in near-ties, spec 1.1, so
/// packed tokens of a view may differ from the CPU cache's within the codec's
/// error); no ViewScratch sharing; no peak_transient_nbytes().
/// Not thread-safe; movable, not copyable; a moved-from cache may only be
/// destroyed or assigned to.
class PackedCausalCache : public CacheDims {
 public:
  /// Validates like qvg::PackedCausalCache: InvalidArgument for bad options or
  /// quant args (block_size must divide head_dim when quantization is on),
  /// Unsupported for allow_growth and for a non-null options.view_scratch.
  /// Allocates nothing and makes no CUDA call (no device needed).
  /// `alloc` must outlive the cache.
  explicit PackedCausalCache(const CacheOptions& options, const QuantArgs& quant = {},
                             Allocator& alloc = default_allocator());
  ~PackedCausalCache();
  PackedCausalCache(PackedCausalCache&&) noexcept;
  PackedCausalCache& operator=(PackedCausalCache&&) noexcept;
  PackedCausalCache(const PackedCausalCache&) = delete;
  PackedCausalCache& operator=(const PackedCausalCache&) = delete;

  /// Writes the chunk [c, c + n) of K/V and returns the visible window, with the
  /// contract of qvg::CausalCache::update (qvg/cache.h): key, value are DEVICE
  /// tensors [B, n, h_in, D], dense, of the cache's dtype; cache_head_start and
  /// recent_window_tokens as there. Every argument and the call's placement are
  /// validated first; the values are checked on the device, reported by a later
  /// call or check() (see "The input check" above) — a call first raises the
  /// InvalidArgument of an earlier bad call, changing nothing. A call that throws
  /// InvalidArgument / Unsupported / OutOfRange, or whose allocations fail, changes
  /// nothing (segments, cursors, the previous view's memory). After that only a
  /// CudaError can interrupt the call; the cache then stays consistent (basic
  /// guarantee). Makes no synchronizing call (but with adaptive span breaks).
  ///
  /// The returned KVView has the CPU cache's indices (local_start_index = T - n,
  /// ...); its k.data and v.data are DEVICE pointers: either into the current
  /// segment (zero_copy, strided) or into a device view buffer the cache owns
  /// (dense [B, T, h_in, D], K then V). They are valid until the next successful
  /// update() or reset_indices() on this cache or its destruction, and readable by
  /// work enqueued on `stream` after this call (the copies and the decode that fill
  /// them are enqueued on `stream`, not finished, when update() returns).
  KVView update(ConstTensorView key, ConstTensorView value, int64_t current_chunk_start, Stream stream,
                std::optional<int64_t> cache_head_start = std::nullopt,
                std::optional<int64_t> recent_window_tokens = std::nullopt);

  /// An empty cache. Frees every segment and the view buffer, each on the stream it
  /// was allocated on (stream-ordered: safe once the work reading them is enqueued).
  void reset_indices();

  /// Waits for `stream` (the stream of the cache's calls), then raises the
  /// InvalidArgument of the oldest bad call not yet reported (the input check above);
  /// returns when every call so far passed. Changes nothing.
  void check(Stream stream);

  /// Bytes of the state, as the CPU cache counts them: raw segments' K and V bytes
  /// plus each span's DeviceEncodedTensor::nbytes() (not its alignment padding); what
  /// this cache alone holds (see fork()).
  size_t resident_nbytes() const;
  /// Device bytes allocated for the state (raw segments plus the spans' allocations,
  /// alignment padding included); excludes the view buffer.
  size_t allocated_nbytes() const;
  /// Bytes of the device view buffer held now (0 after a zero-copy view).
  size_t view_buffer_nbytes() const;
  /// Hands the last copied view's buffer (K then V) to the caller: the KVView the last
  /// update() returned stays valid as long as the returned buffer lives (it is freed on
  /// the stream that allocated it, with this cache's Allocator), and the cache allocates
  /// a new buffer for its next copied view. Empty after a zero-copy view or a second
  /// call. For a caller that gives every view to its user as memory of its own (qvg.torch:
  /// the caches of a model's L layers then hold no view between calls, and the model one
  /// window at a time instead of L). Makes no CUDA call.
  DeviceBuffer release_view_buffer();
  /// As qvg::PackedCausalCache: spans started because a chunk did not fit the open
  /// one (the break ratio), and the bytes of the warm-start codebooks held (init warm).
  int64_t span_breaks() const;
  size_t warm_state_nbytes() const;

  int64_t global_end() const;
  int64_t local_end() const;  ///< min(global_end, cache_size)
  int64_t cache_size() const;
  int64_t attention_window_size() const;
  const QuantArgs& quant_args() const;
  /// Size of the first advance's chunk; nullopt while the cache is empty.
  std::optional<int64_t> chunk_tokens() const;

  /// Snapshots (docs/snapshot.md): the state downloaded into host memory (synchronizes
  /// `stream`) and written by the CPU caches' writer: the bytes a qvg::PackedCausalCache
  /// with the same state writes, but for the config's `device` entry ("cuda"). The CPU
  /// cache loads them, and these functions load the CPU cache's (InvalidArgument /
  /// CorruptData as qvg::PackedCausalCache::load; Unsupported for a snapshot whose
  /// settings the device cache refuses, and for expect.view_scratch). A load uploads
  /// the state on `stream` with `alloc`.
  std::vector<uint8_t> snapshot_bytes(Stream stream) const;
  void save(const std::filesystem::path& path, Stream stream) const;
  static PackedCausalCache from_snapshot_bytes(std::span<const uint8_t> bytes, const SnapshotExpectation& expect,
                                               Stream stream, Allocator& alloc = default_allocator());
  static PackedCausalCache load(const std::filesystem::path& path, const SnapshotExpectation& expect, Stream stream,
                                Allocator& alloc = default_allocator());

  /// A branch (qvg/cache.h, "Branches"): a new cache with this cache's settings,
  /// allocator and state. It shares every encoded span, codebook, refinement layer and
  /// the warm-start codebooks (device memory, immutable, freed with the last cache that
  /// holds it) and copies the raw segments on `stream` (enqueued, not waited for).
  /// First raises the InvalidArgument of an earlier bad call the device has published
  /// (as update(); nothing is forked then); a bad call still running stays this cache's
  /// to report (its rows were never stored: the fork holds what this cache holds).
  /// REQUIRES: `stream` is the stream of this cache's calls, and every branch runs on
  /// it (or the caller synchronizes before another stream uses a branch): a shared
  /// buffer is freed on the stream that allocated it, once the last branch drops it.
  /// resident_nbytes() counts what a branch alone holds, shared_nbytes() the rest.
  /// The fork is a new cache: its first update() allocates its input check's pinned
  /// record, so it must run outside a CUDA graph capture (as any new cache's).
  PackedCausalCache fork(Stream stream);
  /// Bytes of the state (as resident_nbytes() counts them) another branch holds too.
  size_t shared_nbytes() const;

  /// Read-only access to one segment (as qvg::PackedCausalCache::SegmentInfo);
  /// raw views and encodings are device memory, valid until the next mutating call.
  using SegmentInfo = BasicSegmentInfo<DeviceEncodedTensor>;
  size_t num_segments() const;
  /// Throws InvalidArgument unless i < num_segments().
  SegmentInfo segment(size_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit PackedCausalCache(std::unique_ptr<Impl> impl);
  static PackedCausalCache restored(const qvg::detail::PackedStateData& d, Stream stream, Allocator& alloc);
};

/// The dense causal cache of spec 3.2 over caller-owned device buffers: the
/// decisions of qvg::DenseCausalCache (src/cache/dense_plan.h, one implementation)
/// with the bytes moved on the call's stream.
///
/// State: K and V buffers [B, cache_size, H, D] of the cache's dtype, dense, in
/// device memory the caller owns (ExternalStorage; e.g. torch tensors), global_end,
/// local_end, and a device view buffer the cache owns (from its Allocator) holding
/// the last view when it is two ranges (sink ++ recent window).
/// Streams: as PackedCausalCache (every call enqueues on its `stream` and never
/// waits; the input check is the packed cache's: reported by the next call or
/// check(); a bad call's rows are not written — zeros at new positions; one stream
/// per cache).
/// Allocation failures (growth storage, the eviction roll's temporary, the view
/// buffer) happen before any change and leave the cache as it was.
/// Not thread-safe; movable, not copyable.
class DenseCausalCache : public CacheDims {
 public:
  using ExternalStorage = qvg::DenseCausalCache::ExternalStorage;
  /// As qvg::DenseCausalCache::GrowStorage, returning DEVICE storage of the new size,
  /// zero-filled (or being zero-filled by work already enqueued on the call's stream).
  using GrowStorage = qvg::DenseCausalCache::GrowStorage;

  /// Validates like qvg::DenseCausalCache (InvalidArgument for bad options or null
  /// storage); allow_growth needs a GrowStorage (else Unsupported: the device cache
  /// does not own buffers). The storage is taken as is (its content is the state).
  /// `alloc` (for the view buffer and the roll's temporary) must outlive the cache.
  DenseCausalCache(const CacheOptions& options, ExternalStorage storage, GrowStorage grow = nullptr,
                   Allocator& alloc = default_allocator());
  ~DenseCausalCache();
  DenseCausalCache(DenseCausalCache&&) noexcept;
  DenseCausalCache& operator=(DenseCausalCache&&) noexcept;
  DenseCausalCache(const DenseCausalCache&) = delete;
  DenseCausalCache& operator=(const DenseCausalCache&) = delete;

  /// The contract of qvg::CausalCache::update (spec 3.2) with DEVICE key and value
  /// ([B, n, h_in, D], dense, the cache's dtype). The view is a strided range of
  /// the buffers (zero_copy) or the cache's view buffer (dense [B, T, h_in, D], K
  /// then V); device pointers valid until the next successful update(),
  /// reset_indices() or set_indices(), readable by work enqueued on `stream`.
  /// Errors: as the CPU cache (before any change); then only CudaError.
  KVView update(ConstTensorView key, ConstTensorView value, int64_t current_chunk_start, Stream stream,
                std::optional<int64_t> cache_head_start = std::nullopt,
                std::optional<int64_t> recent_window_tokens = std::nullopt);

  /// Cursors to 0 (buffer content is kept); frees the view buffer.
  void reset_indices();
  /// As PackedCausalCache::check: waits for `stream`, raises a bad call's error.
  void check(Stream stream);
  /// As qvg::DenseCausalCache::set_indices (InvalidArgument for inconsistent cursors).
  void set_indices(int64_t global_end, int64_t local_end);

  /// 2 * B * cache_size * H * D * itemsize (the buffers).
  size_t resident_nbytes() const;
  /// Bytes of the device view buffer held now (0 after a zero-copy view).
  size_t view_buffer_nbytes() const;
  /// As PackedCausalCache::release_view_buffer: the last two-range view's buffer handed
  /// to the caller (the view stays valid while it lives); empty otherwise.
  DeviceBuffer release_view_buffer();
  int64_t global_end() const;
  int64_t local_end() const;
  int64_t cache_size() const;  ///< current size (grows with allow_growth)
  int64_t attention_window_size() const;
  bool allow_growth() const;
  /// The buffers (device memory), [B, cache_size, H, D]; valid until the next mutating call.
  ConstTensorView k_buffer() const;
  ConstTensorView v_buffer() const;

  /// A branch (qvg/cache.h, "Branches"): a copy. `storage` supplies the fork's buffers
  /// (called once with cache_size; it serves the fork's growth too; required: the
  /// device cache owns no buffers — InvalidArgument without it or for null storage);
  /// the buffers are copied on `stream` (enqueued). First raises an earlier bad call's
  /// published error, as update(). Same allocator as this cache.
  DenseCausalCache fork(GrowStorage storage, Stream stream);

  /// Snapshots (docs/snapshot.md): the bytes the CPU qvg::DenseCausalCache with the same
  /// history writes (the buffers downloaded: synchronizes `stream`), loaded by either
  /// cache. A load reads and validates the file as qvg::DenseCausalCache::load does
  /// (InvalidArgument / CorruptData), then copies the buffers into `storage` (called
  /// once with the snapshot's cache_size; required, as fork(); it serves growth too)
  /// on `stream`; the cache allocates from `alloc`.
  std::vector<uint8_t> snapshot_bytes(Stream stream) const;
  void save(const std::filesystem::path& path, Stream stream) const;
  static DenseCausalCache from_snapshot_bytes(std::span<const uint8_t> bytes, const SnapshotExpectation& expect,
                                              GrowStorage storage, Stream stream,
                                              Allocator& alloc = default_allocator());
  static DenseCausalCache load(const std::filesystem::path& path, const SnapshotExpectation& expect,
                               GrowStorage storage, Stream stream, Allocator& alloc = default_allocator());

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit DenseCausalCache(std::unique_ptr<Impl> impl);
  static DenseCausalCache restored(qvg::detail::DenseStateData&& d, GrowStorage storage, Stream stream,
                                   Allocator& alloc);
};

}  // namespace qvg::cuda
