// The rate-distortion frontier (qvg/eval/frontier.h, frontier(); docs/quality.md):
// coordinate descent over qvg's knobs from the reference default, a ladder of rates
// around its result, the hq profile, qvg's own configurations over the whole range of
// rates (4 bits, refinement layers) and the baselines at 2, 3 and 4 bits, all scored
// on the same context and queries as compare(). Reports: frontier_report.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>

#include <fmt/core.h>

#include "qvg/attention.h"
#include "qvg/code_format.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/eval/baselines.h"
#include "qvg/eval/error_sums.h"
#include "qvg/eval/frontier.h"
#include "sim/sim_common.h"

namespace qvg {

namespace {

std::string codec_text(const CodecConfig& c, const CodecConfig& ref, bool short_form) {
  std::string o;
  auto add = [&](bool differs, const std::string& t) {
    if (short_form && !differs) return;
    if (!o.empty()) o += ' ';
    o += t;
  };
  add(c.bits != ref.bits, fmt::format("bits={}", c.bits));
  add(c.centroids != ref.centroids, fmt::format("centroids={}", c.centroids));
  add(c.stages != ref.stages, fmt::format("stages={}", c.stages));
  add(c.kmeans_iters != ref.kmeans_iters, fmt::format("iters={}", c.kmeans_iters));
  add(c.block_size != ref.block_size, fmt::format("block={}", c.block_size));
  add(c.asymmetric != ref.asymmetric, c.asymmetric ? "asymmetric" : "symmetric");
  add(c.scale_dtype != ref.scale_dtype, fmt::format("scales={}", name(c.scale_dtype)));
  add(c.scaling != ref.scaling, fmt::format("scaling={}", name(c.scaling)));
  add(c.scale_search != ref.scale_search, fmt::format("search={}", name(c.scale_search)));
  add(c.init != ref.init, fmt::format("init={}", name(c.init)));
  return o;
}

}  // namespace

FrontierCodec reference_codec() {
  QuantArgs q;
  q.apply_profile("reference");
  return frontier_codec_of(q);
}

FrontierCodec frontier_codec_of(const QuantArgs& q) {
  FrontierCodec c;
  c.k = q.codec_for(CacheRole::Key);
  c.v = q.codec_for(CacheRole::Value);
  c.chunks_per_span = 0;
  return c;
}

std::string FrontierCodec::describe(bool short_form) const {
  const FrontierCodec ref = reference_codec();
  const std::string ks = codec_text(k, ref.k, short_form), vs = codec_text(v, ref.v, short_form);
  std::string o;
  if (short_form && ks == vs) {
    if (!ks.empty()) o = ks;
  } else {
    if (!short_form || !ks.empty()) o += "k: " + (ks.empty() ? std::string("ref") : ks);
    if (!short_form || !vs.empty()) o += std::string(o.empty() ? "" : " | ") + "v: " + (vs.empty() ? "ref" : vs);
  }
  if (!short_form || chunks_per_span != 0)
    o += std::string(o.empty() ? "" : " | ") +
         (chunks_per_span == 0 ? std::string("span=all") : fmt::format("span={}", chunks_per_span));
  if (refinement_layer_bits != 0)
    o += std::string(o.empty() ? "" : " | ") + fmt::format("refine={}", refinement_layer_bits);
  return o.empty() ? "reference" : o;
}

void FrontierConfig::validate() const {
  const ModelPreset p = sim::validate_context_config(*this);
  if (max_queries < 0) throw InvalidArgument(fmt::format("max_queries must be >= 0 (0 = no cap), got {}", max_queries));
  if (!(bpe_slack >= 0 && bpe_slack <= 16))
    throw InvalidArgument(fmt::format("bpe_slack must be in [0, 16], got {}", bpe_slack));
  if (max_rounds < 1 || max_rounds > 10)
    throw InvalidArgument(fmt::format("max_rounds must be in 1..10, got {}", max_rounds));
  if (p.head_dim % 64 != 0)
    throw InvalidArgument(fmt::format("the frontier needs head_dim a multiple of 64, got {}", p.head_dim));
}

namespace {

using sim::tensor_error;
using clock_type = std::chrono::steady_clock;

using LayerData = sim::ScoredLayer;

/// x encoded span by span (span_tokens each, the last maybe fewer; warm-started from
/// the previous span with init = warm) and decoded; with refinement_layer_bits, each chunk
/// (chunk_tokens) of a span also gets a refinement layer over its decoding, added to
/// it. Bytes and times added.
Tensor span_round_trip(const Tensor& x, int64_t span_tokens, int64_t chunk_tokens, int refinement_layer_bits,
                       const CodecConfig& cfg, size_t& bytes, double& enc_s, double& dec_s) {
  const Shape4 sh = x.shape();
  const size_t row = size_t(sh.h * sh.d) * dtype_size(x.dtype());
  Tensor out(x.dtype(), sh);
  std::optional<EncodedTensor> prev;
  for (int64_t t0 = 0; t0 < sh.s; t0 += span_tokens) {
    const int64_t n = std::min(span_tokens, sh.s - t0);
    const ConstTensorView part{
        static_cast<const std::byte*>(x.data()) + size_t(t0) * row, x.dtype(), {1, n, sh.h, sh.d}};
    auto t = clock_type::now();
    EncodedTensor e = encode(part, cfg, cfg.init == Init::Warm && prev ? &*prev : nullptr);
    enc_s += sim::seconds_since(t);
    bytes += e.nbytes();
    t = clock_type::now();
    std::byte* dst = static_cast<std::byte*>(out.data()) + size_t(t0) * row;
    decode(e, TensorView{dst, x.dtype(), {1, n, sh.h, sh.d}}, cfg.threads);
    dec_s += sim::seconds_since(t);
    for (int64_t c0 = 0; refinement_layer_bits != 0 && c0 < n; c0 += chunk_tokens) {
      const int64_t m = std::min(chunk_tokens, n - c0);
      const Shape4 cs{1, m, sh.h, sh.d};
      const ConstTensorView xc{static_cast<const std::byte*>(part.data) + size_t(c0) * row, x.dtype(), cs};
      std::byte* dc = dst + size_t(c0) * row;
      t = clock_type::now();
      const EncodedTensor r =
          encode_refinement(xc, ConstTensorView{dc, x.dtype(), cs},
                            refinement_config(refinement_layer_bits, cfg.block_size, cfg.seed, cfg.threads));
      enc_s += sim::seconds_since(t);
      bytes += r.nbytes();
      t = clock_type::now();
      add_refinement(r, 0, m, 0, sh.h, DecodeTarget{dc, x.dtype(), m * sh.h * sh.d, sh.h * sh.d}, cfg.threads);
      dec_s += sim::seconds_since(t);
    }
    if (cfg.init == Init::Warm) prev = std::move(e);
  }
  return out;
}

/// Scores a qvg configuration or a baseline on the scored context's layers.
struct Evaluator {
  const FrontierConfig& cfg;
  const std::vector<LayerData>& data;
  int64_t chunk_tokens = 0;
  double elements = 0;  ///< K and V elements of the context: the bits-per-element denominator

