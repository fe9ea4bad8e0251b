// PackedCausalCache (spec 4). update() = plan (validation, throws, no state
// change) + apply (write the chunk, pack-and-evict, build the view).
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "cache/snapshot_state.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {
namespace {

// A segment's bytes: raw [B, g1 - g0, H, D] K and V, or their encodings. A chunk
// of an incremental span holds its data arrays (k_enc, v_enc without centroids)
// and shares its span's codebooks (k_book, v_book: all K slots allocated, filled
// chunk by chunk) with the span's other chunks.
// A chunk among the refine_recent newest encoded ones also holds its refinement
// layers (k_ref, v_ref: encode_refinement of its decoded K and V).
struct SegData {
  AlignedBuffer k_raw, v_raw;                    // raw
  EncodedTensor k_enc, v_enc;                    // packed
  std::shared_ptr<SpanCodebook> k_book, v_book;  // incremental span chunks only
  std::optional<EncodedTensor> k_ref, v_ref;     // refined chunks only (both or neither)
};
using Policy = detail::CachePolicy<SegData>;
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

}  // namespace

struct PackedCausalCache::Impl {
  const CacheOptions opt;
  const QuantArgs quant;
  const size_t esz;
  const int64_t capacity, window;
  CodecConfig codec_k, codec_v;  // K's and V's codec settings (per role); valid when quant.enabled()

  Policy pol;  // the segments (global order; the last is the current chunk) and their policy
  std::optional<EncodedTensor> warm_k, warm_v;  // codebooks of the last encodings (init = warm)
  // Incremental spans: the open span's codebooks and its first chunk's residual
  // energy per element (the reference of the adaptive boundary), and how many spans
  // were started because a chunk did not fit the open span's codebook.
  std::shared_ptr<SpanCodebook> open_k_book, open_v_book;
  double open_k_energy = 0, open_v_energy = 0;
  int64_t span_breaks = 0;
  std::shared_ptr<ViewScratch> scratch;  // K then V of the last copied view (maybe shared)
  size_t peak_transient = 0;

  Impl(const CacheOptions& o, const QuantArgs& q)
      : opt(o), quant(q), esz(dtype_size(o.dtype)), capacity(o.cache_size), window(o.window()), pol(o, q) {
    scratch = o.view_scratch ? o.view_scratch : std::make_shared<ViewScratch>();
    if (q.enabled()) {
      codec_k = q.codec(CacheRole::Key);
      codec_v = q.codec(CacheRole::Value);
      codec_k.head_offset = codec_v.head_offset = o.head_offset;  // a head shard draws the wide cache's PRNG streams
    }
  }

