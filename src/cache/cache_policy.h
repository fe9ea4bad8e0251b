// src/cache/cache_policy.h — the segment policy of the packed cache (spec 4): the
// segment list and cursors, validation of a call, the view's layout and pieces, and
// the plan of an advance (PackPlan, src/cache/packed_plan.h) and its application.
// Plain C++ with the data abstracted into a payload P carried by every segment, so
// that one policy serves everything that needs it: the CPU qvg::PackedCausalCache
// (host buffers and EncodedTensors), the device-resident
// qvg::cuda::PackedCausalCache (device buffers and DeviceEncodedTensors) and the
// memory model qvg::PolicyReplay (byte counts). The host test
// tests/test_cache_plan.cpp drives it with an empty payload against the
// independent model of tests/support/cache_model.
//
// An update() is plan, execute, apply: plan() (const: validation, the view, the
// advance's PackPlan) throws or decides; the backend executes the plan without
// changing the policy (writes the new chunk, encodes each step, decides the
// incremental chunks' spans with SpanDecisions); apply() installs the outcome.
//
// Names: positions are global token indices unless called "local"; a call writes
// the chunk [start, end) (CallArgs); the view of a call shows the global ranges
// [0, view.sink_end) ++ [view.tail_start, view.end), view.tokens tokens in all.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/packed_plan.h"
#include "qvg/cache.h"
#include "qvg/config.h"
#include "qvg/error.h"

namespace qvg::detail {

template <class T>
inline constexpr bool kIsSharedPtr = false;
template <class T>
inline constexpr bool kIsSharedPtr<std::shared_ptr<T>> = true;

/// A payload's encoding as a reference. The packed caches hold their encodings through
/// std::shared_ptr<const Enc> (immutable once made, shared by a cache's forks: cache.h,
/// "Branches"); the memory model and the tests' payloads hold them as values.
template <class T>
const auto& held(const T& x) {
  if constexpr (kIsSharedPtr<T>)
    return *x;
  else
    return x;
}
/// Stores a new encoding `e` in a payload member `to` (either kind, as held()).
template <class T, class E>
void hold(T& to, E&& e) {
  if constexpr (kIsSharedPtr<T>)
    to = std::make_shared<const std::remove_cvref_t<E>>(std::forward<E>(e));
  else
    to = std::forward<E>(e);
}

template <class P>
struct PlanSegment {
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false;
  int chunks = 1;
  bool packed = false;
  /// A chunk of an incremental span (span_mode = incremental): the span's id, shared
  /// by every chunk encoded with the span's codebook; -1 for raw segments and for
  /// spans encoded whole (deferred and sink spans).
  int64_t span = -1;
  /// Holds refinement layers (refine_recent; the payload holds them exactly then).
  bool refined = false;
  P data;  // raw chunk, encoded span or encoded chunk (the user's payload)

