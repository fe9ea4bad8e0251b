// The rate-distortion frontier (qvg/simulate.h, frontier(); docs/quality.md):
// coordinate descent over qvg's knobs from the reference default, a ladder of rates
// around its result, the hq profile and the baselines at 2, 3 and 4 bits, all scored
// on the same context and queries as compare().
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "codec/kmeans.h"
#include "qvg/attention.h"
#include "qvg/baselines.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/simulate.h"
#include "sim/report_util.h"
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
  c.k = q.codec(CacheRole::Key);
  c.v = q.codec(CacheRole::Value);
  c.span_chunks = 0;
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
  if (!short_form || span_chunks != 0)
    o += std::string(o.empty() ? "" : " | ") +
         (span_chunks == 0 ? std::string("span=all") : fmt::format("span={}", span_chunks));
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
/// the previous span with init = warm) and decoded; bytes and times added.
Tensor span_round_trip(const Tensor& x, int64_t span_tokens, const CodecConfig& cfg, size_t& bytes, double& enc_s,
                       double& dec_s) {
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
    decode(e, TensorView{static_cast<std::byte*>(out.data()) + size_t(t0) * row, x.dtype(), {1, n, sh.h, sh.d}},
           cfg.threads);
    dec_s += sim::seconds_since(t);
    if (cfg.init == Init::Warm) prev = std::move(e);
  }
  return out;
}

