// Baseline quantizers (RTN, KIVI-style, QuaRot-style): see include/qvg/eval/baselines.h
// for the formats and the error bounds they guarantee.
#include "qvg/eval/baselines.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/core.h>

#include "core/enum_names.h"
#include "core/residual_impl.h"
#include "qvg/error.h"
#include "qvg/numeric.h"

namespace qvg {
namespace {

using residual_impl::kTiny;

// The baselines' own integer quantizers (KIVI-style, any of their widths 2, 3, 4, 8,
// not PRQ codes, so not rows of qvg/code_format.h): qmax of a b-bit code.
int qmax_of(int bits, bool asymmetric) {
  return asymmetric ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
}

/// Smallest bf16 value >= x (x finite, |x| far below the bf16 maximum).
float bf16_round_up(float x) {
  uint16_t b = f32_to_bf16(x);
  float v = bf16_to_f32(b);
  if (v >= x) return v;
  // v < x: step one ulp toward +inf. Positive v grows with b + 1, negative v shrinks
  // in magnitude with b - 1; v == 0 means x is a positive value below half the
  // smallest bf16 subnormal, whose successor is that subnormal.
  if (v == 0.0f) return bf16_to_f32(0x0001);
  return bf16_to_f32(v > 0 ? uint16_t(b + 1) : uint16_t(b - 1));
}

/// Largest bf16 value <= x.
float bf16_round_down(float x) {
  uint16_t b = f32_to_bf16(x);
  float v = bf16_to_f32(b);
  if (v <= x) return v;
  if (v == 0.0f) return bf16_to_f32(0x8001);
  return bf16_to_f32(v > 0 ? uint16_t(b - 1) : uint16_t(b + 1));
}

/// round_half_away_from_zero(v) clamped to [lo, hi], as a float. Not
/// residual_impl::round_clamp (the integer code): this keeps the sign of a zero, and
/// the decoded baseline tensors have always held -0.0 where a negative value rounds
/// to 0 (an int code would decode to +0.0 and change their bytes).
float round_clamp(float v, float lo, float hi) {
  float r = std::round(v);  // half away from zero
  return std::clamp(r, lo, hi);
}

bool is_pow2(int64_t d) {
  return d > 0 && (d & (d - 1)) == 0;
}

/// RTN on one block of n values in place; returns s_eff.
float rtn_block(float* x, int64_t n, int qmax) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  const float s_eff = bf16_round_up(std::max(absmax, kTiny) / float(qmax));
  const float q = float(qmax);
  for (int64_t i = 0; i < n; ++i) x[i] = round_clamp(x[i] / s_eff, -q, q) * s_eff;
  return s_eff;
}

/// Asymmetric scale and zero of a group with extremes [lo, hi]: {s_eff, z_eff}.
std::pair<float, float> asym_params(float lo, float hi, int qmax) {
  const float z_eff = bf16_round_down(lo);
  const float s_eff = bf16_round_up(std::max((hi - z_eff) / float(qmax), kTiny));
  return {s_eff, z_eff};
}

float asym_roundtrip(float x, float s_eff, float z_eff, int qmax) {
  return round_clamp((x - z_eff) / s_eff, 0.0f, float(qmax)) * s_eff + z_eff;
}

void check_input(BaselineMethod m, ConstTensorView x, const BaselineConfig& cfg) {
  const Shape4& s = x.shape;
  if (s.b < 1 || s.s < 1 || s.h < 1 || s.d < 1)
    throw InvalidArgument(
        fmt::format("baseline {}: x must have positive dimensions [B, S, H, D], got {}", name(m), s.str()));
  if (x.data == nullptr) throw InvalidArgument(fmt::format("baseline {}: x has no data (null pointer)", name(m)));
  cfg.validate_for(m, s.d);
  check_finite_and_bounded(x, "x");
}

}  // namespace

void BaselineConfig::validate() const {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
    throw InvalidArgument(fmt::format("baseline bits must be 2, 3, 4 or 8, got {}", bits));
  // Codes fill whole bytes: block_size * bits a multiple of 8 (3 bits: blocks of 8).
  const int per = bits == 3 ? 8 : 8 / bits;
  if (block_size < 1 || (block_size * bits) % 8 != 0)
    throw InvalidArgument(
        fmt::format("baseline block_size must be a positive multiple of {} (block_size * bits a multiple of 8), got {}",
                    per, block_size));
  if (kivi_group_tokens < 1)
    throw InvalidArgument(fmt::format("baseline kivi_group_tokens must be >= 1, got {}", kivi_group_tokens));
}

