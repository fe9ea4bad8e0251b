// PackedCausalCache (spec 4). update() = plan (validation and the PackedPlan of
// src/cache/cache_policy.h: throws, no state change) + apply (write the chunk,
// execute the plan's encodings, install them, build the view).
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "cache/plan_access.h"
#include "cache/snapshot_state.h"
#include "cache/span_execution.h"
#include "cache/view_assembly.h"
#include "codec/encode_impl.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"

namespace qvg {
namespace {

// A segment's bytes: raw [B, g1 - g0, H, D] K and V, or their encodings. A chunk
// of an incremental span holds its data arrays (k_enc, v_enc without centroids)
// and shares its span's codebooks (k_book, v_book: all K slots allocated, filled
// chunk by chunk) with the span's other chunks.
// A chunk among the newest encoded ones (QuantArgs' refinement count) also holds its refinement
// layers (k_ref, v_ref: encode_refinement of its decoded K and V).
// Encodings, codebooks and layers are immutable once installed and held through
// shared_ptrs, so a fork shares them (cache.h, "Branches"); raw buffers are a cache's own.
struct SegData {
  AlignedBuffer k_raw, v_raw;                          // raw
  std::shared_ptr<const EncodedTensor> k_enc, v_enc;   // packed
  std::shared_ptr<const SpanCodebook> k_book, v_book;  // incremental span chunks only
  std::shared_ptr<const EncodedTensor> k_ref, v_ref;   // refined chunks only (both or neither)
};
using Books = detail::SpanBooks<SpanCodebook>;
using Policy = detail::CachePolicy<SegData, Books>;
using Segment = Policy::Segment;

size_t codebook_nbytes(const EncodedTensor& e) {
  size_t n = 0;
  for (const auto& c : e.centroid) n += c.size();
  return n;
}

/// Residual energy per element of one encode (0 when there are no elements).
double energy_per_element(const EncodeStats& s) {
  return s.residual_elements > 0 ? s.residual_energy / double(s.residual_elements) : 0.0;
}

/// An encoded step's bytes: its encodings and refinement layers (not its span's
/// codebooks).
size_t data_bytes(const SegData& d) {
  size_t n = d.k_enc->nbytes() + d.v_enc->nbytes();
  if (d.k_ref) n += d.k_ref->nbytes() + d.v_ref->nbytes();
  return n;
}

/// A held object as an optional copy (the tests' debug state holds values).
template <class T>
std::optional<T> opt_of(const std::shared_ptr<const T>& p) {
  return p ? std::optional<T>(*p) : std::nullopt;
}

using Executed = detail::ExecutedPlan<SegData, SpanCodebook, EncodedTensor>;  // installed by Impl::install
using OpenRun = detail::OpenRun<SpanCodebook>;

}  // namespace

struct PackedCausalCache::Impl {
  const CacheOptions opt;
  const QuantArgs quant;
  const size_t esz;
  const int64_t capacity, window;
  CodecConfig codec_k, codec_v;  // K's and V's codec settings (per role); valid when quant.enabled()

  // The segments (global order; the last is the current chunk), their policy and
  // the open incremental span (codebooks, reference energies) with the breaks.
  Policy pol;
  std::shared_ptr<const EncodedTensor> warm_k, warm_v;  // codebooks of the last encodings (init = warm)
  detail::PackOutcome last_advance;                     // what the last advance encoded (the simulator reads it)
  std::shared_ptr<ViewScratch> scratch;                 // K then V of the last copied view (maybe shared)
  size_t view_used = 0;                                 // bytes of it the last view uses (0: zero-copy)
  size_t peak_transient = 0;

  Impl(const CacheOptions& o, const QuantArgs& q)
      : opt(o), quant(q), esz(dtype_size(o.dtype)), capacity(o.cache_size), window(o.window()), pol(o, q) {
    scratch = o.view_scratch ? o.view_scratch : std::make_shared<ViewScratch>();
    if (q.enabled()) {
      codec_k = q.codec_for(CacheRole::Key);
      codec_v = q.codec_for(CacheRole::Value);
      codec_k.head_offset = codec_v.head_offset = o.head_offset;  // a head shard draws the wide cache's PRNG streams
    }
  }

