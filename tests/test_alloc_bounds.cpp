// The readers' allocation bound (docs/reliability.md): parsing any input allocates at
// most 16 x its size + 1 MiB at its peak, and never asks for more than that in one
// request — in particular not for what a header claims. This executable replaces the
// global operator new/delete to count live bytes and the largest request (the fuzz
// targets check the same bound with the sanitizer allocator hooks, every malloc
// included).
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/cache.h"
#include "qvg/error.h"
#include "qvg/io.h"
#include "qvg/snapshot.h"
#include "support/files.h"
#include "support/snapshot_fixtures.h"

namespace {

std::atomic<bool> g_on{false};
std::atomic<int64_t> g_live{0}, g_peak{0}, g_max_request{0};

void note_alloc(void* p, size_t n) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  int64_t m = g_max_request.load();
  while (int64_t(n) > m && !g_max_request.compare_exchange_weak(m, int64_t(n))) {
  }
  if (!p) return;
  const int64_t live = g_live.fetch_add(int64_t(malloc_usable_size(p))) + int64_t(malloc_usable_size(p));
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
}
void note_free(void* p) {
  if (p && g_on.load(std::memory_order_relaxed)) g_live.fetch_sub(int64_t(malloc_usable_size(p)));
}

}  // namespace

// Replacements of the global allocation functions (malloc-backed, as GCC cannot see).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  void* p = std::malloc(n ? n : 1);
  note_alloc(p, n);
  if (!p) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, std::align_val_t a) {
  void* p = std::aligned_alloc(size_t(a), (n + size_t(a) - 1) / size_t(a) * size_t(a));
  note_alloc(p, n);
  if (!p) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): a form left to the
