// qvg::cuda::PackedCausalCache: the device-resident packed cache, built into the
// CUDA library. The policy (validation, eviction, spans, view ranges) is
// CachePolicy (src/cache/cache_policy.h), the one the CPU cache runs too; this file
// executes its plans with the CUDA backend (src/kernels/cuda) as the CPU cache
// (src/cache/packed_cache.cpp) executes them with the host codec: raw chunks by
// cudaMemcpy2DAsync, the plan's whole spans by the device encoder (warm started with
// init = warm), incremental chunks by encode_span_chunk against their span's
// codebooks (adaptive breaks measured by the residual energies), refinement layers
// by encode_refinement, windows as src/cache/view_assembly.h assembles them (one
// decode_ranges, refinement layers added in the same pass). Every
// allocation of an update() happens before the policy changes: the steps of an
// advance's PackPlan are executed first (execute), then installed (install).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "cache/cuda/device_copy.h"
#include "cache/cuda/input_guard.h"
#include "cache/packed_state_transfer.h"
#include "cache/snapshot_io.h"
#include "cache/snapshot_records.h"
#include "cache/span_execution.h"
#include "cache/view_assembly.h"
#include "core/file_impl.h"
#include "kernels/cuda/check.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

namespace qvg::cuda {
namespace {

/// A segment's device data, as the CPU cache's (src/cache/packed_cache.cpp): K and V
/// raw ([B, tokens, H, D] dense) or encoded; a chunk of an incremental span holds
/// its encodings without centroids and shares its span's codebooks; a refined chunk
/// also holds its refinement layers.
/// Encodings, codebooks and layers are immutable once installed and held through
/// shared_ptrs, so a fork shares them; raw buffers are a cache's own.
struct SegData {
  DeviceBuffer k_raw, v_raw;
  std::shared_ptr<const DeviceEncodedTensor> k_enc, v_enc;
  std::shared_ptr<const DeviceSpanCodebook> k_book, v_book;  // incremental span chunks only
  std::shared_ptr<const DeviceEncodedTensor> k_ref, v_ref;   // refined chunks only (both or neither)
  /// A chunk that started a span, its fit not measured (no break ratio): its K and V
  /// residual energies per group (2 x G doubles, device), left on the device; the
  /// cache takes them over at install (Impl::open_energies), with the chunk's tokens.
  DeviceBuffer energies;
  int64_t energy_tokens = 0;
};
using Books = qvg::detail::SpanBooks<DeviceSpanCodebook>;

using Policy = qvg::detail::CachePolicy<SegData, Books>;
using Seg = Policy::Segment;

using Executed = qvg::detail::ExecutedPlan<SegData, DeviceSpanCodebook, DeviceEncodedTensor>;
using OpenRun = qvg::detail::OpenRun<DeviceSpanCodebook>;

}  // namespace

using cache_detail::copy2d;

struct PackedCausalCache::Impl {
  const CacheOptions opt;
  const QuantArgs quant;
  Allocator* alloc;
  const size_t esz;
  CodecConfig codec_k, codec_v;  // K's and V's codec settings (per role); valid when quant.enabled()
  Policy pol;
  std::shared_ptr<const DeviceEncodedTensor> warm_k, warm_v;  // codebooks of the last whole encodings (init = warm)
  DeviceBuffer view;                                          // K then V of the last copied view
  detail::InputGuard guard;                                   // the deferred input check (input_guard.h)
  /// The per-group residual energies of the chunk that started the open span, still on
  /// the device (no break ratio: nothing decides by them); the policy's span state holds
  /// 0 for them until a snapshot reads them (resolved_energies). Empty otherwise.
  DeviceBuffer open_energies;
  int64_t open_energy_tokens = 0;

  /// The state of a snapshot: the policy's, with the open span's energies read from
  /// the device when they were left there (synchronizes `s`).
  qvg::detail::PackedStateData snapshot_state(Stream s) const;

  Impl(const CacheOptions& o, const QuantArgs& q, Allocator& a)
      : opt(o), quant(q), alloc(&a), esz(dtype_size(o.dtype)), pol(o, q) {
    if (q.enabled()) {
      codec_k = q.codec_for(CacheRole::Key);
      codec_v = q.codec_for(CacheRole::Value);
      codec_k.head_offset = codec_v.head_offset = o.head_offset;  // a head shard draws the wide cache's PRNG streams
    }
  }

