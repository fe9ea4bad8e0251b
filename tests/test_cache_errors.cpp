// Spec 5 for both caches, in the pattern of LevelDB's fault tests: for every
// error that applies to a cache, a cache driven to a random state is
// snapshotted (debug_state: buffers, segments, cursors, byte counts, the last
// view's bytes), the bad call must fail with the documented type and a message
// naming argument, value and what is allowed, the cache must equal the
// snapshot, and the next valid call must give exactly what a twin cache that
// never saw the bad call gives.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "qvg/numeric.h"
#include "support/cache_model.h"
#include "support/errors.h"

using namespace qvg;
using namespace qvg::testing;

namespace {

struct Setup {
  CacheOptions o;
  QuantArgs q;
  int64_t base = 3;
};

struct Needs {
  bool window_smaller = false;  // attention_window_size < cache_size
  bool sink = false;            // sink_tokens > 0
  bool heads = false;           // H >= 2
  bool f32 = false;             // dtype f32 (values > 65504 representable)
};

Setup random_setup(std::mt19937_64& rng, bool packed, const Needs& need) {
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Setup s;
  s.o.batch = ri(1, 2);
  s.o.heads = ri(need.heads ? 2 : 1, 4);
  s.o.head_dim = ri(0, 1) ? 8 : 16;
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  s.o.dtype = need.f32 ? DType::F32 : dts[ri(0, 2)];
  s.base = ri(2, 5);
  s.o.sink_tokens = need.sink ? ri(1, s.base + 1) : (ri(0, 1) ? 0 : ri(0, s.base + 1));
  s.o.cache_size = s.o.sink_tokens + ri(2 * s.base + 2, 6 * s.base);
  if (need.window_smaller)
    s.o.attention_window_size = ri(s.o.sink_tokens + s.base + 1, s.o.cache_size - 1);
  else if (ri(0, 3) == 0)
    s.o.attention_window_size = ri(s.o.sink_tokens + s.base + 1, s.o.cache_size);
  if (packed && ri(0, 1)) {
    s.q.enable(ri(0, 1) ? 2 : 4);
    s.q.codec.centroids = int(ri(1, 4));
    s.q.codec.block_size = 8;
    s.q.codec.kmeans_iters = 1;
    s.q.keep_recent_chunks = int(ri(0, 1));
    s.q.span_chunks = int(ri(1, 2));
    if (ri(0, 1)) {  // incremental spans (the error calls must not touch the open span either)
      s.q.span_mode = SpanMode::Incremental;
      s.q.span_break_ratio = ri(0, 1) ? 0.0 : 1.2;
      s.q.refine_recent = int(ri(0, 2));  // refinement layers: error calls must leave them too
    }
    s.q.codec.init = ri(0, 1) ? Init::Warm : Init::Random;
    s.q.codec.threads = 1;
  }
  return s;
}

ScenarioParams params_of(const Setup& s) {
  ScenarioParams p;
  p.B = s.o.batch;
  p.H = s.o.heads;
  p.D = s.o.head_dim;
  p.dtype = s.o.dtype;
  p.base_chunk = s.base;
  p.steps_max = 2;
  return p;
}

/// A random history of valid calls for this setup (checked with the model of
/// the cache kind), replayable on twins.
template <class Model>
std::vector<Call> valid_history(std::mt19937_64& rng, const Setup& s, Model& model) {
  const ScenarioParams p = params_of(s);
  std::vector<Call> out;
  const int chunks = std::uniform_int_distribution<int>(1, 9)(rng);
  for (int i = 0; i < chunks; ++i) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, s.base)(rng);
    for (Call& call : chunk_calls(rng, p, model.global_end(), n)) {
      if (model.check(call)) break;
      model.apply(call);
      out.push_back(std::move(call));
    }
  }
  return out;
}

/// A valid advance at global_end for the next call after the bad one.
template <class Model>
Call next_valid(std::mt19937_64& rng, const Setup& s, const Model& model) {
  const ScenarioParams p = params_of(s);
  for (int64_t n = s.base; n >= 1; --n) {
    Call call = chunk_calls(rng, p, model.global_end(), n).front();
    if (!model.check(call)) return call;
  }
  ADD_FAILURE() << "no valid next call";
  return {};
}

struct BadCall {
  Call call;
  std::vector<std::string> must_contain;  // substrings of the message
  std::string exact;                      // the whole message, when the spec fixes it
};