  size_t raw_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }

  /// Validation of the call and what it does (no state change): the policy's
  /// plan, then the values, then (an advance that encodes) the stored chunks it will
  /// encode.
  detail::PackedPlan plan(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                          std::optional<int64_t> head_start, std::optional<int64_t> recent_window) const {
    detail::PackedPlan p = pol.plan(key, value, chunk_start, head_start, recent_window);
    detail::check_values(key, value);
    if (p.pack) check_chunks_to_encode(*p.pack);
    return p;
  }

  /// The raw chunks an advance's plan encodes must be encodable (finite, |x| <= 1e16,
  /// as every input was when it was written). They can only have become otherwise
  /// through a zero-copy view this cache lent (KVView::zero_copy aliases the stored
  /// chunk; cache.h, "Stored data written through a lent view"). The plan's steps name
  /// exactly the segments execute() will encode. Throws InvalidArgument naming the
  /// stored chunk; no state changes.
  void check_chunks_to_encode(const detail::PackPlan& pack) const {
    const std::vector<Segment>& segs = pol.segments();
    for (const detail::EncodeStep& step : pack.encodes)
      for (size_t i = step.first; i < step.first + step.count; ++i) {
        QVG_CHECK(i < segs.size() && !segs[i].packed);  // the call's new chunk is current: never encoded now
        check_stored_chunk(segs[i], i + 1 == segs.size());
      }
  }

