// src/cache/snapshot_state.h — private: the narrow interface between the caches and
// their snapshots (src/cache/snapshot.cpp, format in docs/snapshot.md). A cache hands
// out its state as plain references (saving copies nothing) and is rebuilt from
// plain owned data that the snapshot reader has fully validated. Each cache file
// implements its two SnapshotAccess functions next to its Impl; the format code
// never sees an Impl. A new piece of cache state (e.g. a new kind of segment) is a
// new field here, written and read by snapshot.cpp.
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
  CacheOptions options;                    ///< as constructed (cache_size and window before any growth)
  int64_t cache_size = 0, window = 0;      ///< current (after growth)
  int64_t global_end = 0, local_end = 0;
  std::span<const std::byte> k, v;         ///< the buffers, [B, cache_size, H, D] each
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
  std::span<const std::byte> k_raw, v_raw;  ///< raw: [B, g1 - g0, H, D] each
  const EncodedTensor* k_enc = nullptr;     ///< packed
  const EncodedTensor* v_enc = nullptr;
};
struct PackedStateRef {
  CacheOptions options;
  QuantArgs quant;
  int64_t global_end = 0;
  std::optional<int64_t> chunk_tokens;
  std::vector<PackedSegmentRef> segments;  ///< global order; the last is the current chunk
  const EncodedTensor* warm_k = nullptr;   ///< warm-start codebooks (codebooks_only), or null
  const EncodedTensor* warm_v = nullptr;
};
struct PackedSegmentData {
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false, packed = false;
  int chunks = 1;
  AlignedBuffer k_raw, v_raw;
  EncodedTensor k_enc, v_enc;
};
struct PackedStateData {
  CacheOptions options;
  QuantArgs quant;
  int64_t global_end = 0;
  std::optional<int64_t> chunk_tokens;
  std::vector<PackedSegmentData> segments;
  std::optional<EncodedTensor> warm_k, warm_v;
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
