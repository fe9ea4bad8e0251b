#include "support/cache_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/core.h>

namespace qvg::testing {

bool small_scale() {
  const char* s = std::getenv("QVG_TEST_SCALE");
  return s != nullptr && std::string_view(s) == "small";
}
int scaled(int full, int small) { return small_scale() ? small : full; }

namespace {

bool values_ok(const Tensor& t) {
  for (float x : t.to_f32())
    if (!std::isfinite(x) || std::fabs(double(x)) > 1e16) return false;
  return true;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

// ---- DenseModel ---------------------------------------------------------------
DenseModel::DenseModel(const CacheOptions& o) : o_(o), cap_(o.cache_size), window_(o.window()) {
  const size_t tok = size_t(o.batch * o.heads * o.head_dim);
  kslots_.assign(size_t(cap_), std::vector<float>(tok, 0.0f));
  vslots_.assign(size_t(cap_), std::vector<float>(tok, 0.0f));
}

size_t DenseModel::resident_nbytes() const {
  return 2 * size_t(o_.batch * cap_ * o_.heads * o_.head_dim) * dtype_size(o_.dtype);
}

std::optional<ErrorKind> DenseModel::check(const Call& call) const {
  const int64_t n = call.n(), c = call.c, ce = c + n, sink = o_.sink_tokens;
  if (!o_.allow_growth && n > cap_) return ErrorKind::OutOfRange;  // longer than the cache
  int64_t window_after = window_;
  if (ce <= ge_) {  // rewrite
    const int64_t shift = ge_ - le_;
    const int64_t local = c - shift;
    if (local < 0) return ErrorKind::OutOfRange;                                   // evicted
    if (shift > 0 && local < std::min(sink, le_)) return ErrorKind::OutOfRange;    // evicted (sink slots)
  } else {  // advance
    const int64_t appended = ce - ge_;
    if (le_ + appended > cap_) {
      if (o_.allow_growth) {
        const int64_t grown = std::max(le_ + appended, 2 * cap_);
        if (window_ == cap_) window_after = grown;
      } else if (cap_ - n < std::min(sink, le_)) {
        return ErrorKind::OutOfRange;  // would overwrite sink tokens
      }
    }
  }
  if (n > window_after) return ErrorKind::OutOfRange;  // not entirely visible
  if (!values_ok(call.k) || !values_ok(call.v)) return ErrorKind::InvalidArgument;
  return std::nullopt;
}

ModelView DenseModel::apply(const Call& call) {
  const int64_t n = call.n(), c = call.c, ce = c + n, sink = o_.sink_tokens;
  const int64_t H = o_.heads, D = o_.head_dim, B = o_.batch, hs = call.head0(), hin = call.h_in();
  int64_t local_start;
  if (ce <= ge_) {
    local_start = c - (ge_ - le_);
  } else {
    const int64_t appended = ce - ge_;
    int64_t end;
    if (le_ + appended > cap_) {
      if (o_.allow_growth) {
        const int64_t grown = std::max(le_ + appended, 2 * cap_);
        if (window_ == cap_) window_ = grown;
        cap_ = grown;
        kslots_.resize(size_t(cap_), std::vector<float>(kslots_[0].size(), 0.0f));
        vslots_.resize(size_t(cap_), std::vector<float>(vslots_[0].size(), 0.0f));
        end = le_ + appended;
      } else {
        const int64_t evicted = le_ + appended - cap_;
        const int64_t rolled = std::max<int64_t>(0, le_ - evicted - sink);
        for (int64_t i = 0; i < rolled; ++i) {  // forward: source index > destination index
          kslots_[size_t(sink + i)] = kslots_[size_t(sink + evicted + i)];
          vslots_[size_t(sink + i)] = vslots_[size_t(sink + evicted + i)];
        }
        end = cap_;
      }
    } else {
      end = le_ + appended;
    }
    local_start = end - n;
    ge_ = ce;
    le_ = end;
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < hin; ++h)
        for (int64_t d = 0; d < D; ++d) {
          kslots_[size_t(local_start + t)][size_t((b * H + hs + h) * D + d)] = call.k.at(b, t, h, d);
          vslots_[size_t(local_start + t)][size_t((b * H + hs + h) * D + d)] = call.v.at(b, t, h, d);
        }
  std::vector<int64_t> idx;
  if (!call.rw) {
    for (int64_t i = std::max<int64_t>(0, le_ - window_); i < le_; ++i) idx.push_back(i);
  } else {
    const int64_t sink_end = std::min(sink, le_);
    const int64_t start = std::max(sink_end, local_start - *call.rw);
    if (start <= sink_end) {
      for (int64_t i = 0; i < le_; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < sink_end; ++i) idx.push_back(i);
      for (int64_t i = start; i < le_; ++i) idx.push_back(i);
    }
  }
  ModelView mv;
  const int64_t T = int64_t(idx.size());
  mv.shape = {B, T, hin, D};
  mv.k.resize(size_t(B * T * hin * D));
  mv.v.resize(mv.k.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < hin; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t o = size_t(((b * T + t) * hin + h) * D + d);
          mv.k[o] = kslots_[size_t(idx[size_t(t)])][size_t((b * H + hs + h) * D + d)];
          mv.v[o] = vslots_[size_t(idx[size_t(t)])][size_t((b * H + hs + h) * D + d)];
        }
  mv.local_start = local_start;
  mv.local_end = local_start + n;
  mv.visible_local_end = le_;
  mv.visible_global_end = ge_;
  return mv;
}

// ---- KVHistory ------------------------------------------------------------------
void KVHistory::write(const Call& call) {
  const int64_t hs = call.head0();
  for (int64_t t = 0; t < call.n(); ++t) {
    auto& kr = k_[call.c + t];
    auto& vr = v_[call.c + t];
    if (kr.empty()) kr.assign(size_t(B_ * H_ * D_), 0.0f);
    if (vr.empty()) vr.assign(size_t(B_ * H_ * D_), 0.0f);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t h = 0; h < call.h_in(); ++h)
        for (int64_t d = 0; d < D_; ++d) {
          kr[size_t((b * H_ + hs + h) * D_ + d)] = call.k.at(b, t, h, d);
          vr[size_t((b * H_ + hs + h) * D_ + d)] = call.v.at(b, t, h, d);
        }
  }
}

float KVHistory::get(const std::map<int64_t, std::vector<float>>& m, int64_t g, int64_t b, int64_t h,
                     int64_t d) const {
  auto it = m.find(g);
  if (it == m.end()) return 0.0f;
  return it->second[size_t((b * H_ + h) * D_ + d)];
}

ModelView KVHistory::view(const std::vector<int64_t>& pos, int64_t hs, int64_t h_count) const {
  ModelView mv;
  const int64_t T = int64_t(pos.size());
  mv.shape = {B_, T, h_count, D_};
  mv.k.resize(size_t(B_ * T * h_count * D_));
  mv.v.resize(mv.k.size());
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < h_count; ++h)
        for (int64_t d = 0; d < D_; ++d) {
          const size_t o = size_t(((b * T + t) * h_count + h) * D_ + d);
          mv.k[o] = k(pos[size_t(t)], b, hs + h, d);
          mv.v[o] = v(pos[size_t(t)], b, hs + h, d);
        }
  return mv;
}

// ---- PackedModel ---------------------------------------------------------------
PackedModel::PackedModel(const CacheOptions& o, const QuantArgs& q) : o_(o), q_(q) {}

void PackedModel::reset() {
  chunks_.clear();
  ge_ = 0;
  next_span_ = 0;
  open_span_ = -1;
  open_chunks_ = 0;
}

std::optional<ErrorKind> PackedModel::check(const Call& call) const {
  const int64_t n = call.n(), c = call.c, ce = c + n, cap = o_.cache_size, sink = o_.sink_tokens;
  const int64_t W = o_.window();
  if (n > cap) return ErrorKind::OutOfRange;
  int64_t ge_after;
  if (!chunks_.empty() && c == chunks_.back().g0) {
    if (n != chunks_.back().g1 - chunks_.back().g0) return ErrorKind::Unsupported;
    ge_after = ge_;
  } else if (c == ge_) {
    const int64_t le = std::min(ge_, cap);
    if (le + n > cap && cap - n < std::min(sink, le)) return ErrorKind::OutOfRange;
    ge_after = ce;
  } else {
    return ErrorKind::Unsupported;
  }
  const int64_t sink_end = std::min(sink, ge_after);
  const int64_t tail = std::max(sink_end, ge_after - std::max<int64_t>(0, W - sink_end));
  // Every token of [c, ce) must be in [0, sink_end) or [tail, ge_after).
  for (int64_t g = c; g < ce; ++g)
    if (g >= sink_end && g < tail) return ErrorKind::OutOfRange;
  if (!values_ok(call.k) || !values_ok(call.v)) return ErrorKind::InvalidArgument;
  return std::nullopt;
}

PackedModel::Result PackedModel::apply(const Call& call) {
  const int64_t n = call.n(), c = call.c, ce = c + n, sink = o_.sink_tokens, W = o_.window();
  if (c == ge_) {  // advance (a rewrite has c == current start != ge)
    chunks_.push_back(Chunk{c, ce, c < sink});
    ge_ = ce;
    pack_and_evict();
  }
  const int64_t sink_end = std::min(sink, ge_);
  const int64_t tail = std::max(sink_end, ge_ - std::max<int64_t>(0, W - sink_end));
  const int64_t lo = call.rw ? std::max(tail, c - *call.rw) : tail;
  Result r;
  for (int64_t g = 0; g < sink_end; ++g) r.positions.push_back(g);
  for (int64_t g = lo; g < ge_; ++g) r.positions.push_back(g);
  const int64_t T = int64_t(r.positions.size());
  r.local_start = T - n;
  r.local_end = T;
  r.visible_local_end = std::min(ge_, o_.cache_size);
  r.visible_global_end = ge_;
  return r;
}

void PackedModel::pack_and_evict() {
  const int64_t sink = o_.sink_tokens, W = o_.window();
  const int64_t sink_end = std::min(sink, ge_);
  const int64_t tail = std::max(sink_end, ge_ - std::max<int64_t>(0, W - sink_end));
  const size_t last = chunks_.size() - 1;
  // 1. Drop finalized non-sink segments every token of which is < tail.
  //    A packed chunk belongs to a span: the span ends where its last chunk ends.
  std::map<int, int64_t> span_end;
  for (const Chunk& ch : chunks_)
    if (ch.st == St::Packed) span_end[ch.span] = std::max(span_end[ch.span], ch.g1);
  for (size_t i = 0; i < last; ++i) {
    Chunk& ch = chunks_[i];
    if (ch.sink || ch.st == St::Dropped) continue;
    const int64_t end = ch.st == St::Packed && !ch.incremental ? span_end[ch.span] : ch.g1;
    if (end <= tail) ch.st = St::Dropped;
  }
  if (!q_.enabled()) return;
  // 2a. Sink chunks.
  if (q_.sink) {
    std::vector<size_t> eligible_raw;
    int ordinal = 0;
    for (size_t i = 0; i < last; ++i) {
      if (!chunks_[i].sink) continue;
      if (ordinal >= q_.sink_keep_chunks && chunks_[i].st == St::Raw) eligible_raw.push_back(i);
      ++ordinal;
    }
    if (q_.sink_span == SinkSpan::Chunk) {
      for (size_t i : eligible_raw) {
        chunks_[i].st = St::Packed;
        chunks_[i].span = next_span_++;
      }
    } else if (!chunks_[last].sink && !eligible_raw.empty()) {
      const int id = next_span_++;
      for (size_t i : eligible_raw) {
        chunks_[i].st = St::Packed;
        chunks_[i].span = id;
      }
    }
  }
  // 2b. Non-sink chunks: all alive finalized ones except the newest keep_recent.
  std::vector<size_t> alive;
  for (size_t i = 0; i < last; ++i)
    if (!chunks_[i].sink && chunks_[i].st != St::Dropped) alive.push_back(i);
  const size_t keep = size_t(q_.keep_recent_chunks);
  std::vector<size_t> eligible_raw;
  for (size_t j = 0; j + keep < alive.size(); ++j)
    if (chunks_[alive[j]].st == St::Raw) eligible_raw.push_back(alive[j]);
  const size_t span = size_t(q_.span_chunks);
  if (q_.span_mode == SpanMode::Incremental) {
    // Every eligible chunk now: into the open span if it has room and holds the
    // chunk's predecessor (and the cache did not break the span), else a new span.
    for (size_t i : eligible_raw) {
      const bool answer = !join_ || join_();  // asked for every incremental chunk, in order
      const bool may_join = open_span_ >= 0 && open_chunks_ < q_.span_chunks && i > 0 &&
                            chunks_[i - 1].st == St::Packed && chunks_[i - 1].incremental &&
                            chunks_[i - 1].span == open_span_;
      Chunk& ch = chunks_[i];
      ch.st = St::Packed;
      ch.incremental = true;
      if (may_join && answer) {
        ch.span = open_span_;
        ++open_chunks_;
      } else {
        ch.span = open_span_ = next_span_++;
        open_chunks_ = 1;
      }
    }
    return;
  }
  for (size_t j = 0; j + span <= eligible_raw.size(); j += span) {
    const int id = next_span_++;
    for (size_t u = j; u < j + span; ++u) {
      chunks_[eligible_raw[u]].st = St::Packed;
      chunks_[eligible_raw[u]].span = id;
    }
  }
}

std::vector<PackedModel::Seg> PackedModel::segments() const {
  std::vector<Seg> out;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& ch = chunks_[i];
    if (ch.st == St::Dropped) continue;
    const bool same_span = ch.st == St::Packed && !out.empty() && out.back().packed && i > 0 &&
                           chunks_[i - 1].st == St::Packed && chunks_[i - 1].span == ch.span;
    if (same_span && !ch.incremental) {
      out.back().g1 = ch.g1;
      out.back().chunks += 1;
      continue;
    }
    out.push_back(Seg{ch.g0, ch.g1, ch.sink, ch.st == St::Packed, 1, same_span});
  }
  // QuantArgs::refine_recent: the newest incremental chunks keep refinement layers.
  int newer = 0;
  for (auto it = out.rbegin(); it != out.rend(); ++it) {
    const bool incremental_chunk = it->packed && !it->sink && q_.span_mode == SpanMode::Incremental;
    if (incremental_chunk && newer++ < q_.refine_recent) it->refined = true;
  }
  return out;
}

