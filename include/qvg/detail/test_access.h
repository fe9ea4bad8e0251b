// qvg/detail/test_access.h — a cache's whole state as a value, for tests (not for users).
//
// Tests (C++, Python through the binding, the fuzzers) check the strong error
// guarantee and snapshot round trips by comparing a cache's complete state before
// and after a call: equal states mean equal caches. That state is not part of the
// caches' interface (qvg/cache.h), so it lives here, read through a `detail`
// friend of the two host caches. It copies every byte the cache holds; the layout
// of these structs may change with the caches' internals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "qvg/cache.h"
#include "qvg/codec.h"

namespace qvg::detail {

/// The whole state of a DenseCausalCache.
struct DenseDebugState {
  std::vector<uint8_t> k, v;  ///< buffer bytes
  int64_t cache_size = 0, window = 0, global_end = 0, local_end = 0;
  size_t resident_nbytes = 0, peak_transient_nbytes = 0;
  std::vector<uint8_t> view_scratch;  ///< bytes behind the last copied view
  bool owns_storage = true;
  bool operator==(const DenseDebugState&) const = default;
};

/// One segment of a PackedCausalCache, with copies of everything it holds.
struct PackedSegmentState {
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false, packed = false;
  int chunks = 1;
  std::vector<uint8_t> k_raw, v_raw;
  EncodedTensor k_enc, v_enc;
  int64_t span = -1;                           ///< incremental span id
  std::optional<SpanCodebook> k_book, v_book;  ///< its codebooks (copies)
  std::optional<EncodedTensor> k_ref, v_ref;   ///< a refined chunk's layers
  bool operator==(const PackedSegmentState&) const = default;
};

/// The whole state of a PackedCausalCache.
struct PackedDebugState {
  std::vector<PackedSegmentState> segments;
  int64_t global_end = 0, local_end = 0;
  std::optional<int64_t> chunk_tokens;
  std::optional<EncodedTensor> warm_k, warm_v;
  size_t resident_nbytes = 0, peak_transient_nbytes = 0;
  std::vector<uint8_t> view_scratch;
  // Incremental spans: the open span (id, chunks, codebooks, reference energies),
  // the next span id and the adaptive breaks so far.
  int64_t open_span = -1, open_span_chunks = 0, next_span = 0, span_breaks = 0;
  std::optional<SpanCodebook> open_k_book, open_v_book;
  double open_k_energy = 0, open_v_energy = 0;
  bool operator==(const PackedDebugState&) const = default;
};

/// The friend of both host caches that reads their state.
struct TestAccess {
  static DenseDebugState state(const DenseCausalCache& c);
  static PackedDebugState state(const PackedCausalCache& c);
};

/// The whole state of `c` (a copy): equal states mean equal caches.
inline DenseDebugState debug_state(const DenseCausalCache& c) {
  return TestAccess::state(c);
}
inline PackedDebugState debug_state(const PackedCausalCache& c) {
  return TestAccess::state(c);
}

}  // namespace qvg::detail
