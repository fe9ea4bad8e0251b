// Tests of cache snapshots (docs/snapshot.md; qvg/cache.h save/load, qvg/snapshot.h).
//
//   * round trips: random call sequences on both caches (quantization on and off,
//     deferred and incremental spans), saved mid-way and loaded into a twin; every
//     later call must give the same views, segments, cursors and resident_nbytes()
//     on both, errors included; incremental spans saved mid-span, with breaks, their
//     codebooks shared again by their chunks;
//   * every truncation and every flipped byte of small snapshots is CorruptData naming
//     a section, and so are foreign files; another configuration than expected is
//     InvalidArgument naming the field;
//   * an interrupted save (killed writer, failing writes) leaves the old file loadable;
//   * a golden snapshot committed to the repository loads bit-exactly.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "kernels/kernels.h"
#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "qvg/io.h"
#include "qvg/snapshot.h"
#include "support/cache_model.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/snapshot_fixtures.h"

namespace qvg {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using testing::Call;
using testing::error_of;
using testing::file_bytes;
using testing::Outcome;
using testing::put_file;
using testing::TempDir;

// ---- random scenarios ---------------------------------------------------------------

struct Scenario {
  CacheOptions o;
  QuantArgs q;
  testing::ScenarioParams p;
  std::vector<int64_t> sizes;  // chunk sizes
};

// `incremental`: spans always incremental, with adaptive boundaries (else as
// testing::random_quant() draws them: deferred or incremental).
Scenario random_scenario(std::mt19937_64& rng, bool packed, std::optional<int> bits, bool incremental = false) {
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Scenario s;
  s.p.B = ri(1, 2);
  s.p.H = ri(1, 3);
  s.p.D = bits ? (ri(0, 1) ? 8 : 16) : (ri(0, 1) ? 4 : 8);
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  s.p.dtype = dts[ri(0, 2)];
  s.p.base_chunk = ri(1, 6);
  s.p.steps_max = 3;
  for (int i = 0; i < 40; ++i) s.sizes.push_back(ri(std::max<int64_t>(1, s.p.base_chunk - 2), s.p.base_chunk + 2));
  const int64_t maxn = *std::max_element(s.sizes.begin(), s.sizes.end());
  CacheOptions& o = s.o;
  o.batch = s.p.B;
  o.heads = s.p.H;
  o.head_dim = s.p.D;
  o.dtype = s.p.dtype;
  o.sink_tokens = ri(0, 2) == 0 ? 0 : ri(0, s.sizes[0] + s.sizes[1]);
  o.cache_size = o.sink_tokens + ri(maxn, 5 * s.p.base_chunk + 2);
  if (ri(0, 2) == 0) o.attention_window_size = ri(std::min(o.cache_size, maxn + o.sink_tokens), o.cache_size);
  if (ri(0, 3) == 0) o.head_offset = ri(1, 64);  // a head shard (format 1.2)
  if (!packed && ri(0, 2) == 0) {
    o.allow_growth = true;
    o.attention_window_size.reset();
  }
  if (bits) {
    s.q = testing::random_quant(rng, *bits, s.p.D);
    if (incremental) {
      s.q.span_mode = SpanMode::Incremental;
      s.q.span_chunks = int(ri(2, 4));
      const double ratios[] = {1.02, 1.1, 1.5, 2.0};
      s.q.span_break_ratio = ratios[ri(0, 3)];
    }
  }
  return s;
}

// The calls of the next chunk of a scenario: sequential, 1-3 denoising steps; the
// dense cache also gets an occasional rewrite of an older chunk.
std::vector<Call> next_calls(std::mt19937_64& rng, const Scenario& s, int64_t global_end, size_t chunk) {
  const int64_t n = s.sizes[chunk % s.sizes.size()];
  return testing::chunk_calls(rng, s.p, global_end, n);
}

// A call that must fail: a bad start, a negative rw or a wrong head slice.
Call bad_call(std::mt19937_64& rng, const Scenario& s, int64_t global_end) {
  Call c;
  c.k = testing::random_tensor(rng, s.p.dtype, {s.p.B, 1, s.p.H, s.p.D});
  c.v = c.k;
  switch (rng() % 3) {
    case 0: c.c = global_end + 1 + int64_t(rng() % 5); break;  // packed: non-sequential
    case 1: c.c = global_end, c.rw = -1; break;
    default: c.c = global_end, c.hs = s.p.H; break;
  }
  return c;
}

// Both caches get `call`; their outcomes, views and states must be equal.
template <class Cache>
void same_call(Cache& a, Cache& b, const Call& call, int& errors) {
  const Outcome x = testing::run_call(a, call), y = testing::run_call(b, call);
  ASSERT_EQ(x.error.has_value(), y.error.has_value()) << x.message << " | " << y.message;
  if (x.error) {
    ++errors;
    ASSERT_EQ(int(*x.error), int(*y.error));
    ASSERT_EQ(x.message, y.message);
  } else {
    ASSERT_EQ(testing::compare_views(x.view, y.view), "") << "c=" << call.c;
    ASSERT_EQ(x.view.local_start_index, y.view.local_start_index);
    ASSERT_EQ(x.view.local_end_index, y.view.local_end_index);
    ASSERT_EQ(x.view.visible_local_end, y.view.visible_local_end);
    ASSERT_EQ(x.view.visible_global_end, y.view.visible_global_end);
    ASSERT_EQ(x.view.zero_copy, y.view.zero_copy);
  }
  ASSERT_EQ(a.resident_nbytes(), b.resident_nbytes());
  ASSERT_EQ(a.global_end(), b.global_end());
  ASSERT_EQ(a.local_end(), b.local_end());
  ASSERT_EQ(a.cache_size(), b.cache_size());
}

void same_state(const DenseCausalCache& a, const DenseCausalCache& b) {
  auto x = qvg::detail::debug_state(a), y = qvg::detail::debug_state(b);
  x.view_scratch.clear(), y.view_scratch.clear();
  x.owns_storage = y.owns_storage = true;
  x.peak_transient_nbytes = y.peak_transient_nbytes = 0;
  ASSERT_TRUE(x == y);
}
void same_state(const PackedCausalCache& a, const PackedCausalCache& b) {
  auto x = qvg::detail::debug_state(a), y = qvg::detail::debug_state(b);
  x.view_scratch.clear(), y.view_scratch.clear();
  x.peak_transient_nbytes = y.peak_transient_nbytes = 0;
  ASSERT_TRUE(x == y);
  ASSERT_EQ(a.warm_state_nbytes(), b.warm_state_nbytes());
  ASSERT_EQ(a.chunk_tokens(), b.chunk_tokens());
  ASSERT_EQ(a.span_breaks(), b.span_breaks());
}

// The chunks of an incremental span share one pair of codebooks (the same objects),
// distinct spans have their own, and resident_nbytes() counts each span's once.
void spans_shared(const PackedCausalCache& c) {
  size_t want = 0;
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto s = c.segment(i);
    want += s.nbytes;
    ASSERT_EQ(s.span >= 0, s.k_codebook != nullptr) << "segment " << i;
    ASSERT_EQ(s.span >= 0, s.v_codebook != nullptr) << "segment " << i;
    if (s.span < 0) continue;
    const bool first_of_span = i == 0 || c.segment(i - 1).span != s.span;
    if (first_of_span) {
      for (const auto& b : s.k_codebook->centroid) want += b.size();
      for (const auto& b : s.v_codebook->centroid) want += b.size();
      if (i > 0) {
        ASSERT_NE(c.segment(i - 1).k_codebook, s.k_codebook) << "segment " << i;
      }
    } else {
      ASSERT_EQ(c.segment(i - 1).k_codebook, s.k_codebook) << "segment " << i;
      ASSERT_EQ(c.segment(i - 1).v_codebook, s.v_codebook) << "segment " << i;
    }
  }
  ASSERT_EQ(c.resident_nbytes(), want);
}

struct RoundTripStats {
  int sequences = 0, calls = 0, errors = 0, snapshots = 0, via_file = 0, packed_segments = 0, warm = 0, grown = 0;
  int incremental = 0, mid_span = 0, spans_saved = 0, breaks = 0, refined_saved = 0;
};