  void check_stored_chunk(const Segment& s, bool current) const {
    for (const bool is_k : {true, false}) {
      try {
        check_finite_and_bounded(raw_view(s, is_k),
                                 fmt::format("the stored {} of chunk [{}, {})", is_k ? "key" : "value", s.g0, s.g1));
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format(
            "{} (index within the chunk): it was written through a zero-copy view this cache lent (update() "
            "returned k/v aliasing the stored chunk), and this advance would encode it; nothing was changed. Write "
            "finite values into the chunk ({}) or call reset_indices()",
            e.what(),
            current ? fmt::format("a rewrite at current_chunk_start = {}, or through the view", s.g0)
                    : std::string("through the view")));
      }
    }
  }

  // --- pack ------------------------------------------------------------------
  /// One role of a whole span (`parts`, concatenated when several), warm started
  /// from `warm` with init = warm.
  EncodedTensor encode_one(const std::vector<const Segment*>& parts, bool is_k, const EncodedTensor* warm,
                           detail::TransientMeter& meter) const {
    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim;
    const int64_t S = parts.back()->g1 - parts.front()->g0;
    ConstTensorView in{nullptr, opt.dtype, {B, S, H, D}};
    AlignedBuffer concat;
    if (parts.size() == 1) {
      in.data = (is_k ? parts[0]->data.k_raw : parts[0]->data.v_raw).data();
    } else {
      concat = AlignedBuffer(raw_bytes(S));
      meter.add(concat.size());
      const size_t tb = size_t(H * D) * esz;
      for (int64_t b = 0; b < B; ++b) {
        int64_t t = 0;
        for (const Segment* s : parts) {
          const AlignedBuffer& src = is_k ? s->data.k_raw : s->data.v_raw;
          std::memcpy(concat.data() + size_t(b * S + t) * tb, src.data() + size_t(b * s->tokens()) * tb,
                      size_t(s->tokens()) * tb);
          t += s->tokens();
        }
      }
      in.data = concat.data();
    }
    const CodecConfig& codec = is_k ? codec_k : codec_v;
    EncodedTensor enc = encode(in, codec, codec.init == Init::Warm ? warm : nullptr);
    meter.add(enc.nbytes());
    if (concat.size()) meter.sub(concat.size());
    return enc;
  }

  /// A raw chunk's K or V as a tensor view.
  ConstTensorView raw_view(const Segment& s, bool is_k) const {
    return {(is_k ? s.data.k_raw : s.data.v_raw).data(), opt.dtype, {opt.batch, s.tokens(), opt.heads, opt.head_dim}};
  }

  /// An incremental chunk (phase 2 of its step): encoded against the open span's
  /// codebooks when it may join, joining when it fits them (fits_open_span); else
  /// the first chunk of a new span. Fills `d`, records the decision in x.decisions
  /// and moves `run` on; changes nothing of the cache.
  void encode_incremental(const Segment& raw, SegData& d, Executed& x, OpenRun& run, const EncodedTensor* warm_k_now,
                          const EncodedTensor* warm_v_now, detail::TransientMeter& meter) const {
    if (x.decisions.may_join()) {
      // Encoded against copies of the span's codebooks: they change only if the
      // chunk joins the span.
      SpanCodebook tk = *run.k(x), tv = *run.v(x);
      const size_t trial = codebook_nbytes(tk.book) + codebook_nbytes(tv.book);
      meter.add(trial);
      // The residual energies only when they decide (measures_span_fit; else every
      // chunk fits): measuring them is two more passes over the chunk's residual.
      const bool measure = detail::measures_span_fit(quant);
      EncodeStats sk, sv;
      EncodedTensor k = encode_span_chunk(raw_view(raw, true), codec_k, tk, pol.later_chunk_slots(codec_k.centroids),
                                          nullptr, measure ? &sk : nullptr);
      EncodedTensor v = encode_span_chunk(raw_view(raw, false), codec_v, tv, pol.later_chunk_slots(codec_v.centroids),
                                          nullptr, measure ? &sv : nullptr);
      if (detail::fits_open_span(quant, energy_per_element(sk), energy_per_element(sv), run.k_energy, run.v_energy)) {
        detail::join_open_span(d, x, run, pol.spans().books.k.get(), std::move(tk), std::move(tv), std::move(k),
                               std::move(v));
        meter.add(data_bytes(d));
        meter.sub(trial);
        return;
      }
      meter.sub(trial);  // the chunk does not fit the open span's codebook: a new span
    }
    // A new span: its first chunk trains the first slots of fresh codebooks (warm
    // started, with init = warm, from the previous span's or encoding's codebooks);
    // its residual energy is the reference later chunks are compared with.
    const Shape4 shape{opt.batch, raw.tokens(), opt.heads, opt.head_dim};
    const auto [wk, wv] = detail::new_span_warm(x, run, warm_k_now, warm_v_now, codec_k, codec_v);
    auto book_k = std::make_shared<SpanCodebook>(SpanCodebook::empty(shape, opt.dtype, codec_k));
    auto book_v = std::make_shared<SpanCodebook>(SpanCodebook::empty(shape, opt.dtype, codec_v));
    meter.add(codebook_nbytes(book_k->book) + codebook_nbytes(book_v->book));
    EncodeStats fk, fv;
    d.k_enc = std::make_shared<const EncodedTensor>(
        encode_span_chunk(raw_view(raw, true), codec_k, *book_k, pol.first_chunk_slots(codec_k.centroids), wk, &fk));
    d.v_enc = std::make_shared<const EncodedTensor>(
        encode_span_chunk(raw_view(raw, false), codec_v, *book_v, pol.first_chunk_slots(codec_v.centroids), wv, &fv));
    meter.add(data_bytes(d));
    detail::start_span(d, x, run, std::move(book_k), std::move(book_v), energy_per_element(fk), energy_per_element(fv));
  }

  /// The refinement layers of a just-encoded incremental chunk `d` (refinement
  /// on): the error of its K and V as the view decodes them (with its span's codebooks
  /// `book_k`, `book_v` as the chunk left them), encoded group by group as each group
  /// is decoded (encode_refinement_of: no decoded copy of the chunk).
  void refine(const Segment& raw, SegData& d, const SpanCodebook& book_k, const SpanCodebook& book_v,
              detail::TransientMeter& meter) const {
    for (const bool is_k : {true, false}) {
      const CodecConfig rc = refinement_config(quant, is_k ? codec_k : codec_v);
      EncodedTensor r = detail::encode_refinement_of(raw_view(raw, is_k), is_k ? *d.k_enc : *d.v_enc,
                                                     &(is_k ? book_k : book_v).book, rc);
      meter.add(r.nbytes());
      (is_k ? d.k_ref : d.v_ref) = std::make_shared<const EncodedTensor>(std::move(r));
    }
  }

  /// execute_plan's remaining backend members (span_execution.h).
  EncodedTensor codebooks_of(const EncodedTensor& e, detail::TransientMeter&) const { return e.codebooks_only(); }
  void step_done(const SegData& d, detail::TransientMeter& meter) const {
    meter.sub(data_bytes(d));  // resident from here on; the raw chunks are gone
  }

  /// Installs an advance: the new chunk `cur` and the executed plan `x`. Only
  /// std::bad_alloc can occur, inside pol.apply() before anything changes.
  void install(const detail::PackPlan& pp, SegData cur, Executed&& x) {
    detail::InstallStage<SpanCodebook, EncodedTensor> stage(pol, x);
    pol.apply(pp, std::move(cur), std::move(x.encoded), x.decisions, std::move(x.books));
    // --- from here on nothing throws ---
    stage.finish(pol, pp, warm_k, warm_v);
  }

  /// What the cache holds: raw bytes and its references to shared objects (branches).
  detail::Holdings holdings() const {
    return detail::holdings_of(pol, [](const SpanCodebook& b) { return codebook_nbytes(b.book); });
  }

  /// A fork's state: the same policy state, raw buffers copied, the rest shared.
  std::unique_ptr<Impl> forked(std::shared_ptr<ViewScratch> view_scratch) const {
    CacheOptions o = opt;
    o.view_scratch = std::move(view_scratch);
    auto f = std::make_unique<Impl>(o, quant);
    const auto copy_raw = [](const AlignedBuffer& b) {
      AlignedBuffer c = AlignedBuffer::uninitialized(b.size());
      if (b.size()) std::memcpy(c.data(), b.data(), b.size());
      return c;
    };
    f->pol.restore(detail::forked_segments(pol, copy_raw), pol.global_end(), pol.chunk_tokens(), pol.spans());
    f->warm_k = warm_k;
    f->warm_v = warm_v;
    return f;
  }

  // --- apply -----------------------------------------------------------------
  /// `held`: bytes the call already holds (copies of an aliased input).
  KVView apply(const detail::PackedPlan& plan, ConstTensorView key, ConstTensorView value, size_t held) {
    const detail::CallPlan& p = plan.call;
    detail::TransientMeter meter;
    meter.add(held);
    const int64_t B = opt.batch, D = opt.head_dim, h_in = p.call.heads, head0 = p.call.head_start;
    // View = [0, sink_end) ++ [tail_start, end) in global tokens (the policy's
    // layout); a single range inside the current chunk is returned without a copy.
    const int64_t T = p.view.tokens;
    const size_t view_bytes = p.copies ? 2 * size_t(B * T * h_in * D) * esz : 0;
    // The view buffer is kept between calls (no fresh pages per call) and only grows:
    // it is freed before it grows (never held twice) and by an advance that encodes
    // when unshared (lower peak while encoding); a shared one is kept for the other
    // caches that use it.
    const size_t had = scratch->size();
    if (had < view_bytes || (p.advance && quant.enabled() && scratch.use_count() == 1)) scratch->release();
    meter.add(scratch->size());  // kept for reuse: held through the call

    std::vector<Segment>& segs = pol.segments();
    auto k_rows = [&](Segment& s) { return detail::rows_of(s.data.k_raw.data(), opt, s.tokens()); };
    auto v_rows = [&](Segment& s) { return detail::rows_of(s.data.v_raw.data(), opt, s.tokens()); };
    if (p.advance) {
      SegData cur;
      // Zeros in heads this call does not write (else every byte is written below).
      const auto chunk_buffer = [&] {
        return h_in == opt.heads ? AlignedBuffer::uninitialized(raw_bytes(p.call.n))
                                 : AlignedBuffer(raw_bytes(p.call.n));
      };
      cur.k_raw = chunk_buffer();
      cur.v_raw = chunk_buffer();
      detail::write_rows(key, {detail::rows_of(cur.k_raw.data(), opt, p.call.n), 0, head0});
      detail::write_rows(value, {detail::rows_of(cur.v_raw.data(), opt, p.call.n), 0, head0});
      Executed x = detail::execute_plan<Executed>(*this, *plan.pack, meter);
      detail::PackOutcome done{plan.pack->encodes, x.decisions.decisions()};
      // --- from here on state changes; only std::bad_alloc can still occur, first ---
      install(*plan.pack, std::move(cur), std::move(x));
      last_advance = std::move(done);
    } else if (!p.copies) {
      Segment& cur = segs.back();
      detail::write_rows(key, {k_rows(cur), 0, head0});
      detail::write_rows(value, {v_rows(cur), 0, head0});
    }  // else: written below together with the view (one read of the input)

    KVView out;
    Segment& cur = segs.back();
    if (!p.copies) {
      out.k = detail::sub_view(k_rows(cur), p.view.tail_start - cur.g0, T, head0, h_in);
      out.v = detail::sub_view(v_rows(cur), p.view.tail_start - cur.g0, T, head0, h_in);
      out.zero_copy = true;
      view_used = 0;
    } else {
      if (scratch->size() < view_bytes) {
        scratch->resize(ViewScratch::grown_size(had, view_bytes, 2 * size_t(B * window * h_in * D) * esz));
        meter.add(scratch->size());
      }
      view_used = view_bytes;
      const detail::Rows vk{scratch->data(), opt.dtype, B, T, h_in, D};
      const detail::Rows vv{scratch->data() + view_bytes / 2, opt.dtype, B, T, h_in, D};
      // Raw segments are copied at once; packed ranges (refined chunks' layers
      // included) are decoded in one parallel pass straight into the view. The
      // current chunk — always the view's last n tokens, and exactly the call's
      // key/value rows — is copied from the input, not re-read from its segment.
      struct Backend {
        const Impl& m;
        const detail::CallPlan& p;
        ConstTensorView key, value;
        const detail::Rows &vk, &vv;
        Segment& cur;
        DecodeTarget target(bool is_k, int64_t out_t) const {
          const detail::Rows& r = is_k ? vk : vv;
          return {r.row(0, out_t, 0), r.dtype, r.tokens * r.heads * r.dim, r.heads * r.dim};
        }
        void copy_raw(const Segment& s, const detail::ViewPiece& pc) const {
          for (const bool is_k : {true, false})
            detail::gather_rows(detail::rows_of((is_k ? s.data.k_raw : s.data.v_raw).data(), m.opt, s.tokens()), pc.t0,
                                pc.t1, p.call.head_start, {is_k ? vk : vv, pc.out_t, 0});
        }
        void copy_chunk() const {
          const int64_t at = vk.tokens - p.call.n;  // the call's chunk: the view's last n tokens
          for (const bool is_k : {true, false}) {
            const ConstTensorView in = is_k ? key : value;
            const detail::RowsAt to{is_k ? vk : vv, at, 0};
            if (p.advance)
              detail::write_rows(in, to);
            else  // a denoising step: into the current segment and the view at once
              detail::write_rows_twice(
                  in,
                  {detail::rows_of((is_k ? cur.data.k_raw : cur.data.v_raw).data(), m.opt, cur.tokens()), 0,
                   p.call.head_start},
                  to);
          }
        }
        void decode(const std::vector<DecodeTask>& tasks) const { decode_ranges(tasks, m.quant.codec.threads); }
      } be{*this, p, key, value, vk, vv, segs.back()};
      detail::assemble_view<DecodeTask>(segs, plan, be);
      out.k = detail::dense_view(vk);
      out.v = detail::dense_view(vv);
    }
    const int64_t global_end = pol.global_end();
    out.local_start_index = T - p.call.n;
    out.local_end_index = T;
    out.visible_local_end = pol.local_end();
    out.visible_global_end = global_end;
    peak_transient = meter.peak();
    return out;
  }
};

