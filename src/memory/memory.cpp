// The exact memory model of the packed cache (include/qvg/eval/memory.h).
#include "qvg/eval/memory.h"

#include <algorithm>

#include <fmt/core.h>

#include "cache/cache_policy.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/eval/workload.h"

namespace qvg {

// ---- MemoryShape ----------------------------------------------------------------

int64_t MemoryShape::chunk_size(int64_t i) const {
  QVG_CHECK(i >= 0);
  const int64_t sc = sink_chunks();
  if (i < sc) return std::min(chunk_tokens, sink_tokens - i * chunk_tokens);
  return chunk_tokens;
}

size_t MemoryShape::raw_bytes(int64_t tokens) const {
  return 2 * size_t(tokens) * size_t(heads) * size_t(head_dim) * dtype_size(dtype);
}

void MemoryShape::validate() const {
  auto need = [](bool ok, std::string_view field, int64_t v, std::string_view allowed) {
    if (!ok) throw InvalidArgument(fmt::format("memory model: {} must be {}, got {}", field, allowed, v));
  };
  constexpr int64_t kMaxTokens = int64_t(1) << 34;
  need(layers >= 1 && layers <= 100000, "layers", layers, "in 1..100000");
  need(heads >= 1 && heads <= 4096, "heads", heads, "in 1..4096");
  need(head_dim >= 1 && head_dim <= 65536, "head_dim", head_dim, "in 1..65536");
  need(chunk_tokens >= 1 && chunk_tokens <= kMaxTokens, "chunk_tokens", chunk_tokens, "in 1..2^34");
  need(context_tokens >= 1 && context_tokens <= kMaxTokens, "context_tokens", context_tokens, "in 1..2^34");
  need(sink_tokens >= 0 && sink_tokens <= context_tokens, "sink_tokens", sink_tokens,
       fmt::format("in 0..context_tokens ({})", context_tokens));
}

MemoryShape MemoryShape::of(const ModelPreset& p, std::optional<int64_t> context_frames) {
  p.validate();
  const int64_t frames = context_frames.value_or(p.context_frames);
  if (frames < 1 || frames > 10'000'000)
    throw InvalidArgument(fmt::format("context frames must be in 1..10000000, got {}", frames));
  MemoryShape s;
  s.layers = p.layers;
  s.heads = p.heads;
  s.head_dim = p.head_dim;
  s.chunk_tokens = p.chunk_tokens();
  s.context_tokens = frames * p.tokens_per_frame();
  s.sink_tokens = std::min<int64_t>(p.sink_frames, frames) * p.tokens_per_frame();
  s.validate();
  return s;
}

CacheOptions MemoryShape::cache_options() const {
  CacheOptions o;
  o.batch = 1;
  o.cache_size = cache_tokens();  // window = cache_size: context + one chunk
  o.heads = heads;
  o.head_dim = head_dim;
  o.dtype = dtype;
  o.sink_tokens = sink_tokens;
  return o;
}

// ---- PolicyReplay ---------------------------------------------------------------

namespace {
/// The memory model's payload: the bytes a segment would hold.
struct Bytes {
  size_t k = 0, v = 0;
  size_t ref = 0;  ///< K + V refinement layers (a refined chunk)
};
}  // namespace

struct PolicyReplay::Impl {
  MemoryShape shape;
  QuantArgs args;
  CodecConfig codec;
  detail::CachePolicy<Bytes> pol;
  std::vector<SegmentSize> segs;
  std::vector<PolicyStep> steps;
  int64_t next_chunk = 0;