template <class Cache>
Cache load_twin(const Cache& a, int64_t head_offset, std::mt19937_64& rng, const TempDir& dir, RoundTripStats& st) {
  const Bytes bytes = a.snapshot_bytes();
  ++st.snapshots;
  if constexpr (std::is_same_v<Cache, PackedCausalCache>) {
    const auto d = qvg::detail::debug_state(a);
    // Saved while the open span can still take chunks.
    st.mid_span += d.open_span >= 0 && d.open_span_chunks < a.quant_args().span_chunks;
    for (const SnapshotSectionInfo& s : inspect_snapshot_bytes(bytes, false).sections)
      st.spans_saved += s.name.starts_with("span ");
    // The lowest version the cache needs: 1.4 for refinement layers (or a refine_bits
    // other than the default: every setting not at its default is stored), 1.2 for a
    // head_offset, 1.1 for spans, else 1.0.
    const bool v11 = a.quant_args().span_mode == SpanMode::Incremental || a.quant_args().span_break_ratio != 0;
    const bool v14 = a.quant_args().refine_recent > 0 || a.quant_args().refine_bits != 4;
    EXPECT_EQ(int(inspect_snapshot_bytes(bytes, false).minor), v14 ? 4 : head_offset ? 2 : v11 ? 1 : 0);
    for (const auto& g : d.segments) st.refined_saved += g.k_ref.has_value();
  } else {
    EXPECT_EQ(int(inspect_snapshot_bytes(bytes, false).minor), head_offset ? 2 : 0);
  }
  SnapshotExpectation x;
  if (rng() % 2) {
    const fs::path p = dir / "s.qvgs";
    a.save(p);
    ++st.via_file;
    EXPECT_EQ(file_bytes(p), bytes);  // save() writes exactly snapshot_bytes()
    Cache b = Cache::load(p, x);
    EXPECT_EQ(b.snapshot_bytes(), bytes);  // canonical: a reload saves the same bytes
    return b;
  }
  Cache b = Cache::from_snapshot_bytes(bytes, x);
  EXPECT_EQ(b.snapshot_bytes(), bytes);
  return b;
}

// One sequence: some chunks on `a`, snapshot, load `b`, then more chunks (and bad
// calls) on both, with a second snapshot of `b` into `c` half-way.
template <class Cache>
void round_trip(uint64_t seed, bool packed, std::optional<int> bits, RoundTripStats& st, bool incremental = false) {
  std::mt19937_64 rng(seed);
  const Scenario s = random_scenario(rng, packed, bits, incremental);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " cs=" << s.o.cache_size << " sink=" << s.o.sink_tokens
                                    << " window=" << s.o.window() << " growth=" << s.o.allow_growth
                                    << " quant: " << s.q.describe());
  const TempDir dir("qvg_test_snapshot");
  auto make = [&] {
    if constexpr (std::is_same_v<Cache, PackedCausalCache>)
      return PackedCausalCache(s.o, s.q);
    else
      return DenseCausalCache(s.o);
  };
  Cache a = make();
  size_t chunk = 0;
  const size_t before = 2 + rng() % 8, after = 3 + rng() % 8;
  for (; chunk < before; ++chunk)
    for (const Call& call : next_calls(rng, s, a.global_end(), chunk)) (void)testing::run_call(a, call);
  if (rng() % 10 == 0) a.reset_indices();  // snapshots of a reset cache too
  Cache b = load_twin(a, s.o.head_offset, rng, dir, st);
  same_state(a, b);
  if (::testing::Test::HasFatalFailure()) return;
  if constexpr (std::is_same_v<Cache, PackedCausalCache>) {
    spans_shared(b);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (size_t k = 0; k < after; ++k, ++chunk) {
    if (k == after / 2) {  // a snapshot of the loaded cache loads too
      Cache c = load_twin(b, s.o.head_offset, rng, dir, st);
      b = std::move(c);
    }
    for (const Call& call : next_calls(rng, s, a.global_end(), chunk)) {
      ++st.calls;
      same_call(a, b, call, st.errors);
      if (::testing::Test::HasFatalFailure()) return;
    }
    if (rng() % 4 == 0) {
      same_call(a, b, bad_call(rng, s, a.global_end()), st.errors);
      if (::testing::Test::HasFatalFailure()) return;
    }
    same_state(a, b);
    if (::testing::Test::HasFatalFailure()) return;
  }
  if constexpr (std::is_same_v<Cache, PackedCausalCache>) {
    spans_shared(b);
    if (::testing::Test::HasFatalFailure()) return;
    const Bytes end = a.snapshot_bytes();
    ASSERT_EQ(b.snapshot_bytes(), end);  // equal caches save equal bytes
    for (size_t i = 0; i < a.num_segments(); ++i) st.packed_segments += a.segment(i).packed;
    st.warm += a.warm_state_nbytes() > 0;
    st.incremental += s.q.span_mode == SpanMode::Incremental;
    st.breaks += int(a.span_breaks());
  } else {
    st.grown += a.cache_size() != s.o.cache_size;
  }
  ++st.sequences;
}

