// src/cache/dense_plan.h — the dense cache's decisions for one update() (spec 3.2):
// validation, rewrite or advance, growth, the eviction roll, where the chunk goes
// and the view's buffer ranges. A pure function of the arguments and the cursors,
// shared by the CPU qvg::DenseCausalCache and the device qvg::cuda::DenseCausalCache
// (which only move the bytes it decides).
#pragma once

#include <cstdint>
#include <optional>

#include "cache/cache_common.h"
#include "qvg/cache.h"
#include "qvg/tensor.h"

namespace qvg::detail {

/// The cursors and sizes a dense cache's plan depends on.
struct DenseState {
  int64_t capacity = 0;  ///< current cache_size (grows with allow_growth)
  int64_t window = 0;    ///< current attention window
  int64_t global_end = 0, local_end = 0;
};

/// A buffer range [begin, end) (local indices).
struct DenseRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

/// What one update() does.
struct DensePlan {
  CallArgs call;
  bool rewrite = false;
  int64_t new_capacity = 0, new_window = 0;  ///< after growth (== capacity, window without)
  int64_t evicted = 0, rolled = 0;  ///< eviction roll: buffer[sink + evicted, +rolled) -> buffer[sink, +rolled)
  int64_t chunk_at = 0;             ///< the chunk's buffer index
  int64_t new_global_end = 0, new_local_end = 0;
  DenseRange first, second;  ///< the view: buffer[first] ++ buffer[second] (second may be empty)
  int64_t view_tokens() const { return first.size() + second.size(); }
};

/// Validates one update() of a dense cache with options `opt` in state `st` (spec 5:
/// InvalidArgument, OutOfRange) and returns what it does. Does not read the
/// elements of key and value (the caller checks their values before any change).
DensePlan plan_dense_update(const CacheOptions& opt, const DenseState& st, ConstTensorView key, ConstTensorView value,
                            int64_t chunk_start, std::optional<int64_t> head_start,
                            std::optional<int64_t> recent_window);

/// Throws InvalidArgument unless (global_end, local_end) are cursors a dense cache of
/// `capacity` tokens can hold (DenseCausalCache::set_indices).
void check_dense_indices(int64_t capacity, int64_t global_end, int64_t local_end);

}  // namespace qvg::detail