  size_t raw_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }
  const CodecConfig& codec(bool is_k) const { return is_k ? codec_k : codec_v; }

  /// Writes the call's [B, n, h_in, D] rows into a raw [B, n, H, D] segment buffer
  /// at head head0 (B * n rows, one guarded 2D copy: only when the call's input check
  /// passes; else zeros for a new chunk, nothing for a rewrite).
  void write_chunk(ConstTensorView src, void* dst, int64_t head0, bool new_chunk, Stream s) const {
    const int64_t B = src.shape.b, n = src.shape.s, h_in = src.shape.h, D = opt.head_dim, H = opt.heads;
    const size_t row = size_t(h_in * D) * esz;
    guard.copy2d(static_cast<std::byte*>(dst) + size_t(head0 * D) * esz, size_t(H * D) * esz, src.data, row, row,
                 size_t(B * n), new_chunk, s);
  }

  /// A raw chunk's K or V as a device tensor view.
  ConstTensorView raw_view(const Seg& sg, bool is_k) const {
    return {
        (is_k ? sg.data.k_raw : sg.data.v_raw).data(), opt.dtype, {opt.batch, sg.tokens(), opt.heads, opt.head_dim}};
  }

  /// A device encoding's centroids only (a warm-start codebook).
  DeviceEncodedTensor codebooks_of(const DeviceEncodedTensor& e, Stream s) const {
    DeviceEncodedTensor w =
        DeviceEncodedTensor::allocate(e.shape, e.dtype, e.config(), s, *alloc, EncodedParts::CentroidsOnly);
    QVG_CUDA(cudaMemcpyAsync(w.mutable_data(EncodedArray::Centroids), e.centroid_data(), w.nbytes(),
                             cudaMemcpyDeviceToDevice, s));
    return w;
  }

  /// The device encoding of one whole span's K or V (parts concatenated when several).
  DeviceEncodedTensor encode_one(const std::vector<const Seg*>& parts, bool is_k, const DeviceEncodedTensor* warm,
                                 Stream s) const {
    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim;
    const int64_t S = parts.back()->g1 - parts.front()->g0;
    ConstTensorView in{nullptr, opt.dtype, {B, S, H, D}};
    DeviceBuffer concat;  // freed on `s` after encode's kernels (stream order)
    if (parts.size() == 1) {
      in.data = (is_k ? parts[0]->data.k_raw : parts[0]->data.v_raw).data();
    } else {
      concat = DeviceBuffer(raw_bytes(S), s, *alloc);
      const size_t tb = size_t(H * D) * esz;
      int64_t t = 0;
      for (const Seg* p : parts) {
        const DeviceBuffer& src = is_k ? p->data.k_raw : p->data.v_raw;
        copy2d(static_cast<std::byte*>(concat.data()) + size_t(t) * tb, size_t(S) * tb, src.data(),
               size_t(p->tokens()) * tb, size_t(p->tokens()) * tb, size_t(B), s);
        t += p->tokens();
      }
      in.data = concat.data();
    }
    const CodecConfig& c = codec(is_k);
    return encode(in, c, c.init == Init::Warm ? warm : nullptr, s, *alloc);
  }

