// src/cache/packed_plan.h — what one advance of a packed cache does (spec 4
// pack-and-evict; incremental spans and refinement: docs/spans.md), as a value
// decided before anything changes, like dense_plan.h for the dense cache:
// evictions, the spans or chunks to encode, the segment list after the advance, and
// the refinement layers that age out. CachePolicy::plan_pack() makes it from the
// segment list alone; each backend executes it (the CPU cache and the device cache
// encode, the memory model counts bytes) and CachePolicy::apply() installs the
// outcome.
//
// Two phases. Phase 1 (PackPlan) is decided from the segments. Which span an
// incremental chunk goes to is phase 2: with a break ratio the chunk joins the
// open span only if, encoded against the span's codebook, it fits (fits_open_span),
// which is measured by encoding it. SpanDecisions walks a plan's incremental chunks
// in encoding order: it says whether the next one may join the open span (the
// backend then measures the fit) and records the decision (ChunkDecision); the
// decisions go to apply() with the encodings.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "qvg/error.h"

namespace qvg::detail {

/// The global ranges one call's view shows: [0, sink_end) ++ [tail_start, end),
/// `tokens` tokens. When the two ranges touch they are merged into one
/// (sink_end = tail_start = 0).
struct ViewLayout {
  int64_t sink_end = 0;    ///< the view's sink part is [0, sink_end)
  int64_t tail_start = 0;  ///< its recent part is [tail_start, end)
  int64_t end = 0;         ///< global_end after the call
  int64_t tokens = 0;
};

/// Global tokens [t0, t1) of segment `seg` (segment-local indices) go to view token out_t.
struct ViewPiece {
  size_t seg = 0;
  int64_t t0 = 0, t1 = 0;  ///< segment-local tokens
  int64_t out_t = 0;
  bool operator==(const ViewPiece&) const = default;
};

/// The ids of incremental spans (the incremental span mode).
struct SpanCursor {
  int64_t open = -1;    ///< the span chunks may join (-1: none yet)
  int open_chunks = 0;  ///< chunks encoded into it so far (evicted ones included)
  int64_t next = 0;     ///< the id the next span gets (ids are never reused until reset)
  bool operator==(const SpanCursor&) const = default;
};

/// The books of a backend without incremental encodings (device cache, memory model).
struct NoBooks {
  bool operator==(const NoBooks&) const = default;
};

/// The open incremental span and the span statistics: the one place this state
/// lives. `Books` is the backend's handle on the open span's codebooks (the CPU
/// cache: its K and V SpanCodebooks, shared with the span's chunks); they outlive
/// the span's last chunk, since with init = warm they seed the next span's.
template <class Books>
struct OpenSpan {
  SpanCursor cursor;
  Books books{};  ///< the open span's codebooks (empty while cursor.open < 0)
  /// Residual energy per element of the open span's first chunk, K and V: the
  /// reference of the adaptive boundary (0 for backends that do not measure).
  double k_energy = 0, v_energy = 0;
  int64_t breaks = 0;  ///< spans started because a chunk that could join did not fit
};

/// One span or chunk an advance encodes.
struct EncodeStep {
  size_t first = 0, count = 0;  ///< raw segments [first, first + count) of the list before the call
  int64_t g0 = 0, g1 = 0;       ///< global tokens: the segments' union
  int chunks = 0;               ///< chunks in all
  bool is_sink = false;
  /// One chunk of an incremental span (count 1; phase 2 decides the span); else a
  /// whole span with its own codebook (sink spans, deferred spans).
  bool incremental = false;
  bool refine = false;  ///< its refinement layers are made (incremental, refinement on)
  int64_t tokens() const { return g1 - g0; }
  bool operator==(const EncodeStep&) const = default;
};

/// A segment of the list after an advance and where it comes from.
struct PlannedSegment {
  enum class Source : uint8_t {
    Kept,     ///< segment `index` of the list before the call, unchanged
    Encoded,  ///< the encoding of step `index` of PackPlan::encodes
    Current,  ///< the call's chunk, raw
  };
  Source source = Source::Kept;
  size_t index = 0;
  int64_t g0 = 0, g1 = 0;
  bool is_sink = false, packed = false;
  bool refined = false;  ///< holds refinement layers after the advance
  int chunks = 1;
  bool operator==(const PlannedSegment&) const = default;
};

/// What an advance does to the segments, decided before any change (phase 1).
/// Invariants: `after` is in global order, its last entry is the call's chunk, every
/// step appears in it exactly once (Encoded, in step order) and every segment of the
/// list before the call appears either in `evicted`, in one step, or as Kept.
struct PackPlan {
  int64_t start = 0, n = 0;             ///< the call's chunk [start, start + n)
  std::vector<size_t> evicted;          ///< segments of the list before the call that are dropped
  std::vector<EncodeStep> encodes;      ///< in encoding order: sink spans, then the rest oldest first
  std::vector<PlannedSegment> after;    ///< the segment list after the advance
  std::vector<size_t> drop_refinement;  ///< entries of `after` whose refinement layers are freed
  SpanCursor spans;                     ///< incremental span ids before the call
  bool follows_open = false;            ///< the first incremental chunk's predecessor is a chunk of the open span
  size_t incremental_chunks() const {
    size_t k = 0;
    for (const EncodeStep& s : encodes) k += s.incremental;
    return k;
  }
  bool operator==(const PackPlan&) const = default;
};

/// Phase 2's outcome for one incremental chunk.
struct ChunkDecision {
  bool may_join = false;  ///< it could join the open span (the backend measured its fit)
  bool joined = false;    ///< it fit and joined the open span; else it started a new span
  int64_t span = -1;      ///< the span it belongs to
  /// A chunk that started a span: its residual energies per element (the new span's
  /// reference; 0 for backends that do not measure).
  double k_energy = 0, v_energy = 0;
  bool operator==(const ChunkDecision&) const = default;
};

/// What an executed advance encoded: its plan's steps and the decisions of its
/// incremental chunks (the simulator reads a cache's last one: detail::PlanAccess).
struct PackOutcome {
  std::vector<EncodeStep> encodes;
  std::vector<ChunkDecision> decisions;
};

/// The adaptive boundary (the break ratio of QuantArgs, docs/spans.md): a chunk fits the open
/// span when its residual energy per element against the span's codebook, for K and
/// for V, is at most `ratio` times the span's first chunk's (`ref_*`); with ratio 0
/// every chunk fits. Against a zero reference a positive energy is an infinite ratio
/// and a zero one the ratio 1.
inline bool fits_open_span(double ratio, double k_energy, double v_energy, double ref_k, double ref_v) {
  const auto r = [](double e, double ref) {
    return ref > 0 ? e / ref : (e > 0 ? std::numeric_limits<double>::infinity() : 1.0);
  };
  return ratio == 0 || std::max(r(k_energy, ref_k), r(v_energy, ref_v)) <= ratio;
}

/// Phase 2: the incremental chunks of one PackPlan, one at a time in encoding order.
/// A chunk may join the open span when there is one, it has room (fewer chunks than
/// the policy's span_capacity) and it holds the chunk's predecessor; a chunk that
/// does not join starts the next span.
class SpanDecisions {
 public:
  SpanDecisions(const PackPlan& p, int capacity)
      : cursor_(p.spans), follows_(p.follows_open), span_chunks_(capacity), planned_(p.incremental_chunks()) {}