  void score(FrontierPoint& pt, const Tensor& kq, const Tensor& vq, const LayerData& d) const {
    pt.k.add(tensor_error(d.k.view(), kq.view()));
    pt.v.add(tensor_error(d.v.view(), vq.view()));
    const Tensor kq_all = sim::concat_tokens(kq.view(), d.k_cur.view());
    const Tensor vq_all = sim::concat_tokens(vq.view(), d.v_cur.view());
    const Tensor out =
        attention(d.q.view(), StridedView::of(kq_all.view()), StridedView::of(vq_all.view()), cfg.threads);
    pt.attention.add(attention_error(out, d.ref));
  }

  FrontierPoint qvg(const FrontierCodec& c) const {
    FrontierPoint pt;
    pt.method = "qvg";
    pt.codec = c;
    size_t bytes = 0;
    for (const LayerData& d : data) {
      const int64_t span = c.chunks_per_span == 0 ? d.k.shape().s : int64_t(c.chunks_per_span) * chunk_tokens;
      const Tensor kq =
          span_round_trip(d.k, span, chunk_tokens, c.refinement_layer_bits, c.k, bytes, pt.encode_s, pt.decode_s);
      const Tensor vq =
          span_round_trip(d.v, span, chunk_tokens, c.refinement_layer_bits, c.v, bytes, pt.encode_s, pt.decode_s);
      score(pt, kq, vq, d);
    }
    pt.bits_per_element = double(bytes) * 8.0 / elements;
    return pt;
  }

