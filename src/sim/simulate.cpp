// The streaming simulation (qvg/eval/simulate.h): a dense cache and packed caches fed
// the same workload, chunk by chunk and layer by layer, scored against each other.
#include "qvg/eval/simulate.h"
#include "qvg/eval/error_sums.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <set>

#include <fmt/core.h>

#include "cache/plan_access.h"
#include "core/rng_impl.h"
#include "qvg/attention.h"
#include "qvg/cache.h"
#include "qvg/code_format.h"
#include "qvg/error.h"
#include "qvg/eval/memory.h"
#include "sim/report_util.h"
#include "sim/sim_common.h"

namespace qvg {

// ---------------------------------------------------------------------------
// Error sums

std::optional<double> ErrorSums::rel_mse() const {
  if (tokens == 0 || ref <= 0) return std::nullopt;
  return err / ref;
}

std::optional<double> ErrorSums::snr_db() const {
  const auto r = rel_mse();
  if (!r || *r <= 0) return std::nullopt;
  return -10.0 * std::log10(*r);
}

void AttentionSums::add(const AttentionSums& o) {
  err += o.err;
  ref += o.ref;
  cos_sum += o.cos_sum;
  if (o.vectors > 0) cos_min = vectors > 0 ? std::min(cos_min, o.cos_min) : o.cos_min;
  vectors += o.vectors;
}

double AttentionSums::rel_l2() const {
  return ref > 0 ? std::sqrt(err / ref) : 0.0;
}
double AttentionSums::cosine() const {
  return vectors > 0 ? cos_sum / double(vectors) : 1.0;
}

AttentionSums attention_error(const Tensor& out, const Tensor& ref) {
  if (!(out.shape() == ref.shape()) || out.dtype() != DType::F32 || ref.dtype() != DType::F32)
    throw InvalidArgument(fmt::format("attention_error: outputs must be fp32 of one shape, got {} {} and {} {}",
                                      out.shape().str(), dtype_name(out.dtype()), ref.shape().str(),
                                      dtype_name(ref.dtype())));
  const auto* a = static_cast<const float*>(out.data());
  const auto* b = static_cast<const float*>(ref.data());
  const int64_t D = out.shape().d;
  const int64_t rows = out.shape().b * out.shape().s * out.shape().h;
  AttentionSums s;
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0, na = 0, nb = 0, e = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double x = a[r * D + d], y = b[r * D + d];
      dot += x * y;
      na += x * x;
      nb += y * y;
      e += (x - y) * (x - y);
    }
    double c;
    if (na == 0 && nb == 0)
      c = 1.0;
    else if (na == 0 || nb == 0)
      c = 0.0;
    else
      c = dot / (std::sqrt(na) * std::sqrt(nb));
    s.err += e;
    s.ref += nb;
    s.cos_sum += c;
    s.cos_min = s.vectors == 0 ? c : std::min(s.cos_min, c);
    ++s.vectors;
  }
  return s;
}

// ---------------------------------------------------------------------------
// Configuration

PackedConfig engine_default_packed_config(const ModelPreset& model) {
  PackedConfig p;
  p.label = "engine";
  p.quant = model.policy_defaults();
  p.quant.apply_profile("reference");  // and int2: a profile sets bits (2) when they are unset
  return p;
}

PackedConfig default_packed_config() {
  PackedConfig p;
  p.label = "int2";
  // As the engine's flags of the published run (the settings table reads them).
  p.quant = QuantArgs::from_flags({{"kv_cache_quant", "int2"},
                                   {"kv_cache_quant_centroids", "256"},
                                   {"kv_cache_quant_block_size", "64"},
                                   {"kv_cache_quant_stages", "1"},
                                   {"kv_cache_quant_iters", "2"},
                                   {"kv_cache_quant_span_chunks", "8"}});
  return p;
}

namespace {

/// The unscaled preset with the context override applied.
ModelPreset base_preset(const std::string& model, std::optional<int64_t> context_frames) {
  ModelPreset p = find_model_preset(model);
  if (context_frames) {
    p.context_frames = int(*context_frames);
    p.sink_frames = std::min(p.sink_frames, p.context_frames);
  }
  p.validate();
  return p;
}

void need(bool ok, std::string_view field, const std::string& value, std::string_view allowed) {
  if (!ok) throw InvalidArgument(fmt::format("{} must be {}, got {}", field, allowed, value));
}

}  // namespace