struct Evaluator {
  const FrontierConfig& cfg;
  const ModelPreset& p;
  std::vector<LayerData>& data;
  int64_t chunk_tokens = 0;
  double elements = 0;

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
      const int64_t span = c.span_chunks == 0 ? d.k.shape().s : int64_t(c.span_chunks) * chunk_tokens;
      const Tensor kq = span_round_trip(d.k, span, c.k, bytes, pt.encode_s, pt.decode_s);
      const Tensor vq = span_round_trip(d.v, span, c.v, bytes, pt.encode_s, pt.decode_s);
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

/// One knob of the descent: its name and values, and how a value is set.
struct Knob {
  std::string name;
  std::vector<std::string> values;
  std::function<void(FrontierCodec&, const std::string&)> set;
};

int to_int(const std::string& s) {
  return std::stoi(s);
}

std::vector<Knob> knobs(bool quick) {
  std::vector<Knob> out;
  auto role_knob = [&](const char* field, std::vector<std::string> values,
                       std::function<void(CodecConfig&, const std::string&)> set) {
    for (const bool is_k : {true, false})
      out.push_back({fmt::format("{}.{}", is_k ? "k" : "v", field), values,
                     [is_k, set](FrontierCodec& c, const std::string& v) { set(is_k ? c.k : c.v, v); }});
  };
  auto both_knob = [&](const char* field, std::vector<std::string> values,
                       std::function<void(CodecConfig&, const std::string&)> set) {
    out.push_back({field, values, [set](FrontierCodec& c, const std::string& v) {
                     set(c.k, v);
                     set(c.v, v);
                   }});
  };
  both_knob("scaling", {"compat", "two_level"},
            [](CodecConfig& c, const std::string& v) { c.scaling = parse_scaling(v); });
  role_knob("scale_search", {"off", "mse"},
            [](CodecConfig& c, const std::string& v) { c.scale_search = parse_scale_search(v); });
  role_knob("asymmetric", {"false", "true"}, [](CodecConfig& c, const std::string& v) { c.asymmetric = v == "true"; });
  if (quick) return out;
  role_knob("bits", {"2", "4"}, [](CodecConfig& c, const std::string& v) { c.bits = to_int(v); });
  role_knob("centroids", {"32", "64", "128", "256"},
            [](CodecConfig& c, const std::string& v) { c.centroids = to_int(v); });
  role_knob("stages", {"1", "2"}, [](CodecConfig& c, const std::string& v) { c.stages = to_int(v); });
  role_knob("block_size", {"32", "64", "128"}, [](CodecConfig& c, const std::string& v) { c.block_size = to_int(v); });
  role_knob("scale_dtype", {"fp8_e4m3", "bf16"},
            [](CodecConfig& c, const std::string& v) { c.scale_dtype = parse_scale_dtype(v); });
  both_knob("iters", {"2", "4", "8"}, [](CodecConfig& c, const std::string& v) { c.kmeans_iters = to_int(v); });
  both_knob("init", {"random", "kmeans++"}, [](CodecConfig& c, const std::string& v) { c.init = parse_init(v); });
  // Span length, and warm starts along the spans (one codebook per span).
  out.push_back({"span", {"all", "4", "1", "4+warm", "1+warm"}, [](FrontierCodec& c, const std::string& v) {
                   c.span_chunks = v.rfind("all", 0) == 0 ? 0 : to_int(v);
                   const bool warm = v.find("+warm") != std::string::npos;
                   if (warm)
                     c.k.init = c.v.init = Init::Warm;
                   else if (c.k.init == Init::Warm)
                     c.k.init = c.v.init = Init::Random;
                 }});
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

}  // namespace

FrontierResult frontier(const FrontierConfig& cfg, const std::function<void(const std::string&)>& progress) {
  cfg.validate();
  const auto t_start = clock_type::now();
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  FrontierResult res;
  const Workload w = sim::open_context(cfg, res, 256);
  const ModelPreset& p = res.preset;
  const int64_t ctx_frames = res.context_chunks * p.frames_per_chunk;

  res.query_stride = cfg.query_stride;
  if (cfg.max_queries > 0) {
    const int64_t ct = p.chunk_tokens();
    while ((ct + res.query_stride - 1) / res.query_stride > cfg.max_queries) ++res.query_stride;
  }
  sim::ScoredContext sc = sim::scored_context(w, res.layers, ctx_frames, res.query_stride, cfg.threads);
  std::vector<LayerData>& data = sc.layers;
  const double elements = sc.elements;
  res.queries = sc.queries;
  say(fmt::format("frontier: {} at scale {}: {} layers, {} context tokens ({} chunks), {} queries (every {}-th)",
                  p.name, cfg.scale, res.layers.size(), res.context_tokens, res.context_chunks, res.queries,
                  res.query_stride));
  Evaluator ev{cfg, p, data, p.chunk_tokens(), elements};

  // Every qvg configuration evaluated once (keyed by its full description).
  std::map<std::string, size_t> seen;
  auto with_seed = [&](FrontierCodec c) {
    c.k.seed = c.v.seed = cfg.codec_seed;
    c.k.threads = c.v.threads = cfg.threads;
    return c;
  };
  auto eval_qvg = [&](const FrontierCodec& c0, const std::string& stage, const std::string& label) -> size_t {
    const FrontierCodec c = with_seed(c0);
    const std::string key = c.describe();
    if (auto it = seen.find(key); it != seen.end()) return it->second;
    for (const CodecConfig* x : {&c.k, &c.v}) x->validate_for_head_dim(p.head_dim);
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
  };

  const FrontierCodec ref = reference_codec();
  res.reference = eval_qvg(ref, "reference", "reference default");
  res.budget_bpe = res.points[res.reference].bits_per_element + cfg.bpe_slack;
  say(fmt::format("coordinate descent from the reference default, budget {:.3f} bits per element", res.budget_bpe));

  // Coordinate descent (see simulate.h).
  FrontierCodec cur = ref;
  size_t cur_i = res.reference;
  const std::vector<Knob> ks = knobs(cfg.quick);
  for (int round = 1; round <= cfg.max_rounds; ++round) {
    bool changed = false;
    for (const Knob& kn : ks) {
      size_t best_i = cur_i;
      FrontierCodec best = cur;
      for (const std::string& val : kn.values) {
        FrontierCodec c = cur;
        kn.set(c, val);
        if (c == cur) continue;
        bool ok = true;
        for (const CodecConfig* x : {&c.k, &c.v}) {
          try {
            x->validate_for_head_dim(p.head_dim);
          } catch (const InvalidArgument&) {
            ok = false;
          }
        }
        if (!ok) continue;
        const size_t i = eval_qvg(c, "descent", fmt::format("{}={}", kn.name, val));
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

  // The hq profile (its settings come from this search; docs/quality.md) and a
  // ladder of rates around the descent's result.
  {
    QuantArgs q;
    q.apply_profile("hq");
    res.profile = eval_qvg(frontier_codec_of(q), "profile", "hq profile");
    // The descent may have visited it already: it is labelled as the profile.
    res.points[res.profile].label = "hq profile";
    res.points[res.profile].stage = "profile";
  }
  if (!cfg.quick) {
    for (const int bits : {2, 4})
      for (const int k : {64, 256}) {
        FrontierCodec c = cur;
        c.k.bits = c.v.bits = bits;
        c.k.centroids = c.v.centroids = k;
        eval_qvg(c, "ladder", fmt::format("best, bits={} centroids={}", bits, k));
      }
    FrontierCodec r4 = ref;
    r4.k.bits = r4.v.bits = 4;
    eval_qvg(r4, "ladder", "reference, bits=4");
  }

  // Baselines: 2, 3, 4 bits, groups of 32 and 64.
  say("baselines: rtn, kivi, quarot at 2, 3, 4 bits, groups of 32 and 64");
  for (const BaselineMethod m : all_baseline_methods())
    for (const int group : {32, 64})
      for (const int bits : {2, 3, 4}) {
        BaselineConfig b;
        b.bits = bits;
        b.block_size = group;
        b.kivi_group_tokens = group;
        b.validate_for(m, p.head_dim);
        res.points.push_back(ev.baseline(m, b));
        const FrontierPoint& q = res.points.back();
        say(fmt::format("  [{:3}] baseline  bpe {:.3f}  attn {:.5f}  {}", res.points.size() - 1, q.bits_per_element,
                        q.attention.rel_l2(), q.label));
      }
  mark_pareto(res.points);
  const double x = res.points[res.profile].bits_per_element;
  for (const BaselineMethod m : all_baseline_methods())
    for (const int group : {32, 64}) res.curves.push_back(curve_at(res.points, std::string(name(m)), group, x));

  // Throughput of the reference and the profile: best of 3 timings.
  auto eps = [&](size_t i, double& enc, double& dec) {
    double be = std::numeric_limits<double>::infinity(), bd = be;
    for (int t = 0; t < 3; ++t) {
      const FrontierPoint pt = ev.qvg(res.points[i].codec);
      be = std::min(be, pt.encode_s);
      bd = std::min(bd, pt.decode_s);
    }
    enc = be > 0 ? elements / be : 0;
    dec = bd > 0 ? elements / bd : 0;
  };
  eps(res.reference, res.ref_encode_eps, res.ref_decode_eps);
  eps(res.profile, res.hq_encode_eps, res.hq_decode_eps);
  res.wall_s = sim::seconds_since(t_start);
  say(fmt::format("frontier done in {:.1f} s: {} points", res.wall_s, res.points.size()));
  return res;
}

// ---- reports -------------------------------------------------------------------------

namespace {

nlohmann::ordered_json codec_json(const CodecConfig& c) {
  nlohmann::ordered_json j;
  j["bits"] = c.bits;
  j["centroids"] = c.centroids;
  j["stages"] = c.stages;
  j["kmeans_iters"] = c.kmeans_iters;
  j["block_size"] = c.block_size;
  j["asymmetric"] = c.asymmetric;
  j["scale_dtype"] = std::string(name(c.scale_dtype));
  j["scaling"] = std::string(name(c.scaling));
  j["scale_search"] = std::string(name(c.scale_search));
  j["init"] = std::string(name(c.init));
  return j;
}

nlohmann::ordered_json opt_json(std::optional<double> v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

std::string frontier_json(const FrontierResult& r, int indent) {
  nlohmann::ordered_json j;
  j["format"] = "qvg.frontier/1";
  j["workload"] = sim::scored_context_json(r, r.config.model, r.query_stride);
  j["search"] = {{"strategy",
                  "coordinate descent from the reference default: per round, each knob's values with the others "
                  "fixed, keeping the least attention error within the budget; until a round changes nothing"},
                 {"budget_bpe", r.budget_bpe},
                 {"bpe_slack", r.config.bpe_slack},
                 {"max_rounds", r.config.max_rounds},
                 {"codec_seed", r.config.codec_seed},
                 {"trace", r.trace},
                 {"wall_s", r.wall_s}};
  auto pj = [&](size_t i) {
    const FrontierPoint& q = r.points[i];
    nlohmann::ordered_json o;
    o["index"] = i;
    o["method"] = q.method;
    o["label"] = q.label;
    o["stage"] = q.stage;
    o["bits_per_element"] = q.bits_per_element;
    o["attention_rel_l2"] = q.attention.rel_l2();
    o["attention_cosine"] = q.attention.cosine();
    o["k_snr_db"] = opt_json(q.k.snr_db());
    o["v_snr_db"] = opt_json(q.v.snr_db());
    o["pareto"] = q.pareto;
    if (q.method == "qvg") {
      o["config"] = q.codec.describe(true);
      o["k"] = codec_json(q.codec.k);
      o["v"] = codec_json(q.codec.v);
      o["span_chunks"] =
          q.codec.span_chunks == 0 ? nlohmann::ordered_json("all") : nlohmann::ordered_json(q.codec.span_chunks);
      o["encode_s"] = q.encode_s;
      o["decode_s"] = q.decode_s;
    } else {
      o["bits"] = q.baseline.bits;
      o["group"] = q.baseline.block_size;
    }
    return o;
  };
  const FrontierPoint& ref = r.points[r.reference];
  const FrontierPoint& hq = r.points[r.profile];
  nlohmann::ordered_json s;
  s["reference"] = pj(r.reference);
  s["best"] = pj(r.best);
  s["hq"] = pj(r.profile);
  s["hq_vs_reference"] = {{"bpe_delta", hq.bits_per_element - ref.bits_per_element},
                          {"attention_error_ratio", ref.attention.rel_l2() / hq.attention.rel_l2()},
                          {"encode_throughput_ratio", r.ref_encode_eps > 0 ? r.hq_encode_eps / r.ref_encode_eps : 0.0},
                          {"decode_throughput_ratio", r.ref_decode_eps > 0 ? r.hq_decode_eps / r.ref_decode_eps : 0.0},
                          {"reference_encode_elements_per_s", r.ref_encode_eps},
                          {"reference_decode_elements_per_s", r.ref_decode_eps},
                          {"hq_encode_elements_per_s", r.hq_encode_eps},
                          {"hq_decode_elements_per_s", r.hq_decode_eps}};
  nlohmann::ordered_json cv = nlohmann::ordered_json::array();
  for (const FrontierCurveAt& c : r.curves)
    cv.push_back({{"method", c.method},
                  {"group", c.group},
                  {"error_at_hq_bpe", c.error},
                  {"clamped", c.clamped},
                  {"ratio_to_hq", c.error / hq.attention.rel_l2()}});
  s["baseline_curves_at_hq_bpe"] = cv;
  j["summary"] = s;
  nlohmann::ordered_json pts = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.points.size(); ++i) pts.push_back(pj(i));
  j["points"] = pts;
  return j.dump(indent);
}

std::string frontier_text(const FrontierResult& r) {
  const FrontierPoint& ref = r.points[r.reference];
  const FrontierPoint& hq = r.points[r.profile];
  const FrontierPoint& best = r.points[r.best];
  std::string o = fmt::format("frontier of {} (scale {}): {} points, {:.1f} s\n", r.preset.name, r.config.scale,
                              r.points.size(), r.wall_s);
  o += fmt::format("  reference default  bpe {:.3f}  attention rel. error {:.5f}\n", ref.bits_per_element,
                   ref.attention.rel_l2());
  o += fmt::format("  descent result     bpe {:.3f}  attention rel. error {:.5f}  ({})\n", best.bits_per_element,
                   best.attention.rel_l2(), best.codec.describe(true));
  o += fmt::format("  hq profile         bpe {:.3f}  attention rel. error {:.5f}  ({})\n", hq.bits_per_element,
                   hq.attention.rel_l2(), hq.codec.describe(true));
  o += fmt::format(
      "  hq vs reference: {:.2f}x lower error at {:+.3f} bits per element; encode {:.2f}x, decode {:.2f}x "
      "the reference's throughput\n",
      ref.attention.rel_l2() / hq.attention.rel_l2(), hq.bits_per_element - ref.bits_per_element,
      r.ref_encode_eps > 0 ? r.hq_encode_eps / r.ref_encode_eps : 0.0,
      r.ref_decode_eps > 0 ? r.hq_decode_eps / r.ref_decode_eps : 0.0);
  for (const FrontierCurveAt& c : r.curves)
    o += fmt::format("  {:6} g{:<2} at {:.3f} bpe: error {:.5f} = {:.2f}x hq's{}\n", c.method, c.group,
                     hq.bits_per_element, c.error, c.error / hq.attention.rel_l2(),
                     c.clamped ? " (its lowest rate is above hq's: that rate's error)" : "");
  o += "  pareto set:\n";
  std::vector<const FrontierPoint*> par;
  for (const FrontierPoint& q : r.points)
    if (q.pareto) par.push_back(&q);
  std::stable_sort(par.begin(), par.end(), [](const FrontierPoint* a, const FrontierPoint* b) {
    return a->bits_per_element < b->bits_per_element;
  });
  for (const FrontierPoint* qp : par)
    if (const FrontierPoint& q = *qp; q.pareto)
      o += fmt::format("    bpe {:.3f}  attn {:.5f}  {} {}\n", q.bits_per_element, q.attention.rel_l2(), q.method,
                       q.method == "qvg" ? q.codec.describe(true) : q.label);
  for (const std::string& t : r.trace) o += "  " + t + "\n";
  return o;
}

std::string frontier_svg(const FrontierResult& r) {
  const double W = 900, H = 600, L = 80, R = 230, T = 60, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const FrontierPoint& q : r.points) {
    const double e = q.attention.rel_l2();
    if (!(e > 0)) continue;
    x0 = std::min(x0, q.bits_per_element);
    x1 = std::max(x1, q.bits_per_element);
    y0 = std::min(y0, std::log10(e));
    y1 = std::max(y1, std::log10(e));
  }
  if (x1 <= x0) x1 = x0 + 1;
  x0 = std::floor(x0 * 2) / 2;
  x1 = std::ceil(x1 * 2) / 2;
  y0 = std::floor(y0);
  y1 = std::ceil(y1);
  if (y1 <= y0) y1 = y0 + 1;
  auto X = [&](double v) { return L + (v - x0) / (x1 - x0) * pw; };
  auto Y = [&](double e) { return T + (y1 - std::log10(std::max(e, 1e-30))) / (y1 - y0) * ph; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H, W, H);
  s += fmt::format(
      "<text x=\"{}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">Rate-distortion frontier: {} (scale {})</text>\n",
      L, r.preset.name, r.config.scale);
  s += fmt::format(
      "<text x=\"{}\" y=\"42\" fill=\"#555\">{} context tokens, {} layers; coordinate descent from the reference "
      "default, budget {:.2f} bpe</text>\n",
      L, r.context_tokens, r.layers.size(), r.budget_bpe);
  // Grid and ticks.
  s += "<g id=\"axes\" stroke=\"#ccc\">\n";
  for (double t : nice_ticks(x0, x1, 8))
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", X(t), T, T + ph);
  for (int e = int(y0); e <= int(y1); ++e)
    s += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\"/>\n", L, Y(std::pow(10.0, e)), L + pw);
  s += "</g>\n<g id=\"ticks\" fill=\"#333\">\n";
  for (double t : nice_ticks(x0, x1, 8))
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", X(t), T + ph + 16, t);
  for (int e = int(y0); e <= int(y1); ++e)
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", L - 6, Y(std::pow(10.0, e)) + 4,
                     std::pow(10.0, e));
  s += "</g>\n";
  s +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", L, T, pw, ph);
  s += fmt::format(
      "<text id=\"x-label\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">bits per element (everything stored: "
      "codebooks, ids, codes, scales, zeros)</text>\n",
      L + pw / 2, H - 18);
  s += fmt::format(
      "<text id=\"y-label\" x=\"18\" y=\"{:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {:.1f})\">attention "
      "relative L2 error (log scale)</text>\n",
      T + ph / 2, T + ph / 2);
  // Baseline curves.
  const std::map<std::string, std::string> colour = {
      {"qvg", "#1f4e9c"}, {"rtn", "#c0392b"}, {"kivi", "#27ae60"}, {"quarot", "#e67e22"}};
  s += "<g id=\"baselines\">\n";
  for (const std::string m : {"rtn", "kivi", "quarot"})
    for (const int group : {32, 64}) {
      std::vector<std::pair<double, double>> c;
      for (const FrontierPoint& q : r.points)
        if (q.method == m && q.baseline.block_size == group) c.emplace_back(q.bits_per_element, q.attention.rel_l2());
      std::sort(c.begin(), c.end());
      std::string path;
      for (const auto& [bx, by] : c) path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(bx), Y(by));
      s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\"{}/>\n", path, colour.at(m),
                       group == 32 ? " stroke-dasharray=\"4 3\"" : "");
      for (const auto& [bx, by] : c)
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"6\" height=\"6\" fill=\"{}\"/>\n", X(bx) - 3,
                         Y(by) - 3, colour.at(m));
    }
  s += "</g>\n<g id=\"qvg-points\">\n";
  for (const FrontierPoint& q : r.points)
    if (q.method == "qvg")
      s += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#9db4dd\" stroke=\"#1f4e9c\" "
          "stroke-width=\"0.5\"><title>{}: {:.3f} bpe, {:.5f}</title></circle>\n",
          X(q.bits_per_element), Y(q.attention.rel_l2()), q.codec.describe(true), q.bits_per_element,
          q.attention.rel_l2());
  s += "</g>\n";
  // Pareto set: joined as a staircase, each point ringed.
  std::vector<const FrontierPoint*> par;
  for (const FrontierPoint& q : r.points)
    if (q.pareto) par.push_back(&q);
  std::sort(par.begin(), par.end(),
            [](const FrontierPoint* a, const FrontierPoint* b) { return a->bits_per_element < b->bits_per_element; });
  s += "<g id=\"pareto\" class=\"pareto\">\n";
  std::string path;
  for (const FrontierPoint* q : par)
    path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(q->bits_per_element), Y(q->attention.rel_l2()));
  s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#111\" stroke-width=\"2\"/>\n", path);
  for (const FrontierPoint* q : par)
    s += fmt::format(
        "<circle class=\"pareto-point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"none\" stroke=\"#111\" "
        "stroke-width=\"1.5\"/>\n",
        X(q->bits_per_element), Y(q->attention.rel_l2()));
  s += "</g>\n";
  // The reference default and the hq profile, labelled.
  auto mark = [&](const char* id, const FrontierPoint& q, const std::string& text, const char* fill, double dy) {
    const double cx = X(q.bits_per_element), cy = Y(q.attention.rel_l2());
    s += fmt::format("<g id=\"{}\">\n<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"7\" fill=\"{}\" stroke=\"#000\"/>\n", id,
                     cx, cy, fill);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000\"/>\n", cx, cy,
                     cx + 30, cy + dy);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">{} ({:.2f} bpe, {:.4f})</text>\n</g>\n",
                     cx + 33, cy + dy + 4, text, q.bits_per_element, q.attention.rel_l2());
  };
  mark("reference", r.points[r.reference], "reference default", "#f1c40f", -28);
  mark("hq", r.points[r.profile], "hq profile", "#8e44ad", 28);
  // Legend.
  const double lx = L + pw + 16;
  double ly = T + 10;
  s += "<g id=\"legend\">\n";
  auto legend = [&](const std::string& shape, const std::string& text) {
    s += shape;
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", lx + 22, ly + 4, text);
    ly += 20;
  };
  legend(fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"#9db4dd\" stroke=\"#1f4e9c\"/>", lx + 8, ly),
         "qvg configuration");
  legend(fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"none\" stroke=\"#111\" stroke-width=\"1.5\"/>", lx + 8,
                     ly),
         "Pareto set");
  legend(fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"#f1c40f\" stroke=\"#000\"/>", lx + 8, ly),
         "reference default");
  legend(fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"#8e44ad\" stroke=\"#000\"/>", lx + 8, ly),
         "hq profile");
  for (const std::string m : {"rtn", "kivi", "quarot"}) {
    legend(
        fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>", lx, ly, lx + 16, ly, colour.at(m)),
        fmt::format("{} g64 (2, 3, 4 bits)", m));
    legend(fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-dasharray=\"4 3\"/>", lx, ly,
                       lx + 16, ly, colour.at(m)),
           fmt::format("{} g32", m));
  }
  s += "</g>\n</svg>\n";
  return s;
}

