// tests/support/snapshot_fixtures.h — small deterministic caches whose snapshots the
// tests, the golden file (tests/data/golden_packed.qvgs) and the fuzz seed corpora
// are made of.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qvg/cache.h"
#include "qvg/tensor.h"

namespace qvg::testing {

/// f32 [1, n, 2, 8] values in [-4, 4) from a test-local LCG (independent of qvg's PRNGs).
Tensor lcg_kv(int64_t n, uint64_t seed);

/// B = 1, cache_size 16, 2 heads, head_dim 8, f32, 2 sink tokens.
CacheOptions small_cache_options();
/// int4, block 8, K = 4, 2 stages, keep_recent 0, init warm, threads 1.
QuantArgs small_quant();
/// A packed cache after four chunks of 4 tokens (lcg_kv seeds 2i, 2i + 1): a packed
/// sink chunk, packed non-sink chunks, the raw current chunk, warm codebooks. With
/// `bits` nullopt, quantization off (every segment raw).
PackedCausalCache small_packed_cache(std::optional<int> bits = 4);
/// small_quant() with incremental spans of up to 3 chunks and adaptive boundaries
/// (span_mode = incremental, span_break_ratio `ratio`).
QuantArgs small_incremental_quant(double ratio = 2.0);
/// A packed cache with incremental spans after `chunks` chunks of 4 tokens (lcg_kv
/// seeds 2i, 2i + 1; small_cache_options(), small_incremental_quant(ratio)). The
/// default holds a packed sink chunk [0, 4), span 2 (one chunk, [12, 16)), the open
/// span 3 (two chunks of three, [16, 24)), the raw current chunk; 3 breaks so far.
PackedCausalCache small_incremental_cache(int chunks = 7, double ratio = 2.0);
/// A dense cache of cache_size 8 with allow_growth, grown to 16 by three chunks of 4.
DenseCausalCache small_dense_cache();

/// Recomputes the checksums of a snapshot (section checksums in the table, then the
/// header checksum) from the format of docs/snapshot.md, so that a crafted change
/// reaches the checks behind them. Leaves bytes it cannot make sense of alone.
void fix_snapshot_checksums(std::vector<uint8_t>& b);

}  // namespace qvg::testing
