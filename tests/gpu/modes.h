// tests/gpu/modes.h — the codec modes the CUDA tests sweep (host and GPU tests).
#pragma once

#include <vector>

#include "qvg/config.h"

namespace qvg::testing {

struct Mode {
  int bits;
  bool asym;
  qvg::ScaleDType sd;
  qvg::Scaling sc;
  int stages;
};

/// Every combination of bits 2/4, sym/asym, fp8/bf16 scales, two_level/compat, 1/2 stages.
inline std::vector<Mode> all_modes() {
  std::vector<Mode> m;
  for (int bits : {2, 4})
    for (bool asym : {false, true})
      for (auto sd : {qvg::ScaleDType::FP8_E4M3, qvg::ScaleDType::BF16})
        for (auto sc : {qvg::Scaling::TwoLevel, qvg::Scaling::Compat})
          for (int stages : {1, 2}) m.push_back({bits, asym, sd, sc, stages});
  return m;
}

}  // namespace qvg::testing