size_t PackedModel::expected_resident(DType dt) const {
  size_t total = 0;
  const int64_t B = o_.batch, H = o_.heads, D = o_.head_dim;
  // An encoding's codebook bytes: stages x [B, H, K, D] of the cache dtype (spec 1.5).
  const size_t codebooks = q_.enabled() ? size_t(q_.codec.stages * B * H * q_.codec.centroids * D) * dtype_size(dt) : 0;
  for (const Seg& s : segments()) {
    const Shape4 sh{B, s.g1 - s.g0, H, D};
    if (!s.packed) {
      total += 2 * size_t(sh.numel()) * dtype_size(dt);
      continue;
    }
    total += 2 * EncodedTensor::predicted_nbytes(sh, dt, q_.codec);
    if (s.joins_prev) total -= 2 * codebooks;  // an incremental span's codebooks count once
    // A refinement layer: an f32 encoding of one stage of one centroid (K and V).
    if (s.refined)
      total += 2 * EncodedTensor::predicted_nbytes(
                       sh, DType::F32, refinement_config(q_.refine_bits, q_.codec.block_size, q_.codec.seed));
  }
  return total;
}

// ---- comparisons ---------------------------------------------------------------
std::string compare_exact(const KVView& got, const ModelView& want) {
  if (!(got.k.shape == want.shape) || !(got.v.shape == want.shape))
    return fmt::format("view shape k {} v {} != expected {}", got.k.shape.str(), got.v.shape.str(),
                       want.shape.str());
  const Shape4 s = want.shape;
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t t = 0; t < s.s; ++t)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t d = 0; d < s.d; ++d) {
          const size_t o = size_t(((b * s.s + t) * s.h + h) * s.d + d);
          const float gk = got.k.at(b, t, h, d), gv = got.v.at(b, t, h, d);
          if (bits_of(gk) != bits_of(want.k[o]))
            return fmt::format("k[{}, {}, {}, {}] = {} != expected {}", b, t, h, d, gk, want.k[o]);
          if (bits_of(gv) != bits_of(want.v[o]))
            return fmt::format("v[{}, {}, {}, {}] = {} != expected {}", b, t, h, d, gv, want.v[o]);
        }
  if (got.local_start_index != want.local_start || got.local_end_index != want.local_end)
    return fmt::format("local indices ({}, {}) != expected ({}, {})", got.local_start_index, got.local_end_index,
                       want.local_start, want.local_end);
  if (got.visible_local_end != want.visible_local_end || got.visible_global_end != want.visible_global_end)
    return fmt::format("visible ends ({}, {}) != expected ({}, {})", got.visible_local_end, got.visible_global_end,
                       want.visible_local_end, want.visible_global_end);
  return "";
}

