// libFuzzer target: the cache API. The input bytes choose a configuration and then
// a sequence of calls — valid and invalid updates, resets, snapshot round trips — made
// on a dense and a packed cache. After every call it checks the contract of spec 5:
//   * the outcome (success or the error kind) is what the independent models of
//     tests/support/cache_model predict;
//   * a failing call leaves the cache exactly as it was (debug_state(), scratch and
//     byte counts included), and a twin cache that never saw the bad call stays equal
//     to it: the next valid call behaves as if the bad one never happened;
//   * a successful view equals the model: dense views and packed views without
//     quantization bit for bit, quantized packed views within the codec's bound;
//     packed segments and resident_nbytes() as the policy says.
// Invalid-argument calls (bad shapes, dtypes, head slices, negative rw, NaN values)
// must be InvalidArgument and change nothing.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "fuzz_support.h"
#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "support/cache_model.h"

namespace {

using namespace qvg;
using testing::Call;

Tensor make_tensor(FuzzedDataProvider& fdp, DType dt, Shape4 s) {
  Tensor t(dt, s);
  const uint8_t mode = fdp.ConsumeIntegralInRange<uint8_t>(0, 15);
  const float base = float(fdp.ConsumeIntegralInRange<int>(-64, 64)) * 0.25f;
  uint32_t st = fdp.ConsumeIntegral<uint32_t>() | 1u;
  for (int64_t i = 0; i < s.numel(); ++i) {
    st ^= st << 13, st ^= st >> 17, st ^= st << 5;
    store_f32(t.data(), dt, size_t(i), base + float(int32_t(st % 2001) - 1000) * 0.004f);
  }
  if (mode == 15 && s.numel() > 0) {  // one value the caches must refuse: NaN, Inf or |x| > 1e16
    const size_t i = size_t(st % uint32_t(s.numel()));
    if (dt == DType::F32) {
      const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 3e16f};
      static_cast<float*>(t.data())[i] = bad[st % 3];
    } else {  // bf16 / f16 NaN bit patterns
      static_cast<uint16_t*>(t.data())[i] = dt == DType::BF16 ? uint16_t(0x7fc0) : uint16_t(0x7e00);
    }
  }
  return t;
}

struct Setup {
  CacheOptions o;
  QuantArgs q;
  testing::ScenarioParams p;
};

Setup make_setup(FuzzedDataProvider& fdp) {
  Setup s;
  CacheOptions& o = s.o;
  o.batch = fdp.ConsumeIntegralInRange<int64_t>(1, 2);
  o.heads = fdp.ConsumeIntegralInRange<int64_t>(1, 3);
  o.head_dim = fdp.ConsumeBool() ? 8 : 16;
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  o.dtype = dts[fdp.ConsumeIntegralInRange<int>(0, 2)];
  o.cache_size = fdp.ConsumeIntegralInRange<int64_t>(1, 24);
  o.sink_tokens = fdp.ConsumeIntegralInRange<int64_t>(0, o.cache_size);
  if (fdp.ConsumeBool()) o.attention_window_size = fdp.ConsumeIntegralInRange<int64_t>(1, o.cache_size);
  if (fdp.ConsumeBool()) {
    QuantArgs& q = s.q;
    q.enable(fdp.ConsumeBool() ? 4 : 2);
    q.codec.block_size = 8;
    q.codec.centroids = fdp.ConsumeIntegralInRange<int>(1, 4);
    q.codec.stages = fdp.ConsumeIntegralInRange<int>(1, 2);
    q.codec.kmeans_iters = 1;
    q.codec.asymmetric = fdp.ConsumeBool();
    q.keep_recent_chunks = fdp.ConsumeIntegralInRange<int>(0, 2);
    q.sink = fdp.ConsumeBool();
    q.sink_span = fdp.ConsumeBool() ? SinkSpan::Full : SinkSpan::Chunk;
    q.sink_keep_chunks = fdp.ConsumeIntegralInRange<int>(0, 1);
    q.span_chunks = fdp.ConsumeIntegralInRange<int>(1, 3);
    if (fdp.ConsumeBool()) {  // incremental spans, with or without adaptive boundaries
      q.span_mode = SpanMode::Incremental;
      const double ratios[] = {0.0, 1.05, 1.5, 3.0};
      q.span_break_ratio = ratios[fdp.ConsumeIntegralInRange<int>(0, 3)];
      q.refine_recent = fdp.ConsumeIntegralInRange<int>(0, 2);  // refinement layers of the newest chunks
      q.refine_bits = fdp.ConsumeBool() ? 4 : 2;
    }
    q.codec.scaling = fdp.ConsumeBool() ? Scaling::Compat : Scaling::TwoLevel;
    q.codec.scale_dtype = fdp.ConsumeBool() ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
    const Init inits[] = {Init::Random, Init::KMeansPlusPlus, Init::Warm};
    q.codec.init = inits[fdp.ConsumeIntegralInRange<int>(0, 2)];
    q.codec.seed = fdp.ConsumeIntegral<uint16_t>();
  }
  s.q.codec.threads = 1;
  s.p.B = o.batch;
  s.p.H = o.heads;
  s.p.D = o.head_dim;
  s.p.dtype = o.dtype;
  return s;
}