std::vector<int> select_layers(int total, int count) {
  if (total < 1) throw InvalidArgument(fmt::format("layer total must be >= 1, got {}", total));
  if (count < 1 || count > total)
    throw InvalidArgument(fmt::format("layers must be in 1..{} (the model's layers), got {}", total, count));
  std::vector<int> v;
  for (int i = 0; i < count; ++i)
    v.push_back(static_cast<int>(std::floor((double(i) + 0.5) * double(total) / double(count))));
  return v;
}

ModelPreset simulation_preset(const SimulationConfig& cfg) {
  return base_preset(cfg.model, cfg.context_frames).scaled(cfg.scale);
}

void SimulationConfig::validate() const {
  find_model_preset(model);  // names the presets on error
  need(scale > 0 && scale <= 1, "scale", fmt::format("{}", scale), "in (0, 1]");
  if (context_frames)
    need(*context_frames >= 1 && *context_frames <= 100000, "context_frames", std::to_string(*context_frames),
         "in 1..100000");
  need(chunks >= 1 && chunks <= 100000, "chunks", std::to_string(chunks), "in 1..100000");
  need(steps >= 1 && steps <= 64, "steps", std::to_string(steps), "in 1..64");
  need(step_noise >= 0 && step_noise <= 1, "step_noise", fmt::format("{}", step_noise), "in [0, 1]");
  need(query_stride >= 1, "query_stride", std::to_string(query_stride), ">= 1");
  check_threads("threads", threads);
  const ModelPreset p = simulation_preset(*this);
  need(layers >= 1 && layers <= p.layers, "layers", std::to_string(layers),
       fmt::format("in 1..{} (the layers of {} at scale {})", p.layers, p.name, scale));
  need(!packed.empty(), "packed configurations", "none", "at least one");
  std::set<std::string> labels;
  for (const PackedConfig& c : packed) {
    need(!c.label.empty(), "packed configuration label", "''", "non-empty");
    need(labels.insert(c.label).second, "packed configuration labels", "'" + c.label + "' twice", "unique");
    need(c.quant.enabled(), fmt::format("packed configuration '{}': bits", c.label), "none", known_code_widths());
    try {
      c.quant.validate_for_head_dim(p.head_dim);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("packed configuration '{}': {}", c.label, e.what()));
    }
  }
}

// ---------------------------------------------------------------------------
// The streaming loop: simulate() runs simulate_chunk() per chunk, which runs
// simulate_layer() per layer: make_step(), advance(), denoising_step() per step
// (scoring with score_encoded() at the last), record_resident().

