// Host test of the device caches' runtime calls (update() never waits, docs/cuda.md; no
// GPU needed): this executable defines, itself, every CUDA runtime function the CUDA
// library calls (a recording fake over host memory; the linker resolves the library's
// references to these definitions before libcudart's), so the caches' host code runs on
// a GPU-less machine — kernels are recorded, not run — and every runtime call an
// update() makes is listed. It checks:
//   * update() on the packed cache (engine default and recommended profile, refined
//     chunks, incremental spans) and on the dense cache makes no synchronizing call,
//     no copy to or from host memory and no non-stream-ordered allocation once the
//     cache is built, and runs while its stream "captures" a CUDA graph, freeing
//     nothing allocated before the capture;
//   * what a graph cannot hold refuses a capture before any change: the settings that
//     must wait (span_break_ratio > 0), an advance to a new chunk and a view of another
//     size (both would free older buffers), a dense cache's growth;
//   * the deferred input check's host half: a bad call the device publishes into the
//     pinned ring (written here as the publish kernel would) is raised by the next
//     call — the CPU cache's message, naming the bad call's chunk — which changes
//     nothing; once; check() synchronizes the stream and raises.
// What it cannot check is the device's arithmetic: the kernels' bodies are tested on
// the host by host_arith_test.cpp and on a GPU by gpu_tests.cpp.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/call_kind.h"
#include "gpu/harness.h"
#include "kernels/cuda/guard_bodies.cuh"
#include "qvg/cache.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

// ---- the recording fake runtime --------------------------------------------------------

namespace fake {

/// The calls made since the last clear(), by name (a copy's kind as a suffix).
std::vector<std::string>& calls() {
  static std::vector<std::string> c;
  return c;
}
bool& capturing() {
  static bool c = false;
  return c;
}
/// The last pinned allocation (the input guard's ring).
void*& last_host_alloc() {
  static void* p = nullptr;
  return p;
}
std::map<const void*, std::string>& kernel_names() {
  static std::map<const void*, std::string> m;
  return m;
}
void record(std::string s) {
  calls().push_back(std::move(s));
}
const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "HtoH";
    case cudaMemcpyHostToDevice: return "HtoD";
    case cudaMemcpyDeviceToHost: return "DtoH";
    case cudaMemcpyDeviceToDevice: return "DtoD";
    default: return "Default";
  }
}
/// What the next pool allocations fail with (cudaSuccess: they succeed).
cudaError_t& pool_error() {
  static cudaError_t e = cudaSuccess;
  return e;
}
/// The allocations made while "capturing" (a graph's own, which it may free).
std::set<const void*>& graph_allocations() {
  static std::set<const void*> s;
  return s;
}
void* alloc(size_t n) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(n, 1) + 255) / 256 * 256);
  if (capturing()) graph_allocations().insert(p);
  return p;
}
struct LaunchConfig {
  dim3 grid, block;
  size_t shared = 0;
  cudaStream_t stream = nullptr;
};
LaunchConfig& pending_launch() {
  static thread_local LaunchConfig c;
  return c;
}

}  // namespace fake

extern "C" {
// Kernel registration and launch (nvcc's generated host code).
void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char* hostFun, char*, const char* deviceName, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {
  fake::kernel_names()[hostFun] = deviceName;
}
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream) {
  fake::pending_launch() = {grid, block, shared, stream};
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  const fake::LaunchConfig& c = fake::pending_launch();
  *grid = c.grid;
  *block = c.block;
  *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* k, const void* fun) {
  *k = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fun));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3, dim3, void**, size_t, cudaStream_t) {
  const auto it = fake::kernel_names().find(reinterpret_cast<const void*>(k));
  fake::record("launch " + (it == fake::kernel_names().end() ? std::string("?") : it->second));
  return cudaSuccess;
}

// Devices, errors.
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrMultiProcessorCount            ? 132
       : a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 232448  // an H100's
                                                      : 1;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int, size_t, unsigned) {
  *n = 2;  // a host computation on a real device too (no stream work)
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t) {
  return "cudaErrorFake";
}
const char* cudaGetErrorString(cudaError_t) {
  return "fake runtime";
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void*) {
  std::memset(a, 0, sizeof *a);
  a->type = cudaMemoryTypeDevice;
  return cudaSuccess;
}