TEST(SnapshotRoundTrip, EveryLaterCallEqualsTheSavedCache) {
  RoundTripStats st;
  const auto t0 = std::chrono::steady_clock::now();
  const int n = testing::scaled(140, 35);  // x 4 configurations: 560 sequences (140 under the sanitizers)
  for (int i = 0; i < n; ++i) {
    round_trip<DenseCausalCache>(1000 + uint64_t(i), false, std::nullopt, st);
    round_trip<PackedCausalCache>(2000 + uint64_t(i), true, std::nullopt, st);
    round_trip<PackedCausalCache>(3000 + uint64_t(i), true, 4, st);
    round_trip<PackedCausalCache>(4000 + uint64_t(i), true, 2, st);
    if (HasFatalFailure()) return;
  }
  std::printf(
      "snapshot round trips: %d sequences (dense, packed off, int4, int2), %d snapshots (%d through files), %d later "
      "calls (%d rejected alike), %d packed segments at the end, %d with warm codebooks, %d grown dense caches, "
      "%.1f s\n",
      st.sequences, st.snapshots, st.via_file, st.calls, st.errors, st.packed_segments, st.warm, st.grown,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_GE(st.sequences, testing::scaled(500, 125));
  EXPECT_GT(st.packed_segments, testing::scaled(100, 20));
  EXPECT_GT(st.warm, testing::scaled(5, 1));
  EXPECT_GT(st.grown, testing::scaled(5, 1));
  EXPECT_GT(st.errors, testing::scaled(50, 10));
  EXPECT_GT(st.incremental, testing::scaled(50, 10));
}

// Incremental spans with adaptive boundaries: saved mid-span and across breaks, the
// loaded cache takes every later call as the saved one would (views bit for bit,
// segments, span ids, codebooks shared by a span's chunks, resident_nbytes(),
// span_breaks()) and saves the same bytes.
TEST(SnapshotRoundTrip, IncrementalSpansContinueBitForBit) {
  RoundTripStats st;
  const auto t0 = std::chrono::steady_clock::now();
  const int n = testing::scaled(120, 30);
  for (int i = 0; i < n; ++i) {
    round_trip<PackedCausalCache>(6000 + uint64_t(i), true, i % 2 ? 2 : 4, st, true);
    if (HasFatalFailure()) return;
  }
  std::printf(
      "incremental round trips: %d sequences, %d snapshots (%d mid-span, %d span sections), %d later calls (%d "
      "rejected alike), %d span breaks at the end, %d refined chunks saved, %.1f s\n",
      st.sequences, st.snapshots, st.mid_span, st.spans_saved, st.calls, st.errors, st.breaks, st.refined_saved,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_EQ(st.incremental, n);
  EXPECT_GT(st.mid_span, testing::scaled(20, 5));
  EXPECT_GT(st.spans_saved, testing::scaled(100, 20));
  EXPECT_GT(st.breaks, testing::scaled(50, 10));
  EXPECT_GT(st.refined_saved, testing::scaled(20, 3));  // refinement layers (format 1.4) saved and continued
}

// ---- small fixed snapshots (tests/support/snapshot_fixtures) ------------------------------

TEST(SnapshotFormat, SmallSnapshotsHoldWhatTheCacheHolds) {
  const PackedCausalCache p = testing::small_packed_cache();
  size_t packed_segs = 0;
  for (size_t i = 0; i < p.num_segments(); ++i) packed_segs += p.segment(i).packed;
  ASSERT_GE(packed_segs, 2u);
  ASSERT_GT(p.warm_state_nbytes(), 0u);
  const Bytes b = p.snapshot_bytes();
  const SnapshotInfo info = inspect_snapshot_bytes(b);
  EXPECT_EQ(info.major, kSnapshotMajor);
  EXPECT_EQ(info.cache, "packed");
  EXPECT_EQ(info.device, "cpu");
  EXPECT_EQ(info.file_bytes, b.size());
  EXPECT_TRUE(info.checksums_ok());
  EXPECT_EQ(info.sections.size(), 2 + p.num_segments() + 2);  // config, state, segments, warm_k, warm_v
  EXPECT_EQ(info.sections.back().name, "warm_v");
  // Little-endian and says so: the byte-order mark 0x01020304 is stored as 04 03 02 01.
  EXPECT_EQ(Bytes(b.begin() + 12, b.begin() + 16), (Bytes{4, 3, 2, 1}));
  EXPECT_TRUE(is_snapshot_bytes(b));
  const DenseCausalCache d = testing::small_dense_cache();
  ASSERT_EQ(d.cache_size(), 16);  // grew from 8
  const SnapshotInfo di = inspect_snapshot_bytes(d.snapshot_bytes());
  EXPECT_EQ(di.cache, "dense");
  EXPECT_EQ(di.sections.size(), 4u);
  bool found = false;
  for (const auto& [k, v] : di.state) found = found || (k == "cache_size" && v == "16");
  EXPECT_TRUE(found);
}

// Every truncation and every flipped byte is refused: CorruptData naming a section,
// never a crash, never a cache.
template <class Cache>
int corruption_cases(const Bytes& good, bool all_masks) {
  int cases = 0;
  auto refused = [&](const Bytes& m, const std::string& what) {
    ++cases;
    try {
      (void)Cache::from_snapshot_bytes(m);
      ADD_FAILURE() << what << ": accepted";
    } catch (const CorruptData& e) {
      const std::string msg = e.what();
      if (msg.rfind("invalid snapshot: ", 0) != 0) ADD_FAILURE() << what << ": " << msg;
    }
  };
  for (size_t n = 0; n < good.size(); ++n)
    refused(Bytes(good.begin(), good.begin() + std::ptrdiff_t(n)), fmt::format("prefix {}", n));
  const std::vector<uint8_t> masks =
      all_masks ? std::vector<uint8_t>{1, 2, 4, 8, 16, 32, 64, 128, 0xff} : std::vector<uint8_t>{1, 0x80, 0xff};
  for (size_t i = 0; i < good.size(); ++i)
    for (uint8_t m : masks) {
      Bytes x = good;
      x[i] ^= m;
      refused(x, fmt::format("byte {} ^ 0x{:02x}", i, m));
      if (::testing::Test::HasFailure()) return cases;
    }
  // Bytes appended.
  Bytes longer = good;
  longer.push_back(0);
  refused(longer, "one byte appended");
  return cases;
}

TEST(SnapshotFormat, EveryTruncationAndFlippedByteIsCorruptData) {
  const bool all = !testing::small_scale();
  const Bytes p = testing::small_packed_cache().snapshot_bytes(), d = testing::small_dense_cache().snapshot_bytes();
  const Bytes inc = testing::small_incremental_cache().snapshot_bytes();
  const int n = corruption_cases<PackedCausalCache>(p, all) + corruption_cases<DenseCausalCache>(d, all) +
                corruption_cases<PackedCausalCache>(inc, all);
  std::printf("corruption cases refused: %d (packed snapshot %zu bytes, dense %zu bytes, incremental %zu bytes)\n", n,
              p.size(), d.size(), inc.size());
  EXPECT_NO_THROW((void)PackedCausalCache::from_snapshot_bytes(p));
  EXPECT_NO_THROW((void)DenseCausalCache::from_snapshot_bytes(d));
  EXPECT_NO_THROW((void)PackedCausalCache::from_snapshot_bytes(inc));
}

TEST(SnapshotFormat, ErrorsNameTheSection) {
  for (const Bytes& p :
       {testing::small_packed_cache().snapshot_bytes(), testing::small_incremental_cache().snapshot_bytes()}) {
    const SnapshotInfo info = inspect_snapshot_bytes(p);
    for (const SnapshotSectionInfo& s : info.sections) {
      Bytes x = p;
      x[size_t(s.offset + s.length / 2)] ^= 0x10;
      const std::string m = error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(x); }, ErrorKind::CorruptData);
      EXPECT_NE(m.find(fmt::format("invalid snapshot: {}: checksum mismatch", s.name)), std::string::npos) << m;
      // inspect reports it instead of throwing.
      const SnapshotInfo bad = inspect_snapshot_bytes(x);
      EXPECT_FALSE(bad.checksums_ok());
      for (const SnapshotSectionInfo& t : bad.sections) EXPECT_EQ(*t.checksum_ok, t.name != s.name) << t.name;
    }
    Bytes x = p;
    x[20] ^= 1;  // the header's reserved field
    EXPECT_NE(error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(x); }, ErrorKind::CorruptData)
                  .find("invalid snapshot: header: checksum mismatch"),
              std::string::npos);
    x = Bytes(p.begin(), p.end() - 1);
    EXPECT_NE(
        error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(x); }, ErrorKind::CorruptData).find("(truncated)"),
        std::string::npos);
  }
}

// Files whose checksums are right but whose content no cache could have: refused,
// naming the section, by the checks behind the checksums (docs/snapshot.md, "What a
// reader checks").
TEST(SnapshotFormat, ImpossibleStatesWithValidChecksumsAreRefused) {
  const Bytes good = testing::small_packed_cache().snapshot_bytes();
  const SnapshotInfo info = inspect_snapshot_bytes(good);
  auto section = [&](const std::string& name) {
    for (const SnapshotSectionInfo& s : info.sections)
      if (s.name == name) return s;
    throw std::runtime_error("no section " + name);
  };
  // Segment header fields: g0 (i64), g1 (i64), is_sink, packed (u8), chunks, flags (u32).
  auto with = [&](const std::string& sec, size_t at, std::vector<uint8_t> bytes) {
    Bytes b = good;
    std::memcpy(b.data() + section(sec).offset + at, bytes.data(), bytes.size());
    testing::fix_snapshot_checksums(b);
    return b;
  };
  auto refused = [&](const Bytes& b, const std::string& where, const std::string& what) {
    const std::string m = error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(b); }, ErrorKind::CorruptData);
    EXPECT_NE(m.find("invalid snapshot: " + where + ": "), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  refused(with("segment 3", 22, {1, 0, 0, 0}), "segment 3", "flags 0x1");
  refused(with("segment 1", 16, {1}), "segment 1", "is_sink = true for a segment starting at 4");
  refused(with("segment 3", 18, {2, 0, 0, 0}), "segment 3", "a raw segment holds one chunk");
  refused(with("segment 3", 16, {2}), "segment 3", "must be 0 or 1");
  refused(with("segment 2", 0, {9, 0, 0, 0, 0, 0, 0, 0}), "segment 2", "encoding");  // [9, 12): 3 tokens
  refused(with("segment 3", 0, {13, 0, 0, 0, 0, 0, 0, 0}), "segment 3", "bytes of K and V");
  // A raw value update() would refuse (NaN), with the right checksum.
  {
    Bytes b = good;
    const float nan = std::nanf("");
    std::memcpy(b.data() + section("segment 3").offset + 26 + 8, &nan, 4);
    testing::fix_snapshot_checksums(b);
    refused(b, "segment 3", "raw K must hold finite values");
  }
  // A global_end the segments do not end at.
  {
    Bytes b = good;
    const SnapshotSectionInfo st = section("state");
    const std::string key = "global_end";
    auto it = std::search(b.begin() + std::ptrdiff_t(st.offset), b.end(), key.begin(), key.end());
    ASSERT_NE(it, b.end());
    *(it + std::ptrdiff_t(key.size()) + 1) = 17;  // after the type byte: the i64's low byte
    testing::fix_snapshot_checksums(b);
    refused(b, "state", "the last segment ends at 16, global_end is 17");
  }
  // The warm flag off while warm sections follow.
  {
    Bytes b = good;
    const std::string key = "warm";
    auto it = std::search(b.begin() + std::ptrdiff_t(section("state").offset), b.end(), key.begin(), key.end());
    ASSERT_NE(it, b.end());
    *(it + std::ptrdiff_t(key.size()) + 1) = 0;
    testing::fix_snapshot_checksums(b);
    refused(b, "section table", "section 6 is 'warm_k', expected the end of the file");
  }
  // Values that would decode to Inf inside a packed segment's encoding (scale_factor).
  {
    PackedCausalCache c(testing::small_cache_options(), testing::small_quant());
    c.update(testing::lcg_kv(4, 1), testing::lcg_kv(4, 2), 0);
    c.update(testing::lcg_kv(4, 3), testing::lcg_kv(4, 4), 4);  // segment 0 packed
    Bytes b = c.snapshot_bytes();
    const SnapshotInfo ci = inspect_snapshot_bytes(b);
    ASSERT_EQ(ci.sections[2].name, "segment 0");
    // The K encoding's scale_factor: the last 4 bytes before the V encoding begins are
    // K's [B, H] = 2 factors; find them as the first group factor of K.
    const EncodedTensor k_enc = *c.segment(0).k_enc;
    const size_t k_arrays = k_enc.nbytes();
    const size_t k_layout = 4 + 3 + 32 + 16 + 1 + 4 + 8 + 4 + 9;  // dtype "f32", shape, 4 x i32, bool, strings
    const size_t factor_at = size_t(ci.sections[2].offset) + 26 + k_layout + k_arrays - 8;
    float f;
    std::memcpy(&f, b.data() + factor_at, 4);
    ASSERT_EQ(f, k_enc.scale_factor[0]);
    f = 3e38f;
    std::memcpy(b.data() + factor_at, &f, 4);
    testing::fix_snapshot_checksums(b);
    refused(b, "segment 0", "keeps every decoded value finite");
  }
}