  /// Whether the next incremental chunk may join the open span (span cursor()).
  bool may_join() const { return follows_ && cursor_.open >= 0 && cursor_.open_chunks < span_chunks_; }

  /// Records the next chunk's decision: it joins iff may_join() and `fits`.
  /// `k_energy`, `v_energy`: its energies when it starts a span (the reference).
  /// REQUIRES fewer decisions than the plan's incremental chunks.
  const ChunkDecision& decide(bool fits, double k_energy = 0, double v_energy = 0) {
    QVG_CHECK(made_.size() < planned_);
    ChunkDecision d;
    d.may_join = may_join();
    d.joined = d.may_join && fits;
    if (d.joined) {
      d.span = cursor_.open;
      ++cursor_.open_chunks;
    } else {
      d.span = cursor_.next++;
      cursor_.open = d.span;
      cursor_.open_chunks = 1;
      d.k_energy = k_energy;
      d.v_energy = v_energy;
    }
    follows_ = true;  // the next incremental chunk follows this one, now in the open span
    made_.push_back(d);
    return made_.back();
  }

  const SpanCursor& cursor() const { return cursor_; }
  const std::vector<ChunkDecision>& decisions() const { return made_; }
  bool complete() const { return made_.size() == planned_; }

 private:
  SpanCursor cursor_;
  bool follows_ = false;
  int span_chunks_ = 1;
  size_t planned_ = 0;
  std::vector<ChunkDecision> made_;
};

}  // namespace qvg::detail