  int64_t tokens() const { return g1 - g0; }
  /// Takes the geometry (g0, g1, is_sink, packed, chunks) of a description of the
  /// segment: a plan's PlannedSegment, a loaded snapshot's segment.
  template <class From>
  void set_geometry(const From& a) {
    g0 = a.g0;
    g1 = a.g1;
    is_sink = a.is_sink;
    packed = a.packed;
    chunks = a.chunks;
  }
};

/// The outcome of validating one update() (no state change), with the view's layout.
struct CallPlan {
  CallArgs call;
  bool advance = false;  ///< start == global_end (else a rewrite of the current chunk)
  int64_t new_global_end = 0;
  int64_t sink_end = 0;      ///< min(sink_tokens, new_global_end)
  int64_t recent_start = 0;  ///< lo of spec 4: tail_start, or max(tail_start, start - rw)
  ViewLayout view;
  /// The view is assembled in a buffer (else it is a zero-copy window of the
  /// current chunk starting at global view.tail_start).
  bool copies = false;
};

/// Everything one update() does, decided before any change.
struct PackedPlan {
  CallPlan call;
  std::optional<PackPlan> pack;  ///< an advance's pack-and-evict (none for a rewrite)
  /// A copied view: where its tokens before the call's chunk come from, in the
  /// segment list after the call — [0, sink_end) at 0 and [tail_start, start) after
  /// it; the chunk's n tokens, view [tokens - n, tokens), come from the input.
  std::vector<ViewPiece> pieces;
};

// ---- the policy's rules over its settings ------------------------------------
// One home for what the policy settings of QuantArgs mean: the caches, the memory
// model and the snapshot reader's invariant checks ask these (or CachePolicy) rather
// than reading the fields, so that a setting is named by its row, its member, the
// policy and the memory model only (scripts/check-setting-names.py).

/// Completed chunks are encoded one at a time into incremental spans (docs/spans.md)
/// rather than in whole deferred spans.
inline bool incremental_spans(const QuantArgs& q) {
  return q.span_mode == SpanMode::Incremental;
}
/// Encoded chunks of incremental spans get refinement layers.
inline bool refines(const QuantArgs& q) {
  return q.refine_recent > 0;
}
/// The most chunks one span holds (one codebook).
inline int64_t span_capacity(const QuantArgs& q) {
  return q.span_chunks;
}
/// The packed sink is one span of the whole sink (else one span per sink chunk), so
/// no raw sink chunk follows a packed one.
inline bool sink_packed_whole(const QuantArgs& q) {
  return q.sink_span == SinkSpan::Full;
}
/// Sink chunk `index` (0-based) is ever packed: quantization on, sink chunks quantized
/// and the chunk not among the leading sink_keep_chunks kept raw.
inline bool packs_sink_chunk(const QuantArgs& q, int64_t index) {
  return q.enabled() && q.sink && index >= q.sink_keep_chunks;
}
/// A chunk's fit to the open span is measured (a break ratio above 0); else every
/// chunk that may join fits.
inline bool measures_span_fit(const QuantArgs& q) {
  return q.span_break_ratio > 0;
}
/// Why a cache that measures the span fit cannot update under a CUDA graph capture
/// (the device cache's refusal names the setting and the two ways out).
inline const char* span_fit_capture_refusal() {
  return "span_break_ratio > 0 reads each encoded chunk's residual energy on the host (a synchronization), which a "
         "CUDA graph capture forbids: set span_break_ratio = 0 or run this update() outside the capture";
}
/// fits_open_span (packed_plan.h) under q's break ratio.
inline bool fits_open_span(const QuantArgs& q, double k_energy, double v_energy, double ref_k, double ref_v) {
  return fits_open_span(q.span_break_ratio, k_energy, v_energy, ref_k, ref_v);
}
/// How many of the newest chunks holding refinement layers keep them.
inline int64_t refined_chunks_kept(const QuantArgs& q) {
  return q.refine_recent;
}
/// The same settings without refinement layers (a benchmark's or a model's peer).
inline QuantArgs without_refinement(QuantArgs q) {
  q.refine_recent = 0;
  return q;
}

/// The aging rule of refinement layers (one home: plan_pack and the snapshot reader):
/// over segments 0..n-1, newest first, a segment's layers go once
/// refined_chunks_kept(q) newer segments hold layers. `holds(i)`: segment i holds
/// layers; `drop(i)` is called for each whose layers go, newest first.
template <class Holds, class Drop>
void age_refinements(const QuantArgs& q, size_t n, Holds&& holds, Drop&& drop) {
  const int64_t keep = refined_chunks_kept(q);
  int64_t newer = 0;
  for (size_t i = n; i-- > 0;)
    if (holds(i) && ++newer > keep) drop(i);
}

template <class P, class Books = NoBooks>
class CachePolicy {
 public:
  using Segment = PlanSegment<P>;
  using Spans = OpenSpan<Books>;

  /// REQUIRES options and quant already validated (the owner does it).
  CachePolicy(const CacheOptions& o, const QuantArgs& q)
      : opt_(o), quant_(q), capacity_(o.cache_size), window_(o.window()) {}

