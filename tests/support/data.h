// tests/support/data.h — deterministic synthetic K/V-like tensors for tests.
#pragma once

#include <cstdint>

#include "qvg/tensor.h"

namespace qvg::testing {

/// i.i.d. normal(0, sigma) + offset, rounded to dtype.
Tensor random_tensor(Shape4 shape, DType dtype, uint64_t seed, float sigma = 1.0f, float offset = 0.0f);

/// Clustered tokens: per (b, h) `clusters` centres with per-channel offsets up to
/// `offset` and magnitude `scale`, each token a centre plus noise of relative size
/// `noise`; a few tokens (1 in 200) get 8x norm. Mimics the structure k-means exploits.
Tensor clustered_tensor(Shape4 shape, DType dtype, uint64_t seed, int clusters = 16, float scale = 100.0f,
                        float offset = 300.0f, float noise = 0.05f);

}  // namespace qvg::testing
