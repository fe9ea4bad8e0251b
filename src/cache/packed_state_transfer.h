// src/cache/packed_state_transfer.h — private: a packed cache's state as the owned
// host data of its snapshot (snapshot_state.h: PackedStateData) and back, for a cache
// whose payload is not host memory (the device packed cache, src/cache/cuda): its
// policy's segments, span codebooks, span state and warm-start codebooks are copied
// into a PackedStateData with `down` (device to host), written by the one writer of
// the CPU caches (snapshot_records.h: write_packed of ref_of(data)), so the two caches
// write the same bytes for the same state (the config's `device` entry aside); a read
// and validated PackedStateData is copied back with `up`. The segment order, the one
// entry per span (a span's chunks are adjacent; the open span's codebooks also when
// none of its chunks is left) and the sharing of a span's codebooks by its chunks are
// those of the CPU cache's SnapshotAccess (packed_cache.cpp).
//
// Requirements on the payload P (members, as the CPU and device caches' SegData):
// k_raw, v_raw (raw buffers), k_enc, v_enc (encodings), k_book, v_book (shared_ptr to
// span codebooks), k_ref, v_ref (optional refinement layers); on the books B: members
// k, v (the shared_ptrs). `down` has raw(buffer) -> AlignedBuffer, enc(encoding) ->
// EncodedTensor, book(span codebook) -> SpanCodebook; `up` the inverse: raw(const
// AlignedBuffer&), enc(const EncodedTensor&), book(const SpanCodebook&).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cache/cache_policy.h"
#include "cache/snapshot_state.h"
#include "qvg/error.h"