void BaselineConfig::validate_for(BaselineMethod m, int64_t head_dim) const {
  validate();
  if (head_dim < 1 || head_dim % block_size != 0)
    throw InvalidArgument(
        fmt::format("baseline block_size {} must divide head_dim, got head_dim {}", block_size, head_dim));
  if (m == BaselineMethod::QuaRot && !is_pow2(head_dim))
    throw InvalidArgument(fmt::format(
        "baseline quarot needs head_dim a power of two (Walsh-Hadamard rotation), got head_dim {}", head_dim));
}

namespace {
constexpr detail::EnumName<BaselineMethod> kMethods[] = {
    {BaselineMethod::RTN, "rtn"}, {BaselineMethod::KIVI, "kivi"}, {BaselineMethod::QuaRot, "quarot"}};
constexpr detail::EnumName<TensorRole> kRoles[] = {{TensorRole::Key, "key"}, {TensorRole::Value, "value"}};
}  // namespace

std::string_view name(BaselineMethod m) { return detail::name_in(kMethods, m); }
std::string_view name(TensorRole r) { return detail::name_in(kRoles, r); }

BaselineMethod parse_baseline_method(std::string_view s) {
  return detail::parse_in(kMethods, s, "baseline method", "rtn, kivi, quarot");
}

const std::vector<BaselineMethod>& all_baseline_methods() {
  static const std::vector<BaselineMethod> v{BaselineMethod::RTN, BaselineMethod::KIVI, BaselineMethod::QuaRot};
  return v;
}

void hadamard_rotate(float* v, int64_t n, int64_t d) {
  if (!is_pow2(d)) throw InvalidArgument(fmt::format("hadamard_rotate: d must be a power of two, got {}", d));
  // H_d / sqrt(d): an exact power of two when log2(d) is even, else one rounding.
  const float norm = float(1.0 / std::sqrt(double(d)));
  for (int64_t r = 0; r < n; ++r) {
    float* x = v + r * d;
    for (int64_t len = 1; len < d; len <<= 1) {
      for (int64_t i = 0; i < d; i += 2 * len) {
        for (int64_t j = i; j < i + len; ++j) {
          const float a = x[j], b = x[j + len];
          x[j] = a + b;
          x[j + len] = a - b;
        }
      }
    }
    for (int64_t j = 0; j < d; ++j) x[j] *= norm;
  }
}

size_t baseline_nbytes(BaselineMethod m, Shape4 s, TensorRole role, const BaselineConfig& cfg) {
  if (s.b < 1 || s.s < 1 || s.h < 1 || s.d < 1)
    throw InvalidArgument(
        fmt::format("baseline {}: shape must have positive dimensions [B, S, H, D], got {}", name(m), s.str()));
  cfg.validate_for(m, s.d);
  const size_t numel = size_t(s.numel());
  const size_t codes = numel * size_t(cfg.bits) / 8;
  const size_t token_blocks = size_t(s.b * s.s * s.h) * size_t(s.d / cfg.block_size);
  if (m == BaselineMethod::KIVI) {
    if (role == TensorRole::Key) {
      const size_t groups =
          size_t(s.b * s.h) * size_t((s.s + cfg.kivi_group_tokens - 1) / cfg.kivi_group_tokens) * size_t(s.d);
      return codes + 4 * groups;
    }
    return codes + 4 * token_blocks;
  }
  return codes + 2 * token_blocks;  // RTN and QuaRot: one bf16 scale per block
}

