// Helpers shared by the report formats (see report_util.h).
#include "sim/report_util.h"

#include <algorithm>
#include <cmath>

namespace qvg::sim {

PackedLayerRecord pooled(const ChunkRecord& c, size_t j) {
  PackedLayerRecord a;
  const size_t n = c.layers.size();
  double res = 0, enc_b = 0, enc_t = 0, vis = 0, tr = 0;
  std::optional<double> pred = 0.0;
  int spans = 0;
  for (const LayerRecord& l : c.layers) {
    const PackedLayerRecord& p = l.packed[j];
    res += double(p.resident_bytes);
    enc_b += double(p.encoded_bytes);
    enc_t += double(p.encoded_tokens);
    vis += double(p.encoded_visible);
    tr = std::max(tr, double(p.transient_peak_bytes));
    if (pred && p.predicted_resident_bytes)
      *pred += double(*p.predicted_resident_bytes);
    else
      pred.reset();
    spans = std::max(spans, p.spans_encoded);
    a.chunks_encoded = std::max(a.chunks_encoded, p.chunks_encoded);
    a.view_bytes = std::max(a.view_bytes, p.view_bytes);
    a.model_bytes = std::max(a.model_bytes, p.model_bytes);
    a.k.add(p.k);
    a.v.add(p.v);
    a.attention.add(p.attention);
    a.encode_s += p.encode_s;
    a.decode_s += p.decode_s;
    a.attention_s += p.attention_s;
  }
  const double dn = double(std::max<size_t>(1, n));
  a.resident_bytes = size_t(std::llround(res / dn));
  a.encoded_bytes = size_t(std::llround(enc_b / dn));
  a.encoded_tokens = int64_t(std::llround(enc_t / dn));
  a.encoded_visible = int64_t(std::llround(vis / dn));
  a.transient_peak_bytes = size_t(tr);
  if (pred) a.predicted_resident_bytes = size_t(std::llround(*pred / dn));
  a.spans_encoded = spans;
  return a;
}

std::optional<double> kv_snr(const CompareRow& row) {
  const auto k = row.k.rel_mse(), v = row.v.rel_mse();
  if (!k || !v) return std::nullopt;
  const double m = (*k + *v) / 2;
  if (m <= 0) return std::nullopt;
  return -10.0 * std::log10(m);
}

}  // namespace qvg::sim
