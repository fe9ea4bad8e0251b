// src/sim/report_util.h — helpers shared by the report formats of src/sim
// (report_json.cpp, report_text.cpp, report_svg.cpp); internal, not part of the API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "qvg/eval/compare.h"
#include "qvg/eval/frontier.h"
#include "qvg/eval/simulate.h"
#include "qvg/settings.h"

namespace qvg::sim {

/// True for the settings table's cache-policy rows (those that are no codec row)
/// that `skip` does not name.
inline bool is_policy_row(const Setting& s, std::span<const std::string_view> skip) {
  return !s.codec_row() && std::find(skip.begin(), skip.end(), s.name) == skip.end();
}

/// The cache-policy settings of q (is_policy_row), each under its name, as JSON
/// values, for reports; `skip` leaves some out.
inline nlohmann::ordered_json policy_json(const QuantArgs& q, std::span<const std::string_view> skip = {}) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const Setting& s : quant_settings()) {
    if (!is_policy_row(s, skip)) continue;
    const SettingValue v = s.get(q);
    std::visit(
        [&](const auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::monostate>)
            j[std::string(s.name)] = nullptr;
          else
            j[std::string(s.name)] = x;
        },
        v);
  }
  return j;
}

/// The same settings as text for the text reports: "name value, name value, ...".
inline std::string policy_text(const QuantArgs& q, std::span<const std::string_view> skip = {}) {
  std::string out;
  for (const Setting& s : quant_settings())
    if (is_policy_row(s, skip)) out += (out.empty() ? "" : ", ") + std::string(s.name) + " " + setting_text(s.get(q));
  return out;
}

/// Configuration j of chunk c over its layers: resident, encoded and predicted bytes
/// and token counts are means (rounded); the transient peak, spans and chunks encoded,
/// view bytes and model bytes the largest; errors pooled, times summed.
PackedLayerRecord pooled(const ChunkRecord& c, size_t j);

/// -10 log10 of the mean of a comparison row's K and V relative MSEs; nullopt when
/// either is absent or the mean is 0.
std::optional<double> kv_snr(const CompareRow& row);

/// The "workload" object of a report on one scored context (CompareResult,
/// FrontierResult): the preset's shape, the context and the queries scored.
template <class Result>
nlohmann::ordered_json scored_context_json(const Result& r, const std::string& model, int query_stride) {
  const ModelPreset& p = r.preset;
  return {{"model", model},
          {"scale", r.config.scale},
          {"seed", r.config.seed},
          {"layers_scored", r.layers},
          {"heads", p.heads},
          {"head_dim", p.head_dim},
          {"chunk_tokens", p.chunk_tokens()},
          {"context_chunks", r.context_chunks},
          {"context_tokens", r.context_tokens},
          {"query_stride", query_stride},
          {"queries", r.queries}};
}

}  // namespace qvg::sim