std::string compare_views(const KVView& a, const KVView& b) {
  if (!(a.k.shape == b.k.shape) || !(a.v.shape == b.v.shape) || a.k.dtype != b.k.dtype)
    return fmt::format("view shapes differ: {} vs {}", a.k.shape.str(), b.k.shape.str());
  const Shape4 s = a.k.shape;
  for (int64_t bb = 0; bb < s.b; ++bb)
    for (int64_t t = 0; t < s.s; ++t)
      for (int64_t h = 0; h < s.h; ++h) {
        const size_t bytes = size_t(s.d) * dtype_size(a.k.dtype);
        if (std::memcmp(a.k.row(bb, t, h), b.k.row(bb, t, h), bytes) != 0)
          return fmt::format("k row [{}, {}, {}] differs", bb, t, h);
        if (std::memcmp(a.v.row(bb, t, h), b.v.row(bb, t, h), bytes) != 0)
          return fmt::format("v row [{}, {}, {}] differs", bb, t, h);
      }
  return "";
}

namespace {

double ulp_of(float y, DType dt) {
  const double a = std::fabs(double(y));
  const int p = dt == DType::F32 ? 23 : dt == DType::F16 ? 10 : 7;
  const double min_ulp = dt == DType::F32 ? std::ldexp(1.0, -149) : dt == DType::F16 ? std::ldexp(1.0, -24)
                                                                                      : std::ldexp(1.0, -133);
  if (a == 0) return min_ulp;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return std::max(min_ulp, std::ldexp(1.0, e - 1 - p));
}

}  // namespace