// Memory.
cudaError_t cudaMemPoolCreate(cudaMemPool_t* p, const cudaMemPoolProps*) {
  static int pool = 0;
  *p = reinterpret_cast<cudaMemPool_t>(&pool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) {
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t) {
  return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t, cudaStream_t) {
  fake::record("cudaMallocFromPoolAsync");
  if (fake::pool_error() != cudaSuccess) return fake::pool_error();
  *p = fake::alloc(n);
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  // Inside a capture only the graph's own allocations may be freed (cudaFreeAsync's
  // contract; a caching allocator would reuse an older buffer the graph still reads).
  const bool own = fake::graph_allocations().erase(p) != 0;
  fake::record(fake::capturing() && !own ? "cudaFreeAsync of memory allocated before the capture" : "cudaFreeAsync");
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  fake::record("cudaMalloc");
  *p = fake::alloc(n);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  fake::record("cudaFree");
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
  fake::record("cudaHostAlloc");
  *p = fake::last_host_alloc() = fake::alloc(n);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  fake::record("cudaFreeHost");
  std::free(p);
  return cudaSuccess;
}

// Copies, streams.
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  fake::record(std::string("cudaMemcpy ") + fake::kind_name(k));
  std::memcpy(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t) {
  fake::record(std::string("cudaMemcpyAsync ") + fake::kind_name(k));
  std::memcpy(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                              cudaStream_t) {
  fake::record(std::string("cudaMemcpy2DAsync ") + fake::kind_name(k));
  for (size_t r = 0; r < h; ++r) std::memcpy(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  fake::record("cudaMemsetAsync");
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  fake::record("cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* st) {
  *st = fake::capturing() ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
}  // extern "C"

// ---- the tests ----------------------------------------------------------------------

namespace {

using Kind = qvg::testing::CallKind;

/// What no update() may call once its cache is built: waits, copies to or from host
/// memory (a captured copy from pageable memory would read it at replay),
/// allocations that are not stream-ordered, and (under a capture) frees of memory
/// allocated before the capture.
bool forbidden(const std::string& c) {
  return c == "cudaStreamSynchronize" || c.rfind("cudaMemcpy ", 0) == 0 || c.find("HtoD") != std::string::npos ||
         c.find("DtoH") != std::string::npos || c.find("HtoH") != std::string::npos ||
         c.find("Default") != std::string::npos || c == "cudaMalloc" || c == "cudaFree" || c == "cudaHostAlloc" ||
         c == "cudaFreeHost" || c.find("before the capture") != std::string::npos;
}

/// The calls of f(), and the first forbidden one (empty when none).
template <class F>
std::string first_forbidden(F&& f, int* launches = nullptr) {
  fake::calls().clear();
  f();
  int n = 0;
  std::string bad;
  for (const std::string& c : fake::calls()) {
    n += c.rfind("launch ", 0) == 0;
    if (bad.empty() && forbidden(c)) bad = c;
  }
  if (launches) *launches = n;
  return bad;
}

/// Host buffers standing for device tensors (the fake runtime's "device memory").
struct Chunk {
  std::vector<uint16_t> k, v;
  qvg::ConstTensorView key, value;
  Chunk(qvg::Shape4 s, uint32_t seed) : k(size_t(s.numel())), v(size_t(s.numel())) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto* buf : {&k, &v})
      for (uint16_t& x : *buf) {
        const float f = nd(rng);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        x = uint16_t(u >> 16);
      }
    key = {k.data(), qvg::DType::BF16, s};
    value = {v.data(), qvg::DType::BF16, s};
  }
};

qvg::CacheOptions options() {
  qvg::CacheOptions o;
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 64;
  o.cache_size = 8 * 32;
  o.sink_tokens = 32;
  o.dtype = qvg::DType::BF16;
  return o;
}
constexpr int64_t kChunk = 32;
const qvg::cuda::Stream kStream = reinterpret_cast<qvg::cuda::Stream>(0x1);

/// The recommended profile at int2 with 8 centroids (small encodes on the fake runtime).
qvg::QuantArgs recommended_int2() {
  qvg::QuantArgs q =
      qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", "recommended"}});
  q.codec.centroids = 8;
  return q;
}
/// `chunks` advances of `cache` from position 0, chunk c seeded seed + c.
void feed(qvg::cuda::PackedCausalCache& cache, int chunks, uint32_t seed) {
  for (int c = 0; c < chunks; ++c) {
    const Chunk ch({1, kChunk, 2, 64}, seed + uint32_t(c));
    (void)cache.update(ch.key, ch.value, c * kChunk, kStream);
  }
}

QVG_TEST(packed_update_never_waits_and_runs_under_capture) {
  for (const char* profile : {"reference", "recommended"}) {
    qvg::QuantArgs q = qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", profile}});
    q.codec.centroids = 8;
    qvg::cuda::PackedCausalCache cache(options(), q);
    int updates = 0, launches_total = 0;
    for (int c = 0; c < 12; ++c) {
      const Chunk ch({1, kChunk, 2, 64}, uint32_t(100 + c));
      for (int step = 0; step < 3; ++step) {
        fake::capturing() = c >= 6 && step == 1;  // some calls inside a "capture"
        int launches = 0;
        const std::string bad =
            first_forbidden([&] { (void)cache.update(ch.key, ch.value, c * kChunk, kStream); }, &launches);
        if (c > 0 || step > 0) {  // the first update builds the cache (its pinned ring)
          QVG_EXPECT(bad.empty()) << profile << "chunk" << c << "step" << step << "called" << bad;
          ++updates;
        }
        launches_total += launches;
      }
    }
    fake::capturing() = false;
    QVG_EXPECT(cache.global_end() == 12 * kChunk) << cache.global_end();
    // The state is the policy's: encoded spans (and, recommended, refined chunks).
    bool packed = false, refined = false;
    for (size_t i = 0; i < cache.num_segments(); ++i) {
      packed = packed || cache.segment(i).packed;
      refined = refined || cache.segment(i).k_ref != nullptr;
    }
    QVG_EXPECT(packed) << profile;
    QVG_EXPECT(refined == (std::string(profile) == "recommended")) << profile;
    QVG_EXPECT(launches_total > 3 * updates) << profile << launches_total;  // the work was enqueued
    std::printf("  %s: %d updates, %d kernel launches, no waiting call\n", profile, updates, launches_total);
  }
}

QVG_TEST(the_first_update_refuses_a_capture_before_any_change) {
  qvg::QuantArgs q = qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}});
  q.codec.centroids = 8;
  qvg::cuda::PackedCausalCache cache(options(), q);
  const Chunk ch({1, kChunk, 2, 64}, 7);
  fake::capturing() = true;
  std::string msg;
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(ch.key, ch.value, 0, kStream); }, &msg) ==
             Kind::Unsupported)
      << msg;
  fake::capturing() = false;
  QVG_EXPECT(msg.find("before capturing") != std::string::npos) << msg;
  QVG_EXPECT(cache.global_end() == 0 && cache.num_segments() == 0);
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(ch.key, ch.value, 0, kStream); }) == Kind::Ok);
}