/// Context handed to case makers: the setup and the cache's state.
struct Ctx {
  const Setup& s;
  const CausalCache& cache;
  std::optional<std::pair<int64_t, int64_t>> current;  // packed: [g0, g1) of the current chunk
  std::mt19937_64& rng;
};

Call plain_call(const Ctx& x, int64_t c, int64_t n, int64_t h = -1, std::optional<int64_t> hs = std::nullopt) {
  const auto& o = x.s.o;
  Call call;
  call.c = c;
  call.hs = hs;
  call.k = random_tensor(x.rng, o.dtype, {o.batch, n, h < 0 ? o.heads : h, o.head_dim});
  call.v = random_tensor(x.rng, o.dtype, {o.batch, n, h < 0 ? o.heads : h, o.head_dim});
  return call;
}

/// Writes v into element (b, t, h, d) without saturation (Tensor::set saturates fp16).
void poke(Tensor& x, int64_t b, int64_t t, int64_t h, int64_t d, float v) {
  const Shape4 s = x.shape();
  const size_t i = size_t(((b * s.s + t) * s.h + h) * s.d + d);
  switch (x.dtype()) {
    case DType::F32: static_cast<float*>(x.data())[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(x.data())[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(x.data())[i] = f32_to_f16(v); break;
  }
}

struct Case {
  const char* name;
  bool dense, packed;
  ErrorKind kind;
  Needs needs;
  std::function<std::optional<BadCall>(Ctx&)> make;
};

std::vector<Case> cases() {
  using K = ErrorKind;
  std::vector<Case> cs;
  auto ge_of = [](const Ctx& x) { return x.cache.global_end(); };
  // --- both caches -------------------------------------------------------------
  cs.push_back({"negative recent_window_tokens", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  BadCall b{plain_call(x, ge_of(x), 1), {}, "recent_window_tokens must be >= 0 or None, got -1"};
                  b.call.rw = -1;
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"head slice without cache_head_start", true, true, K::InvalidArgument, {.heads = true}, [=](Ctx& x) {
                  return std::optional<BadCall>(BadCall{plain_call(x, ge_of(x), 1, 1),
                                                        {"cache_head_start is required", "got None"}, ""});
                }});
  cs.push_back({"head slice past the last head", true, true, K::InvalidArgument, {.heads = true}, [=](Ctx& x) {
                  const int64_t H = x.s.o.heads;
                  return std::optional<BadCall>(BadCall{plain_call(x, ge_of(x), 1, 2, H - 1),
                                                        {"cache_head_start", std::to_string(H - 1)}, ""});
                }});
  cs.push_back({"negative cache_head_start", true, true, K::InvalidArgument, {.heads = true}, [=](Ctx& x) {
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, ge_of(x), 1, 1, -1), {"cache_head_start", "got -1"}, ""});
                }});
  cs.push_back({"more heads than the cache", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  const int64_t H = x.s.o.heads;
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, ge_of(x), 1, H + 1, 0), {"key heads", std::to_string(H + 1)}, ""});
                }});
  cs.push_back({"batch mismatch", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  BadCall b{plain_call(x, ge_of(x), 1), {"key batch", "got " + std::to_string(x.s.o.batch + 1)}, ""};
                  const auto& o = x.s.o;
                  b.call.k = random_tensor(x.rng, o.dtype, {o.batch + 1, 1, o.heads, o.head_dim});
                  b.call.v = b.call.k;
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"head_dim mismatch", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  const auto& o = x.s.o;
                  BadCall b{plain_call(x, ge_of(x), 1), {"head_dim", "got " + std::to_string(o.head_dim * 2)}, ""};
                  b.call.k = random_tensor(x.rng, o.dtype, {o.batch, 1, o.heads, o.head_dim * 2});
                  b.call.v = b.call.k;
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"key dtype differs from the cache", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  const auto& o = x.s.o;
                  const DType other = o.dtype == DType::F32 ? DType::BF16 : DType::F32;
                  BadCall b{plain_call(x, ge_of(x), 1), {"key dtype", std::string(dtype_name(other))}, ""};
                  b.call.k = random_tensor(x.rng, other, {o.batch, 1, o.heads, o.head_dim});
                  b.call.v = b.call.k;
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"value dtype differs from key", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  const auto& o = x.s.o;
                  const DType other = o.dtype == DType::F16 ? DType::BF16 : DType::F16;
                  BadCall b{plain_call(x, ge_of(x), 1), {"value dtype", std::string(dtype_name(other))}, ""};
                  b.call.v = random_tensor(x.rng, other, {o.batch, 1, o.heads, o.head_dim});
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"value shape differs from key", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  const auto& o = x.s.o;
                  BadCall b{plain_call(x, ge_of(x), 2), {"value shape", "[", "]"}, ""};
                  b.call.v = random_tensor(x.rng, o.dtype, {o.batch, 1, o.heads, o.head_dim});
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"n = 0", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  return std::optional<BadCall>(BadCall{plain_call(x, ge_of(x), 0), {"key tokens n", "got 0"}, ""});
                }});
  cs.push_back({"negative current_chunk_start", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, -2, 1), {"current_chunk_start", "got -2"}, ""});
                }});
  cs.push_back({"NaN in key", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  BadCall b{plain_call(x, ge_of(x), 2), {"key must hold finite values", "nan"}, ""};
                  poke(b.call.k, 0, 1, 0, 3, std::numeric_limits<float>::quiet_NaN());
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"Inf in value", true, true, K::InvalidArgument, {}, [=](Ctx& x) {
                  BadCall b{plain_call(x, ge_of(x), 2), {"value must hold finite values", "inf"}, ""};
                  poke(b.call.v, x.s.o.batch - 1, 0, 0, 0, -std::numeric_limits<float>::infinity());
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"|x| > 1e16 in key", true, true, K::InvalidArgument, {.f32 = true}, [=](Ctx& x) {
                  BadCall b{plain_call(x, ge_of(x), 1), {"key must hold finite values with |x| <= 1e16"}, ""};
                  poke(b.call.k, 0, 0, 0, 1, 2e16f);
                  return std::optional<BadCall>(b);
                }});
  cs.push_back({"chunk longer than the cache", true, true, K::OutOfRange, {}, [=](Ctx& x) {
                  const int64_t cs_ = x.s.o.cache_size;
                  return std::optional<BadCall>(BadCall{plain_call(x, ge_of(x), cs_ + 1),
                                                        {"longer than the cache", std::to_string(cs_ + 1)}, ""});
                }});
  cs.push_back({"placement overwriting sink tokens", true, true, K::OutOfRange, {.sink = true}, [=](Ctx& x) {
                  const auto& o = x.s.o;
                  const int64_t le = x.cache.local_end();
                  const int64_t se = std::min(o.sink_tokens, le);
                  const int64_t n = o.cache_size - se + 1;  // forces eviction and overlaps the sink
                  if (se == 0 || le + n <= o.cache_size) return std::optional<BadCall>();
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, ge_of(x), n), {"would overwrite sink tokens", std::to_string(n)}, ""});
                }});
  // --- dense only --------------------------------------------------------------
  cs.push_back({"dense: chunk longer than the window", true, false, K::OutOfRange, {.window_smaller = true},
                [=](Ctx& x) {
                  const auto& o = x.s.o;
                  const int64_t n = o.window() + 1;
                  const int64_t le = x.cache.local_end();
                  if (le + n > o.cache_size && o.cache_size - n < std::min(o.sink_tokens, le))
                    return std::optional<BadCall>();  // would hit the sink error first
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, ge_of(x), n), {"attention window", std::to_string(n)}, ""});
                }});
  cs.push_back({"dense: rewrite of evicted positions", true, false, K::OutOfRange, {}, [=](Ctx& x) {
                  const int64_t shift = x.cache.global_end() - x.cache.local_end();
                  if (shift == 0) return std::optional<BadCall>();
                  const int64_t c = std::uniform_int_distribution<int64_t>(0, shift - 1)(x.rng);
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, c, 1), {"rewrite of evicted positions", std::to_string(c)}, ""});
                }});
  cs.push_back({"dense: rewrite into sink slots after eviction", true, false, K::OutOfRange, {.sink = true},
                [=](Ctx& x) {
                  const int64_t shift = x.cache.global_end() - x.cache.local_end();
                  const int64_t se = std::min(x.s.o.sink_tokens, x.cache.local_end());
                  if (shift == 0 || se == 0) return std::optional<BadCall>();
                  const int64_t c = std::uniform_int_distribution<int64_t>(shift, shift + se - 1)(x.rng);
                  return std::optional<BadCall>(BadCall{plain_call(x, c, 1),
                                                        {"rewrite of evicted positions", "inside the sink slots",
                                                         std::to_string(c)},
                                                        ""});
                }});
  // --- packed only ---------------------------------------------------------------
  cs.push_back({"packed: chunk not entirely visible", false, true, K::OutOfRange, {.window_smaller = true},
                [=](Ctx& x) {
                  const auto& o = x.s.o;
                  const int64_t ge = x.cache.global_end();
                  const int64_t le = x.cache.local_end();
                  const int64_t se = std::min(o.sink_tokens, ge);
                  if (ge < o.sink_tokens) return std::optional<BadCall>();
                  const int64_t n = o.window() - se + 1;
                  if (n > o.cache_size || (le + n > o.cache_size && o.cache_size - n < std::min(o.sink_tokens, le)))
                    return std::optional<BadCall>();
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, ge, n), {"not entirely visible", std::to_string(n)}, ""});
                }});
  cs.push_back({"packed: current chunk size change", false, true, K::Unsupported, {}, [=](Ctx& x) {
                  if (!x.current) return std::optional<BadCall>();
                  const auto [g0, g1] = *x.current;
                  const int64_t n = g1 - g0 == 1 ? 2 : g1 - g0 - 1;
                  return std::optional<BadCall>(BadCall{plain_call(x, g0, n),
                                                        {"must keep its size", "n must be " + std::to_string(g1 - g0),
                                                         "got " + std::to_string(n)},
                                                        ""});
                }});
  cs.push_back({"packed: write past global_end (gap)", false, true, K::Unsupported, {}, [=](Ctx& x) {
                  const int64_t c = x.cache.global_end() + 1;
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, c, 1), {"non-sequential write", "got " + std::to_string(c)}, ""});
                }});
  cs.push_back({"packed: rewrite of an older chunk", false, true, K::Unsupported, {}, [=](Ctx& x) {
                  if (!x.current || x.current->first == 0) return std::optional<BadCall>();
                  const int64_t c = std::uniform_int_distribution<int64_t>(0, x.current->first - 1)(x.rng);
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, c, 1), {"non-sequential write", "got " + std::to_string(c)}, ""});
                }});
  cs.push_back({"packed: write inside the current chunk", false, true, K::Unsupported, {}, [=](Ctx& x) {
                  if (!x.current || x.current->second - x.current->first < 2) return std::optional<BadCall>();
                  const int64_t c = x.current->first + 1;
                  return std::optional<BadCall>(
                      BadCall{plain_call(x, c, 1), {"non-sequential write", "got " + std::to_string(c)}, ""});
                }});
  return cs;
}

