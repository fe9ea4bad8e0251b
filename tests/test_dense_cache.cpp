// DenseCausalCache (spec 3.2): hand-computed cases, then a randomized model
// test against tests/support DenseModel (growth, gaps, overlapping advances,
// partial rewrites, rewrites of older chunks, resets, head slices, every rw).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "support/cache_model.h"

using namespace qvg;
using namespace qvg::testing;

namespace {

/// K value that names its token: g + h/16 + d/1024 (+ 0.5 for V), exact in fp32.
Call tagged_call(int64_t B, int64_t H, int64_t D, int64_t c, int64_t n, std::optional<int64_t> hs = std::nullopt,
                 int64_t h_in = -1, std::optional<int64_t> rw = std::nullopt) {
  if (h_in < 0) h_in = H;
  Call call;
  call.c = c;
  call.hs = hs;
  call.rw = rw;
  call.k = Tensor(DType::F32, {B, n, h_in, D});
  call.v = Tensor(DType::F32, {B, n, h_in, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < h_in; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const float x = float(c + t) + float(hs.value_or(0) + h) / 16.0f + float(d) / 1024.0f + float(b) * 1000.0f;
          call.k.set(b, t, h, d, x);
          call.v.set(b, t, h, d, x + 0.5f);
        }
  return call;
}

/// The global positions a view shows, read back from the tags (batch 0, head 0, d 0).
std::vector<int64_t> tags(const KVView& v) {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < v.k.shape.s; ++t) out.push_back(int64_t(std::floor(v.k.at(0, t, 0, 0))));
  return out;
}

KVView upd(CausalCache& c, const Call& call) { return c.update(call.k, call.v, call.c, call.hs, call.rw); }

}  // namespace

