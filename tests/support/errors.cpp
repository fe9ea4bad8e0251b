#include "support/errors.h"

namespace qvg::testing {

std::string kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::InvalidArgument: return "InvalidArgument";
    case ErrorKind::Unsupported: return "Unsupported";
    case ErrorKind::OutOfRange: return "OutOfRange";
    case ErrorKind::CorruptData: return "CorruptData";
    case ErrorKind::Device: return "Device";
  }
  return "?";
}

}  // namespace qvg::testing
