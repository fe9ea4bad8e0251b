#include "perf/perf.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <malloc.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "codec/kmeans.h"
#include "kernels/kernels.h"
#include "qvg/attention.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/eval/memory.h"
#include "qvg/eval/workload.h"

namespace qvg::perf {

Timing time_it(const std::function<void()>& fn, int min_reps, double min_time_s, int max_reps) {
  using clock = std::chrono::steady_clock;
  fn();  // warm-up: page faults, caches, thread pool start
  std::vector<double> ts;
  const auto start = clock::now();
  while (int(ts.size()) < max_reps) {
    const auto a = clock::now();
    fn();
    const auto b = clock::now();
    ts.push_back(std::chrono::duration<double>(b - a).count());
    if (int(ts.size()) >= min_reps && std::chrono::duration<double>(b - start).count() >= min_time_s) break;
  }
  std::sort(ts.begin(), ts.end());
  Timing t;
  t.reps = int(ts.size());
  t.min_s = ts.front();
  t.max_s = ts.back();
  t.median_s = ts.size() % 2 ? ts[ts.size() / 2] : 0.5 * (ts[ts.size() / 2 - 1] + ts[ts.size() / 2]);
  return t;
}

Paired time_paired(const std::function<void()>& fa, const std::function<void()>& fb, int rounds, double round_time_s) {
  std::vector<double> ma, mb, ratios;
  Paired p;
  p.a.min_s = p.b.min_s = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const Timing ta = time_it(fa, 3, round_time_s, 1000);
    const Timing tb = time_it(fb, 3, round_time_s, 1000);
    ma.push_back(ta.median_s);
    mb.push_back(tb.median_s);
    ratios.push_back(ta.median_s / tb.median_s);
    p.a.min_s = std::min(p.a.min_s, ta.min_s);
    p.b.min_s = std::min(p.b.min_s, tb.min_s);
    p.a.max_s = std::max(p.a.max_s, ta.max_s);
    p.b.max_s = std::max(p.b.max_s, tb.max_s);
    p.a.reps += ta.reps;
    p.b.reps += tb.reps;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  p.a.median_s = median(ma);
  p.b.median_s = median(mb);
  p.ratio = median(ratios);
  return p;
}

void parallel_copy(void* dst, const void* src, size_t bytes, int threads) {
  const int nt = resolve_threads(threads);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const size_t per = (bytes / size_t(n) + 63) / 64 * 64;
    const size_t lo = std::min(bytes, per * size_t(t)), hi = std::min(bytes, lo + per);
    if (hi > lo) std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  }
}

double parallel_fma(int64_t iters, int threads) {
  const int nt = resolve_threads(threads);
  double total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
  total += fma_loop(iters);
  return total;
}

void assign_nearest(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids) {
  kernels::assign_nearest(x, n, dim, c, k, ids, true);
}

std::vector<float> kmeans_centroids(const float* x, int64_t n, int64_t dim, int k, int iters, int64_t h) {
  detail::KMeansParams p;
  p.k = k;
  p.iters = iters;
  p.h = h;
  return detail::kmeans(x, n, dim, p).centroids;
}

std::string cpu_target_name() {
  return kernels::current_target_name();
}

namespace {

// Points of every (b, h) group of x as fp32, group-major, each group centred
// (what the encoder's k-means sees): groups x n x d.
std::vector<float> group_points(const Tensor& x) {
  const Shape4 s = x.shape();
  std::vector<float> out(size_t(s.b * s.h * s.s * s.d));
  const std::vector<float> f = x.to_f32();
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      float* g = out.data() + size_t((b * s.h + h) * s.s * s.d);
      std::vector<double> mean(size_t(s.d), 0.0);
      for (int64_t t = 0; t < s.s; ++t)
        for (int64_t d = 0; d < s.d; ++d) {
          const float v = f[size_t(((b * s.s + t) * s.h + h) * s.d + d)];
          g[t * s.d + d] = v;
          mean[size_t(d)] += v;
        }
      for (int64_t t = 0; t < s.s; ++t)
        for (int64_t d = 0; d < s.d; ++d) g[t * s.d + d] -= float(mean[size_t(d)] / double(s.s));
    }
  return out;
}

