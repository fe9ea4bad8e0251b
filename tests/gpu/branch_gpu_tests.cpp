// Branches on a GPU (issue 38; qvg/cuda_cache.h, fork()): part of qvg_gpu_tests, named
// part2_branches_* (scripts/gpu-check runs them in its optional second part,
// `qvg_gpu_tests part2_`, and the verdict run excludes them). The host logic of the same
// calls runs on every machine in qvg_cuda_calls_test (the fake runtime).
//
// - The device packed cache (recommended profile: incremental spans, refinement layers)
//   forked at a full window: each branch, continued its own way, returns views equal bit
//   for bit to a device cache that replayed the branch's whole history (the device
//   encoder is deterministic: spec 1.1's order-independent sums), and the accounting
//   shows the shared history; dropping the source leaves the fork unchanged.
// - The device dense cache: a fork equals a replay; its snapshot is the CPU dense cache's
//   bytes for the same history and loads back into device storage.
#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "gpu/device_support.h"
#include "gpu/harness.h"
#include "qvg/cache.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"

namespace {

using qvg::cuda::DeviceBuffer;
using qvg::testing::gpu::TestStream;
using qvg::testing::gpu::to_device;
using qvg::testing::gpu::view_to_host;

constexpr int64_t kChunk = 64;

/// One chunk's K and V on the device (and on the host, for the CPU cache).
struct DevChunk {
  qvg::Tensor k, v;
  DeviceBuffer dk, dv;
  DevChunk(const qvg::CacheOptions& o, uint32_t seed, cudaStream_t s)
      : k(qvg::DType::BF16, {o.batch, kChunk, o.heads, o.head_dim}),
        v(qvg::DType::BF16, {o.batch, kChunk, o.heads, o.head_dim}) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (qvg::Tensor* t : {&k, &v})
      for (int64_t i = 0; i < kChunk; ++i)
        for (int64_t h = 0; h < o.heads; ++h)
          for (int64_t d = 0; d < o.head_dim; ++d) t->set(0, i, h, d, 2.0f * nd(rng));
    dk = to_device(k, s);
    dv = to_device(v, s);
  }
  qvg::ConstTensorView key() const { return {dk.data(), qvg::DType::BF16, k.shape()}; }
  qvg::ConstTensorView value() const { return {dv.data(), qvg::DType::BF16, v.shape()}; }
};

qvg::CacheOptions options() {
  qvg::CacheOptions o;
  o.batch = 1;
  o.heads = 4;
  o.head_dim = 128;
  o.cache_size = 8 * kChunk;
  o.sink_tokens = kChunk;
  o.dtype = qvg::DType::BF16;
  return o;
}

/// A call: chunk index, chunk data seed.
struct Call {
  int64_t chunk;
  uint32_t seed;
};

template <class Cache>
std::vector<uint8_t> apply(Cache& c, const qvg::CacheOptions& o, const Call& x, cudaStream_t s) {
  const DevChunk ch(o, x.seed, s);
  const qvg::KVView w = c.update(ch.key(), ch.value(), x.chunk * kChunk, s);
  std::vector<uint8_t> out = view_to_host(w.k, s), v = view_to_host(w.v, s);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

}  // namespace