  /// The residual energies per element of a span chunk's K and V encodes, from the
  /// per-group sums `e` (2 x G doubles, K then V) as the host sums them (groups in
  /// order). Synchronizes `s`: only snapshots and a measured span fit (a break ratio
  /// above 0) ask for them.
  std::pair<double, double> energies(const DeviceBuffer& e, int64_t S, Stream s) const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    QVG_CUDA(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone) throw Unsupported(qvg::detail::span_fit_capture_refusal());
    const int64_t G = opt.batch * opt.heads;
    std::vector<double> h(size_t(2 * G));
    QVG_CUDA(cudaMemcpyAsync(h.data(), e.data(), h.size() * 8, cudaMemcpyDeviceToHost, s));
    QVG_CUDA(cudaStreamSynchronize(s));
    const double elements = double(G * S * opt.head_dim);
    double k = 0, v = 0;
    for (int64_t g = 0; g < G; ++g) {
      k += h[size_t(g)];
      v += h[size_t(G + g)];
    }
    return {elements > 0 ? k / elements : 0.0, elements > 0 ? v / elements : 0.0};
  }

  /// An incremental chunk (phase 2 of its step), as the CPU cache's encode_incremental:
  /// encoded against the open span's codebooks when it may join, joining when it fits
  /// them; else the first chunk of a new span. Changes nothing of the cache.
  void encode_incremental(const Seg& raw, SegData& d, Executed& x, OpenRun& run, const DeviceEncodedTensor* wk_now,
                          const DeviceEncodedTensor* wv_now, Stream s) const {
    const int64_t G = opt.batch * opt.heads;
    DeviceBuffer e(size_t(2 * G) * 8, s, *alloc);
    double* ek = static_cast<double*>(e.data());
    if (x.decisions.may_join()) {
      DeviceSpanCodebook tk = run.k(x)->copy(s, *alloc), tv = run.v(x)->copy(s, *alloc);
      const bool measure = qvg::detail::measures_span_fit(quant);  // else every chunk fits
      DeviceEncodedTensor k =
          encode_span_chunk(raw_view(raw, true), codec_k, tk, pol.later_chunk_slots(codec_k.centroids), nullptr, s,
                            *alloc, measure ? ek : nullptr);
      DeviceEncodedTensor v =
          encode_span_chunk(raw_view(raw, false), codec_v, tv, pol.later_chunk_slots(codec_v.centroids), nullptr, s,
                            *alloc, measure ? ek + G : nullptr);
      bool fits = true;
      if (measure) {
        const auto [k_e, v_e] = energies(e, raw.tokens(), s);
        fits = qvg::detail::fits_open_span(quant, k_e, v_e, run.k_energy, run.v_energy);
      }
      if (fits) {
        qvg::detail::join_open_span(d, x, run, pol.spans().books.k.get(), std::move(tk), std::move(tv), std::move(k),
                                    std::move(v));
        return;
      }
    }
    // A new span: its first chunk trains the first slots of fresh codebooks (warm
    // started, with init = warm, from the previous span's or encoding's codebooks).
    const Shape4 shape{opt.batch, raw.tokens(), opt.heads, opt.head_dim};
    const auto [wk, wv] = qvg::detail::new_span_warm(x, run, wk_now, wv_now, codec_k, codec_v);
    auto book_k = std::make_shared<DeviceSpanCodebook>(DeviceSpanCodebook::empty(shape, opt.dtype, codec_k, s, *alloc));
    auto book_v = std::make_shared<DeviceSpanCodebook>(DeviceSpanCodebook::empty(shape, opt.dtype, codec_v, s, *alloc));
    d.k_enc = std::make_shared<const DeviceEncodedTensor>(encode_span_chunk(
        raw_view(raw, true), codec_k, *book_k, pol.first_chunk_slots(codec_k.centroids), wk, s, *alloc, ek));
    d.v_enc = std::make_shared<const DeviceEncodedTensor>(encode_span_chunk(
        raw_view(raw, false), codec_v, *book_v, pol.first_chunk_slots(codec_v.centroids), wv, s, *alloc, ek + G));
    if (qvg::detail::measures_span_fit(quant)) {  // later chunks of the span are measured against them: now
      const auto [k_e, v_e] = energies(e, raw.tokens(), s);
      qvg::detail::start_span(d, x, run, std::move(book_k), std::move(book_v), k_e, v_e);
      return;
    }
    d.energies = std::move(e);  // read only by a snapshot (resolved_energies): no waiting now
    d.energy_tokens = raw.tokens();
    qvg::detail::start_span(d, x, run, std::move(book_k), std::move(book_v), 0.0, 0.0);
  }

  /// The refinement layers of a just-encoded incremental chunk `d`: its K and V
  /// decoded as the view decodes them (with its span's codebooks as the chunk left
  /// them), and the error encoded (the CPU cache's refine()).
  void refine(const Seg& raw, SegData& d, const DeviceSpanCodebook& book_k, const DeviceSpanCodebook& book_v,
              Stream s) const {
    const int64_t S = raw.tokens(), H = opt.heads, D = opt.head_dim;
    DeviceBuffer dec(raw_bytes(S), s, *alloc);
    for (const bool is_k : {true, false}) {
      const DeviceEncodedTensor& enc = is_k ? *d.k_enc : *d.v_enc;
      const DeviceEncodedTensor& book = (is_k ? book_k : book_v).book;
      DeviceDecodeTask t{&enc, 0, S, 0, H, {dec.data(), opt.dtype, S * H * D, H * D}, &book};
      decode_ranges({t}, s);
      const CodecConfig& c = codec(is_k);
      CodecConfig rc = refinement_config(quant.refine_bits, c.block_size, c.seed, quant.codec.threads);
      rc.head_offset = c.head_offset;
      const ConstTensorView x = raw_view(raw, is_k);
      (is_k ? d.k_ref : d.v_ref) = std::make_shared<const DeviceEncodedTensor>(
          encode_refinement(x, {dec.data(), opt.dtype, x.shape}, rc, s, *alloc));
    }
  }

  void step_done(const SegData&, Stream) const {}  // execute_plan's last backend member (span_execution.h)

  /// Installs an advance: the new chunk `cur` and the executed plan `x`.
  void install(const qvg::detail::PackPlan& pp, SegData cur, Executed&& x) {
    // The unread energies of the last chunk that started a span (the policy's
    // started chunk): the open span's from now on.
    for (SegData& d : x.encoded)
      if (d.energies.size()) {
        open_energies = std::move(d.energies);
        open_energy_tokens = d.energy_tokens;
      }
    qvg::detail::InstallStage<DeviceSpanCodebook, DeviceEncodedTensor> stage(pol, x);
    pol.apply(pp, std::move(cur), std::move(x.encoded), x.decisions, std::move(x.books));
    stage.finish(pol, pp, warm_k, warm_v);
  }

  /// What the cache holds: raw bytes and its references to shared objects (branches).
  qvg::detail::Holdings holdings() const {
    return qvg::detail::holdings_of(pol, [](const DeviceSpanCodebook& b) { return b.book.nbytes(); });
  }

  KVView update(ConstTensorView key, ConstTensorView value, int64_t chunk_start, Stream s,
                std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
    // --- validation: throws, changes nothing ---------------------------------
    guard.raise_published();  // an earlier call's input found out of limits (no waiting)
    const qvg::detail::PackedPlan plan = pol.plan(key, value, chunk_start, head_start, recent_window);
    // The first call: the pinned ring and the flags (after the argument checks: no CUDA call).
    guard.prepare(s, *alloc);
    const qvg::detail::CallPlan& p = plan.call;

    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim, h_in = p.call.heads, n = p.call.n;
    const int64_t head0 = p.call.head_start, T = p.view.tokens;
    const size_t view_bytes = p.copies ? 2 * size_t(B * T * h_in * D) * esz : 0;
    cache_detail::refuse_freeing_under_capture(p.advance, s,
                                               "advance the cache to a new chunk (packing or evicting older chunks)");
    cache_detail::refuse_freeing_under_capture(view.size() != 0 && view.size() != view_bytes, s,
                                               "change the size of the view (its buffer replaced or dropped)");
    // New buffers and the spans' encodings first (an allocation failure here still
    // changes nothing).
    SegData cur;
    std::optional<Executed> executed;
    if (p.advance) {
      cur.k_raw = DeviceBuffer(raw_bytes(n), s, *alloc);
      cur.v_raw = DeviceBuffer(raw_bytes(n), s, *alloc);
      executed.emplace(qvg::detail::execute_plan<Executed>(*this, *plan.pack, s));
    }
    DeviceBuffer new_view;
    if (view_bytes && view.size() != view_bytes) new_view = DeviceBuffer(view_bytes, s, *alloc);
    // --- from here on state changes; only CUDA errors can interrupt it ---------
    // The input check of spec 1, on the device: the chunk's rows are written only if
    // it passes (the advance's encodings above read older chunks only).
    guard.enqueue(key, value, chunk_start, s);
    if (!view_bytes) view = DeviceBuffer();
    if (new_view.size()) view = std::move(new_view);
    if (p.advance) {
      if (h_in != H) {  // zeros in the heads this call does not write
        QVG_CUDA(cudaMemsetAsync(cur.k_raw.data(), 0, cur.k_raw.size(), s));
        QVG_CUDA(cudaMemsetAsync(cur.v_raw.data(), 0, cur.v_raw.size(), s));
      }
      write_chunk(key, cur.k_raw.data(), head0, true, s);
      write_chunk(value, cur.v_raw.data(), head0, true, s);
      install(*plan.pack, std::move(cur), std::move(*executed));
    } else {
      Seg& c_seg = pol.segments().back();
      write_chunk(key, c_seg.data.k_raw.data(), head0, false, s);
      write_chunk(value, c_seg.data.v_raw.data(), head0, false, s);
    }

    KVView out;
    const Seg& cs = pol.segments().back();
    if (!p.copies) {
      out.k =
          qvg::detail::sub_view(qvg::detail::rows_of(static_cast<const void*>(cs.data.k_raw.data()), opt, cs.tokens()),
                                p.view.tail_start - cs.g0, T, head0, h_in);
      out.v =
          qvg::detail::sub_view(qvg::detail::rows_of(static_cast<const void*>(cs.data.v_raw.data()), opt, cs.tokens()),
                                p.view.tail_start - cs.g0, T, head0, h_in);
      out.zero_copy = true;
    } else {
      auto* vk = static_cast<std::byte*>(view.data());
      std::byte* vv = vk + view_bytes / 2;
      // The view as qvg::detail::assemble_view builds it (src/cache/view_assembly.h),
      // with device copies and the device decode.
      struct Backend {
        const Impl& m;
        const qvg::detail::CallPlan& p;
        ConstTensorView key, value;
        std::byte *vk, *vv;
        Stream s;
        size_t out_row() const { return size_t(p.call.heads * m.opt.head_dim) * m.esz; }  // one token of the view
        size_t view_batch() const { return size_t(p.view.tokens) * out_row(); }           // one batch of the view
        DeviceDecodeTarget target(bool is_k, int64_t out_t) const {
          const int64_t hd = p.call.heads * m.opt.head_dim;
          return {(is_k ? vk : vv) + size_t(out_t) * out_row(), m.opt.dtype, p.view.tokens * hd, hd};
        }
        void copy_raw(const Seg& sg, const qvg::detail::ViewPiece& pc) const {
          const size_t seg_row = size_t(m.opt.heads * m.opt.head_dim) * m.esz,
                       seg_batch = size_t(sg.tokens()) * seg_row;
          const size_t src_off = size_t(pc.t0) * seg_row + size_t(p.call.head_start * m.opt.head_dim) * m.esz;
          for (const bool is_k : {true, false})
            for (int64_t b = 0; b < m.opt.batch; ++b)
              copy2d((is_k ? vk : vv) + size_t(b) * view_batch() + size_t(pc.out_t) * out_row(), out_row(),
                     static_cast<const std::byte*>((is_k ? sg.data.k_raw : sg.data.v_raw).data()) +
                         size_t(b) * seg_batch + src_off,
                     seg_row, out_row(), size_t(pc.t1 - pc.t0), s);
        }
        void copy_chunk() const {  // the call's own chunk is the view's last n tokens: copied from the input
          const size_t chunk = size_t(p.call.n) * out_row(), at = size_t(p.view.tokens - p.call.n) * out_row();
          copy2d(vk + at, view_batch(), key.data, chunk, chunk, size_t(m.opt.batch), s);
          copy2d(vv + at, view_batch(), value.data, chunk, chunk, size_t(m.opt.batch), s);
        }
        void decode(const std::vector<DeviceDecodeTask>& tasks) const { decode_ranges(tasks, s); }
      } be{*this, p, key, value, vk, vv, s};
      qvg::detail::assemble_view<DeviceDecodeTask>(pol.segments(), plan, be);
      out.k = qvg::detail::dense_view({vk, opt.dtype, B, T, h_in, D});
      out.v = qvg::detail::dense_view({vv, opt.dtype, B, T, h_in, D});
    }
    out.local_start_index = T - n;
    out.local_end_index = T;
    out.visible_local_end = pol.local_end();
    out.visible_global_end = pol.global_end();
    return out;
  }
};