std::string check_bound(const EncodedTensor& e, int64_t b, int64_t s, int64_t h, const float* x, const float* got,
                        DType out) {
  const int64_t D = e.shape.d, S = e.shape.s, H = e.shape.h;
  const int qmax = e.asymmetric ? (1 << e.bits) - 1 : (1 << (e.bits - 1)) - 1;
  for (int64_t d = 0; d < D; ++d) {
    float r = x[d];
    double csum = 0;
    for (int st = 0; st < e.stages; ++st) {
      const int id = e.ids[size_t(st)][size_t((b * H + h) * S + s)];
      const float c = e.centroid_at(st, b, h, id, d);
      r = r - c;
      csum += std::fabs(double(c));
    }
    const int64_t blk = d / e.block_size;
    const double s_eff = e.scale_eff(b, h, s, blk);
    double lo, hi;
    if (e.asymmetric) {
      const double z = e.zero_eff(b, h, s, blk);
      lo = z;
      hi = z + qmax * s_eff;
    } else {
      lo = -qmax * s_eff;
      hi = qmax * s_eff;
    }
    const double dist = std::max({0.0, lo - double(r), double(r) - hi});
    const double bound = s_eff / 2 + dist + ulp_of(got[d], out) +
                         1e-5 * (std::fabs(double(x[d])) + csum + std::fabs(double(r))) + 1e-30;
    const double err = std::fabs(double(x[d]) - double(got[d]));
    if (!(err <= bound))
      return fmt::format("bound violated at (b={}, s={}, h={}, d={}): x={} decoded={} |err|={} > bound={} "
                         "(s_eff={}, dist={})",
                         b, s, h, d, x[d], got[d], err, bound, s_eff, dist);
  }
  return "";
}