// runtime would allocate with its allocator and free through ours (ASan: alloc-dealloc-mismatch).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  void* p = std::malloc(n ? n : 1);
  note_alloc(p, n);
  return p;
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  void* p = std::aligned_alloc(size_t(a), (n + size_t(a) - 1) / size_t(a) * size_t(a));
  note_alloc(p, n);
  return p;
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return operator new(n, a, t);
}
void operator delete(void* p) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete(void* p, size_t) noexcept { operator delete(p); }
void operator delete[](void* p, size_t) noexcept { operator delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { operator delete(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { operator delete(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { operator delete(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { operator delete(p); }
#pragma GCC diagnostic pop

namespace qvg {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using testing::st_bytes;

constexpr int64_t kMultiple = 16, kSlack = int64_t(1) << 20;

struct Measure {
  int64_t peak = 0, max_request = 0;
};

// Runs f (a parse) with counting on; its errors are swallowed (the bound holds either way).
template <class F>
Measure measure(F&& f) {
  g_live = 0;
  g_peak = 0;
  g_max_request = 0;
  g_on = true;
  try {
    f();
  } catch (const Error&) {
  }
  g_on = false;
  return {g_peak.load(), g_max_request.load()};
}

// Every reader on `b`: the bound holds for the peak and for the largest request.
void expect_bounded(const Bytes& b, const std::string& what) {
  const std::span<const uint8_t> s(b);
  const int64_t bound = kMultiple * int64_t(b.size()) + kSlack;
  const std::pair<const char*, std::function<void()>> readers[] = {
      {"parse_npy", [&] { (void)parse_npy(s); }},
      {"parse_safetensors", [&] { (void)parse_safetensors(s); }},
      {"parse_qvgt", [&] { (void)parse_qvgt(s); }},
      {"dense snapshot", [&] { (void)DenseCausalCache::from_snapshot_bytes(s); }},
      {"packed snapshot", [&] { (void)PackedCausalCache::from_snapshot_bytes(s); }},
      {"inspect_snapshot_bytes", [&] { (void)inspect_snapshot_bytes(s); }},
  };
  for (const auto& [name, f] : readers) {
    const Measure m = measure(f);
    EXPECT_LE(m.peak, bound) << name << " on " << what << " (" << b.size() << " bytes)";
    EXPECT_LE(m.max_request, bound) << name << " on " << what << " asked for " << m.max_request << " bytes at once";
  }
}

// Replaces the i64 value of config/state entry `key` (first occurrence) in place.
void set_entry(Bytes& b, const std::string& key, int64_t v) {
  Bytes k(4);
  const uint32_t len = uint32_t(key.size());
  std::memcpy(k.data(), &len, 4);
  k.insert(k.end(), key.begin(), key.end());
  k.push_back(1);  // type i64
  auto it = std::search(b.begin(), b.end(), k.begin(), k.end());
  ASSERT_NE(it, b.end()) << key;
  std::memcpy(&*(it + std::ptrdiff_t(k.size())), &v, 8);
}


TEST(AllocBounds, HeadersClaimingTerabyteShapesAllocateNothingOfIt) {
  (void)max_threads();  // the OpenMP runtime's one-time allocations are not a reader's
  const int64_t tb = int64_t(1) << 40;
  std::vector<std::pair<std::string, Bytes>> files;
  // .npy: a 4 TiB float32 array in a 128-byte file.
  {
    std::string d = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}", tb);
    d.append(size_t(117 - d.size() % 64) % 64, ' ');
    d.push_back('\n');
    // Filled by memcpy into a presized buffer (GCC 12 warns falsely on chained inserts).
    Bytes b(10 + d.size() + 16, 0);
    const uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(d.size()), uint8_t(d.size() >> 8)};
    std::memcpy(b.data(), prefix, 10);
    std::memcpy(b.data() + 10, d.data(), d.size());
    files.emplace_back("npy claiming 4 TiB", b);
  }
  // safetensors: a [2^20, 2^20] F32 tensor whose offsets claim 4 TiB of data.
  files.emplace_back("safetensors claiming 4 TiB",
                     st_bytes(fmt::format(R"({{"x":{{"dtype":"F32","shape":[1048576,1048576],"data_offsets":[0,{}]}}}})",
                                          uint64_t(4) << 40),
                              64));
  files.emplace_back("safetensors shape of 2^62 elements",
                     st_bytes(R"({"x":{"dtype":"U8","shape":[2147483648,2147483648],"data_offsets":[0,16]}})", 16));
  // .qvgt: metadata claiming [1, 2^40, 1, 8] tokens over small arrays.
  {
    CodecConfig c;
    c.centroids = 2;
    c.block_size = 8;
    Tensor x(DType::F32, {1, 4, 1, 8});
    SafetensorsFile st = parse_safetensors(serialize_qvgt(encode(x, c)));
    for (auto& [k, v] : st.metadata)
      if (k == "shape") v = fmt::format("[1,{},1,8]", tb);
    files.emplace_back(".qvgt claiming 2^40 tokens", serialize_safetensors(st));
  }
  // Snapshots: a dense cache of 2^40 tokens, a segment of 2^40 tokens, 2^31 segments.
  {
    CacheOptions o;
    o.cache_size = 8;
    o.head_dim = 8;
    DenseCausalCache d(o);
    Bytes b = d.snapshot_bytes();
    set_entry(b, "cache_size", tb);
    testing::fix_snapshot_checksums(b);
    files.emplace_back("dense snapshot of 2^40 tokens", b);
    Bytes p = testing::small_packed_cache(std::nullopt).snapshot_bytes();
    const SnapshotInfo info = inspect_snapshot_bytes(p);
    for (const SnapshotSectionInfo& s : info.sections)
      if (s.name == "segment 1") {
        const int64_t g1 = tb;
        std::memcpy(p.data() + s.offset + 8, &g1, 8);
      }
    testing::fix_snapshot_checksums(p);
    files.emplace_back("packed segment of 2^40 tokens", p);
    Bytes q = testing::small_packed_cache(4).snapshot_bytes();
    set_entry(q, "segments", int64_t(1) << 31);
    testing::fix_snapshot_checksums(q);
    files.emplace_back("2^31 segments", q);
  }
  for (const auto& [what, b] : files) expect_bounded(b, what);
  // And each is refused by its reader.
  EXPECT_THROW(parse_npy(files[0].second), CorruptData);
  EXPECT_THROW(parse_safetensors(files[1].second), CorruptData);
  EXPECT_THROW(parse_qvgt(files[3].second), CorruptData);
  EXPECT_THROW((void)DenseCausalCache::from_snapshot_bytes(files[4].second), CorruptData);
  EXPECT_THROW((void)PackedCausalCache::from_snapshot_bytes(files[5].second), CorruptData);
  EXPECT_THROW((void)PackedCausalCache::from_snapshot_bytes(files[6].second), CorruptData);
}

// The committed seed corpora of the fuzz targets and random mutations of them.
TEST(AllocBounds, SeedCorporaAndTheirMutations) {
  (void)max_threads();
  const fs::path corpus = fs::path(QVG_SOURCE_DIR) / "fuzz" / "corpus";
  std::mt19937_64 rng(9);
  int files = 0;
  for (const auto& dir : fs::directory_iterator(corpus)) {
    if (dir.path().filename() == "cache_api") continue;
    for (const auto& f : fs::directory_iterator(dir.path())) {
      std::ifstream in(f.path(), std::ios::binary);
      Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (dir.path().filename() == "snapshot" && !b.empty()) b.erase(b.begin());  // the target's flags byte
      expect_bounded(b, f.path().filename().string());
      for (int m = 0; m < 20; ++m) {
        Bytes x = b;
        for (int e = 0; e < 4 && !x.empty(); ++e) x[rng() % x.size()] = uint8_t(rng());
        if (dir.path().filename() == "snapshot" && (m & 1)) testing::fix_snapshot_checksums(x);
        expect_bounded(x, f.path().filename().string() + " mutated");
      }
      ++files;
    }
  }
  EXPECT_GT(files, 20);
}

}  // namespace
}  // namespace qvg
