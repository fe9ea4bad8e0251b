// The code-format table's two host functions (qvg/code_format.h): the message of an
// unknown width and the list of the known ones.
#include "qvg/code_format.h"

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg {

void unknown_code_width(int bits) {
  throw InvalidArgument(fmt::format("no code format for {}-bit codes (known: {})", bits, known_code_widths()));
}

std::string known_code_widths(bool as_modes) {
  std::string out;
  for (int i = 0; i < kCodeFormatCount; ++i) {
    if (i > 0) out += i + 1 == kCodeFormatCount ? " or " : ", ";
    out += as_modes ? std::string(kCodeFormats[i].mode) : std::to_string(kCodeFormats[i].bits);
  }
  return out;
}

}  // namespace qvg
