// The quantizer comparison (qvg/eval/compare.h, compare()): the PRQ codec and the
// RTN / KIVI-style / QuaRot-style baselines on one context of the workload.
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/core.h>

#include "qvg/attention.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/eval/baselines.h"
#include "qvg/eval/compare.h"
#include "qvg/eval/error_sums.h"
#include "sim/sim_common.h"

namespace qvg {

int64_t default_context_chunks(const ModelPreset& scaled, int centroids) {
  const int64_t need = 64 * int64_t(std::max(1, centroids));
  const int64_t ct = std::max<int64_t>(1, scaled.chunk_tokens());
  return std::max<int64_t>(1, (need + ct - 1) / ct);
}

void CompareConfig::validate() const {
  const ModelPreset p = sim::validate_context_config(*this);
  codec.validate_for_head_dim(p.head_dim);
  BaselineConfig b;
  b.bits = codec.bits;
  b.block_size = codec.block_size;
  b.kivi_group_tokens = codec.block_size;
  for (BaselineMethod m : all_baseline_methods()) b.validate_for(m, p.head_dim);
}

namespace {

using sim::tensor_error;

/// x ([1, chunks * chunk_tokens, H, D]) encoded chunk by chunk into one incremental
/// span (the packed cache's slot schedule: half of K for the first chunk, the rest
/// shared out over the others) and decoded; the bytes stored (one codebook, every
/// chunk's arrays) are added to `bytes`.
Tensor incremental_round_trip(const Tensor& x, int64_t chunk_tokens, int64_t chunks, const CodecConfig& codec,
                              size_t& bytes) {
  const Shape4 sh = x.shape();
  QVG_CHECK(sh.b == 1 && sh.s == chunks * chunk_tokens);
  const int K = codec.centroids;
  const int first = chunks > 1 ? (K + 1) / 2 : K;
  const int later = chunks > 1 ? int((K - first) / (chunks - 1)) : 0;
  const size_t row = size_t(sh.h * sh.d) * dtype_size(x.dtype());
  SpanCodebook span = SpanCodebook::empty({1, chunk_tokens, sh.h, sh.d}, x.dtype(), codec);
  Tensor out(x.dtype(), sh);
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t t0 = i * chunk_tokens;
    const ConstTensorView part{
        static_cast<const std::byte*>(x.data()) + size_t(t0) * row, x.dtype(), {1, chunk_tokens, sh.h, sh.d}};
    const EncodedTensor e = encode_span_chunk(part, codec, span, i == 0 ? first : later);
    bytes += e.nbytes();
    const DecodeTarget dst{static_cast<std::byte*>(out.data()) + size_t(t0) * row, x.dtype(), sh.s * sh.h * sh.d,
                           sh.h * sh.d};
    decode_ranges({DecodeTask{&e, 0, chunk_tokens, 0, sh.h, dst, &span.book}}, codec.threads);
  }
  bytes += span.book.nbytes();
  return out;
}

}  // namespace

CompareResult compare(const CompareConfig& cfg) {
  cfg.validate();
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  CompareResult res;
  const Workload w = sim::open_context(cfg, res, cfg.codec.centroids);
  const ModelPreset& p = res.preset;
  const int64_t ctx_frames = res.context_chunks * p.frames_per_chunk;

  CodecConfig codec = cfg.codec;
  if (cfg.threads > 0 && codec.threads == 0) codec.threads = cfg.threads;
  BaselineConfig bc;
  bc.bits = cfg.codec.bits;
  bc.block_size = cfg.codec.block_size;
  bc.kivi_group_tokens = cfg.codec.block_size;

  const std::vector<std::string> methods = {"qvg", "rtn", "kivi", "quarot"};
  res.rows.resize(methods.size());
  std::vector<size_t> bytes(methods.size(), 0);
  double elements = 0;
  for (size_t m = 0; m < methods.size(); ++m) res.rows[m].method = methods[m];

  const sim::ScoredContext sc = sim::scored_context(w, res.layers, ctx_frames, cfg.query_stride, cfg.threads);
  res.queries = sc.queries;
  elements = sc.elements;
  for (const sim::ScoredLayer& ctx : sc.layers) {
    const Tensor& q = ctx.q;
    const Tensor& ref = ctx.ref;
    for (size_t m = 0; m < methods.size(); ++m) {
      CompareRow& row = res.rows[m];
      Tensor kq, vq;
      const auto t0 = clock::now();
      if (methods[m] == "qvg" && cfg.spans == SpanMode::Incremental) {
        kq = incremental_round_trip(ctx.k, p.chunk_tokens(), res.context_chunks, codec, bytes[m]);
        vq = incremental_round_trip(ctx.v, p.chunk_tokens(), res.context_chunks, codec, bytes[m]);
      } else if (methods[m] == "qvg") {
        const EncodedTensor ek = encode(ctx.k.view(), codec);
        const EncodedTensor ev = encode(ctx.v.view(), codec);
        kq = decode(ek, codec.threads);
        vq = decode(ev, codec.threads);
        bytes[m] += ek.nbytes() + ev.nbytes();
      } else {
        const BaselineMethod bm = parse_baseline_method(methods[m]);
        RoundTrip rk = baseline_roundtrip(bm, ctx.k.view(), TensorRole::Key, bc);
        RoundTrip rv = baseline_roundtrip(bm, ctx.v.view(), TensorRole::Value, bc);
        bytes[m] += rk.nbytes + rv.nbytes;
        kq = std::move(rk.decoded);
        vq = std::move(rv.decoded);
      }
      row.seconds += sim::seconds_since(t0);
      row.k.add(tensor_error(ctx.k.view(), kq.view()));
      row.v.add(tensor_error(ctx.v.view(), vq.view()));
      const Tensor kq_all = sim::concat_tokens(kq.view(), ctx.k_cur.view());
      const Tensor vq_all = sim::concat_tokens(vq.view(), ctx.v_cur.view());
      const Tensor out =
          attention(q.view(), StridedView::of(kq_all.view()), StridedView::of(vq_all.view()), cfg.threads);
      row.attention.add(attention_error(out, ref));
    }
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    res.rows[m].bits_per_element = double(bytes[m]) * 8.0 / elements;
    res.rows[m].ratio = 16.0 / res.rows[m].bits_per_element;
  }
  res.wall_s = sim::seconds_since(t_start);
  return res;
}

}  // namespace qvg
