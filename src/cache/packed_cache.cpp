// PackedCausalCache (spec 4). update() = plan (validation, throws, no state
// change) + apply (write the chunk, pack-and-evict, build the view).
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {
namespace {

struct Segment {
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false;
  int chunks = 1;
  bool packed = false;
  AlignedBuffer k_raw, v_raw;  // raw: [B, g1 - g0, H, D]
  EncodedTensor k_enc, v_enc;  // packed

  int64_t tokens() const { return g1 - g0; }
  size_t nbytes() const { return packed ? k_enc.nbytes() + v_enc.nbytes() : k_raw.size() + v_raw.size(); }
};

/// The metadata and codebooks of `e` (what a warm start needs), nothing else.
EncodedTensor codebook_only(const EncodedTensor& e) {
  EncodedTensor w;
  w.dtype = e.dtype;
  w.shape = e.shape;
  w.bits = e.bits;
  w.block_size = e.block_size;
  w.stages = e.stages;
  w.centroids = e.centroids;
  w.asymmetric = e.asymmetric;
  w.scale_dtype = e.scale_dtype;
  w.scaling = e.scaling;
  w.centroid = e.centroid;
  return w;
}

size_t codebook_nbytes(const EncodedTensor& e) {
  size_t n = 0;
  for (const auto& c : e.centroid) n += c.size();
  return n;
}

}  // namespace

struct PackedCausalCache::Impl {
  const CacheOptions opt;
  const QuantArgs quant;
  const size_t esz;
  const int64_t cap, window;
  CodecConfig codec;  // valid when quant.enabled()

  std::vector<Segment> segs;  // global order; segs.back() is the current chunk
  int64_t ge = 0;
  std::optional<int64_t> chunk_tokens;
  std::optional<EncodedTensor> warm_k, warm_v;  // codebooks of the last encodings (init = warm)
  std::shared_ptr<ViewScratch> scratch;  // K then V of the last copied view (maybe shared)
  size_t peak_transient = 0;

  Impl(const CacheOptions& o, const QuantArgs& q)
      : opt(o), quant(q), esz(dtype_size(o.dtype)), cap(o.cache_size), window(o.window()) {
    scratch = o.view_scratch ? o.view_scratch : std::make_shared<ViewScratch>();
    if (q.enabled()) codec = q.codec();
  }

  int64_t sink_end_at(int64_t g) const { return std::min(opt.sink_tokens, g); }
  int64_t tail_start_at(int64_t g) const {
    const int64_t se = sink_end_at(g);
    return std::max(se, g - std::max<int64_t>(0, window - se));
  }
  size_t raw_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }

  struct Plan {
    detail::CallArgs a;
    bool advance = false;
    int64_t sink_end = 0, lo = 0;  // view = [0, sink_end) ++ [lo, new_ge)
    int64_t new_ge = 0;
  };

  Plan plan(ConstTensorView key, ConstTensorView value, int64_t c, std::optional<int64_t> hs,
            std::optional<int64_t> rw) const {
    Plan p;
    p.a = detail::validate_call(opt, key, value, c, hs, rw);
    const int64_t n = p.a.n, ce = p.a.ce, sink = opt.sink_tokens;
    if (n > cap)
      throw OutOfRange(fmt::format("chunk of n = {} tokens is longer than the cache (cache_size = {})", n, cap));
    if (!segs.empty() && c == segs.back().g0) {
      const Segment& cur = segs.back();
      if (n != cur.tokens())
        throw Unsupported(fmt::format(
            "rewrite of the current chunk [{}, {}) must keep its size: n must be {}, got {} (the packed cache does "
            "not support changing the current chunk's size)",
            cur.g0, cur.g1, cur.tokens(), n));
      p.advance = false;
      p.new_ge = ge;
    } else if (c == ge) {
      const int64_t le = std::min(ge, cap);
      const int64_t se = std::min(sink, le);
      if (le + n > cap && cap - n < se)
        throw OutOfRange(fmt::format(
            "chunk [{}, {}) would overwrite sink tokens: after eviction it is placed at buffer [{}, {}), which "
            "overlaps the {} sink tokens at [0, {}) (cache_size = {}, n = {}); chunks may be at most "
            "cache_size - sink = {} tokens here",
            c, ce, cap - n, cap, se, se, cap, n, cap - se));
      p.advance = true;
      p.new_ge = ce;
    } else if (segs.empty()) {
      throw Unsupported(fmt::format(
          "non-sequential write: on an empty cache current_chunk_start must be global_end = {} (advance), got {}", ge,
          c));
    } else {
      throw Unsupported(fmt::format(
          "non-sequential write: current_chunk_start must be the current chunk's start {} (rewrite) or global_end = "
          "{} (advance), got {}",
          segs.back().g0, ge, c));
    }
    p.sink_end = sink_end_at(p.new_ge);
    const int64_t tail = tail_start_at(p.new_ge);
    if (tail > std::max(c, p.sink_end))
      throw OutOfRange(fmt::format(
          "chunk [{}, {}) is not entirely visible: the attention window of {} tokens shows the sink [0, {}) and "
          "[{}, {}); a chunk may hold at most the window minus the sink tokens in front of it ({} tokens here), got "
          "n = {}",
          c, ce, window, p.sink_end, tail, p.new_ge, window - std::min(c, p.sink_end), n));
    p.lo = rw ? std::max(tail, c - *rw) : tail;
    detail::check_values(key, value);
    return p;
  }

  // --- pack-and-evict --------------------------------------------------------
  struct SpanRef {
    size_t first = 0, count = 0;
  };

  /// Step 1 of pack-and-evict: drop finalized non-sink segments left of the tail.
  void evict() {
    const int64_t tail = tail_start_at(ge);
    const size_t last = segs.size() - 1;
    size_t w = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
      const bool drop = i < last && !segs[i].is_sink && segs[i].g1 <= tail;
      if (!drop) {
        if (w != i) segs[w] = std::move(segs[i]);
        ++w;
      }
    }
    segs.resize(w);
  }

  /// Step 2: the spans to encode now, in encoding order (sink spans, then
  /// non-sink spans, oldest first). Indices refer to the current segs.
  std::vector<SpanRef> spans_to_encode() const {
    std::vector<SpanRef> spans;
    if (!quant.enabled()) return spans;
    const size_t last = segs.size() - 1;  // the current chunk: never encoded here
    if (quant.sink) {
      std::vector<size_t> elig;
      int64_t chunk_index = 0;
      for (size_t i = 0; i < last; ++i) {
        if (!segs[i].is_sink) continue;
        if (!segs[i].packed && chunk_index >= quant.sink_keep_chunks) elig.push_back(i);
        chunk_index += segs[i].chunks;
      }
      if (quant.sink_span == SinkSpan::Chunk) {
        for (size_t i : elig) spans.push_back({i, 1});
      } else if (!elig.empty() && !segs[last].is_sink) {
        for (size_t j = 1; j < elig.size(); ++j) QVG_CHECK(elig[j] == elig[0] + j);
        spans.push_back({elig[0], elig.size()});
      }
    }
    std::vector<size_t> raw;
    for (size_t i = 0; i < last; ++i)
      if (!segs[i].is_sink && !segs[i].packed) raw.push_back(i);
    const size_t keep = size_t(quant.keep_recent_chunks);
    const size_t eligible = raw.size() > keep ? raw.size() - keep : 0;
    const size_t span = size_t(quant.span_chunks);
    for (size_t j = 0; j + span <= eligible; j += span) spans.push_back({raw[j], span});
    return spans;
  }

  EncodedTensor encode_one(const std::vector<const Segment*>& parts, bool is_k, detail::TransientMeter& meter) {
    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim;
    const int64_t S = parts.back()->g1 - parts.front()->g0;
    ConstTensorView in{nullptr, opt.dtype, {B, S, H, D}};
    AlignedBuffer concat;
    if (parts.size() == 1) {
      in.data = (is_k ? parts[0]->k_raw : parts[0]->v_raw).data();
    } else {
      concat = AlignedBuffer(raw_bytes(S));
      meter.add(concat.size());
      const size_t tb = size_t(H * D) * esz;
      for (int64_t b = 0; b < B; ++b) {
        int64_t t = 0;
        for (const Segment* s : parts) {
          const AlignedBuffer& src = is_k ? s->k_raw : s->v_raw;
          std::memcpy(concat.data() + size_t(b * S + t) * tb, src.data() + size_t(b * s->tokens()) * tb,
                      size_t(s->tokens()) * tb);
          t += s->tokens();
        }
      }
      in.data = concat.data();
    }
    std::optional<EncodedTensor>& warm = is_k ? warm_k : warm_v;
    const EncodedTensor* w = (codec.init == Init::Warm && warm) ? &*warm : nullptr;
    EncodedTensor enc = encode(in, codec, w);
    meter.add(enc.nbytes());
    if (concat.size()) meter.sub(concat.size());
    return enc;
  }

  void pack(detail::TransientMeter& meter) {
    const std::vector<SpanRef> spans = spans_to_encode();
    size_t removed = 0;  // segments merged away by earlier spans of this call
    for (const SpanRef& sr : spans) {
      const size_t first = sr.first - removed;
      std::vector<const Segment*> parts;
      int chunks = 0;
      for (size_t i = first; i < first + sr.count; ++i) {
        QVG_CHECK(!segs[i].packed && segs[i].is_sink == segs[first].is_sink);
        parts.push_back(&segs[i]);
        chunks += segs[i].chunks;
      }
      Segment packed;
      packed.g0 = parts.front()->g0;
      packed.g1 = parts.back()->g1;
      packed.is_sink = parts.front()->is_sink;
      packed.chunks = chunks;
      packed.packed = true;
      packed.k_enc = encode_one(parts, true, meter);
      packed.v_enc = encode_one(parts, false, meter);
      if (codec.init == Init::Warm) {
        warm_k = codebook_only(packed.k_enc);
        warm_v = codebook_only(packed.v_enc);
      }
      const size_t enc_bytes = packed.nbytes();
      segs[first] = std::move(packed);
      segs.erase(segs.begin() + std::ptrdiff_t(first + 1), segs.begin() + std::ptrdiff_t(first + sr.count));
      meter.sub(enc_bytes);  // resident from here on; the raw chunks are gone
      removed += sr.count - 1;
    }
  }

  // --- apply -----------------------------------------------------------------
  KVView apply(const Plan& p, ConstTensorView key, ConstTensorView value) {
    detail::TransientMeter meter;
    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim, h_in = p.a.h_in, c = p.a.c;
    // View ranges [0, r1) ++ [r2, new_ge) (first may be empty); a single range
    // inside the current chunk [c, ce) is returned without a copy.
    int64_t r1 = p.sink_end, r2 = p.lo;
    if (r1 == r2) r1 = r2 = 0;  // adjacent: one range [0, new_ge)
    const int64_t r3 = p.new_ge;
    const int64_t T = r1 + (r3 - r2);
    const bool copy = r1 > 0 || r2 < c;
    const size_t view_bytes = copy ? 2 * size_t(B * T * h_in * D) * esz : 0;
    // An advance that encodes frees an unshared view buffer first (lower peak while
    // encoding); a shared one is kept for the other caches that use it.
    if (scratch->size() != view_bytes || (p.advance && quant.enabled() && scratch.use_count() == 1))
      scratch->release();
    meter.add(scratch->size());  // kept for reuse: held through the call

    if (p.advance) {
      Segment cur;
      cur.g0 = c;
      cur.g1 = p.a.ce;
      cur.is_sink = c < opt.sink_tokens;
      cur.k_raw = AlignedBuffer(raw_bytes(p.a.n));  // zeros in heads this call does not write
      cur.v_raw = AlignedBuffer(raw_bytes(p.a.n));
      detail::write_rows(key, cur.k_raw.data(), p.a.n, H, 0, p.a.hs);
      detail::write_rows(value, cur.v_raw.data(), p.a.n, H, 0, p.a.hs);
      segs.reserve(segs.size() + 1);
      // --- from here on state changes; only std::bad_alloc can still occur ---
      segs.push_back(std::move(cur));
      if (!chunk_tokens) chunk_tokens = p.a.n;
      ge = p.new_ge;
      evict();
      pack(meter);
    } else if (!copy) {
      Segment& cur = segs.back();
      detail::write_rows(key, cur.k_raw.data(), cur.tokens(), H, 0, p.a.hs);
      detail::write_rows(value, cur.v_raw.data(), cur.tokens(), H, 0, p.a.hs);
    }  // else: written below together with the view (one read of the input)

    KVView out;
    const Segment& cur = segs.back();
    if (!copy) {
      out.k = detail::sub_view(cur.k_raw.data(), opt.dtype, B, cur.tokens(), H, D, r2 - cur.g0, T, p.a.hs, h_in);
      out.v = detail::sub_view(cur.v_raw.data(), opt.dtype, B, cur.tokens(), H, D, r2 - cur.g0, T, p.a.hs, h_in);
      out.zero_copy = true;
    } else {
      if (scratch->size() != view_bytes) {
        scratch->resize(view_bytes);
        meter.add(view_bytes);
      }
      std::byte* sk = scratch->data();
      std::byte* sv = scratch->data() + view_bytes / 2;
      // Raw segments are copied at once; packed spans are collected and decoded
      // in one parallel pass (every span, K and V) straight into the view.
      // The current chunk — always the view's last n tokens, and exactly the
      // call's key/value rows — is copied from the input, not re-read from its
      // segment.
      std::vector<DecodeTask> tasks;
      fill(0, r1, 0, p.a.hs, h_in, sk, sv, T, tasks);
      fill(r2, c, r1, p.a.hs, h_in, sk, sv, T, tasks);
      QVG_CHECK(r3 == p.a.ce && r1 + (c - r2) == T - p.a.n);
      if (p.advance) {
        detail::write_rows(key, sk, T, h_in, T - p.a.n, 0);
        detail::write_rows(value, sv, T, h_in, T - p.a.n, 0);
      } else {  // a denoising step: into the current segment and the view at once
        Segment& c_seg = segs.back();
        detail::write_rows_twice(key, {c_seg.k_raw.data(), c_seg.tokens(), H, 0, p.a.hs}, {sk, T, h_in, T - p.a.n, 0});
        detail::write_rows_twice(value, {c_seg.v_raw.data(), c_seg.tokens(), H, 0, p.a.hs}, {sv, T, h_in, T - p.a.n, 0});
      }
      decode_ranges(tasks, quant.threads);
      out.k = detail::dense_view(sk, opt.dtype, B, T, h_in, D);
      out.v = detail::dense_view(sv, opt.dtype, B, T, h_in, D);
    }
    out.local_start_index = T - p.a.n;
    out.local_end_index = T;
    out.visible_local_end = std::min(ge, cap);
    out.visible_global_end = ge;
    peak_transient = meter.peak();
    return out;
  }

  /// Writes global tokens [x0, x1) (heads [hs, hs + h_out)) at view token out_t
  /// of the dense [B, T, h_out, D] buffers sk, sv: raw segments now, packed ones
  /// appended to `tasks` for the caller's decode_ranges().
  void fill(int64_t x0, int64_t x1, int64_t out_t, int64_t hs, int64_t h_out, std::byte* sk, std::byte* sv, int64_t T,
            std::vector<DecodeTask>& tasks) const {
    if (x0 >= x1) return;
    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim;
    int64_t covered = 0;
    for (const Segment& s : segs) {
      const int64_t o0 = std::max(x0, s.g0), o1 = std::min(x1, s.g1);
      if (o0 >= o1) continue;
      const int64_t at = out_t + (o0 - x0);
      if (!s.packed) {
        detail::gather_rows(s.k_raw.data(), B, s.tokens(), H, D, esz, o0 - s.g0, o1 - s.g0, hs, h_out, sk, T, at);
        detail::gather_rows(s.v_raw.data(), B, s.tokens(), H, D, esz, o0 - s.g0, o1 - s.g0, hs, h_out, sv, T, at);
      } else {
        const size_t off = size_t(at * h_out * D) * esz;
        const DecodeTarget tk{sk + off, opt.dtype, T * h_out * D, h_out * D};
        const DecodeTarget tv{sv + off, opt.dtype, T * h_out * D, h_out * D};
        tasks.push_back({&s.k_enc, o0 - s.g0, o1 - s.g0, hs, hs + h_out, tk});
        tasks.push_back({&s.v_enc, o0 - s.g0, o1 - s.g0, hs, hs + h_out, tv});
      }
      covered += o1 - o0;
    }
    QVG_CHECK(covered == x1 - x0);  // every visible token is held by exactly one segment
  }
};

