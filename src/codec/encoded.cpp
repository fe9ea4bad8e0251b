// EncodedTensor: sizes, validation and element accessors (spec 1.5).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include <fmt/core.h>

#include "core/residual_impl.h"
#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg {

EncodedTensor EncodedTensor::allocate(const EncodingLayout& layout) {
  EncodedTensor e;
  static_cast<EncodingLayout&>(e) = layout;
  e.centroid.resize(size_t(layout.stages));
  e.ids.resize(size_t(layout.stages));
  for (const ArrayDesc& a : layout.arrays()) {
    const size_t n = a.bytes();
    switch (a.kind) {
      case EncodedArray::Centroids: e.centroid[size_t(a.stage)].assign(n, 0); break;
      case EncodedArray::Ids: e.ids[size_t(a.stage)].assign(n, 0); break;
      case EncodedArray::Codes: e.codes.assign(n, 0); break;
      case EncodedArray::Scales: e.scales.assign(n, 0); break;
      case EncodedArray::Zeros: e.zeros.assign(n, 0); break;
      case EncodedArray::ScaleFactor: e.scale_factor.assign(n / 4, 1.0f); break;
      case EncodedArray::ZeroFactor: e.zero_factor.assign(n / 4, 1.0f); break;
    }
  }
  return e;
}

EncodedTensor EncodedTensor::codebooks_only() const {
  EncodedTensor w;
  static_cast<EncodingLayout&>(w) = layout();
  w.centroid = centroid;
  return w;
}

namespace {
template <class T>
auto as_bytes_of(T& v) {
  using B = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  return std::span<B>(reinterpret_cast<B*>(v.data()), v.size() * sizeof(v[0]));
}
}  // namespace

std::span<const uint8_t> EncodedTensor::array(const ArrayDesc& a) const {
  return const_cast<EncodedTensor*>(this)->array(a);
}

std::span<uint8_t> EncodedTensor::array(const ArrayDesc& a) {
  const size_t st = size_t(a.stage);
  switch (a.kind) {
    case EncodedArray::Centroids: return st < centroid.size() ? as_bytes_of(centroid[st]) : std::span<uint8_t>();
    case EncodedArray::Ids: return st < ids.size() ? as_bytes_of(ids[st]) : std::span<uint8_t>();
    case EncodedArray::Codes: return as_bytes_of(codes);
    case EncodedArray::Scales: return as_bytes_of(scales);
    case EncodedArray::Zeros: return as_bytes_of(zeros);
    case EncodedArray::ScaleFactor: return as_bytes_of(scale_factor);
    case EncodedArray::ZeroFactor: return as_bytes_of(zero_factor);
  }
  return {};
}

size_t EncodedTensor::nbytes() const {
  size_t n = codes.size() + scales.size() + zeros.size() + 4 * (scale_factor.size() + zero_factor.size());
  for (const auto& c : centroid) n += c.size();
  for (const auto& i : ids) n += i.size();
  return n;
}

size_t EncodedTensor::predicted_nbytes(Shape4 s, DType dtype, const CodecConfig& cfg) {
  return EncodingLayout::of(s, dtype, cfg).total_bytes();
}

double EncodedTensor::bits_per_element() const {
  const double numel = double(shape.numel());
  return numel > 0 ? double(nbytes()) * 8.0 / numel : 0.0;
}

void EncodedTensor::validate() const {
  auto bad = [](const std::string& m) { throw CorruptData("encoded tensor: " + m); };
  check();
  if (centroid.size() != size_t(stages) || ids.size() != size_t(stages))
    bad(fmt::format("expected {} centroid and id arrays, got {} and {}", stages, centroid.size(), ids.size()));
  const std::vector<ArrayDesc> arrs = arrays();
  const int64_t k_eff = std::min<int64_t>(centroids, shape.s);
  for (const ArrayDesc& a : arrs) {
    const size_t got = array(a).size(), want = a.bytes();
    if (got != want) {
      const std::string what = a.kind == EncodedArray::Centroids ? "centroids"
                               : a.kind == EncodedArray::Ids     ? "ids"
                                                                 : a.name();
      bad(fmt::format("{} has {} bytes, expected {}", what, got, want));
    }
    if (a.kind == EncodedArray::Ids)
      for (uint8_t id : ids[size_t(a.stage)])
        if (int64_t(id) >= k_eff)
          bad(fmt::format("ids.{} holds id {} >= {} (min(centroids, tokens))", a.stage, id, k_eff));
  }
  // Arrays the layout does not have must be empty.
  const bool has_zeros = asymmetric, has_sf = two_level(), has_zf = two_level() && asymmetric;
  if (!has_zeros && !zeros.empty()) bad(fmt::format("zeros has {} bytes, expected 0", zeros.size()));
  if (!has_sf && !scale_factor.empty())
    bad(fmt::format("scale_factor has {} bytes, expected 0", scale_factor.size() * 4));
  if (!has_zf && !zero_factor.empty())
    bad(fmt::format("zero_factor has {} bytes, expected 0", zero_factor.size() * 4));
  for (float f : scale_factor)
    if (!(std::isfinite(f) && f > 0)) bad(fmt::format("scale_factor must be finite and > 0, got {}", f));
  for (float f : zero_factor)
    if (!(std::isfinite(f) && f > 0)) bad(fmt::format("zero_factor must be finite and > 0, got {}", f));
}

