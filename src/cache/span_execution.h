// src/cache/span_execution.h — the execution state of an advance's incremental
// chunks (docs/spans.md), shared by the CPU cache (packed_cache.cpp) and the device
// cache (cuda/device_cache.cpp): they differ only in their codebook and encoding
// types and in how they encode, so what a chunk's encode decides (join the open
// span with the trial codebooks, or start a new span) is written once here.
#pragma once

#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "cache/packed_plan.h"
#include "qvg/config.h"

namespace qvg::detail {

/// An incremental span's codebooks (K, V), shared by the span's chunks and, while
/// it is open, by the policy's span state.
template <class Book>
struct SpanBooks {
  std::shared_ptr<Book> k, v;
};

/// What executing an advance's PackPlan made; the cache is unchanged until the
/// backend installs it. Data: the backend's segment data; Book: its span codebook
/// (SpanCodebook or DeviceSpanCodebook); Enc: its encoding.
template <class Data, class Book, class Enc>
struct ExecutedPlan {
  std::vector<Data> encoded;  // one per step of the plan, in order
  SpanDecisions decisions;    // the incremental chunks' spans
  SpanBooks<Book> books;      // the open span's codebooks, when one of the call's chunks started it
  /// New contents of the cache's open span's codebooks (chunks of the call joined it).
  std::optional<Book> open_k, open_v;
  std::optional<Enc> warm_k, warm_v;  // the warm-start codebooks the call's whole spans left
};

/// The open span as the steps executed so far left it.
template <class Book>
struct OpenRun {
  SpanBooks<Book> books;  // its codebooks' handles
  bool staged = false;    // they are the cache's and their new contents are ExecutedPlan::open_k, open_v
  double k_energy = 0, v_energy = 0;
  template <class X>
  const Book* k(const X& x) const {
    return staged ? &*x.open_k : books.k.get();
  }
  template <class X>
  const Book* v(const X& x) const {
    return staged ? &*x.open_v : books.v.get();
  }
};

/// A chunk encoded (k, v) against trial copies (tk, tv) of the open span's codebooks
/// joins the span: `d` takes the encodings and the span's handles; the trial
/// codebooks become the span's new contents, staged in `x` when the codebooks are
/// the cache's (`cache_k`: the cache's open K codebook), else written in place (a
/// span this call started, not the cache's yet).
template <class Data, class Book, class Enc, class X>
void join_open_span(Data& d, X& x, OpenRun<Book>& run, const Book* cache_k, Book&& tk, Book&& tv, Enc&& k, Enc&& v) {
  hold(d.k_enc, std::move(k));
  hold(d.v_enc, std::move(v));
  d.k_book = run.books.k;
  d.v_book = run.books.v;
  if (run.books.k.get() == cache_k) {
    x.open_k = std::move(tk);
    x.open_v = std::move(tv);
    run.staged = true;
  } else {
    *run.books.k = std::move(tk);
    *run.books.v = std::move(tv);
  }
  x.decisions.decide(true);
}

/// The warm-start codebooks of a new span's first chunk (init = warm only): the
/// previous span's, else the encoding's codebooks `k_now`, `v_now`.
template <class Book, class Enc, class X>
std::pair<const Enc*, const Enc*> new_span_warm(const X& x, const OpenRun<Book>& run, const Enc* k_now,
                                                const Enc* v_now, const CodecConfig& ck, const CodecConfig& cv) {
  const Enc* wk = run.books.k ? &run.k(x)->book : k_now;
  const Enc* wv = run.books.v ? &run.v(x)->book : v_now;
  return {ck.init == Init::Warm ? wk : nullptr, cv.init == Init::Warm ? wv : nullptr};
}

/// Chunk `d`, encoded as the first chunk of fresh codebooks (k, v) with residual
/// energies (k_energy, v_energy), starts a new span: the run and `x` move on to it.
template <class Data, class Book, class X>
void start_span(Data& d, X& x, OpenRun<Book>& run, std::shared_ptr<Book> k, std::shared_ptr<Book> v, double k_energy,
                double v_energy) {
  d.k_book = k;
  d.v_book = v;
  run = {{std::move(k), std::move(v)}, false, k_energy, v_energy};
  x.books = run.books;
  x.decisions.decide(false, run.k_energy, run.v_energy);
}

/// After an advance whose chunks joined the span open before it: the span's
/// codebooks `before` are replaced by `now` wherever the cache refers to them (its
/// chunks and the policy's open span). The old objects are never written: a fork of
/// the cache may still share them (cache.h, "Branches"). Does not throw.
template <class Pol, class Books>
void replace_span_books(Pol& pol, const Books& before, const Books& now) noexcept {
  for (auto& s : pol.segments())
    if (s.data.k_book == before.k) {
      s.data.k_book = now.k;
      s.data.v_book = now.v;
    }
  auto& open = pol.spans().books;
  if (open.k == before.k) open = now;
}

/// What installing an advance (the backends' install()) takes from its executed plan
/// besides the segments, made before the policy changes (only allocation can fail
/// here): the new contents of the span open before the call (chunks of the call joined
/// it) as new codebook objects, and the warm-start codebooks as shared ones.
/// finish() completes the install after the policy's apply() and does not throw.
template <class Book, class Enc>
struct InstallStage {
  SpanBooks<Book> before, joined;  // the open span's codebooks before the call, and its new ones
  std::shared_ptr<const Enc> warm_k, warm_v;