QVG_TEST(adaptive_span_breaks_refuse_a_capture_before_any_change) {
  qvg::QuantArgs q = recommended_int2();
  q.span_break_ratio = 1.5;
  qvg::cuda::PackedCausalCache cache(options(), q);
  feed(cache, 6, 300);
  const Chunk next({1, kChunk, 2, 64}, 399);
  const int64_t end = cache.global_end();
  const size_t segs = cache.num_segments();
  fake::capturing() = true;
  std::string msg;
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(next.key, next.value, end, kStream); }, &msg) ==
             Kind::Unsupported)
      << msg;
  fake::capturing() = false;
  // Refused as every captured advance is (it would free older chunks), before the energies' read.
  QVG_EXPECT(msg.find("advance the cache") != std::string::npos) << msg;
  QVG_EXPECT(cache.global_end() == end && cache.num_segments() == segs);
  // Outside a capture the same call waits once per encoded chunk (as documented) and succeeds.
  fake::calls().clear();
  (void)cache.update(next.key, next.value, end, kStream);
  int syncs = 0;
  for (const std::string& c : fake::calls()) syncs += c == "cudaStreamSynchronize";
  QVG_EXPECT(syncs >= 1 && cache.global_end() == end + kChunk) << syncs;
}

// What would free buffers allocated before a capture refuses it, changing nothing and
// enqueuing nothing: the packed cache's advance to a new chunk (it packs or evicts
// older chunks), a step whose view has another size than the last call's (the view
// buffer replaced), and the dense cache's growth (the caller drops its old storage;
// the dense view's resizing is refused by the same rule, not exercised here). Outside the
// capture the same calls succeed; a captured step of the same size frees nothing
// older (the fake's cudaFreeAsync check, packed_update_never_waits_and_runs_under_capture).
QVG_TEST(a_capture_that_would_free_older_buffers_refuses_before_any_change) {
  qvg::cuda::PackedCausalCache cache(options(), recommended_int2());
  feed(cache, 7, 800);
  const Chunk next({1, kChunk, 2, 64}, 899);
  const auto refused = [&](auto&& call, const char* what, const char* why) {
    fake::calls().clear();
    fake::capturing() = true;
    std::string msg;
    const Kind k = qvg::testing::call_kind(call, &msg);
    fake::capturing() = false;
    int work = 0;
    for (const std::string& c : fake::calls()) work += c != "cudaStreamIsCapturing";
    QVG_EXPECT(k == Kind::Unsupported && msg.find(why) != std::string::npos && work == 0)
        << what << msg << "calls" << work;
  };
  int64_t end = cache.global_end();
  size_t segs = cache.num_segments();
  refused([&] { (void)cache.update(next.key, next.value, end, kStream); }, "packed advance", "advance the cache");
  QVG_EXPECT(cache.global_end() == end && cache.num_segments() == segs);
  (void)cache.update(next.key, next.value, end, kStream);  // outside: it advances
  QVG_EXPECT(cache.global_end() == end + kChunk);
  end = cache.global_end();
  segs = cache.num_segments();
  // A step of the same chunk with a shorter view (recent_window_tokens): another view size.
  refused([&] { (void)cache.update(next.key, next.value, end - kChunk, kStream, std::nullopt, 2 * kChunk); },
          "packed view resize", "change the size of the view");
  QVG_EXPECT(cache.global_end() == end && cache.num_segments() == segs);
  QVG_EXPECT(qvg::testing::call_kind([&] {
               (void)cache.update(next.key, next.value, end - kChunk, kStream, std::nullopt, 2 * kChunk);
             }) == Kind::Ok);

  // The dense cache: growth (its old storage is dropped by the caller) and a view resize.
  qvg::CacheOptions o = options();
  o.allow_growth = true;
  o.cache_size = 4 * kChunk;
  const size_t row = size_t(o.heads * o.head_dim);
  std::vector<std::vector<uint16_t>> store;
  store.emplace_back(size_t(o.cache_size) * row);
  store.emplace_back(size_t(o.cache_size) * row);
  qvg::cuda::DenseCausalCache dense(o, {store[0].data(), store[1].data()}, [&](int64_t cap) {
    store.emplace_back(size_t(cap) * row);
    void* k = store.back().data();
    store.emplace_back(size_t(cap) * row);
    return qvg::cuda::DenseCausalCache::ExternalStorage{k, store.back().data()};
  });
  int64_t dend = 0;
  for (; dend < 4 * kChunk; dend += kChunk) {
    const Chunk ch({1, kChunk, 2, 64}, uint32_t(900 + dend));
    (void)dense.update(ch.key, ch.value, dend, kStream);
  }
  refused([&] { (void)dense.update(next.key, next.value, dend, kStream); }, "dense growth", "grow the cache");
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)dense.update(next.key, next.value, dend, kStream); }) == Kind::Ok);
}