// A call whose shapes, dtypes and head slice are valid (the models decide the rest).
Call shaped_call(FuzzedDataProvider& fdp, const Setup& s, int64_t global_end, std::optional<int64_t> current) {
  Call c;
  switch (fdp.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: c.c = global_end; break;
    case 2: c.c = current.value_or(global_end); break;
    case 3: c.c = std::max<int64_t>(0, global_end - fdp.ConsumeIntegralInRange<int64_t>(0, 12)); break;
    default: c.c = global_end + fdp.ConsumeIntegralInRange<int64_t>(1, 6); break;
  }
  const int64_t n = fdp.ConsumeIntegralInRange<int64_t>(1, s.o.cache_size + 2);
  const int64_t h = fdp.ConsumeIntegralInRange<int64_t>(1, s.o.heads);
  if (h < s.o.heads || fdp.ConsumeBool()) c.hs = fdp.ConsumeIntegralInRange<int64_t>(0, s.o.heads - h);
  if (fdp.ConsumeBool()) c.rw = fdp.ConsumeIntegralInRange<int64_t>(0, 10);
  c.k = make_tensor(fdp, s.o.dtype, {s.o.batch, n, h, s.o.head_dim});
  c.v = make_tensor(fdp, s.o.dtype, {s.o.batch, n, h, s.o.head_dim});
  return c;
}

// A call that is InvalidArgument whatever the cache's state.
Call invalid_call(FuzzedDataProvider& fdp, const Setup& s, int64_t global_end) {
  Call c;
  c.c = global_end;
  Shape4 ks{s.o.batch, 2, s.o.heads, s.o.head_dim}, vs = ks;
  DType kd = s.o.dtype, vd = s.o.dtype;
  switch (fdp.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: c.rw = -fdp.ConsumeIntegralInRange<int64_t>(1, 5); break;
    case 1: c.hs = s.o.heads - ks.h + fdp.ConsumeIntegralInRange<int64_t>(1, 3); break;
    case 2:
      ks.h = vs.h = s.o.heads > 1 ? s.o.heads - 1 : 1;
      if (ks.h == s.o.heads) c.hs = -1;  // one head: an out-of-range start instead
      break;                             // (a head slice without cache_head_start)
    case 3: ks.d = vs.d = s.o.head_dim * 2; break;
    case 4: ks.b = vs.b = s.o.batch + 1; break;
    case 5: vs.s = 3; break;
    case 6: kd = vd = s.o.dtype == DType::F32 ? DType::BF16 : DType::F32; break;
    default: ks.s = vs.s = 0; break;
  }
  c.k = Tensor(kd, ks);
  c.v = Tensor(vd, vs);
  return c;
}

template <class Cache>
auto state_of(const Cache& c) {
  return qvg::detail::debug_state(c);
}

