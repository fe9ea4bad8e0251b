#include "qvg/error.h"

#include <cstdio>
#include <cstdlib>

namespace qvg {

void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "qvg: internal check failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace qvg
