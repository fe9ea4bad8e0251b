// qvg/eval/error_sums.h — the error measures the experiments share
// (qvg/eval/simulate.h, qvg/eval/compare.h, qvg/eval/frontier.h): reconstruction and
// attention error, kept as sums so that layers and chunks pool exactly.
// Errors: every entry point validates its configuration first and throws
// InvalidArgument naming the field, its value and what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qvg/tensor.h"

namespace qvg {

// ---------------------------------------------------------------------------
// Error sums: kept as sums so that layers and chunks pool exactly.

/// Reconstruction error of one tensor over a set of elements.
struct ErrorSums {
  double err = 0;      ///< sum of (x - x')^2
  double ref = 0;      ///< sum of x^2
  int64_t tokens = 0;  ///< tokens (rows of all heads) the sums cover
  void add(const ErrorSums& o) { err += o.err, ref += o.ref, tokens += o.tokens; }
  /// err / ref; nullopt when no tokens were compared or ref == 0.
  std::optional<double> rel_mse() const;
  /// -10 log10(rel_mse); nullopt when rel_mse is absent or 0 (identical).
  std::optional<double> snr_db() const;
};

/// Attention output error of one view against the reference output.
struct AttentionSums {
  double err = 0;       ///< sum over outputs of ||o - o_ref||^2
  double ref = 0;       ///< sum over outputs of ||o_ref||^2
  double cos_sum = 0;   ///< sum over (query, head) vectors of cos(o, o_ref)
  double cos_min = 1;   ///< smallest cosine of any (query, head) vector
  int64_t vectors = 0;  ///< (query, head) vectors compared
  void add(const AttentionSums& o);
  double rel_l2() const;  ///< sqrt(err / ref); 0 when ref == 0
  double cosine() const;  ///< cos_sum / vectors (mean cosine); 1 when empty
};

/// Accumulates the error of `out` against `ref` (both fp32 [B, n, H, D], same shape).
/// A zero vector has cosine 1 against a zero vector and 0 against anything else.
AttentionSums attention_error(const Tensor& out, const Tensor& ref);

}  // namespace qvg
