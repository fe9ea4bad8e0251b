// The PRQ encoder (spec 1.1, 1.2): per (b, h) group, k-means stages on the
// progressive residuals, then the block-quantized final residual. Groups are
// independent, so the result is the same whatever the thread count.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <memory>

#include <fmt/core.h>

#include "codec/decode_impl.h"
#include "codec/encode_impl.h"
#include "core/exact_sum_impl.h"
#include "core/residual_impl.h"
#include "kernels/kernels.h"
#include "qvg/error.h"

namespace qvg {
namespace detail {

void quantize_residual_group(const float* r, int64_t group, EncodedTensor& enc, ScaleSearch search) {
  namespace R = residual_impl;
  const int64_t S = enc.shape.s, D = enc.shape.d, bs = enc.block_size, nb = D / bs;
  const bool asym = enc.asymmetric;
  const int qmax = R::qmax_of(enc.bits, asym);
  const bool two = enc.scaling == Scaling::TwoLevel;
  const bool fp8 = enc.scale_dtype == ScaleDType::FP8_E4M3;
  const bool divide = two && fp8;  // the stored value is raw / factor

  // Pass 1: raw scales (and zeros) of every block; the group's largest ones.
  // (Block maxima and minima come from the SIMD kernels; the rest is per block.)
  std::vector<float> raw_s(static_cast<size_t>(S * nb)), raw_z(asym ? size_t(S * nb) : 0);
  std::vector<float> hi(asym ? size_t(S * nb) : 0);  // block maxima (asymmetric)
  float max_s = 0, max_z = 0;
  if (!asym) {
    kernels::block_absmax(r, S * nb, bs, raw_s.data());
    for (float& s : raw_s) {
      s = R::raw_scale_sym(s, qmax);
      max_s = std::max(max_s, s);
    }
  } else {
    kernels::block_minmax(r, S * nb, bs, raw_z.data(), hi.data());
    for (size_t i = 0; i < raw_s.size(); ++i) {
      const float s = R::raw_scale_asym(raw_z[i], hi[i], qmax);
      raw_s[i] = s;
      max_s = std::max(max_s, s);
      max_z = std::max(max_z, std::fabs(raw_z[i]));
    }
  }
  // Two-level factors (spec 1.4); 1 with bf16 scales.
  const float g = divide ? R::two_level_factor(max_s) : 1.0f;
  const float gz = divide && asym ? R::two_level_factor(max_z) : 1.0f;
  if (two) {
    enc.scale_factor[size_t(group)] = g;
    if (asym) enc.zero_factor[size_t(group)] = gz;
  }

  // Pass 2: store scales/zeros, then quantize with the stored (effective) values
  // and pack (SIMD kernel).
  const int64_t sbase = group * S * nb;
  std::vector<float> s_eff(raw_s.size()), z_eff(raw_z.size());
  // The scale search (Mse): candidates shrink the block's range (symmetric: [-absmax,
  // absmax]; asymmetric: [lo, hi] about its centre); the factors stay those of the
  // `off` choice, so a candidate's stored values are what the decoder reads.
  // The errors come from the SIMD kernel (the same bits on every target), a tile of
  // blocks per call; the first least one wins. Every candidate is evaluated, those
  // whose stored bits equal the previous one's too (the rule's list skips them): such a
  // candidate has its predecessor's values and, computed alike, its error, so the first
  // least is the rule's choice all the same. (Deduplicating each block cost more than
  // the lanes it saved: a block's 15 candidates fill one vector on AVX-512, two on
  // 8-lane targets.)
  constexpr int64_t kTile = 64;  // blocks per kernel call
  constexpr int kSteps = R::kScaleSearchSteps;
  const bool searching = search == ScaleSearch::Mse;
  constexpr int64_t kStride = kernels::kCandidateStride;
  const size_t tile_blocks = searching ? size_t(std::min<int64_t>(kTile, S * nb)) : 0;
  std::vector<float> cerr(tile_blocks * kSteps);
  // Every candidate of the tile's blocks (SIMD kernel).
  std::vector<uint32_t> all_sb(tile_blocks * kStride), all_zb(all_sb.size());
  std::vector<float> all_se(all_sb.size()), all_ze(all_sb.size());
  for (size_t i = 0; i < raw_s.size(); ++i) {
    const int64_t si = sbase + int64_t(i);
    uint32_t s_bits, z_bits;
    float se, ze;
    if (!searching) {  // the block-maximum rule (spec 1.2)
      s_bits = R::store_format(R::to_store(raw_s[i], divide, g), fp8);
      z_bits = asym ? R::store_format(R::to_store(raw_z[i], divide, gz), fp8) : 0u;
      se = R::effective(R::format_value(s_bits, fp8), g);
      ze = asym ? R::effective(R::format_value(z_bits, fp8), gz) : 0.0f;
    } else {
      const size_t tile0 = i - i % size_t(kTile), k = i - tile0;
      if (k == 0) {  // the tile's candidates and errors, all at once
        const size_t nt = std::min(size_t(kTile), raw_s.size() - tile0);
        kernels::scale_candidates(raw_s.data() + tile0, asym ? raw_z.data() + tile0 : nullptr,
                                  asym ? hi.data() + tile0 : nullptr, int64_t(nt), asym, divide, g, gz, fp8,
                                  all_sb.data(), all_zb.data(), all_se.data(), all_ze.data());
        kernels::block_errors_batch(r + int64_t(tile0) * bs, int64_t(nt), bs, qmax, asym, all_se.data(),
                                    asym ? all_ze.data() : nullptr, kStride, nullptr, cerr.data());
      }
      const size_t o = k * size_t(kStride) + size_t(R::scale_search_best(cerr.data() + k * kSteps, kSteps));
      s_bits = all_sb[o];
      z_bits = asym ? all_zb[o] : 0u;
      se = all_se[o];
      ze = asym ? all_ze[o] : 0.0f;
    }
    R::put_stored(enc.scales.data(), fp8, si, s_bits);
    s_eff[i] = se;
    if (asym) {
      R::put_stored(enc.zeros.data(), fp8, si, z_bits);
      z_eff[i] = ze;
    }
  }
  uint8_t* codes = enc.codes.data() + size_t(group * S * enc.code_bytes_per_token());
  kernels::quantize_rows(r, S, D, bs, enc.bits, asym, s_eff.data(), asym ? z_eff.data() : nullptr, codes);
}

namespace {

/// The refinement errors of x - minus as one fp32 tensor (encode_refinement's
/// definition, spelled out): the slow path, for the input check's message.
Tensor refinement_errors(ConstTensorView x, ConstTensorView minus) {
  const size_t n = size_t(x.shape.numel());
  Tensor e(DType::F32, x.shape);
  std::vector<float> a(n);
  float* ep = static_cast<float*>(e.data());
  convert_to_f32(x.data, x.dtype, a.data(), n);
  convert_to_f32(minus.data, minus.dtype, ep, n);
  const float lim = refinement_error_limit();
  for (size_t i = 0; i < n; ++i) ep[i] = std::clamp(a[i] - ep[i], -lim, lim);
  return e;
}

/// Row t of group (b, h) of a dense [B, S, H, D] tensor as fp32 into `out` (D values).
void gather_row(ConstTensorView x, int64_t b, int64_t t, int64_t h, float* out) {
  const Shape4& sh = x.shape;
  const size_t src = size_t(((b * sh.s + t) * sh.h + h) * sh.d);
  if (x.dtype == DType::F32)
    std::copy_n(static_cast<const float*>(x.data) + src, sh.d, out);
  else
    convert_to_f32(static_cast<const uint8_t*>(x.data) + src * dtype_size(x.dtype), x.dtype, out, size_t(sh.d));
}

/// Prefetches row t of group (b, h) of a dense [B, S, H, D] tensor (its D values). A
/// group's rows lie H * D elements apart (3 KB for Self-Forcing's 12 x 128 bf16), a stride
/// the hardware prefetchers do not follow across pages: without this the gathers wait for
/// memory row by row (a third of a refinement layer's encode). Reads nothing.
[[gnu::always_inline]] inline void prefetch_row(ConstTensorView x, int64_t b, int64_t t, int64_t h) {
  const Shape4& sh = x.shape;
  if (t >= sh.s) return;
  const size_t esz = dtype_size(x.dtype), bytes = size_t(sh.d) * esz;
  const char* p = static_cast<const char*>(x.data) + size_t(((b * sh.s + t) * sh.h + h) * sh.d) * esz;
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 0);
}
/// Rows prefetched ahead of a gather (enough in flight to cover a memory latency).
constexpr int64_t kPrefetchRows = 8;

/// out = clamp(x - y, +-lim) over n values, one fp32 subtraction each (encode_refinement's
/// error); returns whether any is NaN (a flag, not a branch). Written so that GCC
/// vectorizes it: with a bool flag and std::clamp it did not (a scalar compare, setp and
/// minss per element: a quarter of a refinement layer's encode). A NaN error's `out` is
/// unspecified (the caller refuses the input).
bool refinement_error_row(const float* x, const float* y, int64_t n, float lim, float* out) {
  int nan = 0;
  for (int64_t d = 0; d < n; ++d) {
    const float e = x[d] - y[d];
    nan |= int(e != e);
    const float lo = e < -lim ? -lim : e;
    out[d] = lim < lo ? lim : lo;
  }
  return nan != 0;
}

/// An uninitialized buffer that grows on demand (every element is written before it
/// is read; value-initialized vectors would zero megabytes per encode for nothing).
template <class T>
class Scratch {
 public:
  T* get(size_t n) {
    if (n > n_) {
      p_ = std::make_unique_for_overwrite<T[]>(n);
      n_ = n;
    }
    return p_.get();
  }

