// src/kernels/cuda/host.h — helpers of the CUDA backend's host code (C++20; the .cu
// files do not include it).
#pragma once

#include <cstdint>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"
#include "qvg/encoding_layout.h"
#include "qvg/tensor.h"

namespace qvg::cuda {

/// qvg::DType as the kernels' small integer (cuda_arith::kBF16 / kF16 / kF32).
inline int arith_dtype(DType t) {
  static_assert(int(DType::BF16) == cuda_arith::kBF16 && int(DType::F16) == cuda_arith::kF16 &&
                int(DType::F32) == cuda_arith::kF32);
  return int(t);
}

/// Where the arrays of one encoding are (device memory, or host memory for the host
/// tests of the kernel bodies). Stages contiguous, as in DeviceEncodedTensor.
struct EncodedArrays {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zeros = nullptr;         ///< asymmetric only
  const float* scale_factor = nullptr;    ///< two_level only
  const float* zero_factor = nullptr;     ///< two_level and asymmetric only
  const uint8_t* ids = nullptr;           ///< stage 0
  const uint8_t* centroid = nullptr;      ///< stage 0
};

/// The decode kernel's arguments for an encoding with `layout` at `a`: arrays,
/// shape and format fields. The range (t0, t1, h0, h1) and the target (out,
/// out_dtype, strides) are left for the caller.
inline kernels::DecodeArgs decode_args(const EncodingLayout& layout, const EncodedArrays& a) {
  kernels::DecodeArgs t;
  t.codes = a.codes;
  t.scales = a.scales;
  t.zeros = a.zeros;
  t.scale_factor = a.scale_factor;
  t.zero_factor = a.zero_factor;
  t.ids = a.ids;
  t.centroid = a.centroid;
  t.ids_stage_stride = layout.groups() * layout.shape.s;
  t.centroid_stage_stride = layout.groups() * layout.centroids * layout.shape.d * int64_t(dtype_size(layout.dtype));
  t.B = int32_t(layout.shape.b);
  t.S = int32_t(layout.shape.s);
  t.H = int32_t(layout.shape.h);
  t.D = int32_t(layout.shape.d);
  t.K = layout.centroids;
  t.bits = layout.bits;
  t.block = layout.block_size;
  t.stages = layout.stages;
  t.asymmetric = layout.asymmetric ? 1 : 0;
  t.fp8 = layout.scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 0;
  t.centroid_dtype = int8_t(arith_dtype(layout.dtype));
  return t;
}

}  // namespace qvg::cuda
