// tests/support/data.h — deterministic synthetic K/V-like tensors for tests.
#pragma once

#include <cstdint>
#include <random>

#include "qvg/tensor.h"

namespace qvg::testing {

/// i.i.d. normal(0, sigma) + offset, rounded to dtype.
Tensor random_tensor(Shape4 shape, DType dtype, uint64_t seed, float sigma = 1.0f, float offset = 0.0f);

/// i.i.d. uniform in [-amp, amp] drawn from a test's one stream `rng` (b, s, h, d
/// order), rounded to dtype. Inline: tests/gpu builds tests/support/cache_model.cpp,
/// which uses it, without this library.
inline Tensor random_tensor(std::mt19937_64& rng, DType dt, Shape4 shape, float amp = 2.0f) {
  Tensor t(dt, shape);
  std::uniform_real_distribution<float> u(-amp, amp);
  for (int64_t b = 0; b < shape.b; ++b)
    for (int64_t s = 0; s < shape.s; ++s)
      for (int64_t h = 0; h < shape.h; ++h)
        for (int64_t d = 0; d < shape.d; ++d) t.set(b, s, h, d, u(rng));
  return t;
}

/// Same dtype, shape and bytes.
bool same_bytes(const Tensor& a, const Tensor& b);

/// Clustered tokens: per (b, h) `clusters` centres with per-channel offsets up to
/// `offset` and magnitude `scale`, each token a centre plus noise of relative size
/// `noise`; a few tokens (1 in 200) get 8x norm. Mimics the structure k-means exploits.
Tensor clustered_tensor(Shape4 shape, DType dtype, uint64_t seed, int clusters = 16, float scale = 100.0f,
                        float offset = 300.0f, float noise = 0.05f);

}  // namespace qvg::testing
