// src/cache/cache_policy.h — the segment policy of the packed cache (spec 4):
// validation of a call, eviction, which spans to encode, packing, and where every
// token of a view comes from. Plain C++ with the data abstracted into a payload P
// carried by every segment, so that one policy serves everything that needs it:
// the CPU qvg::PackedCausalCache (host buffers and EncodedTensors), the
// device-resident qvg::cuda::PackedCausalCache (device buffers and
// DeviceEncodedTensors) and the memory model qvg::PolicyReplay (byte counts). The
// host test tests/gpu/cache_plan_test.cpp drives it with an empty payload against
// the independent model of tests/support/cache_model.
//
// Names: positions are global token indices unless called "local"; a call writes
// the chunk [start, end) (CallArgs); the view of a call shows the global ranges
// [0, view.sink_end) ++ [view.tail_start, view.end), view.tokens tokens in all.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "qvg/cache.h"
#include "qvg/config.h"
#include "qvg/error.h"

namespace qvg::detail {

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
  P data;  // raw chunk, encoded span or encoded chunk (the user's payload)

  int64_t tokens() const { return g1 - g0; }
};

/// The global ranges one call's view shows: [0, sink_end) ++ [tail_start, end),
/// `tokens` tokens. When the two ranges touch they are merged into one
/// (sink_end = tail_start = 0).
struct ViewLayout {
  int64_t sink_end = 0;    ///< the view's sink part is [0, sink_end)
  int64_t tail_start = 0;  ///< its recent part is [tail_start, end)
  int64_t end = 0;         ///< global_end after the call
  int64_t tokens = 0;
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

/// Global tokens [t0, t1) of segment `seg` (segment-local indices) go to view token out_t.
struct ViewPiece {
  size_t seg = 0;
  int64_t t0 = 0, t1 = 0;  ///< segment-local tokens
  int64_t out_t = 0;
};

/// Segments [first, first + count) of the current list, encoded as one span; or,
/// `incremental`, one raw chunk (count 1) to encode into an incremental span.
struct SpanRef {
  size_t first = 0, count = 0;
  bool incremental = false;
};

/// What pack() tells its encoder about one span or chunk, and what the encoder
/// answers for an incremental chunk.
struct SpanChoice {
  bool incremental = false;  ///< a chunk of an incremental span (else a whole span)
  /// The open incremental span has room and its newest chunk is this chunk's
  /// predecessor: the chunk may be encoded against the span's codebook.
  bool may_join = false;
  /// Set by the encoder: it encoded the chunk into the open span (only if may_join);
  /// false: it trained a new codebook on the chunk, which starts a new span.
  bool joined = false;
};

template <class P>
class CachePolicy {
 public:
  using Segment = PlanSegment<P>;

  /// REQUIRES options and quant already validated (the owner does it).
  CachePolicy(const CacheOptions& o, const QuantArgs& q)
      : opt_(o), quant_(q), capacity_(o.cache_size), window_(o.window()) {}

  const std::vector<Segment>& segments() const { return segs_; }
  std::vector<Segment>& segments() { return segs_; }
  int64_t global_end() const { return global_end_; }
  int64_t local_end() const { return std::min(global_end_, capacity_); }
  std::optional<int64_t> chunk_tokens() const { return chunk_tokens_; }
  void reset() {
    segs_.clear();
    global_end_ = 0;
    chunk_tokens_.reset();
    open_ = OpenSpan{};
    next_span_ = 0;
  }
  /// The incremental span chunks may still join (id -1: none), and its chunk count.
  struct OpenSpan {
    int64_t id = -1;
    int chunks = 0;
    bool operator==(const OpenSpan&) const = default;
  };

  /// Takes over a saved state (snapshots): the segments (with their span ids), the
  /// cursors, the open incremental span and the next span id. REQUIRES it valid for
  /// this policy (src/cache/snapshot.cpp checks the invariants before).
  void restore(std::vector<Segment> segs, int64_t global_end, std::optional<int64_t> chunk_tokens, OpenSpan open = {},
               int64_t next_span = 0) {
    segs_ = std::move(segs);
    global_end_ = global_end;
    chunk_tokens_ = chunk_tokens;
    open_ = open;
    next_span_ = next_span;
  }
  const OpenSpan& open_span() const { return open_; }
  /// The id the next incremental span will get (ids are never reused until reset()).
  int64_t next_span_id() const { return next_span_; }

  int64_t sink_end_at(int64_t g) const { return std::min(opt_.sink_tokens, g); }
  int64_t tail_start_at(int64_t g) const {
    const int64_t se = sink_end_at(g);
    return std::max(se, g - std::max<int64_t>(0, window_ - se));
  }
  /// The full-window view geometry (no recent_window_tokens) at global_end g.
  WindowRanges window_ranges_at(int64_t g) const { return {sink_end_at(g), tail_start_at(g), g}; }

