// qvg/cache.h — the causal K/V caches of spec sections 3 to 5.
//
// A video transformer block owns one cache for its K and V. Once per denoising
// step it calls update() with the K/V of the chunk being generated and attends
// the chunk's queries over the view update() returns. Two caches share that
// interface (CausalCache):
//   * DenseCausalCache (spec 3.2): sink tokens + a rolling buffer, the baseline.
//   * PackedCausalCache (spec 4): the QVG segment store; completed chunks are
//     encoded with the PRQ codec (qvg/codec.h) in spans, old ones are evicted.
// What update() returns (KVView, StridedView, ViewScratch) is in qvg/view.h, which
// this header includes.
//
// Errors (spec 5): every update() validates all its arguments and the call's
// placement before anything changes. A call that throws leaves the cache
// exactly as it was (buffers, segments, cursors, byte counts, the previous
// view's memory) and the next valid call behaves as if the bad one never
// happened. The error kinds are those of qvg/error.h:
//   InvalidArgument — negative recent_window_tokens, head slice, shape / dtype /
//                     head_dim / key-value mismatch, n = 0, negative chunk start,
//                     non-finite or |x| > 1e16 values, bad options or QuantArgs;
//   Unsupported     — packed: non-sequential write, size change of the current
//                     chunk, allow_growth;
//   OutOfRange      — a chunk longer than the cache or not entirely visible in
//                     the window, a placement overwriting sink tokens; dense: a
//                     rewrite of evicted positions.
// Only allocation failure (std::bad_alloc) can interrupt a call after
// validation; the cache then stays consistent (basic guarantee).
//
// Thread safety: a cache is not thread-safe; one caller at a time. update()
// itself uses OpenMP (codec) where it helps. Caches are movable, not copyable;
// a moved-from cache may only be destroyed or assigned to.
//
// Branches (fork()): a fork is a new cache with the source's settings and state;
// given the same calls, both return what a cache that received the whole history
// itself returns, bit for bit. A packed cache's fork shares everything encoded —
// spans, incremental spans' codebooks, refinement layers, warm-start codebooks —
// which never changes once made (immutable, reference-counted, freed with the last
// cache that holds it), and copies its raw segments (the current chunk, chunks kept
// raw, raw sink chunks): a fork costs about a copy of the raw part. A dense cache's
// fork is a copy of its buffers. Branches are independent caches: calls on two
// branches may run on two threads at once (the shared parts are only read); each
// branch still takes one caller at a time. resident_nbytes() counts what a branch
// alone holds, shared_nbytes() what it holds together with other branches, and
// PackedCausalCache::group_nbytes() what a set of branches holds in all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "qvg/cache_options.h"
#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/snapshot.h"
#include "qvg/tensor.h"
#include "qvg/view.h"