PackedCausalCache::PackedCausalCache(const CacheOptions& options, const QuantArgs& quant) {
  detail::validate_options(options);
  if (options.allow_growth)
    throw Unsupported("allow_growth must be false for the packed cache (its segments never grow), got true");
  if (quant.enabled())
    quant.validate_for_head_dim(options.head_dim);
  else
    quant.validate();
  impl_ = std::make_unique<Impl>(options, quant);
}

PackedCausalCache::~PackedCausalCache() = default;
PackedCausalCache::PackedCausalCache(PackedCausalCache&&) noexcept = default;
PackedCausalCache& PackedCausalCache::operator=(PackedCausalCache&&) noexcept = default;

KVView PackedCausalCache::do_update(ConstTensorView key, ConstTensorView value, int64_t c, std::optional<int64_t> hs,
                                    std::optional<int64_t> rw) {
  const Impl::Plan p = impl_->plan(key, value, c, hs, rw);
  return impl_->apply(p, key, value);
}

void PackedCausalCache::reset_indices() {
  impl_->segs.clear();
  impl_->ge = 0;
  impl_->chunk_tokens.reset();
  impl_->warm_k.reset();
  impl_->warm_v.reset();
  impl_->scratch->release();
  impl_->peak_transient = 0;
}

size_t PackedCausalCache::resident_nbytes() const {
  size_t n = 0;
  for (const Segment& s : impl_->segs) n += s.nbytes();
  return n;
}
size_t PackedCausalCache::peak_transient_nbytes() const { return impl_->peak_transient; }
int64_t PackedCausalCache::global_end() const { return impl_->ge; }
int64_t PackedCausalCache::local_end() const { return std::min(impl_->ge, impl_->cap); }
int64_t PackedCausalCache::cache_size() const { return impl_->cap; }
int64_t PackedCausalCache::attention_window_size() const { return impl_->window; }
int64_t PackedCausalCache::sink_tokens() const { return impl_->opt.sink_tokens; }
int64_t PackedCausalCache::batch() const { return impl_->opt.batch; }
int64_t PackedCausalCache::num_heads() const { return impl_->opt.heads; }
int64_t PackedCausalCache::head_dim() const { return impl_->opt.head_dim; }
DType PackedCausalCache::dtype() const { return impl_->opt.dtype; }
const QuantArgs& PackedCausalCache::quant_args() const { return impl_->quant; }
std::optional<int64_t> PackedCausalCache::chunk_tokens() const { return impl_->chunk_tokens; }