PackedCausalCache::PackedCausalCache(const CacheOptions& options, const QuantArgs& quant) : CausalCache(options) {
  detail::validate_options(options);
  if (options.allow_growth)
    throw Unsupported("allow_growth must be false for the packed cache (its segments never grow), got true");
  if (quant.enabled())
    quant.validate_for_head_dim(options.head_dim);
  else
    quant.validate();
  impl_ = std::make_unique<Impl>(options, quant);
}

PackedCausalCache::PackedCausalCache(std::unique_ptr<Impl> impl) : CausalCache(impl->opt), impl_(std::move(impl)) {}

PackedCausalCache::~PackedCausalCache() = default;
PackedCausalCache::PackedCausalCache(PackedCausalCache&&) noexcept = default;
PackedCausalCache& PackedCausalCache::operator=(PackedCausalCache&&) noexcept = default;

KVView PackedCausalCache::do_update(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                                    std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
  Impl& m = *impl_;
  const detail::PackedPlan p = m.plan(key, value, chunk_start, head_start, recent_window);
  std::vector<detail::ByteRange> owned = {{m.scratch->data(), m.scratch->size()}};
  for (const Segment& s : m.pol.segments()) {
    owned.push_back({s.data.k_raw.data(), s.data.k_raw.size()});
    owned.push_back({s.data.v_raw.data(), s.data.v_raw.size()});
  }
  const detail::CallInput in = detail::unaliased_input(key, value, owned);
  return m.apply(p, in.key, in.value, in.copied_bytes());
}