// Runs `call` on `cache` expecting `want` (an error kind, or success). On an error the
// state must be exactly as before. Returns the outcome.
template <class Cache>
testing::Outcome checked_call(Cache& cache, const Call& call, std::optional<ErrorKind> want, const char* which) {
  const auto before = state_of(cache);
  testing::Outcome out = testing::run_call(cache, call);
  FUZZ_CHECK(out.error == want, "{}: c={} n={} h={} hs={} rw={}: expected {}, got {} ({})", which, call.c, call.n(),
             call.h_in(), call.hs ? *call.hs : -99, call.rw ? *call.rw : -99, want ? int(*want) : -1,
             out.error ? int(*out.error) : -1, out.message);
  if (out.error) FUZZ_CHECK(state_of(cache) == before, "{}: a failing call changed the state: {}", which, out.message);
  return out;
}

// The twin never saw a failing call: it must take `c` (which `out` says the cache
// accepted) alike.
template <class Cache>
void twin_call(Cache& twin, const Call& c, const testing::Outcome& out, const char* which) {
  const testing::Outcome t = testing::run_call(twin, c);
  FUZZ_CHECK(!t.error, "{} twin rejected a call the cache accepted: {}", which, t.message);
  FUZZ_CHECK(testing::compare_views(out.view, t.view).empty(), "{} twin view differs", which);
}

// Both through a snapshot: equal bytes before, the same bytes after a reload.
template <class Cache>
void twin_snapshot(Cache& cache, Cache& twin, const char* which, const SnapshotExpectation& x) {
  const std::vector<uint8_t> a = cache.snapshot_bytes(), b = twin.snapshot_bytes();
  FUZZ_CHECK(a == b, "{} cache and twin snapshots differ", which);
  cache = Cache::from_snapshot_bytes(a, x);
  twin = Cache::from_snapshot_bytes(b, x);
  FUZZ_CHECK(cache.snapshot_bytes() == a, "{} snapshot round trip differs", which);
}

// The cache and its twin hold the same state after a valid call.
template <class Cache>
void check_twin_state(const Cache& cache, const Cache& twin, const char* which) {
  FUZZ_CHECK(state_of(cache) == state_of(twin), "{} cache and twin differ after a valid call", which);
}

// A side (cache, twin, model) back to empty.
template <class Side>
void reset_side(Side& side) {
  side.cache.reset_indices();
  side.twin.reset_indices();
  side.model.reset();
}

// The model of the dense cache and its twin.
struct DenseSide {
  DenseCausalCache cache, twin;
  testing::DenseModel model;
  explicit DenseSide(const CacheOptions& o) : cache(o), twin(o), model(o) {}

  void call(const Call& c) {
    const auto want = model.check(c);
    const testing::Outcome out = checked_call(cache, c, want, "dense");
    if (out.error) return;
    twin_call(twin, c, out, "dense");
    const testing::ModelView mv = model.apply(c);
    const std::string diff = testing::compare_exact(out.view, mv);
    FUZZ_CHECK(diff.empty(), "dense view differs from the model: {}", diff);
    check_twin_state(cache, twin, "dense");
    FUZZ_CHECK(cache.resident_nbytes() == model.resident_nbytes(), "dense resident_nbytes");
  }
  void invalid(const Call& c) { checked_call(cache, c, ErrorKind::InvalidArgument, "dense (invalid argument)"); }
  void reset() { reset_side(*this); }
  void snapshot() { twin_snapshot(cache, twin, "dense", {}); }
};

struct PackedSide {
  CacheOptions o;
  PackedCausalCache cache, twin;
  testing::PackedModel model;
  testing::KVHistory hist;
  // Incremental spans: where a chunk starts a new span depends on the data (adaptive
  // boundaries); the model replays the cache's decisions and checks the rest.
  std::shared_ptr<std::deque<bool>> joins = std::make_shared<std::deque<bool>>();
  PackedSide(const CacheOptions& opt, const QuantArgs& q)
      : o(opt), cache(opt, q), twin(opt, q), model(opt, q), hist(opt.batch, opt.heads, opt.head_dim) {
    model.set_join_decision([j = joins] {
      if (j->empty()) return true;
      const bool join = j->front();
      j->pop_front();
      return join;
    });
  }