  template <class Pol, class X>
  InstallStage(const Pol& pol, X& x) : before(pol.spans().books) {
    if (x.open_k) joined = {std::make_shared<Book>(std::move(*x.open_k)), std::make_shared<Book>(std::move(*x.open_v))};
    if (x.warm_k) warm_k = std::make_shared<const Enc>(std::move(*x.warm_k));
    if (x.warm_v) warm_v = std::make_shared<const Enc>(std::move(*x.warm_v));
  }
  /// After pol.apply(pp, ...): the joined span's codebooks replace the old ones (never
  /// written in place: a fork may share them), the cache's warm-start codebooks
  /// (`cache_wk`, `cache_wv`) move on, and older chunks lose their refinement layers
  /// (their base encodings stay exactly as they are).
  template <class Pol>
  void finish(Pol& pol, const PackPlan& pp, std::shared_ptr<const Enc>& cache_wk,
              std::shared_ptr<const Enc>& cache_wv) noexcept {
    if (joined.k) replace_span_books(pol, before, joined);
    if (warm_k) cache_wk = std::move(warm_k);
    if (warm_v) cache_wv = std::move(warm_v);
    for (const size_t i : pp.drop_refinement) {
      pol.segments()[i].data.k_ref.reset();
      pol.segments()[i].data.v_ref.reset();
    }
  }
};

/// Executes the encodings of an advance's plan `pp`, in order, from the policy's
/// raw segments (the call's own chunk is never part of a step), and returns what
/// they made; changes nothing of the cache (an exception leaves it as it was).
/// `m` is the backend's cache state, with the members both packed caches have:
/// pol, warm_k, warm_v, codec_k, codec_v and, each taking the backend's context
/// `ctx` last (the CPU cache's transient meter, the device cache's stream):
/// encode_incremental (a chunk joins the open span or starts one), refine (its
/// refinement layers), encode_one (a whole span), codebooks_of (the warm-start
/// codebooks an encoding leaves) and step_done (after each step).
template <class X, class M, class Ctx>
X execute_plan(const M& m, const PackPlan& pp, Ctx& ctx) {
  X x{{}, m.pol.span_decisions(pp), {}, {}, {}, {}, {}};
  const auto& segs = m.pol.segments();
  const auto& spans = m.pol.spans();
  OpenRun<std::remove_reference_t<decltype(*spans.books.k)>> run{spans.books, false, spans.k_energy, spans.v_energy};
  const auto* wk = m.warm_k ? &*m.warm_k : nullptr;  // the warm-start codebooks so far
  const auto* wv = m.warm_v ? &*m.warm_v : nullptr;
  x.encoded.reserve(pp.encodes.size());
  for (const EncodeStep& e : pp.encodes) {
    std::vector<const std::remove_cvref_t<decltype(segs.front())>*> parts;
    for (size_t i = e.first; i < e.first + e.count; ++i) parts.push_back(&segs[i]);
    typename decltype(x.encoded)::value_type d;
    if (e.incremental) {
      m.encode_incremental(*parts.front(), d, x, run, wk, wv, ctx);
      if (e.refine) m.refine(*parts.front(), d, *run.k(x), *run.v(x), ctx);
    } else {
      hold(d.k_enc, m.encode_one(parts, true, wk, ctx));
      hold(d.v_enc, m.encode_one(parts, false, wv, ctx));
      if (m.codec_k.init == Init::Warm) wk = &*(x.warm_k = m.codebooks_of(held(d.k_enc), ctx));
      if (m.codec_v.init == Init::Warm) wv = &*(x.warm_v = m.codebooks_of(held(d.v_enc), ctx));
    }
    m.step_done(d, ctx);
    x.encoded.push_back(std::move(d));
  }
  return x;
}

}  // namespace qvg::detail