// ---- crafting snapshots: sections and entries rewritten, checksums fixed -----------------

// The file with section `name`'s bytes replaced by `content` (the table's offsets and
// lengths, the file size and every checksum recomputed).
Bytes with_section(const Bytes& file, const std::string& name, const Bytes& content) {
  const SnapshotInfo info = inspect_snapshot_bytes(file, false);
  Bytes out(file.begin(), file.begin() + 40 + 32 * std::ptrdiff_t(info.sections.size()));
  bool found = false;
  for (size_t i = 0; i < info.sections.size(); ++i) {
    const SnapshotSectionInfo& s = info.sections[i];
    const uint64_t off = out.size();
    if (s.name == name) {
      out.insert(out.end(), content.begin(), content.end());
      found = true;
    } else {
      out.insert(out.end(), file.begin() + std::ptrdiff_t(s.offset),
                 file.begin() + std::ptrdiff_t(s.offset + s.length));
    }
    const uint64_t len = out.size() - off;
    std::memcpy(out.data() + 40 + 32 * i + 8, &off, 8);
    std::memcpy(out.data() + 40 + 32 * i + 16, &len, 8);
  }
  EXPECT_TRUE(found) << name;
  const uint64_t size = out.size();
  std::memcpy(out.data() + 24, &size, 8);
  testing::fix_snapshot_checksums(out);
  return out;
}

Bytes section_bytes(const Bytes& file, const std::string& name) {
  for (const SnapshotSectionInfo& s : inspect_snapshot_bytes(file, false).sections)
    if (s.name == name)
      return Bytes(file.begin() + std::ptrdiff_t(s.offset), file.begin() + std::ptrdiff_t(s.offset + s.length));
  ADD_FAILURE() << "no section " << name;
  return {};
}

// The entries of a config or state section (docs/snapshot.md): key, type, value bytes.
struct RawEntry {
  std::string key;
  uint8_t type = 0;
  Bytes value;
};
std::vector<RawEntry> entries_of(const Bytes& b) {
  size_t at = 0;
  auto u32 = [&] {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    at += 4;
    return v;
  };
  std::vector<RawEntry> e(u32());
  for (RawEntry& x : e) {
    const uint32_t n = u32();
    x.key.assign(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + n));
    at += n;
    x.type = b[at++];
    const size_t len = x.type <= 2   ? 8
                       : x.type == 3 ? 1
                       : x.type == 4 ? 4 + size_t([&] {
                                         uint32_t v;
                                         std::memcpy(&v, b.data() + at, 4);
                                         return v;
                                       }())
                                     : 0;
    x.value.assign(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + len));
    at += len;
  }
  return e;
}
Bytes bytes_of(const std::vector<RawEntry>& e) {
  Bytes b;
  auto u32 = [&](uint32_t v) { b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4); };
  u32(uint32_t(e.size()));
  for (const RawEntry& x : e) {
    u32(uint32_t(x.key.size()));
    b.insert(b.end(), x.key.begin(), x.key.end());
    b.push_back(x.type);
    b.insert(b.end(), x.value.begin(), x.value.end());
  }
  return b;
}
RawEntry i64_entry(const std::string& key, int64_t v) {
  RawEntry e{key, 1, Bytes(8)};
  std::memcpy(e.value.data(), &v, 8);
  return e;
}
RawEntry str_entry(const std::string& key, const std::string& v) {
  RawEntry e{key, 4, Bytes(4)};
  const uint32_t n = uint32_t(v.size());
  std::memcpy(e.value.data(), &n, 4);
  e.value.insert(e.value.end(), v.begin(), v.end());
  return e;
}
// The file with entry `e` of section `sec` (config or state) replaced, or added at
// the end when it is not there; with `remove`, that entry removed.
Bytes with_entry(const Bytes& file, const std::string& sec, const RawEntry& e, bool remove = false) {
  std::vector<RawEntry> es = entries_of(section_bytes(file, sec));
  auto it = std::find_if(es.begin(), es.end(), [&](const RawEntry& x) { return x.key == e.key; });
  if (remove) {
    EXPECT_NE(it, es.end()) << e.key;
    if (it != es.end()) es.erase(it);
  } else if (it == es.end()) {
    es.push_back(e);
  } else {
    *it = e;
  }
  return with_section(file, sec, bytes_of(es));
}
std::string entry_text(const std::vector<std::pair<std::string, std::string>>& es, const std::string& key) {
  for (const auto& [k, v] : es)
    if (k == key) return v;
  return "(absent)";
}

// ---- format 1.1: incremental spans ------------------------------------------------------

TEST(SnapshotFormat, IncrementalSpansAreFormat1_1AndEverythingElseStays1_0) {
  // Deferred spans and dense caches need nothing of 1.1: written as 1.0, byte for byte
  // what a 1.0 writer wrote (the golden file below checks it).
  EXPECT_EQ(inspect_snapshot_bytes(testing::small_packed_cache().snapshot_bytes()).minor, 0);
  EXPECT_EQ(inspect_snapshot_bytes(testing::small_dense_cache().snapshot_bytes()).minor, 0);
  const SnapshotInfo d = inspect_snapshot_bytes(testing::small_packed_cache().snapshot_bytes());
  EXPECT_EQ(entry_text(d.config, "span_mode"), "(absent)");
  // An incremental cache: 1.1, with its span state, one section per span.
  const PackedCausalCache c = testing::small_incremental_cache();
  const auto st = qvg::detail::debug_state(c);
  ASSERT_EQ(st.open_span, 3);
  ASSERT_EQ(st.open_span_chunks, 2);
  ASSERT_EQ(st.span_breaks, 3);
  const Bytes b = c.snapshot_bytes();
  const SnapshotInfo info = inspect_snapshot_bytes(b);
  EXPECT_EQ(info.major, 1);
  EXPECT_EQ(info.minor, 1);
  EXPECT_TRUE(info.checksums_ok());
  EXPECT_EQ(entry_text(info.config, "span_mode"), "incremental");
  EXPECT_EQ(entry_text(info.config, "span_break_ratio"), "2");
  EXPECT_EQ(entry_text(info.state, "spans"), "2");
  EXPECT_EQ(entry_text(info.state, "open_span"), "3");
  EXPECT_EQ(entry_text(info.state, "open_span_chunks"), "2");
  EXPECT_EQ(entry_text(info.state, "next_span"), "4");
  EXPECT_EQ(entry_text(info.state, "span_breaks"), "3");
  double ek = 0;
  const std::string ek_text = entry_text(info.state, "open_k_energy");
  std::from_chars(ek_text.data(), ek_text.data() + ek_text.size(), ek);
  EXPECT_EQ(ek, st.open_k_energy);  // exact
  std::vector<std::string> names;
  for (const SnapshotSectionInfo& s : info.sections) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"config", "state", "span 0", "span 1", "segment 0", "segment 1",
                                             "segment 2", "segment 3", "segment 4", "warm_k", "warm_v"}));
  // The span's codebooks once, in its section; its chunks without centroids.
  const size_t layout = 81;  // f32, fp8_e4m3, two_level
  size_t book = 0;
  for (const auto& a : c.segment(2).k_codebook->centroid) book += a.size();
  EXPECT_EQ(info.sections[3].length, 8 + 2 * (4 + layout + book));
  for (size_t i : {size_t(2), size_t(3)}) {
    const auto g = c.segment(i);
    ASSERT_EQ(g.span, 3);
    EXPECT_EQ(info.sections[4 + i].length, 26 + 8 + 2 * layout + g.k_enc->nbytes() + g.v_enc->nbytes());
    EXPECT_EQ(g.k_enc->centroid[0].size(), 0u);
  }
  // Loaded: the same state, the codebooks shared again, the same bytes.
  const PackedCausalCache l = PackedCausalCache::from_snapshot_bytes(b);
  same_state(c, l);
  spans_shared(l);
  EXPECT_EQ(l.segment(2).k_codebook, l.segment(3).k_codebook);
  EXPECT_EQ(l.resident_nbytes(), c.resident_nbytes());
  EXPECT_EQ(l.snapshot_bytes(), b);
  // Deferred spans with a break ratio (unused, but part of the configuration): 1.1.
  QuantArgs q = testing::small_quant();
  q.span_break_ratio = 0.1;
  PackedCausalCache r(testing::small_cache_options(), q);
  r.update(testing::lcg_kv(4, 1), testing::lcg_kv(4, 2), 0);
  const Bytes rb = r.snapshot_bytes();
  const SnapshotInfo ri = inspect_snapshot_bytes(rb);
  EXPECT_EQ(ri.minor, 1);
  EXPECT_EQ(entry_text(ri.config, "span_mode"), "deferred");
  EXPECT_EQ(entry_text(ri.config, "span_break_ratio"), "0.1");
  EXPECT_EQ(entry_text(ri.state, "spans"), "(absent)");
  const PackedCausalCache rl = PackedCausalCache::from_snapshot_bytes(rb);
  EXPECT_EQ(rl.quant_args().span_break_ratio, 0.1);
  EXPECT_EQ(rl.snapshot_bytes(), rb);
}