std::string check_packed_view(const PackedCausalCache& cache, const KVView& view,
                              const std::vector<int64_t>& positions, const KVHistory& hist, int64_t hs) {
  const Shape4 s = view.k.shape;
  if (s.s != int64_t(positions.size()))
    return fmt::format("view has {} tokens, expected {}", s.s, positions.size());
  std::vector<float> x(size_t(s.d)), got(size_t(s.d));
  // Chunks of incremental spans: their data with the span's codebooks (K, V).
  std::vector<std::optional<std::pair<EncodedTensor, EncodedTensor>>> full(cache.num_segments());
  // Refined chunks: the base decoding and the layer's f32 decoding (K, V), whole.
  struct Refined {
    Tensor base_k, base_v, ref_k, ref_v;
  };
  std::vector<std::optional<Refined>> refined(cache.num_segments());
  for (size_t i = 0; i < cache.num_segments(); ++i) {
    const auto seg = cache.segment(i);
    if (seg.packed && seg.k_codebook)
      full[i].emplace(with_codebook(*seg.k_enc, *seg.k_codebook), with_codebook(*seg.v_enc, *seg.v_codebook));
    if (seg.packed && seg.k_ref) {
      if (!full[i]) return fmt::format("segment {} holds refinement layers but is not a chunk of a span", i);
      refined[i] =
          Refined{decode(full[i]->first, 1), decode(full[i]->second, 1), decode(*seg.k_ref, 1), decode(*seg.v_ref, 1)};
    }
  }
  for (int64_t t = 0; t < s.s; ++t) {
    const int64_t g = positions[size_t(t)];
    size_t si = 0;
    while (si < cache.num_segments() && !(cache.segment(si).g0 <= g && g < cache.segment(si).g1)) ++si;
    if (si == cache.num_segments()) return fmt::format("position {} is in no segment", g);
    const auto seg = cache.segment(si);
    for (int pass = 0; pass < 2; ++pass) {
      const StridedView& vw = pass == 0 ? view.k : view.v;
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t h = 0; h < s.h; ++h) {
          for (int64_t d = 0; d < s.d; ++d) {
            x[size_t(d)] = pass == 0 ? hist.k(g, b, hs + h, d) : hist.v(g, b, hs + h, d);
            got[size_t(d)] = vw.at(b, t, h, d);
          }
          if (!seg.packed) {
            for (int64_t d = 0; d < s.d; ++d)
              if (bits_of(x[size_t(d)]) != bits_of(got[size_t(d)]))
                return fmt::format("{} raw position {} [b={}, h={}, d={}]: {} != written {}", pass ? "v" : "k", g,
                                   b, hs + h, d, got[size_t(d)], x[size_t(d)]);
          } else if (refined[si]) {
            // A refined chunk: the view holds round(base + layer) exactly, and the layer
            // decodes the base's error x - base within its own bound (spec 1.2).
            const Refined& rf = *refined[si];
            const Tensor& base = pass == 0 ? rf.base_k : rf.base_v;
            const Tensor& lay = pass == 0 ? rf.ref_k : rf.ref_v;
            const EncodedTensor& le = pass == 0 ? *seg.k_ref : *seg.v_ref;
            const int64_t sg = g - seg.g0;
            std::vector<float> err_x(size_t(s.d)), lay_got(size_t(s.d));
            for (int64_t d = 0; d < s.d; ++d) {
              const float bv = base.at(b, sg, hs + h, d), lv = lay.at(b, sg, hs + h, d);
              float sum = bv + lv;
              Tensor one(vw.dtype, {1, 1, 1, 1});
              convert_from_f32(&sum, vw.dtype, one.data(), 1);
              const float want = one.at(0, 0, 0, 0);
              if (bits_of(want) != bits_of(got[size_t(d)]))
                return fmt::format("{} refined position {} [b={}, h={}, d={}]: {} != round(base {} + layer {}) = {}",
                                   pass ? "v" : "k", g, b, hs + h, d, got[size_t(d)], bv, lv, want);
              err_x[size_t(d)] = x[size_t(d)] - bv;
              lay_got[size_t(d)] = lv;
            }
            std::string err = check_bound(le, b, sg, hs + h, err_x.data(), lay_got.data(), DType::F32);
            if (!err.empty()) return fmt::format("{} refinement layer at position {}: {}", pass ? "v" : "k", g, err);
          } else {
            const EncodedTensor& e = full[si] ? (pass == 0 ? full[si]->first : full[si]->second)
                                              : (pass == 0 ? *seg.k_enc : *seg.v_enc);
            std::string err = check_bound(e, b, g - seg.g0, hs + h, x.data(), got.data(), vw.dtype);
            if (!err.empty()) return fmt::format("{} encoded position {}: {}", pass ? "v" : "k", g, err);
          }
        }
    }
  }
  return "";
}

