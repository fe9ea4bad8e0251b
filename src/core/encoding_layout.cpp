// EncodingLayout: the arrays of spec 1.5 derived from an encoding's metadata.
#include "qvg/encoding_layout.h"

#include <fmt/core.h>

#include "qvg/code_format.h"
#include "qvg/error.h"

namespace qvg {

std::string ArrayDesc::name() const {
  switch (kind) {
    case EncodedArray::Centroids: return fmt::format("centroids.{}", stage);
    case EncodedArray::Ids: return fmt::format("ids.{}", stage);
    case EncodedArray::Codes: return "codes";
    case EncodedArray::Scales: return "scales";
    case EncodedArray::Zeros: return "zeros";
    case EncodedArray::ScaleFactor: return "scale_factor";
    case EncodedArray::ZeroFactor: return "zero_factor";
  }
  return "?";
}

size_t ArrayDesc::bytes() const {
  size_t n = elem_size;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

EncodingLayout EncodingLayout::of(Shape4 shape, DType dtype, const CodecConfig& cfg) {
  EncodingLayout l;
  static_cast<StoredCodec&>(l) = cfg;
  l.dtype = dtype;
  l.shape = shape;
  return l;
}

CodecConfig EncodingLayout::config() const {
  CodecConfig c;
  static_cast<StoredCodec&>(c) = *this;
  return c;
}

std::vector<ArrayDesc> EncodingLayout::arrays() const {
  const Shape4& x = shape;
  const size_t ssz = scale_elem_size();
  std::vector<ArrayDesc> r;
  r.reserve(size_t(2 * stages + 5));
  for (int s = 0; s < stages; ++s)
    r.push_back({EncodedArray::Centroids, s, ArrayElem::Input, dtype_size(dtype), {x.b, x.h, centroids, x.d}});
  for (int s = 0; s < stages; ++s) r.push_back({EncodedArray::Ids, s, ArrayElem::U8, 1, {x.b, x.h, x.s}});
  // D * bits / 8 as whole groups (code_bytes): no overflow, and exact once block_size
  // (a multiple of the group) divides D. An unknown width (unchecked values) gives 0.
  const CodeFormat* f = find_code_format(bits);
  r.push_back({EncodedArray::Codes, 0, ArrayElem::U8, 1, {x.b, x.h, x.s, f ? code_bytes(*f, x.d) : 0}});
  const int64_t blocks = block_size > 0 ? x.d / block_size : 0;
  r.push_back({EncodedArray::Scales, 0, ArrayElem::Scale, ssz, {x.b, x.h, x.s, blocks}});
  if (asymmetric) r.push_back({EncodedArray::Zeros, 0, ArrayElem::Scale, ssz, {x.b, x.h, x.s, blocks}});
  if (two_level()) {
    r.push_back({EncodedArray::ScaleFactor, 0, ArrayElem::F32, 4, {x.b, x.h}});
    if (asymmetric) r.push_back({EncodedArray::ZeroFactor, 0, ArrayElem::F32, 4, {x.b, x.h}});
  }
  return r;
}

size_t EncodingLayout::total_bytes() const {
  size_t n = 0;
  for (const ArrayDesc& a : arrays()) n += a.bytes();
  return n;
}

void EncodingLayout::check() const {
  auto bad = [](const std::string& m) { throw CorruptData("encoded tensor: " + m); };
  const CodeFormat* f = find_code_format(bits);
  if (!f) bad(fmt::format("bits must be {}, got {}", known_code_widths(), bits));
  if (centroids < 1 || centroids > 256) bad(fmt::format("centroids must be in 1..256, got {}", centroids));
  if (stages < 1 || stages > kMaxStages) bad(fmt::format("stages must be in 1..{}, got {}", kMaxStages, stages));
  if (shape.b < 1 || shape.s < 1 || shape.h < 1 || shape.d < 1)
    bad(fmt::format("shape must have positive dimensions, got {}", shape.str()));
  // Bound every dimension so that no size computed from them can overflow.
  constexpr int64_t kMaxDim = int64_t(1) << 31;
  if (shape.b > kMaxDim || shape.s > kMaxDim || shape.h > kMaxDim || shape.d > 65536 ||
      double(shape.b) * double(shape.s) * double(shape.h) * double(shape.d) > 1e15)
    bad(fmt::format("shape {} is too large", shape.str()));
  if (block_size < 1 || shape.d % block_size != 0 || block_size % f->group_codes != 0)
    bad(fmt::format("block_size {} must divide head_dim {} and be a multiple of {}", block_size, shape.d,
                    f->group_codes));
}

}  // namespace qvg
