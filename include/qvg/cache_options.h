// qvg/cache_options.h — the constructor arguments shared by both causal caches
// (spec 3.1; the caches are in qvg/cache.h). Their own header so that what is told
// about a cache without one — a snapshot's expectation (qvg/snapshot.h) — can name
// them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "qvg/tensor.h"

namespace qvg {

class ViewScratch;  // qvg/view.h: memory that backs copied views

/// The constructor arguments shared by both caches (spec 3.1). Validated once,
/// at construction; the cache trusts them afterwards.
struct CacheOptions {
  int64_t batch = 1;          ///< B >= 1
  int64_t cache_size = 0;     ///< tokens the cache holds, >= 1
  int64_t heads = 1;          ///< H >= 1
  int64_t head_dim = 0;       ///< D >= 1
  DType dtype = DType::BF16;  ///< of every key/value passed in and of the views
  int64_t sink_tokens = 0;    ///< 0 <= sink_tokens <= cache_size: leading tokens never evicted
  /// Tokens a view shows (1..cache_size); nullopt = cache_size.
  std::optional<int64_t> attention_window_size;
  /// Dense only: grow the buffer instead of evicting (the packed cache rejects it).
  bool allow_growth = false;
  /// Backing memory of copied views; nullptr: the cache owns its own. See ViewScratch.
  std::shared_ptr<ViewScratch> view_scratch;
  /// The global index of this cache's head 0 when the cache holds a shard of a
  /// wider cache's heads (sequence parallelism: rank r holds heads [r * H, r * H + H)).
  /// Packed spans are encoded with CodecConfig::head_offset = head_offset, so a
  /// shard's encodings equal the wide cache's for the same heads. 0..2^40; 0 = a
  /// whole cache. The dense cache ignores it (it encodes nothing).
  int64_t head_offset = 0;

  /// The window in tokens (attention_window_size or cache_size).
  int64_t window() const { return attention_window_size.value_or(cache_size); }
  /// Throws InvalidArgument naming the field for any value outside its range.
  void validate() const;
};

}  // namespace qvg