namespace qvg {

namespace detail {
struct SnapshotAccess;  // src/cache/snapshot_state.h: the caches' state, out and in
struct PlanAccess;      // src/cache/plan_access.h: what a packed cache's last advance did
struct TestAccess;      // qvg/detail/test_access.h: a cache's whole state, for tests
}  // namespace detail

/// The global token ranges a packed-cache view shows when recent_window_tokens is
/// absent (spec 4): the sink [0, sink_end) followed by [tail_start, global_end);
/// the two ranges merge when tail_start <= sink_end.
struct WindowRanges {
  int64_t sink_end = 0;    ///< min(sink_tokens, global_end)
  int64_t tail_start = 0;  ///< max(sink_end, global_end - max(0, window - sink_end))
  int64_t global_end = 0;
  /// Tokens shown: global_end if the ranges merge, else sink_end + (global_end - tail_start).
  int64_t tokens() const { return tail_start <= sink_end ? global_end : sink_end + (global_end - tail_start); }
  /// The view row of global token g, or -1 when g is not shown.
  int64_t view_row(int64_t g) const {
    if (g < 0 || g >= global_end) return -1;
    if (tail_start <= sink_end || g < sink_end) return g;
    return g >= tail_start ? sink_end + (g - tail_start) : -1;
  }
  bool operator==(const WindowRanges&) const = default;
};

/// Read-only description of one segment of a packed cache (host or device: Encoded
/// is EncodedTensor or cuda::DeviceEncodedTensor). Pointers are valid until the next
/// mutating call on the cache.
template <class Encoded>
struct BasicSegmentInfo {
  int64_t g0 = 0, g1 = 0;  ///< global token range
  bool is_sink = false;
  bool packed = false;
  bool current = false;            ///< the current (last, raw) chunk
  int chunks = 1;                  ///< chunks in the span (1 for a raw segment)
  StridedView k_raw, v_raw;        ///< raw only: dense [B, g1 - g0, H, D]
  const Encoded* k_enc = nullptr;  ///< packed only
  const Encoded* v_enc = nullptr;  ///< packed only
  /// A chunk of an incremental span: the span's id (shared by its chunks) and its
  /// codebooks (k_enc/v_enc then have empty centroid arrays: decode with
  /// DecodeTask::codebook or with_codebook()). -1 and nullptr otherwise.
  int64_t span = -1;
  const Encoded* k_codebook = nullptr;
  const Encoded* v_codebook = nullptr;
  /// A refined chunk (QuantArgs' refinement settings): its refinement layers (f32
  /// encodings of its decoding error, encode_refinement()); nullptr otherwise.
  const Encoded* k_ref = nullptr;
  const Encoded* v_ref = nullptr;
  /// Resident bytes of K and V (an incremental chunk's without its span's
  /// codebooks, which resident_nbytes() counts once per span; a refined chunk's
  /// with its layers).
  size_t nbytes = 0;
};

/// The construction arguments every cache (host or device) reports and never
/// changes (spec 3.1): batch, heads, head_dim, dtype, sink tokens.
class CacheDims {
 public:
  int64_t batch() const { return batch_; }
  int64_t num_heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  int64_t sink_tokens() const { return sink_tokens_; }

 protected:
  explicit CacheDims(const CacheOptions& o)
      : batch_(o.batch), heads_(o.heads), head_dim_(o.head_dim), dtype_(o.dtype), sink_tokens_(o.sink_tokens) {}

 private:
  int64_t batch_, heads_, head_dim_;
  DType dtype_;
  int64_t sink_tokens_;
};

/// Spec 3.1's rule for any cache (host or device): sink_tokens == 0 and cache_size == n
/// and window == n, so the current chunk of n tokens is the whole view and attention
/// can use the chunk's own K/V directly.
template <class Cache>
bool can_direct_current_attention(const Cache& c, int64_t n) {
  return c.sink_tokens() == 0 && c.cache_size() == n && c.attention_window_size() == n;
}

/// The checks update() makes first that read only the arguments' shapes and dtypes
/// (spec 5.1: recent_window_tokens, dtypes, shapes, key/value agreement, n, the head
/// slice, the chunk start), then the chunk's length against a cache of `cache_size`
/// tokens (OutOfRange; with options.allow_growth, InvalidArgument when a cache grown
/// to hold the chunk would pass the size limits): in update()'s order, with its
/// errors. For a caller that must copy key and value before update() (the Python
/// binding, for a strided or expanded torch tensor; spec 5.1): a call refused
/// by its shapes then takes no memory first. Reads no element; the values and the
/// placement against the cursors remain update()'s to check.
void check_update_shapes(const CacheOptions& options, int64_t cache_size, DType key_dtype, Shape4 key,
                         DType value_dtype, Shape4 value, int64_t current_chunk_start,
                         std::optional<int64_t> cache_head_start, std::optional<int64_t> recent_window_tokens);

/// The interface both caches share (spec 3.1).
class CausalCache : public CacheDims {
 public:
  virtual ~CausalCache() = default;

  /// Writes the chunk [c, c + n) of K/V and returns the visible window.
  /// key, value: [B, n, h_in, D] dense, the cache's dtype, identical shapes.
  /// current_chunk_start (c): global position of the chunk's first token, >= 0.
  /// cache_head_start (hs): required when h_in != H; heads [hs, hs + h_in) must
  ///   lie in [0, H); only those heads are written and returned.
  /// recent_window_tokens (rw): nullopt, or >= 0 to restrict the non-sink part
  ///   of the view to the rw tokens before the chunk (plus the chunk).
  /// REQUIRES: nothing beyond the types — every argument is validated and a
  /// violation throws as described at the top of this file; nothing changes on
  /// a throw. The result's k/v live until the next mutating call (KVView).
  KVView update(ConstTensorView key, ConstTensorView value, int64_t current_chunk_start,
                std::optional<int64_t> cache_head_start = std::nullopt,
                std::optional<int64_t> recent_window_tokens = std::nullopt) {
    return do_update(key, value, current_chunk_start, cache_head_start, recent_window_tokens);
  }

