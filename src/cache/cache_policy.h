// src/cache/cache_policy.h — the segment policy of the packed cache (spec 4):
// validation of a call, eviction, which spans to encode, packing, and where every
// token of a view comes from. Plain C++ with the data abstracted into a payload P
// carried by every segment, so that one policy serves both caches: the CPU
// qvg::PackedCausalCache (host buffers and EncodedTensors) and the device-resident
// qvg::cuda::PackedCausalCache (device buffers). The host test
// tests/gpu/cache_plan_test.cpp also drives it with an empty payload.
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
  P data;  // raw chunk or encoded span (the user's payload)

  int64_t tokens() const { return g1 - g0; }
};

/// The outcome of validating one update() (no state change), with the view's
/// layout: view = [0, r1) ++ [r2, r3) in global tokens, T tokens; a view with
/// !copy is a zero-copy window of the current chunk starting at global r2.
struct CallPlan {
  CallArgs a;
  bool advance = false;
  int64_t sink_end = 0, lo = 0, new_ge = 0;
  int64_t r1 = 0, r2 = 0, r3 = 0, T = 0;
  bool copy = false;
};

/// Global tokens [o0, o1) of segment `seg` (segment-local [o0 - g0, o1 - g0)) go to
/// view token out_t.
struct ViewPiece {
  size_t seg = 0;
  int64_t t0 = 0, t1 = 0;  ///< segment-local tokens
  int64_t out_t = 0;
};

struct SpanRef {
  size_t first = 0, count = 0;
};

template <class P>
class CachePolicy {
 public:
  using Segment = PlanSegment<P>;

  /// REQUIRES options and quant already validated (the owning cache does it).
  CachePolicy(const CacheOptions& o, const QuantArgs& q) : opt_(o), quant_(q), cap_(o.cache_size), window_(o.window()) {}

  const std::vector<Segment>& segments() const { return segs_; }
  std::vector<Segment>& segments() { return segs_; }
  int64_t global_end() const { return ge_; }
  std::optional<int64_t> chunk_tokens() const { return chunk_tokens_; }
  void reset() {
    segs_.clear();
    ge_ = 0;
    chunk_tokens_.reset();
  }

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
  CallPlan plan(ConstTensorView key, ConstTensorView value, int64_t c, std::optional<int64_t> hs,
                std::optional<int64_t> rw) const {
    CallPlan p;
    p.a = validate_call(opt_, key, value, c, hs, rw);
    const int64_t n = p.a.n, ce = p.a.ce, sink = opt_.sink_tokens;
    if (n > cap_)
      throw OutOfRange(fmt::format("chunk of n = {} tokens is longer than the cache (cache_size = {})", n, cap_));
    if (!segs_.empty() && c == segs_.back().g0) {
      const Segment& cur = segs_.back();
      if (n != cur.tokens())
        throw Unsupported(fmt::format(
            "rewrite of the current chunk [{}, {}) must keep its size: n must be {}, got {} (the packed cache does "
            "not support changing the current chunk's size)",
            cur.g0, cur.g1, cur.tokens(), n));
      p.advance = false;
      p.new_ge = ge_;
    } else if (c == ge_) {
      const int64_t le = std::min(ge_, cap_);
      const int64_t se = std::min(sink, le);
      if (le + n > cap_ && cap_ - n < se)
        throw OutOfRange(fmt::format(
            "chunk [{}, {}) would overwrite sink tokens: after eviction it is placed at buffer [{}, {}), which "
            "overlaps the {} sink tokens at [0, {}) (cache_size = {}, n = {}); chunks may be at most "
            "cache_size - sink = {} tokens here",
            c, ce, cap_ - n, cap_, se, se, cap_, n, cap_ - se));
      p.advance = true;
      p.new_ge = ce;
    } else if (segs_.empty()) {
      throw Unsupported(fmt::format(
          "non-sequential write: on an empty cache current_chunk_start must be global_end = {} (advance), got {}", ge_,
          c));
    } else {
      throw Unsupported(fmt::format(
          "non-sequential write: current_chunk_start must be the current chunk's start {} (rewrite) or global_end = "
          "{} (advance), got {}",
          segs_.back().g0, ge_, c));
    }
    p.sink_end = sink_end_at(p.new_ge);
    const int64_t tail = tail_start_at(p.new_ge);
    if (tail > std::max(c, p.sink_end))
      throw OutOfRange(fmt::format(
          "chunk [{}, {}) is not entirely visible: the attention window of {} tokens shows the sink [0, {}) and "
          "[{}, {}); a chunk may hold at most the window minus the sink tokens in front of it ({} tokens here), got "
          "n = {}",
          c, ce, window_, p.sink_end, tail, p.new_ge, window_ - std::min(c, p.sink_end), n));
    p.lo = rw ? std::max(tail, c - *rw) : tail;
    // The view's ranges.
    p.r1 = p.sink_end;
    p.r2 = p.lo;
    if (p.r1 == p.r2) p.r1 = p.r2 = 0;  // adjacent: one range [0, new_ge)
    p.r3 = p.new_ge;
    p.T = p.r1 + (p.r3 - p.r2);
    p.copy = p.r1 > 0 || p.r2 < c;
    return p;
  }

  /// An advance's bookkeeping before pack-and-evict: the new raw chunk [c, ce)
  /// (payload `cur`) becomes current; chunk_tokens and global_end are set.
  void push_current(const CallPlan& p, P cur) {
    Segment s;
    s.g0 = p.a.c;
    s.g1 = p.a.ce;
    s.is_sink = p.a.c < opt_.sink_tokens;
    s.data = std::move(cur);
    segs_.push_back(std::move(s));
    if (!chunk_tokens_) chunk_tokens_ = p.a.n;
    ge_ = p.new_ge;
  }

  /// Step 1 of pack-and-evict: drop finalized non-sink segments left of the tail.
  void evict() {
    const int64_t tail = tail_start_at(ge_);
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
    const size_t span = size_t(quant_.span_chunks);
    for (size_t j = 0; j + span <= eligible; j += span) spans.push_back({raw[j], span});
    return spans;
  }

  /// Step 2 applied: for every span, `encode(parts, packed)` fills packed.data from
  /// the raw parts (in global order); the span then replaces its raw chunks. An
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
      encode(parts, packed);
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

  /// The pieces of a copied view before the call's own chunk: [0, r1) at 0 and
  /// [r2, c) at r1 (the chunk's n tokens, view [T - n, T), come from the input).
  std::vector<ViewPiece> view_pieces(const CallPlan& p) const {
    std::vector<ViewPiece> pieces;
    fill(0, p.r1, 0, pieces);
    fill(p.r2, p.a.c, p.r1, pieces);
    QVG_CHECK(p.r3 == p.a.ce && p.r1 + (p.a.c - p.r2) == p.T - p.a.n);
    return pieces;
  }

 private:
  CacheOptions opt_;
  QuantArgs quant_;
  int64_t cap_ = 0, window_ = 0;
  std::vector<Segment> segs_;  // global order; segs_.back() is the current chunk
  int64_t ge_ = 0;
  std::optional<int64_t> chunk_tokens_;
};

}  // namespace qvg::detail