/// Writes a bad call into the ring as the publish kernel does (fields, then its number).
void publish(int64_t call, int64_t chunk_start, int which, float value) {
  auto* slots = static_cast<qvg::cuda::kernels::CheckSlot*>(fake::last_host_alloc());
  qvg::cuda::kernels::CheckSlot& s = slots[call % qvg::cuda::kernels::kCheckSlots];
  s = {0, chunk_start, kChunk, 0, 5, 1, 7, which, value};  // call (0 while written), chunk, n, [b, t, h, d], ...
  s.call = (unsigned long long)call;                       // last, as the kernel publishes it
}

QVG_TEST(a_published_bad_call_is_raised_by_the_next_call_and_check) {
  qvg::QuantArgs q = qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}});
  q.codec.centroids = 8;
  qvg::cuda::PackedCausalCache cache(options(), q);
  const Chunk a({1, kChunk, 2, 64}, 1), b({1, kChunk, 2, 64}, 2);
  (void)cache.update(a.key, a.value, 0, kStream);
  (void)cache.update(a.key, a.value, kChunk, kStream);
  publish(1, kChunk, 1, std::nanf(""));  // the device found the value of call 2 bad
  const int64_t end = cache.global_end();
  const size_t segs = cache.num_segments();
  std::string msg;
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(b.key, b.value, kChunk, kStream); }, &msg) ==
             Kind::InvalidArgument)
      << msg;
  QVG_EXPECT(msg.find("value must hold finite values with |x| <= 1e16, got nan at [0, 5, 1, 7]") != std::string::npos)
      << msg;
  QVG_EXPECT(msg.find("chunk [32, 64)") != std::string::npos) << msg;
  QVG_EXPECT(cache.global_end() == end && cache.num_segments() == segs);
  // Reported once: the next call goes on.
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(b.key, b.value, kChunk, kStream); }) == Kind::Ok);
  // Two more bad calls: check() waits for the stream and raises the older first.
  publish(3, 2 * kChunk, 0, 1e16f);  // float32(1e16) > 1e16: named with every digit, as on the CPU
  publish(2, kChunk, 0, INFINITY);
  fake::calls().clear();
  QVG_EXPECT(qvg::testing::call_kind([&] { cache.check(kStream); }, &msg) == Kind::InvalidArgument) << msg;
  QVG_EXPECT(!fake::calls().empty() && fake::calls().front() == "cudaStreamSynchronize");
  QVG_EXPECT(msg.find("key must hold finite values") != std::string::npos && msg.find("got inf") != std::string::npos &&
             msg.find("chunk [32, 64)") != std::string::npos)
      << msg;
  QVG_EXPECT(qvg::testing::call_kind([&] { cache.check(kStream); }, &msg) == Kind::InvalidArgument) << msg;
  QVG_EXPECT(msg.find("chunk [64, 96)") != std::string::npos &&
             msg.find("got 10000000272564224 at") != std::string::npos)
      << msg;
  QVG_EXPECT(qvg::testing::call_kind([&] { cache.check(kStream); }) == Kind::Ok);
}

