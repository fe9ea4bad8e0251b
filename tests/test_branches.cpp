// Branches (issue 38; qvg/cache.h, "Branches"): fork() of the packed and dense caches.
//  * Randomized differential test: random call sequences on a growing set of
//    branches, forks and drops at random points. Every branch has a shadow: a cache
//    built fresh and fed the branch's whole history (replayed when the branch is
//    forked). After every call the branch's view and whole state equal its shadow's,
//    bit for bit; a drop leaves every other branch's state as it was; a branch's
//    resident + shared bytes equal its shadow's resident bytes (the shadow shares
//    nothing), and once one branch is left it shares nothing either.
//  * The accounting: N forks of one state hold the encoded history once
//    (group_nbytes), each alone only its raw segments.
//  * Snapshots of a branch are those of its shadow.
//  * Two threads, one branch each, 10,000 calls each, views as the replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "support/data.h"
#include "support/snapshot_fixtures.h"

using namespace qvg;
using namespace qvg::testing;

namespace {

/// One recorded update() call.
struct Call {
  Tensor k, v;
  int64_t start = 0;
  std::optional<int64_t> head_start, rw;
};

std::vector<uint8_t> view_bytes(const StridedView& v) {
  const Tensor t = v.to_tensor();
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

/// A view's content and indices as one comparable value.
struct ViewValue {
  std::vector<uint8_t> k, v;
  int64_t ls = 0, le = 0, vle = 0, vge = 0;
  bool operator==(const ViewValue&) const = default;
};
ViewValue value_of(const KVView& w) {
  return {view_bytes(w.k),   view_bytes(w.v),     w.local_start_index,
          w.local_end_index, w.visible_local_end, w.visible_global_end};
}

template <class Cache>
KVView apply(Cache& c, const Call& x) {
  return c.update(x.k, x.v, x.start, x.head_start, x.rw);
}

/// The state compared between a branch and its shadow: the debug state without
/// what depends on the view scratch's history (a fork starts with its own, empty
/// one, so its first call's transient bytes differ; the last view's bytes are kept).
detail::PackedDebugState comparable(const PackedCausalCache& c) {
  detail::PackedDebugState s = detail::TestAccess::state(c);
  s.peak_transient_nbytes = 0;
  return s;
}
detail::DenseDebugState comparable(const DenseCausalCache& c) {
  detail::DenseDebugState s = detail::TestAccess::state(c);
  s.peak_transient_nbytes = 0;
  s.view_scratch.clear();  // the dense cache keeps its scratch's size, not the last view's
  return s;
}

struct Config {
  CacheOptions opt;
  QuantArgs quant;
  int64_t chunk = 2;
};

/// One bf16 cache of 2 heads of 8, chunks of 2 tokens, a 2-token sink and `cache_size`
/// tokens, with incremental spans (small_incremental_quant, no breaks).
Config incremental_config(int64_t cache_size) {
  Config s;
  s.chunk = 2;
  s.opt.batch = 1;
  s.opt.heads = 2;
  s.opt.head_dim = 8;
  s.opt.dtype = DType::BF16;
  s.opt.sink_tokens = 2;
  s.opt.cache_size = cache_size;
  s.quant = small_incremental_quant(0.0);
  return s;
}

/// An advance of `c` by one chunk of random K/V (all heads).
template <class Cache>
Call advance_call(std::mt19937_64& rng, const Config& s, const Cache& c) {
  Call x;
  x.start = c.global_end();
  x.k = random_tensor(rng, s.opt.dtype, {s.opt.batch, s.chunk, s.opt.heads, s.opt.head_dim});
  x.v = random_tensor(rng, s.opt.dtype, {s.opt.batch, s.chunk, s.opt.heads, s.opt.head_dim});
  return x;
}

/// A random packed-cache configuration at tiny shapes: spans (deferred, incremental
/// with and without breaks), refinement layers, sinks, keep_recent, warm or random init.
Config random_packed_config(std::mt19937_64& rng) {
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Config s;
  s.chunk = ri(1, 3);
  s.opt.batch = ri(1, 2);
  s.opt.heads = ri(1, 3);
  s.opt.head_dim = 8;
  s.opt.dtype = ri(0, 1) ? DType::BF16 : DType::F32;
  const int64_t sink_chunks = ri(0, 2);
  s.opt.sink_tokens = sink_chunks * s.chunk;
  s.opt.cache_size = (sink_chunks + ri(3, 7)) * s.chunk;
  if (ri(0, 3) == 0) s.opt.attention_window_size = s.opt.cache_size - s.chunk;
  s.quant = small_quant();
  s.quant.codec.stages = int(ri(1, 2));
  s.quant.codec.init = ri(0, 1) ? Init::Warm : Init::Random;
  s.quant.keep_recent_chunks = int(ri(0, 1));
  s.quant.sink = ri(0, 1) == 1;
  s.quant.span_chunks = int(ri(1, 3));
  if (ri(0, 1)) {
    s.quant.span_mode = SpanMode::Incremental;
    s.quant.span_break_ratio = ri(0, 1) ? 0.0 : 1.5;
    s.quant.refine_recent = int(ri(0, 2));
  }
  return s;
}

/// The next call on a branch: mostly rewrites of the current chunk (denoising steps)
/// and advances; random head slices and recent windows.
template <class Cache>
Call random_call(std::mt19937_64& rng, const Config& s, const Cache& c) {
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Call x;
  const bool advance = c.global_end() == 0 || ri(0, 2) == 0;
  x.start = advance ? c.global_end() : c.global_end() - s.chunk;
  int64_t h_in = s.opt.heads;
  if (s.opt.heads > 1 && ri(0, 3) == 0) {
    h_in = ri(1, s.opt.heads);
    x.head_start = ri(0, s.opt.heads - h_in);
  }
  if (ri(0, 4) == 0) x.rw = ri(0, 3 * s.chunk);
  x.k = random_tensor(rng, s.opt.dtype, {s.opt.batch, s.chunk, h_in, s.opt.head_dim});
  x.v = random_tensor(rng, s.opt.dtype, {s.opt.batch, s.chunk, h_in, s.opt.head_dim});
  return x;
}

struct PackedBranch {
  std::unique_ptr<PackedCausalCache> cache, shadow;
  std::vector<Call> history;
};

PackedCausalCache replayed(const Config& s, const std::vector<Call>& history) {
  PackedCausalCache c(s.opt, s.quant);
  for (const Call& x : history) apply(c, x);
  return c;
}

void check_accounting(const std::vector<PackedBranch>& bs) {
  std::vector<const PackedCausalCache*> all;
  size_t sum = 0;
  for (const PackedBranch& b : bs) {
    ASSERT_EQ(b.shadow->shared_nbytes(), 0u);
    ASSERT_EQ(b.cache->resident_nbytes() + b.cache->shared_nbytes(), b.shadow->resident_nbytes());
    all.push_back(b.cache.get());
    sum += b.cache->resident_nbytes() + b.cache->shared_nbytes();
  }
  const size_t group = PackedCausalCache::group_nbytes(all);
  ASSERT_LE(group, sum);
  size_t alone = 0;
  for (const PackedBranch& b : bs) alone += b.cache->resident_nbytes();
  ASSERT_GE(group, alone);
  if (bs.size() == 1) {
    ASSERT_EQ(bs[0].cache->shared_nbytes(), 0u);
    ASSERT_EQ(group, bs[0].shadow->resident_nbytes());
  }
}

/// One random sequence; adds its forks and drops to `forks`, `drops`.
void run_packed_branches(uint64_t seed, int& forks, int& drops) {
  std::mt19937_64 rng(seed);
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const Config s = random_packed_config(rng);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " chunk " << s.chunk << " " << s.quant.describe());
  std::vector<PackedBranch> bs;
  bs.push_back(
      {std::make_unique<PackedCausalCache>(s.opt, s.quant), std::make_unique<PackedCausalCache>(s.opt, s.quant), {}});
  for (int step = 0; step < 60; ++step) {
    const int64_t op = ri(0, 9);
    if (op == 0 && bs.size() < 5) {  // fork a random branch
      PackedBranch& from = bs[size_t(ri(0, int64_t(bs.size()) - 1))];
      const detail::PackedDebugState before = comparable(*from.cache);
      PackedBranch b{std::make_unique<PackedCausalCache>(from.cache->fork()),
                     std::make_unique<PackedCausalCache>(replayed(s, from.history)), from.history};
      ASSERT_TRUE(comparable(*from.cache) == before) << "fork changed its source";
      // Equal to the replay but for the last view (a fork has none yet).
      detail::PackedDebugState f = comparable(*b.cache), r = comparable(*b.shadow);
      ASSERT_TRUE(f.view_scratch.empty());
      r.view_scratch.clear();
      ASSERT_TRUE(f == r) << "step " << step;
      ASSERT_EQ(b.cache->snapshot_bytes(), from.cache->snapshot_bytes());
      bs.push_back(std::move(b));
      ++forks;
    } else if (op == 1 && bs.size() > 1) {  // drop a random branch
      const size_t d = size_t(ri(0, int64_t(bs.size()) - 1));
      std::vector<detail::PackedDebugState> others;
      for (size_t i = 0; i < bs.size(); ++i)
        if (i != d) others.push_back(comparable(*bs[i].cache));
      bs.erase(bs.begin() + std::ptrdiff_t(d));
      for (size_t i = 0; i < bs.size(); ++i) ASSERT_TRUE(comparable(*bs[i].cache) == others[i]) << "step " << step;
      ++drops;
    } else {  // a call on a random branch and its shadow
      PackedBranch& b = bs[size_t(ri(0, int64_t(bs.size()) - 1))];
      const Call x = random_call(rng, s, *b.cache);
      const ViewValue got = value_of(apply(*b.cache, x));
      const ViewValue want = value_of(apply(*b.shadow, x));
      ASSERT_TRUE(got == want) << "step " << step << " start " << x.start;
      ASSERT_TRUE(comparable(*b.cache) == comparable(*b.shadow)) << "step " << step;
      b.history.push_back(x);
    }
    check_accounting(bs);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The survivors: a snapshot of each is its shadow's; dropping all but one leaves it sharing nothing.
  for (const PackedBranch& b : bs) ASSERT_EQ(b.cache->snapshot_bytes(), b.shadow->snapshot_bytes());
  while (bs.size() > 1) bs.pop_back();
  check_accounting(bs);
}

}  // namespace

TEST(Branches, PackedRandomForksAndDropsEqualTheirReplays) {
  int forks = 0, drops = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    run_packed_branches(seed, forks, drops);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(forks, 150);  // the sequences did fork and drop
  EXPECT_GT(drops, 80);
}

// The accounting of N = 8 branches of one state: the encoded history once, each
// branch alone its raw segments (computed here from the segments' descriptions).
TEST(Branches, EightBranchesHoldTheEncodedHistoryOnce) {
  std::mt19937_64 rng(7);
  Config s = incremental_config(14);
  s.quant.refine_recent = 1;
  s.quant.keep_recent_chunks = 1;
  PackedCausalCache src(s.opt, s.quant);
  for (int i = 0; i < 10; ++i) apply(src, advance_call(rng, s, src));
  size_t raw = 0, packed = 0;
  for (size_t i = 0; i < src.num_segments(); ++i) (src.segment(i).packed ? packed : raw) += src.segment(i).nbytes;
  ASSERT_GT(raw, 0u);
  ASSERT_GT(packed, 0u);
  const size_t total = src.resident_nbytes();
  ASSERT_EQ(src.shared_nbytes(), 0u);
  ASSERT_GT(total, raw + packed);  // the incremental span's codebooks count once per span
  std::vector<PackedCausalCache> forks;
  for (int i = 0; i < 7; ++i) forks.push_back(src.fork());
  std::vector<const PackedCausalCache*> all{&src};
  for (const PackedCausalCache& f : forks) all.push_back(&f);
  for (const PackedCausalCache* c : all) {
    EXPECT_EQ(c->resident_nbytes(), raw);
    EXPECT_EQ(c->shared_nbytes(), total - raw);
  }
  EXPECT_EQ(PackedCausalCache::group_nbytes(all), total + 7 * raw);
  // Dropping forks: the shared part stays shared until one branch is left.
  forks.erase(forks.begin() + 1, forks.end());
  EXPECT_EQ(PackedCausalCache::group_nbytes(std::vector<const PackedCausalCache*>{&src, &forks[0]}), total + raw);
  forks.clear();
  EXPECT_EQ(src.resident_nbytes(), total);
  EXPECT_EQ(src.shared_nbytes(), 0u);
  // An advance on one branch: its new spans are its own, the old ones stay shared.
  PackedCausalCache f = src.fork();
  apply(f, advance_call(rng, s, f));
  EXPECT_EQ(src.resident_nbytes() + src.shared_nbytes(), total);
  EXPECT_GT(f.resident_nbytes(), 0u);
  EXPECT_GT(f.shared_nbytes(), 0u);
  EXPECT_EQ(PackedCausalCache::group_nbytes(std::vector<const PackedCausalCache*>{&src, &f}),
            src.resident_nbytes() + f.resident_nbytes() + src.shared_nbytes());
}

// The dense cache: a fork is a copy (owned, or in caller storage), equal to a replay.
TEST(Branches, DenseRandomForksEqualTheirReplays) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    std::mt19937_64 rng(seed);
    auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    Config s;
    s.chunk = ri(1, 3);
    s.opt.batch = ri(1, 2);
    s.opt.heads = ri(1, 3);
    s.opt.head_dim = 8;
    s.opt.dtype = ri(0, 1) ? DType::BF16 : DType::F32;
    s.opt.sink_tokens = ri(0, 1) * s.chunk;
    s.opt.cache_size = s.opt.sink_tokens + ri(2, 5) * s.chunk;
    s.opt.allow_growth = ri(0, 3) == 0;
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    struct Branch {
      std::unique_ptr<DenseCausalCache> cache, shadow;
      std::vector<Call> history;
    };
    // Caller storage for forks made with it (kept alive to the end of the test).
    std::vector<std::unique_ptr<std::vector<uint8_t>>> storage;
    const auto supply = [&](int64_t cs) {
      const size_t n = size_t(s.opt.batch * cs * s.opt.heads * s.opt.head_dim) * dtype_size(s.opt.dtype);
      storage.push_back(std::make_unique<std::vector<uint8_t>>(2 * n));
      return DenseCausalCache::ExternalStorage{storage.back()->data(), storage.back()->data() + n};
    };
    const auto replay = [&](const std::vector<Call>& h) {
      auto c = std::make_unique<DenseCausalCache>(s.opt);
      for (const Call& x : h) apply(*c, x);
      return c;
    };
    std::vector<Branch> bs;
    bs.push_back({std::make_unique<DenseCausalCache>(s.opt), std::make_unique<DenseCausalCache>(s.opt), {}});
    for (int step = 0; step < 40; ++step) {
      const int64_t op = ri(0, 7);
      if (op == 0 && bs.size() < 4) {
        Branch& from = bs[size_t(ri(0, int64_t(bs.size()) - 1))];
        const bool caller = ri(0, 1) == 1;
        Branch b{std::make_unique<DenseCausalCache>(caller ? from.cache->fork(supply) : from.cache->fork()),
                 replay(from.history), from.history};
        ASSERT_EQ(b.cache->owns_storage(), !caller);
        ASSERT_EQ(b.cache->snapshot_bytes(), from.cache->snapshot_bytes());
        bs.push_back(std::move(b));
      } else if (op == 1 && bs.size() > 1) {
        const size_t d = size_t(ri(0, int64_t(bs.size()) - 1));
        bs.erase(bs.begin() + std::ptrdiff_t(d));
      } else {
        Branch& b = bs[size_t(ri(0, int64_t(bs.size()) - 1))];
        Call x = random_call(rng, s, *b.cache);
        const ViewValue got = value_of(apply(*b.cache, x));
        ASSERT_TRUE(got == value_of(apply(*b.shadow, x))) << "step " << step;
        b.history.push_back(std::move(x));
      }
      for (const Branch& b : bs) {
        detail::DenseDebugState f = comparable(*b.cache), r = comparable(*b.shadow);
        f.owns_storage = r.owns_storage;  // a fork into caller storage
        ASSERT_TRUE(f == r) << "step " << step;
        ASSERT_EQ(b.cache->shared_nbytes(), 0u);
      }
    }
  }
}