std::string compare_segments(const PackedCausalCache& cache, const std::vector<PackedModel::Seg>& want) {
  std::string got_s, want_s;
  bool same = cache.num_segments() == want.size();
  for (size_t i = 0; i < cache.num_segments(); ++i) {
    const auto s = cache.segment(i);
    got_s += fmt::format("[{},{}){}{}x{}{}{} ", s.g0, s.g1, s.is_sink ? "s" : "", s.packed ? "P" : "R", s.chunks,
                         s.span >= 0 && i > 0 && cache.segment(i - 1).span == s.span ? "+" : "", s.k_ref ? "r" : "");
    if (i < want.size()) {
      const auto& w = want[i];
      const bool joins_prev = s.span >= 0 && i > 0 && cache.segment(i - 1).span == s.span;
      if (s.g0 != w.g0 || s.g1 != w.g1 || s.is_sink != w.sink || s.packed != w.packed || s.chunks != w.chunks ||
          joins_prev != w.joins_prev || (s.k_ref != nullptr) != w.refined || (s.v_ref != nullptr) != w.refined)
        same = false;
    }
  }
  for (const auto& w : want)
    want_s += fmt::format("[{},{}){}{}x{}{}{} ", w.g0, w.g1, w.sink ? "s" : "", w.packed ? "P" : "R", w.chunks,
                          w.joins_prev ? "+" : "", w.refined ? "r" : "");
  return same ? "" : fmt::format("segments {}!= expected {}", got_s, want_s);
}

