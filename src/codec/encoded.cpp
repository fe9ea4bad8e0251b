// EncodedTensor: sizes, validation and element accessors (spec 1.5).
#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "core/residual_impl.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {

size_t EncodedTensor::nbytes() const {
  size_t n = codes.size() + scales.size() + zeros.size() + 4 * (scale_factor.size() + zero_factor.size());
  for (const auto& c : centroid) n += c.size();
  for (const auto& i : ids) n += i.size();
  return n;
}

size_t EncodedTensor::predicted_nbytes(Shape4 s, DType dtype, const CodecConfig& cfg) {
  const size_t groups = size_t(s.b * s.h);
  const size_t tokens = groups * size_t(s.s);
  const size_t blocks = tokens * size_t(s.d / cfg.block_size);
  const size_t scale_bytes = cfg.scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 2;
  size_t n = size_t(cfg.stages) * (groups * size_t(cfg.centroids) * size_t(s.d) * dtype_size(dtype) + tokens);
  n += tokens * size_t(s.d) * size_t(cfg.bits) / 8;
  n += blocks * scale_bytes * (cfg.asymmetric ? 2 : 1);
  if (cfg.scaling == Scaling::TwoLevel) n += groups * 4 * (cfg.asymmetric ? 2 : 1);
  return n;
}

double EncodedTensor::bits_per_element() const {
  const double numel = double(shape.numel());
  return numel > 0 ? double(nbytes()) * 8.0 / numel : 0.0;
}

CodecConfig EncodedTensor::config() const {
  CodecConfig c;
  c.bits = bits;
  c.centroids = centroids;
  c.stages = stages;
  c.block_size = block_size;
  c.asymmetric = asymmetric;
  c.scale_dtype = scale_dtype;
  c.scaling = scaling;
  return c;
}

void EncodedTensor::validate() const {
  auto bad = [](const std::string& m) { throw CorruptData("encoded tensor: " + m); };
  if (bits != 2 && bits != 4) bad(fmt::format("bits must be 2 or 4, got {}", bits));
  if (centroids < 1 || centroids > 256) bad(fmt::format("centroids must be in 1..256, got {}", centroids));
  if (stages < 1 || stages > 64) bad(fmt::format("stages must be in 1..64, got {}", stages));
  if (shape.b < 1 || shape.s < 1 || shape.h < 1 || shape.d < 1)
    bad(fmt::format("shape must have positive dimensions, got {}", shape.str()));
  // Bound every dimension so that size arithmetic below cannot overflow.
  constexpr int64_t kMaxDim = int64_t(1) << 31;
  if (shape.b > kMaxDim || shape.s > kMaxDim || shape.h > kMaxDim || shape.d > 65536 ||
      double(shape.b) * double(shape.s) * double(shape.h) * double(shape.d) > 1e15)
    bad(fmt::format("shape {} is too large", shape.str()));
  if (block_size < 1 || shape.d % block_size != 0 || block_size % (8 / bits) != 0)
    bad(fmt::format("block_size {} must divide head_dim {} and be a multiple of {}", block_size, shape.d,
                    8 / bits));
  const size_t groups = size_t(shape.b * shape.h);
  const size_t tokens = groups * size_t(shape.s);
  const size_t blocks = tokens * size_t(shape.d / block_size);
  auto expect = [&](const char* what, size_t got, size_t want) {
    if (got != want) bad(fmt::format("{} has {} bytes, expected {}", what, got, want));
  };
  if (centroid.size() != size_t(stages) || ids.size() != size_t(stages))
    bad(fmt::format("expected {} centroid and id arrays, got {} and {}", stages, centroid.size(), ids.size()));
  const int64_t k_eff = std::min<int64_t>(centroids, shape.s);
  for (int st = 0; st < stages; ++st) {
    expect("centroids", centroid[size_t(st)].size(), groups * size_t(centroids) * size_t(shape.d) * dtype_size(dtype));
    expect("ids", ids[size_t(st)].size(), tokens);
    for (uint8_t id : ids[size_t(st)])
      if (int64_t(id) >= k_eff) bad(fmt::format("ids.{} holds id {} >= {} (min(centroids, tokens))", st, id, k_eff));
  }
  expect("codes", codes.size(), tokens * size_t(shape.d) * size_t(bits) / 8);
  expect("scales", scales.size(), blocks * scale_elem_size());
  expect("zeros", zeros.size(), asymmetric ? blocks * scale_elem_size() : 0);
  const bool two = scaling == Scaling::TwoLevel;
  expect("scale_factor", scale_factor.size() * 4, two ? groups * 4 : 0);
  expect("zero_factor", zero_factor.size() * 4, two && asymmetric ? groups * 4 : 0);
  for (float f : scale_factor)
    if (!(std::isfinite(f) && f > 0)) bad(fmt::format("scale_factor must be finite and > 0, got {}", f));
  for (float f : zero_factor)
    if (!(std::isfinite(f) && f > 0)) bad(fmt::format("zero_factor must be finite and > 0, got {}", f));
}

float EncodedTensor::scale_eff(int64_t b, int64_t h, int64_t s, int64_t blk) const {
  const int64_t g = b * shape.h + h;
  const size_t i = size_t((g * shape.s + s) * blocks_per_token() + blk);
  float v = residual_impl::stored_value(scales.data(), scale_dtype == ScaleDType::FP8_E4M3, int64_t(i));
  float f = scaling == Scaling::TwoLevel ? scale_factor[size_t(g)] : 1.0f;
  return v * f;
}

float EncodedTensor::zero_eff(int64_t b, int64_t h, int64_t s, int64_t blk) const {
  const int64_t g = b * shape.h + h;
  const size_t i = size_t((g * shape.s + s) * blocks_per_token() + blk);
  float v = residual_impl::stored_value(zeros.data(), scale_dtype == ScaleDType::FP8_E4M3, int64_t(i));
  float f = scaling == Scaling::TwoLevel ? zero_factor[size_t(g)] : 1.0f;
  return v * f;
}

float EncodedTensor::centroid_at(int st, int64_t b, int64_t h, int64_t k, int64_t d) const {
  const size_t i = size_t(((b * shape.h + h) * centroids + k) * shape.d + d);
  return load_f32(centroid[size_t(st)].data(), dtype, i);
}

int EncodedTensor::code_at(int64_t b, int64_t h, int64_t s, int64_t d) const {
  const size_t row = size_t(((b * shape.h + h) * shape.s + s) * code_bytes_per_token());
  if (bits == 4) {
    uint8_t byte = codes[row + size_t(d / 2)];
    return (d % 2 == 0) ? (byte >> 4) : (byte & 0xF);
  }
  uint8_t byte = codes[row + size_t(d / 4)];
  return (byte >> (6 - 2 * (d % 4))) & 0x3;
}

}  // namespace qvg