namespace {

using Clock = std::chrono::steady_clock;

/// x + a * rms(x) * N(0, 1), the noise a pure function of (key, element index);
/// the result is rounded to x's dtype. a == 0 returns a copy.
Tensor perturbed(const Tensor& x, double a, uint64_t key) {
  Tensor out(x.dtype(), x.shape());
  const size_t n = size_t(x.shape().numel());
  if (a == 0 || n == 0) {
    std::memcpy(out.data(), x.data(), x.nbytes());
    return out;
  }
  std::vector<float> f(n);
  convert_to_f32(x.data(), x.dtype(), f.data(), n);
  double ss = 0;
  for (float v : f) ss += double(v) * double(v);
  const double amp = a * std::sqrt(ss / double(n));
  const int64_t pairs = int64_t((n + 1) / 2);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pairs; ++i) {
    const uint64_t h1 = rng_impl::mix64(key ^ rng_impl::mix64(uint64_t(i)));
    const uint64_t h2 = rng_impl::mix64(h1);
    const double u1 = (double(h1 >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = double(h2 >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
    const size_t j = size_t(2 * i);
    f[j] = static_cast<float>(double(f[j]) + amp * r * std::cos(th));
    if (j + 1 < n) f[j + 1] = static_cast<float>(double(f[j + 1]) + amp * r * std::sin(th));
  }
  convert_from_f32(f.data(), x.dtype(), out.data(), n);
  return out;
}

/// Which global token ranges the packed cache holds encoded, oldest first.
struct EncodedInfo {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t tokens = 0;
  size_t bytes = 0;
  int spans = 0;
};
EncodedInfo encoded_info(const PackedCausalCache& c) {
  EncodedInfo e;
  int64_t last_span = -1;
  for (size_t i = 0; i < c.num_segments(); ++i) {
    const auto s = c.segment(i);
    if (!s.packed) continue;
    e.ranges.emplace_back(s.g0, s.g1);
    e.tokens += s.g1 - s.g0;
    e.bytes += s.nbytes;
    if (s.span >= 0 && s.span != last_span)  // an incremental span's codebooks, once
      e.bytes += s.k_codebook->nbytes() + s.v_codebook->nbytes();
    if (s.span < 0 || s.span != last_span) ++e.spans;
    last_span = s.span;
  }
  return e;
}

/// Error of view `got` against view `want` (same [1, T, H, D], both showing the
/// ranges `w`) over the view rows that hold encoded tokens, added to `out`.
/// Deterministic: per-row partial sums, summed in order.
void encoded_view_error(const StridedView& want, const StridedView& got, const EncodedInfo& enc, const WindowRanges& w,
                        ErrorSums& out, int threads) {
  const int64_t T = want.shape.s, H = want.shape.h, D = want.shape.d;
  std::vector<int64_t> rows;  // view rows of encoded tokens
  for (const auto& [g0, g1] : enc.ranges)
    for (int64_t g = g0; g < std::min(g1, w.global_end); ++g) {
      const int64_t t = w.view_row(g);
      if (t >= 0) rows.push_back(t);
    }
  if (rows.empty()) return;
  std::vector<double> err(rows.size()), ref(rows.size());
  const int nt = resolve_threads(threads);
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> a(static_cast<size_t>(D)), b(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
      const int64_t t = rows[size_t(i)];
      QVG_CHECK(t < T);
      double e = 0, r = 0;
      for (int64_t h = 0; h < H; ++h) {
        convert_to_f32(want.row(0, t, h), want.dtype, a.data(), size_t(D));
        convert_to_f32(got.row(0, t, h), got.dtype, b.data(), size_t(D));
        for (int64_t d = 0; d < D; ++d) {
          const double x = a[size_t(d)], y = b[size_t(d)];
          e += (x - y) * (x - y);
          r += x * x;
        }
      }
      err[size_t(i)] = e;
      ref[size_t(i)] = r;
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    out.err += err[i];
    out.ref += ref[i];
  }
  out.tokens += int64_t(rows.size());
}

/// One simulated layer: its dense cache, one packed cache per configuration, and the
/// memory model's replay of each packed cache. The packed caches of one configuration
/// share one ViewScratch across the layers (Model::views).
struct LayerState {
  int layer = 0;
  std::unique_ptr<DenseCausalCache> dense;
  std::vector<std::unique_ptr<PackedCausalCache>> packed;
  std::vector<std::unique_ptr<PolicyReplay>> replay;  // null when the memory model rejects the shapes
  /// Per configuration: whether each incremental chunk the last advance encoded joined
  /// its open span (the cache's adaptive decisions, replayed by the memory model).
  std::vector<std::deque<bool>> joins;
};

/// The simulated layers and, per packed configuration, the view scratch their caches
/// share (held here too, as qvg.torch's binding holds its shared scratch: a scratch
/// shared this way is kept between calls, never released by an encoding advance).
struct Model {
  std::vector<LayerState> layers;
  std::vector<std::shared_ptr<ViewScratch>> views;  // one per configuration

  /// Configuration j's bytes at this instant: every simulated layer's resident bytes
  /// plus the shared view scratch.
  size_t held_bytes(size_t j) const {
    size_t n = views[j]->size();
    for (const LayerState& st : layers) n += st.packed[j]->resident_nbytes();
    return n;
  }
};

/// Bytes a view holds outside the cache's resident storage: K and V of a copied view
/// (the scratch), 0 for a zero-copy view.
size_t copied_view_bytes(const KVView& v) {
  if (v.zero_copy) return 0;
  const Shape4& s = v.k.shape;
  return 2 * size_t(s.b * s.s * s.h * s.d) * dtype_size(v.k.dtype);
}

/// After a call of configuration j on one layer: the call's view bytes and the model's
/// bytes at this instant, into `pr` (the most over the chunk's calls).
void record_instant(const Model& m, size_t j, const KVView& v, PackedLayerRecord& pr) {
  pr.view_bytes = std::max(pr.view_bytes, copied_view_bytes(v));
  pr.model_bytes = std::max(pr.model_bytes, m.held_bytes(j));
}

/// Empty caches (bf16, batch 1, window = the scaled preset's cache) for each of `layers`;
/// the packed caches of configuration j share views[j].
std::vector<LayerState> build_layer_states(const SimulationConfig& cfg, const ModelPreset& p,
                                           const std::vector<int>& layers,
                                           const std::vector<std::shared_ptr<ViewScratch>>& views) {
  // One layer's shapes (not validated here: the memory model may refuse them, below).
  MemoryShape ms;
  ms.layers = 1;
  ms.heads = p.heads;
  ms.head_dim = p.head_dim;
  ms.chunk_tokens = p.chunk_tokens();
  ms.context_tokens = p.context_tokens();
  ms.sink_tokens = p.sink_tokens();
  ms.dtype = DType::BF16;
  const CacheOptions co = ms.cache_options();

  std::vector<LayerState> states;
  for (int layer : layers) {
    LayerState st;
    st.layer = layer;
    st.dense = std::make_unique<DenseCausalCache>(co);
    for (size_t j = 0; j < cfg.packed.size(); ++j) {
      QuantArgs q = cfg.packed[j].quant;
      if (cfg.threads > 0 && q.codec.threads == 0) q.codec.threads = cfg.threads;
      CacheOptions shared = co;
      shared.view_scratch = views[j];
      st.packed.push_back(std::make_unique<PackedCausalCache>(shared, q));
      std::unique_ptr<PolicyReplay> r;
      try {
        r = std::make_unique<PolicyReplay>(ms, q);
      } catch (const InvalidArgument&) {
        r.reset();  // the memory model does not cover these shapes: no prediction
      }
      st.replay.push_back(std::move(r));
      st.joins.emplace_back();
    }
    states.push_back(std::move(st));
  }
  return states;
}

/// One denoising step's K, V and subsampled Q.
struct StepTensors {
  Tensor k, v, qsub;
};

/// Step s of chunk ci on `layer`: the chunk `lc` plus noise of relative size
/// step_noise * (steps-1-s) / steps (the last step is the clean chunk); the time
/// taken is added to `generate_s`.
StepTensors make_step(const SimulationConfig& cfg, const LayerChunk& lc, int layer, int64_t ci, int s,
                      double& generate_s) {
  const auto t0 = Clock::now();
  const double a = cfg.step_noise * double(cfg.steps - 1 - s) / double(cfg.steps);
  const uint64_t key = rng_impl::mix64(cfg.seed ^ rng_impl::mix64(uint64_t(layer) * 1000003u + uint64_t(ci))) ^
                       rng_impl::mix64(uint64_t(s) + 0x51ED);
  StepTensors t;
  t.k = perturbed(lc.k, a, key ^ 1);
  t.v = perturbed(lc.v, a, key ^ 2);
  t.qsub = sim::subsample_tokens(perturbed(lc.q, a, key ^ 3).view(), cfg.query_stride);
  generate_s += sim::seconds_since(t0);
  return t;
}

/// The advance (rw = 0) of every cache of `st` with step 0 of the chunk starting at
/// c: pack-and-evict without decoding the history. Records into `lr` the dense
/// update time, each packed cache's encode time, spans encoded and transient peak.
/// Returns the packed caches' full-window ranges at the new global_end (the same
/// for every configuration: one cache geometry).
WindowRanges advance(const Model& m, LayerState& st, const StepTensors& step0, int64_t c, LayerRecord& lr) {
  auto t0 = Clock::now();
  st.dense->update(step0.k.view(), step0.v.view(), c, std::nullopt, int64_t(0));
  lr.dense_update_s += sim::seconds_since(t0);
  lr.dense_transient_peak_bytes = st.dense->peak_transient_nbytes();
  for (size_t j = 0; j < st.packed.size(); ++j) {
    PackedCausalCache& pk = *st.packed[j];
    t0 = Clock::now();
    const KVView v = pk.update(step0.k.view(), step0.v.view(), c, std::nullopt, int64_t(0));
    lr.packed[j].encode_s = sim::seconds_since(t0);
    lr.packed[j].transient_peak_bytes = pk.peak_transient_nbytes();
    record_instant(m, j, v, lr.packed[j]);
    // What the advance's plan encoded: whole spans, and incremental chunks that
    // joined the open span or started one (their decisions go to the memory model).
    const detail::PackOutcome& done = detail::PlanAccess::last_advance(pk);
    for (const detail::EncodeStep& e : done.encodes) {
      lr.packed[j].spans_encoded += !e.incremental;
      lr.packed[j].chunks_encoded += e.chunks;
    }
    for (const detail::ChunkDecision& d : done.decisions) {
      st.joins[j].push_back(d.joined);
      lr.packed[j].spans_encoded += !d.joined;
    }
    lr.packed[j].span_breaks = pk.span_breaks();
  }
  const WindowRanges w = st.packed.front()->window_ranges();
  for (const auto& pk : st.packed) QVG_CHECK(pk->window_ranges() == w);
  return w;
}

/// Scores the encoded tokens of packed view `pv` (of cache `pk`) against the dense
/// view `dv`, both showing the ranges `w`, into `pr` (K and V errors, encoded sizes).
void score_encoded(const PackedCausalCache& pk, const KVView& dv, const KVView& pv, const WindowRanges& w, int threads,
                   PackedLayerRecord& pr) {
  QVG_CHECK(w.tokens() == dv.k.shape.s);
  const EncodedInfo enc = encoded_info(pk);
  pr.encoded_tokens = enc.tokens;
  pr.encoded_bytes = enc.bytes;
  ErrorSums ek, ev;
  encoded_view_error(dv.k, pv.k, enc, w, ek, threads);
  encoded_view_error(dv.v, pv.v, enc, w, ev, threads);
  pr.k = ek;
  pr.v = ev;
  pr.encoded_visible = ek.tokens;
}

/// One denoising step (a rewrite of the chunk starting at c with `t`) on every cache
/// of `st`, each returning its full view (ranges `w`). With `score`, the reference
/// attention of t.qsub over the dense view and over each packed view; on the `last`
/// step, score_encoded(). Times, peaks and errors go into `lr`.
void denoising_step(const SimulationConfig& cfg, const Model& m, LayerState& st, const StepTensors& t, int64_t c,
                    const WindowRanges& w, bool score, bool last, LayerRecord& lr) {
  auto t0 = Clock::now();
  const KVView dv = st.dense->update(t.k.view(), t.v.view(), c);
  lr.dense_update_s += sim::seconds_since(t0);
  lr.dense_transient_peak_bytes = std::max(lr.dense_transient_peak_bytes, st.dense->peak_transient_nbytes());
  lr.window_tokens = dv.k.shape.s;

  Tensor ref;
  if (score) {
    t0 = Clock::now();
    ref = attention(t.qsub.view(), dv, cfg.threads);
    lr.dense_attention_s += sim::seconds_since(t0);
  }
  for (size_t j = 0; j < st.packed.size(); ++j) {
    PackedCausalCache& pk = *st.packed[j];
    PackedLayerRecord& pr = lr.packed[j];
    t0 = Clock::now();
    const KVView pv = pk.update(t.k.view(), t.v.view(), c);
    pr.decode_s += sim::seconds_since(t0);
    pr.transient_peak_bytes = std::max(pr.transient_peak_bytes, pk.peak_transient_nbytes());
    record_instant(m, j, pv, pr);
    // Both caches are built from the same validated preset, so their views always
    // show the same tokens: a difference is a bug (an invariant), not a user error.
    QVG_CHECK(pv.k.shape.s == dv.k.shape.s);
    if (score) {
      t0 = Clock::now();
      const Tensor out = attention(t.qsub.view(), pv, cfg.threads);
      pr.attention_s += sim::seconds_since(t0);
      pr.attention.add(attention_error(out, ref));
    }
    if (last) score_encoded(pk, dv, pv, w, cfg.threads, pr);
  }
}

/// The resident bytes of every cache of `st` after the chunk, and the memory
/// model's prediction for it (advances each replay by one chunk), into `lr`.
void record_resident(LayerState& st, LayerRecord& lr) {
  lr.dense_resident_bytes = st.dense->resident_nbytes();
  for (size_t j = 0; j < st.packed.size(); ++j) {
    PackedLayerRecord& pr = lr.packed[j];
    pr.resident_bytes = st.packed[j]->resident_nbytes();
    std::deque<bool>& joins = st.joins[j];
    if (st.replay[j]) {
      const auto decide = [&joins] {  // the cache's decision for the next incremental chunk
        QVG_CHECK(!joins.empty());
        const bool joined = joins.front();
        joins.pop_front();
        return joined;
      };
      pr.predicted_resident_bytes = st.replay[j]->advance(decide).resident_bytes;
    }
    joins.clear();
  }
}

/// Layer `st` during chunk `rec.chunk`: generation (into the reused buffer `lc`),
/// the advance, the denoising steps and the records. Appends the layer's record to
/// rec.layers and sets rec.window_tokens and rec.queries.
void simulate_layer(const SimulationConfig& cfg, const Workload& workload, const Model& m, LayerState& st,
                    LayerChunk& lc, ChunkRecord& rec) {
  const int64_t ci = rec.chunk.index, c = rec.chunk.token0;
  LayerRecord lr;
  lr.layer = st.layer;
  lr.packed.resize(cfg.packed.size());

  const auto t0 = Clock::now();
  GenerateParts parts;
  parts.k_pre_rope = false;
  parts.q = true;
  workload.generate_into(st.layer, ci, lc, parts);
  lr.generate_s += sim::seconds_since(t0);

  StepTensors step0 = make_step(cfg, lc, st.layer, ci, 0, lr.generate_s);
  const WindowRanges w = advance(m, st, step0, c, lr);
  rec.window_tokens = w.tokens();
  for (int s = 0; s < cfg.steps; ++s) {
    const bool last = s + 1 == cfg.steps;
    const StepTensors cur = s == 0 ? std::move(step0) : make_step(cfg, lc, st.layer, ci, s, lr.generate_s);
    rec.queries = cur.qsub.shape().s;
    denoising_step(cfg, m, st, cur, c, w, last || cfg.attention_every_step, last, lr);
  }
  record_resident(st, lr);
  rec.layers.push_back(std::move(lr));
}

/// Calls `progress` (when set): `chunk` chunks of cfg.chunks done, and `layer` of
/// `layers` layers of the next; `last` is the chunk just finished (layer == 0) or null.
void report_progress(const ProgressFn& progress, const SimulationConfig& cfg, int64_t chunk, int layer, int layers,
                     Clock::time_point t_start, const ChunkRecord* last) {
  if (!progress) return;
  SimulationProgress pg;
  pg.chunk = chunk;
  pg.chunks = cfg.chunks;
  pg.layer = layer;
  pg.layers = layers;
  pg.elapsed_s = sim::seconds_since(t_start);
  pg.last = last;
  progress(pg);
}

/// Chunk ci through every layer of `states` (progress after each layer but the
/// last); the record's wall_s is the whole chunk's time.
ChunkRecord simulate_chunk(const SimulationConfig& cfg, const Workload& workload, Model& m, int64_t ci, LayerChunk& lc,
                           const ProgressFn& progress, Clock::time_point t_start) {
  const auto t_chunk = Clock::now();
  ChunkRecord rec;
  rec.chunk = workload.chunk(ci);
  rec.global_end = rec.chunk.token0 + rec.chunk.tokens;
  std::vector<LayerState>& states = m.layers;
  for (size_t li = 0; li < states.size(); ++li) {
    simulate_layer(cfg, workload, m, states[li], lc, rec);
    if (li + 1 < states.size()) report_progress(progress, cfg, ci, int(li + 1), int(states.size()), t_start, nullptr);
  }
  rec.wall_s = sim::seconds_since(t_chunk);
  return rec;
}

}  // namespace

SimulationResult simulate(const SimulationConfig& cfg, const ProgressFn& progress) {
  cfg.validate();
  const auto t_start = Clock::now();

  WorkloadOptions wo;
  wo.scale = cfg.scale;
  wo.seed = cfg.seed;
  wo.dtype = DType::BF16;
  wo.threads = cfg.threads;
  const Workload workload(base_preset(cfg.model, cfg.context_frames), wo);

  SimulationResult res;
  res.config = cfg;
  res.preset = workload.preset();
  res.layers = select_layers(res.preset.layers, cfg.layers);
  Model m;
  for (size_t j = 0; j < cfg.packed.size(); ++j) m.views.push_back(std::make_shared<ViewScratch>());
  m.layers = build_layer_states(cfg, res.preset, res.layers, m.views);
  const int64_t window = m.layers.front().packed.front()->attention_window_size();

  LayerChunk lc;
  for (int64_t ci = 0; ci < cfg.chunks; ++ci) {
    res.chunks.push_back(simulate_chunk(cfg, workload, m, ci, lc, progress, t_start));
    const ChunkRecord& rec = res.chunks.back();
    if (res.window_full_chunk < 0 && rec.window_tokens >= window) res.window_full_chunk = ci;
    report_progress(progress, cfg, ci + 1, 0, int(m.layers.size()), t_start, &rec);
  }
  res.wall_s = sim::seconds_since(t_start);
  summarize(res);
  return res;
}

// ---------------------------------------------------------------------------
// Summary

namespace {

/// The model-level figures of configuration j (PackedSummary, "the model level").
void summarize_model_level(const SimulationResult& r, size_t j, PackedSummary& s) {
  const size_t n_model = size_t(std::max(1, r.preset.layers));
  std::vector<size_t> prev;  // each simulated layer's predicted resident bytes after the previous chunk
  bool predicted = true;
  // The shared view buffer as the caches size it: grown to the largest view so far by
  // ViewScratch::grown_size (bf16, batch 1, the window of K and V its limit).
  const size_t limit =
      2 * size_t(r.preset.cache_tokens() * r.preset.heads * r.preset.head_dim) * dtype_size(DType::BF16);
  size_t buffer = 0;
  for (const ChunkRecord& c : r.chunks) {
    if (c.layers.empty()) continue;
    const PackedLayerRecord a = sim::pooled(c, j);  // the largest view and model bytes, the mean resident
    s.view_bytes = std::max(s.view_bytes, a.view_bytes);
    s.measured_model_peak_bytes = std::max(s.measured_model_peak_bytes, a.model_bytes);
    s.model_peak_bytes = std::max(s.model_peak_bytes, n_model * a.resident_bytes + a.view_bytes);
    predicted = predicted && a.predicted_resident_bytes.has_value();
    if (!predicted) continue;
    // The layers are called in order: while layer i runs its calls, the layers before
    // it hold this chunk's state and those after it the previous chunk's.
    if (prev.empty()) prev.assign(c.layers.size(), 0);
    for (size_t i = 0; i < c.layers.size(); ++i) {
      prev[i] = *c.layers[i].packed[j].predicted_resident_bytes;
      const size_t need = c.layers[i].packed[j].view_bytes;
      if (need > buffer) buffer = ViewScratch::grown_size(buffer, need, limit);
      size_t held = buffer;
      for (const size_t b : prev) held += b;
      s.predicted_model_peak_bytes = std::max(s.predicted_model_peak_bytes, held);
    }
  }
  if (!predicted) s.predicted_model_peak_bytes = 0;
  s.model_peak_matches = predicted && s.predicted_model_peak_bytes == s.measured_model_peak_bytes;
  s.model_dense_bytes = n_model * s.dense_bytes;
  s.ratio_model_peak = s.model_peak_bytes > 0 ? double(s.model_dense_bytes) / double(s.model_peak_bytes) : 0;
}

/// Time per denoising step of configuration j (PackedSummary::step_s) and the chunk of
/// its first encoding.
void summarize_step_time(const SimulationResult& r, size_t j, PackedSummary& s) {
  const int64_t first_full = r.window_full_chunk >= 0 ? r.window_full_chunk : 0;
  double t = 0;
  int64_t n = 0;
  for (const ChunkRecord& c : r.chunks)
    for (const LayerRecord& l : c.layers) {
      const PackedLayerRecord& p = l.packed[j];
      if (s.first_encoded_chunk < 0 && p.chunks_encoded > 0) s.first_encoded_chunk = c.chunk.index;
      if (c.chunk.index < first_full) continue;
      t += p.encode_s + p.decode_s;
      ++n;
    }
  s.step_s = n > 0 ? t / double(n) / double(std::max(1, r.config.steps)) : 0;
}

}  // namespace

void summarize(SimulationResult& r) {
  r.summary.clear();
  const size_t ncfg = r.config.packed.size();
  const int64_t first_full = r.window_full_chunk >= 0 ? r.window_full_chunk : 0;
  for (size_t j = 0; j < ncfg; ++j) {
    PackedSummary s;
    s.label = r.config.packed[j].label;
    s.memory_model_matches = true;
    double packed_full_sum = 0;
    int64_t full_n = 0, step_calls = 0, enc_chunks_spans = 0, enc_chunks = 0;
    double enc_time_spans = 0, enc_time_chunks = 0, dec_time = 0, att_time = 0;
    int64_t layer_chunks = 0;
    for (const ChunkRecord& c : r.chunks) {
      if (c.layers.empty()) continue;
      AttentionSums chunk_att;
      bool quality = false;
      for (const LayerRecord& l : c.layers) {
        const PackedLayerRecord& p = l.packed[j];
        s.dense_bytes = std::max(s.dense_bytes, l.dense_resident_bytes);
        s.packed_peak_bytes = std::max(s.packed_peak_bytes, p.resident_bytes);
        s.transient_peak_bytes = std::max(s.transient_peak_bytes, p.transient_peak_bytes);
        if (!p.predicted_resident_bytes || *p.predicted_resident_bytes != p.resident_bytes)
          s.memory_model_matches = false;
        if (p.encoded_visible > 0) {
          quality = true;
          s.k.add(p.k);
          s.v.add(p.v);
          s.attention.add(p.attention);
          chunk_att.add(p.attention);
        }
        if (p.spans_encoded > 0) {
          enc_time_spans += p.encode_s;
          enc_chunks_spans += p.spans_encoded;
        }
        if (p.chunks_encoded > 0) {
          enc_time_chunks += p.encode_s;
          enc_chunks += p.chunks_encoded;
        }
        dec_time += p.decode_s;
        step_calls += r.config.steps;
        att_time += p.attention_s;
        ++layer_chunks;
      }
      if (quality) {
        ++s.quality_chunks;
        s.worst_attention_rel_l2 = std::max(s.worst_attention_rel_l2, chunk_att.rel_l2());
      }
      if (c.chunk.index >= first_full) {
        packed_full_sum += double(c.layers.front().packed[j].resident_bytes);
        ++full_n;
      }
    }
    if (!r.chunks.empty() && !r.chunks.back().layers.empty()) {
      const PackedLayerRecord& last = r.chunks.back().layers.front().packed[j];
      s.packed_last_bytes = last.resident_bytes;
      int64_t breaks = 0;
      for (const LayerRecord& l : r.chunks.back().layers) breaks += l.packed[j].span_breaks;
      s.span_breaks = int64_t(std::llround(double(breaks) / double(r.chunks.back().layers.size())));
      if (last.encoded_tokens > 0) {
        const double elems = 2.0 * double(last.encoded_tokens) * double(r.preset.heads) * double(r.preset.head_dim);
        s.bits_per_element = double(last.encoded_bytes) * 8.0 / elems;
      }
    }
    s.packed_mean_full_bytes = full_n > 0 ? size_t(std::llround(packed_full_sum / double(full_n))) : 0;
    s.ratio_peak = s.packed_peak_bytes > 0 ? double(s.dense_bytes) / double(s.packed_peak_bytes) : 0;
    s.ratio_full = s.packed_mean_full_bytes > 0 ? double(s.dense_bytes) / double(s.packed_mean_full_bytes) : 0;
    const double nl = double(std::max<size_t>(1, r.layers.size()));
    s.spans = int64_t(std::llround(double(enc_chunks_spans) / nl));
    s.encode_s_per_span = enc_chunks_spans > 0 ? enc_time_spans / double(enc_chunks_spans) : 0;
    s.encode_s_per_chunk = enc_chunks > 0 ? enc_time_chunks / double(enc_chunks) : 0;
    s.decode_s_per_step = step_calls > 0 ? dec_time / double(step_calls) : 0;
    s.attention_s_per_chunk = layer_chunks > 0 ? att_time / double(layer_chunks) : 0;

    // The full-size model with this run's context and configuration.
    try {
      const ModelPreset& full = find_model_preset(r.config.model);  // its own context
      const MemoryReport mr = memory_report(MemoryShape::of(full), r.config.packed[j].quant);
      s.full_dense_bytes = mr.dense_window_bytes;
      s.full_policy_peak_bytes = mr.policy_peak_bytes;
      s.full_layers = full.layers;
      s.full_model_dense_bytes = mr.dense_model_bytes();
      s.full_model_peak_bytes = mr.model_peak_bytes(ViewMemory::Shared);
      s.full_ratio_model_peak = mr.model_peak_ratio(ViewMemory::Shared);
    } catch (const InvalidArgument&) {
      s.full_layers = 0;  // not covered by the memory model: left out of the report
    }
    summarize_model_level(r, j, s);
    summarize_step_time(r, j, s);
    r.summary.push_back(std::move(s));
  }
}

}  // namespace qvg
