// src/cache/plan_access.h — internal reads of what a packed cache decided (friend
// of qvg::PackedCausalCache): the simulator counts the spans and chunks an advance
// encoded, and hands its incremental chunks' decisions to the memory model, from
// the plan the cache executed rather than from the segment lists.
#pragma once

#include "cache/packed_plan.h"
#include "qvg/cache.h"

namespace qvg::detail {

struct PlanAccess {
  /// What the cache's last advance encoded (empty before its first advance and
  /// after reset_indices()); valid until the next mutating call.
  static const PackOutcome& last_advance(const PackedCausalCache& c);
};

}  // namespace qvg::detail