  /// Dense: cursors to 0 (buffer content is kept). Packed: an empty cache.
  virtual void reset_indices() = 0;
  /// qvg::can_direct_current_attention(*this, n).
  bool can_direct_current_attention(int64_t n) const { return qvg::can_direct_current_attention(*this, n); }

  /// Bytes of the cache's state that this cache alone holds (see each class; all of
  /// it unless the cache shares encodings with its forks).
  virtual size_t resident_nbytes() const = 0;
  /// Bytes of the cache's state that it holds together with other caches (its forks or
  /// the cache it was forked from; "Branches" above); 0 for a dense cache. Read while
  /// another branch changes, it is a snapshot (the sharing may end at any time).
  virtual size_t shared_nbytes() const = 0;
  /// The most bytes the last successful update() held beyond the resident
  /// state at any moment: the view buffer if it copied, the old buffers during
  /// a dense growth, and for the packed cache a span's concatenated input plus
  /// its encodings before they replace the raw chunks. Working memory inside
  /// qvg::encode() itself (per-group fp32 copies) is not counted. Unchanged by
  /// a failing call; 0 before the first call and after reset_indices().
  virtual size_t peak_transient_nbytes() const = 0;

  virtual int64_t global_end() const = 0;  ///< tokens [0, global_end) have been generated
  virtual int64_t local_end() const = 0;   ///< tokens held in the buffer
  virtual int64_t cache_size() const = 0;
  virtual int64_t attention_window_size() const = 0;

 protected:
  explicit CausalCache(const CacheOptions& o) : CacheDims(o) {}
  CausalCache(CausalCache&&) noexcept = default;
  CausalCache& operator=(CausalCache&&) noexcept = default;
  virtual KVView do_update(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                           std::optional<int64_t> head_start, std::optional<int64_t> recent_window) = 0;
};

// ---------------------------------------------------------------------------
/// The dense cache of spec 3.2: the baseline every packed result is compared to.
///
/// State: buffers K, V, each [B, cache_size, H, D] of dtype; cursors
/// global_end (tokens [0, global_end) were generated) and local_end (the
/// buffer's valid prefix).
/// Invariants:
///   * 0 <= local_end <= cache_size and local_end <= global_end;
///   * shift = global_end - local_end counts evicted tokens; shift > 0 only once
///     an eviction happened, and then local_end == cache_size;
///   * buffer[0, min(sink, local_end)) holds global tokens [0, min(sink, local_end));
///     a global position g >= sink lives at buffer index g - shift when that is
///     >= min(sink, local_end) (older ones were evicted);
///   * resident_nbytes() == 2 * B * cache_size * H * D * dtype_size (the buffers,
///     owned or external), whatever the cursors.
/// Calls (ce = c + n):
///   * Rewrite (ce <= global_end): written at buffer index c - shift; cursors
///     unchanged. OutOfRange ("rewrite of evicted positions") when that index is
///     negative, and also — a decision beyond the engine, which silently wrote
///     into the sink slots — when an eviction happened and the index falls
///     inside the sink slots [0, min(sink, local_end)).
///   * Advance (ce > global_end, gaps allowed): appended = ce - global_end. If
///     local_end + appended > cache_size: with allow_growth the buffers grow to
///     max(local_end + appended, 2 * cache_size) (a window equal to the old size
///     follows); otherwise evicted = local_end + appended - cache_size, the rolled
///     = max(0, local_end - evicted - sink) tokens after them move down to
///     buffer[sink, sink + rolled) (all heads) and the chunk ends at cache_size.
///     Else the chunk ends at local_end + appended. global_end = ce, local_end =
///     the chunk's end. Gap tokens hold whatever the buffer held.
///   * View: rw absent: buffer[max(0, local_end - window), local_end). rw >= 0:
///     sink_end = min(sink, local_end), start = max(sink_end, local_start - rw);
///     buffer[0, local_end) if start <= sink_end, else buffer[0, sink_end) ++
///     buffer[start, local_end). A single range is returned without a copy
///     (strided view into the buffer); two ranges are copied into scratch.
class DenseCausalCache final : public CausalCache {
 public:
  /// Caller-owned storage for the buffers: each [B, cache_size, H, D] of the
  /// cache's dtype, dense, alive as long as the cache uses it. Its content is
  /// taken as is (the buffer's state). On growth the cache asks its GrowStorage
  /// for the new buffers, or without one switches to storage it owns (copying),
  /// after which owns_storage() is true.
  struct ExternalStorage {
    void* k = nullptr;
    void* v = nullptr;
  };
  /// Supplies the buffers of a grown cache (allow_growth): called with the new
  /// cache_size during an update() that grows, after the call was validated and
  /// before anything changed. Returns caller storage for K and V of
  /// [B, new_cache_size, H, D], zero-filled, alive as long as the cache uses it
  /// (non-null; else the call fails with InvalidArgument). The cache copies its
  /// buffers into it and uses it from then on. It may throw (e.g. std::bad_alloc):
  /// the update() then fails with the cache unchanged. The sizes it is asked for
  /// are the cache's rule (spec 3.2: max(needed, 2 * old)), not the caller's.
  using GrowStorage = std::function<ExternalStorage(int64_t new_cache_size)>;

