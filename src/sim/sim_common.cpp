// Helpers shared by src/sim (see sim_common.h).
#include "sim/sim_common.h"

#include <cmath>
#include <cstring>

#include <fmt/core.h>

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
