// PackedCausalCache (spec 4). update() = plan (validation, throws, no state
// change) + apply (write the chunk, pack-and-evict, build the view).
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {
namespace {

// A segment's bytes: raw [B, g1 - g0, H, D] K and V, or their encodings.
struct SegData {
  AlignedBuffer k_raw, v_raw;  // raw
  EncodedTensor k_enc, v_enc;  // packed
};
using Policy = detail::CachePolicy<SegData>;
using Segment = Policy::Segment;

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
  const int64_t capacity, window;
  CodecConfig codec;  // valid when quant.enabled()

  Policy pol;  // the segments (global order; the last is the current chunk) and their policy
  std::optional<EncodedTensor> warm_k, warm_v;  // codebooks of the last encodings (init = warm)
  std::shared_ptr<ViewScratch> scratch;  // K then V of the last copied view (maybe shared)
  size_t peak_transient = 0;

  Impl(const CacheOptions& o, const QuantArgs& q)
      : opt(o), quant(q), esz(dtype_size(o.dtype)), capacity(o.cache_size), window(o.window()), pol(o, q) {
    scratch = o.view_scratch ? o.view_scratch : std::make_shared<ViewScratch>();
    if (q.enabled()) {
      codec = q.codec();
      codec.head_offset = o.head_offset;  // a head shard draws the wide cache's PRNG streams
    }
  }

  size_t raw_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }

  /// Validation of the call (no state change): the policy's, then the values.
  detail::CallPlan plan(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                        std::optional<int64_t> head_start, std::optional<int64_t> recent_window) const {
    detail::CallPlan p = pol.plan(key, value, chunk_start, head_start, recent_window);
    detail::check_values(key, value);
    return p;
  }

  // --- pack ------------------------------------------------------------------
  EncodedTensor encode_one(const std::vector<const Segment*>& parts, bool is_k, detail::TransientMeter& meter) {
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
    const EncodedTensor* w = (codec.init == Init::Warm && warm) ? &*warm : nullptr;
    EncodedTensor enc = encode(in, codec, w);
    meter.add(enc.nbytes());
    if (concat.size()) meter.sub(concat.size());
    return enc;
  }

  /// Encodes the spans the policy picks; each replaces its raw chunks.
  void pack(detail::TransientMeter& meter) {
    pol.pack([&](const std::vector<const Segment*>& parts, Segment& packed) {
      packed.data.k_enc = encode_one(parts, true, meter);
      packed.data.v_enc = encode_one(parts, false, meter);
      if (codec.init == Init::Warm) {
        warm_k = packed.data.k_enc.codebooks_only();
        warm_v = packed.data.v_enc.codebooks_only();
      }
      meter.sub(detail::segment_bytes(packed));  // resident from here on; the raw chunks are gone
    });
  }

  // --- apply -----------------------------------------------------------------
  KVView apply(const detail::CallPlan& p, ConstTensorView key, ConstTensorView value) {
    detail::TransientMeter meter;
    const int64_t B = opt.batch, D = opt.head_dim, h_in = p.call.heads, head0 = p.call.head_start;
    // View = [0, sink_end) ++ [tail_start, end) in global tokens (the policy's
    // layout); a single range inside the current chunk is returned without a copy.
    const int64_t T = p.view.tokens;
    const size_t view_bytes = p.copies ? 2 * size_t(B * T * h_in * D) * esz : 0;
    // An advance that encodes frees an unshared view buffer first (lower peak while
    // encoding); a shared one is kept for the other caches that use it.
    if (scratch->size() != view_bytes || (p.advance && quant.enabled() && scratch.use_count() == 1))
      scratch->release();
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
      for (const detail::ViewPiece& pc : pol.view_pieces(p)) {
        Segment& s = segs[pc.seg];
        if (!s.packed) {
          detail::gather_rows(k_rows(s), pc.t0, pc.t1, head0, {vk, pc.out_t, 0});
          detail::gather_rows(v_rows(s), pc.t0, pc.t1, head0, {vv, pc.out_t, 0});
        } else {
          const DecodeTarget tk{vk.row(0, pc.out_t, 0), opt.dtype, T * h_in * D, h_in * D};
          const DecodeTarget tv{vv.row(0, pc.out_t, 0), opt.dtype, T * h_in * D, h_in * D};
          tasks.push_back({&s.data.k_enc, pc.t0, pc.t1, head0, head0 + h_in, tk});
          tasks.push_back({&s.data.v_enc, pc.t0, pc.t1, head0, head0 + h_in, tv});
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

PackedCausalCache::~PackedCausalCache() = default;
PackedCausalCache::PackedCausalCache(PackedCausalCache&&) noexcept = default;
PackedCausalCache& PackedCausalCache::operator=(PackedCausalCache&&) noexcept = default;

KVView PackedCausalCache::do_update(ConstTensorView key, ConstTensorView value, int64_t chunk_start,
                                    std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
  const detail::CallPlan p = impl_->plan(key, value, chunk_start, head_start, recent_window);
  return impl_->apply(p, key, value);
}

void PackedCausalCache::reset_indices() {
  impl_->pol.reset();
  impl_->warm_k.reset();
  impl_->warm_v.reset();
  impl_->scratch->release();
  impl_->peak_transient = 0;
}

size_t PackedCausalCache::resident_nbytes() const {
  size_t n = 0;
  for (const Segment& s : impl_->pol.segments()) n += detail::segment_bytes(s);
  return n;
}
size_t PackedCausalCache::peak_transient_nbytes() const { return impl_->peak_transient; }
int64_t PackedCausalCache::global_end() const { return impl_->pol.global_end(); }
int64_t PackedCausalCache::local_end() const { return impl_->pol.local_end(); }
int64_t PackedCausalCache::cache_size() const { return impl_->capacity; }
int64_t PackedCausalCache::attention_window_size() const { return impl_->window; }
const QuantArgs& PackedCausalCache::quant_args() const { return impl_->quant; }
std::optional<int64_t> PackedCausalCache::chunk_tokens() const { return impl_->pol.chunk_tokens(); }

size_t PackedCausalCache::warm_state_nbytes() const {
  size_t n = 0;
  if (impl_->warm_k) n += codebook_nbytes(*impl_->warm_k);
  if (impl_->warm_v) n += codebook_nbytes(*impl_->warm_v);
  return n;
}

WindowRanges PackedCausalCache::window_ranges() const {
  return impl_->pol.window_ranges_at(impl_->pol.global_end());
}

size_t PackedCausalCache::num_segments() const { return impl_->pol.segments().size(); }

PackedCausalCache::SegmentInfo PackedCausalCache::segment(size_t i) const {
  return detail::describe_segment<EncodedTensor>(impl_->pol, i, impl_->opt);
}

PackedCausalCache::DebugState PackedCausalCache::debug_state() const {
  DebugState st;
  for (const Segment& s : impl_->pol.segments())
    st.segments.push_back({s.g0, s.g1, s.is_sink, s.packed, s.chunks,
                           detail::bytes_copy(s.data.k_raw.data(), s.data.k_raw.size()),
                           detail::bytes_copy(s.data.v_raw.data(), s.data.v_raw.size()), s.data.k_enc, s.data.v_enc});
  st.global_end = impl_->pol.global_end();
  st.local_end = local_end();
  st.chunk_tokens = impl_->pol.chunk_tokens();
  st.warm_k = impl_->warm_k;
  st.warm_v = impl_->warm_v;
  st.resident_nbytes = resident_nbytes();
  st.peak_transient_nbytes = impl_->peak_transient;
  st.view_scratch = detail::bytes_copy(impl_->scratch->data(), impl_->scratch->size());
  return st;
}

}  // namespace qvg