void PackedCausalCache::reset_indices() {
  impl_->pol.reset();
  impl_->warm_k.reset();
  impl_->warm_v.reset();
  impl_->last_advance = {};
  impl_->scratch->release();
  impl_->view_used = 0;
  impl_->peak_transient = 0;
}

size_t PackedCausalCache::resident_nbytes() const {
  return impl_->holdings().split().first;
}
size_t PackedCausalCache::shared_nbytes() const {
  return impl_->holdings().split().second;
}
PackedCausalCache PackedCausalCache::fork(std::shared_ptr<ViewScratch> view_scratch) const {
  return PackedCausalCache(impl_->forked(std::move(view_scratch)));
}
size_t PackedCausalCache::group_nbytes(std::span<const PackedCausalCache* const> caches) {
  std::vector<detail::Holdings> hs;
  hs.reserve(caches.size());
  for (const PackedCausalCache* c : caches)
    if (c) hs.push_back(c->impl_->holdings());
  return detail::Holdings::group(hs);
}
int64_t PackedCausalCache::span_breaks() const {
  return impl_->pol.spans().breaks;
}
size_t PackedCausalCache::peak_transient_nbytes() const {
  return impl_->peak_transient;
}
int64_t PackedCausalCache::global_end() const {
  return impl_->pol.global_end();
}
int64_t PackedCausalCache::local_end() const {
  return impl_->pol.local_end();
}
int64_t PackedCausalCache::cache_size() const {
  return impl_->capacity;
}
int64_t PackedCausalCache::attention_window_size() const {
  return impl_->window;
}
const QuantArgs& PackedCausalCache::quant_args() const {
  return impl_->quant;
}
std::optional<int64_t> PackedCausalCache::chunk_tokens() const {
  return impl_->pol.chunk_tokens();
}

