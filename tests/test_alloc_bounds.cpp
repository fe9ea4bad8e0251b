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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/cache.h"
#include "qvg/error.h"
#include "qvg/file.h"
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

// The counter counts (every other test here would hold trivially if it counted
// nothing): each form of operator new reaches the peak and the largest
// request, frees leave the live count, nothing counts while off, and a reader's
// known allocation (parse_npy copies an array's data) is seen.
TEST(AllocBounds, TheCounterCounts) {
  constexpr int64_t kMiB = int64_t(1) << 20;
  const Measure m = measure([] {
    void* volatile a = ::operator new(size_t(3 * kMiB));
    void* volatile b = ::operator new[](size_t(kMiB));
    void* volatile c = ::operator new(size_t(kMiB), std::align_val_t(64));
    void* volatile d = ::operator new(size_t(kMiB), std::nothrow);
    ::operator delete(a);
    ::operator delete[](b);
    ::operator delete(c, std::align_val_t(64));
    ::operator delete(d);
    void* volatile e = ::operator new(size_t(2 * kMiB));  // after the frees: below the peak
    ::operator delete(e);
  });
  EXPECT_GE(m.peak, 6 * kMiB);
  EXPECT_LT(m.peak, 6 * kMiB + 64 * 1024);
  EXPECT_EQ(m.max_request, 3 * kMiB);
  EXPECT_EQ(g_live.load(), 0);
  // Off: nothing counts.
  void* volatile off = ::operator new(size_t(5 * kMiB));
  ::operator delete(off);
  EXPECT_EQ(g_max_request.load(), 3 * kMiB);
  // A reader: a 1 MiB float32 array is copied out of its file.
  NpyArray a;
  a.shape = {int64_t(kMiB / 4)};
  a.data = Bytes(size_t(kMiB), 1);
  const Bytes file = serialize_npy(a);
  const Measure r = measure([&] { (void)parse_npy(file); });
  EXPECT_GE(r.peak, kMiB);
  EXPECT_GE(r.max_request, kMiB);
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

// f(name, bytes, is_snapshot) for every file of the committed seed corpora of the
// reader fuzz targets (a snapshot seed without the target's flags byte); returns how
// many.
int for_each_seed(const std::function<void(const std::string&, const Bytes&, bool)>& f) {
  const fs::path corpus = fs::path(QVG_SOURCE_DIR) / "fuzz" / "corpus";
  int files = 0;
  for (const auto& dir : fs::directory_iterator(corpus)) {
    if (dir.path().filename() == "cache_api") continue;
    const bool snapshot = dir.path().filename() == "snapshot";
    for (const auto& file : fs::directory_iterator(dir.path())) {
      std::ifstream in(file.path(), std::ios::binary);
      Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (snapshot && !b.empty()) b.erase(b.begin());  // the target's flags byte
      f(file.path().filename().string(), b, snapshot);
      ++files;
    }
  }
  return files;
}

// The committed seed corpora of the fuzz targets and random mutations of them.
TEST(AllocBounds, SeedCorporaAndTheirMutations) {
  (void)max_threads();
  std::mt19937_64 rng(9);
  const int files = for_each_seed([&](const std::string& name, const Bytes& b, bool snapshot) {
    expect_bounded(b, name);
    for (int m = 0; m < 20; ++m) {
      Bytes x = b;
      for (int e = 0; e < 4 && !x.empty(); ++e) x[rng() % x.size()] = uint8_t(rng());
      if (snapshot && (m & 1)) testing::fix_snapshot_checksums(x);
      expect_bounded(x, name + " mutated");
    }
  });
  EXPECT_GT(files, 20);
}

// ---- header checks before reads (spec 5.1, "Files") -----------------------------------
// The path-taking readers check a file's header against the file's size before they
// read the file: a sparse file — a file of a few bytes (a valid seed, or a mutation of
// one) followed by a hole of gigabytes (its apparent size; nothing on disk) — is
// refused by every reader, and neither the peak nor any single request grows with the
// hole: at most 16 x the bytes before it + 1 MiB.

// The path-taking readers, each with the extension it reads.
struct PathReader {
  const char* name;
  const char* ext;
  std::function<void(const fs::path&)> read;
};
const std::vector<PathReader>& path_readers() {
  static const std::vector<PathReader> r = {
      {"read_tensor_file (.npy)", ".npy", [](const fs::path& p) { (void)read_tensor_file(p); }},
      {"read_tensor_file (.safetensors)", ".safetensors", [](const fs::path& p) { (void)read_tensor_file(p); }},
      {"read_safetensors", ".safetensors", [](const fs::path& p) { (void)read_safetensors(p); }},
      {"read_qvgt", ".qvgt", [](const fs::path& p) { (void)read_qvgt(p); }},
      {"inspect_qvgt", ".qvgt", [](const fs::path& p) { (void)inspect_qvgt(p); }},
      {"DenseCausalCache::load", ".snap", [](const fs::path& p) { (void)DenseCausalCache::load(p); }},
      {"PackedCausalCache::load", ".snap", [](const fs::path& p) { (void)PackedCausalCache::load(p); }},
      {"inspect_snapshot", ".snap", [](const fs::path& p) { (void)inspect_snapshot(p); }},
      {"is_snapshot_file", ".snap", [](const fs::path& p) { (void)is_snapshot_file(p); }},
  };
  return r;
}

// `head` followed by a hole of `hole` bytes, at `p`.
void put_sparse(const fs::path& p, const Bytes& head, uint64_t hole) {
  testing::put_file(p, head);
  fs::resize_file(p, head.size() + hole);
}

// Every path reader on `head` + a hole: refused (a reader of this library's errors,
// or is_snapshot_file's false), within the bound of the bytes before the hole.
void expect_sparse_refused(const Bytes& head, uint64_t hole, const std::string& what, int& checked) {
  testing::TempDir dir("qvg_sparse");
  const int64_t bound = kMultiple * int64_t(head.size()) + kSlack;
  for (const PathReader& r : path_readers()) {
    const fs::path p = dir / (std::string("f") + r.ext);
    put_sparse(p, head, hole);
    bool refused = false;
    const Measure m = measure([&] {
      try {
        r.read(p);
        refused = std::string(r.name) == "is_snapshot_file";  // it answers (without an error)
      } catch (const Error&) {
        refused = true;
      }
    });
    EXPECT_TRUE(refused) << r.name << " accepted " << what << " with a hole of " << hole << " bytes";
    EXPECT_LE(m.peak, bound) << r.name << " on " << what << " (" << head.size() << " bytes + a hole of " << hole << ")";
    EXPECT_LE(m.max_request, bound) << r.name << " on " << what << " asked for " << m.max_request << " bytes at once";
    ++checked;
  }
}

TEST(AllocBounds, SparseFilesAreRefusedBeforeTheirHoleIsRead) {
  (void)max_threads();
  int checked = 0;
  // The case as found: nothing but a hole of 2 GiB (a zero header).
  expect_sparse_refused({}, uint64_t(1) << 31, "a file of 2 GiB of zeros", checked);
  // Headers whose length fields claim what the hole holds: a safetensors / .qvgt
  // header of 100 MB, a .npy 2.0 dict of 4 GiB - 1; the hole reads as NUL bytes,
  // refused after the first 64 KiB.
  Bytes st(8, 0);
  const uint64_t n = 100'000'000;
  std::memcpy(st.data(), &n, 8);
  st.push_back('{');
  expect_sparse_refused(st, uint64_t(1) << 31, "a 100 MB safetensors header of zeros", checked);
  const Bytes npy = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff, '{'};
  expect_sparse_refused(npy, uint64_t(1) << 33, "a 4 GiB .npy header of zeros", checked);
  // Every seed file of the fuzz corpora, and mutations of its first 64 bytes (the
  // headers), followed by holes of about 2 GiB and 8 GiB.
  std::mt19937_64 rng(42);
  int seeds = 0;
  const int files = for_each_seed([&](const std::string& name, const Bytes& b, bool snapshot) {
    if (b.empty()) return;
    const uint64_t hole = (uint64_t(1) << (31 + 2 * (seeds++ % 2))) + rng() % 4096;
    expect_sparse_refused(b, hole, name, checked);
    for (int m = 0; m < 3; ++m) {
      Bytes x = b;
      for (int e = 0; e < 2; ++e) x[rng() % std::min<size_t>(x.size(), 64)] = uint8_t(rng());
      if (snapshot) testing::fix_snapshot_checksums(x);
      expect_sparse_refused(x, hole, name + " mutated", checked);
    }
  });
  EXPECT_GT(files, 20);
  std::printf("[ sparse  ] %d reader runs on %d seed files (and mutations) with holes of 2-8 GiB\n", checked, files);
}

}  // namespace
}  // namespace qvg