void write_frontier_report(const FrontierResult& r, const std::string& dir) {
  write_report_files(dir, {{"frontier.json", frontier_json(r, 2) + "\n"},
                           {"frontier.svg", frontier_svg(r)},
                           {"summary.txt", frontier_text(r)}});
}

// ---- warm start --------------------------------------------------------------------

WarmStartFigures warm_start_figures(const std::string& model, double scale, int layers, int centroids, int64_t chunks,
                                    uint64_t seed, int threads) {
  WorkloadOptions wo;
  wo.scale = scale;
  wo.seed = seed;
  wo.threads = threads;
  const Workload w(find_model_preset(model), wo);
  const ModelPreset& p = w.preset();
  WarmStartFigures f;
  double inertia_r2 = 0, inertia_w2 = 0, inertia_w1 = 0, iters_sum = 0;
  int64_t reached = 0;
  GenerateParts parts;
  parts.k_pre_rope = false;
  parts.q = false;
  const int64_t ct = p.chunk_tokens(), H = p.heads, D = p.head_dim;
  for (int layer : select_layers(p.layers, layers)) {
    const LayerChunk ctx = w.generate_frames(layer, 0, chunks * p.frames_per_chunk, parts);
    for (const Tensor* x : {&ctx.k, &ctx.v}) {
      std::vector<float> all(size_t(x->shape().numel()));
      convert_to_f32(x->data(), x->dtype(), all.data(), all.size());
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> prev;  // the previous span's centroids of this head
        for (int64_t c = 0; c < chunks; ++c) {
          std::vector<float> pts(size_t(ct * D));
          for (int64_t t = 0; t < ct; ++t)
            std::copy_n(all.data() + size_t(((c * ct + t) * H + h) * D), D, pts.data() + t * D);
          detail::KMeansParams kp;
          kp.k = centroids;
          kp.seed = 1234;
          kp.b = 0;
          kp.h = h;
          kp.record_inertia = true;
          kp.iters = 2;
          const detail::KMeansResult rr = detail::kmeans(pts.data(), ct, D, kp);
          // Timed without the inertia record (an fp64 pass per iteration).
          detail::KMeansParams tp = kp;
          tp.record_inertia = false;
          auto t0 = clock_type::now();
          (void)detail::kmeans(pts.data(), ct, D, tp);
          const double rs = sim::seconds_since(t0);
          if (!prev.empty() && int64_t(prev.size()) == int64_t(centroids) * D) {
            const double target = rr.inertia.back();
            detail::KMeansParams wp = kp;
            wp.init = Init::Warm;
            wp.warm = prev.data();
            wp.iters = 8;
            const detail::KMeansResult wr = detail::kmeans(pts.data(), ct, D, wp);
            int need = -1;
            for (size_t i = 0; i < wr.inertia.size(); ++i)
              if (wr.inertia[i] <= target) {
                need = int(i);
                break;
              }
            ++f.groups;
            f.random_s += rs;
            inertia_r2 += target;
            inertia_w1 += wr.inertia[std::min<size_t>(1, wr.inertia.size() - 1)];
            inertia_w2 += wr.inertia[std::min<size_t>(2, wr.inertia.size() - 1)];
            // Warm with random's 2 iterations (equal time), timed.
            detail::KMeansParams w2 = wp;
            w2.iters = 2;
            w2.record_inertia = false;
            t0 = clock_type::now();
            (void)detail::kmeans(pts.data(), ct, D, w2);
            f.warm_s_equal_iters += sim::seconds_since(t0);
            if (need < 0) {
              ++f.warm_never;
            } else {
              f.random_s_reached += rs;
              ++reached;
              iters_sum += need;
              // Time warm k-means with the iterations it needed (0: the initial
              // centroids already do: one assignment pass).
              wp.iters = std::max(1, need);
              wp.record_inertia = false;
              t0 = clock_type::now();
              (void)detail::kmeans(pts.data(), ct, D, wp);
              f.warm_s_to_target += sim::seconds_since(t0);
            }
          }
          // The next span warm-starts from this span's centroids as the cache's chain
          // makes them (init warm, kmeans_iters 2; the first span random).
          if (prev.empty()) {
            prev = rr.centroids;
          } else {
            detail::KMeansParams wp = kp;
            wp.init = Init::Warm;
            wp.warm = prev.data();
            wp.record_inertia = false;
            prev = detail::kmeans(pts.data(), ct, D, wp).centroids;
          }
        }
      }
    }
  }
  f.warm_iters_to_target = reached > 0 ? iters_sum / double(reached) : 0;
  f.inertia_ratio_equal_iters = inertia_r2 > 0 ? inertia_w2 / inertia_r2 : 0;
  f.inertia_ratio_one_iter = inertia_r2 > 0 ? inertia_w1 / inertia_r2 : 0;
  return f;
}

}  // namespace qvg
