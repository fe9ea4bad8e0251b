// Google Benchmark suite: the kernels of docs/performance.md with rates and ratios
// against this machine's limits, measured once at start-up in the same process (copy
// bandwidth and FMA peak, all threads). `qvg bench` runs the same measurements with
// medians and writes JSON; this suite is for profiling single kernels
// (--benchmark_filter) and for Google Benchmark's own statistics.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "perf/perf.h"
#include "qvg/attention.h"
#include "qvg/codec.h"
#include "qvg/eval/workload.h"

namespace {

using namespace qvg;

struct Limits {
  double copy_bps = 0, fma_flops = 0;
  Limits() {
    const size_t n = size_t(256) << 20;
    std::vector<char> a(n, 1), b(n, 2);
    auto t = perf::time_it([&] { perf::parallel_copy(b.data(), a.data(), n, 0); }, 5, 0.3);
    copy_bps = 2.0 * double(n) / t.median_s;
    double f = 0;
    auto tf = perf::time_it([&] { f = perf::parallel_fma(20000000, 0); }, 5, 0.3);
    fma_flops = f / tf.median_s;
  }
};
const Limits& limits() {
  static const Limits l;
  return l;
}

struct Chunk {
  Tensor k, v, q;
  Chunk() {
    Workload wl(find_model_preset("self-forcing-1.3b"));
    LayerChunk lc = wl.generate(15, 2, GenerateParts{false, true});
    k = std::move(lc.k);
    v = std::move(lc.v);
    q = std::move(lc.q);
  }
};
const Chunk& chunk() {
  static const Chunk c;
  return c;
}

void BM_Copy(benchmark::State& st) {
  const size_t n = size_t(st.range(0)) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  for (auto _ : st) perf::parallel_copy(b.data(), a.data(), n, 0);
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(2 * n));
}
BENCHMARK(BM_Copy)->Arg(256)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_FmaPeak(benchmark::State& st) {
  double f = 0;
  for (auto _ : st) f += perf::parallel_fma(10000000, 0);
  st.counters["flops"] = benchmark::Counter(f, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& st) {
  CodecConfig cfg;
  cfg.bits = int(st.range(0));
  cfg.centroids = 256;
  EncodedTensor e = encode(chunk().k, cfg);
  Tensor out(DType::BF16, e.shape);
  for (auto _ : st) decode(e, out.view());
  const double bytes = double(e.nbytes() + out.nbytes());
  st.SetBytesProcessed(int64_t(double(st.iterations()) * bytes));
  st.counters["fraction_of_copy_bw"] =
      benchmark::Counter(bytes / limits().copy_bps, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)->Arg(2)->Arg(3)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);

std::vector<float> centred_group(int64_t h) {
  const Tensor& k = chunk().k;
  const int64_t n = k.shape().s, d = k.shape().d;
  std::vector<float> p(size_t(n * d));
  std::vector<double> mean(size_t(d), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < d; ++c) {
      p[size_t(t * d + c)] = k.at(0, t, h, c);
      mean[size_t(c)] += p[size_t(t * d + c)];
    }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < d; ++c) p[size_t(t * d + c)] -= float(mean[size_t(c)] / double(n));
  return p;
}

void BM_KMeansAssign(benchmark::State& st) {
  const int64_t G = omp_get_max_threads(), d = 128, K = 256;
  std::vector<std::vector<float>> pts;
  for (int64_t g = 0; g < G; ++g) pts.push_back(centred_group(g));
  const int64_t n = int64_t(pts[0].size()) / d;
  std::vector<std::vector<uint8_t>> ids(static_cast<size_t>(G), std::vector<uint8_t>(static_cast<size_t>(n)));
  for (auto _ : st) {
#pragma omp parallel for
    for (int64_t g = 0; g < G; ++g)
      perf::assign_nearest(pts[size_t(g)].data(), n, d, pts[size_t(g)].data(), int(K), ids[size_t(g)].data());
  }
  const double flops = 2.0 * double(G * n * K * d);
  st.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["fraction_of_fma_peak"] =
      benchmark::Counter(flops / limits().fma_flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_KMeansAssign)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_KMeans(benchmark::State& st) {
  const int iters = int(st.range(0));
  auto p = centred_group(0);
  const int64_t n = int64_t(p.size()) / 128;
  double inertia = 0;
  for (auto _ : st) {
    const std::vector<float> c = perf::kmeans_centroids(p.data(), n, 128, 256, iters);
    st.PauseTiming();
    inertia = inertia_fp64(p.data(), n, c.data(), 256, 128);
    st.ResumeTiming();
  }
  st.counters["inertia"] = inertia;
}
BENCHMARK(BM_KMeans)->Arg(2)->Arg(10)->UseRealTime()->Unit(benchmark::kMillisecond);

#ifdef QVG_HAVE_FAISS
void BM_FaissKMeans(benchmark::State& st) {
  const int iters = int(st.range(0));
  auto p = centred_group(0);
  const int64_t n = int64_t(p.size()) / 128;
  std::vector<float> c(256 * 128);
  auto peer = perf::faiss_kmeans();
  double inertia = 0;
  for (auto _ : st) {
    peer(p.data(), 1, n, 128, 256, iters, 1, 1234, c.data());
    st.PauseTiming();
    inertia = inertia_fp64(p.data(), n, c.data(), 256, 128);
    st.ResumeTiming();
  }
  st.counters["inertia"] = inertia;
}
BENCHMARK(BM_FaissKMeans)->Arg(2)->Arg(10)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

void BM_Encode(benchmark::State& st) {
  CodecConfig cfg;
  cfg.bits = int(st.range(0));
  cfg.centroids = 256;
  for (auto _ : st) benchmark::DoNotOptimize(encode(chunk().k, cfg));
}
BENCHMARK(BM_Encode)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Attention(benchmark::State& st) {
  // One chunk's first 512 queries over a 7-chunk window of the chunk's keys.
  const Tensor& k = chunk().k;
  const int64_t T = 7 * k.shape().s, H = k.shape().h, D = k.shape().d, nq = 512;
  Tensor kw(DType::BF16, {1, T, H, D}), vw(DType::BF16, {1, T, H, D}), q(DType::BF16, {1, nq, H, D});
  for (int i = 0; i < 7; ++i) {
    std::memcpy(static_cast<char*>(kw.data()) + size_t(i) * k.nbytes(), k.data(), k.nbytes());
    std::memcpy(static_cast<char*>(vw.data()) + size_t(i) * k.nbytes(), chunk().v.data(), k.nbytes());
  }
  std::memcpy(q.data(), chunk().q.data(), q.nbytes());
  const StridedView sk = StridedView::of(kw), sv = StridedView::of(vw);
  for (auto _ : st) benchmark::DoNotOptimize(attention(q, sk, sv));
  const double flops = 4.0 * double(nq * T * D * H);
  st.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["fraction_of_fma_peak"] =
      benchmark::Counter(flops / limits().fma_flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