QVG_TEST(dense_update_never_waits) {
  qvg::CacheOptions o = options();
  std::vector<uint16_t> kbuf(size_t(o.cache_size * o.heads * o.head_dim)), vbuf(kbuf.size());
  qvg::cuda::DenseCausalCache cache(o, {kbuf.data(), vbuf.data()});
  int updates = 0;
  for (int c = 0; c < 12; ++c) {
    const Chunk ch({1, kChunk, 2, 64}, uint32_t(500 + c));
    for (int step = 0; step < 2; ++step) {
      fake::capturing() = step == 1;
      const std::string bad = first_forbidden([&] { (void)cache.update(ch.key, ch.value, c * kChunk, kStream); });
      if (c > 0 || step > 0) {
        QVG_EXPECT(bad.empty()) << "chunk" << c << "step" << step << "called" << bad;
        ++updates;
      }
    }
  }
  fake::capturing() = false;
  publish(1, 11 * kChunk, 0, std::nanf(""));
  std::string msg;
  const Chunk ch({1, kChunk, 2, 64}, 600);
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)cache.update(ch.key, ch.value, 11 * kChunk, kStream); }, &msg) ==
             Kind::InvalidArgument)
      << msg;
  std::printf("  dense: %d updates, no waiting call\n", updates);
}

// ---- branches and the dense cache's snapshots (issue 38), on the fake runtime ---------
// The fake's device memory is host memory and its copies move bytes (kernels are only
// recorded), so the device caches' host logic runs on emulated state here: the device
// dense cache's buffers are written directly, as its update() would leave them.

/// A dense [1, cache_size, H, D] bf16 buffer pair with distinct bytes.
struct DenseBuffers {
  std::vector<uint16_t> k, v;
  explicit DenseBuffers(const qvg::CacheOptions& o, uint16_t seed = 0)
      : k(size_t(o.cache_size * o.heads * o.head_dim)), v(k.size()) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = uint16_t(0x3f00 + (i * 7 + seed) % 251);
      v[i] = uint16_t(0xbf00 + (i * 13 + seed) % 241);
    }
  }
};

