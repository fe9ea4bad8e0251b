// src/cache/snapshot_validate.h — private: the invariants of a state read from a
// snapshot (docs/snapshot.md, "What a reader checks", 4 and 5), checked before a
// cache is built from it. Where an invariant is a rule of a cache — the dense
// cursors set_indices() takes (dense_plan.h), the packed window's tail and the aging
// of refinement layers (cache_policy.h) — the check calls the cache's own function
// rather than restating it.
#pragma once

#include "cache/snapshot_state.h"

namespace qvg::detail::snap {

/// A dense state's sizes and cursors against its options (growth only with
/// allow_growth, the window following growth only when it was the whole cache,
/// cursors as set_indices() requires). Throws CorruptData naming "state".
void check_dense_state(const DenseStateData& d);

/// A packed state's invariants: segments against the cursors and the window, the
/// encoding order, refinement layers, warm-start codebooks, and the bookkeeping of
/// incremental spans. REQUIRES every segment and span read by read_packed (each
/// checked on its own). Throws CorruptData naming "state" or the span section.
void check_packed_state(const PackedStateData& d);

}  // namespace qvg::detail::snap
