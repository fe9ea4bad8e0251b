// The device encoder (spec 1.1, 1.2): the host side enqueues the points with their
// group mean, then per stage centring, initial indices (init random's draw, or
// kmeans++'s picks from the stage's centred points) and centroids, kmeans_iters
// x (assignment, update), stored centroids and (but for the last stage) the next
// residual with its mean; then the residual quantizer, which subtracts the last
// stage's centroids itself. Every group
// is processed by the same launches; early stopping is decided per group on the
// device (kernels of a stopped group return at once), so nothing synchronizes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "codec/cuda/encode_traced.h"
#include "codec/cuda/range_args.h"
#include "codec/encode_impl.h"
#include "core/input_limits.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "qvg/cuda.h"

namespace qvg::cuda {
namespace {

/// Carves 256-byte aligned pieces out of one scratch allocation.
class Carver {
 public:
  size_t take(size_t bytes) {
    const size_t off = used_;
    used_ += (bytes + 255) & ~size_t(255);
    return off;
  }
  size_t size() const { return used_; }

 private:
  size_t used_ = 0;
};

}  // namespace

namespace {

/// Events recorded on the encode's stream after each phase (encode_phases): mark(p)
/// closes phase p, which ran since the previous mark (or since start()).
struct PhaseMarks {
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  cudaEvent_t begin = nullptr;
  void record(cudaEvent_t& e, Stream s) {
    QVG_CUDA(cudaEventCreate(&e));
    QVG_CUDA(cudaEventRecord(e, s));
  }
  void start(Stream s) { record(begin, s); }
  void mark(const char* phase, Stream s) {
    marks.emplace_back(phase, nullptr);
    record(marks.back().second, s);
  }
  ~PhaseMarks() {
    if (begin) cudaEventDestroy(begin);
    for (auto& m : marks)
      if (m.second) cudaEventDestroy(m.second);
  }
};

/// What one device encode does beyond encode(): a warm start, a span chunk, the
/// residual energies, the ids trace of the GPU tests, the phase events of the benchmark.
struct EncodeJob {
  const DeviceEncodedTensor* warm = nullptr;  ///< init warm's codebook (else random)
  DeviceSpanCodebook* span = nullptr;         ///< a chunk of this span (encode_span_chunk)
  int add = 0;                                ///< its new centroids per stage (at most)
  double* energy = nullptr;                   ///< G doubles: each group's residual energy
  void* ids_trace = nullptr;                  ///< encode_traced's trace
  PhaseMarks* marks = nullptr;                ///< encode_phases' events
};

void check_codebook(const EncodingLayout& c, Shape4 sh, const CodecConfig& cfg, const char* what) {
  if (c.shape.b != sh.b || c.shape.h != sh.h || c.shape.d != sh.d || c.centroids != cfg.centroids ||
      c.stages != cfg.stages)
    throw InvalidArgument(fmt::format(
        "{} must match B, H, D, centroids and stages of the input ({}, centroids={}, stages={}), got shape {} with "
        "centroids={}, stages={}",
        what, sh.str(), cfg.centroids, cfg.stages, c.shape.str(), c.centroids, c.stages));
}

/// The quantizer's arguments for the arrays of `enc` with K slots (residual inputs
/// and scratch pointers left to the caller).
kernels::QuantizeArgs quantize_args(DeviceEncodedTensor& enc, int K) {
  kernels::QuantizeArgs q = quantize_format(enc, K);
  q.codes = enc.mutable_data(EncodedArray::Codes);
  q.scales = enc.mutable_data(EncodedArray::Scales);
  q.zeros = enc.mutable_data(EncodedArray::Zeros);                                         // nullptr unless asymmetric
  q.scale_factor = reinterpret_cast<float*>(enc.mutable_data(EncodedArray::ScaleFactor));  // nullptr unless two_level
  q.zero_factor = reinterpret_cast<float*>(enc.mutable_data(EncodedArray::ZeroFactor));
  return q;
}

/// InvalidArgument for a head dim the device encoder cannot serve on this device.
void check_encode_head_dim(int64_t D) {
  const int64_t most = kernels::max_encode_head_dim();
  if (D > most)
    throw InvalidArgument(fmt::format(
        "head_dim must be at most {} for the device encoder on this device (its assignment keeps a centroid row of "
        "4 x head_dim bytes in shared memory), got {}",
        most, D));
}

DeviceEncodedTensor encode_job(ConstTensorView x, const CodecConfig& cfg, const EncodeJob& job, Stream stream,
                               Allocator& alloc) {
  if (x.data == nullptr) throw InvalidArgument("encode input is null");
  const Shape4 sh = x.shape;
  const bool warm = cfg.init == Init::Warm && job.warm != nullptr;
  const bool kpp = cfg.init == Init::KMeansPlusPlus;  // else random (init warm without a codebook too)
  if (warm) {
    check_codebook(*job.warm, sh, cfg, "warm-start centroids");
    if (job.warm->centroid_data() == nullptr) throw InvalidArgument("warm-start centroids: the encoding has none");
  }
  DeviceSpanCodebook* span = job.span;
  const int64_t B = sh.b, S = sh.s, H = sh.h, D = sh.d, G = B * H;
  check_encode_head_dim(D);
  const int K = cfg.centroids, iters = cfg.kmeans_iters;
  int added = 0;
  if (span != nullptr) {
    cfg.validate_for_head_dim(D);
    check_codebook(span->book, sh, cfg, "the span's codebook");
    if (span->book.dtype != x.dtype)
      throw InvalidArgument(fmt::format("the span's codebook dtype must be the input's {}, got {}", dtype_name(x.dtype),
                                        dtype_name(span->book.dtype)));
    if (span->book.centroid_data() == nullptr) throw InvalidArgument("the span's codebook holds no centroids");
    if (span->filled < 0 || span->filled > K || job.add < 0)
      throw InvalidArgument(fmt::format("span codebook: filled must be in [0, {}] and add >= 0, got filled={} add={}",
                                        K, span->filled, job.add));
    added = int(std::min<int64_t>({int64_t(job.add), S, int64_t(K - span->filled)}));
    if (span->filled + added < 1)
      throw InvalidArgument("span codebook: no slot would be in use (filled = 0 and add = 0)");
  }
  DeviceEncodedTensor enc = DeviceEncodedTensor::allocate(sh, x.dtype, cfg, stream, alloc,
                                                          span ? EncodedParts::WithoutCentroids : EncodedParts::All);
  // k-means trains K_t centroids per stage (a span chunk: its new ones), k_eff of them real.
  const int K_t = span ? std::max(added, 1) : K;
  const int k_eff = span ? added : int(std::min<int64_t>(K, S));
  const int64_t nb = D / cfg.block_size;
  const int dt = arith_dtype(x.dtype);

  // Stage 0's points are the input itself (kernels::Points over x: r_0 = X, read as
  // fp32 exactly), not an fp32 copy of it, unless a kernel needs them in the residual
  // buffer: a span chunk with later stages (its next stage is subtracted in place), or
  // an input the vector loads cannot read (not 16-byte aligned). The buffer exists for
  // later stages' residuals too.
  const bool direct = !(span != nullptr && cfg.stages > 1) && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  const bool has_r = !direct || cfg.stages > 1;

  Carver cv;
  const int64_t nchunk = (S + kernels::kMeanChunk - 1) / kernels::kMeanChunk;
  const size_t o_r = cv.take(has_r ? size_t(G * S * D) * 4 : 0);
  const size_t o_xb = cv.take(size_t(G * S * D) * 2);
  const size_t o_part = cv.take(size_t(G * nchunk * D) * 8);
  const size_t o_mu = cv.take(size_t(G * D) * 4);
  const size_t o_maxabs = cv.take(size_t(G) * 4);
  const size_t o_idx = cv.take(size_t(G * K_t) * 4);
  const size_t o_c = cv.take(size_t(G * K * D) * 4);
  const size_t o_cb = cv.take(size_t(G * K * D) * 2);
  const size_t o_cn = cv.take(size_t(G * K) * 4);
  const size_t o_stored = cv.take(size_t(G * K * D) * 4);
  const size_t o_sums = cv.take(size_t(G * K_t * D) * 8);
  const size_t o_counts = cv.take(size_t(G * K_t) * 4);
  const size_t o_changed = cv.take(size_t(std::max(iters, 1)) * size_t(G) * 4);
  const size_t o_raws = cv.take(size_t(G * S * nb) * 4);
  const size_t o_rawz = cv.take(cfg.asymmetric ? size_t(G * S * nb) * 4 : 0);
  const size_t o_gmax = cv.take(size_t(2 * G) * 4);
  const size_t o_kpp = cv.take(kpp ? kernels::kmeanspp_scratch_bytes(G, S) : 0);
  const size_t o_energy = cv.take(job.energy != nullptr ? size_t(2 * G) * 8 : 0);
  DeviceBuffer scratch(cv.size(), stream, alloc);
  uint8_t* base = static_cast<uint8_t*>(scratch.data());
  const auto F = [&](size_t off) { return reinterpret_cast<float*>(base + off); };
  float* r = has_r ? F(o_r) : nullptr;
  // the stage's points: the input (stage 0, direct) or r
  kernels::Points pts = direct ? kernels::input_points(x.data, dt, H, S, D) : kernels::residual_points(r, S, D);
  uint16_t* xb = reinterpret_cast<uint16_t*>(base + o_xb);
  double* partial = reinterpret_cast<double*>(base + o_part);
  float* mu = F(o_mu);
  float* maxabs = F(o_maxabs);
  uint32_t* idx = reinterpret_cast<uint32_t*>(base + o_idx);
  float* c = F(o_c);
  uint16_t* cb = reinterpret_cast<uint16_t*>(base + o_cb);
  float* cnorm = F(o_cn);
  float* stored = F(o_stored);
  long long* sums = reinterpret_cast<long long*>(base + o_sums);
  int* counts = reinterpret_cast<int*>(base + o_counts);
  int* changed = reinterpret_cast<int*>(base + o_changed);

  const size_t esz = dtype_size(x.dtype);
  const double stop = 1e-4 * double(S);
  const size_t stage_c = size_t(G * K * D) * esz;  // bytes of one stage's codebook
  const auto warm_stage = [&](int st) {
    return job.warm->centroid_data() + size_t(st) * size_t(G * K * D) * dtype_size(job.warm->dtype);
  };

  // Stage 0's points and mean; each later stage's come from the previous stage's
  // subtraction. The last stage's residual is never written: the quantizer
  // subtracts its stored centroids itself. Stage 0's initial indices (when k-means
  // draws them) are drawn by the gather's launch, beside it: they do not depend on
  // the data (init random only: kmeans++ picks from the stage's centred points).
  kernels::InitDraw draw;
  if (!warm && !kpp && k_eff > 0) {
    draw.idx = idx;
    draw.K = K_t;
    draw.k_eff = k_eff;
    draw.seed = cfg.seed;
    draw.head_offset = cfg.head_offset;
  }
  const auto mark = [&](const char* phase) {
    if (job.marks) job.marks->mark(phase, stream);
  };
  if (job.marks) job.marks->start(stream);
  kernels::gather_points(x.data, dt, B, S, H, D, direct ? nullptr : r, partial, mu, stream, draw);
  const uint8_t* last_ids = nullptr;
  for (int st = 0; st < cfg.stages; ++st) {
    uint8_t* ids = enc.mutable_data(EncodedArray::Ids) + size_t(st) * size_t(G * S);
    QVG_CUDA(cudaMemsetAsync(changed, 0, size_t(std::max(iters, 1)) * size_t(G) * 4, stream));
    QVG_CUDA(cudaMemsetAsync(maxabs, 0, size_t(G) * 4, stream));
    kernels::center_points(pts, mu, G, xb, maxabs, stream);
    mark("centre");
    if (k_eff > 0) {  // k-means: the encoding's K centroids, or a span chunk's new ones
      if (warm)
        kernels::warm_centroids(warm_stage(st), arith_dtype(job.warm->dtype), K, span ? span->filled : 0, K_t, G, D, mu,
                                c, stream);
      else {
        if (kpp)
          kernels::kmeanspp_indices(pts, mu, G, H, K_t, k_eff, cfg.seed, st, cfg.head_offset, base + o_kpp, idx,
                                    stream);
        else if (st > 0 || draw.idx == nullptr)  // stage 0's: drawn by the gather's launch
          kernels::init_indices(G, H, S, K_t, k_eff, cfg.seed, st, cfg.head_offset, idx, stream);
        kernels::init_centroids(pts, mu, idx, G, K_t, k_eff, c, stream);
      }
      mark("init");
      for (int it = 0; it < iters; ++it) {
        kernels::prepare_centroids(c, G, D, K_t, k_eff, cb, cnorm, stream);
        kernels::assign(xb, cb, cnorm, G, S, D, K_t, ids, changed, it, stop, stream);
        mark("assign");
        if (job.ids_trace != nullptr)  // the GPU tests' replay (tests/gpu/encode_replay.h)
          QVG_CUDA(
              cudaMemcpyAsync(static_cast<uint8_t*>(job.ids_trace) + (size_t(st) * iters + size_t(it)) * size_t(G * S),
                              ids, size_t(G * S), cudaMemcpyDeviceToDevice, stream));
        kernels::update_centroids(pts, mu, maxabs, ids, G, S, D, K_t, sums, counts, c, changed, it, stop, stream);
        mark("update");
      }
    }
    if (span == nullptr) {
      void* out_c = enc.mutable_data(EncodedArray::Centroids) + size_t(st) * stage_c;
      kernels::finish_stage(pts, r, c, mu, ids, G, S, D, K, k_eff, dt, out_c, stored, st + 1 == cfg.stages, partial,
                            stream);
    } else {
      // The new centroids into their slots, then every point to the nearest slot in
      // use (assign_to on the host: no update).
      void* book = span->book.mutable_data(EncodedArray::Centroids) + size_t(st) * stage_c;
      if (added > 0) kernels::store_new_centroids(c, mu, dt, K, span->filled, added, G, D, book, stream);
      kernels::book_entries(book, dt, G, K, D, mu, stored, c, stream);
      const int used = span->filled + added;
      kernels::prepare_centroids(c, G, D, K, used, cb, cnorm, stream);
      QVG_CUDA(cudaMemsetAsync(changed, 0, size_t(G) * 4, stream));
      if (used <= S)  // `assign` considers min(K, S) slots: every slot in use
        kernels::assign(xb, cb, cnorm, G, S, D, K, ids, changed, 0, stop, stream);
      else
        kernels::assign_to_slots(xb, cb, cnorm, G, S, K, D, used, ids, stream);
      if (st + 1 < cfg.stages) {
        kernels::subtract_stored_centroids(r, stored, ids, G, S, K, D, stream);
        kernels::group_means(r, G, S, D, mu, stream);
      }
    }
    if (st + 1 < cfg.stages) pts = kernels::residual_points(r, S, D);  // the next stage's points
    last_ids = ids;
    mark("finish");
  }
  kernels::QuantizeArgs q = quantize_args(enc, K);
  q.r = pts;
  q.stored = stored;
  q.ids = last_ids;
  q.raw_s = F(o_raws);
  q.raw_z = cfg.asymmetric ? F(o_rawz) : nullptr;
  q.group_max = F(o_gmax);
  kernels::quantize_residual(q, stream);
  mark("quantize");
  if (cfg.scale_search == ScaleSearch::Mse) {
    kernels::search_scales(q, stream);
    mark("scale search");
  }
  if (job.energy != nullptr)
    kernels::residual_energies(q, reinterpret_cast<unsigned long long*>(base + o_energy), job.energy, stream);
  if (span) span->filled += added;
  return enc;  // `scratch` is freed on `stream`, after the kernels above
}

}  // namespace

DeviceEncodedTensor detail::encode_traced(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc,
                                          void* ids_trace, const DeviceEncodedTensor* warm) {
  EncodeJob job;
  job.ids_trace = ids_trace;
  job.warm = warm;
  return encode_job(x, cfg, job, stream, alloc);
}

DeviceEncodedTensor detail::encode_phases(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc,
                                          EncodePhaseTimes& times) {
  PhaseMarks marks;
  EncodeJob job;
  job.marks = &marks;
  DeviceEncodedTensor enc = encode_job(x, cfg, job, stream, alloc);
  QVG_CUDA(cudaStreamSynchronize(stream));
  times = EncodePhaseTimes{};
  cudaEvent_t prev = marks.begin;
  for (const auto& [name, ev] : marks.marks) {
    float ms = 0;
    QVG_CUDA(cudaEventElapsedTime(&ms, prev, ev));
    prev = ev;
    size_t i = 0;
    while (i < times.names.size() && times.names[i] != name) ++i;
    if (i == times.names.size()) {
      times.names.push_back(name);
      times.ms.push_back(0.0);
    }
    times.ms[i] += double(ms);
  }
  return enc;
}

DeviceEncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc) {
  return encode_job(x, cfg, EncodeJob{}, stream, alloc);
}

DeviceEncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, const DeviceEncodedTensor* warm, Stream stream,
                           Allocator& alloc, double* energy) {
  EncodeJob job;
  job.warm = warm;
  job.energy = energy;
  return encode_job(x, cfg, job, stream, alloc);
}

DeviceEncodedTensor encode_span_chunk(ConstTensorView x, const CodecConfig& cfg, DeviceSpanCodebook& span, int add,
                                      const DeviceEncodedTensor* warm, Stream stream, Allocator& alloc,
                                      double* energy) {
  EncodeJob job;
  job.warm = warm;
  job.span = &span;
  job.add = add;
  job.energy = energy;
  return encode_job(x, cfg, job, stream, alloc);
}

DeviceEncodedTensor encode_refinement(ConstTensorView x, ConstTensorView decoded, const CodecConfig& cfg, Stream stream,
                                      Allocator& alloc) {
  qvg::detail::check_refinement_inputs(x, decoded, cfg);  // the host's checks
  const int64_t n = x.shape.numel();
  DeviceBuffer e(size_t(n) * 4, stream, alloc);  // freed on `stream` after the encode's kernels
  kernels::refinement_errors(x.data, decoded.data, arith_dtype(x.dtype), qvg::detail::refinement_error_limit(), n,
                             static_cast<float*>(e.data()), stream);
  return encode(ConstTensorView{e.data(), DType::F32, x.shape}, cfg, stream, alloc);
}