  /// Owned, zero-filled buffers. Throws InvalidArgument for bad options.
  explicit DenseCausalCache(const CacheOptions& options);
  /// Buffers in caller storage (see ExternalStorage), and optionally the caller's
  /// storage for growth. Throws InvalidArgument for bad options or null pointers.
  DenseCausalCache(const CacheOptions& options, ExternalStorage storage, GrowStorage grow = nullptr);
  ~DenseCausalCache() override;
  DenseCausalCache(DenseCausalCache&&) noexcept;
  DenseCausalCache& operator=(DenseCausalCache&&) noexcept;

  void reset_indices() override;
  /// Sets the cursors (for bindings whose index tensors live outside the cache).
  /// REQUIRES 0 <= local_end <= cache_size, local_end <= global_end, and
  /// global_end == local_end unless local_end == cache_size; else InvalidArgument.
  void set_indices(int64_t global_end, int64_t local_end);

  size_t resident_nbytes() const override;
  size_t shared_nbytes() const override { return 0; }
  size_t peak_transient_nbytes() const override;
  int64_t global_end() const override;
  int64_t local_end() const override;
  int64_t cache_size() const override;  ///< current size (grows with allow_growth)
  int64_t attention_window_size() const override;
  bool allow_growth() const;

  /// A branch ("Branches" at the top of this file): a new cache with this cache's
  /// options, cursors and a copy of its buffers (cache_size tokens, as they are).
  /// `storage`: when given, the fork's buffers are caller storage it supplies (called
  /// once with cache_size, as GrowStorage is on growth; it serves later growth too);
  /// else the fork owns its buffers. `view_scratch`: the fork's view scratch
  /// (CacheOptions::view_scratch; default a new one of its own, so that branches on two
  /// threads never share one). peak_transient_nbytes() of the fork is 0 until its first
  /// call. This cache is unchanged; errors (std::bad_alloc, the storage's own, null
  /// storage: InvalidArgument) leave no fork.
  DenseCausalCache fork(GrowStorage storage = nullptr, std::shared_ptr<ViewScratch> view_scratch = nullptr) const;

  /// The buffers, [B, cache_size, H, D]; valid until the next mutating call.
  ConstTensorView k_buffer() const;
  ConstTensorView v_buffer() const;
  bool owns_storage() const;

  // ---- snapshots (docs/snapshot.md) -------------------------------------------
  // The contract of all four is in qvg/snapshot.h; the file holds both buffers as
  // they are in memory. `storage` (load): when given, the buffers are caller storage
  // it supplies (called once with the snapshot's cache_size, as GrowStorage is on
  // growth) and it serves later growth too; else the cache owns its buffers.
  void save(const std::filesystem::path& path) const;
  std::vector<uint8_t> snapshot_bytes() const;
  static DenseCausalCache load(const std::filesystem::path& path, const SnapshotExpectation& expect = {},
                               GrowStorage storage = nullptr);
  static DenseCausalCache from_snapshot_bytes(std::span<const uint8_t> bytes, const SnapshotExpectation& expect = {},
                                              GrowStorage storage = nullptr);

 protected:
  KVView do_update(ConstTensorView key, ConstTensorView value, int64_t chunk_start, std::optional<int64_t> head_start,
                   std::optional<int64_t> recent_window) override;