size_t PackedCausalCache::warm_state_nbytes() const {
  size_t n = 0;
  if (impl_->warm_k) n += codebook_nbytes(*impl_->warm_k);
  if (impl_->warm_v) n += codebook_nbytes(*impl_->warm_v);
  return n;
}

WindowRanges PackedCausalCache::window_ranges() const {
  return impl_->pol.window_ranges_at(impl_->pol.global_end());
}

size_t PackedCausalCache::num_segments() const {
  return impl_->pol.segments().size();
}

PackedCausalCache::SegmentInfo PackedCausalCache::segment(size_t i) const {
  return detail::describe_segment<EncodedTensor>(impl_->pol, i, impl_->opt);
}

detail::PackedDebugState detail::TestAccess::state(const PackedCausalCache& c) {
  const PackedCausalCache::Impl& m = *c.impl_;
  PackedDebugState st;
  const auto copy_of = [](const auto& p) { return p ? std::optional<SpanCodebook>(*p) : std::nullopt; };
  for (const Segment& s : m.pol.segments())
    st.segments.push_back(
        {s.g0, s.g1, s.is_sink, s.packed, s.chunks, detail::bytes_copy(s.data.k_raw.data(), s.data.k_raw.size()),
         detail::bytes_copy(s.data.v_raw.data(), s.data.v_raw.size()), opt_of(s.data.k_enc).value_or(EncodedTensor{}),
         opt_of(s.data.v_enc).value_or(EncodedTensor{}), s.span, copy_of(s.data.k_book), copy_of(s.data.v_book),
         opt_of(s.data.k_ref), opt_of(s.data.v_ref)});
  st.global_end = m.pol.global_end();
  st.local_end = c.local_end();
  st.chunk_tokens = m.pol.chunk_tokens();
  st.warm_k = opt_of(m.warm_k);
  st.warm_v = opt_of(m.warm_v);
  st.resident_nbytes = c.resident_nbytes() + c.shared_nbytes();
  st.peak_transient_nbytes = m.peak_transient;
  // The last view's bytes (the buffer past them holds no view: content unspecified).
  st.view_scratch = detail::bytes_copy(m.scratch->data(), std::min(m.view_used, m.scratch->size()));
  const detail::OpenSpan<Books>& spans = m.pol.spans();
  st.open_span = spans.cursor.open;
  st.open_span_chunks = spans.cursor.open_chunks;
  st.next_span = spans.cursor.next;
  st.span_breaks = spans.breaks;
  st.open_k_book = copy_of(spans.books.k);
  st.open_v_book = copy_of(spans.books.v);
  st.open_k_energy = spans.k_energy;
  st.open_v_energy = spans.v_energy;
  return st;
}

