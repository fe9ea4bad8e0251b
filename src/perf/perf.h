// src/perf/perf.h — the performance measurements of `qvg bench` and bench/.
//
// Every measurement reports wall-clock medians over repetitions, and figures
// relative to a limit or a peer measured in the same run: bandwidths count bytes
// read plus bytes written by the algorithm (a copy of N bytes counts 2N), FLOP
// rates count a multiply-add as 2. Nothing here asserts a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace qvg::perf {

struct Timing {
  double median_s = 0, min_s = 0, max_s = 0;
  int reps = 0;
};
/// Runs fn once untimed (warm-up), then at least `min_reps` times and until
/// `min_time_s` has passed (at most `max_reps`).
Timing time_it(const std::function<void()>& fn, int min_reps = 5, double min_time_s = 0.2, int max_reps = 200);

/// Two functions measured in alternating rounds (a, b, a, b, ...) so that both
/// see the same machine state on a shared, noisy host. `ratio` is the median over
/// rounds of (round median of a) / (round median of b).
struct Paired {
  Timing a, b;  ///< medians / extremes over all rounds
  double ratio = 0;
};
Paired time_paired(const std::function<void()>& fa, const std::function<void()>& fb, int rounds = 7,
                   double round_time_s = 0.1);

struct Measurement {
  std::string name;
  Timing t;
  std::map<std::string, double> figures;  ///< derived figures (gbps, ratios, ...)
  std::string note;
  std::string alias_of;  ///< set: the same measurement as that row, under a second name
};

/// Whether the machine was busy while the suite ran (docs/performance.md): under load
/// the rows' times move by up to 10x and their ratios with them. Three signals: the
/// spread of the repeated copies of copy_bandwidth (slowest / fastest repetition of the
/// same memcpy: near 1 on a quiet machine), the drift of the same copy repeated at the
/// end of the suite (its median over the first one's), and the 1-minute load average
/// read before the suite started against the cores.
struct LoadCheck {
  double copy_spread = 1;    ///< first copy: max_s / min_s
  double copy_drift = 1;     ///< last copy's median / first copy's median
  double load_average = -1;  ///< 1-minute load average at the start; < 0: unavailable
  int cores = 1;             ///< hardware threads
  bool loaded = false;       ///< any signal past its limit (kSpreadLimit, kDriftLimit, kLoadPerCore)
  std::string reason;        ///< the signals past their limits, in words; empty when quiet
  static constexpr double kSpreadLimit = 1.5, kDriftLimit = 1.25, kLoadPerCore = 0.5;
};
/// The verdict from the two copy timings and the load average (< 0: not used).
LoadCheck assess_load(const Timing& first_copy, const Timing& last_copy, double load_average, int cores);

/// The peer k-means (faiss), when the build has it: clusters each of `groups`
/// point sets (n x d, contiguous one after the other) into k centroids with
/// `iters` Lloyd iterations using `threads` threads; writes groups x k x d
/// centroids. Returns false when faiss is not built in.
using PeerKMeans = std::function<bool(const float* x, int64_t groups, int64_t n, int64_t d, int k, int iters,
                                      int threads, uint64_t seed, float* centroids)>;

struct BenchOptions {
  bool quick = false;  ///< smaller shapes and fewer repetitions (CI smoke run)
  int threads = 0;     ///< 0 = all cores
  PeerKMeans faiss;    ///< empty: the faiss comparison is reported as unavailable
  std::function<void(const std::string&)> progress;  ///< called before each measurement
};

/// What `qvg bench` prints and writes for a suite's measurements: `table`, one row per
/// measurement (median, min, max and its figures; a row with alias_of labelled as that
/// row under a second name, its figures not repeated), then a "machine load:" line and,
/// when `load` says busy, a "WARNING: this machine was busy during the run (reason)"
/// line; `json`, one object (two-space indent, ending with a newline): per measurement
/// its timing, figures and note (an alias: its timing and "alias_of"), "target",
/// "quick" and "machine_load" {loaded, copy_spread, copy_drift, load_average_1m (null
/// when unavailable), cores, reason}.
struct BenchReport {
  std::string table, json;
};
BenchReport bench_report(const std::vector<Measurement>& ms, const LoadCheck& load, const std::string& target,
                         bool quick);

/// Runs the CPU performance suite of docs/performance.md (machine limits, decode,
/// k-means vs faiss, encode, window reconstruction, attention) and returns the
/// measurements in order; with `load`, also the machine's load while it ran (the copy
/// of copy_bandwidth is repeated at the end for it).
std::vector<Measurement> run_suite(const BenchOptions& opt, LoadCheck* load = nullptr);

// ---- the pieces (also used by the Google Benchmark suite) ----

/// memcpy of `bytes` between two buffers, split over `threads` threads.
void parallel_copy(void* dst, const void* src, size_t bytes, int threads);
/// Runs a register-resident FMA loop of `iters` iterations on the calling thread
/// (12 independent vector chains, on the SIMD target the CPU kernels use) and
/// returns the number of floating-point operations it did (a multiply-add counts 2).
double fma_loop(int64_t iters);
/// Runs fma_loop on every thread; returns FLOPs done.
double parallel_fma(int64_t iters_per_thread, int threads);
/// The encoder's fast k-means assignment (the CPU kernel), for measuring it alone:
/// ids[i] = index of the nearest of the k centroids (k x dim) to point i (n x dim).
/// REQUIRES 1 <= k <= 256, dim >= 1.
void assign_nearest(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids);
/// The codec's k-means (spec 1.1, random init, seed 1234, PRNG stream of group h) on
/// n points of dimension dim: returns the k x dim centroids of `iters` iterations.
std::vector<float> kmeans_centroids(const float* x, int64_t n, int64_t dim, int k, int iters, int64_t h = 0);
/// Name of the SIMD target the CPU kernels dispatch to (e.g. "AVX3").
std::string cpu_target_name();

}  // namespace qvg::perf

namespace qvg::perf {
/// faiss k-means as a PeerKMeans; defined only in builds with faiss
/// (QVG_HAVE_FAISS), in src/perf/faiss_peer.cpp.
PeerKMeans faiss_kmeans();
}  // namespace qvg::perf