PackedCausalCache::PackedCausalCache(const CacheOptions& options, const QuantArgs& quant, Allocator& alloc)
    : CacheDims(options) {
  qvg::detail::validate_options(options);
  if (options.allow_growth)
    throw Unsupported("allow_growth must be false for the packed cache (its segments never grow), got true");
  if (options.view_scratch)
    throw Unsupported(
        "view_scratch must be null for the device packed cache (a ViewScratch is host memory; the cache owns a "
        "device view buffer), got a shared ViewScratch");
  if (quant.enabled())
    quant.validate_for_head_dim(options.head_dim);
  else
    quant.validate();
  impl_ = std::make_unique<Impl>(options, quant, alloc);
}

PackedCausalCache::~PackedCausalCache() = default;
PackedCausalCache::PackedCausalCache(PackedCausalCache&&) noexcept = default;
PackedCausalCache& PackedCausalCache::operator=(PackedCausalCache&&) noexcept = default;

KVView PackedCausalCache::update(ConstTensorView key, ConstTensorView value, int64_t current_chunk_start, Stream stream,
                                 std::optional<int64_t> cache_head_start, std::optional<int64_t> recent_window_tokens) {
  return impl_->update(key, value, current_chunk_start, stream, cache_head_start, recent_window_tokens);
}