Outcome run_call(CausalCache& cache, const Call& call) {
  Outcome o;
  try {
    o.view = cache.update(call.k, call.v, call.c, call.hs, call.rw);
  } catch (const Error& e) {
    o.error = e.kind();
    o.message = e.what();
  }
  return o;
}

// ---- sequences -----------------------------------------------------------------
QuantArgs random_quant(std::mt19937_64& rng, int bits, int64_t D) {
  auto ri = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  QuantArgs q;
  q.enable(bits);
  q.codec.block_size = (D % 16 == 0 && ri(0, 1)) ? 16 : 8;
  q.codec.centroids = int(ri(1, 8));
  q.codec.stages = int(ri(1, 2));
  q.codec.kmeans_iters = 1;
  q.codec.asymmetric = ri(0, 1) == 1;
  q.keep_recent_chunks = int(ri(0, 2));
  q.sink = ri(0, 3) != 0;
  q.sink_span = ri(0, 1) ? SinkSpan::Full : SinkSpan::Chunk;
  q.sink_keep_chunks = int(ri(0, 1));
  q.span_chunks = int(ri(1, 3));
  if (ri(0, 1)) {  // incremental spans, with or without adaptive boundaries
    q.span_mode = SpanMode::Incremental;
    const double ratios[] = {0.0, 0.0, 1.05, 1.5, 3.0};
    q.span_break_ratio = ratios[ri(0, 4)];
    q.refine_recent = int(ri(0, 3)) - 1;  // refinement layers of the newest chunks: none (half the time), 1 or 2
    if (q.refine_recent < 0) q.refine_recent = 0;
    q.refine_bits = ri(0, 1) ? 4 : 2;
  }
  q.codec.scaling = ri(0, 1) ? Scaling::Compat : Scaling::TwoLevel;
  q.codec.scale_dtype = ri(0, 2) == 0 ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
  const Init inits[] = {Init::Random, Init::KMeansPlusPlus, Init::Warm};
  q.codec.init = inits[ri(0, 2)];
  q.codec.seed = uint64_t(ri(0, 1 << 20));
  q.codec.threads = 1;
  return q;
}

