// src/cache/snapshot_state.h — private: the narrow interface between the caches and
// their snapshots (src/cache/snapshot_*: the records in snapshot_dense.cpp and
// snapshot_packed.cpp, format in docs/snapshot.md). A cache hands out its state as
// plain references (saving copies nothing) and is rebuilt from plain owned data that
// the snapshot reader has fully validated. Each cache file implements its two
// SnapshotAccess functions next to its Impl; the format code never sees an Impl. A
// new piece of cache state (e.g. a new kind of segment) is a new field here, written
// and read by the cache's record file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/tensor.h"

namespace qvg::detail {

// ---- dense cache ---------------------------------------------------------------
/// A dense cache's state, by reference (valid until the cache's next mutating call).
struct DenseStateRef {
  CacheOptions options;                ///< as constructed (cache_size and window before any growth)
  int64_t cache_size = 0, window = 0;  ///< current (after growth)
  int64_t global_end = 0, local_end = 0;
  std::span<const std::byte> k, v;  ///< the buffers, [B, cache_size, H, D] each
};
/// A dense cache's state, owned, validated (what load() builds a cache from).
struct DenseStateData {
  CacheOptions options;
  int64_t cache_size = 0, window = 0, global_end = 0, local_end = 0;
  AlignedBuffer k, v;
};

// ---- packed cache --------------------------------------------------------------
struct PackedSegmentRef {
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false, packed = false;
  int chunks = 1;
  int64_t span = -1;                        ///< a chunk of incremental span `span` (else -1)
  std::span<const std::byte> k_raw, v_raw;  ///< raw: [B, g1 - g0, H, D] each
  const EncodedTensor* k_enc = nullptr;     ///< packed (a span chunk's: without centroids)
  const EncodedTensor* v_enc = nullptr;
  const EncodedTensor* k_ref = nullptr;  ///< a refined chunk's layers (both or neither)
  const EncodedTensor* v_ref = nullptr;
};
/// An incremental span's codebooks, shared by its chunks (and the open span's).
struct PackedSpanRef {
  int64_t id = -1;
  const SpanCodebook* k = nullptr;
  const SpanCodebook* v = nullptr;
};
/// The incremental-span bookkeeping of a packed cache (the incremental span mode).
struct SpanState {
  int64_t open_span = -1;  ///< the span chunks may join (-1: none yet)
  int open_span_chunks = 0;
  int64_t next_span = 0;  ///< the id the next span gets
  int64_t span_breaks = 0;
  double open_k_energy = 0, open_v_energy = 0;  ///< the open span's first chunk's, per element
};
struct PackedStateRef {
  CacheOptions options;
  QuantArgs quant;
  const char* device = "cpu";  ///< the config's `device` entry: "cpu", or "cuda" for the device cache
  int64_t global_end = 0;
  std::optional<int64_t> chunk_tokens;
  std::vector<PackedSegmentRef> segments;  ///< global order; the last is the current chunk
  const EncodedTensor* warm_k = nullptr;   ///< warm-start codebooks (codebooks_only), or null
  const EncodedTensor* warm_v = nullptr;
  /// Incremental spans: every span a segment refers to, and the open span (which may
  /// have no chunk left), once each, in increasing id order.
  std::vector<PackedSpanRef> spans;
  SpanState span_state;
};
struct PackedSegmentData {
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false, packed = false;
  int chunks = 1;
  int64_t span = -1;
  AlignedBuffer k_raw, v_raw;
  EncodedTensor k_enc, v_enc;
  std::optional<EncodedTensor> k_ref, v_ref;  ///< a refined chunk's layers (format 1.4)
};
struct PackedSpanData {
  int64_t id = -1;
  SpanCodebook k, v;
};
struct PackedStateData {
  CacheOptions options;
  QuantArgs quant;
  int64_t global_end = 0;
  std::optional<int64_t> chunk_tokens;
  std::vector<PackedSegmentData> segments;
  std::optional<EncodedTensor> warm_k, warm_v;
  std::vector<PackedSpanData> spans;  ///< increasing ids; the chunks of one span share its codebooks
  SpanState span_state;
};

/// The caches' side of snapshots (friend of both caches).
struct SnapshotAccess {
  static DenseStateRef state(const DenseCausalCache& c);
  /// REQUIRES data validated (docs/snapshot.md, "what a reader checks").
  static DenseCausalCache make(DenseStateData&& data, DenseCausalCache::GrowStorage storage);
  static PackedStateRef state(const PackedCausalCache& c);
  /// REQUIRES data validated.
  static PackedCausalCache make(PackedStateData&& data);
};

}  // namespace qvg::detail
