// src/cache/snapshot_records.h — private: the records of the two caches' snapshots
// (docs/snapshot.md, "Layout"): a cache's state (snapshot_state.h) as the sections of
// a file, and back. Dense: snapshot_dense.cpp; packed: snapshot_packed.cpp. Reading
// validates everything before anything is built (snapshot_validate.h holds the
// invariants of a loaded state); every allocation is bounded by the section it fills.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/snapshot_io.h"
#include "cache/snapshot_state.h"

namespace qvg::detail::snap {

/// The sections of a cache's file and the format minor it needs.
struct Written {
  std::vector<SectionOut> sections;  ///< borrow the cache's data: valid while the state is
  uint16_t minor = 0;
};

Written write_dense(const DenseStateRef& st);
/// Throws CorruptData naming the section, or InvalidArgument (another cache kind, a
/// differing expectation).
DenseStateData read_dense(const Source& src, const SnapshotExpectation& x);

Written write_packed(const PackedStateRef& st);
/// Errors as read_dense.
PackedStateData read_packed(const Source& src, const SnapshotExpectation& x);

}  // namespace qvg::detail::snap