RoundTrip baseline_roundtrip(BaselineMethod m, ConstTensorView x, TensorRole role, const BaselineConfig& cfg) {
  check_input(m, x, cfg);
  const Shape4 sh = x.shape;
  const int64_t D = sh.d, bs = cfg.block_size, nblk = D / bs;
  const int64_t rows = sh.b * sh.s * sh.h;  // one row = one (b, s, h) head vector
  std::vector<float> buf(size_t(sh.numel()));
  convert_to_f32(x.data, x.dtype, buf.data(), buf.size());

  RoundTrip rt;
  const bool kivi_key = m == BaselineMethod::KIVI && role == TensorRole::Key;
  if (kivi_key) {
    // Per channel over groups of G tokens of one (b, h). Element (b, s, h, d) lives at
    // ((b * S + s) * H + h) * D + d.
    const int qmax = qmax_of(cfg.bits, true);
    const int64_t G = cfg.kivi_group_tokens, ng = (sh.s + G - 1) / G;
    rt.scale.assign(size_t(sh.b * sh.h * ng * D), 0.0f);
    rt.zero.assign(rt.scale.size(), 0.0f);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < sh.b; ++b) {
      for (int64_t h = 0; h < sh.h; ++h) {
        std::vector<float> lo(static_cast<size_t>(D)), hi(static_cast<size_t>(D));
        for (int64_t g = 0; g < ng; ++g) {
          const int64_t t0 = g * G, t1 = std::min(sh.s, t0 + G);
          std::fill(lo.begin(), lo.end(), std::numeric_limits<float>::infinity());
          std::fill(hi.begin(), hi.end(), -std::numeric_limits<float>::infinity());
          for (int64_t t = t0; t < t1; ++t) {
            const float* row = buf.data() + ((b * sh.s + t) * sh.h + h) * D;
            for (int64_t d = 0; d < D; ++d) {
              lo[size_t(d)] = std::min(lo[size_t(d)], row[d]);
              hi[size_t(d)] = std::max(hi[size_t(d)], row[d]);
            }
          }
          const size_t base = size_t(((b * sh.h + h) * ng + g) * D);
          for (int64_t d = 0; d < D; ++d) {
            auto [s_eff, z_eff] = asym_params(lo[size_t(d)], hi[size_t(d)], qmax);
            rt.scale[base + size_t(d)] = s_eff;
            rt.zero[base + size_t(d)] = z_eff;
          }
          for (int64_t t = t0; t < t1; ++t) {
            float* row = buf.data() + ((b * sh.s + t) * sh.h + h) * D;
            for (int64_t d = 0; d < D; ++d)
              row[d] = asym_roundtrip(row[d], rt.scale[base + size_t(d)], rt.zero[base + size_t(d)], qmax);
          }
        }
      }
    }
  } else if (m == BaselineMethod::KIVI) {
    // Value: per token, per block, asymmetric.
    const int qmax = qmax_of(cfg.bits, true);
    rt.scale.assign(size_t(rows * nblk), 0.0f);
    rt.zero.assign(rt.scale.size(), 0.0f);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < nblk; ++k) {
        float* blk = buf.data() + r * D + k * bs;
        float lo = blk[0], hi = blk[0];
        for (int64_t i = 1; i < bs; ++i) {
          lo = std::min(lo, blk[i]);
          hi = std::max(hi, blk[i]);
        }
        auto [s_eff, z_eff] = asym_params(lo, hi, qmax);
        rt.scale[size_t(r * nblk + k)] = s_eff;
        rt.zero[size_t(r * nblk + k)] = z_eff;
        for (int64_t i = 0; i < bs; ++i) blk[i] = asym_roundtrip(blk[i], s_eff, z_eff, qmax);
      }
    }
  } else {
    // RTN, or QuaRot = rotate, RTN, rotate back.
    const int qmax = qmax_of(cfg.bits, false);
    const bool rotate = m == BaselineMethod::QuaRot;
    rt.scale.assign(size_t(rows * nblk), 0.0f);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* row = buf.data() + r * D;
      if (rotate) hadamard_rotate(row, 1, D);
      for (int64_t k = 0; k < nblk; ++k) rt.scale[size_t(r * nblk + k)] = rtn_block(row + k * bs, bs, qmax);
      if (rotate) hadamard_rotate(row, 1, D);
    }
  }

  rt.decoded = Tensor(x.dtype, sh);
  convert_from_f32(buf.data(), x.dtype, rt.decoded.data(), buf.size());
  rt.nbytes = baseline_nbytes(m, sh, role, cfg);
  rt.bits_per_element = double(rt.nbytes) * 8.0 / double(sh.numel());
  return rt;
}

}  // namespace qvg
