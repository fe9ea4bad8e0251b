// src/sim/report_util.h — helpers shared by the report formats of src/sim
// (report_json.cpp, report_text.cpp, report_svg.cpp); internal, not part of the API.
#pragma once

#include <cstddef>
#include <optional>

#include "qvg/simulate.h"

namespace qvg::sim {

/// Configuration j of chunk c over its layers: resident, encoded and predicted bytes
/// and token counts are means (rounded), the transient peak and spans encoded the
/// largest, errors pooled, times summed.
PackedLayerRecord pooled(const ChunkRecord& c, size_t j);

/// -10 log10 of the mean of a comparison row's K and V relative MSEs; nullopt when
/// either is absent or the mean is 0.
std::optional<double> kv_snr(const CompareRow& row);

}  // namespace qvg::sim
