// src/codec/cuda/range_args.h — one decode task's kernel arguments (decode_ranges and
// add_refinements: the same arrays, range and target fields).
#pragma once

#include <cstdint>

#include <fmt/format.h>

#include "kernels/cuda/host.h"
#include "qvg/cuda.h"
#include "qvg/error.h"

namespace qvg::cuda {

/// The arrays of `e`, the centroids taken from `book` (e itself, or an incremental
/// span's codebook).
inline EncodedArrays arrays_of(const DeviceEncodedTensor& e, const DeviceEncodedTensor& book) {
  return {e.codes_data(),        e.scales_data(), e.zeros_data(), e.scale_factor_data(),
          e.zero_factor_data(), e.ids_data(),    book.centroid_data()};
}

/// Throws InvalidArgument unless `e` is a refinement layer as encode_refinement makes
/// them: f32, one symmetric stage of one centroid, every array held.
inline void check_layer(const DeviceEncodedTensor& e) {
  if (e.dtype != DType::F32 || e.stages != 1 || e.centroids != 1 || e.asymmetric || e.parts() != EncodedParts::All)
    throw InvalidArgument("refinement layer: it must come from encode_refinement (f32, one symmetric stage of one "
                          "centroid, every array)");
}

/// The decode kernel's arguments for tokens [t0, t1), heads [h0, h1) of `e` into
/// `dst`, the centroids taken from `book` (e itself, or an incremental span's codebook).
/// InvalidArgument, naming `what` (the task's kind: "decode", "refinement"), for a
/// range outside e.
inline kernels::DecodeArgs range_args(const char* what, const DeviceEncodedTensor& e, const DeviceEncodedTensor& book,
                                      int64_t t0, int64_t t1, int64_t h0, int64_t h1, const DecodeTarget& dst) {
  if (!(0 <= t0 && t0 <= t1 && t1 <= e.shape.s && 0 <= h0 && h0 < h1 && h1 <= e.shape.h))
    throw InvalidArgument(fmt::format("{} range tokens [{}, {}) heads [{}, {}) is outside the encoding {}", what, t0,
                                      t1, h0, h1, e.shape.str()));
  kernels::DecodeArgs t = decode_args(e, arrays_of(e, book));
  t.t0 = int32_t(t0);
  t.t1 = int32_t(t1);
  t.h0 = int32_t(h0);
  t.h1 = int32_t(h1);
  t.out_dtype = int8_t(arith_dtype(dst.dtype));
  t.out = dst.base;
  t.batch_stride = dst.batch_stride;
  t.token_stride = dst.token_stride;
  return t;
}

}  // namespace qvg::cuda