  const std::vector<Segment>& segments() const { return segs_; }
  std::vector<Segment>& segments() { return segs_; }
  int64_t global_end() const { return global_end_; }
  int64_t local_end() const { return std::min(global_end_, capacity_); }
  std::optional<int64_t> chunk_tokens() const { return chunk_tokens_; }
  /// The open incremental span (its codebooks and reference energies) and the breaks.
  const Spans& spans() const { return spans_; }
  Spans& spans() { return spans_; }
  void reset() {
    segs_.clear();
    global_end_ = 0;
    chunk_tokens_.reset();
    spans_ = Spans{};
  }

  /// Slots of a span's codebook of `centroids` slots the first chunk trains (half
  /// of them when a span holds several chunks) and slots each later chunk adds (the
  /// rest shared out evenly): a later chunk adds centroids fitted to itself, so
  /// content that drifts within a span (motion, the time channels of rotary
  /// embedding) still finds its own centroids, while the span stores one codebook.
  int first_chunk_slots(int centroids) const { return span_capacity(quant_) > 1 ? (centroids + 1) / 2 : centroids; }
  int later_chunk_slots(int centroids) const {
    const int64_t n = span_capacity(quant_);
    return n > 1 ? int((centroids - first_chunk_slots(centroids)) / (n - 1)) : 0;
  }
  /// Phase 2 of plan `p` (its incremental chunks' spans, packed_plan.h).
  SpanDecisions span_decisions(const PackPlan& p) const { return SpanDecisions(p, int(span_capacity(quant_))); }

  /// Takes over a saved state (snapshots): the segments (with their span ids and
  /// refined flags), the cursors and the span state. REQUIRES it valid for this
  /// policy (src/cache/snapshot.cpp checks the invariants before).
  void restore(std::vector<Segment> segs, int64_t global_end, std::optional<int64_t> chunk_tokens, Spans spans) {
    segs_ = std::move(segs);
    global_end_ = global_end;
    chunk_tokens_ = chunk_tokens;
    spans_ = std::move(spans);
  }

  int64_t sink_end_at(int64_t g) const { return std::min(opt_.sink_tokens, g); }
  int64_t tail_start_at(int64_t g) const {
    const int64_t se = sink_end_at(g);
    return std::max(se, g - std::max<int64_t>(0, window_ - se));
  }
  /// The full-window view geometry (no recent_window_tokens) at global_end g.
  WindowRanges window_ranges_at(int64_t g) const { return {sink_end_at(g), tail_start_at(g), g}; }

  /// Validates one update() — everything but the element values, which the caller
  /// checks after this, before any state change — and decides what it does: the
  /// view, an advance's PackPlan and the copied view's pieces. Reads only key/value's
  /// shape, dtype and whether data is null; changes nothing.
  PackedPlan plan(ConstTensorView key, ConstTensorView value, int64_t chunk_start, std::optional<int64_t> head_start,
                  std::optional<int64_t> recent_window) const {
    PackedPlan pl;
    pl.call = plan_call(key, value, chunk_start, head_start, recent_window);
    const CallPlan& p = pl.call;
    if (p.advance) pl.pack = plan_pack(p.call.start, p.call.n);
    if (p.copies) {
      if (pl.pack)
        pl.pieces = view_pieces(pl.pack->after, p);
      else
        pl.pieces = view_pieces(segs_, p);
    }
    return pl;
  }