QVG_TEST(part2_branches_device_packed_forks_equal_their_replays) {
  TestStream st;
  const qvg::CacheOptions o = options();
  qvg::QuantArgs q =
      qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", "recommended"}});
  std::vector<Call> history;
  for (int64_t c = 0; c < 10; ++c)
    for (uint32_t step = 0; step < 2; ++step) history.push_back({c, uint32_t(100 * c + step)});
  std::optional<qvg::cuda::PackedCausalCache> src(std::in_place, o, q);
  for (const Call& x : history) (void)apply(*src, o, x, st.s);
  const size_t whole = src->resident_nbytes();
  qvg::cuda::PackedCausalCache f = src->fork(st.s);
  QVG_EXPECT(src->shared_nbytes() > 0 && src->shared_nbytes() == f.shared_nbytes());
  QVG_EXPECT(f.resident_nbytes() + f.shared_nbytes() == whole);
  QVG_EXPECT(f.snapshot_bytes(st.s) == src->snapshot_bytes(st.s));
  // Two continuations: a denoising step of the current chunk, then 3 new chunks each.
  for (int b = 0; b < 2; ++b) {
    qvg::cuda::PackedCausalCache& c = b == 0 ? *src : f;
    std::vector<Call> h = history;
    qvg::cuda::PackedCausalCache replay(o, q);
    for (const Call& x : history) (void)apply(replay, o, x, st.s);
    for (int64_t k = 0; k < 4; ++k) {
      const Call x{9 + k, uint32_t(5000 + 100 * b + k)};
      const std::vector<uint8_t> got = apply(c, o, x, st.s), want = apply(replay, o, x, st.s);
      QVG_EXPECT(got == want) << "branch" << b << "call" << k << "view differs from the replay's";
    }
    QVG_EXPECT(c.resident_nbytes() + c.shared_nbytes() == replay.resident_nbytes()) << "branch" << b;
    QVG_EXPECT(c.snapshot_bytes(st.s) == replay.snapshot_bytes(st.s)) << "branch" << b;
  }
  // The source dropped: the fork is unchanged and holds everything alone.
  const std::vector<uint8_t> before = f.snapshot_bytes(st.s);
  src.reset();
  QVG_EXPECT(f.snapshot_bytes(st.s) == before);
  QVG_EXPECT(f.shared_nbytes() == 0);
}

QVG_TEST(part2_branches_device_dense_fork_and_snapshot) {
  TestStream st;
  const qvg::CacheOptions o = options();
  std::vector<std::unique_ptr<DeviceBuffer>> storage;
  const auto supply = [&](int64_t cs) {
    const size_t bytes = size_t(o.batch * cs * o.heads * o.head_dim) * 2;
    storage.push_back(std::make_unique<DeviceBuffer>(2 * bytes, st.s));
    QVG_GPU_CHECK(cudaMemsetAsync(storage.back()->data(), 0, 2 * bytes, st.s));
    auto* p = static_cast<std::byte*>(storage.back()->data());
    return qvg::DenseCausalCache::ExternalStorage{p, p + bytes};
  };
  const qvg::DenseCausalCache::ExternalStorage s0 = supply(o.cache_size);
  qvg::cuda::DenseCausalCache dev(o, s0);
  qvg::DenseCausalCache cpu(o);
  for (int64_t c = 0; c < 10; ++c) {  // past the buffer: evictions and rolls
    const DevChunk ch(o, uint32_t(7 * c + 1), st.s);
    (void)dev.update(ch.key(), ch.value(), c * kChunk, st.s);
    (void)cpu.update(ch.k.view(), ch.v.view(), c * kChunk);
  }
  QVG_EXPECT(dev.snapshot_bytes(st.s) == cpu.snapshot_bytes()) << "the CPU dense cache's bytes";
  qvg::cuda::DenseCausalCache f = dev.fork(supply, st.s);
  qvg::cuda::DenseCausalCache back =
      qvg::cuda::DenseCausalCache::from_snapshot_bytes(cpu.snapshot_bytes(), {}, supply, st.s);
  for (int64_t c = 10; c < 13; ++c) {
    const DevChunk ch(o, uint32_t(7 * c + 1), st.s);
    const std::vector<uint8_t> want =
        qvg::testing::gpu::host_view_bytes(cpu.update(ch.k.view(), ch.v.view(), c * kChunk).k);
    for (qvg::cuda::DenseCausalCache* x : {&dev, &f, &back}) {
      const qvg::KVView w = x->update(ch.key(), ch.value(), c * kChunk, st.s);
      QVG_EXPECT(view_to_host(w.k, st.s) == want) << "chunk" << c;
    }
  }
  QVG_EXPECT(f.snapshot_bytes(st.s) == cpu.snapshot_bytes() && back.snapshot_bytes(st.s) == cpu.snapshot_bytes());
}
