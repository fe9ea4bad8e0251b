// libFuzzer target: the cache snapshot reader (docs/snapshot.md), both caches.
// Input: one flags byte, then the file. Flags: bit 0 — recompute the section and
// header checksums first (and bit 2 the file size field), so that mutations reach
// the structural checks behind the checksums; bit 1 — load as a dense cache (else
// packed).
// Properties: no crash or sanitizer report; loading throws only CorruptData /
// InvalidArgument; allocation within the stated bound; inspect never crashes; a
// loaded cache saves to the same bytes, reloads, and takes further calls (typed
// errors only, state unchanged by a failing call).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "fuzz_support.h"
#include "qvg/cache.h"
#include "qvg/error.h"
#include "qvg/snapshot.h"
#include "support/snapshot_fixtures.h"

namespace {

using namespace qvg;

template <class Cache>
void exercise(Cache& c) {
  const std::vector<uint8_t> s = c.snapshot_bytes();
  Cache again = Cache::from_snapshot_bytes(s);
  FUZZ_CHECK(again.snapshot_bytes() == s, "a reloaded snapshot saves other bytes");
  // A few calls: an advance at global_end and a rewrite of the last chunk.
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(c.cache_size(), 4));
  Tensor k(c.dtype(), {c.batch(), n, c.num_heads(), c.head_dim()});
  for (int64_t start : {c.global_end(), std::max<int64_t>(0, c.global_end() - n)}) {
    const std::vector<uint8_t> before = c.snapshot_bytes();
    try {
      (void)c.update(k, k, start);
    } catch (const Error& e) {
      FUZZ_CHECK(e.kind() != ErrorKind::CorruptData && e.kind() != ErrorKind::Device, "{}", e.what());
      FUZZ_CHECK(c.snapshot_bytes() == before, "a failing update changed the state: {}", e.what());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::vector<uint8_t> b(data + 1, data + size);
  if ((flags & 5) == 5 && b.size() >= 32) {  // the file size field too
    const uint64_t n = b.size();
    std::memcpy(b.data() + 24, &n, 8);
  }
  if (flags & 1) testing::fix_snapshot_checksums(b);
  try {
    (void)inspect_snapshot_bytes(b);
  } catch (const CorruptData&) {
  }
  // InvalidArgument: a snapshot of the other cache kind.
  if (flags & 2) {
    auto c = fuzz::bounded_parse("DenseCausalCache::from_snapshot_bytes", b.size(), true,
                                 [&] { return DenseCausalCache::from_snapshot_bytes(b); });
    if (c) exercise(*c);
  } else {
    auto c = fuzz::bounded_parse("PackedCausalCache::from_snapshot_bytes", b.size(), true,
                                 [&] { return PackedCausalCache::from_snapshot_bytes(b); });
    if (c) exercise(*c);
  }
  return 0;
}
