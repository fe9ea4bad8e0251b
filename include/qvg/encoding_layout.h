// qvg/encoding_layout.h — what an encoded tensor is made of (spec 1.5), computed
// once: the nine metadata fields of an encoding and, derived from them, every
// array's name, element type, logical shape and size.
//
// EncodedTensor (host, qvg/codec.h) and DeviceEncodedTensor (device, qvg/cuda.h)
// both are an EncodingLayout plus storage; the encoder allocates from it, the
// decoder, the `.qvgt` reader and writer, validation, the device allocation and
// transfers and the memory model (predicted sizes) all read it from here, so the
// layout of spec 1.5 is written in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qvg/config.h"
#include "qvg/tensor.h"

namespace qvg {

/// The arrays of spec 1.5, in their order.
enum class EncodedArray : uint8_t { Centroids, Ids, Codes, Scales, Zeros, ScaleFactor, ZeroFactor };

/// Element type of an array: the input dtype (centroids), uint8 (ids, codes), the
/// scale format (scales, zeros: fp8 e4m3 bytes or bf16) or fp32 (factors).
enum class ArrayElem : uint8_t { Input, U8, Scale, F32 };

/// One array of an encoding. Shapes are the logical ones of spec 1.5.
struct ArrayDesc {
  EncodedArray kind = EncodedArray::Codes;
  int stage = 0;  ///< centroids and ids: the stage; 0 for the others
  ArrayElem elem = ArrayElem::U8;
  size_t elem_size = 1;         ///< bytes per element
  std::vector<int64_t> shape;   ///< e.g. [B, H, K, D] for centroids, [B, H] for factors
  std::string name() const;     ///< "centroids.<s>", "ids.<s>", "codes", "scales", "zeros", ...
  /// product(shape) * elem_size. REQUIRES a layout that passed check() (no overflow).
  size_t bytes() const;
};

/// The metadata of one encoding (spec 1.5, the `.qvgt` metadata of spec 1.6) and
/// everything derived from it: the stored codec fields (StoredCodec, qvg/config.h),
/// the input dtype and shape. A value type; comparisons compare the nine fields.
struct EncodingLayout : StoredCodec {
  DType dtype = DType::BF16;  ///< input dtype; centroids are stored in it
  Shape4 shape;               ///< [B, S, H, D] of the input

  /// The layout of an encoding of `shape` in `dtype` with cfg (no validation).
  static EncodingLayout of(Shape4 shape, DType dtype, const CodecConfig& cfg);
  /// The codec parameters of this layout (seed, init, iters, threads: defaults).
  CodecConfig config() const;

  int64_t groups() const { return shape.b * shape.h; }
  int64_t blocks_per_token() const { return shape.d / block_size; }
  /// D * bits / 8 (spec 1.5), exact: D is a multiple of the width's code group.
  int64_t code_bytes_per_token() const { return shape.d * bits / 8; }
  size_t scale_elem_size() const { return scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 2; }
  bool two_level() const { return scaling == Scaling::TwoLevel; }

  /// The arrays an encoding with this layout holds, in spec 1.5 order: centroids.0..,
  /// ids.0.., codes, scales, zeros (asymmetric), scale_factor (two_level),
  /// zero_factor (two_level and asymmetric). Shapes only: safe on unchecked values.
  std::vector<ArrayDesc> arrays() const;
  /// The sum of the arrays' bytes (the encoded size of spec 1.5).
  /// REQUIRES a layout that passed check() (or values known to be in range).
  size_t total_bytes() const;

  /// Throws CorruptData ("encoded tensor: ...") unless bits, centroids, stages,
  /// block_size and shape are in range and consistent (block_size divides D and is a
  /// multiple of the width's code group (qvg/code_format.h); every dimension >= 1 and small enough that no size
  /// computed from them can overflow).
  void check() const;

  bool operator==(const EncodingLayout&) const = default;
};

}  // namespace qvg