  void call(const Call& c) {
    const auto want = model.check(c);
    std::set<int64_t> packed_before;
    for (size_t i = 0; i < cache.num_segments(); ++i)
      if (cache.segment(i).packed) packed_before.insert(cache.segment(i).g0);
    const testing::Outcome out = checked_call(cache, c, want, "packed");
    if (out.error) return;
    joins->clear();
    for (size_t i = 0; i < cache.num_segments(); ++i) {
      const auto sg = cache.segment(i);
      if (sg.span < 0 || packed_before.count(sg.g0)) continue;
      joins->push_back(i > 0 && cache.segment(i - 1).span == sg.span);
    }
    twin_call(twin, c, out, "packed");
    const testing::PackedModel::Result r = model.apply(c);
    hist.write(c);
    FUZZ_CHECK(out.view.local_start_index == r.local_start && out.view.local_end_index == r.local_end &&
                   out.view.visible_local_end == r.visible_local_end &&
                   out.view.visible_global_end == r.visible_global_end,
               "packed view indices differ from the model");
    if (!cache.quant_args().enabled()) {
      testing::ModelView mv = hist.view(r.positions, c.head0(), c.h_in());
      mv.local_start = r.local_start;
      mv.local_end = r.local_end;
      mv.visible_local_end = r.visible_local_end;
      mv.visible_global_end = r.visible_global_end;
      const std::string diff = testing::compare_exact(out.view, mv);
      FUZZ_CHECK(diff.empty(), "packed view differs from the model: {}", diff);
    } else {
      const std::string diff = testing::check_packed_view(cache, out.view, r.positions, hist, c.head0());
      FUZZ_CHECK(diff.empty(), "quantized packed view outside the codec bound: {}", diff);
    }
    const std::string segs = testing::compare_segments(cache, model.segments());
    FUZZ_CHECK(segs.empty(), "packed segments differ from the model: {}", segs);
    FUZZ_CHECK(cache.resident_nbytes() == model.expected_resident(o.dtype), "packed resident_nbytes");
    check_twin_state(cache, twin, "packed");
  }
  void invalid(const Call& c) { checked_call(cache, c, ErrorKind::InvalidArgument, "packed (invalid argument)"); }
  void reset() {
    reset_side(*this);
    hist.clear();
  }
  void snapshot() {
    SnapshotExpectation x;
    x.threads = 1;
    twin_snapshot(cache, twin, "packed", x);
  }
  std::optional<int64_t> current() const {
    const size_t n = cache.num_segments();
    return n ? std::optional<int64_t>(cache.segment(n - 1).g0) : std::nullopt;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const Setup s = make_setup(fdp);
  CacheOptions dense_opts = s.o;
  dense_opts.allow_growth = fdp.ConsumeBool();
  if (dense_opts.allow_growth) dense_opts.attention_window_size.reset();
  DenseSide dense(dense_opts);
  PackedSide packed(s.o, s.q);
  for (int step = 0; step < 48 && fdp.remaining_bytes() > 0; ++step) {
    switch (fdp.ConsumeIntegralInRange<int>(0, 15)) {
      case 12: {
        const Call c = invalid_call(fdp, s, packed.cache.global_end());
        dense.invalid(c);
        packed.invalid(c);
        break;
      }
      case 13:
        dense.reset();
        packed.reset();
        break;
      case 14:
        dense.snapshot();
        packed.snapshot();
        break;
      case 15: {  // the other kind, or another configuration, is refused
        bool refused = false;
        try {
          (void)PackedCausalCache::from_snapshot_bytes(dense.cache.snapshot_bytes());
        } catch (const InvalidArgument&) {
          refused = true;
        }
        FUZZ_CHECK(refused, "a dense snapshot loaded as a packed cache");
        SnapshotExpectation x;
        x.options = s.o;
        x.options->heads += 1;
        refused = false;
        try {
          (void)PackedCausalCache::from_snapshot_bytes(packed.cache.snapshot_bytes(), x);
        } catch (const InvalidArgument& e) {
          refused = std::string(e.what()).find("num_heads") != std::string::npos;
        }
        FUZZ_CHECK(refused, "a snapshot of another configuration was not refused naming num_heads");
        break;
      }
      default: {
        const Call d = shaped_call(fdp, s, dense.cache.global_end(), std::nullopt);
        dense.call(d);
        const Call p = shaped_call(fdp, s, packed.cache.global_end(), packed.current());
        packed.call(p);
        break;
      }
    }
  }
  return 0;
}