QVG_TEST(device_dense_snapshot_is_the_cpu_dense_caches_and_loads_back) {
  qvg::CacheOptions o = options();
  DenseBuffers dev_buf(o), cpu_buf(o);
  qvg::cuda::DenseCausalCache dev(o, {dev_buf.k.data(), dev_buf.v.data()});
  qvg::DenseCausalCache cpu(o, {cpu_buf.k.data(), cpu_buf.v.data()});
  for (const auto& [g, l] : {std::pair<int64_t, int64_t>{0, 0}, {96, 96}, {1000, o.cache_size}}) {
    dev.set_indices(g, l);
    cpu.set_indices(g, l);
    fake::calls().clear();
    const std::vector<uint8_t> bytes = dev.snapshot_bytes(kStream);
    QVG_EXPECT(bytes == cpu.snapshot_bytes()) << "global_end" << g;
    bool waited = false;
    for (const std::string& c : fake::calls()) waited |= c == "cudaStreamSynchronize";
    QVG_EXPECT(waited) << "snapshot_bytes must wait for the stream before reading the download";
    // Loaded into new storage: the same buffers and cursors.
    std::vector<std::unique_ptr<DenseBuffers>> held;
    const auto storage = [&](int64_t cs) {
      qvg::CacheOptions so = o;
      so.cache_size = cs;
      held.push_back(std::make_unique<DenseBuffers>(so, uint16_t(99)));
      return qvg::DenseCausalCache::ExternalStorage{held.back()->k.data(), held.back()->v.data()};
    };
    const qvg::cuda::DenseCausalCache back =
        qvg::cuda::DenseCausalCache::from_snapshot_bytes(bytes, {}, storage, kStream);
    QVG_EXPECT(held.size() == 1 && held[0]->k == dev_buf.k && held[0]->v == dev_buf.v);
    QVG_EXPECT(back.global_end() == g && back.local_end() == l);
    QVG_EXPECT(back.snapshot_bytes(kStream) == bytes);
    // The CPU cache loads the device cache's bytes.
    QVG_EXPECT(qvg::DenseCausalCache::from_snapshot_bytes(bytes).snapshot_bytes() == bytes);
  }
  std::string msg;
  QVG_EXPECT(
      qvg::testing::call_kind(
          [&] { (void)qvg::cuda::DenseCausalCache::from_snapshot_bytes(cpu.snapshot_bytes(), {}, nullptr, kStream); },
          &msg) == Kind::InvalidArgument)
      << msg;
  std::vector<uint8_t> cut = cpu.snapshot_bytes();
  cut.resize(cut.size() / 2);
  QVG_EXPECT(qvg::testing::call_kind([&] {
               (void)qvg::cuda::DenseCausalCache::from_snapshot_bytes(cut, {}, nullptr, kStream);
             }) != Kind::Ok);
}

QVG_TEST(device_dense_fork_copies_buffers_and_cursors) {
  qvg::CacheOptions o = options();
  DenseBuffers src_buf(o), fork_buf(o, 5);
  qvg::cuda::DenseCausalCache src(o, {src_buf.k.data(), src_buf.v.data()});
  src.set_indices(500, o.cache_size);
  int asked = 0;
  const auto storage = [&](int64_t cs) {
    ++asked;
    QVG_EXPECT(cs == o.cache_size);
    return qvg::DenseCausalCache::ExternalStorage{fork_buf.k.data(), fork_buf.v.data()};
  };
  qvg::cuda::DenseCausalCache f = src.fork(storage, kStream);
  QVG_EXPECT(asked == 1);
  QVG_EXPECT(fork_buf.k == src_buf.k && fork_buf.v == src_buf.v);
  QVG_EXPECT(f.global_end() == 500 && f.local_end() == o.cache_size);
  QVG_EXPECT(f.snapshot_bytes(kStream) == src.snapshot_bytes(kStream));
  QVG_EXPECT(qvg::testing::call_kind([&] { (void)src.fork(nullptr, kStream); }) == Kind::InvalidArgument);
}

