// GPU tests of the device caches' update() without waiting (docs/cuda.md, "update()
// does not wait"; run in gpu-check's verdict, in qvg_gpu_tests) —
//   * the deferred input check: a step whose value holds a NaN returns normally, its
//     rows are never stored (the cache's snapshot is the one before the bad call), the
//     next call raises the CPU's InvalidArgument naming the bad call's chunk and element
//     and changes nothing, and check() is clean after; a bad advance's chunk holds zeros;
//   * CUDA graph capture: a denoising step's update() captured on a stream, the graph
//     launched, gives the bytes of the same update() run directly on a twin cache,
//     for the packed (recommended profile, refined chunks) and the dense cache.
// The host half of both (no synchronizing call, the message) is tested without a GPU
// by tests/gpu/device_calls_test.cpp.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/call_kind.h"
#include "gpu/device_support.h"
#include "gpu/harness.h"
#include "kernels/cuda/cuda_kernels.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

namespace {

using qvg::testing::gpu::TestStream;
using qvg::testing::gpu::to_host;
using qvg::testing::gpu::view_to_host;
using Kind = qvg::testing::CallKind;

constexpr int64_t kN = 96, kH = 4, kD = 64;
const qvg::Shape4 kChunk{1, kN, kH, kD};

qvg::CacheOptions options() {
  qvg::CacheOptions o;  // batch 1, bf16 (the defaults)
  std::tie(o.heads, o.head_dim, o.sink_tokens, o.cache_size) = std::tuple{kH, kD, kN, 6 * kN};
  return o;
}
qvg::QuantArgs recommended() {
  qvg::QuantArgs q =
      qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", "recommended"}});
  q.codec.centroids = 16;
  return q;
}

/// K then V of one chunk in one device buffer, filled by the clustered test fill.
struct DeviceChunk {
  qvg::cuda::DeviceBuffer kv;
  qvg::ConstTensorView k, v;
  DeviceChunk(uint64_t seed, cudaStream_t s) : kv(size_t(2 * kChunk.numel()) * 2, s) {
    qvg::cuda::kernels::fill_clustered(kv.data(), 0, 1, 2 * kN, kH, kD, seed, 1.0f, s);
    const auto* base = static_cast<const uint8_t*>(kv.data());
    k = {base, qvg::DType::BF16, kChunk};
    v = {base + size_t(kChunk.numel()) * 2, qvg::DType::BF16, kChunk};
  }
  /// Element e of V (bf16) set to `bits` (e.g. a NaN), synchronously.
  void poison_value(size_t e, uint16_t bits, cudaStream_t s) {
    QVG_GPU_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(kv.data()) + size_t(kChunk.numel()) * 2 + 2 * e, &bits, 2,
                                  cudaMemcpyHostToDevice, s));
    QVG_GPU_CHECK(cudaStreamSynchronize(s));
  }
};

QVG_TEST(deferred_check_bad_input_is_never_stored_and_raised_by_the_next_call) {
  TestStream st;
  qvg::cuda::PackedCausalCache cache(options(), recommended());
  for (int c = 0; c < 4; ++c) {
    DeviceChunk ch(10 + uint64_t(c), st.s);
    (void)cache.update(ch.k, ch.v, c * kN, st.s);
    (void)cache.update(ch.k, ch.v, c * kN, st.s);
  }
  const int64_t cur = 3 * kN;
  const std::vector<uint8_t> before = cache.snapshot_bytes(st.s);
  DeviceChunk bad(77, st.s);
  const size_t e = size_t((5 * kH + 2) * kD + 9);  // [0, 5, 2, 9]
  bad.poison_value(e, 0x7FC0, st.s);               // a NaN
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(bad.k, bad.v, cur, st.s); }) == Kind::Ok);
  QVG_EXPECT(cache.snapshot_bytes(st.s) == before) << "the bad step's rows were stored";
  DeviceChunk good(78, st.s);
  std::string msg;
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(good.k, good.v, cur, st.s); }, &msg) ==
             Kind::InvalidArgument)
      << msg;
  QVG_EXPECT(msg.find("value must hold finite values with |x| <= 1e16, got nan at [0, 5, 2, 9]") != std::string::npos &&
             msg.find("chunk [288, 384)") != std::string::npos)
      << msg;
  QVG_EXPECT(cache.snapshot_bytes(st.s) == before) << "the reporting call changed the cache";
  QVG_EXPECT(qvg::testing::call_kind([&] { cache.check(st.s); }) == Kind::Ok);
  // A bad advance: its chunk's rows are zeros; check() reports it at once.
  bad.poison_value(e, 0x7F80, st.s);  // +inf
  (void)cache.update(bad.k, bad.v, 4 * kN, st.s);
  QVG_EXPECT(qvg::testing::call_kind([&] { cache.check(st.s); }, &msg) == Kind::InvalidArgument) << msg;
  QVG_EXPECT(msg.find("got inf at [0, 5, 2, 9]") != std::string::npos &&
             msg.find("chunk [384, 480)") != std::string::npos)
      << msg;
  const auto seg = cache.segment(cache.num_segments() - 1);
  const std::vector<uint16_t> k = to_host<uint16_t>(seg.k_raw.data, size_t(kChunk.numel()), st.s);
  bool zeros = true;
  for (uint16_t x : k) zeros = zeros && x == 0;
  QVG_EXPECT(zeros && seg.g0 == 4 * kN) << "the bad advance's chunk is not zeros";
}

