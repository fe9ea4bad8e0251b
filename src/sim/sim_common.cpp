// Helpers shared by src/sim (see sim_common.h).
#include "sim/sim_common.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/core.h>

#include "qvg/attention.h"
#include "qvg/error.h"

namespace qvg::sim {

Tensor subsample_tokens(ConstTensorView x, int64_t stride) {
  QVG_CHECK(stride >= 1 && x.shape.b == 1 && x.shape.s >= 1);
  const int64_t n = (x.shape.s + stride - 1) / stride;
  Tensor out(x.dtype, Shape4{1, n, x.shape.h, x.shape.d});
  const size_t row = size_t(x.shape.h * x.shape.d) * dtype_size(x.dtype);
  const auto* src = static_cast<const std::byte*>(x.data);
  auto* dst = static_cast<std::byte*>(out.data());
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + size_t(i) * row, src + size_t(i * stride) * row, row);
  return out;
}

Tensor concat_tokens(ConstTensorView a, ConstTensorView b) {
  QVG_CHECK(a.shape.b == 1 && b.shape.b == 1 && a.shape.h == b.shape.h && a.shape.d == b.shape.d && a.dtype == b.dtype);
  Tensor out(a.dtype, Shape4{1, a.shape.s + b.shape.s, a.shape.h, a.shape.d});
  auto* dst = static_cast<std::byte*>(out.data());
  std::memcpy(dst, a.data, a.nbytes());
  std::memcpy(dst + a.nbytes(), b.data, b.nbytes());
  return out;
}

ErrorSums tensor_error(ConstTensorView x, ConstTensorView y) {
  QVG_CHECK(x.shape == y.shape);
  const size_t n = size_t(x.shape.numel());
  std::vector<float> a(n), b(n);
  convert_to_f32(x.data, x.dtype, a.data(), n);
  convert_to_f32(y.data, y.dtype, b.data(), n);
  ErrorSums s;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    s.err += d * d;
    s.ref += double(a[i]) * double(a[i]);
  }
  s.tokens = x.shape.b * x.shape.s;
  return s;
}

ScoredContext scored_context(const Workload& w, const std::vector<int>& layers, int64_t ctx_frames,
                             int64_t query_stride, int threads) {
  const ModelPreset& p = w.preset();
  GenerateParts ctx_parts;
  ctx_parts.k_pre_rope = false;
  ctx_parts.q = false;
  GenerateParts cur_parts;
  cur_parts.k_pre_rope = false;
  ScoredContext out;
  for (int layer : layers) {
    LayerChunk ctx = w.generate_frames(layer, 0, ctx_frames, ctx_parts);
    LayerChunk cur = w.generate_frames(layer, ctx_frames, p.frames_per_chunk, cur_parts);
    ScoredLayer d;
    d.q = subsample_tokens(cur.q.view(), query_stride);
    out.queries = d.q.shape().s;
    const Tensor k_all = concat_tokens(ctx.k.view(), cur.k.view());
    const Tensor v_all = concat_tokens(ctx.v.view(), cur.v.view());
    d.ref = attention(d.q.view(), StridedView::of(k_all.view()), StridedView::of(v_all.view()), threads);
    out.elements += 2.0 * double(ctx.k.shape().numel());
    d.k = std::move(ctx.k);
    d.v = std::move(ctx.v);
    d.k_cur = std::move(cur.k);
    d.v_cur = std::move(cur.v);
    out.layers.push_back(std::move(d));
  }
  return out;
}

std::string grouped(int64_t v) {
  const std::string s = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string mib(size_t bytes) {
  const double m = double(bytes) / double(1 << 20);
  if (m >= 1000.0) {
    const auto tenths = static_cast<int64_t>(std::llround(m * 10.0));
    return fmt::format("{}.{} MiB", grouped(tenths / 10), tenths % 10);
  }
  return fmt::format("{:.2f} MiB", m);
}

}  // namespace qvg::sim