  /// The pack-and-evict of an advance by the chunk [start, start + n) (spec 4):
  /// step 1 drops finalized non-sink segments left of the new tail; step 2 encodes
  /// the eligible spans (sink spans, then deferred spans of span_chunks chunks or
  /// every eligible chunk into incremental spans, keep_recent_chunks left raw);
  /// then only the refine_recent newest chunks holding refinement layers keep them.
  /// REQUIRES start == global_end(), n >= 1 (plan() checked it, or the caller
  /// replays sizes). Pure: changes nothing.
  PackPlan plan_pack(int64_t start, int64_t n) const {
    PackPlan pp;
    pp.start = start;
    pp.n = n;
    pp.spans = spans_.cursor;
    const int64_t tail = tail_start_at(start + n);
    std::vector<size_t> kept;  // the list after eviction, the call's chunk aside (it is never encoded here)
    for (size_t i = 0; i < segs_.size(); ++i)
      (!segs_[i].is_sink && segs_[i].g1 <= tail ? pp.evicted : kept).push_back(i);
    if (quant_.enabled()) plan_encodes(kept, start < opt_.sink_tokens, pp);
    // The list after the advance: each step's segments become its encoding (steps
    // are in global order, as `kept`), the rest stay; the call's chunk comes last.
    size_t step = 0;
    for (size_t k = 0; k < kept.size();) {
      PlannedSegment a;
      if (step < pp.encodes.size() && pp.encodes[step].first == kept[k]) {
        const EncodeStep& e = pp.encodes[step];
        a = {PlannedSegment::Source::Encoded, step, e.g0, e.g1, e.is_sink, true, e.refine, e.chunks};
        ++step;
        k += e.count;
      } else {
        const Segment& s = segs_[kept[k]];
        a = {PlannedSegment::Source::Kept, kept[k], s.g0, s.g1, s.is_sink, s.packed, s.refined, s.chunks};
        ++k;
      }
      pp.after.push_back(a);
    }
    QVG_CHECK(step == pp.encodes.size());
    pp.after.push_back(
        {PlannedSegment::Source::Current, 0, start, start + n, start < opt_.sink_tokens, false, false, 1});
    age_refinements(
        quant_, pp.after.size(), [&](size_t i) { return pp.after[i].refined; },
        [&](size_t i) {
          pp.after[i].refined = false;
          pp.drop_refinement.push_back(i);
        });
    return pp;
  }

  /// Installs an executed advance (phase 1 `p` of plan_pack on this state, phase 2
  /// `d` complete): the segment list becomes p.after with the call's chunk `current`
  /// and step j's encoding `encoded[j]`; incremental chunks get their spans from `d`,
  /// and the open span becomes d's, with `books` its codebooks when one of the
  /// call's chunks started it (else `books` is ignored and they stay). The payloads of
  /// p.drop_refinement still hold their layers: the backend frees them after this.
  /// Strong guarantee: only std::bad_alloc can occur, before anything changes.
  void apply(const PackPlan& p, P current, std::vector<P> encoded, const SpanDecisions& d, Books books = {}) {
    QVG_CHECK(encoded.size() == p.encodes.size() && d.complete() && p.start == global_end_);
    std::vector<Segment> next;
    next.reserve(p.after.size());
    // --- from here on nothing throws ---
    size_t inc = 0;  // decisions are in encoding order, as the Encoded entries of `after`
    for (const PlannedSegment& a : p.after) {
      Segment s;
      if (a.source == PlannedSegment::Source::Kept) {
        s = std::move(segs_[a.index]);
      } else if (a.source == PlannedSegment::Source::Encoded) {
        s.data = std::move(encoded[a.index]);
        if (p.encodes[a.index].incremental) s.span = d.decisions()[inc++].span;
      } else {
        s.data = std::move(current);
      }
      s.set_geometry(a);
      s.refined = a.refined;
      next.push_back(std::move(s));
    }
    segs_ = std::move(next);
    if (!chunk_tokens_) chunk_tokens_ = p.n;
    global_end_ = p.start + p.n;
    const ChunkDecision* started = nullptr;  // the last chunk that started a span
    for (const ChunkDecision& c : d.decisions()) {
      if (!c.joined) started = &c;
      spans_.breaks += c.may_join && !c.joined;
    }
    spans_.cursor = d.cursor();
    if (started) {
      spans_.books = std::move(books);
      spans_.k_energy = started->k_energy;
      spans_.v_energy = started->v_energy;
    }
  }