 private:
  std::unique_ptr<T[]> p_;
  size_t n_ = 0;
};

/// Scratch of one thread of the encoder, reused across the groups it encodes.
struct GroupScratch {
  KMeansWorkspace ws;
  Scratch<float> r, stored;              // a group's points (then residuals); a stage's codebook as fp32
  std::vector<float> warm_c;
  Scratch<float> row;                    // one row as fp32
  Scratch<float> book;                   // a codebook as fp32 (the decoded encoding's)
  Scratch<uint8_t> decoded;              // a group's decoded rows (the decoded encoding's)
  std::vector<const float*> book_ptr;    // per stage
  std::vector<const uint8_t*> ids_ptr;   // per stage
};

/// The encoder over the groups of a [B, S, H, D] shape whose points come from
/// `points(b, h, scratch)`: it writes the group's S x D fp32 points into scratch.r and
/// returns false when one is NaN (only refinement errors can be: the caller throws
/// after the region). Everything else is encode()'s (spec 1.1-1.2): k-means stages,
/// span slots, stats, the residual quantizer; `et` is the encoding's dtype.
/// REQUIRES the arguments validated (encode_with_path's checks).
template <class Points>
EncodedTensor encode_groups(Shape4 sh, DType et, const CodecConfig& cfg, const EncodedTensor* warm, EncodeStats* stats,
                            AssignPath path, SpanCodebook* span, int added, Points&& points, bool& nan_points) {
  const int64_t G = sh.b * sh.h, S = sh.s, D = sh.d, K = cfg.centroids;
  const size_t csz = dtype_size(et);
  EncodedTensor enc = EncodedTensor::allocate(EncodingLayout::of(sh, et, cfg));
  if (stats) {
    stats->iterations.assign(size_t(cfg.stages), std::vector<int>(size_t(G), 0));
    stats->residual_energy = 0;
    stats->residual_elements = G * S * D;
  }
  std::vector<double> energy(size_t(G), 0.0);  // per group, summed in group order below
  const int64_t used = span ? span->filled + added : 0;  // slots a span chunk's points may use

  const Init init = (cfg.init == Init::Warm && warm == nullptr) ? Init::Random : cfg.init;
  const int nthreads = resolve_threads(cfg.threads);
  // Threads go to the groups; with fewer groups than threads, the groups run one
  // after the other and each k-means assignment is split over the threads instead.
  const bool inner = G < nthreads;
  std::exception_ptr failure;
  std::atomic<bool> nan_error{false};
#pragma omp parallel num_threads(inner ? 1 : nthreads)
  {
  GroupScratch sc;
  float* const r = sc.r.get(size_t(S * D));
  float* const stored = sc.stored.get(size_t(K * D));
#pragma omp for schedule(dynamic, 1)
  for (int64_t g = 0; g < G; ++g) {
    try {
      const int64_t b = g / sh.h, h = g % sh.h;
      if (!points(b, h, sc)) {
        nan_error.store(true, std::memory_order_relaxed);
        continue;  // thrown by the caller, after the region
      }
      for (int st = 0; st < cfg.stages; ++st) {
        uint8_t* ids = enc.ids[size_t(st)].data() + size_t(g * S);
        // The stage's codebook: k-means centroids of this encoding (slots [0, K)), or
        // the span's slots with `added` new ones trained here ([filled, filled + added)).
        const int64_t first_new = span ? span->filled : 0;
        const int k_train = span ? added : cfg.centroids;
        uint8_t* cbase = (span ? span->book.centroid[size_t(st)].data() : enc.centroid[size_t(st)].data()) +
                         size_t(g * K * D) * csz;
        bool centred = false;  // sc.ws holds these points' centring (kmeans() made it)
        if (k_train > 0) {
          KMeansParams p;
          p.k = k_train;
          p.iters = cfg.kmeans_iters;
          p.init = init;
          p.seed = cfg.seed;
          p.stage = st;
          p.b = b;
          p.h = h + cfg.head_offset;  // the PRNG stream's head: the global head of a shard
          p.path = path;
          p.threads = inner ? nthreads : 1;
          if (init == Init::Warm) {
            sc.warm_c.resize(size_t(k_train * D));
            for (int64_t i = 0; i < k_train * D; ++i)
              sc.warm_c[size_t(i)] = warm->centroid_at(st, b, h, first_new + i / D, i % D);
            p.warm = sc.warm_c.data();
          }
          KMeansResult km = kmeans(r, S, D, p, sc.ws);
          centred = km.centred;
          if (stats) stats->iterations[size_t(st)][size_t(g)] = km.iterations;
          // Store centroids rounded to the input dtype; subtract the *stored* values.
          convert_from_f32(km.centroids.data(), et, cbase + size_t(first_new * D) * csz, size_t(k_train * D));
          if (!span) std::copy(km.ids.begin(), km.ids.end(), ids);
        }
        convert_to_f32(cbase, et, stored, size_t(K * D));
        if (span)  // every point to the nearest slot in use (old and new centroids)
          assign_to(r, S, D, stored, int(used), ids, path, inner ? nthreads : 1, sc.ws, centred);
        for (int64_t t = 0; t < S; ++t) {
          const float* c = stored + int64_t(ids[t]) * D;
          float* rt = r + t * D;
          for (int64_t d = 0; d < D; ++d) rt[d] = rt[d] - c[d];
        }
      }
      if (stats)  // exact and order-independent (spec 1.1: it decides span breaks)
        energy[size_t(g)] = exact_sum::energy_of([r](int64_t i) { return r[i]; }, S * D);
      quantize_residual_group(r, g, enc, cfg.scale_search);
    } catch (...) {
#pragma omp critical(qvg_encode_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  }
  if (failure) std::rethrow_exception(failure);
  nan_points = nan_error.load();
  if (stats)
    for (double e : energy) stats->residual_energy += e;
  if (span) {
    span->filled += added;
    for (auto& c : enc.centroid) c = std::vector<uint8_t>();  // decoded with the span's codebook
  }
  return enc;
}

/// The shape and codec checks of every encode (InvalidArgument).
void check_encode_shape(Shape4 sh, const CodecConfig& cfg) {
  if (sh.b < 1 || sh.s < 1 || sh.h < 1 || sh.d < 1)
    throw InvalidArgument(fmt::format("input shape must be [B, S, H, D] with every dimension >= 1, got {}", sh.str()));
  cfg.validate_for_head_dim(sh.d);
  if (sh.s > (int64_t(1) << 31) || sh.b * sh.h > (int64_t(1) << 31))
    throw InvalidArgument(fmt::format("input shape {} is too large (tokens and groups must be < 2^31)", sh.str()));
}

}  // namespace

EncodedTensor encode_with_path(ConstTensorView x, const CodecConfig& cfg, const EncodedTensor* warm,
                               EncodeStats* stats, AssignPath path, SpanCodebook* span, int add,
                               const ConstTensorView* minus) {
  const Shape4 sh = x.shape;
  check_encode_shape(sh, cfg);
  auto check_codebook = [&](const EncodedTensor& c, const char* what) {
    if (c.shape.b != sh.b || c.shape.h != sh.h || c.shape.d != sh.d || c.centroids != cfg.centroids ||
        c.stages != cfg.stages || c.centroid.size() != size_t(cfg.stages))
      throw InvalidArgument(fmt::format(
          "{} must match B, H, D, centroids and stages of the input ({}, centroids={}, stages={}), "
          "got shape {} with centroids={}, stages={}",
          what, sh.str(), cfg.centroids, cfg.stages, c.shape.str(), c.centroids, c.stages));
  };
  const int64_t G = sh.b * sh.h, S = sh.s, D = sh.d, K = cfg.centroids;
  // The encoding's dtype (its centroids' storage): the input's, or f32 for refinement
  // errors (encode() of the f32 error tensor).
  const DType et = minus ? DType::F32 : x.dtype;
  const size_t csz = dtype_size(et);
  if (cfg.init == Init::Warm && warm != nullptr) check_codebook(*warm, "warm-start centroids");
  // A span chunk: up to `add` new centroids per stage, in slots [filled, filled + added).
  int added = 0;
  if (span != nullptr) {
    check_codebook(span->book, "the span's codebook");
    if (span->book.dtype != et)
      throw InvalidArgument(fmt::format("the span's codebook dtype must be the input's {}, got {}", dtype_name(et),
                                        dtype_name(span->book.dtype)));
    const size_t want = size_t(G * K * D) * csz;
    for (const auto& c : span->book.centroid)
      if (c.size() != want)
        throw InvalidArgument(fmt::format("the span's codebook arrays must hold {} bytes, got {}", want, c.size()));
    if (span->filled < 0 || span->filled > K || add < 0)
      throw InvalidArgument(fmt::format("span codebook: filled must be in [0, {}] and add >= 0, got filled={} add={}",
                                        K, span->filled, add));
    added = int(std::min<int64_t>({int64_t(add), S, K - span->filled}));
    if (span->filled + added < 1)
      throw InvalidArgument("span codebook: no slot would be in use (filled = 0 and add = 0)");
  }
  // Refinement errors are clamped, so only a NaN error can fail the check: the
  // gather flags it and the error tensor is then checked whole, for its message.
  if (!minus) check_finite_and_bounded(x, "input");
  const float lim = minus ? refinement_error_limit() : 0.0f;
  bool nan = false;
  EncodedTensor enc = encode_groups(
      sh, et, cfg, warm, stats, path, span, added,
      [&](int64_t b, int64_t h, GroupScratch& sc) {
        bool ok = true;
        float* const row = minus ? sc.row.get(size_t(D)) : nullptr;
        float* const r = sc.r.get(size_t(S * D));
        for (int64_t t = 0; t < kPrefetchRows; ++t) {
          prefetch_row(x, b, t, h);
          if (minus) prefetch_row(*minus, b, t, h);
        }
        for (int64_t t = 0; t < S; ++t) {  // the group's S points (fp32, token rows)
          float* rt = r + t * D;
          prefetch_row(x, b, t + kPrefetchRows, h);
          gather_row(x, b, t, h, rt);
          if (minus) {  // the refinement error, one fp32 subtraction, clamped
            prefetch_row(*minus, b, t + kPrefetchRows, h);
            gather_row(*minus, b, t, h, row);
            ok = !refinement_error_row(rt, row, D, lim, rt) && ok;
          }
        }
        return ok;
      },
      nan);
  if (nan) check_finite_and_bounded(refinement_errors(x, *minus).view(), "input");  // throws
  return enc;
}

EncodedTensor encode_refinement_of(ConstTensorView x, const EncodedTensor& enc, const EncodedTensor* codebook,
                                   const CodecConfig& cfg) {
  const Shape4 sh = x.shape;
  if (!(enc.shape == sh) || enc.dtype != x.dtype)
    throw InvalidArgument(fmt::format("encode_refinement_of: the encoding must be of x's shape and dtype ({} {}), got {} {}",
                                      sh.str(), dtype_name(x.dtype), enc.shape.str(), dtype_name(enc.dtype)));
  const EncodedTensor& book = codebook ? *codebook : enc;
  if (book.centroid.size() != size_t(enc.stages) || book.centroids != enc.centroids || book.dtype != enc.dtype)
    throw InvalidArgument("encode_refinement_of: the codebook must hold the encoding's stages and centroids");
  if (cfg.centroids != 1 || cfg.stages != 1)
    throw InvalidArgument(fmt::format(
        "encode_refinement: the config must have one stage of one centroid (refinement_config), got {} x {}",
        cfg.stages, cfg.centroids));
  check_encode_shape(sh, cfg);
  const int64_t S = sh.s, D = sh.d, K = enc.centroids;
  const float lim = refinement_error_limit();
  const size_t esz = dtype_size(x.dtype);
  bool nan = false;
  EncodedTensor layer = encode_groups(
      sh, DType::F32, cfg, nullptr, nullptr, AssignPath::Fast, nullptr, 0,
      [&](int64_t b, int64_t h, GroupScratch& sc) {
        // The group's rows decoded as decode_ranges() decodes them (its codebook as
        // fp32, decode_rows into x's dtype), then e = clamp(x - decoded) row by row.
        const int64_t g = b * sh.h + h;
        float* const cb = sc.book.get(size_t(enc.stages * K * D));
        sc.book_ptr.resize(size_t(enc.stages));
        sc.ids_ptr.resize(size_t(enc.stages));
        for (int st = 0; st < enc.stages; ++st) {
          float* c = cb + size_t(st * K * D);
          convert_to_f32(book.centroid[size_t(st)].data() + size_t(g * K * D) * esz, x.dtype, c, size_t(K * D));
          sc.book_ptr[size_t(st)] = c;
          sc.ids_ptr[size_t(st)] = enc.ids[size_t(st)].data() + size_t(g * S);
        }
        uint8_t* const decoded = sc.decoded.get(size_t(S * D) * esz);
        kernels::DecodeRows job = rows_job(enc, g, 0, S);
        job.ids = sc.ids_ptr.data();
        job.centroids = sc.book_ptr.data();
        job.out = decoded;
        job.out_dtype = x.dtype;
        job.out_token_stride = D;
        kernels::decode_rows(job);
        float* const row = sc.row.get(size_t(D));
        float* const r = sc.r.get(size_t(S * D));
        bool ok = true;
        for (int64_t t = 0; t < kPrefetchRows; ++t) prefetch_row(x, b, t, h);
        for (int64_t t = 0; t < S; ++t) {
          float* rt = r + t * D;
          prefetch_row(x, b, t + kPrefetchRows, h);
          if (x.dtype == DType::BF16) {  // both rows widened and subtracted in one SIMD pass
            const auto* xr = static_cast<const uint16_t*>(x.data) + ((b * S + t) * sh.h + h) * D;
            const auto* dr = reinterpret_cast<const uint16_t*>(decoded) + t * D;
            ok = !kernels::bf16_error_row(xr, dr, size_t(D), lim, rt) && ok;
            continue;
          }
          gather_row(x, b, t, h, rt);
          convert_to_f32(decoded + size_t(t * D) * esz, x.dtype, row, size_t(D));
          ok = !refinement_error_row(rt, row, D, lim, rt) && ok;
        }
        return ok;
      },
      nan);
  if (nan) {  // encode_refinement's own refusal, with its message
    Tensor dec(x.dtype, sh);
    decode(with_codebook(enc, book), dec.view());
    check_finite_and_bounded(refinement_errors(x, dec.view()).view(), "input");
  }
  return layer;
}

}  // namespace detail

EncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, const EncodedTensor* warm, EncodeStats* stats) {
  return detail::encode_with_path(x, cfg, warm, stats, detail::AssignPath::Fast, nullptr);
}

SpanCodebook SpanCodebook::empty(Shape4 shape, DType dtype, const CodecConfig& cfg) {
  SpanCodebook s;
  static_cast<EncodingLayout&>(s.book) = EncodingLayout::of(shape, dtype, cfg);
  const size_t n = size_t(shape.b * shape.h * cfg.centroids * shape.d) * dtype_size(dtype);
  s.book.centroid.assign(size_t(cfg.stages), std::vector<uint8_t>(n, 0));
  return s;
}

EncodedTensor encode_span_chunk(ConstTensorView x, const CodecConfig& cfg, SpanCodebook& span, int add,
                                const EncodedTensor* warm, EncodeStats* stats) {
  return detail::encode_with_path(x, cfg, warm, stats, detail::AssignPath::Fast, &span, add);
}

EncodedTensor with_codebook(const EncodedTensor& part, const EncodedTensor& codebook) {
  EncodedTensor full = part;
  full.centroid = codebook.centroid;
  return full;
}

}  // namespace qvg