TEST(SnapshotFormat, IncrementalSpansContinueAfterLoadAtEveryPoint) {
  // Saved after every chunk (empty, first span, mid-span, after breaks, after a
  // span's first chunk was evicted), loaded, and both continued for the chunks left.
  for (int saved_at = 0; saved_at <= 9; ++saved_at) {
    SCOPED_TRACE(saved_at);
    PackedCausalCache a(testing::small_cache_options(), testing::small_incremental_quant());
    for (int64_t i = 0; i < saved_at; ++i)
      a.update(testing::lcg_kv(4, uint64_t(2 * i)), testing::lcg_kv(4, uint64_t(2 * i + 1)), 4 * i);
    PackedCausalCache b = PackedCausalCache::from_snapshot_bytes(a.snapshot_bytes());
    same_state(a, b);
    for (int64_t i = saved_at; i < 12; ++i) {
      const Tensor k = testing::lcg_kv(4, uint64_t(2 * i)), v = testing::lcg_kv(4, uint64_t(2 * i + 1));
      for (int step = 0; step < 2; ++step) {  // an advance, then a denoising step's rewrite
        const KVView x = a.update(k, v, 4 * i), y = b.update(k, v, 4 * i);
        ASSERT_EQ(testing::compare_views(x, y), "") << "chunk " << i;
      }
      same_state(a, b);
      spans_shared(b);
      ASSERT_EQ(a.snapshot_bytes(), b.snapshot_bytes());
    }
  }
}

// The checks behind the checksums for incremental spans (docs/snapshot.md, "What a
// reader checks"), on small_incremental_cache(): span 0 is span 2 (one chunk,
// segment 1, K and V filled 2), span 1 the open span 3 (segments 2 and 3, filled 3).
// Format 1.4: refinement layers of the newest chunks (QuantArgs::refine_recent).
TEST(SnapshotFormat, RefinementLayersAreFormat1_4AndRefusedWhereTheCacheWouldHoldNone) {
  QuantArgs q = testing::small_incremental_quant(0.0);
  q.refine_recent = 2;
  q.refine_bits = 2;
  PackedCausalCache c(testing::small_cache_options(), q);
  for (int64_t i = 0; i < 7; ++i)
    c.update(testing::lcg_kv(4, uint64_t(2 * i)), testing::lcg_kv(4, uint64_t(2 * i + 1)), 4 * i);
  const Bytes good = c.snapshot_bytes();
  const SnapshotInfo info = inspect_snapshot_bytes(good);
  EXPECT_EQ(info.minor, 4);
  EXPECT_EQ(entry_text(info.config, "refine_recent"), "2");
  EXPECT_EQ(entry_text(info.config, "refine_bits"), "2");
  int refined = 0;
  for (size_t i = 0; i < c.num_segments(); ++i) refined += c.segment(i).k_ref != nullptr;
  ASSERT_EQ(refined, 2);
  // Loaded: the same state (layers included), and the same bytes again.
  const PackedCausalCache b = PackedCausalCache::from_snapshot_bytes(good);
  EXPECT_TRUE(qvg::detail::debug_state(b).segments == qvg::detail::debug_state(c).segments);
  EXPECT_EQ(b.resident_nbytes(), c.resident_nbytes());
  EXPECT_EQ(b.snapshot_bytes(), good);
  auto refused = [&](const Bytes& f, const std::string& where, const std::string& what) {
    SCOPED_TRACE(what);
    const std::string m = error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(f); }, ErrorKind::CorruptData);
    EXPECT_NE(m.find("invalid snapshot: " + where + ": "), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  // A configuration under which the cache would hold other layers than the file.
  refused(with_entry(good, "config", i64_entry("refine_recent", 3)), "state",
          "lacks refinement layers; exactly the 3 newest chunks of incremental spans hold them");
  refused(with_entry(good, "config", i64_entry("refine_recent", 1)), "state",
          "holds refinement layers; exactly the 1 newest chunks of incremental spans hold them");
  // refine_recent = 0: the segment's flag 0x2 is refused where it is read.
  const std::string m0 = error_of(
      [&] { (void)PackedCausalCache::from_snapshot_bytes(with_entry(good, "config", i64_entry("refine_recent", 0))); },
      ErrorKind::CorruptData);
  EXPECT_NE(m0.find("a refined segment (flag 0x2) must be a chunk of an incremental span"), std::string::npos) << m0;
  refused(with_entry(good, "config", i64_entry("refine_bits", 4)), "segment 2",
          "the K refinement layer is a [1, 4, 2, 8] f32 encoding (bits=2 centroids=1 stages=1); this cache's layers");
  // Another configuration than the caller's: refused naming the field.
  SnapshotExpectation x;
  x.options = testing::small_cache_options();
  QuantArgs w = q;
  w.refine_recent = 1;
  x.quant = w;
  const std::string m =
      error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(good, x); }, ErrorKind::InvalidArgument);
  EXPECT_NE(m.find("refine_recent = 2, the caller expects 1"), std::string::npos) << m;
}

// A width added after the reference's is stored from its row's minor
// (qvg/code_format.h): an int3 cache is format 1.5 and loads back exactly; the same
// file labelled 1.4 is refused naming the entry, as an older reader refuses 1.5.
TEST(SnapshotFormat, AThreeBitCacheIsFormat1_5AndRefusedUnderAnOlderMinor) {
  const PackedCausalCache c = testing::small_packed_cache(3);
  const Bytes good = c.snapshot_bytes();
  const SnapshotInfo info = inspect_snapshot_bytes(good);
  EXPECT_EQ(info.minor, 5);
  EXPECT_EQ(entry_text(info.config, "bits"), "3");
  const PackedCausalCache b = PackedCausalCache::from_snapshot_bytes(good);
  EXPECT_TRUE(qvg::detail::debug_state(b).segments == qvg::detail::debug_state(c).segments);
  EXPECT_EQ(b.snapshot_bytes(), good);
  EXPECT_EQ(inspect_snapshot_bytes(testing::small_packed_cache(4).snapshot_bytes()).minor, 0);
  Bytes older = good;
  older[10] = 4;  // the header's minor (u16, little-endian, offset 10: docs/snapshot.md)
  older[11] = 0;
  testing::fix_snapshot_checksums(older);
  const std::string m = error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(older); }, ErrorKind::CorruptData);
  EXPECT_NE(m.find("entry 'bits' = 3 is stored from format 1.5, but the file is 1.4"), std::string::npos) << m;
}