TEST(DenseCache, EvictionRollKeepsSinkAndShiftsTail) {
  CacheOptions o;
  o.cache_size = 8;
  o.heads = 2;
  o.head_dim = 4;
  o.dtype = DType::F32;
  o.sink_tokens = 2;
  DenseCausalCache cache(o);
  upd(cache, tagged_call(1, 2, 4, 0, 3));
  upd(cache, tagged_call(1, 2, 4, 3, 3));
  KVView v = upd(cache, tagged_call(1, 2, 4, 6, 3));
  // le 6 + 3 > 8: evicted 1, rolled = 6 - 1 - 2 = 3: buffer[3, 6) -> [2, 5); chunk at [5, 8).
  EXPECT_EQ(tags(v), (std::vector<int64_t>{0, 1, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(v.local_start_index, 5);
  EXPECT_EQ(v.local_end_index, 8);
  EXPECT_EQ(v.visible_local_end, 8);
  EXPECT_EQ(v.visible_global_end, 9);
  EXPECT_TRUE(v.zero_copy);
  EXPECT_EQ(cache.peak_transient_nbytes(), 0u);
  // Heads are rolled together.
  EXPECT_EQ(v.k.at(0, 2, 1, 3), 3.0f + 1.0f / 16 + 3.0f / 1024);
  EXPECT_EQ(v.v.at(0, 2, 1, 3), 3.5f + 1.0f / 16 + 3.0f / 1024);
  // rw = 1: start = max(2, 5 - 1) = 4 > sink_end 2 -> [0, 2) ++ [4, 8), copied.
  v = upd(cache, tagged_call(1, 2, 4, 6, 3, std::nullopt, -1, 1));
  EXPECT_EQ(tags(v), (std::vector<int64_t>{0, 1, 5, 6, 7, 8}));
  EXPECT_FALSE(v.zero_copy);
  EXPECT_EQ(cache.peak_transient_nbytes(), 2u * 6 * 2 * 4 * 4);
  // A rewrite of an evicted position fails and changes nothing.
  const auto before = qvg::detail::debug_state(cache);
  EXPECT_THROW(upd(cache, tagged_call(1, 2, 4, 2, 2)), OutOfRange);
  EXPECT_EQ(qvg::detail::debug_state(cache), before);
}

TEST(DenseCache, GrowthDoublesAndWindowFollows) {
  CacheOptions o;
  o.cache_size = 4;
  o.head_dim = 2;
  o.dtype = DType::F32;
  o.allow_growth = true;
  DenseCausalCache cache(o);
  upd(cache, tagged_call(1, 1, 2, 0, 3));
  const size_t old_bytes = cache.resident_nbytes();
  KVView v = upd(cache, tagged_call(1, 1, 2, 3, 3));
  EXPECT_EQ(cache.cache_size(), 8);  // max(6, 2 * 4)
  EXPECT_EQ(cache.attention_window_size(), 8);
  EXPECT_EQ(tags(v), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(cache.peak_transient_nbytes(), old_bytes);
  // A chunk longer than the cache grows it to exactly what is needed.
  v = upd(cache, tagged_call(1, 1, 2, 6, 20));
  EXPECT_EQ(cache.cache_size(), 26);
  EXPECT_EQ(v.k.shape.s, 26);
}

TEST(DenseCache, WindowSmallerThanCacheDoesNotFollowGrowth) {
  CacheOptions o;
  o.cache_size = 4;
  o.head_dim = 2;
  o.dtype = DType::F32;
  o.allow_growth = true;
  o.attention_window_size = 3;
  DenseCausalCache cache(o);
  upd(cache, tagged_call(1, 1, 2, 0, 3));
  KVView v = upd(cache, tagged_call(1, 1, 2, 3, 2));
  EXPECT_EQ(cache.cache_size(), 8);
  EXPECT_EQ(cache.attention_window_size(), 3);
  EXPECT_EQ(tags(v), (std::vector<int64_t>{2, 3, 4}));
}

TEST(DenseCache, GapsAndPartialRewrites) {
  CacheOptions o;
  o.cache_size = 10;
  o.head_dim = 2;
  o.dtype = DType::F32;
  DenseCausalCache cache(o);
  upd(cache, tagged_call(1, 1, 2, 0, 2));
  KVView v = upd(cache, tagged_call(1, 1, 2, 5, 2));  // gap [2, 5)
  EXPECT_EQ(v.visible_global_end, 7);
  EXPECT_EQ(v.visible_local_end, 7);
  EXPECT_EQ(v.local_start_index, 5);
  EXPECT_EQ(v.k.at(0, 3, 0, 0), 0.0f);  // gap slots hold what the buffer held (zeros here)
  v = upd(cache, tagged_call(1, 1, 2, 1, 1));  // partial rewrite of the first chunk
  EXPECT_EQ(v.local_start_index, 1);
  EXPECT_EQ(v.visible_global_end, 7);
  EXPECT_EQ(tags(v)[1], 1);
  // Overlapping advance: [6, 9) overlaps the last written token.
  v = upd(cache, tagged_call(1, 1, 2, 6, 3));
  EXPECT_EQ(v.local_start_index, 6);
  EXPECT_EQ(v.visible_global_end, 9);
}

TEST(DenseCache, RewriteIntoSinkSlotsAfterEvictionIsRejected) {
  CacheOptions o;
  o.cache_size = 10;
  o.head_dim = 2;
  o.dtype = DType::F32;
  o.sink_tokens = 6;
  DenseCausalCache cache(o);
  for (int64_t c = 0; c < 10; c += 2) upd(cache, tagged_call(1, 1, 2, c, 2));
  upd(cache, tagged_call(1, 1, 2, 10, 2));  // evicts 2: global 6, 7 gone; shift 2
  // Global 2 would be written at buffer index 0 (a sink slot): rejected.
  try {
    upd(cache, tagged_call(1, 1, 2, 2, 2));
    FAIL() << "expected OutOfRange";
  } catch (const OutOfRange& e) {
    EXPECT_NE(std::string(e.what()).find("rewrite of evicted positions"), std::string::npos) << e.what();
  }
  // Global 8 lives at buffer index 6: allowed.
  KVView v = upd(cache, tagged_call(1, 1, 2, 8, 2));
  EXPECT_EQ(v.local_start_index, 6);
}

TEST(DenseCache, HeadSliceIsZeroCopyIntoTheBuffer) {
  CacheOptions o;
  o.cache_size = 6;
  o.heads = 4;
  o.head_dim = 8;
  o.batch = 2;
  o.dtype = DType::BF16;
  DenseCausalCache cache(o);
  std::mt19937_64 rng(7);
  Tensor k = random_tensor(rng, DType::BF16, {2, 3, 2, 8}), v = random_tensor(rng, DType::BF16, {2, 3, 2, 8});
  KVView view = cache.update(k, v, 0, 1);
  EXPECT_TRUE(view.zero_copy);
  EXPECT_EQ(view.k.shape, (Shape4{2, 3, 2, 8}));
  const auto* base = static_cast<const std::byte*>(cache.k_buffer().data);
  EXPECT_EQ(static_cast<const std::byte*>(view.k.data), base + 8 * 2);  // head 1 of token 0
  EXPECT_EQ(view.k.stride_t, 4 * 8);
  EXPECT_EQ(view.k.stride_b, 6 * 4 * 8);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(view.k.at(b, t, h, d), k.at(b, t, h, d));
}

TEST(DenseCache, ExternalStorageIsUsedInPlace) {
  CacheOptions o;
  o.cache_size = 4;
  o.head_dim = 2;
  o.dtype = DType::F32;
  std::vector<float> kb(8, -1.0f), vb(8, -2.0f);
  DenseCausalCache cache(o, {kb.data(), vb.data()});
  EXPECT_FALSE(cache.owns_storage());
  KVView v = upd(cache, tagged_call(1, 1, 2, 0, 2));
  EXPECT_EQ(kb[0], 0.0f);
  EXPECT_EQ(kb[2], 1.0f);
  EXPECT_EQ(kb[4], -1.0f);  // untouched
  EXPECT_EQ(v.k.data, kb.data());
  cache.set_indices(4, 4);
  v = upd(cache, tagged_call(1, 1, 2, 4, 1));  // evicts one token
  EXPECT_EQ(v.visible_global_end, 5);
  EXPECT_EQ(kb[6], 4.0f);
  EXPECT_THROW(cache.set_indices(3, 2), InvalidArgument);
  EXPECT_THROW(DenseCausalCache(o, {nullptr, vb.data()}), InvalidArgument);
}

TEST(DenseCache, ResetIndicesKeepsBuffer) {
  CacheOptions o;
  o.cache_size = 4;
  o.head_dim = 2;
  o.dtype = DType::F32;
  DenseCausalCache cache(o);
  upd(cache, tagged_call(1, 1, 2, 0, 3));
  cache.reset_indices();
  EXPECT_EQ(cache.global_end(), 0);
  EXPECT_EQ(cache.local_end(), 0);
  KVView v = upd(cache, tagged_call(1, 1, 2, 0, 1));
  EXPECT_EQ(v.k.shape.s, 1);
  EXPECT_EQ(cache.k_buffer().shape.s, 4);
  EXPECT_TRUE(cache.can_direct_current_attention(4));
  EXPECT_FALSE(cache.can_direct_current_attention(3));
}

// ---------------------------------------------------------------------------
// Randomized model test.

namespace {

struct DenseRun {
  int calls = 0, errors = 0, growths = 0, copies = 0;
};

void run_dense_sequence(uint64_t seed, DenseRun& stats) {
  std::mt19937_64 rng(seed);
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::uniform_real_distribution<float> u(0, 1);
  ScenarioParams p;
  p.B = ri(1, 2);
  p.H = ri(1, 4);
  const int64_t dims[] = {8, 16, 32, 64};
  p.D = u(rng) < 0.8f ? dims[ri(0, 1)] : dims[ri(2, 3)];
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  p.dtype = dts[ri(0, 2)];
  p.base_chunk = ri(1, 8);
  p.steps_max = 2;
  CacheOptions o;
  o.batch = p.B;
  o.heads = p.H;
  o.head_dim = p.D;
  o.dtype = p.dtype;
  o.cache_size = ri(p.base_chunk, 8 * p.base_chunk);
  const int64_t sinks[] = {0, ri(0, p.base_chunk - 1), p.base_chunk, 2 * p.base_chunk};
  o.sink_tokens = std::min(o.cache_size, sinks[ri(0, 3)]);
  if (u(rng) < 0.5f) o.attention_window_size = ri(1, o.cache_size);
  o.allow_growth = u(rng) < 0.2f;
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " B=" << o.batch << " H=" << o.heads << " D="
                                    << o.head_dim << " cs=" << o.cache_size << " sink=" << o.sink_tokens
                                    << " window=" << o.window() << " growth=" << o.allow_growth);
  DenseCausalCache cache(o);
  DenseModel model(o);
  const int ops = int(ri(10, 40));
  for (int op = 0; op < ops; ++op) {
    const int64_t ge = model.global_end();
    const int64_t n = p.vary_chunks ? ri(1, 2 * p.base_chunk) : p.base_chunk;
    std::vector<Call> calls;
    const float r = u(rng);
    if (r < 0.5f || ge == 0) {
      calls = chunk_calls(rng, p, ge, n);  // the next chunk, 1-2 steps
    } else if (r < 0.6f) {
      calls = chunk_calls(rng, p, ge + ri(1, p.base_chunk), n);  // gap
    } else if (r < 0.7f && n > 1) {
      calls = chunk_calls(rng, p, std::max<int64_t>(0, ge - ri(1, n - 1)), n);  // overlapping advance
    } else if (r < 0.95f) {
      const int64_t m = ri(1, std::max<int64_t>(1, std::min(ge, p.base_chunk)));
      const int64_t lo = std::max<int64_t>(0, ge - o.cache_size - p.base_chunk);
      calls = chunk_calls(rng, p, ri(lo, std::max(lo, ge - m)), m);  // (partial) rewrite, maybe evicted
    } else {
      cache.reset_indices();
      model.reset();
      continue;
    }
    for (const Call& call : calls) {
      ++stats.calls;
      const auto want_err = model.check(call);
      const int64_t cap_before = cache.cache_size();
      if (want_err) {
        const auto before = qvg::detail::debug_state(cache);
        const Outcome out = run_call(cache, call);
        ASSERT_EQ(out.error, want_err) << "c=" << call.c << " n=" << call.n() << " " << out.message;
        ASSERT_TRUE(qvg::detail::debug_state(cache) == before) << "state changed by a failing call";
        ++stats.errors;
        continue;
      }
      const Outcome out = run_call(cache, call);
      ASSERT_FALSE(out.error) << "c=" << call.c << " n=" << call.n() << ": " << out.message;
      const ModelView mv = model.apply(call);
      const std::string diff = compare_exact(out.view, mv);
      ASSERT_EQ(diff, "") << "c=" << call.c << " n=" << call.n() << " hs=" << call.head0()
                          << " rw=" << (call.rw ? *call.rw : -1);
      ASSERT_EQ(cache.global_end(), model.global_end());
      ASSERT_EQ(cache.local_end(), model.local_end());
      ASSERT_EQ(cache.cache_size(), model.cache_size());
      ASSERT_EQ(cache.attention_window_size(), model.window());
      ASSERT_EQ(cache.resident_nbytes(), model.resident_nbytes());
      const bool grew = cache.cache_size() != cap_before;
      stats.growths += grew;
      stats.copies += !out.view.zero_copy;
      const size_t esz = dtype_size(o.dtype);
      const size_t view_bytes = out.view.zero_copy ? 0 : 2 * size_t(out.view.k.shape.numel()) * esz;
      const size_t grow_bytes = grew ? 2 * size_t(o.batch * cap_before * o.heads * o.head_dim) * esz : 0;
      ASSERT_EQ(cache.peak_transient_nbytes(), std::max(view_bytes, grow_bytes));
      if (out.view.zero_copy) {  // aliases the buffer
        const auto* kb = static_cast<const std::byte*>(cache.k_buffer().data);
        const auto* vp = static_cast<const std::byte*>(out.view.k.data);
        ASSERT_TRUE(vp >= kb && vp < kb + cache.k_buffer().nbytes());
      }
    }
  }
}

}  // namespace

TEST(DenseCache, RandomizedAgainstModel) {
  const int sequences = scaled(2000, 200);
  DenseRun stats;
  for (int i = 0; i < sequences; ++i) {
    run_dense_sequence(1000 + uint64_t(i), stats);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("dense model test: %d sequences, %d calls, %d rejected as the model predicted, %d growths, %d copied views\n",
              sequences, stats.calls, stats.errors, stats.growths, stats.copies);
  EXPECT_GT(stats.errors, 0);
  EXPECT_GT(stats.growths, 0);
  EXPECT_GT(stats.copies, 0);
}