void PackedCausalCache::reset_indices() {
  impl_->pol.reset();
  impl_->warm_k.reset();
  impl_->warm_v.reset();
  impl_->view = DeviceBuffer();
  impl_->open_energies = DeviceBuffer();
}

void PackedCausalCache::check(Stream stream) {
  impl_->guard.wait_and_raise(stream);
}

size_t PackedCausalCache::resident_nbytes() const {
  return impl_->holdings().split().first;
}
size_t PackedCausalCache::shared_nbytes() const {
  return impl_->holdings().split().second;
}

PackedCausalCache::PackedCausalCache(std::unique_ptr<Impl> impl) : CacheDims(impl->opt), impl_(std::move(impl)) {}

PackedCausalCache PackedCausalCache::fork(Stream stream) {
  const Impl& m = *impl_;
  impl_->guard.raise_published();  // an earlier call's input found out of limits (no waiting)
  auto f = std::make_unique<Impl>(m.opt, m.quant, *m.alloc);
  const auto copy = [&](const DeviceBuffer& b) {
    DeviceBuffer c(b.size(), stream, *m.alloc);
    copy2d(c.data(), b.size(), b.data(), b.size(), b.size(), 1, stream);
    return c;
  };
  f->pol.restore(qvg::detail::forked_segments(m.pol, copy), m.pol.global_end(), m.pol.chunk_tokens(), m.pol.spans());
  f->warm_k = m.warm_k;
  f->warm_v = m.warm_v;
  if (m.open_energies.size()) f->open_energies = copy(m.open_energies);
  f->open_energy_tokens = m.open_energy_tokens;
  return PackedCausalCache(std::move(f));
}
size_t PackedCausalCache::allocated_nbytes() const {
  size_t n = 0;
  int64_t last_span = -1;
  for (const Seg& s : impl_->pol.segments()) {
    n += s.packed ? s.data.k_enc->allocated_bytes() + s.data.v_enc->allocated_bytes()
                  : s.data.k_raw.size() + s.data.v_raw.size();
    if (s.data.k_ref) n += s.data.k_ref->allocated_bytes() + s.data.v_ref->allocated_bytes();
    if (s.span >= 0 && s.span != last_span)
      n += s.data.k_book->book.allocated_bytes() + s.data.v_book->book.allocated_bytes();
    last_span = s.span;
  }
  return n;
}
int64_t PackedCausalCache::span_breaks() const {
  return impl_->pol.spans().breaks;
}
size_t PackedCausalCache::warm_state_nbytes() const {
  return (impl_->warm_k ? impl_->warm_k->nbytes() : 0) + (impl_->warm_v ? impl_->warm_v->nbytes() : 0);
}
size_t PackedCausalCache::view_buffer_nbytes() const {
  return impl_->view.size();
}
DeviceBuffer PackedCausalCache::release_view_buffer() {
  return std::move(impl_->view);
}
int64_t PackedCausalCache::global_end() const {
  return impl_->pol.global_end();
}
int64_t PackedCausalCache::local_end() const {
  return impl_->pol.local_end();
}
int64_t PackedCausalCache::cache_size() const {
  return impl_->opt.cache_size;
}
int64_t PackedCausalCache::attention_window_size() const {
  return impl_->opt.window();
}
const QuantArgs& PackedCausalCache::quant_args() const {
  return impl_->quant;
}
std::optional<int64_t> PackedCausalCache::chunk_tokens() const {
  return impl_->pol.chunk_tokens();
}
size_t PackedCausalCache::num_segments() const {
  return impl_->pol.segments().size();
}