TEST(Branches, DenseForkIntoNullStorageIsRefused) {
  const DenseCausalCache c(small_cache_options());
  EXPECT_THROW(c.fork([](int64_t) { return DenseCausalCache::ExternalStorage{}; }), InvalidArgument);
}

// Two threads, one branch each, 10,000 calls each (3 denoising rewrites per
// advance), every view equal to the same thread's replay cache's.
TEST(Branches, TwoThreadsOneBranchEach) {
  std::mt19937_64 rng(11);
  Config s = incremental_config(12);
  s.quant.span_chunks = 2;
  s.quant.refine_recent = 1;
  s.quant.codec.stages = 1;
  s.quant.codec.kmeans_iters = 1;
  PackedCausalCache src(s.opt, s.quant);
  std::vector<Call> history;
  for (int i = 0; i < 6; ++i) {
    history.push_back(advance_call(rng, s, src));
    apply(src, history.back());
  }
  constexpr int kCalls = 10000;
  std::vector<PackedCausalCache> branches;
  branches.push_back(src.fork());
  branches.push_back(src.fork());
  int mismatches[2] = {0, 0}, calls[2] = {0, 0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 r(100 + uint64_t(t));
      PackedCausalCache shadow = replayed(s, history);
      PackedCausalCache& b = branches[size_t(t)];
      for (int i = 0; i < kCalls; ++i) {
        Call x;
        x.start = i % 4 == 0 ? b.global_end() : b.global_end() - s.chunk;
        x.k = random_tensor(r, s.opt.dtype, {1, 2, 2, 8});
        x.v = random_tensor(r, s.opt.dtype, {1, 2, 2, 8});
        if (!(value_of(apply(b, x)) == value_of(apply(shadow, x)))) ++mismatches[t];
        ++calls[t];
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(calls[0], kCalls);
  EXPECT_EQ(calls[1], kCalls);
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
  // The source, untouched by either, still shares exactly its encoded sink with them
  // (sink segments are never evicted); every other span it shared left their windows.
  size_t sink_packed = 0;
  for (size_t i = 0; i < src.num_segments(); ++i)
    if (src.segment(i).is_sink && src.segment(i).packed) sink_packed += src.segment(i).nbytes;
  ASSERT_GT(sink_packed, 0u);
  EXPECT_EQ(src.shared_nbytes(), sink_packed);
  EXPECT_EQ(src.resident_nbytes() + src.shared_nbytes(), replayed(s, history).resident_nbytes());
}