QVG_TEST(device_packed_fork_shares_the_encoded_history) {
  qvg::cuda::PackedCausalCache src(options(), recommended_int2());
  feed(src, 10, 700);
  const size_t whole = src.resident_nbytes();
  QVG_EXPECT(src.shared_nbytes() == 0);
  size_t raw = 0;
  for (size_t i = 0; i < src.num_segments(); ++i)
    if (!src.segment(i).packed) raw += src.segment(i).nbytes;
  QVG_EXPECT(raw > 0 && raw < whole);
  fake::calls().clear();
  std::optional<qvg::cuda::PackedCausalCache> f(src.fork(kStream));
  int copies = 0;
  for (const std::string& c : fake::calls()) {
    copies += c.rfind("cudaMemcpy2DAsync DtoD", 0) == 0;
    QVG_EXPECT(c != "cudaStreamSynchronize" && c.find("HtoD") == std::string::npos &&
               c.find("DtoH") == std::string::npos)
        << "fork called" << c;
  }
  QVG_EXPECT(copies >= 2) << "the raw segments are copied on the stream";
  QVG_EXPECT(f->num_segments() == src.num_segments());
  for (size_t i = 0; i < src.num_segments(); ++i) {
    const auto a = src.segment(i), b = f->segment(i);
    QVG_EXPECT(a.g0 == b.g0 && a.g1 == b.g1 && a.packed == b.packed && a.span == b.span && a.nbytes == b.nbytes);
    if (a.packed)
      QVG_EXPECT(a.k_enc == b.k_enc && a.v_enc == b.v_enc && a.k_ref == b.k_ref) << "segment" << i << "not shared";
    else
      QVG_EXPECT(a.k_raw.data != b.k_raw.data) << "raw segment" << i << "not copied";
  }
  QVG_EXPECT(src.resident_nbytes() == raw && f->resident_nbytes() == raw);
  QVG_EXPECT(src.shared_nbytes() == whole - raw && f->shared_nbytes() == whole - raw);
  QVG_EXPECT(f->snapshot_bytes(kStream) == src.snapshot_bytes(kStream));
  f.reset();
  QVG_EXPECT(src.resident_nbytes() == whole && src.shared_nbytes() == 0);
}

// A copied view's buffer handed to the caller (release_view_buffer, issue 37): the view
// stays where it was, the cache holds no view buffer, and its next copied view gets a new
// buffer; a zero-copy view has none to hand over.
QVG_TEST(packed_view_buffer_is_handed_to_the_caller) {
  qvg::QuantArgs q = qvg::QuantArgs::from_flags({{"kv_cache_quant", "int2"}});
  q.codec.centroids = 8;
  qvg::cuda::PackedCausalCache cache(options(), q);
  int copied = 0;
  for (int c = 0; c < 4; ++c) {
    const Chunk ch({1, kChunk, 2, 64}, uint32_t(900 + c));
    const qvg::KVView w = cache.update(ch.key, ch.value, c * kChunk, kStream);
    if (w.zero_copy) {
      QVG_EXPECT(cache.release_view_buffer().size() == 0) << "chunk" << c;
      continue;
    }
    ++copied;
    const size_t held = cache.view_buffer_nbytes();
    QVG_EXPECT(held > 0);
    const qvg::cuda::DeviceBuffer mine = cache.release_view_buffer();
    QVG_EXPECT(mine.size() == held && mine.data() == w.k.data) << "chunk" << c;
    QVG_EXPECT(cache.view_buffer_nbytes() == 0 && cache.release_view_buffer().size() == 0);
    const qvg::KVView again = cache.update(ch.key, ch.value, c * kChunk, kStream);  // a denoising step
    QVG_EXPECT(!again.zero_copy && again.k.data != mine.data() && cache.view_buffer_nbytes() == held);
  }
  QVG_EXPECT(copied == 3) << copied;
}

// The dense cache's two-range view (sink ++ recent window) handed over the same way.
QVG_TEST(dense_view_buffer_is_handed_to_the_caller) {
  qvg::CacheOptions o = options();
  DenseBuffers buf(o);
  qvg::cuda::DenseCausalCache cache(o, {buf.k.data(), buf.v.data()});
  int copied = 0;
  for (int c = 0; c < 6; ++c) {
    const Chunk ch({1, kChunk, 2, 64}, uint32_t(950 + c));
    const qvg::KVView w = cache.update(ch.key, ch.value, c * kChunk, kStream, std::nullopt, int64_t{0});
    if (w.zero_copy) {
      QVG_EXPECT(cache.release_view_buffer().size() == 0);
      continue;
    }
    ++copied;
    const size_t held = cache.view_buffer_nbytes();
    const qvg::cuda::DeviceBuffer mine = cache.release_view_buffer();
    QVG_EXPECT(held > 0 && mine.size() == held && mine.data() == w.k.data && cache.view_buffer_nbytes() == 0);
  }
  QVG_EXPECT(copied >= 4) << copied;
}