Measurement make(const std::string& name, const Timing& t) {
  Measurement m;
  m.name = name;
  m.t = t;
  return m;
}

}  // namespace

LoadCheck assess_load(const Timing& first_copy, const Timing& last_copy, double load_average, int cores) {
  LoadCheck c;
  c.cores = std::max(1, cores);
  c.load_average = load_average;
  c.copy_spread = first_copy.min_s > 0 ? first_copy.max_s / first_copy.min_s : 1;
  c.copy_drift = first_copy.median_s > 0 ? last_copy.median_s / first_copy.median_s : 1;
  auto add = [&](const std::string& why) {
    c.loaded = true;
    c.reason += (c.reason.empty() ? "" : "; ") + why;
  };
  if (c.copy_spread > LoadCheck::kSpreadLimit)
    add(
        fmt::format("repetitions of one copy took from {:.3g} to {:.3g} s ({:.2f}x apart, where a quiet machine keeps "
                    "them within {:.2f}x)",
                    first_copy.min_s, first_copy.max_s, c.copy_spread, LoadCheck::kSpreadLimit));
  if (c.copy_drift > LoadCheck::kDriftLimit || c.copy_drift < 1 / LoadCheck::kDriftLimit)
    add(fmt::format("the same copy took {:.2f}x as long at the end of the run as at its start", c.copy_drift));
  if (load_average > LoadCheck::kLoadPerCore * double(c.cores))
    add(fmt::format("the 1-minute load average was {:.2f} on {} cores before the run started", load_average, c.cores));
  return c;
}

BenchReport bench_report(const std::vector<Measurement>& ms, const LoadCheck& load, const std::string& target,
                         bool quick) {
  BenchReport r;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  r.table = fmt::format("{:<28} {:>11} {:>11} {:>11}  {}\n", "measurement", "median_s", "min_s", "max_s", "figures");
  for (const Measurement& m : ms) {
    nlohmann::ordered_json o = {
        {"median_s", m.t.median_s}, {"min_s", m.t.min_s}, {"max_s", m.t.max_s}, {"reps", m.t.reps}};
    if (!m.alias_of.empty()) {  // a second name for a row above: labelled, its figures not repeated
      o["alias_of"] = m.alias_of;
      j[m.name] = o;
      r.table += fmt::format("{:<28} {:>11} {:>11} {:>11}  the row {} under a second name\n", m.name, "=", "=", "=",
                             m.alias_of);
      continue;
    }
    std::string figs;
    for (const auto& [k, v] : m.figures) {
      o[k] = v;
      figs += fmt::format("{}={:.4g} ", k, v);
    }
    if (!m.note.empty()) o["note"] = m.note;
    j[m.name] = o;
    r.table +=
        fmt::format("{:<28} {:>11.6f} {:>11.6f} {:>11.6f}  {}\n", m.name, m.t.median_s, m.t.min_s, m.t.max_s, figs);
  }
  j["target"] = target;
  j["quick"] = quick;
  j["machine_load"] = {{"loaded", load.loaded},
                       {"copy_spread", load.copy_spread},
                       {"copy_drift", load.copy_drift},
                       {"load_average_1m",
                        load.load_average >= 0 ? nlohmann::ordered_json(load.load_average) : nlohmann::ordered_json()},
                       {"cores", load.cores},
                       {"reason", load.reason}};
  r.table += fmt::format("machine load: copy spread {:.2f}x, drift {:.2f}x, load average {} on {} cores: {}\n",
                         load.copy_spread, load.copy_drift,
                         load.load_average >= 0 ? fmt::format("{:.2f}", load.load_average) : std::string("n/a"),
                         load.cores, load.loaded ? "BUSY" : "quiet");
  if (load.loaded)
    r.table += fmt::format(
        "WARNING: this machine was busy during the run ({}): the times above and the ratios between rows can be off "
        "several times; rerun when it is quiet\n",
        load.reason);
  r.json = j.dump(2) + "\n";
  return r;
}