// ---- snapshots: the state through host memory, the CPU caches' records -------------

namespace {

/// Device to host copies of a cache's payloads (each synchronizes `s`).
struct Down {
  Stream s;
  AlignedBuffer raw(const DeviceBuffer& b) const {
    AlignedBuffer h = AlignedBuffer::uninitialized(b.size());
    if (b.size()) QVG_CUDA(cudaMemcpyAsync(h.data(), b.data(), b.size(), cudaMemcpyDeviceToHost, s));
    QVG_CUDA(cudaStreamSynchronize(s));
    return h;
  }
  EncodedTensor enc(const DeviceEncodedTensor& e) const { return e.download(s); }
  SpanCodebook book(const DeviceSpanCodebook& b) const { return b.download(s); }
};
/// Host to device copies on `s` (the encodings' uploads synchronize; restored() waits for
/// the raw copies before the host state can be freed).
struct Up {
  Stream s;
  Allocator* alloc;
  DeviceBuffer raw(const AlignedBuffer& h) const {
    DeviceBuffer b(h.size(), s, *alloc);
    if (h.size()) QVG_CUDA(cudaMemcpyAsync(b.data(), h.data(), h.size(), cudaMemcpyHostToDevice, s));
    return b;
  }
  DeviceEncodedTensor enc(const EncodedTensor& e) const { return DeviceEncodedTensor::upload(e, s, *alloc); }
  DeviceSpanCodebook book(const SpanCodebook& b) const { return DeviceSpanCodebook::upload(b, s, *alloc); }
};

}  // namespace