  FrontierPoint baseline(BaselineMethod m, const BaselineConfig& b) const {
    FrontierPoint pt;
    pt.method = std::string(name(m));
    pt.baseline = b;
    pt.stage = "baseline";
    pt.label = fmt::format("{} {}b g{}", name(m), b.bits, b.block_size);
    size_t bytes = 0;
    for (const LayerData& d : data) {
      RoundTrip rk = baseline_roundtrip(m, d.k.view(), TensorRole::Key, b);
      RoundTrip rv = baseline_roundtrip(m, d.v.view(), TensorRole::Value, b);
      bytes += rk.nbytes + rv.nbytes;
      score(pt, rk.decoded, rv.decoded, d);
    }
    pt.bits_per_element = double(bytes) * 8.0 / elements;
    return pt;
  }
};

/// One value a knob can take: its label in the trace ("2", "mse", "4+warm") and the
/// setting it makes.
struct KnobValue {
  std::string label;
  std::function<void(FrontierCodec&)> apply;
};

/// One knob of the descent: its name ("k.bits", "scaling", "span") and its values.
struct Knob {
  std::string name;
  std::vector<KnobValue> values;
};

/// A value's label in the trace: an int in decimal, a bool as true/false, an enum by name().
std::string value_label(int v) {
  return fmt::format("{}", v);
}
std::string value_label(bool v) {
  return v ? "true" : "false";
}
template <typename E>
requires std::is_enum_v<E> std::string value_label(E v) {
  return std::string(name(v));
}

/// Which roles one knob of a CodecConfig member sets.
enum class Roles {
  Each,  ///< a knob per role: "k.<field>", then "v.<field>"
  Both,  ///< one knob "<field>" setting K and V alike
};

/// Appends the knob(s) of CodecConfig member `member` with `values`, in that order.
template <typename T, typename C>  // C: CodecConfig or its base StoredCodec
void add_member_knob(std::vector<Knob>& out, Roles roles, const char* field, T C::*member,
                     const std::vector<T>& values) {
  auto knob = [&](const std::string& knob_name, bool set_k, bool set_v) {
    Knob kn{knob_name, {}};
    for (const T v : values)
      kn.values.push_back({value_label(v), [=](FrontierCodec& c) {
                             if (set_k) c.k.*member = v;
                             if (set_v) c.v.*member = v;
                           }});
    out.push_back(std::move(kn));
  };
  if (roles == Roles::Both) {
    knob(field, true, true);
  } else {
    knob(fmt::format("k.{}", field), true, false);
    knob(fmt::format("v.{}", field), false, true);
  }
}

/// The span knob: chunks per span (0 = the whole context) and whether each span's
/// k-means starts warm from the previous span's centroids (one codebook per span).
Knob span_knob() {
  struct Span {
    int chunks;
    bool warm;
  };
  Knob kn{"span", {}};
  for (const Span s : {Span{0, false}, Span{4, false}, Span{1, false}, Span{4, true}, Span{1, true}})
    kn.values.push_back(
        {fmt::format("{}{}", s.chunks == 0 ? std::string("all") : value_label(s.chunks), s.warm ? "+warm" : ""),
         [s](FrontierCodec& c) {
           c.chunks_per_span = s.chunks;
           if (s.warm)
             c.k.init = c.v.init = Init::Warm;
           else if (c.k.init == Init::Warm)
             c.k.init = c.v.init = Init::Random;
         }});
  return kn;
}

/// The code widths of qvg/code_format.h (2, 3, 4): the bits knob's values.
std::vector<int> code_widths() {
  std::vector<int> w;
  for (const CodeFormat& f : kCodeFormats) w.push_back(f.bits);
  return w;
}

/// The knobs in the descent's fixed order (`quick`: the first three only).
std::vector<Knob> knobs(bool quick) {
  std::vector<Knob> out;
  add_member_knob(out, Roles::Both, "scaling", &CodecConfig::scaling, {Scaling::Compat, Scaling::TwoLevel});
  add_member_knob(out, Roles::Each, "scale_search", &CodecConfig::scale_search, {ScaleSearch::Off, ScaleSearch::Mse});
  add_member_knob(out, Roles::Each, "asymmetric", &CodecConfig::asymmetric, {false, true});
  if (quick) return out;
  add_member_knob(out, Roles::Each, "bits", &CodecConfig::bits, code_widths());
  add_member_knob(out, Roles::Each, "centroids", &CodecConfig::centroids, {32, 64, 128, 256});
  add_member_knob(out, Roles::Each, "stages", &CodecConfig::stages, {1, 2});
  add_member_knob(out, Roles::Each, "block_size", &CodecConfig::block_size, {32, 64, 128});
  add_member_knob(out, Roles::Each, "scale_dtype", &CodecConfig::scale_dtype, {ScaleDType::FP8_E4M3, ScaleDType::BF16});
  add_member_knob(out, Roles::Both, "iters", &CodecConfig::kmeans_iters, {2, 4, 8});
  add_member_knob(out, Roles::Both, "init", &CodecConfig::init, {Init::Random, Init::KMeansPlusPlus});
  out.push_back(span_knob());
  return out;
}

void mark_pareto(std::vector<FrontierPoint>& pts) {
  for (FrontierPoint& a : pts) {
    a.pareto = true;
    for (const FrontierPoint& b : pts) {
      const double ea = a.attention.rel_l2(), eb = b.attention.rel_l2();
      if (&a != &b && b.bits_per_element <= a.bits_per_element && eb <= ea &&
          (b.bits_per_element < a.bits_per_element || eb < ea)) {
        a.pareto = false;
        break;
      }
    }
  }
}

/// The curve (bits 2, 3, 4) of one baseline and group at bits per element x.
FrontierCurveAt curve_at(const std::vector<FrontierPoint>& pts, const std::string& method, int group, double x) {
  std::vector<std::pair<double, double>> c;
  for (const FrontierPoint& p : pts)
    if (p.method == method && p.baseline.block_size == group) c.emplace_back(p.bits_per_element, p.attention.rel_l2());
  std::sort(c.begin(), c.end());
  FrontierCurveAt r;
  r.method = method;
  r.group = group;
  QVG_CHECK(!c.empty());
  if (x <= c.front().first) {
    r.error = c.front().second;
    r.clamped = x < c.front().first;
    return r;
  }
  if (x >= c.back().first) {
    r.error = c.back().second;
    r.clamped = x > c.back().first;
    return r;
  }
  for (size_t i = 1; i < c.size(); ++i)
    if (x <= c[i].first) {
      const double t = (x - c[i - 1].first) / (c[i].first - c[i - 1].first);
      r.error = std::exp(std::log(c[i - 1].second) * (1 - t) + std::log(c[i].second) * t);
      return r;
    }
  r.error = c.back().second;
  return r;
}

/// True when K's and V's settings are valid for head_dim (the descent skips the
/// values that are not).
bool valid_for(const FrontierCodec& c, int64_t head_dim) {
  for (const CodecConfig* x : {&c.k, &c.v}) {
    try {
      x->validate_for_head_dim(head_dim);
    } catch (const InvalidArgument&) {
      return false;
    }
  }
  return true;
}

/// The search's steps over one scored context. Every point lands in res.points; each
/// qvg configuration is evaluated once (keyed by its full description, seed and
/// threads included) and a repeat returns the first evaluation's index.
struct Search {
  const FrontierConfig& cfg;
  FrontierResult& res;
  const Evaluator& ev;
  const std::function<void(const std::string&)>& progress;
  std::map<std::string, size_t> seen;

