// qvg::cuda::PackedCausalCache: the device-resident packed cache, built into the
// CUDA library. The policy (validation, eviction, spans, view ranges) is
// CachePolicy (src/cache/cache_policy.h), the one the CPU cache runs too; this file
// executes its plans with the CUDA backend (src/kernels/cuda): raw chunks by
// cudaMemcpy2DAsync, the plan's spans by the device encoder, windows by one
// decode_ranges. Every allocation of an update() happens before the policy changes:
// the spans of an advance's PackPlan are encoded first (encode_steps), then the
// policy installs them (CachePolicy::apply).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "cache/cuda/device_copy.h"
#include "kernels/cuda/check.h"
#include "qvg/cuda.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

namespace qvg::cuda {
namespace {

/// A segment's device data: K and V raw ([B, tokens, H, D] dense) or encoded.
struct SegData {
  DeviceBuffer k_raw, v_raw;
  DeviceEncodedTensor k_enc, v_enc;
};

using Policy = qvg::detail::CachePolicy<SegData>;
using Seg = Policy::Segment;

}  // namespace

using cache_detail::copy2d;

struct PackedCausalCache::Impl {
  const CacheOptions opt;
  const QuantArgs quant;
  Allocator* alloc;
  const size_t esz;
  CodecConfig codec;  // valid when quant.enabled()
  Policy pol;
  DeviceBuffer view;  // K then V of the last copied view

  Impl(const CacheOptions& o, const QuantArgs& q, Allocator& a)
      : opt(o), quant(q), alloc(&a), esz(dtype_size(o.dtype)), pol(o, q) {
    if (q.enabled()) {
      codec = q.codec();
      codec.head_offset = o.head_offset;  // a head shard draws the wide cache's PRNG streams
    }
  }

  size_t raw_bytes(int64_t tokens) const { return size_t(opt.batch * tokens * opt.heads * opt.head_dim) * esz; }

  /// Writes the call's [B, n, h_in, D] rows into a raw [B, n, H, D] segment buffer
  /// at head head0 (B * n rows, one 2D copy).
  void write_chunk(ConstTensorView src, void* dst, int64_t head0, Stream s) const {
    const int64_t B = src.shape.b, n = src.shape.s, h_in = src.shape.h, D = opt.head_dim, H = opt.heads;
    const size_t row = size_t(h_in * D) * esz;
    copy2d(static_cast<std::byte*>(dst) + size_t(head0 * D) * esz, size_t(H * D) * esz, src.data, row, row,
           size_t(B * n), s);
  }

  /// The device encoding of one span's K or V (parts concatenated when several).
  DeviceEncodedTensor encode_one(const std::vector<const Seg*>& parts, bool is_k, Stream s) const {
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
    return encode(in, codec, s, *alloc);
  }

  /// The encodings of the steps of an advance's plan, in order, made from the raw
  /// segments before anything changes (they exist already: the call's own chunk is
  /// never part of a span). An allocation failure here leaves the cache as it was.
  std::vector<SegData> encode_steps(const qvg::detail::PackPlan& pp, Stream s) const {
    std::vector<SegData> out;
    out.reserve(pp.encodes.size());
    for (const qvg::detail::EncodeStep& e : pp.encodes) {
      QVG_CHECK(!e.incremental);  // rejected at construction
      std::vector<const Seg*> parts;
      for (size_t i = e.first; i < e.first + e.count; ++i) parts.push_back(&pol.segments()[i]);
      SegData d;
      d.k_enc = encode_one(parts, true, s);
      d.v_enc = encode_one(parts, false, s);
      out.push_back(std::move(d));
    }
    return out;
  }

