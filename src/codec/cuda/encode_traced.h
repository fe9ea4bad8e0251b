// src/codec/cuda/encode_traced.h — the device encoder with its assignments traced,
// for the GPU tests (tests/gpu/encode_replay.h).
#pragma once

#include "qvg/cuda.h"

namespace qvg::cuda {

namespace detail {
/// encode() that also copies the ids of every k-means iteration, as the assignment
/// left them, into `ids_trace` (device memory of stages * kmeans_iters * G * S bytes,
/// [stage][iteration][group][token]; a group stopped early keeps its ids there). For
/// the GPU tests, which replay the encoding on the host from these assignments
/// (tests/gpu/encode_replay.h). ids_trace == nullptr: encode() itself.
/// `warm`: as encode()'s warm start (cfg.init warm).
DeviceEncodedTensor encode_traced(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc,
                                  void* ids_trace, const DeviceEncodedTensor* warm = nullptr);
}  // namespace detail

}  // namespace qvg::cuda