size_t PackedCausalCache::warm_state_nbytes() const {
  size_t n = 0;
  if (impl_->warm_k) n += codebook_nbytes(*impl_->warm_k);
  if (impl_->warm_v) n += codebook_nbytes(*impl_->warm_v);
  return n;
}

size_t PackedCausalCache::num_segments() const { return impl_->segs.size(); }

PackedCausalCache::SegmentInfo PackedCausalCache::segment(size_t i) const {
  QVG_CHECK(i < impl_->segs.size());
  const Segment& s = impl_->segs[i];
  const CacheOptions& o = impl_->opt;
  SegmentInfo info;
  info.g0 = s.g0;
  info.g1 = s.g1;
  info.is_sink = s.is_sink;
  info.packed = s.packed;
  info.current = i + 1 == impl_->segs.size();
  info.chunks = s.chunks;
  info.nbytes = s.nbytes();
  if (s.packed) {
    info.k_enc = &s.k_enc;
    info.v_enc = &s.v_enc;
  } else {
    info.k_raw = detail::dense_view(s.k_raw.data(), o.dtype, o.batch, s.tokens(), o.heads, o.head_dim);
    info.v_raw = detail::dense_view(s.v_raw.data(), o.dtype, o.batch, s.tokens(), o.heads, o.head_dim);
  }
  return info;
}