  KVView update(ConstTensorView key, ConstTensorView value, int64_t chunk_start, Stream s,
                std::optional<int64_t> head_start, std::optional<int64_t> recent_window) {
    // --- validation: throws, changes nothing ---------------------------------
    const qvg::detail::PackedPlan plan = pol.plan(key, value, chunk_start, head_start, recent_window);
    const qvg::detail::CallPlan& p = plan.call;
    check_input_limits(key, "key", value, "value", s, *alloc);  // one flag buffer, one synchronization

    const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim, h_in = p.call.heads, n = p.call.n;
    const int64_t head0 = p.call.head_start, T = p.view.tokens;
    const size_t view_bytes = p.copies ? 2 * size_t(B * T * h_in * D) * esz : 0;
    // New buffers and the spans' encodings first (an allocation failure here still
    // changes nothing).
    SegData cur;
    std::vector<SegData> encoded;
    if (p.advance) {
      cur.k_raw = DeviceBuffer(raw_bytes(n), s, *alloc);
      cur.v_raw = DeviceBuffer(raw_bytes(n), s, *alloc);
      encoded = encode_steps(*plan.pack, s);
    }
    DeviceBuffer new_view;
    if (view_bytes && view.size() != view_bytes) new_view = DeviceBuffer(view_bytes, s, *alloc);
    // --- from here on state changes; only CUDA errors can interrupt it ---------
    if (!view_bytes) view = DeviceBuffer();
    if (new_view.size()) view = std::move(new_view);
    if (p.advance) {
      if (h_in != H) {  // zeros in the heads this call does not write
        QVG_CUDA(cudaMemsetAsync(cur.k_raw.data(), 0, cur.k_raw.size(), s));
        QVG_CUDA(cudaMemsetAsync(cur.v_raw.data(), 0, cur.v_raw.size(), s));
      }
      write_chunk(key, cur.k_raw.data(), head0, s);
      write_chunk(value, cur.v_raw.data(), head0, s);
      // No incremental chunks, hence no decisions to make, and no refinement layers.
      pol.apply(*plan.pack, std::move(cur), std::move(encoded),
                qvg::detail::SpanDecisions(*plan.pack, quant.span_chunks));
    } else {
      Seg& c_seg = pol.segments().back();
      write_chunk(key, c_seg.data.k_raw.data(), head0, s);
      write_chunk(value, c_seg.data.v_raw.data(), head0, s);
    }

    KVView out;
    const Seg& cs = pol.segments().back();
    if (!p.copies) {
      out.k = qvg::detail::sub_view(qvg::detail::rows_of(static_cast<const void*>(cs.data.k_raw.data()), opt, cs.tokens()),
                                    p.view.tail_start - cs.g0, T, head0, h_in);
      out.v = qvg::detail::sub_view(qvg::detail::rows_of(static_cast<const void*>(cs.data.v_raw.data()), opt, cs.tokens()),
                                    p.view.tail_start - cs.g0, T, head0, h_in);
      out.zero_copy = true;
    } else {
      auto* vk = static_cast<std::byte*>(view.data());
      std::byte* vv = vk + view_bytes / 2;
      const size_t out_row = size_t(h_in * D) * esz;   // one token of the view
      const size_t view_batch = size_t(T) * out_row;    // one batch of the view
      std::vector<DeviceDecodeTask> tasks;
      for (const qvg::detail::ViewPiece& pc : plan.pieces) {
        const Seg& sg = pol.segments()[pc.seg];
        const size_t off = size_t(pc.out_t) * out_row;
        if (!sg.packed) {
          const size_t seg_row = size_t(H * D) * esz, seg_batch = size_t(sg.tokens()) * seg_row;
          const size_t src_off = size_t(pc.t0) * seg_row + size_t(head0 * D) * esz;
          for (int64_t b = 0; b < B; ++b) {
            copy2d(vk + size_t(b) * view_batch + off, out_row,
                   static_cast<const std::byte*>(sg.data.k_raw.data()) + size_t(b) * seg_batch + src_off, seg_row,
                   out_row, size_t(pc.t1 - pc.t0), s);
            copy2d(vv + size_t(b) * view_batch + off, out_row,
                   static_cast<const std::byte*>(sg.data.v_raw.data()) + size_t(b) * seg_batch + src_off, seg_row,
                   out_row, size_t(pc.t1 - pc.t0), s);
          }
        } else {
          const DeviceDecodeTarget tk{vk + off, opt.dtype, T * h_in * D, h_in * D};
          const DeviceDecodeTarget tv{vv + off, opt.dtype, T * h_in * D, h_in * D};
          tasks.push_back({&sg.data.k_enc, pc.t0, pc.t1, head0, head0 + h_in, tk});
          tasks.push_back({&sg.data.v_enc, pc.t0, pc.t1, head0, head0 + h_in, tv});
        }
      }
      // The call's own chunk is the view's last n tokens: copied from the input.
      const size_t chunk = size_t(n) * out_row, at = size_t(T - n) * out_row;
      copy2d(vk + at, view_batch, key.data, chunk, chunk, size_t(B), s);
      copy2d(vv + at, view_batch, value.data, chunk, chunk, size_t(B), s);
      if (!tasks.empty()) decode_ranges(tasks, s);
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
  if (quant.enabled() && quant.span_mode != SpanMode::Deferred)
    throw Unsupported(fmt::format(
        "span_mode must be deferred for the device packed cache (the CUDA encoder cannot yet encode against a "
        "span's fixed codebook), got {}",
        name(quant.span_mode)));
  if (quant.enabled() && quant.init != Init::Random)
    throw Unsupported(fmt::format(
        "init must be random for the device packed cache (the CUDA encoder supports random init only), got {}",
        name(quant.init)));
  if (quant.enabled() && quant.scale_search != ScaleSearch::Off)
    throw Unsupported(fmt::format(
        "scale_search must be off for the device packed cache (the CUDA encoder chooses scales from the block "
        "maxima only), got {}",
        name(quant.scale_search)));
  if (quant.enabled() && quant.per_role())
    throw Unsupported(
        fmt::format("per-role settings are not supported by the device packed cache (it encodes K and V with one "
                    "configuration), got {}",
                    quant.describe()));
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
  impl_->view = DeviceBuffer();
}

size_t PackedCausalCache::resident_nbytes() const {
  size_t n = 0;
  for (const Seg& s : impl_->pol.segments()) n += qvg::detail::segment_bytes(s);  // no incremental spans here
  return n;
}
size_t PackedCausalCache::allocated_nbytes() const {
  size_t n = 0;
  for (const Seg& s : impl_->pol.segments())
    n += s.packed ? s.data.k_enc.allocated_bytes() + s.data.v_enc.allocated_bytes()
                  : s.data.k_raw.size() + s.data.v_raw.size();
  return n;
}
size_t PackedCausalCache::view_buffer_nbytes() const { return impl_->view.size(); }
int64_t PackedCausalCache::global_end() const { return impl_->pol.global_end(); }
int64_t PackedCausalCache::local_end() const { return impl_->pol.local_end(); }
int64_t PackedCausalCache::cache_size() const { return impl_->opt.cache_size; }
int64_t PackedCausalCache::attention_window_size() const { return impl_->opt.window(); }
const QuantArgs& PackedCausalCache::quant_args() const { return impl_->quant; }
std::optional<int64_t> PackedCausalCache::chunk_tokens() const { return impl_->pol.chunk_tokens(); }
size_t PackedCausalCache::num_segments() const { return impl_->pol.segments().size(); }

PackedCausalCache::SegmentInfo PackedCausalCache::segment(size_t i) const {
  const auto& segs = impl_->pol.segments();
  if (i >= segs.size())
    throw InvalidArgument(fmt::format("segment index i must be < num_segments() = {}, got {}", segs.size(), i));
  return qvg::detail::describe_segment<DeviceEncodedTensor>(impl_->pol, i, impl_->opt);
}

}  // namespace qvg::cuda