qvg::detail::PackedStateData PackedCausalCache::Impl::snapshot_state(Stream s) const {
  qvg::detail::PackedStateData d = qvg::detail::state_data_of(pol, opt, quant, warm_k.get(), warm_v.get(), Down{s});
  if (open_energies.size()) {
    const auto [k_e, v_e] = energies(open_energies, open_energy_tokens, s);
    d.span_state.open_k_energy = k_e;
    d.span_state.open_v_energy = v_e;
  }
  return d;
}

std::vector<uint8_t> PackedCausalCache::snapshot_bytes(Stream stream) const {
  const qvg::detail::PackedStateData d = impl_->snapshot_state(stream);
  const qvg::detail::snap::Written w = qvg::detail::snap::write_packed(qvg::detail::ref_of(d, "cuda"));
  return qvg::detail::snap::snapshot_file_bytes(w.sections, w.minor);
}

void PackedCausalCache::save(const std::filesystem::path& path, Stream stream) const {
  const qvg::detail::PackedStateData d = impl_->snapshot_state(stream);
  const qvg::detail::snap::Written w = qvg::detail::snap::write_packed(qvg::detail::ref_of(d, "cuda"));
  qvg::detail::snap::write_snapshot(path, w.sections, w.minor);
}

PackedCausalCache PackedCausalCache::restored(const qvg::detail::PackedStateData& d, Stream stream, Allocator& alloc) {
  PackedCausalCache c(d.options, d.quant, alloc);  // the device cache's own checks (view_scratch, allow_growth)
  auto r = qvg::detail::restore_state<SegData, Books, DeviceEncodedTensor>(d, Up{stream, &alloc});
  c.impl_->pol.restore(std::move(r.segments), d.global_end, d.chunk_tokens, std::move(r.spans));
  if (r.warm_k) c.impl_->warm_k = std::make_shared<const DeviceEncodedTensor>(std::move(*r.warm_k));
  if (r.warm_v) c.impl_->warm_v = std::make_shared<const DeviceEncodedTensor>(std::move(*r.warm_v));
  // `d` may be freed on return: a copy from pageable memory is not promised to have read
  // its source when cudaMemcpyAsync returns.
  QVG_CUDA(cudaStreamSynchronize(stream));
  return c;
}

PackedCausalCache PackedCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                         const SnapshotExpectation& expect, Stream stream,
                                                         Allocator& alloc) {
  return restored(qvg::detail::snap::read_packed(qvg::detail::snap::MemorySource(bytes), expect), stream, alloc);
}

PackedCausalCache PackedCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect,
                                          Stream stream, Allocator& alloc) {
  return qvg::detail::with_path(path, [&] {
    const qvg::detail::snap::FileSource src(path);
    return restored(qvg::detail::snap::read_packed(src, expect), stream, alloc);
  });
}

PackedCausalCache::SegmentInfo PackedCausalCache::segment(size_t i) const {
  const auto& segs = impl_->pol.segments();
  if (i >= segs.size())
    throw InvalidArgument(fmt::format("segment index i must be < num_segments() = {}, got {}", segs.size(), i));
  return qvg::detail::describe_segment<DeviceEncodedTensor>(impl_->pol, i, impl_->opt);
}

}  // namespace qvg::cuda