void add_refinements(const std::vector<DeviceRefineTask>& tasks, Stream stream) {
  std::vector<kernels::DecodeArgs> kt;
  for (const DeviceRefineTask& tk : tasks) {
    if (tk.ref == nullptr) throw InvalidArgument("refinement task without a layer");
    const DeviceEncodedTensor& e = *tk.ref;
    check_layer(e);
    kt.push_back(range_args("refinement", e, e, tk.t0, tk.t1, tk.h0, tk.h1, tk.dst));
  }
  kernels::refine_tasks(kt.data(), int(kt.size()), stream);
}

namespace {

// The first element index of each tensor with a non-finite value or |x| > 1e16 (its
// element count when none): one flag buffer, one copy back, one synchronization.
void check_limits(std::initializer_list<std::pair<ConstTensorView, const char*>> xs, Stream stream, Allocator& alloc) {
  unsigned long long init[2] = {0, 0}, first[2] = {0, 0};
  QVG_CHECK(xs.size() <= 2);
  size_t i = 0;
  bool any = false;
  for (const auto& [x, what] : xs) {
    init[i++] = (unsigned long long)x.shape.numel();
    any = any || x.shape.numel() > 0;
  }
  if (!any) return;
  DeviceBuffer flag(sizeof init, stream, alloc);
  auto* p = static_cast<unsigned long long*>(flag.data());
  // "none found" as every byte 0xFF (no copy from this frame, which a throw below would end)
  QVG_CUDA(cudaMemsetAsync(p, 0xFF, sizeof init, stream));
  i = 0;
  for (const auto& [x, what] : xs) {
    if (x.shape.numel() > 0) kernels::first_out_of_limit(x.data, arith_dtype(x.dtype), x.shape.numel(), p + i, stream);
    ++i;
  }
  QVG_CUDA(cudaMemcpyAsync(first, p, sizeof first, cudaMemcpyDeviceToHost, stream));
  QVG_CUDA(cudaStreamSynchronize(stream));
  i = 0;
  for (const auto& [x, what] : xs) {
    if (first[i] < init[i]) {
      // The CPU's message (check_finite_and_bounded): the value and its [b, t, h, d] index.
      const size_t es = dtype_size(x.dtype);
      unsigned char elem[8] = {};
      QVG_CUDA(cudaMemcpy(elem, static_cast<const unsigned char*>(x.data) + first[i] * es, es, cudaMemcpyDeviceToHost));
      const float v = load_f32(elem, x.dtype, 0);
      throw InvalidArgument(qvg::detail::input_limit_message(what, v, x.shape, int64_t(first[i])));
    }
    ++i;
  }
}

}  // namespace

void check_input_limits(ConstTensorView x, const char* what, Stream stream) {
  check_limits({{x, what}}, stream, default_allocator());
}

void check_input_limits(ConstTensorView a, const char* what_a, ConstTensorView b, const char* what_b, Stream stream,
                        Allocator& alloc) {
  check_limits({{a, what_a}, {b, what_b}}, stream, alloc);
}

}  // namespace qvg::cuda