std::optional<int64_t> random_rw(std::mt19937_64& rng, const ScenarioParams& p) {
  std::uniform_real_distribution<float> u(0, 1);
  if (u(rng) >= p.rw_prob) return std::nullopt;
  if (u(rng) < 0.3f) return int64_t(0);
  return std::uniform_int_distribution<int64_t>(1, 3 * p.base_chunk)(rng);
}

std::vector<Call> chunk_calls(std::mt19937_64& rng, const ScenarioParams& p, int64_t c, int64_t n) {
  std::vector<Call> calls;
  std::uniform_real_distribution<float> u(0, 1);
  const int steps = std::uniform_int_distribution<int>(1, p.steps_max)(rng);
  for (int st = 0; st < steps; ++st) {
    if (p.H > 1 && u(rng) < p.slice_prob) {
      // Contiguous head groups covering [0, H), written in random order.
      std::vector<std::pair<int64_t, int64_t>> groups;
      int64_t h0 = 0;
      while (h0 < p.H) {
        const int64_t len = std::uniform_int_distribution<int64_t>(1, p.H - h0)(rng);
        groups.push_back({h0, len});
        h0 += len;
      }
      std::shuffle(groups.begin(), groups.end(), rng);
      for (auto [gh, len] : groups) {
        Call call;
        call.c = c;
        call.hs = gh;
        call.rw = random_rw(rng, p);
        call.k = random_tensor(rng, p.dtype, {p.B, n, len, p.D});
        call.v = random_tensor(rng, p.dtype, {p.B, n, len, p.D});
        calls.push_back(std::move(call));
      }
    } else {
      Call call;
      call.c = c;
      if (u(rng) < 0.3f) call.hs = 0;
      call.rw = random_rw(rng, p);
      call.k = random_tensor(rng, p.dtype, {p.B, n, p.H, p.D});
      call.v = random_tensor(rng, p.dtype, {p.B, n, p.H, p.D});
      calls.push_back(std::move(call));
    }
  }
  return calls;
}

}  // namespace qvg::testing