  void say(const std::string& s) const {
    if (progress) progress(s);
  }

  /// The index of qvg configuration c (with the config's codec seed and threads) in
  /// res.points, evaluated now unless it was before. Throws InvalidArgument when c is
  /// not valid for the preset's head_dim.
  size_t evaluate(FrontierCodec c, const std::string& stage, const std::string& label) {
    c.k.seed = c.v.seed = cfg.codec_seed;
    c.k.threads = c.v.threads = cfg.threads;
    const std::string key = c.describe();
    if (auto it = seen.find(key); it != seen.end()) return it->second;
    for (const CodecConfig* x : {&c.k, &c.v}) x->validate_for_head_dim(res.preset.head_dim);
    FrontierPoint pt = ev.qvg(c);
    pt.stage = stage;
    pt.label = label;
    res.points.push_back(std::move(pt));
    const size_t i = res.points.size() - 1;
    seen[key] = i;
    const FrontierPoint& q = res.points[i];
    say(fmt::format("  [{:3}] {:9} bpe {:.3f}  attn {:.5f}  K {:5.2f} dB  V {:5.2f} dB  {}", i, stage,
                    q.bits_per_element, q.attention.rel_l2(), q.k.snr_db().value_or(0), q.v.snr_db().value_or(0),
                    c.describe(true)));
    return i;
  }

