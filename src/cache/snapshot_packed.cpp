// The records of a packed cache's snapshot (snapshot_records.h), each writer beside
// its reader: config, state (cursors; incremental spans' bookkeeping), span i (an
// incremental span's codebooks), segment i (raw K/V or encodings, a span chunk's
// refinement layers), warm_k / warm_v (warm-start codebooks).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/cache_policy.h"
#include "cache/snapshot_config.h"
#include "cache/snapshot_encoding.h"
#include "cache/snapshot_entries.h"
#include "cache/snapshot_records.h"
#include "cache/snapshot_validate.h"
#include "core/bytes_impl.h"

namespace qvg::detail::snap {

namespace {

// ---- state ----------------------------------------------------------------------------
// The counts of the sections that follow the state.
struct Counts {
  int64_t segments = 0, spans = 0;
  bool warm = false;
};

KvWriter state_entries(const PackedStateRef& st) {
  KvWriter kv;
  kv.i64("global_end", st.global_end);
  kv.opt_i64("chunk_tokens", st.chunk_tokens);
  kv.i64("segments", int64_t(st.segments.size()));
  kv.boolean("warm", st.warm_k != nullptr);
  if (incremental_spans(st.quant)) {
    const SpanState& ss = st.span_state;
    kv.i64("spans", int64_t(st.spans.size()));
    kv.i64("open_span", ss.open_span);
    kv.i64("open_span_chunks", ss.open_span_chunks);
    kv.i64("next_span", ss.next_span);
    kv.i64("span_breaks", ss.span_breaks);
    kv.real("open_k_energy", ss.open_k_energy);
    kv.real("open_v_energy", ss.open_v_energy);
  }
  return kv;
}

Counts get_state(KvReader kv, PackedStateData& d) {
  Counts n;
  d.global_end = kv.i64("global_end");
  d.chunk_tokens = kv.opt_i64("chunk_tokens");
  n.segments = kv.i64("segments");
  n.warm = kv.boolean("warm");
  if (incremental_spans(d.quant)) {
    SpanState& ss = d.span_state;
    n.spans = kv.i64("spans");
    ss.open_span = kv.i64("open_span");
    ss.open_span_chunks = kv.i32("open_span_chunks");
    ss.next_span = kv.i64("next_span");
    ss.span_breaks = kv.i64("span_breaks");
    ss.open_k_energy = kv.real("open_k_energy");
    ss.open_v_energy = kv.real("open_v_energy");
  }
  kv.expect_all_read();
  return n;
}

// ---- span i: i64 id, then per K and V the slots in use (u32 filled) and the codebook
// (layout and centroid arrays, all K slots) ---------------------------------------------
SectionOut put_span(const PackedSpanRef& sp, uint32_t index) {
  SectionOut s{Kind::Span, index, {}, {}};
  for (const SpanCodebook* b : {sp.k, sp.v}) {
    ByteWriter w;
    if (b == sp.k) w.put(sp.id);
    w.put(static_cast<uint32_t>(b->filled));
    s.own(std::move(w.bytes()));
    put_encoded(s, b->book, Arrays::CodebooksOnly);
  }
  return s;
}

PackedSpanData get_span(std::span<const uint8_t> bytes, const std::string& where, const CacheOptions& o,
                        const QuantArgs& q) {
  ByteReader r(bytes, "invalid snapshot: " + where);
  if (!q.enabled()) r.fail("a span codebook in a cache with quantization off");
  PackedSpanData sp;
  sp.id = r.get<int64_t>("span id");
  if (sp.id < 0 || sp.id > kMaxPosition) r.fail(fmt::format("span id {} is out of [0, 2^60]", sp.id));
  for (SpanCodebook* b : {&sp.k, &sp.v}) {
    const char* what = b == &sp.k ? "the K codebook" : "the V codebook";
    const uint32_t filled = r.get<uint32_t>("filled");
    b->book = get_encoded(r, Arrays::CodebooksOnly);
    const EncodingLayout& l = b->book;
    check_layout_fits(l, o, q, b == &sp.k ? CacheRole::Key : CacheRole::Value, false, 0, what);
    if (l.shape.s < 1 || l.shape.s > o.cache_size)
      r.fail(fmt::format("{} was made for a chunk of {} tokens, outside [1, cache_size = {}]", what, l.shape.s,
                         o.cache_size));
    if (filled < 1 || filled > uint32_t(l.centroids))
      r.fail(fmt::format("{} has {} slots in use, must be 1..{} (centroids)", what, filled, l.centroids));
    b->filled = int(filled);
    // Slots not yet in use are zero (a later chunk fills them; a warm start reads them).
    const size_t row = size_t(l.shape.d) * dtype_size(l.dtype);
    for (size_t st = 0; st < b->book.centroid.size(); ++st)
      for (int64_t g = 0; g < l.groups(); ++g) {
        const uint8_t* p = b->book.centroid[st].data() + size_t(g * l.centroids) * row;
        if (std::any_of(p + size_t(filled) * row, p + size_t(l.centroids) * row, [](uint8_t x) { return x != 0; }))
          r.fail(
              fmt::format("{}: stage {}, group {} holds a centroid in a slot not in use (>= {})", what, st, g, filled));
      }
  }
  r.expect_end();
  return sp;
}

// ---- segment i: i64 g0, g1, u8 is_sink, packed, u32 chunks, flags, [i64 span], then
// raw K and V, or K and V encodings [and K and V refinement layers] ------------------
SectionOut put_segment(const PackedSegmentRef& g, uint32_t index) {
  SectionOut s{Kind::Segment, index, {}, {}};
  ByteWriter w;
  w.put(g.g0);
  w.put(g.g1);
  w.put_bool(g.is_sink);
  w.put_bool(g.packed);
  w.put(static_cast<uint32_t>(g.chunks));
  w.put((g.span >= 0 ? kFlagSpanChunk : uint32_t(0)) | (g.k_ref ? kFlagRefined : uint32_t(0)));
  if (g.span >= 0) w.put(g.span);
  s.own(std::move(w.bytes()));
  if (g.packed) {
    const Arrays which = g.span >= 0 ? Arrays::WithoutCodebooks : Arrays::All;
    put_encoded(s, *g.k_enc, which);
    put_encoded(s, *g.v_enc, which);
    if (g.k_ref) {
      put_encoded(s, *g.k_ref, Arrays::All);
      put_encoded(s, *g.v_ref, Arrays::All);
    }
  } else {
    s.ref(g.k_raw);
    s.ref(g.v_raw);
  }
  return s;
}

// "0x1 and 0x2 only", "0x1 only", "none": the flags a version defines, for messages.
std::string flags_text(uint32_t known) {
  std::vector<std::string> bits;
  for (const FlagInfo& f : kSegmentFlags)
    if (known & f.bit) bits.push_back(fmt::format("0x{:x}", f.bit));
  if (bits.empty()) return "none";
  std::string t = bits.back();
  if (bits.size() > 1) {
    t = bits[0];
    for (size_t i = 1; i + 1 < bits.size(); ++i) t += ", " + bits[i];
    t += " and " + bits.back();
  }
  return t + " only";
}

// A segment's raw K and V, [B, n, H, D] each, holding what update() accepts (raw
// chunks are encoded later).
void get_raw(ByteReader& r, PackedSegmentData& s, const CacheOptions& o) {
  const int64_t n = s.g1 - s.g0;
  if (s.chunks != 1) r.fail(fmt::format("a raw segment holds one chunk, got chunks = {}", s.chunks));
  if (n > o.cache_size) r.fail(fmt::format("a raw chunk of {} tokens is longer than the cache ({})", n, o.cache_size));
  const size_t raw = size_t(o.batch * n * o.heads * o.head_dim) * dtype_size(o.dtype);
  if (r.remaining() != 2 * raw)
    r.fail(fmt::format("{} bytes of K and V, a raw [{}, {}, {}, {}] {} chunk has {}", r.remaining(), o.batch, n,
                       o.heads, o.head_dim, dtype_name(o.dtype), 2 * raw));
  for (AlignedBuffer* dst : {&s.k_raw, &s.v_raw}) {
    const auto b = r.get_bytes(raw, "raw K/V");
    *dst = AlignedBuffer::uninitialized(raw);
    std::memcpy(dst->data(), b.data(), raw);
    const ConstTensorView t{dst->data(), o.dtype, {o.batch, n, o.heads, o.head_dim}};
    check_finite_and_bounded(t, dst == &s.k_raw ? "raw K" : "raw V");
  }
}

// A refined chunk's K and V layers: whole f32 encodings of the layout the
// configuration implies (refinement_config of the settings and the role).
void get_refinement(ByteReader& r, PackedSegmentData& s, const CacheOptions& o, const QuantArgs& q) {
  const int64_t n = s.g1 - s.g0;
  for (std::optional<EncodedTensor>* ref : {&s.k_ref, &s.v_ref}) {
    const bool is_k = ref == &s.k_ref;
    *ref = get_encoded(r, Arrays::All);
    const CodecConfig want = refinement_config(q, q.codec_for(is_k ? CacheRole::Key : CacheRole::Value));
    const EncodingLayout expect = EncodingLayout::of({o.batch, n, o.heads, o.head_dim}, DType::F32, want);
    if (!(static_cast<const EncodingLayout&>(**ref) == expect))
      r.fail(
          fmt::format("the {} refinement layer is a {} {} encoding (bits={} centroids={} stages={}); this cache's "
                      "layers are {} {} encodings with {}",
                      is_k ? "K" : "V", (*ref)->shape.str(), dtype_name((*ref)->dtype), (*ref)->bits, (*ref)->centroids,
                      (*ref)->stages, expect.shape.str(), dtype_name(expect.dtype), want.describe()));
  }
}

PackedSegmentData get_segment(std::span<const uint8_t> bytes, const std::string& where, const CacheOptions& o,
                              const QuantArgs& q, uint16_t minor, std::vector<PackedSpanData>& spans) {
  ByteReader r(bytes, "invalid snapshot: " + where);
  PackedSegmentData s;
  s.g0 = r.get<int64_t>("g0");
  s.g1 = r.get<int64_t>("g1");
  s.is_sink = r.get_bool("is_sink");
  s.packed = r.get_bool("packed");
  const uint32_t chunks = r.get<uint32_t>("chunks");
  const uint32_t flags = r.get<uint32_t>("flags");
  const uint32_t known = known_segment_flags(minor);
  if (flags & ~known)
    r.fail(fmt::format("flags 0x{:x}: format {}.{} defines {} (a newer qvg may have written them)", flags,
                       kSnapshotMajor, minor, flags_text(known)));
  if ((flags & kFlagRefined) && (!(flags & kFlagSpanChunk) || !refines(q)))
    r.fail(
        fmt::format("a refined segment (flag 0x{:x}) must be a chunk of an incremental span (flag 0x{:x}) of a cache "
                    "that refines (flags 0x{:x}; settings {})",
                    kFlagRefined, kFlagSpanChunk, flags, q.describe()));
  if (s.g0 < 0 || s.g1 <= s.g0 || s.g1 > kMaxPosition)
    r.fail(fmt::format("token range [{}, {}) is empty or out of [0, 2^60]", s.g0, s.g1));
  if (chunks < 1 || chunks > uint32_t(INT32_MAX)) r.fail(fmt::format("chunks = {}, must be >= 1", chunks));
  s.chunks = int(chunks);
  if (s.is_sink != (s.g0 < o.sink_tokens))
    r.fail(fmt::format("is_sink = {} for a segment starting at {} (sink_tokens = {})", s.is_sink, s.g0, o.sink_tokens));
  if (flags & kFlagSpanChunk) {
    s.span = r.get<int64_t>("span");
    if (!incremental_spans(q) || !s.packed || s.is_sink || s.chunks != 1 || s.span < 0)
      r.fail(
          fmt::format("a chunk of span {} must be one packed non-sink chunk (chunks = 1) of a cache with incremental "
                      "spans, and its span id >= 0 (packed = {}, is_sink = {}, chunks = {}; settings {})",
                      s.span, s.packed, s.is_sink, s.chunks, q.describe()));
  } else if (s.packed && !s.is_sink && incremental_spans(q)) {
    r.fail(fmt::format(
        "a packed non-sink segment of a cache with incremental spans must be a chunk of a span (flag 0x{:x})",
        kFlagSpanChunk));
  }
  const int64_t n = s.g1 - s.g0;
  if (!s.packed) {
    get_raw(r, s, o);
    return s;
  }
  if (!q.enabled()) r.fail("a packed segment in a cache with quantization off");
  if (s.span < 0) {
    s.k_enc = get_encoded(r, Arrays::All);
    s.v_enc = get_encoded(r, Arrays::All);
    r.expect_end();
    check_layout_fits(s.k_enc, o, q, CacheRole::Key, true, n, "K");
    check_layout_fits(s.v_enc, o, q, CacheRole::Value, true, n, "V");
    return s;
  }
  const auto sp = std::lower_bound(spans.begin(), spans.end(), s.span,
                                   [](const PackedSpanData& a, int64_t id) { return a.id < id; });
  if (sp == spans.end() || sp->id != s.span) r.fail(fmt::format("span {} has no span section", s.span));
  s.k_enc = get_encoded(r, Arrays::WithoutCodebooks);
  s.v_enc = get_encoded(r, Arrays::WithoutCodebooks);
  check_layout_fits(s.k_enc, o, q, CacheRole::Key, true, n, "K");
  check_layout_fits(s.v_enc, o, q, CacheRole::Value, true, n, "V");
  check_span_chunk(s.k_enc, sp->k, "K");
  check_span_chunk(s.v_enc, sp->v, "V");
  if (flags & kFlagRefined) get_refinement(r, s, o, q);
  r.expect_end();
  return s;
}

// ---- warm_k, warm_v: a codebook's layout and centroid arrays ---------------------------
SectionOut put_warm(Kind kind, const EncodedTensor& w) {
  SectionOut s;
  s.kind = kind;
  put_encoded(s, w, Arrays::CodebooksOnly);
  return s;
}

EncodedTensor get_warm(std::span<const uint8_t> bytes, const std::string& where, CacheRole role, const CacheOptions& o,
                       const QuantArgs& q) {
  ByteReader r(bytes, "invalid snapshot: " + where);
  EncodedTensor w = get_encoded(r, Arrays::CodebooksOnly);
  r.expect_end();
  if (!q.enabled()) throw InvalidArgument("warm-start codebooks in a cache with quantization off");
  check_layout_fits(w, o, q, role, false, 0, "the warm-start codebook");
  return w;
}

}  // namespace

// ---- the file ---------------------------------------------------------------------------
Written write_packed(const PackedStateRef& st) {
  Written w;
  w.minor = minor_needed(st.options, &st.quant);
  w.sections.push_back(kv_section(Kind::Config, config_entries("packed", st.options, &st.quant, w.minor, st.device)));
  w.sections.push_back(kv_section(Kind::State, state_entries(st)));
  for (size_t i = 0; i < st.spans.size(); ++i) w.sections.push_back(put_span(st.spans[i], uint32_t(i)));
  for (size_t i = 0; i < st.segments.size(); ++i) w.sections.push_back(put_segment(st.segments[i], uint32_t(i)));
  if (st.warm_k) {
    w.sections.push_back(put_warm(Kind::WarmK, *st.warm_k));
    w.sections.push_back(put_warm(Kind::WarmV, *st.warm_v));
  }
  return w;
}

PackedStateData read_packed(const Source& src, const SnapshotExpectation& x) {
  Opened o = open_snapshot(src, "packed", x);
  PackedStateData d;
  d.options = o.config.options;
  d.quant = *o.config.quant;
  const uint16_t minor = o.table.minor;
  const std::vector<TableEntry>& t = o.table.entries;
  const TableEntry& state = t[kStateSection];
  if (state.kind != uint32_t(Kind::State))
    corrupt("section table", fmt::format("section {} is '{}', expected 'state'", kStateSection, state.name()));
  const Counts n = get_state(KvReader(read_entries(read_section(src, state).bytes, "state"), "state"), d);
  if (n.segments < 0 || uint64_t(n.segments) > t.size())
    corrupt("state", fmt::format("segments = {} but the file has {} sections", n.segments, t.size()));
  if (n.spans < 0 || uint64_t(n.spans) > t.size())
    corrupt("state", fmt::format("spans = {} but the file has {} sections", n.spans, t.size()));
  std::vector<std::pair<Kind, uint32_t>> want = {{Kind::Config, 0}, {Kind::State, 0}};
  for (int64_t i = 0; i < n.spans; ++i) want.emplace_back(Kind::Span, uint32_t(i));
  for (int64_t i = 0; i < n.segments; ++i) want.emplace_back(Kind::Segment, uint32_t(i));
  if (n.warm) want.insert(want.end(), {{Kind::WarmK, 0}, {Kind::WarmV, 0}});
  expect_sections(o.table, want);
  size_t next = kPayloadSection;
  d.spans.reserve(size_t(n.spans));
  for (int64_t i = 0; i < n.spans; ++i) {
    const TableEntry& e = t[next++];
    const SectionBytes b = read_section(src, e);
    d.spans.push_back(in_section(e.name(), [&] { return get_span(b.bytes, e.name(), d.options, d.quant); }));
    if (i > 0 && d.spans[size_t(i)].id <= d.spans[size_t(i) - 1].id)
      corrupt(e.name(), fmt::format("span id {} follows span id {} (span sections are in increasing id order)",
                                    d.spans[size_t(i)].id, d.spans[size_t(i) - 1].id));
  }
  d.segments.reserve(size_t(n.segments));
  for (int64_t i = 0; i < n.segments; ++i) {
    const TableEntry& e = t[next++];
    const SectionBytes b = read_section(src, e);
    d.segments.push_back(
        in_section(e.name(), [&] { return get_segment(b.bytes, e.name(), d.options, d.quant, minor, d.spans); }));
  }
  if (n.warm) {
    for (std::optional<EncodedTensor>* w : {&d.warm_k, &d.warm_v}) {
      const TableEntry& e = t[next++];
      const SectionBytes b = read_section(src, e);
      const CacheRole role = w == &d.warm_k ? CacheRole::Key : CacheRole::Value;
      *w = in_section(e.name(), [&] { return get_warm(b.bytes, e.name(), role, d.options, d.quant); });
    }
  }
  check_packed_state(d);
  return d;
}

}  // namespace qvg::detail::snap