  /// Everything update() validates except the element values (the caller checks
  /// them after this, before any state change).
  /// Reads only key/value's shape, dtype and whether data is null.
  CallPlan plan(ConstTensorView key, ConstTensorView value, int64_t chunk_start, std::optional<int64_t> head_start,
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

  /// An advance's bookkeeping before pack-and-evict: the new raw chunk [start,
  /// start + n) (payload `cur`) becomes current; chunk_tokens and global_end are set.
  /// REQUIRES start == global_end(), n >= 1 (plan() checked it, or the caller replays sizes).
  void push_current(int64_t start, int64_t n, P cur) {
    Segment s;
    s.g0 = start;
    s.g1 = start + n;
    s.is_sink = start < opt_.sink_tokens;
    s.data = std::move(cur);
    segs_.push_back(std::move(s));
    if (!chunk_tokens_) chunk_tokens_ = n;
    global_end_ = start + n;
  }
  void push_current(const CallPlan& p, P cur) { push_current(p.call.start, p.call.n, std::move(cur)); }

  /// Step 1 of pack-and-evict: drop finalized non-sink segments left of the tail.
  void evict() {
    const int64_t tail = tail_start_at(global_end_);
    const size_t last = segs_.size() - 1;
    size_t w = 0;
    for (size_t i = 0; i < segs_.size(); ++i) {
      const bool drop = i < last && !segs_[i].is_sink && segs_[i].g1 <= tail;
      if (!drop) {
        if (w != i) segs_[w] = std::move(segs_[i]);
        ++w;
      }
    }
    segs_.resize(w);
  }

  /// Step 2: the spans to encode now, in encoding order (sink spans, then
  /// non-sink spans, oldest first). Indices refer to the current segments.
  std::vector<SpanRef> spans_to_encode() const {
    std::vector<SpanRef> spans;
    if (!quant_.enabled()) return spans;
    const size_t last = segs_.size() - 1;  // the current chunk: never encoded here
    if (quant_.sink) {
      std::vector<size_t> elig;
      int64_t chunk_index = 0;
      for (size_t i = 0; i < last; ++i) {
        if (!segs_[i].is_sink) continue;
        if (!segs_[i].packed && chunk_index >= quant_.sink_keep_chunks) elig.push_back(i);
        chunk_index += segs_[i].chunks;
      }
      if (quant_.sink_span == SinkSpan::Chunk) {
        for (size_t i : elig) spans.push_back({i, 1});
      } else if (!elig.empty() && !segs_[last].is_sink) {
        for (size_t j = 1; j < elig.size(); ++j) QVG_CHECK(elig[j] == elig[0] + j);
        spans.push_back({elig[0], elig.size()});
      }
    }
    std::vector<size_t> raw;
    for (size_t i = 0; i < last; ++i)
      if (!segs_[i].is_sink && !segs_[i].packed) raw.push_back(i);
    const size_t keep = size_t(quant_.keep_recent_chunks);
    const size_t eligible = raw.size() > keep ? raw.size() - keep : 0;
    if (quant_.span_mode == SpanMode::Incremental) {  // every eligible chunk now, one at a time
      for (size_t j = 0; j < eligible; ++j) spans.push_back({raw[j], 1, true});
      return spans;
    }
    const size_t span = size_t(quant_.span_chunks);
    for (size_t j = 0; j + span <= eligible; j += span) spans.push_back({raw[j], span});
    return spans;
  }

  /// Step 2 applied: for every span, `encode(parts, packed, choice)` fills
  /// packed.data from the raw parts (in global order); the span then replaces its
  /// raw chunks. For an incremental chunk (choice.incremental, one part) the encoder
  /// sets choice.joined to say whether it joined the open span (allowed only when
  /// choice.may_join) or started a new one; the policy numbers the spans. An
  /// exception from `encode` leaves the spans encoded so far in place and the rest raw.
  template <class Encode>
  void pack(Encode&& encode) {
    const std::vector<SpanRef> spans = spans_to_encode();
    size_t removed = 0;  // segments merged away by earlier spans of this call
    for (const SpanRef& sr : spans) {
      const size_t first = sr.first - removed;
      std::vector<const Segment*> parts;
      int chunks = 0;
      for (size_t i = first; i < first + sr.count; ++i) {
        QVG_CHECK(!segs_[i].packed && segs_[i].is_sink == segs_[first].is_sink);
        parts.push_back(&segs_[i]);
        chunks += segs_[i].chunks;
      }
      Segment packed;
      packed.g0 = parts.front()->g0;
      packed.g1 = parts.back()->g1;
      packed.is_sink = parts.front()->is_sink;
      packed.chunks = chunks;
      packed.packed = true;
      SpanChoice choice;
      choice.incremental = sr.incremental;
      choice.may_join = sr.incremental && open_.id >= 0 && open_.chunks < quant_.span_chunks && first > 0 &&
                        segs_[first - 1].packed && segs_[first - 1].span == open_.id;
      encode(parts, packed, choice);
      if (sr.incremental) {
        QVG_CHECK(!choice.joined || choice.may_join);
        if (choice.joined) {
          packed.span = open_.id;
          ++open_.chunks;
        } else {
          packed.span = next_span_++;
          open_ = OpenSpan{packed.span, 1};
        }
      }
      segs_[first] = std::move(packed);
      segs_.erase(segs_.begin() + std::ptrdiff_t(first + 1), segs_.begin() + std::ptrdiff_t(first + sr.count));
      removed += sr.count - 1;
    }
  }

  /// Where global tokens [x0, x1) of the view come from, placed from view token
  /// out_t on. Every token is in exactly one piece.
  void fill(int64_t x0, int64_t x1, int64_t out_t, std::vector<ViewPiece>& pieces) const {
    if (x0 >= x1) return;
    int64_t covered = 0;
    for (size_t i = 0; i < segs_.size(); ++i) {
      const Segment& s = segs_[i];
      const int64_t o0 = std::max(x0, s.g0), o1 = std::min(x1, s.g1);
      if (o0 >= o1) continue;
      pieces.push_back({i, o0 - s.g0, o1 - s.g0, out_t + (o0 - x0)});
      covered += o1 - o0;
    }
    QVG_CHECK(covered == x1 - x0);  // every visible token is held by exactly one segment
  }

  /// The pieces of a copied view before the call's own chunk: [0, sink_end) at 0
  /// and [tail_start, start) after it (the chunk's n tokens, view [tokens - n,
  /// tokens), come from the input).
  std::vector<ViewPiece> view_pieces(const CallPlan& p) const {
    std::vector<ViewPiece> pieces;
    fill(0, p.view.sink_end, 0, pieces);
    fill(p.view.tail_start, p.call.start, p.view.sink_end, pieces);
    QVG_CHECK(p.view.end == p.call.end &&
              p.view.sink_end + (p.call.start - p.view.tail_start) == p.view.tokens - p.call.n);
    return pieces;
  }

 private:
  CacheOptions opt_;
  QuantArgs quant_;
  int64_t capacity_ = 0, window_ = 0;
  std::vector<Segment> segs_;  // global order; segs_.back() is the current chunk
  int64_t global_end_ = 0;
  std::optional<int64_t> chunk_tokens_;
  OpenSpan open_;          // the incremental span chunks may join
  int64_t next_span_ = 0;  // id of the next incremental span
};

/// Raw K+V bytes or encoded K+V bytes of a segment whose payload has the members
/// k_raw, v_raw (buffers with size()) and k_enc, v_enc (encodings with nbytes()).
/// A chunk of an incremental span does not hold its span's codebook (see
/// resident_bytes()).
template <class P>
size_t segment_bytes(const PlanSegment<P>& s) {
  size_t n = s.packed ? s.data.k_enc.nbytes() + s.data.v_enc.nbytes() : s.data.k_raw.size() + s.data.v_raw.size();
  if constexpr (requires { s.data.k_ref; })  // a refined chunk's layers (the host packed cache)
    if (s.data.k_ref) n += s.data.k_ref->nbytes() + s.data.v_ref->nbytes();
  return n;
}

/// QuantArgs::refine_recent: only the `keep` newest segments that hold refinement
/// layers (`has(segment)`) keep them; `drop(segment)` frees the older ones' (newest
/// first, so a segment's layers go when `keep` newer chunks hold layers).
template <class P, class Has, class Drop>
void keep_newest_refinements(CachePolicy<P>& pol, int64_t keep, Has&& has, Drop&& drop) {
  int64_t newer = 0;
  auto& segs = pol.segments();
  for (auto it = segs.rbegin(); it != segs.rend(); ++it)
    if (has(*it) && ++newer > keep) drop(*it);
}

/// The resident bytes of spec 4: every segment's bytes (`seg_bytes(segment)`) plus,
/// once per incremental span that still has a chunk, the span's codebooks
/// (`book_bytes(segment)` of any of its chunks).
template <class P, class SegBytes, class BookBytes>
size_t resident_bytes(const CachePolicy<P>& pol, SegBytes&& seg_bytes, BookBytes&& book_bytes) {
  size_t n = 0;
  int64_t last_span = -1;
  for (const PlanSegment<P>& s : pol.segments()) {
    n += seg_bytes(s);
    if (s.span >= 0 && s.span != last_span) n += book_bytes(s);  // a span's chunks are adjacent
    last_span = s.span;
  }
  return n;
}

/// The public description of segment i (BasicSegmentInfo, qvg/cache.h) for a payload
/// as segment_bytes() requires; raw views over its buffers' data().
template <class Encoded, class P>
BasicSegmentInfo<Encoded> describe_segment(const CachePolicy<P>& pol, size_t i, const CacheOptions& o) {
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
    info.k_enc = &s.data.k_enc;
    info.v_enc = &s.data.v_enc;
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