  /// The reference default evaluated; sets res.reference and the descent's budget.
  FrontierCodec start_at_reference() {
    const FrontierCodec ref = reference_codec();
    res.reference = evaluate(ref, "reference", "reference default");
    res.budget_bpe = res.points[res.reference].bits_per_element + cfg.bpe_slack;
    say(fmt::format("coordinate descent from the reference default, budget {:.3f} bits per element", res.budget_bpe));
    return ref;
  }

  /// Coordinate descent from `start` (point res.reference; see simulate.h): sets
  /// res.best and res.trace and returns the configuration it ends at.
  FrontierCodec descend(const FrontierCodec& start) {
    FrontierCodec cur = start;
    size_t cur_i = res.reference;
    const std::vector<Knob> ks = knobs(cfg.quick);
    for (int round = 1; round <= cfg.max_rounds; ++round) {
      bool changed = false;
      for (const Knob& kn : ks) {
        size_t best_i = cur_i;
        FrontierCodec best = cur;
        for (const KnobValue& val : kn.values) {
          FrontierCodec c = cur;
          val.apply(c);
          if (c == cur || !valid_for(c, res.preset.head_dim)) continue;
          const size_t i = evaluate(c, "descent", fmt::format("{}={}", kn.name, val.label));
          const FrontierPoint& q = res.points[i];
          if (q.bits_per_element <= res.budget_bpe + 1e-12 &&
              q.attention.rel_l2() < res.points[best_i].attention.rel_l2()) {
            best_i = i;
            best = c;
          }
        }
        if (best_i != cur_i) {
          res.trace.push_back(fmt::format("round {}: {} -> attn {:.5f} at {:.3f} bpe ({})", round, kn.name,
                                          res.points[best_i].attention.rel_l2(), res.points[best_i].bits_per_element,
                                          best.describe(true)));
          say("  accept " + res.trace.back());
          cur = best;
          cur_i = best_i;
          changed = true;
        }
      }
      if (!changed) break;
    }
    res.best = cur_i;
    return cur;
  }

  /// The hq profile (its settings come from this search; docs/quality.md); sets
  /// res.profile. The descent may have visited it already: it is relabelled.
  void add_profile() {
    QuantArgs q;
    q.apply_profile("hq");
    res.profile = evaluate(frontier_codec_of(q), "profile", "hq profile");
    res.points[res.profile].label = "hq profile";
    res.points[res.profile].stage = "profile";
  }

  /// A ladder of rates around the descent's result (every code width x centroids 64/256).
  void add_ladder(const FrontierCodec& best) {
    for (const int bits : code_widths())
      for (const int k : {64, 256}) {
        FrontierCodec c = best;
        c.k.bits = c.v.bits = bits;
        c.k.centroids = c.v.centroids = k;
        evaluate(c, "ladder", fmt::format("best, bits={} centroids={}", bits, k));
      }
  }

  /// qvg's own configurations over the baselines' whole range of rates
  /// (docs/quality.md; quick runs too): hq with V at 4 bits (about 3.4 bits per
  /// element), hq at 4 bits (about 4.4), the reference at 4 bits, and hq with a 2-bit
  /// refinement layer on every chunk (about 4.6).
  void add_range(const FrontierCodec& ref) {
    QuantArgs q;
    q.apply_profile("hq");
    const FrontierCodec hq = frontier_codec_of(q);
    FrontierCodec v4 = hq;
    v4.v.bits = 4;
    evaluate(v4, "range", "hq, V at 4 bits");
    FrontierCodec hq4 = hq;
    hq4.k.bits = hq4.v.bits = 4;
    evaluate(hq4, "range", "hq at 4 bits");
    FrontierCodec r4 = ref;
    r4.k.bits = r4.v.bits = 4;
    evaluate(r4, "range", "reference at 4 bits");
    FrontierCodec refined = hq;
    refined.refinement_layer_bits = 2;
    evaluate(refined, "range", "hq + 2-bit refinement layers");
  }