namespace qvg::detail {

/// The state of a cache running `pol` (with its warm-start codebooks, if any) as owned host data.
template <class P, class B, class Enc, class Down>
PackedStateData state_data_of(const CachePolicy<P, B>& pol, const CacheOptions& o, const QuantArgs& q,
                              const Enc* warm_k, const Enc* warm_v, Down&& down) {
  PackedStateData d;
  d.options = o;
  d.quant = q;
  d.global_end = pol.global_end();
  d.chunk_tokens = pol.chunk_tokens();
  for (const PlanSegment<P>& s : pol.segments()) {
    PackedSegmentData g;  // the placement fields first, the arrays below
    std::tie(g.g0, g.g1, g.is_sink, g.packed, g.chunks, g.span) =
        std::tie(s.g0, s.g1, s.is_sink, s.packed, s.chunks, s.span);
    if (s.packed) {
      g.k_enc = down.enc(held(s.data.k_enc));
      g.v_enc = down.enc(held(s.data.v_enc));
      if (s.data.k_ref) {
        g.k_ref = down.enc(*s.data.k_ref);
        g.v_ref = down.enc(*s.data.v_ref);
      }
    } else {
      g.k_raw = down.raw(s.data.k_raw);
      g.v_raw = down.raw(s.data.v_raw);
    }
    if (s.span >= 0 && (d.spans.empty() || d.spans.back().id != s.span))
      d.spans.push_back({s.span, down.book(*s.data.k_book), down.book(*s.data.v_book)});
    d.segments.push_back(std::move(g));
  }
  const OpenSpan<B>& spans = pol.spans();
  const SpanCursor& open = spans.cursor;
  if (open.open >= 0 && (d.spans.empty() || d.spans.back().id != open.open))
    d.spans.push_back({open.open, down.book(*spans.books.k), down.book(*spans.books.v)});
  d.span_state = {open.open, open.open_chunks, open.next, spans.breaks, spans.k_energy, spans.v_energy};
  if (warm_k) d.warm_k = down.enc(*warm_k);
  if (warm_v) d.warm_v = down.enc(*warm_v);
  return d;
}

/// The writer's view of owned state data (valid while `d` is); `device`: the config's
/// `device` entry ("cpu", "cuda").
inline PackedStateRef ref_of(const PackedStateData& d, const char* device) {
  PackedStateRef r;
  r.options = d.options;
  r.quant = d.quant;
  r.device = device;
  r.global_end = d.global_end;
  r.chunk_tokens = d.chunk_tokens;
  for (const PackedSegmentData& s : d.segments) {
    PackedSegmentRef g{s.g0, s.g1, s.is_sink, s.packed, s.chunks, s.span, {}, {}, nullptr, nullptr, nullptr, nullptr};
    if (s.packed) {
      g.k_enc = &s.k_enc;
      g.v_enc = &s.v_enc;
      if (s.k_ref) {
        g.k_ref = &*s.k_ref;
        g.v_ref = &*s.v_ref;
      }
    } else {
      g.k_raw = {s.k_raw.data(), s.k_raw.size()};
      g.v_raw = {s.v_raw.data(), s.v_raw.size()};
    }
    r.segments.push_back(g);
  }
  for (const PackedSpanData& sp : d.spans) r.spans.push_back({sp.id, &sp.k, &sp.v});
  r.warm_k = d.warm_k ? &*d.warm_k : nullptr;
  r.warm_v = d.warm_v ? &*d.warm_v : nullptr;
  r.span_state = d.span_state;
  return r;
}

/// What a cache is rebuilt from: its policy's segments and span state, its warm-start codebooks.
template <class P, class B, class Enc>
struct RestoredState {
  std::vector<PlanSegment<P>> segments;
  OpenSpan<B> spans;
  std::optional<Enc> warm_k, warm_v;
};

/// Validated state data (read_packed) as a cache's payloads, made with `up`; one
/// shared pair of codebooks per span, for its chunks and (the open span) the policy.
template <class P, class B, class Enc, class Up>
RestoredState<P, B, Enc> restore_state(const PackedStateData& d, Up&& up) {
  using Book = std::remove_const_t<typename decltype(P::k_book)::element_type>;
  std::vector<std::pair<int64_t, std::pair<std::shared_ptr<Book>, std::shared_ptr<Book>>>> books;
  books.reserve(d.spans.size());
  for (const PackedSpanData& sp : d.spans)
    books.push_back({sp.id, {std::make_shared<Book>(up.book(sp.k)), std::make_shared<Book>(up.book(sp.v))}});
  const auto book_of = [&](int64_t id) {
    const auto it =
        std::lower_bound(books.begin(), books.end(), id, [](const auto& b, int64_t x) { return b.first < x; });
    QVG_CHECK(it != books.end() && it->first == id);  // the reader checked every id has its span
    return it->second;
  };
  RestoredState<P, B, Enc> r;
  r.segments.reserve(d.segments.size());
  for (const PackedSegmentData& s : d.segments) {
    PlanSegment<P> g;
    g.set_geometry(s);
    g.span = s.span;
    g.refined = s.k_ref.has_value();
    if (s.packed) {
      hold(g.data.k_enc, up.enc(s.k_enc));
      hold(g.data.v_enc, up.enc(s.v_enc));
      if (s.k_ref) {
        hold(g.data.k_ref, up.enc(*s.k_ref));
        hold(g.data.v_ref, up.enc(*s.v_ref));
      }
    } else {
      g.data.k_raw = up.raw(s.k_raw);
      g.data.v_raw = up.raw(s.v_raw);
    }
    if (s.span >= 0) std::tie(g.data.k_book, g.data.v_book) = book_of(s.span);
    r.segments.push_back(std::move(g));
  }
  const SpanState& ss = d.span_state;
  r.spans.cursor = {ss.open_span, ss.open_span_chunks, ss.next_span};
  if (ss.open_span >= 0) std::tie(r.spans.books.k, r.spans.books.v) = book_of(ss.open_span);
  r.spans.k_energy = ss.open_k_energy;
  r.spans.v_energy = ss.open_v_energy;
  r.spans.breaks = ss.span_breaks;
  if (d.warm_k) r.warm_k = up.enc(*d.warm_k);
  if (d.warm_v) r.warm_v = up.enc(*d.warm_v);
  return r;
}

}  // namespace qvg::detail