 private:
  /// Validation and the view's layout (plan()).
  CallPlan plan_call(ConstTensorView key, ConstTensorView value, int64_t chunk_start, std::optional<int64_t> head_start,
                     std::optional<int64_t> recent_window) const {
    CallPlan p;
    p.call = validate_call(opt_, key, value, chunk_start, head_start, recent_window);
    const int64_t n = p.call.n, start = p.call.start, end = p.call.end, sink = opt_.sink_tokens;
    if (n > capacity_)
      throw OutOfRange(fmt::format("chunk of n = {} tokens is longer than the cache (cache_size = {})", n, capacity_));
    if (!segs_.empty() && start == segs_.back().g0) {
      const Segment& cur = segs_.back();
      if (n != cur.tokens())
        throw Unsupported(fmt::format(
            "rewrite of the current chunk [{}, {}) must keep its size: n must be {}, got {} (the packed cache does "
            "not support changing the current chunk's size)",
            cur.g0, cur.g1, cur.tokens(), n));
      p.advance = false;
      p.new_global_end = global_end_;
    } else if (start == global_end_) {
      const int64_t local = local_end();
      const int64_t sink_held = std::min(sink, local);
      if (local + n > capacity_ && capacity_ - n < sink_held)
        throw OutOfRange(fmt::format(
            "chunk [{}, {}) would overwrite sink tokens: after eviction it is placed at buffer [{}, {}), which "
            "overlaps the {} sink tokens at [0, {}) (cache_size = {}, n = {}); chunks may be at most "
            "cache_size - sink = {} tokens here",
            start, end, capacity_ - n, capacity_, sink_held, sink_held, capacity_, n, capacity_ - sink_held));
      p.advance = true;
      p.new_global_end = end;
    } else if (segs_.empty()) {
      throw Unsupported(fmt::format(
          "non-sequential write: on an empty cache current_chunk_start must be global_end = {} (advance), got {}",
          global_end_, start));
    } else {
      throw Unsupported(fmt::format(
          "non-sequential write: current_chunk_start must be the current chunk's start {} (rewrite) or global_end = "
          "{} (advance), got {}",
          segs_.back().g0, global_end_, start));
    }
    p.sink_end = sink_end_at(p.new_global_end);
    const int64_t tail = tail_start_at(p.new_global_end);
    if (tail > std::max(start, p.sink_end))
      throw OutOfRange(fmt::format(
          "chunk [{}, {}) is not entirely visible: the attention window of {} tokens shows the sink [0, {}) and "
          "[{}, {}); a chunk may hold at most the window minus the sink tokens in front of it ({} tokens here), got "
          "n = {}",
          start, end, window_, p.sink_end, tail, p.new_global_end, window_ - std::min(start, p.sink_end), n));
    p.recent_start = recent_window ? std::max(tail, start - *recent_window) : tail;
    // The view's ranges.
    ViewLayout& v = p.view;
    v.sink_end = p.sink_end;
    v.tail_start = p.recent_start;
    if (v.sink_end == v.tail_start) v.sink_end = v.tail_start = 0;  // adjacent: one range [0, end)
    v.end = p.new_global_end;
    v.tokens = v.sink_end + (v.end - v.tail_start);
    p.copies = v.sink_end > 0 || v.tail_start < start;
    return p;
  }