std::vector<Measurement> run_suite(const BenchOptions& opt, LoadCheck* load) {
  check_threads("threads", opt.threads);
  const int threads = resolve_threads(opt.threads);
  double load_average = -1;
  if (double l[1]; load != nullptr && ::getloadavg(l, 1) == 1) load_average = l[0];
  auto step = [&](const std::string& s) {
    if (opt.progress) opt.progress(s);
  };
  std::vector<Measurement> out;
  const double min_time = opt.quick ? 0.05 : 0.3;

  // ---- machine limits ------------------------------------------------------------
  step("copy_bandwidth");
  const size_t copy_bytes = opt.quick ? (size_t(64) << 20) : (size_t(256) << 20);
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 2);
  // Timed again at the end for the load check, on the same buffers.
  const auto time_copy = [&] {
    return time_it([&] { parallel_copy(dst.data(), src.data(), copy_bytes, threads); }, 5, min_time);
  };
  Measurement copy = make("copy_bandwidth", time_copy());
  const double copy_bps = 2.0 * double(copy_bytes) / copy.t.median_s;
  copy.figures["gbps"] = copy_bps / 1e9;
  copy.figures["bytes"] = double(copy_bytes);
  copy.figures["threads"] = threads;
  out.push_back(copy);

  step("fma_peak");
  const int64_t fma_iters = opt.quick ? 2000000 : 20000000;
  double fma_flops = 0;
  Measurement fma = make("fma_peak", time_it([&] { fma_flops = parallel_fma(fma_iters, threads); }, 9, min_time));
  const double peak = fma_flops / fma.t.median_s;
  fma.figures["gflops"] = peak / 1e9;
  fma.figures["threads"] = threads;
  fma.note = "register-resident fp32 FMA loop on target " + cpu_target_name();
  out.push_back(fma);

  // ---- the workload: one Self-Forcing chunk of one layer ----------------------------
  ModelPreset preset = find_model_preset("self-forcing-1.3b");
  if (opt.quick) preset = preset.scaled(0.25);
  Workload wl(preset, WorkloadOptions{});
  const int64_t chunk = preset.chunk_tokens(), H = preset.heads, D = preset.head_dim;
  LayerChunk lc = wl.generate(preset.layers / 2, 2, GenerateParts{false, true});
  const Tensor& kx = lc.k;
  const std::string shape = fmt::format("[1, {}, {}, {}]", chunk, H, D);

  // ---- decode -----------------------------------------------------------------------
  EncodedTensor enc2, enc4;
  for (int bits : {2, 4}) {
    step(fmt::format("decode_int{}", bits));
    CodecConfig cfg;
    cfg.bits = bits;
    cfg.centroids = 256;
    cfg.threads = threads;
    EncodedTensor e = encode(kx, cfg);
    Tensor outt(DType::BF16, kx.shape());
    // Alternating rounds of decode and of the machine's copy (same buffers as
    // copy_bandwidth): the fraction is the median of per-round ratios.
    const Paired pr = time_paired([&] { decode(e, outt.view(), threads); },
                                  [&] { parallel_copy(dst.data(), src.data(), copy_bytes, threads); },
                                  opt.quick ? 3 : 9, opt.quick ? 0.03 : 0.1);
    Measurement m = make(fmt::format("decode_int{}", bits), pr.a);
    const double bytes = double(e.nbytes() + outt.nbytes());
    m.figures["gbps"] = bytes / m.t.median_s / 1e9;
    // decode bytes/s over copy bytes/s, per round: (bytes / t_dec) / (2 copy_bytes / t_copy)
    m.figures["fraction_of_copy_bw"] = bytes / (2.0 * double(copy_bytes)) / pr.ratio;
    m.figures["copy_gbps_same_rounds"] = 2.0 * double(copy_bytes) / pr.b.median_s / 1e9;
    m.figures["bytes"] = bytes;
    m.note = "decode of " + shape + " bf16, centroids 256, block 64; bytes = encoded + output";
    out.push_back(m);
    (bits == 2 ? enc2 : enc4) = std::move(e);
  }
  const double decode2_s = out.back().name == "decode_int4" ? out[out.size() - 2].t.median_s : 0;
  src.clear();
  src.shrink_to_fit();
  dst.clear();
  dst.shrink_to_fit();

  // ---- k-means ------------------------------------------------------------------------
  const std::vector<float> pts = group_points(kx);
  const int64_t G = H, n = chunk;
  const int K = 256;
  {
    step("kmeans_assign");
    std::vector<float> cent(size_t(G * K * D));
    for (int64_t g = 0; g < G; ++g) std::copy_n(pts.data() + g * n * D, K * D, cent.data() + g * K * D);
    std::vector<uint8_t> ids(size_t(G * n));
    // Alternating rounds with the FMA loop (as decode with the copy): the fraction
    // is the median of per-round ratios, so a slow spell of the host moves both.
    const Paired pr = time_paired(
        [&] {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
          for (int64_t g = 0; g < G; ++g)
            assign_nearest(pts.data() + g * n * D, n, D, cent.data() + g * K * D, K, ids.data() + g * n);
        },
        [&] { fma_flops = parallel_fma(fma_iters, threads); }, opt.quick ? 3 : 7, opt.quick ? 0.03 : 0.1);
    Measurement m = make("kmeans_assign", pr.a);
    const double flops = 2.0 * double(G) * double(n) * K * double(D);
    m.figures["gflops"] = flops / m.t.median_s / 1e9;
    m.figures["fraction_of_fma_peak"] = flops / fma_flops / pr.ratio;
    m.figures["fma_gflops_same_rounds"] = fma_flops / pr.b.median_s / 1e9;
    m.note = fmt::format("{} groups x {} points x {} centroids x D {}; 2*N*K*D flops per pass", G, n, K, D);
    out.push_back(m);
  }
  for (int iters : {2, 10}) {
    const std::string name = fmt::format("kmeans_it{}", iters);
    step(name);
    std::vector<float> ours(size_t(G * K * D)), theirs(size_t(G * K * D));
    Measurement m = make(name, time_it(
                                   [&] {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
                                     for (int64_t g = 0; g < G; ++g) {
                                       const std::vector<float> c =
                                           kmeans_centroids(pts.data() + g * n * D, n, D, K, iters, g);
                                       std::copy(c.begin(), c.end(), ours.begin() + g * K * D);
                                     }
                                   },
                                   opt.quick ? 2 : 3, min_time, opt.quick ? 3 : 20));
    double inertia_ours = 0;
    for (int64_t g = 0; g < G; ++g)
      inertia_ours += inertia_fp64(pts.data() + g * n * D, n, ours.data() + g * K * D, K, D);
    m.figures["inertia"] = inertia_ours;
    bool have_peer = false;
    Timing peer_t;
    if (opt.faiss) {
      peer_t = time_it([&] { have_peer = opt.faiss(pts.data(), G, n, D, K, iters, threads, 1234, theirs.data()); },
                       opt.quick ? 2 : 3, min_time, opt.quick ? 3 : 20);
    }
    if (have_peer) {
      double inertia_faiss = 0;
      for (int64_t g = 0; g < G; ++g)
        inertia_faiss += inertia_fp64(pts.data() + g * n * D, n, theirs.data() + g * K * D, K, D);
      m.figures["faiss_median_s"] = peer_t.median_s;
      m.figures["faiss_inertia"] = inertia_faiss;
      m.figures["speedup_vs_faiss"] = peer_t.median_s / m.t.median_s;
      m.figures["inertia_ratio_vs_faiss"] = inertia_ours / inertia_faiss;
      m.note =
          "faiss::Clustering (IndexFlatL2, same K, iterations and threads); faiss splits empty clusters and "
          "never stops early, ours keeps empty centroids and stops when < 1e-4 of points move";
    } else {
      m.note = "faiss comparison unavailable in this build";
    }
    out.push_back(m);
  }

  // ---- encode -------------------------------------------------------------------------
  {
    step("encode_int2");
    CodecConfig cfg;
    cfg.bits = 2;
    cfg.centroids = 256;
    cfg.threads = threads;
    Measurement m = make("encode_int2", time_it([&] { encode(kx, cfg); }, opt.quick ? 2 : 3, min_time, 20));
    m.figures["ratio_to_decode"] = decode2_s > 0 ? m.t.median_s / decode2_s : 0;
    m.note = "k-means (2 iterations, 256 centroids) + residual of " + shape;
    out.push_back(m);
  }

  // ---- window reconstruction ----------------------------------------------------------
  const int window_chunks = 7;
  for (int bits : {2, 4}) {
    const std::string name = fmt::format("reconstruct_window_int{}", bits);
    step(name);
    CacheOptions co;
    co.batch = 1;
    co.cache_size = window_chunks * chunk;
    co.heads = H;
    co.head_dim = D;
    co.dtype = DType::BF16;
    co.sink_tokens = chunk;
    QuantArgs qa;
    qa.enable(bits);
    qa.codec.centroids = 256;
    qa.codec.threads = threads;
    PackedCausalCache cache(co, qa);
    // Stream until the window is full and one chunk has slid out.
    for (int64_t c = 0; c <= window_chunks; ++c) cache.update(kx, lc.v, c * chunk);
    const int64_t cur = window_chunks * chunk;
    KVView view;
    view = cache.update(kx, lc.v, cur);
    const size_t view_bytes = 2 * size_t(view.k.shape.numel()) * dtype_size(view.k.dtype);
    std::vector<char> a(view_bytes, 1), b(view_bytes, 2);
    const Paired pr = time_paired([&] { view = cache.update(kx, lc.v, cur); },
                                  [&] { parallel_copy(b.data(), a.data(), view_bytes, threads); }, opt.quick ? 3 : 7,
                                  opt.quick ? 0.05 : 0.15);
    Measurement m = make(name, pr.a);
    m.figures["copy_median_s"] = pr.b.median_s;
    m.figures["ratio_to_copy"] = pr.ratio;
    m.figures["view_tokens"] = double(view.k.shape.s);
    m.figures["resident_bytes"] = double(cache.resident_nbytes());
    m.note = fmt::format(
        "denoising-step update returning a {}-chunk window (sink 1 chunk, keep_recent 1) vs a "
        "copy of the same {} dense bytes (K+V)",
        window_chunks, view_bytes);
    out.push_back(m);
    if (bits == 2) {
      // The int2 window under its short name, reconstruct_window (docs/performance.md):
      // the same measurement, labelled.
      Measurement alias = m;
      alias.name = "reconstruct_window";
      alias.alias_of = name;
      out.push_back(alias);
    }
    if (bits == 4) {
      // ---- attention of one chunk's queries over that window ----------------------------
      step("attention_chunk");
      const Tensor kv_k = view.k.to_tensor(), kv_v = view.v.to_tensor();
      const StridedView sk = StridedView::of(kv_k), sv = StridedView::of(kv_v);
      Tensor q = lc.q;
      int64_t nq = chunk;
      if (!opt.quick) {  // a quarter of the chunk's queries keeps the run short
        nq = chunk / 4;
        Tensor qs(q.dtype(), {1, nq, H, D});
        std::memcpy(qs.data(), q.data(), qs.nbytes());
        q = std::move(qs);
      }
      Measurement am = make("attention_chunk", time_it([&] { attention(q, sk, sv, threads); }, 2, min_time, 5));
      const double flops = 4.0 * double(nq) * double(view.k.shape.s) * double(D) * double(H);
      am.figures["gflops"] = flops / am.t.median_s / 1e9;
      am.figures["fraction_of_fma_peak"] = flops / am.t.median_s / peak;
      am.note = fmt::format("reference attention, {} queries x {} keys x {} heads, D {}", nq, view.k.shape.s, H, D);
      out.push_back(am);
    }
  }
  // ---- a branch: fork() of a full Self-Forcing window vs copying its raw chunks -------
  {
    step("fork_packed_cache");
    // The shape (38): Self-Forcing at scale 0.25, the recommended profile, the
    // window full and rolling; chunks of the workload (every fourth layer's data).
    const ModelPreset fp = find_model_preset("self-forcing-1.3b").scaled(0.25);
    Workload fw(fp, WorkloadOptions{});
    const CacheOptions co = MemoryShape::of(fp).cache_options();
    QuantArgs qa = fp.policy_defaults();
    qa.apply_profile("recommended");
    qa.codec.threads = threads;
    PackedCausalCache cache(co, qa);
    const int64_t fc = fp.chunk_tokens(), chunks = fp.cache_tokens() / fc + 2;
    for (int64_t c = 0; c < chunks; ++c) {
      const LayerChunk ch = fw.generate(int(c % 4) * fp.layers / 4, int(c), GenerateParts{false, false});
      cache.update(ch.k, ch.v, c * fc);
    }
    std::vector<std::pair<const void*, size_t>> raw;  // the raw segments' K and V
    size_t raw_bytes = 0;
    for (size_t i = 0; i < cache.num_segments(); ++i) {
      const PackedCausalCache::SegmentInfo g = cache.segment(i);
      if (g.packed) continue;
      for (const StridedView* r : {&g.k_raw, &g.v_raw}) {
        const size_t bytes = size_t(r->shape.numel()) * dtype_size(r->dtype);
        raw.push_back({r->data, bytes});
        raw_bytes += bytes;
      }
    }
    const Paired pr = time_paired([&] { PackedCausalCache f = cache.fork(); },
                                  [&] {
                                    std::vector<AlignedBuffer> copies;
                                    for (const auto& [p, bytes] : raw) {
                                      copies.push_back(AlignedBuffer::uninitialized(bytes));
                                      std::memcpy(copies.back().data(), p, bytes);
                                    }
                                  },
                                  opt.quick ? 3 : 7, opt.quick ? 0.05 : 0.15);
    // Bytes a fork allocates: the heap in use (glibc: small blocks + mmapped blocks)
    // while one fork is held, minus before.
    const auto in_use = [] {
      const struct mallinfo2 mi = mallinfo2();
      return mi.uordblks + mi.hblkhd;
    };
    const size_t before = in_use();
    std::optional<PackedCausalCache> held = cache.fork();
    const size_t fork_alloc = in_use() - before;
    held.reset();
    // N = 8 branches of this state.
    std::vector<PackedCausalCache> branches;
    for (int i = 0; i < 7; ++i) branches.push_back(cache.fork());
    std::vector<const PackedCausalCache*> all{&cache};
    for (const PackedCausalCache& b : branches) all.push_back(&b);
    const size_t whole = cache.resident_nbytes() + cache.shared_nbytes();
    Measurement m = make("fork_packed_cache", pr.a);
    m.figures["raw_copy_median_s"] = pr.b.median_s;
    m.figures["ratio_to_raw_copy"] = pr.ratio;
    m.figures["raw_bytes"] = double(raw_bytes);
    if (fork_alloc >= raw_bytes) {  // else the heap is not glibc's (a sanitizer's allocator): not measured
      m.figures["fork_allocated_bytes"] = double(fork_alloc);
      m.figures["alloc_ratio_to_raw"] = raw_bytes ? double(fork_alloc) / double(raw_bytes) : 0;
    }
    m.figures["resident_bytes"] = double(whole);
    m.figures["branches8_bytes"] = double(PackedCausalCache::group_nbytes(all));
    m.figures["branches8_copies_bytes"] = 8.0 * double(whole);
    m.note = fmt::format(
        "fork() of a self-forcing x0.25 packed cache ({} tokens, recommended profile, window full) vs "
        "copying its {} raw bytes into new buffers; 8 branches hold the encoded history once",
        co.cache_size, raw_bytes);
    out.push_back(m);
  }

  if (load != nullptr) {  // the first measurement's copy again, for the load check
    step("copy_bandwidth (again, for the load check)");
    src.assign(copy_bytes, 1);  // freed after the decode rows (the k-means rows need the memory)
    dst.assign(copy_bytes, 2);
    *load = assess_load(copy.t, time_copy(), load_average, omp_get_num_procs());
  }
  return out;
}

}  // namespace qvg::perf
