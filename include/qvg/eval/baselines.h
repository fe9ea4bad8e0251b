// qvg/eval/baselines.h — the simple quantizers the PRQ codec is compared against.
//
// Every baseline works at the same code width (`bits`) and block size as the codec
// and reports the exact size of the format it would store. A round trip returns
// the decoded tensor (the input's shape and dtype, rounded once to nearest even)
// and that size; nothing is packed in memory, the byte count follows from the
// formats below. All arithmetic is fp32, deterministic and thread-count free.
//
// Formats (B, S, H, D = the input's shape; G = kivi_group_tokens; code bytes are
// always B*S*H*D*bits/8 — every format packs `bits`-wide codes densely along D):
//
//   RTN (method `rtn`): per token, per block of `block_size` consecutive channels of
//     one head, symmetric absmax. qmax = 2^(bits-1) - 1; raw scale
//     s = max(absmax, 1e-10) / qmax, stored as bf16 *rounded up* (toward +inf) so
//     that the grid [-qmax s_eff, qmax s_eff] always covers the block;
//     q = clamp(round_half_away_from_zero(x / s_eff), -qmax, qmax); x' = q * s_eff.
//     Bytes: codes + 2 * B*S*H*(D/block_size) (one bf16 scale per block).
//   KIVI-style (method `kivi`): asymmetric (min/max + zero point), qmax = 2^bits - 1.
//     Key: per channel, over groups of G consecutive tokens of one (b, h) (the last
//       group of a tensor may hold fewer tokens); Value: per token, per block of
//       `block_size` channels. The zero z = min is stored as bf16 *rounded down*,
//       the scale s = max((max - z_eff) / qmax, 1e-10) as bf16 *rounded up*, so the
//       grid [z_eff, z_eff + qmax s_eff] covers every element of the group;
//       code = clamp(round_half_away_from_zero((x - z_eff) / s_eff), 0, qmax);
//       x' = code * s_eff + z_eff.
//     Bytes: codes + 4 * (number of groups): K: B*H*ceil(S/G)*D groups,
//       V: B*S*H*(D/block_size) groups (one bf16 scale + one bf16 zero each).
//     KIVI keeps its newest tokens unquantized; here the cache's keep_recent policy
//     plays that role, so the round trip quantizes every token.
//   QuaRot-style (method `quarot`): each head vector (one token, one head, D channels)
//     is rotated by the orthonormal Walsh-Hadamard matrix H_D / sqrt(D) (D must be a
//     power of two), quantized exactly as RTN in the rotated basis, dequantized and
//     rotated back. The rotation is fixed, so it costs no bytes: the size is RTN's.
//
// Error bounds (what tests check, from the stored values): RTN and KIVI: for every
// element |x - x'| <= s_eff / 2 of its group, plus a few fp32 ulps and half an ulp of
// the output dtype. QuaRot: the same per element *in the rotated basis*, so per head
// vector ||x - x'||_2 <= sqrt(sum over its blocks of block_size * (s_eff/2)^2) plus
// rounding.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "qvg/tensor.h"

namespace qvg {

/// The baseline quantizers. Names (`rtn`, `kivi`, `quarot`) are what CLIs and
/// reports use; the numeric values are not persisted.
enum class BaselineMethod { RTN, KIVI, QuaRot };
/// Which tensor of the cache a round trip quantizes (KIVI treats them differently).
enum class TensorRole { Key, Value };

/// Parameters shared by all baselines.
struct BaselineConfig {
  int bits = 4;                ///< code width: 2, 3, 4 or 8
  int block_size = 64;         ///< channels sharing a scale (RTN, QuaRot, KIVI V); divides D,
                               ///< and block_size * bits is a multiple of 8
  int kivi_group_tokens = 64;  ///< tokens sharing a per-channel scale (KIVI K): >= 1

  /// Throws InvalidArgument naming the field, its value and what is allowed.
  void validate() const;
  /// validate() plus the requirements on head_dim D: block_size divides D (all methods);
  /// D a power of two (QuaRot).
  void validate_for(BaselineMethod m, int64_t head_dim) const;
};

/// The result of one baseline round trip.
struct RoundTrip {
  Tensor decoded;               ///< [B, S, H, D], the input's dtype, rounded nearest even
  size_t nbytes = 0;            ///< exact size of the stored format (see the header comment)
  double bits_per_element = 0;  ///< nbytes * 8 / numel
  /// The stored scales s_eff and zeros z_eff (decoded from bf16) — for error-bound
  /// checks and diagnostics. Layouts, row-major:
  ///   RTN, QuaRot, KIVI value: [B, S, H, D/block_size] (QuaRot: in the rotated basis);
  ///   KIVI key: [B, H, ceil(S/G), D].
  /// `zero` is empty for the symmetric methods (RTN, QuaRot).
  std::vector<float> scale;
  std::vector<float> zero;
};

/// Quantizes and dequantizes x ([B, S, H, D], bf16/f16/f32) with method m.
/// Throws InvalidArgument for an invalid cfg (validate_for), an empty tensor, or
/// non-finite / out-of-limit (|x| > 1e16) elements.
RoundTrip baseline_roundtrip(BaselineMethod m, ConstTensorView x, TensorRole role, const BaselineConfig& cfg);

/// The size in bytes baseline_roundtrip would report for a tensor of `shape`, without
/// any data (the sizes depend only on shape, role and cfg). Validates like the round trip.
size_t baseline_nbytes(BaselineMethod m, Shape4 shape, TensorRole role, const BaselineConfig& cfg);

/// "rtn" | "kivi" | "quarot" (case-sensitive); InvalidArgument listing them otherwise.
BaselineMethod parse_baseline_method(std::string_view s);
std::string_view name(BaselineMethod m);  ///< "rtn" | "kivi" | "quarot"
std::string_view name(TensorRole r);      ///< "key" | "value"
/// Every method, in the order of the enum (for tables and comparisons).
const std::vector<BaselineMethod>& all_baseline_methods();

/// Applies the orthonormal Walsh-Hadamard rotation H_D / sqrt(D) in place to `n`
/// vectors of length d stored contiguously (v: n * d floats). The matrix is symmetric
/// and orthonormal, so applying it twice is the identity up to rounding.
/// REQUIRES: d a power of two (checked: InvalidArgument).
void hadamard_rotate(float* v, int64_t n, int64_t d);

}  // namespace qvg
