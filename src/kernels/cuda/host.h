// src/kernels/cuda/host.h — helpers of the CUDA backend's host code (C++20; the .cu
// files do not include it): the kernels' view of a dtype and of an encoding's arrays.
#pragma once

#include <cstdint>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"
#include "kernels/cuda/encode_bodies.cuh"
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
  const uint8_t* zeros = nullptr;       ///< asymmetric only
  const float* scale_factor = nullptr;  ///< two_level only
  const float* zero_factor = nullptr;   ///< two_level and asymmetric only
  const uint8_t* ids = nullptr;         ///< stage 0
  const uint8_t* centroid = nullptr;    ///< stage 0
};

/// The decode kernel's arguments for an encoding with `layout` at `a`: arrays,
/// shape and format fields. The range (t0, t1, h0, h1) and the target (out,
/// out_dtype, strides) are left for the caller.
inline kernels::DecodeArgs decode_args(const EncodingLayout& l, const EncodedArrays& a) {
  const int64_t G = l.groups();
  return {.codes = a.codes,
          .scales = a.scales,
          .zeros = a.zeros,
          .scale_factor = a.scale_factor,
          .zero_factor = a.zero_factor,
          .ids = a.ids,
          .centroid = a.centroid,
          .ids_stage_stride = G * l.shape.s,
          .centroid_stage_stride = G * l.centroids * l.shape.d * int64_t(dtype_size(l.dtype)),
          .B = int32_t(l.shape.b),
          .S = int32_t(l.shape.s),
          .H = int32_t(l.shape.h),
          .D = int32_t(l.shape.d),
          .K = l.centroids,
          .bits = l.bits,
          .block = l.block_size,
          .stages = l.stages,
          .asymmetric = int8_t(l.asymmetric ? 1 : 0),
          .fp8 = int8_t(l.scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 0),
          .centroid_dtype = int8_t(arith_dtype(l.dtype))};
}

/// Sets the refinement-layer fields of t (DecodeArgs::ref_*) to the layer with layout
/// `l` at `a`: a layer of encode_refinement (f32, one symmetric stage of one centroid,
/// the task's encoding's shape; the caller checks that).
inline void set_refinement(kernels::DecodeArgs& t, const EncodingLayout& l, const EncodedArrays& a) {
  t.ref_codes = a.codes;
  t.ref_scales = a.scales;
  t.ref_scale_factor = a.scale_factor;
  t.ref_centroid = reinterpret_cast<const float*>(a.centroid);
  t.ref_bits = l.bits;
  t.ref_block = l.block_size;
  t.ref_fp8 = int8_t(l.scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 0);
}

/// The quantizer's shape and format fields for an encoding with layout `l` whose
/// last stage has `K` codebook slots. The arrays (codes, scales, ...), the residual
/// inputs (r, stored, ids) and the scratch are left for the caller.
inline kernels::QuantizeArgs quantize_format(const EncodingLayout& l, int K) {
  kernels::QuantizeArgs q;
  q.G = l.groups();
  q.S = l.shape.s;
  q.D = l.shape.d;
  q.K = K;
  q.bits = l.bits;
  q.block = l.block_size;
  q.asymmetric = l.asymmetric;
  q.fp8 = l.scale_dtype == ScaleDType::FP8_E4M3;
  q.two_level = l.two_level();
  return q;
}

}  // namespace qvg::cuda
