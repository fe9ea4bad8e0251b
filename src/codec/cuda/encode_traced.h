// src/codec/cuda/encode_traced.h — the device encoder with its assignments traced,
// for the GPU tests (tests/gpu/encode_replay.h).
#pragma once

#include <string>
#include <vector>

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

/// The phases of one device encode, timed by events recorded between them on its
/// stream (for the GPU benchmark: where an encode's time goes). Names, in order of
/// first appearance: "centre" (the gather, group means and centred bf16 points of
/// every stage), "init" (initial indices or kmeans++ picks, initial centroids),
/// "assign" (every k-means assignment, with its centroid preparation), "update"
/// (every centroid update), "finish" (stored centroids, next residuals),
/// "quantize" (the residual quantizer), "scale search".
struct EncodePhaseTimes {
  std::vector<std::string> names;
  std::vector<double> ms;  ///< per name, summed over its occurrences
};
/// encode() with its phases timed into `times` (waits for the stream at the end).
DeviceEncodedTensor encode_phases(ConstTensorView x, const CodecConfig& cfg, Stream stream, Allocator& alloc,
                                  EncodePhaseTimes& times);
}  // namespace detail

}  // namespace qvg::cuda