TEST(SnapshotFormat, ImpossibleIncrementalStatesAreRefused) {
  const Bytes good = testing::small_incremental_cache().snapshot_bytes();
  ASSERT_NO_THROW((void)PackedCausalCache::from_snapshot_bytes(good));
  const SnapshotInfo info = inspect_snapshot_bytes(good);
  auto at = [&](const std::string& sec, size_t off, const std::vector<uint8_t>& bytes) {
    Bytes b = good;
    for (const SnapshotSectionInfo& s : info.sections)
      if (s.name == sec) std::memcpy(b.data() + s.offset + off, bytes.data(), bytes.size());
    testing::fix_snapshot_checksums(b);
    return b;
  };
  auto refused = [&](const Bytes& b, const std::string& where, const std::string& what) {
    SCOPED_TRACE(what);
    const std::string m = error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(b); }, ErrorKind::CorruptData);
    EXPECT_NE(m.find("invalid snapshot: " + where + ": "), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  auto le = [](int64_t v, size_t n) {
    std::vector<uint8_t> b(n);
    std::memcpy(b.data(), &v, n);
    return b;
  };
  // docs/reliability.md, finding 13 (found by fuzz_snapshot): a sink_tokens entry
  // larger than the saved sink (12, the file holds the sink chunk [0, 4) and then
  // [12, 16)) left the sink tokens [4, 12) missing; the next update() failed an
  // internal check. The sink is never evicted: refused.
  refused(with_entry(good, "config", i64_entry("sink_tokens", 12)), "state",
          "segment 0 ends at 4 but segment 1 starts at 12 (only the evicted tokens between the sink's end at 12");
  // Segments: the flag (offset 22), the span id (26), the first id of K (26 + 8 + layout).
  refused(at("segment 1", 22, le(0, 4)), "segment 1", "must be a chunk of a span (flag 0x1)");
  refused(at("segment 1", 22, le(3, 4)), "segment 1", "flags 0x3: format 1.1 defines 0x1 only");
  refused(at("segment 0", 22, le(1, 4)), "segment 0", "must be one packed non-sink chunk");
  refused(at("segment 4", 22, le(1, 4)), "segment 4", "must be one packed non-sink chunk");
  refused(at("segment 1", 26, le(7, 8)), "segment 1", "span 7 has no span section");
  refused(at("segment 1", 26, le(-1, 8)), "segment 1", "span id >= 0");
  refused(at("segment 1", 26 + 8 + 81, {2}), "segment 1", "ids.0 holds id 2, its span's codebook has 2 slots in use");
  // A chunk moved to another span: too many chunks for the open span; with room, span
  // 2 is left without chunks; chunks of a span apart.
  refused(at("segment 1", 26, le(3, 8)), "state", "span 3 has more than 2 chunks (segment 3)");
  refused(at("segment 1", 26, le(3, 8)), "state", "span 3 has more than 2 chunks");
  {
    const Bytes b = with_entry(at("segment 1", 26, le(3, 8)), "state", i64_entry("open_span_chunks", 3));
    refused(b, "span 0", "span 2 has no chunk and is not the open span");
  }
  refused(at("segment 2", 26, le(2, 8)), "state", "the open span 3 holds 1 of its 2 chunks");
  {
    // Span 2's codebooks with a third slot in use (zero), so that segment 3's ids fit it.
    Bytes b = at("segment 3", 26, le(2, 8));
    const size_t span0 = size_t(info.sections[2].offset), book = 2 * 4 * 2 * 8 * 4;  // 2 stages of [1, 2, 4, 8] f32
    for (size_t off : {size_t(8), 8 + 4 + 81 + book}) std::memcpy(b.data() + span0 + off, le(3, 4).data(), 4);
    testing::fix_snapshot_checksums(b);
    refused(b, "state", "segment 3 is a chunk of span 2 after a chunk of span 3");
  }
  // Span sections: id order, slots in use, unused slots zero, layout.
  refused(at("span 0", 0, le(5, 8)), "span 1", "span id 3 follows span id 5");
  refused(at("span 0", 8, le(0, 4)), "span 0", "the K codebook has 0 slots in use, must be 1..4");
  refused(at("span 0", 8, le(5, 4)), "span 0", "the K codebook has 5 slots in use, must be 1..4");
  refused(at("span 0", 8, le(1, 4)), "span 0", "holds a centroid in a slot not in use (>= 1)");
  {
    const float one = 1.0f;
    std::vector<uint8_t> f(4);
    std::memcpy(f.data(), &one, 4);
    refused(at("span 0", 12 + 81 + 3 * 32, f), "span 0", "slot not in use (>= 2)");
    const float inf = INFINITY;
    std::memcpy(f.data(), &inf, 4);
    refused(at("span 0", 12 + 81, f), "span 0", "not finite");
  }
  refused(at("span 0", 12 + 4 + 3 + 8, le(17, 8)), "span 0", "outside [1, cache_size = 16]");  // shape.s
  // State entries.
  refused(with_entry(good, "state", i64_entry("open_span", 2)), "state", "open_span = 2 must be the last span started");
  refused(with_entry(good, "state", i64_entry("next_span", 5)), "state", "open_span = 3 must be the last span started");
  refused(with_entry(good, "state", i64_entry("span_breaks", 4)), "state", "span_breaks = 4 is out of [0, 3]");
  refused(with_entry(good, "state", i64_entry("open_span_chunks", 4)), "state",
          "open_span_chunks = 4 is out of [1, 3]");
  refused(with_entry(good, "state", i64_entry("open_span_chunks", 1)), "state", "span 3 has more than 1 chunks");
  refused(with_entry(good, "state", i64_entry("spans", 1)), "section table",
          "section 3 is 'span 1', expected 'segment 0'");
  refused(with_entry(good, "state", i64_entry("spans", 3)), "section table", "expected 'span 2'");
  refused(with_entry(good, "state", str_entry("open_k_energy", "-1")), "state", "must be >= 0");
  refused(with_entry(good, "state", str_entry("open_k_energy", "nan")), "state", "'nan' is not a finite number");
  refused(with_entry(good, "state", str_entry("open_v_energy", "2.50")), "state", "'2.50' is not a finite number");
  refused(with_entry(good, "state", str_entry("open_v_energy", "1e999")), "state", "not a finite number");
  refused(with_entry(good, "state", i64_entry("open_k_energy", 1)), "state", "entry 'open_k_energy' must be a string");
  refused(with_entry(good, "state", i64_entry("spans", 0), true), "state", "missing entry 'spans'");
  // Configuration.
  refused(with_entry(good, "config", str_entry("span_break_ratio", "1e+07")), "config",
          "span_break_ratio must be in [0, 1e6]");
  refused(with_entry(good, "config", str_entry("span_break_ratio", "2.0")), "config", "shortest decimal form");
  refused(with_entry(good, "config", str_entry("span_mode", "eager")), "config", "span_mode");
  refused(with_entry(good, "config", str_entry("span_mode", "deferred")), "state", "unknown entry 'spans'");
  // A 1.1 file labelled 1.0: its additions are unknown to format 1.0.
  {
    Bytes b = good;
    b[10] = 0;
    testing::fix_snapshot_checksums(b);
    refused(b, "section table", "span 0 (a newer qvg may have written it)");
    QuantArgs q = testing::small_quant();
    q.span_break_ratio = 0.5;
    PackedCausalCache r(testing::small_cache_options(), q);
    Bytes rb = r.snapshot_bytes();
    rb[10] = 0;
    testing::fix_snapshot_checksums(rb);
    refused(rb, "config", "unknown entry 'span_mode'");
  }
  // The same crafted files through inspect: never a crash.
  (void)inspect_snapshot_bytes(with_entry(good, "state", str_entry("open_k_energy", "nan")));
}

TEST(SnapshotFormat, NewerMajorVersionAndOtherByteOrderAreRefused) {
  Bytes p = testing::small_packed_cache().snapshot_bytes();
  Bytes x = p;
  x[8] = 2;  // major 2 (the header checksum is not even read)
  EXPECT_NE(error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(x); }, ErrorKind::CorruptData)
                .find("format version 2.0: this reader reads 1.x (written by a newer qvg)"),
            std::string::npos);
  x = p;
  std::reverse(x.begin() + 12, x.begin() + 16);
  EXPECT_NE(
      error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(x); }, ErrorKind::CorruptData).find("big-endian"),
      std::string::npos);
  EXPECT_THROW((void)inspect_snapshot_bytes(x), CorruptData);
}