 private:
  friend struct detail::SnapshotAccess;
  friend struct detail::TestAccess;
  struct Impl;
  explicit DenseCausalCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
/// The packed causal cache of spec 4 (QVG).
///
/// State: a list of segments [g0, g1) in global order, each raw (K and V in the
/// cache dtype, [B, g1 - g0, H, D]) or packed (one EncodedTensor for K and one
/// for V, spec 1.5, encoding a *span* of consecutive chunks with one codebook);
/// the last segment is the *current* chunk, raw. global_end; chunk_tokens
/// (fixed by the first advance, informational: chunks may vary in size); the
/// warm-start codebooks of the last K and V encodings (init = warm).
/// Invariants:
///   * segments are sorted, adjacent ones touch (s[i].g1 == s[i+1].g0) except
///     across the evicted tokens between the last sink segment and the first
///     non-sink one, and the last one ends at global_end; the first one starts
///     at 0 while sink segments exist (they are never dropped);
///   * a raw segment is exactly one chunk; a packed span never mixes sink and
///     non-sink chunks; a segment is a sink segment iff its g0 < sink_tokens;
///   * local_end == min(global_end, cache_size);
///   * resident_nbytes() + shared_nbytes() == sum of raw segment bytes (2 * B * (g1-g0) * H * D *
///     dtype_size, the current one included) + sum over spans of
///     k.nbytes() + v.nbytes() (+ once per incremental span its codebooks, + the
///     refinement layers of refined chunks). Not counted: the warm-start codebooks
///     (warm_state_nbytes()) and the view scratch (transient).
/// Calls (ce = c + n):
///   * c == current.g0: rewrite of the current chunk (a denoising step); n must
///     equal its size (else Unsupported).
///   * c == global_end: advance. The current chunk is finalized, a new raw
///     chunk [c, ce) (zeros in heads this call does not write) becomes current,
///     global_end = ce, then pack-and-evict runs, in this order:
///       sink_end = min(sink, global_end),
///       tail_start = max(sink_end, global_end - max(0, window - sink_end));
///       1. finalized non-sink segments with g1 <= tail_start are dropped;
///       2. with quantization on, eligible chunks are encoded (the policy's
///          settings are QuantArgs', qvg/config.h): non-sink finalized raw
///          chunks older than the newest ones kept raw, in spans of the
///          configured number of chunks, oldest first, as soon as a span is
///          full; with `sink` on, finalized sink chunks after the leading ones
///          kept raw — one span per chunk (sink span policy `chunk`) or all
///          together at the first advance with c >= sink_tokens (`full`). Sink
///          spans are encoded first, then non-sink spans.
///          NOTE: chunks that leave the window before their span fills are
///          dropped raw, so a window too small to hold a full span of eligible
///          chunks packs nothing.
///       3. init = warm: each encoding seeds k-means from the previous
///          encoding's codebook of the same tensor (K or V); the first
///          encoding (and the first after reset_indices()) uses random init.
///   * anything else: Unsupported (non-sequential write).
///   * Also rejected like the dense cache: a chunk longer than the cache, an
///     advance whose placement would overwrite sink tokens (OutOfRange), and a
///     chunk not entirely visible: tail_start > max(c, sink_end) (OutOfRange).
///   * View: the sink [0, sink_end) followed by [lo, global_end), lo =
///     tail_start (rw absent) or max(tail_start, c - rw) (adjacent ranges
///     merge). A view inside the current chunk is returned without a copy;
///     otherwise raw rows are copied and packed spans are decoded one at a time
///     (qvg::decode_range) straight into a scratch buffer the cache owns.
///   * Stored data written through a lent view (spec 5.1, "Aliasing"): a
///     zero-copy view aliases the stored raw chunk, as the engine's views do, so
///     the caller may change stored data through it; the cache uses what it finds.
///     Values the codec cannot encode (NaN, Inf, |x| > 1e16) are refused by the
///     advance that would encode that chunk: InvalidArgument naming the stored
///     chunk's token range and the element, saying it was written through a lent
///     zero-copy view, thrown while planning — nothing changes (global_end,
///     segments, resident bytes). Such values are never encoded as they are (an
///     encoding must decode finite) nor silently replaced. The caller repairs the
///     chunk (a rewrite while it is the current chunk, or finite values written
///     through the view while it is raw) or calls reset_indices(). A cache that
///     encodes nothing (quantization off; the dense cache) stores and shows what
///     was written.
///   With quantization off and window == cache_size every view equals the
///   dense cache's bit for bit. With window < cache_size this cache shows the
///   sink plus the newest window - sink_end tokens, the dense one the last
///   `window` buffer tokens (deliberate, as spec 4 says).
class PackedCausalCache final : public CausalCache {
 public:
  /// Throws InvalidArgument for bad options or quant args (block_size must
  /// divide head_dim when quantization is on), Unsupported for allow_growth.
  explicit PackedCausalCache(const CacheOptions& options, const QuantArgs& quant = {});
  ~PackedCausalCache() override;
  PackedCausalCache(PackedCausalCache&&) noexcept;
  PackedCausalCache& operator=(PackedCausalCache&&) noexcept;