  /// Step 2 of plan_pack: the spans to encode, in encoding order, over `kept` (the
  /// list after eviction, indices of the list before the call; the call's chunk,
  /// sink or not as `current_sink`, follows it). Sets pp.encodes and pp.follows_open.
  void plan_encodes(const std::vector<size_t>& kept, bool current_sink, PackPlan& pp) const {
    const auto add = [&](size_t k, size_t count, bool incremental) {  // kept[k, k + count)
      EncodeStep e;
      e.first = kept[k];
      e.count = count;
      e.g0 = segs_[kept[k]].g0;
      e.g1 = segs_[kept[k + count - 1]].g1;
      e.is_sink = segs_[kept[k]].is_sink;
      for (size_t j = k; j < k + count; ++j) {  // adjacent raw segments of one kind
        QVG_CHECK(kept[j] == e.first + (j - k) && !segs_[kept[j]].packed && segs_[kept[j]].is_sink == e.is_sink);
        e.chunks += segs_[kept[j]].chunks;
      }
      e.incremental = incremental;
      e.refine = incremental && refines(quant_);
      pp.encodes.push_back(e);
    };
    if (quant_.sink) {
      std::vector<size_t> elig;  // positions in `kept`
      int64_t chunk_index = 0;
      for (size_t k = 0; k < kept.size(); ++k) {
        const Segment& s = segs_[kept[k]];
        if (!s.is_sink) continue;
        if (!s.packed && chunk_index >= quant_.sink_keep_chunks) elig.push_back(k);
        chunk_index += s.chunks;
      }
      if (quant_.sink_span == SinkSpan::Chunk) {
        for (size_t k : elig) add(k, 1, false);
      } else if (!elig.empty() && !current_sink) {
        for (size_t j = 1; j < elig.size(); ++j) QVG_CHECK(elig[j] == elig[0] + j);
        add(elig[0], elig.size(), false);
      }
    }
    std::vector<size_t> raw;  // positions in `kept`
    for (size_t k = 0; k < kept.size(); ++k)
      if (!segs_[kept[k]].is_sink && !segs_[kept[k]].packed) raw.push_back(k);
    const size_t keep = size_t(quant_.keep_recent_chunks);
    const size_t eligible = raw.size() > keep ? raw.size() - keep : 0;
    if (quant_.span_mode == SpanMode::Incremental) {  // every eligible chunk now, one at a time
      if (eligible > 0 && raw[0] > 0) {
        const Segment& pred = segs_[kept[raw[0] - 1]];
        pp.follows_open = spans_.cursor.open >= 0 && pred.packed && pred.span == spans_.cursor.open;
      }
      for (size_t j = 0; j < eligible; ++j) add(raw[j], 1, true);
      return;
    }
    const size_t span = size_t(quant_.span_chunks);
    for (size_t j = 0; j + span <= eligible; j += span) add(raw[j], span, false);
  }

  /// Where global tokens [x0, x1) of the view come from in `segs` (anything with
  /// g0, g1 in global order), placed from view token out_t on. Every token is in
  /// exactly one piece.
  template <class S>
  static void fill(const std::vector<S>& segs, int64_t x0, int64_t x1, int64_t out_t, std::vector<ViewPiece>& pieces) {
    if (x0 >= x1) return;
    int64_t covered = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
      const int64_t o0 = std::max(x0, segs[i].g0), o1 = std::min(x1, segs[i].g1);
      if (o0 >= o1) continue;
      pieces.push_back({i, o0 - segs[i].g0, o1 - segs[i].g0, out_t + (o0 - x0)});
      covered += o1 - o0;
    }
    QVG_CHECK(covered == x1 - x0);  // every visible token is held by exactly one segment
  }

  /// The pieces of a copied view before the call's own chunk, in `segs` (the list
  /// after the call).
  template <class S>
  static std::vector<ViewPiece> view_pieces(const std::vector<S>& segs, const CallPlan& p) {
    std::vector<ViewPiece> pieces;
    fill(segs, 0, p.view.sink_end, 0, pieces);
    fill(segs, p.view.tail_start, p.call.start, p.view.sink_end, pieces);
    QVG_CHECK(p.view.end == p.call.end &&
              p.view.sink_end + (p.call.start - p.view.tail_start) == p.view.tokens - p.call.n);
    return pieces;
  }

  CacheOptions opt_;
  QuantArgs quant_;
  int64_t capacity_ = 0, window_ = 0;
  std::vector<Segment> segs_;  // global order; segs_.back() is the current chunk
  int64_t global_end_ = 0;
  std::optional<int64_t> chunk_tokens_;
  Spans spans_;  // the open incremental span and the breaks
};