QVG_TEST(graph_captured_step_equals_the_direct_step) {
  TestStream st;
  qvg::cuda::PackedCausalCache direct(options(), recommended()), captured(options(), recommended());
  std::vector<DeviceChunk> chunks;
  for (int c = 0; c < 5; ++c) chunks.emplace_back(200 + uint64_t(c), st.s);
  for (int c = 0; c < 5; ++c)
    for (auto* cache : {&direct, &captured}) {
      (void)cache->update(chunks[size_t(c)].k, chunks[size_t(c)].v, c * kN, st.s);
      (void)cache->update(chunks[size_t(c)].k, chunks[size_t(c)].v, c * kN, st.s);  // the view buffer in place
    }
  bool refined = false;
  for (size_t i = 0; i < captured.num_segments(); ++i) refined = refined || captured.segment(i).k_ref != nullptr;
  QVG_EXPECT(refined) << "no refined chunk in the window";
  DeviceChunk step(300, st.s);
  const int64_t cur = 4 * kN;
  const qvg::KVView want = direct.update(step.k, step.v, cur, st.s);
  cudaGraph_t graph = nullptr;
  QVG_GPU_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  qvg::KVView got;
  const Kind k = qvg::testing::call_kind([&] { got = captured.update(step.k, step.v, cur, st.s); });
  QVG_GPU_CHECK(cudaStreamEndCapture(st.s, &graph));
  QVG_EXPECT(k == Kind::Ok) << "update() failed under capture";
  cudaGraphExec_t exec = nullptr;
  QVG_GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int launch = 0; launch < 2; ++launch) {  // a replay gives the same bytes again
    QVG_GPU_CHECK(cudaGraphLaunch(exec, st.s));
    QVG_EXPECT(view_to_host(got.k, st.s) == view_to_host(want.k, st.s) &&
               view_to_host(got.v, st.s) == view_to_host(want.v, st.s))
        << "launch" << launch;
  }
  QVG_GPU_CHECK(cudaGraphExecDestroy(exec));
  QVG_GPU_CHECK(cudaGraphDestroy(graph));
  QVG_EXPECT(qvg::testing::call_kind([&] { captured.check(st.s); }) == Kind::Ok);
  QVG_EXPECT(captured.snapshot_bytes(st.s) == direct.snapshot_bytes(st.s));
}

QVG_TEST(graph_captured_dense_step_equals_the_direct_step) {
  TestStream st;
  const qvg::CacheOptions o = options();
  const size_t buf = size_t(o.cache_size * kH * kD) * 2;
  qvg::cuda::DeviceBuffer k1(buf, st.s), v1(buf, st.s), k2(buf, st.s), v2(buf, st.s);
  for (void* p : {k1.data(), v1.data(), k2.data(), v2.data()}) QVG_GPU_CHECK(cudaMemsetAsync(p, 0, buf, st.s));
  qvg::cuda::DenseCausalCache direct(o, {k1.data(), v1.data()}), captured(o, {k2.data(), v2.data()});
  std::vector<DeviceChunk> chunks;
  for (int c = 0; c < 4; ++c) chunks.emplace_back(400 + uint64_t(c), st.s);
  for (int c = 0; c < 4; ++c)
    for (auto* cache : {&direct, &captured})
      (void)cache->update(chunks[size_t(c)].k, chunks[size_t(c)].v, c * kN, st.s);
  DeviceChunk step(500, st.s);
  const qvg::KVView want = direct.update(step.k, step.v, 3 * kN, st.s);
  cudaGraph_t graph = nullptr;
  QVG_GPU_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  qvg::KVView got;
  const Kind k = qvg::testing::call_kind([&] { got = captured.update(step.k, step.v, 3 * kN, st.s); });
  QVG_GPU_CHECK(cudaStreamEndCapture(st.s, &graph));
  QVG_EXPECT(k == Kind::Ok) << "update() failed under capture";
  cudaGraphExec_t exec = nullptr;
  QVG_GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  QVG_GPU_CHECK(cudaGraphLaunch(exec, st.s));
  QVG_EXPECT(view_to_host(got.k, st.s) == view_to_host(want.k, st.s) &&
             view_to_host(got.v, st.s) == view_to_host(want.v, st.s));
  QVG_GPU_CHECK(cudaGraphExecDestroy(exec));
  QVG_GPU_CHECK(cudaGraphDestroy(graph));
}

}  // namespace