const detail::PackOutcome& detail::PlanAccess::last_advance(const PackedCausalCache& c) {
  return c.impl_->last_advance;
}

// ---- snapshots (src/cache/snapshot.cpp): the state out and in ------------------
detail::PackedStateRef detail::SnapshotAccess::state(const PackedCausalCache& c) {
  const PackedCausalCache::Impl& m = *c.impl_;
  PackedStateRef r;
  r.options = m.opt;
  r.quant = m.quant;
  r.global_end = m.pol.global_end();
  r.chunk_tokens = m.pol.chunk_tokens();
  for (const Segment& s : m.pol.segments()) {
    PackedSegmentRef g{s.g0, s.g1, s.is_sink, s.packed, s.chunks, s.span, {}, {}, nullptr, nullptr, nullptr, nullptr};
    if (s.packed) {
      g.k_enc = s.data.k_enc.get();
      g.v_enc = s.data.v_enc.get();
      if (s.data.k_ref) {
        g.k_ref = &*s.data.k_ref;
        g.v_ref = &*s.data.v_ref;
      }
    } else {
      g.k_raw = {s.data.k_raw.data(), s.data.k_raw.size()};
      g.v_raw = {s.data.v_raw.data(), s.data.v_raw.size()};
    }
    // A span's chunks are adjacent and spans come oldest first: one entry per span.
    if (s.span >= 0 && (r.spans.empty() || r.spans.back().id != s.span))
      r.spans.push_back({s.span, s.data.k_book.get(), s.data.v_book.get()});
    r.segments.push_back(g);
  }
  r.warm_k = m.warm_k.get();
  r.warm_v = m.warm_v.get();
  const detail::OpenSpan<Books>& spans = m.pol.spans();
  const detail::SpanCursor& open = spans.cursor;
  // The open span's codebooks, also when none of its chunks is left (they seed the
  // next span's with init = warm).
  if (open.open >= 0 && (r.spans.empty() || r.spans.back().id != open.open))
    r.spans.push_back({open.open, spans.books.k.get(), spans.books.v.get()});
  r.span_state = {open.open, open.open_chunks, open.next, spans.breaks, spans.k_energy, spans.v_energy};
  return r;
}