// The default allocator takes a pool allocation's failure for a pool that does not
// work (and serves the device by cudaMalloc from then on, which synchronizing frees and
// no capture allow) only outside a capture: a failure inside one (the capture's own,
// e.g. invalidated by another library) and out-of-memory are thrown as CudaError, and
// the next allocation uses the pool again. (The fallback itself is not exercised: it
// lasts for the process.)
QVG_TEST(a_pool_failure_inside_a_capture_is_thrown_and_leaves_the_pool_in_use) {
  qvg::cuda::Allocator& a = qvg::cuda::default_allocator();
  for (const cudaError_t e : {cudaErrorStreamCaptureInvalidated, cudaErrorMemoryAllocation}) {
    fake::pool_error() = e;
    fake::capturing() = e != cudaErrorMemoryAllocation;
    fake::calls().clear();
    bool thrown = false;
    try {
      (void)a.allocate(1024, kStream);
    } catch (const qvg::cuda::CudaError&) {
      thrown = true;
    }
    fake::capturing() = false;
    fake::pool_error() = cudaSuccess;
    QVG_EXPECT(thrown) << int(e);
    fake::calls().clear();
    void* p = a.allocate(1024, kStream);
    a.deallocate(p, 1024, kStream);
    const std::string bad = [] {
      for (const std::string& c : fake::calls())
        if (forbidden(c)) return c;
      return std::string();
    }();
    QVG_EXPECT(p != nullptr && bad.empty() && fake::calls().front() == "cudaMallocFromPoolAsync")
        << int(e) << "then called" << bad;
  }
}

// The device encoder refuses a head dim its assignment cannot hold (one fp32 centroid
// row in the shared memory of the device: 24,576 channels with the fake's H100 opt-in
// limit) with InvalidArgument naming the limit and the value, before anything is
// enqueued or allocated; the limit itself encodes.
QVG_TEST(the_device_encoder_refuses_a_head_dim_beyond_its_shared_memory) {
  qvg::CodecConfig cfg;
  cfg.centroids = 2;
  cfg.kmeans_iters = 1;
  for (const int64_t D : {int64_t(24576 + 64), int64_t(24576)}) {
    std::vector<uint16_t> x(size_t(2 * D), 0x3F80);  // [1, 2, 1, D] of bf16 ones
    const qvg::ConstTensorView v{x.data(), qvg::DType::BF16, {1, 2, 1, D}};
    fake::calls().clear();
    std::string msg;
    const Kind k = qvg::testing::call_kind([&] { (void)qvg::cuda::encode(v, cfg, kStream); }, &msg);
    if (D > 24576) {
      QVG_EXPECT(k == Kind::InvalidArgument && msg.find("head_dim must be at most 24576") != std::string::npos &&
                 msg.find("got 24640") != std::string::npos && fake::calls().empty())
          << msg << fake::calls().size();
    } else {
      QVG_EXPECT(k == Kind::Ok) << msg;
    }
  }
}

// The harness's filter (gpu-check: the verdict runs "-all_settings_,-part2_", part 2
// runs "all_settings_" and "part2_").
QVG_TEST(harness_filter_words) {
  using qvg::testing::selected;
  QVG_EXPECT(selected("anything", ""));
  QVG_EXPECT(selected("part2_branches_x", "part2_") && !selected("gpu_encode", "part2_"));
  QVG_EXPECT(!selected("part2_branches_x", "-all_settings_,-part2_"));
  QVG_EXPECT(!selected("all_settings_y", "-all_settings_,-part2_"));
  QVG_EXPECT(selected("gpu_encode", "-all_settings_,-part2_"));
  QVG_EXPECT(selected("b_x", "a_,b_") && !selected("c_x", "a_,b_"));
  QVG_EXPECT(!selected("a_b_", "a_,-b_"));
}

}  // namespace

int main(int argc, char** argv) {
  return qvg::testing::run_all(argc, argv);
}
