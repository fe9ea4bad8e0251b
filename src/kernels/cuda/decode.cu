// The fused decode kernel (spec 1.3) on the device: unpack the codes, decode the
// stored scales (and zeros) with the two-level factor, add every stage's centroid
// gathered by id, round once to the output dtype, and write straight into a
// strided target. One launch serves up to kDecodeTasksPerLaunch ranges of one mode
// (e.g. every segment of a packed-cache window, K and V), so a window costs one
// launch.
//
// The vectorised kernel is a template on the mode (the codes' width, a row of
// qvg/code_format.h; scale format, centroid dtype, output dtype; the width of a
// refinement layer or none: 3 x 2 x (9 + 3 x 3) = 108 instantiations for the rows
// int2, int3, int4, each width's in its own unit: decode_vec.cuh, decode_int<bits>.cu),
// chosen once per launch on the host (with_decode_submode, through
// qvg::dispatch_width); each unrefined kernel holds a symmetric and an asymmetric copy
// of its loop (DecodeVecThread's ASYM), each thread sets up its invariants once and
// then decodes its tokens in batches of four. Everything a thread does is
// decode_block_vec / decode_block_generic of bodies.cuh, which the host test runs over
// the same grid.
//
// Arithmetic: the functions of arith.cuh (__fmul_rn/__fadd_rn, integer format
// conversions; the file is compiled with --fmad=false), in the order of
// decode_rows_reference: residual first, then stage 0, 1, ... centroids, each a
// separately rounded fp32 operation.
#include <atomic>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/per_device.h"

namespace qvg::cuda::kernels {

/// Launches the vectorised kernel of L's mode for codes of BITS bits: defined in
/// decode_vec.cuh, instantiated in decode_int<BITS>.cu (one unit per width).
template <int BITS>
void launch_decode_vec(const DecodeLaunch& L, cudaStream_t stream);

namespace {

__global__ void __launch_bounds__(kDecodeThreads) decode_generic_kernel(const __grid_constant__ DecodeLaunch L) {
  const int32_t blk = int32_t(blockIdx.x);
  const int ti = task_of_block(L, blk);
  decode_block_generic(L, ti, blk - L.first_block[ti], int(threadIdx.x));
}

/// Blocks in two waves of the current device at kDecodeWaveBlocks blocks per
/// multiprocessor: a smaller grid gets smaller tiles.
int32_t two_waves() {
  static std::atomic<int32_t> cache[detail::kMaxDevices];
  const int dev = detail::current_device();
  if (dev >= 0 && dev < detail::kMaxDevices) {
    const int32_t c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int sms = 0;
  QVG_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int32_t blocks = 2 * sms * kDecodeWaveBlocks;
  if (dev >= 0 && dev < detail::kMaxDevices) cache[dev].store(blocks, std::memory_order_relaxed);
  return blocks;
}

}  // namespace

void decode_tasks(const DecodeArgs* tasks, int n, cudaStream_t stream) {
  for (const DecodeLaunch& L : plan_decode(tasks, n, two_waves())) {
    const dim3 grid(unsigned(L.blocks())), block(kDecodeThreads);
    if (!L.vec) {
      decode_generic_kernel<<<grid, block, 0, stream>>>(L);
      detail::check_launch("decode_generic_kernel");
      continue;
    }
    with_decodable_width(L.bits, [&](auto bits) { launch_decode_vec<decltype(bits)::value>(L, stream); });
  }
}

}  // namespace qvg::cuda::kernels