PackedCausalCache::DebugState PackedCausalCache::debug_state() const {
  DebugState st;
  for (const Segment& s : impl_->segs) {
    SegmentState ss;
    ss.g0 = s.g0;
    ss.g1 = s.g1;
    ss.is_sink = s.is_sink;
    ss.packed = s.packed;
    ss.chunks = s.chunks;
    const auto* kb = reinterpret_cast<const uint8_t*>(s.k_raw.data());
    const auto* vb = reinterpret_cast<const uint8_t*>(s.v_raw.data());
    ss.k_raw.assign(kb, kb + s.k_raw.size());
    ss.v_raw.assign(vb, vb + s.v_raw.size());
    ss.k_enc = s.k_enc;
    ss.v_enc = s.v_enc;
    st.segments.push_back(std::move(ss));
  }
  st.global_end = impl_->ge;
  st.local_end = local_end();
  st.chunk_tokens = impl_->chunk_tokens;
  st.warm_k = impl_->warm_k;
  st.warm_v = impl_->warm_v;
  st.resident_nbytes = resident_nbytes();
  st.peak_transient_nbytes = impl_->peak_transient;
  const auto* sb = reinterpret_cast<const uint8_t*>(impl_->scratch->data());
  st.view_scratch.assign(sb, sb + impl_->scratch->size());
  return st;
}

}  // namespace qvg