  size_t raw_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }

  /// Validation of the call (no state change): the policy's, then the values, then
  /// (an advance that encodes) the stored chunks it will encode.
  detail::CallPlan plan(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                        std::optional<int64_t> head_start, std::optional<int64_t> recent_window) const {
    detail::CallPlan p = pol.plan(key, value, chunk_start, head_start, recent_window);
    detail::check_values(key, value);
    if (p.advance && quant.enabled()) check_chunks_to_encode(p);
    return p;
  }

  /// The raw chunks advance `p` will encode must be encodable (finite, |x| <= 1e16,
  /// as every input was when it was written). They can only have become otherwise
  /// through a zero-copy view this cache lent (KVView::zero_copy aliases the stored
  /// chunk): issue 27, finding 16. Which chunks: the policy run on the segments'
  /// geometry alone (push_current, evict, spans_to_encode on a copy without
  /// payload), so the check matches what apply() encodes. Throws InvalidArgument
  /// naming the stored chunk; no state changes.
  void check_chunks_to_encode(const detail::CallPlan& p) const {
    struct Ref {
      size_t index = std::numeric_limits<size_t>::max();  // in pol.segments(); max: the call's new chunk
    };
    const std::vector<Segment>& segs = pol.segments();
    std::vector<detail::PlanSegment<Ref>> geometry;
    geometry.reserve(segs.size() + 1);
    for (size_t i = 0; i < segs.size(); ++i) {
      detail::PlanSegment<Ref> g;
      g.g0 = segs[i].g0;
      g.g1 = segs[i].g1;
      g.is_sink = segs[i].is_sink;
      g.chunks = segs[i].chunks;
      g.packed = segs[i].packed;
      g.span = segs[i].span;
      g.data.index = i;
      geometry.push_back(g);
    }
    detail::CachePolicy<Ref> shadow(opt, quant);
    shadow.restore(std::move(geometry), pol.global_end(), pol.chunk_tokens(),
                   {pol.open_span().id, pol.open_span().chunks}, pol.next_span_id());
    shadow.push_current(p, Ref{});
    shadow.evict();
    const auto& after = shadow.segments();
    for (const detail::SpanRef& sr : shadow.spans_to_encode())
      for (size_t i = sr.first; i < sr.first + sr.count; ++i) {
        const size_t index = after[i].data.index;
        QVG_CHECK(index < segs.size() && !segs[index].packed);  // the new chunk is current: never encoded now
        check_stored_chunk(segs[index], index + 1 == segs.size());
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
  EncodedTensor encode_one(const std::vector<const Segment*>& parts, bool is_k, detail::TransientMeter& meter,
                           EncodeStats* stats = nullptr) {
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
    std::optional<EncodedTensor>& warm = is_k ? warm_k : warm_v;
    const CodecConfig& codec = is_k ? codec_k : codec_v;
    const EncodedTensor* w = (codec.init == Init::Warm && warm) ? &*warm : nullptr;
    EncodedTensor enc = encode(in, codec, w, stats);
    meter.add(enc.nbytes());
    if (concat.size()) meter.sub(concat.size());
    return enc;
  }

  /// A raw chunk's K or V as a tensor view.
  ConstTensorView raw_view(const Segment& s, bool is_k) const {
    return {(is_k ? s.data.k_raw : s.data.v_raw).data(), opt.dtype, {opt.batch, s.tokens(), opt.heads, opt.head_dim}};
  }

  /// Slots of a span's codebook the first chunk trains (half of K when a span holds
  /// several chunks) and slots each later chunk adds (the rest shared out evenly):
  /// a later chunk adds centroids fitted to itself, so content that drifts within a
  /// span (motion, the time channels of rotary embedding) still finds its own
  /// centroids, while the span stores one codebook of K slots.
  int first_chunk_slots(const CodecConfig& c) const {
    return quant.span_chunks > 1 ? (c.centroids + 1) / 2 : c.centroids;
  }
  int later_chunk_slots(const CodecConfig& c) const {
    return quant.span_chunks > 1 ? (c.centroids - first_chunk_slots(c)) / (quant.span_chunks - 1) : 0;
  }

  /// An incremental chunk: into the open span when allowed and the chunk fits its
  /// codebook (residual energy per element within span_break_ratio of the span's
  /// first chunk, or any with ratio 0), else as the first chunk of a new span.
  void encode_incremental(const Segment& raw, Segment& packed, detail::SpanChoice& choice,
                          detail::TransientMeter& meter) {
    if (choice.may_join) {
      // Encoded against copies of the span's codebooks: the span changes only if
      // the chunk joins it.
      SpanCodebook tk = *open_k_book, tv = *open_v_book;
      const size_t trial = codebook_nbytes(tk.book) + codebook_nbytes(tv.book);
      meter.add(trial);
      EncodeStats sk, sv;
      EncodedTensor k = encode_span_chunk(raw_view(raw, true), codec_k, tk, later_chunk_slots(codec_k), nullptr, &sk);
      EncodedTensor v = encode_span_chunk(raw_view(raw, false), codec_v, tv, later_chunk_slots(codec_v), nullptr, &sv);
      const auto ratio = [](double e, double first) {
        return first > 0 ? e / first : (e > 0 ? std::numeric_limits<double>::infinity() : 1.0);
      };
      const double r =
          std::max(ratio(energy_per_element(sk), open_k_energy), ratio(energy_per_element(sv), open_v_energy));
      if (quant.span_break_ratio == 0 || r <= quant.span_break_ratio) {
        *open_k_book = std::move(tk);
        *open_v_book = std::move(tv);
        packed.data.k_enc = std::move(k);
        packed.data.v_enc = std::move(v);
        packed.data.k_book = open_k_book;
        packed.data.v_book = open_v_book;
        meter.add(detail::segment_bytes(packed));
        meter.sub(trial);
        choice.joined = true;
        return;
      }
      meter.sub(trial);
      ++span_breaks;  // the chunk does not fit the open span's codebook: a new span
    }
    // A new span: its first chunk trains the first slots of fresh codebooks (warm
    // started, with init = warm, from the previous span's or encoding's codebooks);
    // its residual energy is the reference later chunks are compared with.
    const Shape4 shape{opt.batch, raw.tokens(), opt.heads, opt.head_dim};
    const EncodedTensor* wk = open_k_book ? &open_k_book->book : (warm_k ? &*warm_k : nullptr);
    const EncodedTensor* wv = open_v_book ? &open_v_book->book : (warm_v ? &*warm_v : nullptr);
    if (codec_k.init != Init::Warm) wk = nullptr;
    if (codec_v.init != Init::Warm) wv = nullptr;
    auto book_k = std::make_shared<SpanCodebook>(SpanCodebook::empty(shape, opt.dtype, codec_k));
    auto book_v = std::make_shared<SpanCodebook>(SpanCodebook::empty(shape, opt.dtype, codec_v));
    meter.add(codebook_nbytes(book_k->book) + codebook_nbytes(book_v->book));
    EncodeStats fk, fv;
    packed.data.k_enc = encode_span_chunk(raw_view(raw, true), codec_k, *book_k, first_chunk_slots(codec_k), wk, &fk);
    packed.data.v_enc = encode_span_chunk(raw_view(raw, false), codec_v, *book_v, first_chunk_slots(codec_v), wv, &fv);
    meter.add(detail::segment_bytes(packed));
    packed.data.k_book = open_k_book = std::move(book_k);
    packed.data.v_book = open_v_book = std::move(book_v);
    open_k_energy = energy_per_element(fk);
    open_v_energy = energy_per_element(fv);
    choice.joined = false;
  }

  /// The refinement layers of a just-encoded incremental chunk (refine_recent > 0):
  /// its K and V decoded as the view decodes them, and the error encoded.
  void refine(const Segment& raw, Segment& packed, detail::TransientMeter& meter) {
    const int64_t S = raw.tokens(), H = opt.heads, D = opt.head_dim;
    AlignedBuffer dec(raw_bytes(S));
    const size_t f32_bytes = size_t(opt.batch * S * H * D) * 4;  // encode_refinement's two fp32 copies
    meter.add(dec.size() + 2 * f32_bytes);
    for (const bool is_k : {true, false}) {
      const EncodedTensor& enc = is_k ? packed.data.k_enc : packed.data.v_enc;
      const EncodedTensor& book = (is_k ? packed.data.k_book : packed.data.v_book)->book;
      decode_ranges({{&enc, 0, S, 0, H, {dec.data(), opt.dtype, S * H * D, H * D}, &book}}, quant.threads);
      const CodecConfig& c = is_k ? codec_k : codec_v;
      CodecConfig rc = refinement_config(quant.refine_bits, c.block_size, c.seed, quant.threads);
      rc.head_offset = c.head_offset;
      const ConstTensorView x = raw_view(raw, is_k);
      EncodedTensor r = encode_refinement(x, {dec.data(), opt.dtype, x.shape}, rc);
      meter.add(r.nbytes());
      (is_k ? packed.data.k_ref : packed.data.v_ref) = std::move(r);
    }
    meter.sub(dec.size() + 2 * f32_bytes);
  }

  /// Encodes the spans and chunks the policy picks; each replaces its raw chunks.
  void pack(detail::TransientMeter& meter) {
    pol.pack([&](const std::vector<const Segment*>& parts, Segment& packed, detail::SpanChoice& choice) {
      if (choice.incremental) {
        encode_incremental(*parts.front(), packed, choice, meter);
        if (quant.refine_recent > 0) refine(*parts.front(), packed, meter);
      } else {
        packed.data.k_enc = encode_one(parts, true, meter);
        packed.data.v_enc = encode_one(parts, false, meter);
        if (codec_k.init == Init::Warm) warm_k = packed.data.k_enc.codebooks_only();
        if (codec_v.init == Init::Warm) warm_v = packed.data.v_enc.codebooks_only();
      }
      meter.sub(detail::segment_bytes(packed));  // resident from here on; the raw chunks are gone
    });
    // Older chunks lose their layers; their base encodings stay exactly as they are.
    if (quant.refine_recent > 0)
      detail::keep_newest_refinements(
          pol, quant.refine_recent, [](const Segment& s) { return s.data.k_ref.has_value(); },
          [](Segment& s) {
            s.data.k_ref.reset();
            s.data.v_ref.reset();
          });
  }

  size_t resident() const {
    return detail::resident_bytes(
        pol, [](const Segment& s) { return detail::segment_bytes(s); },
        [](const Segment& s) { return codebook_nbytes(s.data.k_book->book) + codebook_nbytes(s.data.v_book->book); });
  }

  // --- apply -----------------------------------------------------------------
  /// `held`: bytes the call already holds (copies of an aliased input).
  KVView apply(const detail::CallPlan& p, ConstTensorView key, ConstTensorView value, size_t held) {
    detail::TransientMeter meter;
    meter.add(held);
    const int64_t B = opt.batch, D = opt.head_dim, h_in = p.call.heads, head0 = p.call.head_start;
    // View = [0, sink_end) ++ [tail_start, end) in global tokens (the policy's
    // layout); a single range inside the current chunk is returned without a copy.
    const int64_t T = p.view.tokens;
    const size_t view_bytes = p.copies ? 2 * size_t(B * T * h_in * D) * esz : 0;
    // An advance that encodes frees an unshared view buffer first (lower peak while
    // encoding); a shared one is kept for the other caches that use it.
    if (scratch->size() != view_bytes || (p.advance && quant.enabled() && scratch.use_count() == 1)) scratch->release();
    meter.add(scratch->size());  // kept for reuse: held through the call

    std::vector<Segment>& segs = pol.segments();
    auto k_rows = [&](Segment& s) { return detail::rows_of(s.data.k_raw.data(), opt, s.tokens()); };
    auto v_rows = [&](Segment& s) { return detail::rows_of(s.data.v_raw.data(), opt, s.tokens()); };
    if (p.advance) {
      SegData cur;
      cur.k_raw = AlignedBuffer(raw_bytes(p.call.n));  // zeros in heads this call does not write
      cur.v_raw = AlignedBuffer(raw_bytes(p.call.n));
      detail::write_rows(key, {detail::rows_of(cur.k_raw.data(), opt, p.call.n), 0, head0});
      detail::write_rows(value, {detail::rows_of(cur.v_raw.data(), opt, p.call.n), 0, head0});
      segs.reserve(segs.size() + 1);
      // --- from here on state changes; only std::bad_alloc can still occur ---
      pol.push_current(p, std::move(cur));
      pol.evict();
      pack(meter);
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
    } else {
      if (scratch->size() != view_bytes) {
        scratch->resize(view_bytes);
        meter.add(view_bytes);
      }
      const detail::Rows vk{scratch->data(), opt.dtype, B, T, h_in, D};
      const detail::Rows vv{scratch->data() + view_bytes / 2, opt.dtype, B, T, h_in, D};
      // Raw segments are copied at once; packed spans are collected and decoded
      // in one parallel pass (every span, K and V) straight into the view.
      // The current chunk — always the view's last n tokens, and exactly the
      // call's key/value rows — is copied from the input, not re-read from its
      // segment.
      std::vector<DecodeTask> tasks;
      const std::vector<detail::ViewPiece> pieces = pol.view_pieces(p);
      for (const detail::ViewPiece& pc : pieces) {
        Segment& s = segs[pc.seg];
        if (!s.packed) {
          detail::gather_rows(k_rows(s), pc.t0, pc.t1, head0, {vk, pc.out_t, 0});
          detail::gather_rows(v_rows(s), pc.t0, pc.t1, head0, {vv, pc.out_t, 0});
        } else {
          const DecodeTarget tk{vk.row(0, pc.out_t, 0), opt.dtype, T * h_in * D, h_in * D};
          const DecodeTarget tv{vv.row(0, pc.out_t, 0), opt.dtype, T * h_in * D, h_in * D};
          tasks.push_back(
              {&s.data.k_enc, pc.t0, pc.t1, head0, head0 + h_in, tk, s.data.k_book ? &s.data.k_book->book : nullptr});
          tasks.push_back(
              {&s.data.v_enc, pc.t0, pc.t1, head0, head0 + h_in, tv, s.data.v_book ? &s.data.v_book->book : nullptr});
        }
      }
      const int64_t chunk_at = T - p.call.n;  // the call's chunk: the view's last n tokens
      if (p.advance) {
        detail::write_rows(key, {vk, chunk_at, 0});
        detail::write_rows(value, {vv, chunk_at, 0});
      } else {  // a denoising step: into the current segment and the view at once
        Segment& c_seg = segs.back();
        detail::write_rows_twice(key, {k_rows(c_seg), 0, head0}, {vk, chunk_at, 0});
        detail::write_rows_twice(value, {v_rows(c_seg), 0, head0}, {vv, chunk_at, 0});
      }
      decode_ranges(tasks, quant.threads);
      // Refined chunks: their layers added to what was just decoded.
      for (const detail::ViewPiece& pc : pieces) {
        const Segment& s = segs[pc.seg];
        if (!s.packed || !s.data.k_ref) continue;
        add_refinement(*s.data.k_ref, pc.t0, pc.t1, head0, head0 + h_in,
                       {vk.row(0, pc.out_t, 0), opt.dtype, T * h_in * D, h_in * D}, quant.threads);
        add_refinement(*s.data.v_ref, pc.t0, pc.t1, head0, head0 + h_in,
                       {vv.row(0, pc.out_t, 0), opt.dtype, T * h_in * D, h_in * D}, quant.threads);
      }
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
  const detail::CallPlan p = m.plan(key, value, chunk_start, head_start, recent_window);
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
  impl_->open_k_book.reset();
  impl_->open_v_book.reset();
  impl_->open_k_energy = impl_->open_v_energy = 0;
  impl_->span_breaks = 0;
  impl_->scratch->release();
  impl_->peak_transient = 0;
}

size_t PackedCausalCache::resident_nbytes() const {
  return impl_->resident();
}
int64_t PackedCausalCache::span_breaks() const {
  return impl_->span_breaks;
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

PackedCausalCache::DebugState PackedCausalCache::debug_state() const {
  DebugState st;
  const auto copy_of = [](const std::shared_ptr<SpanCodebook>& p) {
    return p ? std::optional<SpanCodebook>(*p) : std::nullopt;
  };
  for (const Segment& s : impl_->pol.segments())
    st.segments.push_back({s.g0, s.g1, s.is_sink, s.packed, s.chunks,
                           detail::bytes_copy(s.data.k_raw.data(), s.data.k_raw.size()),
                           detail::bytes_copy(s.data.v_raw.data(), s.data.v_raw.size()), s.data.k_enc, s.data.v_enc,
                           s.span, copy_of(s.data.k_book), copy_of(s.data.v_book), s.data.k_ref, s.data.v_ref});
  st.global_end = impl_->pol.global_end();
  st.local_end = local_end();
  st.chunk_tokens = impl_->pol.chunk_tokens();
  st.warm_k = impl_->warm_k;
  st.warm_v = impl_->warm_v;
  st.resident_nbytes = resident_nbytes();
  st.peak_transient_nbytes = impl_->peak_transient;
  st.view_scratch = detail::bytes_copy(impl_->scratch->data(), impl_->scratch->size());
  st.open_span = impl_->pol.open_span().id;
  st.open_span_chunks = impl_->pol.open_span().chunks;
  st.next_span = impl_->pol.next_span_id();
  st.span_breaks = impl_->span_breaks;
  st.open_k_book = copy_of(impl_->open_k_book);
  st.open_v_book = copy_of(impl_->open_v_book);
  st.open_k_energy = impl_->open_k_energy;
  st.open_v_energy = impl_->open_v_energy;
  return st;
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
      g.k_enc = &s.data.k_enc;
      g.v_enc = &s.data.v_enc;
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
  r.warm_k = m.warm_k ? &*m.warm_k : nullptr;
  r.warm_v = m.warm_v ? &*m.warm_v : nullptr;
  const auto& open = m.pol.open_span();
  // The open span's codebooks, also when none of its chunks is left (they seed the
  // next span's with init = warm).
  if (open.id >= 0 && (r.spans.empty() || r.spans.back().id != open.id))
    r.spans.push_back({open.id, m.open_k_book.get(), m.open_v_book.get()});
  r.span_state = {open.id, open.chunks, m.pol.next_span_id(), m.span_breaks, m.open_k_energy, m.open_v_energy};
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
    g.g0 = s.g0;
    g.g1 = s.g1;
    g.is_sink = s.is_sink;
    g.packed = s.packed;
    g.chunks = s.chunks;
    g.span = s.span;
    g.data = {std::move(s.k_raw), std::move(s.v_raw), std::move(s.k_enc), std::move(s.v_enc), nullptr, nullptr,
              std::move(s.k_ref), std::move(s.v_ref)};
    if (s.span >= 0) {
      const auto b = book_of(s.span);
      g.data.k_book = b[0];
      g.data.v_book = b[1];
    }
    segs.push_back(std::move(g));
  }
  const detail::SpanState& ss = d.span_state;
  m->pol.restore(std::move(segs), d.global_end, d.chunk_tokens, {ss.open_span, ss.open_span_chunks}, ss.next_span);
  m->warm_k = std::move(d.warm_k);
  m->warm_v = std::move(d.warm_v);
  if (ss.open_span >= 0) {
    const auto b = book_of(ss.open_span);
    m->open_k_book = b[0];
    m->open_v_book = b[1];
  }
  m->open_k_energy = ss.open_k_energy;
  m->open_v_energy = ss.open_v_energy;
  m->span_breaks = ss.span_breaks;
  return PackedCausalCache(std::move(m));
}

}  // namespace qvg