PackedCausalCache detail::SnapshotAccess::make(PackedStateData&& d) {
  auto m = std::make_unique<PackedCausalCache::Impl>(d.options, d.quant);
  // One shared pair of codebooks per span, for its chunks and (the open span) the cache.
  std::vector<std::pair<int64_t, std::array<std::shared_ptr<SpanCodebook>, 2>>> books;
  books.reserve(d.spans.size());
  for (PackedSpanData& sp : d.spans)
    books.push_back(
        {sp.id, {std::make_shared<SpanCodebook>(std::move(sp.k)), std::make_shared<SpanCodebook>(std::move(sp.v))}});
  const auto book_of = [&](int64_t id) {
    const auto it =
        std::lower_bound(books.begin(), books.end(), id, [](const auto& b, int64_t x) { return b.first < x; });
    QVG_CHECK(it != books.end() && it->first == id);  // the reader checked every id has its span
    return it->second;
  };
  std::vector<Segment> segs;
  segs.reserve(d.segments.size());
  for (PackedSegmentData& s : d.segments) {
    Segment g;
    g.set_geometry(s);
    g.span = s.span;
    g.refined = s.k_ref.has_value();
    g.data.k_raw = std::move(s.k_raw);
    g.data.v_raw = std::move(s.v_raw);
    if (s.packed) {
      g.data.k_enc = std::make_shared<const EncodedTensor>(std::move(s.k_enc));
      g.data.v_enc = std::make_shared<const EncodedTensor>(std::move(s.v_enc));
    }
    if (s.k_ref) {
      g.data.k_ref = std::make_shared<const EncodedTensor>(std::move(*s.k_ref));
      g.data.v_ref = std::make_shared<const EncodedTensor>(std::move(*s.v_ref));
    }
    if (s.span >= 0) {
      const auto b = book_of(s.span);
      g.data.k_book = b[0];
      g.data.v_book = b[1];
    }
    segs.push_back(std::move(g));
  }
  const detail::SpanState& ss = d.span_state;
  detail::OpenSpan<Books> spans;
  spans.cursor = {ss.open_span, ss.open_span_chunks, ss.next_span};
  if (ss.open_span >= 0) {
    const auto b = book_of(ss.open_span);
    spans.books = {b[0], b[1]};
  }
  spans.k_energy = ss.open_k_energy;
  spans.v_energy = ss.open_v_energy;
  spans.breaks = ss.span_breaks;
  m->pol.restore(std::move(segs), d.global_end, d.chunk_tokens, std::move(spans));
  if (d.warm_k) m->warm_k = std::make_shared<const EncodedTensor>(std::move(*d.warm_k));
  if (d.warm_v) m->warm_v = std::make_shared<const EncodedTensor>(std::move(*d.warm_v));
  return PackedCausalCache(std::move(m));
}

}  // namespace qvg
