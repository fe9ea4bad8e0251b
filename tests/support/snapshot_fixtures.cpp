#include "support/snapshot_fixtures.h"

#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace qvg::testing {

Tensor lcg_kv(int64_t n, uint64_t seed) {
  Tensor t(DType::F32, {1, n, 2, 8});
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 8; ++d) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        t.set(0, s, h, d, float(double(st >> 11) * 0x1.0p-53 * 8.0 - 4.0));
      }
  return t;
}

CacheOptions small_cache_options() {
  CacheOptions o;
  o.batch = 1;
  o.cache_size = 16;
  o.heads = 2;
  o.head_dim = 8;
  o.dtype = DType::F32;
  o.sink_tokens = 2;
  return o;
}

QuantArgs small_quant() {
  QuantArgs q;
  q.enable(4);
  q.codec.block_size = 8;
  q.codec.centroids = 4;
  q.codec.stages = 2;
  q.codec.kmeans_iters = 2;
  q.keep_recent_chunks = 0;
  q.codec.init = Init::Warm;
  q.codec.threads = 1;
  return q;
}

PackedCausalCache small_packed_cache(std::optional<int> bits) {
  QuantArgs q = small_quant();
  if (bits)
    q.enable(*bits);
  else
    q.quantize = false;
  PackedCausalCache c(small_cache_options(), q);
  for (int64_t i = 0; i < 4; ++i) c.update(lcg_kv(4, uint64_t(2 * i)), lcg_kv(4, uint64_t(2 * i + 1)), 4 * i);
  return c;
}

QuantArgs small_incremental_quant(double ratio) {
  QuantArgs q = small_quant();
  q.span_mode = SpanMode::Incremental;
  q.span_chunks = 3;
  q.span_break_ratio = ratio;
  return q;
}

PackedCausalCache small_incremental_cache(int chunks, double ratio) {
  PackedCausalCache c(small_cache_options(), small_incremental_quant(ratio));
  for (int64_t i = 0; i < chunks; ++i) c.update(lcg_kv(4, uint64_t(2 * i)), lcg_kv(4, uint64_t(2 * i + 1)), 4 * i);
  return c;
}

DenseCausalCache small_dense_cache() {
  CacheOptions o = small_cache_options();
  o.cache_size = 8;
  o.allow_growth = true;
  DenseCausalCache c(o);
  for (int64_t i = 0; i < 3; ++i) c.update(lcg_kv(4, uint64_t(i)), lcg_kv(4, uint64_t(i + 9)), 4 * i);
  return c;
}

void fix_snapshot_checksums(std::vector<uint8_t>& b) {
  if (b.size() < 40) return;
  uint32_t n;
  std::memcpy(&n, b.data() + 16, 4);
  if (n > (b.size() - 40) / 32) return;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* e = b.data() + 40 + 32 * size_t(i);
    uint64_t off, len;
    std::memcpy(&off, e + 8, 8);
    std::memcpy(&len, e + 16, 8);
    if (off > b.size() || len > b.size() - off) continue;
    const uint64_t h = XXH64(b.data() + off, size_t(len), 0);
    std::memcpy(e + 24, &h, 8);
  }
  std::vector<uint8_t> covered(b.begin(), b.begin() + 32);
  covered.insert(covered.end(), b.begin() + 40, b.begin() + 40 + 32 * std::ptrdiff_t(n));
  const uint64_t h = XXH64(covered.data(), covered.size(), 0);
  std::memcpy(b.data() + 32, &h, 8);
}

}  // namespace qvg::testing