  void reset_indices() override;

  /// Raw segments plus the encodings, codebooks and layers no other branch holds.
  size_t resident_nbytes() const override;
  /// The encodings, codebooks and layers (counted as resident_nbytes() counts them)
  /// that another branch holds too. resident_nbytes() + shared_nbytes() is the
  /// resident size of spec 4 (the invariant above).
  size_t shared_nbytes() const override;
  size_t peak_transient_nbytes() const override;
  int64_t global_end() const override;
  int64_t local_end() const override;
  int64_t cache_size() const override;
  int64_t attention_window_size() const override;
  const QuantArgs& quant_args() const;

  /// A branch ("Branches" at the top of this file): a new cache with this cache's
  /// options and quant args whose state equals this cache's. It shares every encoded
  /// span, codebook, refinement layer and the warm-start codebooks (nothing copied) and
  /// copies the raw segments (current chunk included). `view_scratch`: the fork's view
  /// scratch (CacheOptions::view_scratch; default a new one of its own, so that
  /// branches on two threads never share one). The fork has no last view: its first
  /// call is a rewrite of the current chunk or an advance, as this cache's next call
  /// would be; span_breaks() and chunk_tokens() continue this cache's. This cache is
  /// unchanged; an allocation failure leaves no fork.
  PackedCausalCache fork(std::shared_ptr<ViewScratch> view_scratch = nullptr) const;
  /// Bytes the caches hold in all, each shared encoding, codebook and layer counted
  /// once: N branches of one state hold its encoded history once. Null entries are
  /// skipped. Equals the sum of resident_nbytes() when nothing is shared.
  static size_t group_nbytes(std::span<const PackedCausalCache* const> caches);
  /// Size of the first advance's chunk; nullopt while the cache is empty.
  std::optional<int64_t> chunk_tokens() const;
  /// Bytes of the warm-start codebooks kept for init = warm (not resident).
  size_t warm_state_nbytes() const;
  /// Incremental spans: how many spans were started because a chunk's residual
  /// energy against the open span's codebook exceeded the break ratio (QuantArgs)
  /// times the span's first chunk's (adaptive boundaries) since construction or reset.
  int64_t span_breaks() const;
  /// The ranges a view without recent_window_tokens shows at the current
  /// global_end (what the last advance's full-window view showed). Empty cache: all 0.
  WindowRanges window_ranges() const;

  /// Read-only access to one segment; pointers valid until the next mutating call.
  using SegmentInfo = BasicSegmentInfo<EncodedTensor>;
  size_t num_segments() const;
  SegmentInfo segment(size_t i) const;  ///< REQUIRES i < num_segments()

  // ---- snapshots (docs/snapshot.md) -------------------------------------------
  // The contract of all four is in qvg/snapshot.h; the file holds every segment (raw
  // bytes or encodings) as in memory and the warm-start codebooks.
  void save(const std::filesystem::path& path) const;
  std::vector<uint8_t> snapshot_bytes() const;
  static PackedCausalCache load(const std::filesystem::path& path, const SnapshotExpectation& expect = {});
  static PackedCausalCache from_snapshot_bytes(std::span<const uint8_t> bytes, const SnapshotExpectation& expect = {});

 protected:
  KVView do_update(ConstTensorView key, ConstTensorView value, int64_t chunk_start, std::optional<int64_t> head_start,
                   std::optional<int64_t> recent_window) override;

 private:
  friend struct detail::SnapshotAccess;
  friend struct detail::PlanAccess;
  friend struct detail::TestAccess;
  struct Impl;
  explicit PackedCausalCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qvg