TEST(SnapshotFormat, ForeignFilesAreCorruptDataAndTheOtherKindInvalidArgument) {
  CodecConfig c;
  c.centroids = 4;
  c.block_size = 8;
  const Bytes qvgt = serialize_qvgt(encode(testing::lcg_kv(6, 1), c));
  NpyArray npy;
  npy.shape = {2};
  npy.data = Bytes(8, 0);
  std::mt19937_64 rng(1);
  Bytes noise(4096);
  for (auto& b : noise) b = uint8_t(rng());
  for (const Bytes& f : {Bytes{}, Bytes{0x89, 'Q'}, qvgt, serialize_npy(npy), noise}) {
    const std::string m = error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(f); }, ErrorKind::CorruptData);
    EXPECT_NE(m.find("invalid snapshot: header: "), std::string::npos) << m;
    EXPECT_THROW((void)DenseCausalCache::from_snapshot_bytes(f), CorruptData);
    EXPECT_FALSE(is_snapshot_bytes(f));
  }
  const Bytes dense = testing::small_dense_cache().snapshot_bytes(),
              packed = testing::small_packed_cache().snapshot_bytes();
  EXPECT_NE(error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(dense); }, ErrorKind::InvalidArgument)
                .find("the snapshot holds a dense cache"),
            std::string::npos);
  EXPECT_THROW((void)DenseCausalCache::from_snapshot_bytes(packed), InvalidArgument);
}

TEST(SnapshotFormat, AnotherConfigurationThanExpectedIsRefusedNamingTheField) {
  const Bytes b = testing::small_packed_cache().snapshot_bytes();
  SnapshotExpectation x;
  x.options = testing::small_cache_options();
  x.quant = testing::small_quant();
  EXPECT_NO_THROW((void)PackedCausalCache::from_snapshot_bytes(b, x));
  x.options->attention_window_size = 16;  // equal to cache_size: the same window
  x.quant->codec.threads = 2;             // not part of the configuration
  EXPECT_NO_THROW((void)PackedCausalCache::from_snapshot_bytes(b, x));
  auto refused = [&](auto edit, const std::string& field) {
    SnapshotExpectation y;
    y.options = testing::small_cache_options();
    y.quant = testing::small_quant();
    edit(y);
    const std::string m =
        error_of([&] { (void)PackedCausalCache::from_snapshot_bytes(b, y); }, ErrorKind::InvalidArgument);
    EXPECT_NE(m.find("the snapshot's cache has " + field + " = "), std::string::npos) << m;
  };
  refused([](auto& y) { y.options->batch = 2; }, "batch");
  refused([](auto& y) { y.options->cache_size = 32; }, "cache_size");
  refused([](auto& y) { y.options->heads = 4; }, "num_heads");
  refused([](auto& y) { y.options->head_dim = 16; }, "head_dim");
  refused([](auto& y) { y.options->dtype = DType::BF16; }, "dtype");
  refused([](auto& y) { y.options->sink_tokens = 0; }, "sink_tokens");
  refused([](auto& y) { y.options->attention_window_size = 12; }, "attention_window_size");
  refused([](auto& y) { y.options->head_offset = 4; }, "head_offset");
  refused([](auto& y) { y.quant->codec.bits = 2; }, "bits");
  refused([](auto& y) { y.quant->quantize = false; }, "bits");
  refused([](auto& y) { y.quant->codec.centroids = 8; }, "centroids");
  refused([](auto& y) { y.quant->codec.stages = 1; }, "stages");
  refused([](auto& y) { y.quant->codec.kmeans_iters = 3; }, "kmeans_iters");
  refused([](auto& y) { y.quant->codec.asymmetric = true; }, "asymmetric");
  refused([](auto& y) { y.quant->keep_recent_chunks = 1; }, "keep_recent_chunks");
  refused([](auto& y) { y.quant->sink = false; }, "sink");
  refused([](auto& y) { y.quant->sink_span = SinkSpan::Full; }, "sink_span");
  refused([](auto& y) { y.quant->sink_keep_chunks = 1; }, "sink_keep_chunks");
  refused([](auto& y) { y.quant->span_chunks = 2; }, "span_chunks");
  refused([](auto& y) { y.quant->span_mode = SpanMode::Incremental; }, "span_mode");
  refused([](auto& y) { y.quant->span_break_ratio = 0.5; }, "span_break_ratio");
  refused([](auto& y) { y.quant->codec.scaling = Scaling::Compat; }, "scaling");
  refused([](auto& y) { y.quant->codec.scale_dtype = ScaleDType::BF16; }, "scale_dtype");
  refused([](auto& y) { y.quant->codec.init = Init::Random; }, "init");
  refused([](auto& y) { y.quant->codec.seed = 1; }, "seed");
  SnapshotExpectation g;
  g.options = testing::small_cache_options();
  g.options->cache_size = 8;
  EXPECT_NE(
      error_of([&] { (void)DenseCausalCache::from_snapshot_bytes(testing::small_dense_cache().snapshot_bytes(), g); },
               ErrorKind::InvalidArgument)
          .find("allow_growth"),
      std::string::npos);
  g.threads = max_threads() + 1;
  EXPECT_THROW((void)PackedCausalCache::from_snapshot_bytes(b, g), InvalidArgument);
}

TEST(SnapshotFormat, RuntimeSettingsAndCallerStorage) {
  // A shared view scratch and the thread count are the caller's, not the file's.
  auto scratch = std::make_shared<ViewScratch>();
  SnapshotExpectation x;
  x.view_scratch = scratch;
  x.threads = 2;
  PackedCausalCache p = PackedCausalCache::from_snapshot_bytes(testing::small_packed_cache().snapshot_bytes(), x);
  EXPECT_EQ(p.quant_args().codec.threads, 2);
  const KVView v = p.update(testing::lcg_kv(4, 50), testing::lcg_kv(4, 51), 16);
  EXPECT_EQ(v.k.data, static_cast<const void*>(scratch->data()));
  // Dense buffers in caller storage, asked for once with the snapshot's cache_size.
  std::vector<std::vector<std::byte>> owned;
  std::vector<int64_t> asked;
  auto storage = [&](int64_t cs) {
    asked.push_back(cs);
    owned.emplace_back(size_t(cs) * 2 * 8 * 4);
    owned.emplace_back(size_t(cs) * 2 * 8 * 4);
    return DenseCausalCache::ExternalStorage{owned[owned.size() - 2].data(), owned.back().data()};
  };
  const DenseCausalCache saved = testing::small_dense_cache();
  DenseCausalCache d = DenseCausalCache::from_snapshot_bytes(saved.snapshot_bytes(), {}, storage);
  EXPECT_EQ(asked, (std::vector<int64_t>{16}));
  EXPECT_FALSE(d.owns_storage());
  EXPECT_EQ(d.k_buffer().data, static_cast<const void*>(owned[0].data()));
  same_state(saved, d);
  d.update(testing::lcg_kv(12, 3), testing::lcg_kv(12, 4), 12);  // grows through the same storage
  EXPECT_EQ(asked, (std::vector<int64_t>{16, 32}));
}

// ---- atomic save ----------------------------------------------------------------------------