void EncodedTensor::validate_values() const {
  auto bad = [](const std::string& m) { throw CorruptData("encoded tensor: " + m); };
  const int64_t G = groups(), S = shape.s, K = centroids, D = shape.d, nb = blocks_per_token();
  const bool fp8 = scale_dtype == ScaleDType::FP8_E4M3;
  const int qmax = residual_impl::qmax_of(bits, asymmetric);
  // Largest magnitude of each group's stage-sum of centroids, scales and zeros.
  std::vector<double> cent(size_t(G), 0.0), smax(size_t(G), 0.0), zmax(size_t(G), 0.0);
  for (size_t s = 0; s < centroid.size(); ++s)
    for (int64_t g = 0; g < G; ++g) {
      double m = 0;
      for (int64_t i = g * K * D; i < (g + 1) * K * D; ++i) {
        const float v = load_f32(centroid[s].data(), dtype, size_t(i));
        if (!std::isfinite(v)) bad(fmt::format("centroids.{} holds a non-finite value at element {}", s, i));
        m = std::max(m, std::fabs(double(v)));
      }
      cent[size_t(g)] += m;
    }
  for (const std::vector<uint8_t>* arr : {&scales, &zeros}) {
    const bool is_scale = arr == &scales;
    if (arr->empty()) continue;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = g * S * nb; i < (g + 1) * S * nb; ++i) {
        const float v = residual_impl::stored_value(arr->data(), fp8, i);
        if (!std::isfinite(v) || (is_scale && std::signbit(v)))
          bad(fmt::format("{} holds {} at element {} ({})", is_scale ? "scales" : "zeros", v, i,
                          is_scale ? "scales are finite and >= 0" : "zeros are finite"));
        double& m = is_scale ? smax[size_t(g)] : zmax[size_t(g)];
        m = std::max(m, std::fabs(double(v)));
      }
  }
  for (const std::vector<float>* fv : {&scale_factor, &zero_factor})
    for (size_t g = 0; g < fv->size(); ++g) {
      const char* what = fv == &scale_factor ? "scale_factor" : "zero_factor";
      const float f = (*fv)[g];  // finite and > 0 (validate())
      if (!fp8 && f != 1.0f) bad(fmt::format("{} holds {} at group {}; with bf16 scales every factor is 1", what, f, g));
      (fv == &scale_factor ? smax : zmax)[g] *= double(f);
    }
  if (!asymmetric) {
    // Symmetric codes are q + qmax with |q| <= qmax: at most 2 * qmax. Read group by
    // group (spec 1.5: G codes in B bytes); a bad code is reported by its group's first byte.
    const int max_code = 2 * qmax;
    dispatch_width(bits, [&](auto w) {
      using W = decltype(w);
      for (size_t i = 0; i + W::kGroupBytes <= codes.size(); i += W::kGroupBytes) {
        const uint32_t v = group_value<W>(codes.data() + i);
        for (int j = 0; j < W::kGroupCodes; ++j)
          if (int((v >> W::shift(j)) & W::kMask) > max_code)
            bad(fmt::format("codes byte {} holds a symmetric int{} code above {}", i, bits, max_code));
      }
    });
  }
  for (int64_t g = 0; g < G; ++g) {
    const double bound = cent[size_t(g)] + double(qmax) * smax[size_t(g)] + zmax[size_t(g)];
    if (!(bound <= kMaxDecodedMagnitude))
      bad(fmt::format("group {} decodes to magnitudes up to {:.4g} (centroids {:.4g}, residual scales {:.4g}), above "
                      "the {:g} that keeps every decoded value finite",
                      g, bound, cent[size_t(g)], smax[size_t(g)], kMaxDecodedMagnitude));
  }
}

namespace {
/// Effective value (spec 1.4) of element (b, h, s, blk) of a scale or zero array
/// with its per-group factors (empty with compat scaling: factor 1).
float effective_of(const EncodedTensor& e, const std::vector<uint8_t>& arr, const std::vector<float>& factor,
                   int64_t b, int64_t h, int64_t s, int64_t blk) {
  const int64_t g = b * e.shape.h + h;
  const int64_t i = (g * e.shape.s + s) * e.blocks_per_token() + blk;
  const float v = residual_impl::stored_value(arr.data(), e.scale_dtype == ScaleDType::FP8_E4M3, i);
  return residual_impl::effective(v, e.two_level() ? factor[size_t(g)] : 1.0f);
}
}  // namespace

float EncodedTensor::scale_eff(int64_t b, int64_t h, int64_t s, int64_t blk) const {
  return effective_of(*this, scales, scale_factor, b, h, s, blk);
}
float EncodedTensor::zero_eff(int64_t b, int64_t h, int64_t s, int64_t blk) const {
  return effective_of(*this, zeros, zero_factor, b, h, s, blk);
}

float EncodedTensor::centroid_at(int st, int64_t b, int64_t h, int64_t k, int64_t d) const {
  const size_t i = size_t(((b * shape.h + h) * centroids + k) * shape.d + d);
  return load_f32(centroid[size_t(st)].data(), dtype, i);
}

int EncodedTensor::code_at(int64_t b, int64_t h, int64_t s, int64_t d) const {
  const size_t row = size_t(((b * shape.h + h) * shape.s + s) * code_bytes_per_token());
  return residual_impl::code_of_row(codes.data() + row, bits, d);
}

}  // namespace qvg
