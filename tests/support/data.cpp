#include "support/data.h"

#include <cstring>
#include <random>
#include <vector>

namespace qvg::testing {

Tensor random_tensor(Shape4 shape, DType dtype, uint64_t seed, float sigma, float offset) {
  Tensor t(dtype, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, sigma);
  const size_t N = size_t(shape.numel());
  for (size_t i = 0; i < N; ++i) store_f32(t.data(), dtype, i, n(rng) + offset);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

Tensor clustered_tensor(Shape4 shape, DType dtype, uint64_t seed, int clusters, float scale, float offset,
                        float noise) {
  Tensor t(dtype, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t D = shape.d;
  std::vector<float> centres(static_cast<size_t>(clusters * D)), chan(static_cast<size_t>(D));
  for (int64_t b = 0; b < shape.b; ++b)
    for (int64_t h = 0; h < shape.h; ++h) {
      for (int64_t d = 0; d < D; ++d) chan[size_t(d)] = offset * u(rng);
      for (auto& c : centres) c = scale * n(rng);
      for (int64_t s = 0; s < shape.s; ++s) {
        // Runs of neighbouring tokens share a cluster (spatial redundancy).
        const int c = int((s / 7 + int64_t(rng() % 3)) % clusters);
        const float boost = (rng() % 200 == 0) ? 8.0f : 1.0f;
        for (int64_t d = 0; d < D; ++d) {
          float v = chan[size_t(d)] + boost * (centres[size_t(c * D + d)] + noise * scale * n(rng));
          t.set(b, s, h, d, v);
        }
      }
    }
  return t;
}

}  // namespace qvg::testing