  Impl(const MemoryShape& s, const QuantArgs& q) : shape(s), args(q), pol(s.cache_options(), q) {
    if (q.enabled()) codec = q.codec;
  }
};

PolicyReplay::PolicyReplay(const MemoryShape& shape, const QuantArgs& args) {
  shape.validate();
  args.validate_for_head_dim(shape.head_dim);
  impl_ = std::make_unique<Impl>(shape, args);
}
PolicyReplay::~PolicyReplay() = default;
PolicyReplay::PolicyReplay(PolicyReplay&&) noexcept = default;
PolicyReplay& PolicyReplay::operator=(PolicyReplay&&) noexcept = default;

const std::vector<SegmentSize>& PolicyReplay::segments() const { return impl_->segs; }
const std::vector<PolicyStep>& PolicyReplay::steps() const { return impl_->steps; }

namespace {
// One role's bytes (per-role settings: K and V may be encoded differently).
size_t role_span_bytes(const MemoryShape& m, const QuantArgs& a, CacheRole role, int64_t tokens) {
  const Shape4 s{1, tokens, m.heads, m.head_dim};
  return EncodedTensor::predicted_nbytes(s, m.dtype, a.codec_for(role));
}
size_t role_codebook_bytes(const MemoryShape& m, const QuantArgs& a, CacheRole role) {
  const Shape4 s{1, 1, m.heads, m.head_dim};
  const EncodingLayout l = EncodingLayout::of(s, m.dtype, a.codec_for(role));
  size_t n = 0;
  for (const ArrayDesc& d : l.arrays())
    if (d.kind == EncodedArray::Centroids) n += d.bytes();
  return n;
}
size_t role_chunk_data_bytes(const MemoryShape& m, const QuantArgs& a, CacheRole role, int64_t tokens) {
  return role_span_bytes(m, a, role, tokens) - role_codebook_bytes(m, a, role);
}
/// A refinement layer of one role's chunk: an f32 encoding (refinement_config).
size_t role_refine_bytes(const MemoryShape& m, const QuantArgs& a, CacheRole role, int64_t tokens) {
  const Shape4 s{1, tokens, m.heads, m.head_dim};
  return EncodedTensor::predicted_nbytes(s, DType::F32, refinement_config(a, a.codec_for(role)));
}
}  // namespace

size_t PolicyReplay::span_bytes(int64_t tokens) const {
  return role_span_bytes(impl_->shape, impl_->args, CacheRole::Key, tokens) +
         role_span_bytes(impl_->shape, impl_->args, CacheRole::Value, tokens);
}

size_t PolicyReplay::codebook_bytes() const {
  return role_codebook_bytes(impl_->shape, impl_->args, CacheRole::Key) +
         role_codebook_bytes(impl_->shape, impl_->args, CacheRole::Value);
}

size_t PolicyReplay::chunk_data_bytes(int64_t tokens) const { return span_bytes(tokens) - codebook_bytes(); }

size_t PolicyReplay::refine_bytes(int64_t tokens) const {
  if (!impl_->args.enabled() || !detail::refines(impl_->args)) return 0;
  return role_refine_bytes(impl_->shape, impl_->args, CacheRole::Key, tokens) +
         role_refine_bytes(impl_->shape, impl_->args, CacheRole::Value, tokens);
}

const PolicyStep& PolicyReplay::advance(const JoinDecision& join) {
  Impl& m = *impl_;
  const int64_t n = m.shape.chunk_size(m.next_chunk);
  const size_t raw_half = m.shape.raw_bytes(n) / 2;
  // The policy's plan of the advance, executed on sizes: each step's encoded bytes,
  // and for an incremental chunk the decision `join` gives (consumed for every
  // incremental chunk, in order; it counts only when the chunk may join).
  const detail::PackPlan plan = m.pol.plan_pack(m.pol.global_end(), n);
  detail::SpanDecisions decisions = m.pol.span_decisions(plan);
  std::vector<Bytes> encoded;
  for (const detail::EncodeStep& e : plan.encodes) {
    auto role_bytes = [&](CacheRole r) {
      return e.incremental ? role_chunk_data_bytes(m.shape, m.args, r, e.tokens())
                           : role_span_bytes(m.shape, m.args, r, e.tokens());
    };
    encoded.push_back(
        {role_bytes(CacheRole::Key), role_bytes(CacheRole::Value), e.refine ? refine_bytes(e.tokens()) : 0});
    if (e.incremental) decisions.decide(!join || join());
  }
  m.pol.apply(plan, Bytes{raw_half, raw_half}, std::move(encoded), decisions);
  for (const size_t i : plan.drop_refinement) m.pol.segments()[i].data.ref = 0;  // aged out

  m.segs.clear();
  PolicyStep st;
  st.chunk = m.next_chunk++;
  st.global_end = m.pol.global_end();
  const size_t book = m.args.enabled() ? codebook_bytes() : 0;
  for (const auto& p : m.pol.segments()) {
    const SegmentSize s{p.g0, p.g1, p.chunks, p.is_sink, p.packed, p.data.k, p.data.v, p.span, p.data.ref};
    m.segs.push_back(s);
    (s.packed ? st.packed_bytes : st.raw_bytes) += s.bytes();
    st.refine_bytes += s.refine_bytes;
    (s.packed ? st.packed_tokens : st.raw_tokens) += s.tokens();
  }
  st.resident_bytes = detail::resident_bytes(
      m.pol, [](const detail::PlanSegment<Bytes>& p) { return p.data.k + p.data.v + p.data.ref; },
      [&](const detail::PlanSegment<Bytes>&) { return book; });
  st.codebook_bytes = st.resident_bytes - st.raw_bytes - st.packed_bytes;
  st.packed_bytes += st.codebook_bytes;
  st.segments = int64_t(m.segs.size());
  m.steps.push_back(st);
  return m.steps.back();
}

// ---- the report -----------------------------------------------------------------

double MemoryReport::ratio() const {
  return packed_context_bytes > 0 ? double(raw_context_bytes) / double(packed_context_bytes) : 0.0;
}
double MemoryReport::policy_ratio() const {
  return policy_peak_bytes > 0 ? double(raw_context_bytes) / double(policy_peak_bytes) : 0.0;
}
double MemoryReport::policy_ratio_vs_dense_window() const {
  return policy_peak_bytes > 0 ? double(dense_window_bytes) / double(policy_peak_bytes) : 0.0;
}

namespace {

/// The chunks replayed before the measured period: after the sink is complete every
/// chunk has the same size, so from here the state relative to global_end repeats
/// with the span period.
int64_t steady_from(const MemoryShape& shape, const QuantArgs& args, int64_t period) {
  const int64_t window_chunks = (shape.cache_tokens() + shape.chunk_tokens - 1) / shape.chunk_tokens;
  return shape.sink_chunks() + window_chunks + period + (args.enabled() ? args.keep_recent_chunks : 0) + 2;
}

/// The step of the steady-state peak, replayed from an empty cache: steady_from
/// chunks, then the first maximum over one period (checked to repeat the period
/// before); adds the chunks it replays to `replayed`. Costs O(window chunks x
/// segments): quadratic in the context.
PolicyStep replayed_peak(const MemoryShape& shape, const QuantArgs& args, int64_t period, int64_t& replayed) {
  PolicyReplay replay(shape, args);
  const int64_t from = steady_from(shape, args, period);
  replayed += from + 2 * period;
  for (int64_t i = 0; i < from + 2 * period; ++i) replay.advance();
  const auto& steps = replay.steps();
  const size_t end = steps.size();
  PolicyStep peak;
  for (size_t i = end - size_t(period); i < end; ++i) {
    QVG_CHECK(steps[i].resident_bytes == steps[i - size_t(period)].resident_bytes);
    if (steps[i].resident_bytes > peak.resident_bytes) peak = steps[i];
  }
  return peak;
}

/// a + k (b - a), field by field, for every figure of a step.
PolicyStep extrapolated(const PolicyStep& a, const PolicyStep& b, int64_t k) {
  const auto u = [k](size_t x, size_t y) { return size_t(int64_t(x) + k * (int64_t(y) - int64_t(x))); };
  const auto i = [k](int64_t x, int64_t y) { return x + k * (y - x); };
  PolicyStep r;
  r.chunk = i(a.chunk, b.chunk);
  r.global_end = i(a.global_end, b.global_end);
  r.resident_bytes = u(a.resident_bytes, b.resident_bytes);
  r.raw_bytes = u(a.raw_bytes, b.raw_bytes);
  r.packed_bytes = u(a.packed_bytes, b.packed_bytes);
  r.codebook_bytes = u(a.codebook_bytes, b.codebook_bytes);
  r.refine_bytes = u(a.refine_bytes, b.refine_bytes);
  r.raw_tokens = i(a.raw_tokens, b.raw_tokens);
  r.packed_tokens = i(a.packed_tokens, b.packed_tokens);
  r.segments = i(a.segments, b.segments);
  return r;
}

/// The steady-state peak in time independent of the context length (the replay from an
/// empty cache is quadratic in the context, 60 s at 100,000 frames;
/// docs/reliability.md). A longer context by one span period (period x chunk_tokens
/// tokens) adds one full span in the middle of the window at the same phase: the steady
/// state is the shorter one's with that span inserted (its bytes, tokens and segment;
/// the peak one period later), so every figure of the peak step is linear in the number
/// of periods. The peak is replayed on the context shortened by k periods to a window
/// of about `base` chunks (the sink, the raw and refined tail and four periods), on
/// that plus one and plus two periods, and extrapolated to k; the three replays must be
/// exactly linear (else — never seen — the full replay is used). Exact: the tests
/// compare it with the full replay over contexts and settings.
PolicyStep policy_peak(const MemoryShape& shape, const QuantArgs& args, int64_t period, int64_t& replayed) {
  const int64_t window_chunks = (shape.cache_tokens() + shape.chunk_tokens - 1) / shape.chunk_tokens;
  const int64_t tail = args.enabled() ? args.keep_recent_chunks + detail::refined_chunks_kept(args) : 0;
  const int64_t base = shape.sink_chunks() + tail + 4 * period + 8;
  const int64_t k = (window_chunks - base) / period;
  if (k < 3) return replayed_peak(shape, args, period, replayed);
  auto shortened = [&](int64_t periods) {
    MemoryShape s = shape;
    s.context_tokens -= periods * period * shape.chunk_tokens;
    return s;
  };
  const PolicyStep a = replayed_peak(shortened(k), args, period, replayed);
  const PolicyStep b = replayed_peak(shortened(k - 1), args, period, replayed);
  const PolicyStep c = replayed_peak(shortened(k - 2), args, period, replayed);
  const PolicyStep c_pred = extrapolated(a, b, 2);
  const bool linear = c.chunk == c_pred.chunk && c.global_end == c_pred.global_end &&
                      c.resident_bytes == c_pred.resident_bytes && c.raw_bytes == c_pred.raw_bytes &&
                      c.packed_bytes == c_pred.packed_bytes && c.codebook_bytes == c_pred.codebook_bytes &&
                      c.refine_bytes == c_pred.refine_bytes && c.raw_tokens == c_pred.raw_tokens &&
                      c.packed_tokens == c_pred.packed_tokens && c.segments == c_pred.segments;
  return linear ? extrapolated(a, b, k) : replayed_peak(shape, args, period, replayed);
}

}  // namespace

// The model-level peak (reporting only: computed from the per-layer figures above).
size_t MemoryReport::model_peak_bytes(ViewMemory views) const {
  const size_t view_windows = views == ViewMemory::Shared ? 1 : size_t(shape.layers);
  return total(policy_peak_bytes) + view_windows * view_window_bytes;
}
double MemoryReport::model_peak_ratio(ViewMemory views) const {
  const size_t peak = model_peak_bytes(views);
  return peak > 0 ? double(dense_model_bytes()) / double(peak) : 0.0;
}

// Branches (reporting only: from the peak step's split into raw and packed bytes).
namespace {
void check_branches(int64_t n) {
  if (n < 1 || n > kMaxBranches)
    throw InvalidArgument(fmt::format("memory model: branches n must be in 1..{}, got {}", kMaxBranches, n));
}
}  // namespace

size_t MemoryReport::branches_bytes(int64_t n) const {
  check_branches(n);
  QVG_CHECK(peak_step.raw_bytes + peak_step.packed_bytes == peak_step.resident_bytes);
  return peak_step.packed_bytes + size_t(n) * peak_step.raw_bytes;
}
size_t MemoryReport::model_branches_bytes(int64_t n) const {
  return total(branches_bytes(n)) + size_t(n) * view_window_bytes;
}
BranchesMemory MemoryReport::branches(int64_t n) const {
  BranchesMemory b;
  b.n = n;
  b.forked_bytes = branches_bytes(n);  // checks n
  b.shared_bytes = peak_step.packed_bytes;
  b.own_bytes = peak_step.raw_bytes;
  b.copies_bytes = size_t(n) * policy_peak_bytes;
  b.dense_bytes = size_t(n) * dense_window_bytes;
  b.model_forked_bytes = model_branches_bytes(n);
  b.model_copies_bytes = size_t(n) * model_peak_bytes(ViewMemory::Shared);
  b.model_dense_bytes = size_t(n) * dense_model_bytes();
  return b;
}
double BranchesMemory::ratio_vs_copies() const {
  return model_forked_bytes > 0 ? double(model_copies_bytes) / double(model_forked_bytes) : 0.0;
}
double BranchesMemory::ratio_vs_dense() const {
  return model_forked_bytes > 0 ? double(model_dense_bytes) / double(model_forked_bytes) : 0.0;
}

MemoryReport memory_report(const MemoryShape& shape, const QuantArgs& args) {
  PolicyReplay replay(shape, args);  // validates both
  MemoryReport r;
  r.shape = shape;
  r.args = args;
  r.raw_context_bytes = shape.raw_bytes(shape.context_tokens);
  r.dense_window_bytes = shape.raw_bytes(shape.cache_tokens());
  r.view_window_bytes = r.dense_window_bytes;  // the view is in the cache dtype, K and V

  // Fully encoded context.
  auto raw_seg = [&](int64_t g0, int64_t g1, bool sink, int64_t chunks) {
    SegmentSize s;
    s.g0 = g0;
    s.g1 = g1;
    s.sink = sink;
    s.chunks = chunks;
    s.k_bytes = s.v_bytes = shape.raw_bytes(g1 - g0) / 2;
    return s;
  };
  const bool incremental = args.enabled() && detail::incremental_spans(args);
  auto span_seg = [&](int64_t g0, int64_t g1, bool sink, int64_t chunks) {
    SegmentSize s = raw_seg(g0, g1, sink, chunks);
    s.packed = true;
    s.k_bytes = role_span_bytes(shape, args, CacheRole::Key, g1 - g0);
    s.v_bytes = role_span_bytes(shape, args, CacheRole::Value, g1 - g0);
    if (incremental && !sink) {  // one codebook, then each chunk's data arrays (own factors)
      for (const CacheRole role : {CacheRole::Key, CacheRole::Value}) {
        size_t bytes = role_codebook_bytes(shape, args, role);
        for (int64_t t = g0; t < g1; t += shape.chunk_tokens)
          bytes += role_chunk_data_bytes(shape, args, role, std::min(g1, t + shape.chunk_tokens) - t);
        (role == CacheRole::Key ? s.k_bytes : s.v_bytes) = bytes;
      }
    }
    return s;
  };
  const bool on = args.enabled();
  int64_t g = 0;
  std::vector<std::pair<int64_t, int64_t>> pending_sink;  // sink chunks to span together (full)
  for (int64_t i = 0; i < shape.sink_chunks(); ++i) {
    const int64_t n = shape.chunk_size(i);
    if (!detail::packs_sink_chunk(args, i))
      r.context_layout.push_back(raw_seg(g, g + n, true, 1));
    else if (!detail::sink_packed_whole(args))
      r.context_layout.push_back(span_seg(g, g + n, true, 1));
    else
      pending_sink.emplace_back(g, g + n);
    g += n;
  }
  if (!pending_sink.empty())
    r.context_layout.push_back(
        span_seg(pending_sink.front().first, pending_sink.back().second, true, int64_t(pending_sink.size())));
  const int64_t span_tokens = on ? detail::span_capacity(args) * shape.chunk_tokens : shape.chunk_tokens;
  while (g < shape.context_tokens) {
    const int64_t e = std::min(shape.context_tokens, g + span_tokens);
    const int64_t chunks = (e - g + shape.chunk_tokens - 1) / shape.chunk_tokens;
    r.context_layout.push_back(on ? span_seg(g, e, false, chunks) : raw_seg(g, e, false, chunks));
    g = e;
  }
  for (const SegmentSize& s : r.context_layout) r.packed_context_bytes += s.bytes();

  // Policy peak: the steady state's maximum over one span period (policy_peak).
  const int64_t period = on ? detail::span_capacity(args) : 1;
  r.steady_from = steady_from(shape, args, period);
  r.period_chunks = period;
  r.peak_step = policy_peak(shape, args, period, r.replayed_chunks);
  r.policy_peak_bytes = r.peak_step.resident_bytes;
  r.peak_chunk = r.peak_step.chunk;
  return r;
}

}  // namespace qvg