/// Raw K+V bytes or encoded K+V bytes of a segment whose payload has the members
/// k_raw, v_raw (buffers with size()) and k_enc, v_enc (encodings with nbytes()).
/// A chunk of an incremental span does not hold its span's codebook (see
/// resident_bytes()).
template <class P>
size_t segment_bytes(const PlanSegment<P>& s) {
  size_t n =
      s.packed ? held(s.data.k_enc).nbytes() + held(s.data.v_enc).nbytes() : s.data.k_raw.size() + s.data.v_raw.size();
  if constexpr (requires { s.data.k_ref; })  // a refined chunk's layers (the host packed cache)
    if (s.data.k_ref) n += s.data.k_ref->nbytes() + s.data.v_ref->nbytes();
  return n;
}

/// The resident bytes of spec 4: every segment's bytes (`seg_bytes(segment)`) plus,
/// once per incremental span that still has a chunk, the span's codebooks
/// (`book_bytes(segment)` of any of its chunks).
template <class P, class B, class SegBytes, class BookBytes>
size_t resident_bytes(const CachePolicy<P, B>& pol, SegBytes&& seg_bytes, BookBytes&& book_bytes) {
  size_t n = 0;
  int64_t last_span = -1;
  for (const PlanSegment<P>& s : pol.segments()) {
    n += seg_bytes(s);
    if (s.span >= 0 && s.span != last_span) n += book_bytes(s);  // a span's chunks are adjacent
    last_span = s.span;
  }
  return n;
}

/// What a packed cache holds, for the accounting of branches (cache.h, "Branches"):
/// the bytes of its raw segments (its own) and one entry per reference it holds to a
/// shared immutable object (an encoding, a refinement layer, a span's codebooks).
struct Holdings {
  struct Ref {
    const void* p = nullptr;
    size_t bytes = 0;  ///< what resident bytes count for it (0: a reference that adds none)
    long uses = 0;     ///< references in all caches (shared_ptr::use_count)
  };
  size_t raw = 0;
  std::vector<Ref> refs;

  template <class T>
  void add(const std::shared_ptr<T>& p, size_t bytes) {
    if (p) refs.push_back({p.get(), bytes, p.use_count()});
  }
  /// {bytes held alone (raw included), bytes shared with other caches}: an object is
  /// shared when more references to it exist than this cache holds. Its bytes count
  /// once (a span's codebooks: once per span that has a chunk, as resident_bytes()).
  std::pair<size_t, size_t> split() const {
    size_t alone = raw, shared = 0;
    for_each_object(refs, [&](const Ref& first, size_t refs_here, size_t bytes) {
      (first.uses > long(refs_here) ? shared : alone) += bytes;
    });
    return {alone, shared};
  }
  /// The bytes of several caches' holdings in all, each object once.
  static size_t group(const std::vector<Holdings>& hs) {
    std::vector<Ref> all;
    size_t n = 0;
    for (const Holdings& h : hs) {
      n += h.raw;
      all.insert(all.end(), h.refs.begin(), h.refs.end());
    }
    for_each_object(std::move(all), [&](const Ref&, size_t, size_t bytes) { n += bytes; });
    return n;
  }

 private:
  /// f(a reference, the references to its object in `r`, the object's bytes) once per
  /// object (references grouped by address).
  template <class F>
  static void for_each_object(std::vector<Ref> r, F&& f) {
    std::sort(r.begin(), r.end(), [](const Ref& a, const Ref& b) { return std::less<>()(a.p, b.p); });
    for (size_t i = 0; i < r.size();) {
      size_t j = i, bytes = 0;
      for (; j < r.size() && r[j].p == r[i].p; ++j) bytes = std::max(bytes, r[j].bytes);
      f(r[i], j - i, bytes);
      i = j;
    }
  }
};