// Runs f in a child process; returns its wait status.
template <class F>
int in_child(F&& f, int kill_after_us = -1) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    f();
    ::_exit(0);
  }
  if (kill_after_us >= 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(SnapshotSave, AKilledWriterLeavesTheOldOrTheNewSnapshot) {
  const TempDir dir("qvg_test_snapshot");
  const fs::path p = dir / "cache.qvgs";
  // Two different states of one cache, large enough that a save takes a while.
  CacheOptions o;
  o.cache_size = 4096;
  o.heads = 8;
  o.head_dim = 64;
  o.dtype = DType::BF16;
  DenseCausalCache a(o), b(o);
  std::mt19937_64 rng(3);
  a.update(testing::random_tensor(rng, DType::BF16, {1, 2048, 8, 64}),
           testing::random_tensor(rng, DType::BF16, {1, 2048, 8, 64}), 0);
  b.update(testing::random_tensor(rng, DType::BF16, {1, 3000, 8, 64}),
           testing::random_tensor(rng, DType::BF16, {1, 3000, 8, 64}), 0);
  const Bytes sa = a.snapshot_bytes(), sb = b.snapshot_bytes();
  a.save(p);
  int old_seen = 0, new_seen = 0;
  const int rounds = testing::scaled(24, 10);
  for (int r = 0; r < rounds; ++r) {
    const Bytes& before = file_bytes(p) == sa ? sa : sb;
    const DenseCausalCache& next = &before == &sa ? b : a;
    const int status = in_child(
        [&] {
          for (;;) next.save(p);  // until killed
        },
        int(rng() % 40000));
    ASSERT_TRUE(WIFSIGNALED(status));
    // The file is exactly one of the two snapshots and loads.
    const Bytes now = file_bytes(p);
    ASSERT_TRUE(now == sa || now == sb) << "round " << r << ": " << now.size() << " bytes";
    (now == before ? old_seen : new_seen) += 1;
    const DenseCausalCache loaded = DenseCausalCache::load(p);
    EXPECT_EQ(loaded.global_end(), now == sa ? 2048 : 3000);
    // A killed writer may leave its temporary behind (never under the final name).
    for (const auto& e : fs::directory_iterator(dir / ""))
      if (e.path() != p) fs::remove(e.path());
  }
  std::printf("killed writers: %d left the old snapshot, %d the new one\n", old_seen, new_seen);
}

TEST(SnapshotSave, FailingWritesLeaveTheOldSnapshotAndNoTemporary) {
  const TempDir dir("qvg_test_snapshot");
  const fs::path p = dir / "cache.qvgs";
  const PackedCausalCache old_cache = testing::small_packed_cache();
  old_cache.save(p);
  const Bytes old_bytes = file_bytes(p);
  PackedCausalCache next = testing::small_packed_cache();
  next.update(testing::lcg_kv(4, 70), testing::lcg_kv(4, 71), 16);
  const size_t size = next.snapshot_bytes().size();
  // The writer in a child whose file size limit (RLIMIT_FSIZE) makes write() fail
  // after `limit` bytes: EFBIG, like a full disk.
  for (size_t limit : {size_t(0), size_t(1), size_t(39), size_t(40), size / 3, size / 2, size - 1}) {
    const int status = in_child([&] {
      ::signal(SIGXFSZ, SIG_IGN);
      rlimit rl{rlim_t(limit), rlim_t(limit)};
      ::setrlimit(RLIMIT_FSIZE, &rl);
      try {
        next.save(p);
      } catch (const InvalidArgument& e) {
        ::_exit(std::string(e.what()).find("cannot write") != std::string::npos ? 3 : 4);
      }
      ::_exit(5);
    });
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 3) << "limit " << limit;
    EXPECT_EQ(file_bytes(p), old_bytes) << "limit " << limit;
    EXPECT_EQ(dir.entries(), 1u) << "a temporary was left behind at limit " << limit;
  }
  EXPECT_NO_THROW((void)PackedCausalCache::load(p));
  // Unwritable destinations.
  EXPECT_THROW(next.save(dir / "missing" / "x.qvgs"), InvalidArgument);
  // Loading errors name the path.
  const std::string m = error_of([&] { (void)PackedCausalCache::load(dir / "nope.qvgs"); }, ErrorKind::InvalidArgument);
  EXPECT_NE(m.find("nope.qvgs"), std::string::npos);
  put_file(dir / "bad.qvgs", Bytes(old_bytes.begin(), old_bytes.begin() + 100));
  const std::string t = error_of([&] { (void)PackedCausalCache::load(dir / "bad.qvgs"); }, ErrorKind::CorruptData);
  EXPECT_NE(t.find("bad.qvgs': invalid snapshot: header: "), std::string::npos) << t;
}

// ---- golden snapshot ----------------------------------------------------------------------

// tests/data/golden_packed.qvgs: testing::small_packed_cache() encoded on the SCALAR target (the
// encoder's bytes depend on the SIMD target, spec 1.1). Regenerate (only for a
// deliberate format change, and say so) with
//   QVG_WRITE_GOLDEN_SNAPSHOT=tests/data/golden_packed.qvgs build/release/test_snapshot
const fs::path kGolden = fs::path(QVG_SOURCE_DIR) / "tests" / "data" / "golden_packed.qvgs";

TEST(SnapshotGolden, CommittedSnapshotLoadsBitExactly) {
  kernels::force_target(kernels::available_targets().back().id);
  const PackedCausalCache built = testing::small_packed_cache();
  kernels::force_target(0);
  if (const char* out = std::getenv("QVG_WRITE_GOLDEN_SNAPSHOT")) built.save(out);
  const Bytes golden = file_bytes(kGolden);
  ASSERT_FALSE(golden.empty()) << kGolden;
  PackedCausalCache loaded = PackedCausalCache::load(kGolden);
  EXPECT_EQ(loaded.snapshot_bytes(), golden);  // nothing lost or changed on the way in
  EXPECT_EQ(built.snapshot_bytes(), golden);   // today's writer writes the same bytes
  same_state(built, loaded);
  EXPECT_EQ(loaded.resident_nbytes(), built.resident_nbytes());
  // It continues as the cache it was.
  PackedCausalCache again = PackedCausalCache::load(kGolden);
  const Tensor k = testing::lcg_kv(4, 90), v = testing::lcg_kv(4, 91);
  kernels::force_target(kernels::available_targets().back().id);
  const KVView a = loaded.update(k, v, 16);
  const KVView b = again.update(k, v, 16);
  kernels::force_target(0);
  EXPECT_EQ(testing::compare_views(a, b), "");
  EXPECT_EQ(a.k.shape.s, 16);
}

// ---- format 1.2: head_offset ------------------------------------------------------------

TEST(SnapshotFormat, AHeadShardIsFormat1_2AndKeepsItsHeadOffset) {
  // A shard of heads [5, 7) of a wider cache: its encodings draw the PRNG streams of
  // heads 5 and 6, so a loaded cache that forgot the offset would encode later chunks
  // differently. The snapshot stores it (format 1.2), checks it against the caller's
  // expectation, and the loaded cache continues bit for bit.
  CacheOptions o = testing::small_cache_options();
  o.head_offset = 5;
  QuantArgs q = testing::small_quant();
  q.codec.init = Init::Random;  // every chunk draws from the head's stream: 2 of 4 tokens,
  q.codec.centroids = 2;        // one Lloyd step, so the drawn points show in the result
  q.codec.kmeans_iters = 1;
  PackedCausalCache a(o, q), plain(testing::small_cache_options(), q);
  for (int i = 0; i < 3; ++i) {
    const Tensor k = testing::lcg_kv(4, 2 * i), v = testing::lcg_kv(4, 2 * i + 1);
    (void)a.update(k, v, 4 * i);
    (void)plain.update(k, v, 4 * i);
  }
  const Bytes b = a.snapshot_bytes();
  const SnapshotInfo info = inspect_snapshot_bytes(b);
  EXPECT_EQ(info.minor, 2);
  EXPECT_EQ(entry_text(info.config, "head_offset"), "5");
  EXPECT_EQ(inspect_snapshot_bytes(plain.snapshot_bytes()).minor, 0);
  EXPECT_EQ(entry_text(inspect_snapshot_bytes(plain.snapshot_bytes()).config, "head_offset"), "(absent)");
  SnapshotExpectation x;
  x.options = o;
  x.quant = q;
  PackedCausalCache c = PackedCausalCache::from_snapshot_bytes(b, x);
  EXPECT_EQ(c.snapshot_bytes(), b);
  bool differs_from_plain = false;
  for (int i = 3; i < 7; ++i) {
    const Tensor k = testing::lcg_kv(4, 2 * i), v = testing::lcg_kv(4, 2 * i + 1);
    const KVView va = a.update(k, v, 4 * i), vc = c.update(k, v, 4 * i), vp = plain.update(k, v, 4 * i);
    ASSERT_TRUE(testing::compare_views(va, vc) == "") << "chunk " << i;
    differs_from_plain |= testing::compare_views(va, vp) != "";
  }
  EXPECT_TRUE(differs_from_plain);  // the offset matters, so the check above can fail
  // A dense cache with an offset is 1.2 too, and refuses another offset.
  CacheOptions d = testing::small_cache_options();
  d.head_offset = 3;
  DenseCausalCache dc(d);
  EXPECT_EQ(inspect_snapshot_bytes(dc.snapshot_bytes()).minor, 2);
  SnapshotExpectation y;
  y.options = testing::small_cache_options();
  const std::string m = error_of([&] { (void)DenseCausalCache::from_snapshot_bytes(dc.snapshot_bytes(), y); },
                                 ErrorKind::InvalidArgument);
  EXPECT_NE(m.find("head_offset = 3, the caller expects 0"), std::string::npos) << m;
}

}  // namespace
}  // namespace qvg