template <class CacheT, class Model>
void run_case(const Case& cs, bool packed, int seeds, int& applied, std::string& example) {
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937_64 rng(uint64_t(seed) * 7919 + 17);
    const Setup s = random_setup(rng, packed, cs.needs);
    SCOPED_TRACE(::testing::Message() << cs.name << " seed " << seed << " cs=" << s.o.cache_size
                                      << " sink=" << s.o.sink_tokens << " window=" << s.o.window()
                                      << " quant: " << s.q.describe());
    Model model = [&] {
      if constexpr (std::is_same_v<Model, DenseModel>) return Model(s.o);
      else return Model(s.o, s.q);
    }();
    auto make = [&] {
      if constexpr (std::is_same_v<CacheT, DenseCausalCache>) return CacheT(s.o);
      else return CacheT(s.o, s.q);
    };
    CacheT cache = make(), twin = make();
    const std::vector<Call> history = valid_history(rng, s, model);
    KVView last{};
    for (const Call& call : history) {
      last = cache.update(call.k, call.v, call.c, call.hs, call.rw);
      twin.update(call.k, call.v, call.c, call.hs, call.rw);
    }
    Ctx ctx{s, cache, std::nullopt, rng};
    if constexpr (std::is_same_v<CacheT, PackedCausalCache>) {
      if (cache.num_segments() > 0) {
        const auto cur = cache.segment(cache.num_segments() - 1);
        ctx.current = std::make_pair(cur.g0, cur.g1);
      }
    }
    const std::optional<BadCall> bad = cs.make(ctx);
    if (!bad) continue;
    ++applied;
    const auto snapshot = qvg::detail::debug_state(cache);
    const Tensor last_k = history.empty() ? Tensor() : last.k.to_tensor();
    try {
      cache.update(bad->call.k, bad->call.v, bad->call.c, bad->call.hs, bad->call.rw);
      ADD_FAILURE() << "no error";
      return;
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (example.empty()) example = msg;
      EXPECT_EQ(kind_name(e.kind()), kind_name(cs.kind)) << msg;
      if (!bad->exact.empty()) {
        EXPECT_EQ(msg, bad->exact);
      }
      for (const std::string& sub : bad->must_contain) EXPECT_NE(msg.find(sub), std::string::npos) << msg;
      switch (cs.kind) {  // the C++ type matches the kind
        case ErrorKind::InvalidArgument: EXPECT_NE(dynamic_cast<const InvalidArgument*>(&e), nullptr); break;
        case ErrorKind::Unsupported: EXPECT_NE(dynamic_cast<const Unsupported*>(&e), nullptr); break;
        case ErrorKind::OutOfRange: EXPECT_NE(dynamic_cast<const OutOfRange*>(&e), nullptr); break;
        case ErrorKind::CorruptData: EXPECT_NE(dynamic_cast<const CorruptData*>(&e), nullptr); break;
        case ErrorKind::Device: EXPECT_NE(dynamic_cast<const DeviceError*>(&e), nullptr); break;
      }
    }
    ASSERT_TRUE(qvg::detail::debug_state(cache) == snapshot) << "state changed by the failing call";
    EXPECT_EQ(qvg::detail::debug_state(cache), qvg::detail::debug_state(twin));
    if (!history.empty()) {  // the previous view is still valid and unchanged
      const StridedView saved = StridedView::of(last_k);
      EXPECT_EQ(compare_views(KVView{last.k, last.k}, KVView{saved, saved}), "");
    }
    const Call next = next_valid(rng, s, model);
    const KVView a = cache.update(next.k, next.v, next.c, next.hs, next.rw);
    const KVView b = twin.update(next.k, next.v, next.c, next.hs, next.rw);
    EXPECT_EQ(compare_views(a, b), "");
    EXPECT_EQ(a.local_start_index, b.local_start_index);
    EXPECT_EQ(a.visible_global_end, b.visible_global_end);
    EXPECT_TRUE(qvg::detail::debug_state(cache) == qvg::detail::debug_state(twin))
        << "the next valid call differs from the twin's";
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace

TEST(CacheErrors, DenseStateUnchangedAfterEveryError) {
  const int seeds = scaled(60, 15);
  for (const Case& c : cases()) {
    if (!c.dense) continue;
    int applied = 0;
    std::string example;
    run_case<DenseCausalCache, DenseModel>(c, false, seeds, applied, example);
    std::printf("dense  %-46s %2d/%d states  e.g. %s\n", c.name, applied, seeds, example.c_str());
    EXPECT_GT(applied, 0) << c.name;
    if (HasFatalFailure()) return;
  }
}

TEST(CacheErrors, PackedStateUnchangedAfterEveryError) {
  const int seeds = scaled(60, 15);
  for (const Case& c : cases()) {
    if (!c.packed) continue;
    int applied = 0;
    std::string example;
    run_case<PackedCausalCache, PackedModel>(c, true, seeds, applied, example);
    std::printf("packed %-46s %2d/%d states  e.g. %s\n", c.name, applied, seeds, example.c_str());
    EXPECT_GT(applied, 0) << c.name;
    if (HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------------------
// Construction errors (no state to keep).

namespace {

CacheOptions ok_opts() {
  CacheOptions o;
  o.cache_size = 16;
  o.head_dim = 16;
  o.heads = 2;
  return o;
}

}  // namespace

TEST(CacheErrors, ConstructorOptions) {
  auto both = [](const CacheOptions& o, const std::string& sub) {
    EXPECT_NE(error_of([&] { DenseCausalCache c(o); }, ErrorKind::InvalidArgument).find(sub), std::string::npos);
    EXPECT_NE(error_of([&] { PackedCausalCache c(o); }, ErrorKind::InvalidArgument).find(sub), std::string::npos);
  };
  CacheOptions o = ok_opts();
  o.sink_tokens = 17;
  both(o, "sink_tokens must be in [0, cache_size = 16], got 17");
  o = ok_opts();
  o.attention_window_size = 17;
  both(o, "attention_window_size must be in [1, cache_size = 16] or None, got 17");
  o.attention_window_size = 0;
  both(o, "got 0");
  o = ok_opts();
  o.cache_size = 0;
  both(o, "cache_size must be >= 1, got 0");
  o = ok_opts();
  o.head_dim = 0;
  both(o, "head_dim must be >= 1, got 0");
  o = ok_opts();
  o.batch = -1;
  both(o, "batch must be >= 1, got -1");
  o = ok_opts();
  o.heads = 0;
  both(o, "num_heads must be >= 1, got 0");
  // Sizes are bounded at construction with qvg's own message (the size limits of
  // docs/design.md: a head_dim or num_heads of 2^40 must not reach the allocator).
  o = ok_opts();
  o.head_dim = int64_t(1) << 40;
  both(o, "head_dim must be at most 65536 (2^16), got 1099511627776");
  o = ok_opts();
  o.heads = int64_t(1) << 40;
  both(o, "num_heads must be at most 65536 (2^16), got 1099511627776");
  o = ok_opts();
  o.batch = (int64_t(1) << 16) + 1;
  both(o, "batch must be at most 65536");
  o = ok_opts();
  o.cache_size = (int64_t(1) << 40) + 1;
  o.sink_tokens = 0;
  both(o, "cache_size must be at most 1099511627776 (2^40 tokens)");
  o = ok_opts();  // each size allowed, their product too large: 2 x 2^24 x 2^8 x 2^8 x 2 bytes = 2^42
  o.cache_size = int64_t(1) << 24;
  o.heads = 256;
  o.head_dim = 256;
  both(o, "too large: its K and V would take");
  o.cache_size = int64_t(1) << 21;  // 2^40 bytes exactly: allowed (nothing allocated by the packed cache)
  EXPECT_NO_THROW(PackedCausalCache c(o));
}

TEST(CacheErrors, PackedRejectsGrowthAndInvalidConfiguration) {
  CacheOptions o = ok_opts();
  o.allow_growth = true;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o); }, ErrorKind::Unsupported).find("allow_growth"),
            std::string::npos);
  o = ok_opts();
  QuantArgs q;
  q.enable(5);  // no code format (qvg/code_format.h)
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("bits must be 2, 3 or 4"),
            std::string::npos);
  q = QuantArgs();
  q.enable(2);
  q.codec.block_size = 12;  // multiple of 4, does not divide 16
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("block_size"),
            std::string::npos);
  q.codec.block_size = 64;  // larger than head_dim 16
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("block_size"),
            std::string::npos);
  q = QuantArgs();
  q.enable(4);
  q.codec.block_size = 16;
  q.codec.centroids = 300;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("centroids"),
            std::string::npos);
  q.codec.centroids = 16;
  q.keep_recent_chunks = -1;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("keep_recent_chunks"),
            std::string::npos);
  q.keep_recent_chunks = 1;
  q.span_chunks = 0;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("span_chunks"),
            std::string::npos);
  q.span_chunks = 2;
  for (double bad : {-0.5, 1e7, std::numeric_limits<double>::quiet_NaN()}) {
    q.span_break_ratio = bad;
    EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument).find("span_break_ratio"),
              std::string::npos)
        << bad;
  }
  q.span_break_ratio = 0;
  // Refinement layers: incremental spans only, a count in range, a code width.
  q.refine_recent = 1;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument)
                .find("refine_recent must be 0 unless span_mode is incremental"),
            std::string::npos);
  q.span_mode = SpanMode::Incremental;
  EXPECT_NO_THROW(PackedCausalCache c(o, q));
  q.refine_bits = 5;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument)
                .find("refine_bits must be 2, 3 or 4, got 5"),
            std::string::npos);
  q.refine_bits = 4;
  q.refine_recent = -1;
  EXPECT_NE(error_of([&] { PackedCausalCache c(o, q); }, ErrorKind::InvalidArgument)
                .find("refine_recent must be in 0..1000000"),
            std::string::npos);
  q.refine_recent = 0;
  q.span_mode = SpanMode::Deferred;
  // Quantization off: the codec fields are not checked against head_dim.
  q = QuantArgs();
  o.head_dim = 8;
  EXPECT_NO_THROW(PackedCausalCache c(o, q));
}

TEST(CacheErrors, SetIndicesValidates) {
  DenseCausalCache c(ok_opts());
  const auto before = qvg::detail::debug_state(c);
  EXPECT_NE(error_of([&] { c.set_indices(5, 17); }, ErrorKind::InvalidArgument).find("local_end"), std::string::npos);
  EXPECT_NE(error_of([&] { c.set_indices(7, 5); }, ErrorKind::InvalidArgument).find("global_end"), std::string::npos);
  EXPECT_NE(error_of([&] { c.set_indices(3, 5); }, ErrorKind::InvalidArgument).find("global_end"), std::string::npos);
  EXPECT_EQ(qvg::detail::debug_state(c), before);
}