/// The holdings of a cache whose payload holds its encodings, layers and span
/// codebooks through shared_ptrs (the host and device SegData); `book_bytes(book)`
/// is a span codebook's bytes. The policy's open-span handles are references too
/// (adding no bytes: a span without chunks is not resident).
template <class P, class B, class BookBytes>
Holdings holdings_of(const CachePolicy<P, B>& pol, BookBytes&& book_bytes) {
  Holdings h;
  h.refs.reserve(4 * pol.segments().size() + 2);
  for (const PlanSegment<P>& s : pol.segments()) {
    if (!s.packed) {
      h.raw += s.data.k_raw.size() + s.data.v_raw.size();
    } else {
      h.add(s.data.k_enc, s.data.k_enc->nbytes());
      h.add(s.data.v_enc, s.data.v_enc->nbytes());
    }
    if (s.data.k_ref) {
      h.add(s.data.k_ref, s.data.k_ref->nbytes());
      h.add(s.data.v_ref, s.data.v_ref->nbytes());
    }
    if (s.data.k_book) {
      h.add(s.data.k_book, book_bytes(*s.data.k_book));
      h.add(s.data.v_book, book_bytes(*s.data.v_book));
    }
  }
  h.add(pol.spans().books.k, 0);
  h.add(pol.spans().books.v, 0);
  return h;
}

/// A fork's segment list: every segment's geometry, its payload's immutable objects
/// (encodings, span codebooks, refinement layers: the shared_ptrs holdings_of() counts)
/// shared, its raw buffers copied (`copy_raw(buffer)`).
template <class P, class B, class CopyRaw>
std::vector<PlanSegment<P>> forked_segments(const CachePolicy<P, B>& pol, CopyRaw&& copy_raw) {
  std::vector<PlanSegment<P>> out;
  out.reserve(pol.segments().size());
  for (const PlanSegment<P>& s : pol.segments()) {
    PlanSegment<P> g;
    g.set_geometry(s);
    g.span = s.span;
    g.refined = s.refined;
    std::tie(g.data.k_enc, g.data.v_enc, g.data.k_book, g.data.v_book, g.data.k_ref, g.data.v_ref) =
        std::tie(s.data.k_enc, s.data.v_enc, s.data.k_book, s.data.v_book, s.data.k_ref, s.data.v_ref);
    if (!s.packed) {
      g.data.k_raw = copy_raw(s.data.k_raw);
      g.data.v_raw = copy_raw(s.data.v_raw);
    }
    out.push_back(std::move(g));
  }
  return out;
}

/// The public description of segment i (BasicSegmentInfo, qvg/cache.h) for a payload
/// as segment_bytes() requires; raw views over its buffers' data().
template <class Encoded, class P, class B>
BasicSegmentInfo<Encoded> describe_segment(const CachePolicy<P, B>& pol, size_t i, const CacheOptions& o) {
  const auto& segs = pol.segments();
  QVG_CHECK(i < segs.size());
  const PlanSegment<P>& s = segs[i];
  BasicSegmentInfo<Encoded> info;
  info.g0 = s.g0;
  info.g1 = s.g1;
  info.is_sink = s.is_sink;
  info.packed = s.packed;
  info.current = i + 1 == segs.size();
  info.chunks = s.chunks;
  info.nbytes = segment_bytes(s);
  info.span = s.span;
  if (s.packed) {
    info.k_enc = &held(s.data.k_enc);
    info.v_enc = &held(s.data.v_enc);
    if constexpr (requires { s.data.k_book->book; }) {  // a chunk of an incremental span
      info.k_codebook = s.data.k_book ? &s.data.k_book->book : nullptr;
      info.v_codebook = s.data.v_book ? &s.data.v_book->book : nullptr;
    }
    if constexpr (requires { s.data.k_ref; }) {  // a refined chunk
      info.k_ref = s.data.k_ref ? &*s.data.k_ref : nullptr;
      info.v_ref = s.data.v_ref ? &*s.data.v_ref : nullptr;
    }
  } else {
    info.k_raw = dense_view(rows_of(static_cast<const void*>(s.data.k_raw.data()), o, s.tokens()));
    info.v_raw = dense_view(rows_of(static_cast<const void*>(s.data.v_raw.data()), o, s.tokens()));
  }
  return info;
}

}  // namespace qvg::detail