  /// Every baseline at 2, 3 and 4 bits, groups of 32 and 64.
  void add_baselines() {
    say("baselines: rtn, kivi, quarot at 2, 3, 4 bits, groups of 32 and 64");
    for (const BaselineMethod m : all_baseline_methods())
      for (const int group : {32, 64})
        for (const int bits : {2, 3, 4}) {
          BaselineConfig b;
          b.bits = bits;
          b.block_size = group;
          b.kivi_group_tokens = group;
          b.validate_for(m, res.preset.head_dim);
          res.points.push_back(ev.baseline(m, b));
          const FrontierPoint& q = res.points.back();
          say(fmt::format("  [{:3}] baseline  bpe {:.3f}  attn {:.5f}  {}", res.points.size() - 1, q.bits_per_element,
                          q.attention.rel_l2(), q.label));
        }
  }

  /// The Pareto set marked and every baseline curve read at the profile's rate.
  void summarize() {
    mark_pareto(res.points);
    const double x = res.points[res.profile].bits_per_element;
    for (const BaselineMethod m : all_baseline_methods())
      for (const int group : {32, 64}) res.curves.push_back(curve_at(res.points, std::string(name(m)), group, x));
  }

  /// Encode and decode throughput (elements per second) of point i's codec: the
  /// best of 3 timings each (0 where a time is 0).
  std::pair<double, double> throughput(size_t i) const {
    double be = std::numeric_limits<double>::infinity(), bd = be;
    for (int t = 0; t < 3; ++t) {
      const FrontierPoint pt = ev.qvg(res.points[i].codec);
      be = std::min(be, pt.encode_s);
      bd = std::min(bd, pt.decode_s);
    }
    return {be > 0 ? ev.elements / be : 0, bd > 0 ? ev.elements / bd : 0};
  }
};

/// The query stride: cfg.query_stride, grown until the next chunk gives at most
/// cfg.max_queries queries (0: no cap).
int query_stride_for(const FrontierConfig& cfg, const ModelPreset& p) {
  int stride = cfg.query_stride;
  if (cfg.max_queries > 0) {
    const int64_t ct = p.chunk_tokens();
    while ((ct + stride - 1) / stride > cfg.max_queries) ++stride;
  }
  return stride;
}

}  // namespace

FrontierResult frontier(const FrontierConfig& cfg, const std::function<void(const std::string&)>& progress) {
  cfg.validate();
  const auto t_start = clock_type::now();
  FrontierResult res;
  const Workload w = sim::open_context(cfg, res, 256);
  const ModelPreset& p = res.preset;
  res.query_stride = query_stride_for(cfg, p);
  const sim::ScoredContext sc =
      sim::scored_context(w, res.layers, res.context_chunks * p.frames_per_chunk, res.query_stride, cfg.threads);
  res.queries = sc.queries;
  const Evaluator ev{cfg, sc.layers, p.chunk_tokens(), sc.elements};
  Search search{cfg, res, ev, progress, {}};
  search.say(fmt::format("frontier: {} at scale {}: {} layers, {} context tokens ({} chunks), {} queries (every {}-th)",
                         p.name, cfg.scale, res.layers.size(), res.context_tokens, res.context_chunks, res.queries,
                         res.query_stride));

  const FrontierCodec ref = search.start_at_reference();
  const FrontierCodec best = search.descend(ref);
  search.add_profile();
  if (!cfg.quick) search.add_ladder(best);
  search.add_range(ref);
  search.add_baselines();
  search.summarize();
  std::tie(res.ref_encode_eps, res.ref_decode_eps) = search.throughput(res.reference);
  std::tie(res.hq_encode_eps, res.hq_decode_eps) = search.throughput(res.profile);
  res.wall_s = sim::seconds_since(t_start);
  search.say(fmt::format("frontier done in {:.1f} s: {} points", res.wall_s, res.points.size()));
  return res;
}

}  // namespace qvg
