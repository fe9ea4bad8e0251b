// tests/gpu/modes.h — the codec modes the CUDA tests sweep (host and GPU tests).
#pragma once

#include <vector>

#include "qvg/code_format.h"
#include "qvg/config.h"

namespace qvg::testing {

struct Mode {
  int bits;
  bool asym;
  qvg::ScaleDType sd;
  qvg::Scaling sc;
  int stages;
};

/// Every combination of the given code widths, sym/asym, fp8/bf16 scales,
/// two_level/compat, 1/2 stages.
inline std::vector<Mode> modes_of_widths(const std::vector<int>& widths) {
  std::vector<Mode> m;
  for (int bits : widths)
    for (bool asym : {false, true})
      for (auto sd : {qvg::ScaleDType::FP8_E4M3, qvg::ScaleDType::BF16})
        for (auto sc : {qvg::Scaling::TwoLevel, qvg::Scaling::Compat})
          for (int stages : {1, 2}) m.push_back({bits, asym, sd, sc, stages});
  return m;
}
/// The engine's widths, bits 2/4 (what the host tests compare with the CPU codec).
inline std::vector<Mode> all_modes() {
  return modes_of_widths({2, 4});
}
/// Every row of qvg/code_format.h (int2, int3, int4): the device tests' sweep. A mode's
/// block size must be a multiple of its row's group_codes (int3: 8).
inline std::vector<Mode> every_width_modes() {
  std::vector<int> widths;
  for (const qvg::CodeFormat& f : qvg::kCodeFormats) widths.push_back(f.bits);
  return modes_of_widths(widths);
}

}  // namespace qvg::testing
