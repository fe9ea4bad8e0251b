// src/kernels/cuda/decode_vec.cuh — the vectorised decode kernel (decode.cu's fused
// decode, spec 1.3) for the codes of one width: decode_int<bits>.cu includes this
// header and instantiates launch_decode_vec<bits> with QVG_DECODE_VEC_WIDTH, so that
// each width's 36 kernels compile in their own translation unit (in parallel; one
// unit held all 108 and was the build's longest step). decode.cu's launcher calls
// launch_decode_vec<bits> for every width with a row in qvg/code_format.h whose words
// fit: a width without its unit is a link error, not a silent fallback.
#pragma once

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace qvg::cuda::kernels {

template <int BITS, bool FP8, int CDT, int ODT, int RBITS>
__global__ void __launch_bounds__(kDecodeThreads,
                                  CDT == qvg::cuda_arith::kF32 || RBITS > 0 ? kDecodeMinBlocksWide : kDecodeMinBlocks)
    decode_vec_kernel(const __grid_constant__ DecodeLaunch L) {
  const int32_t blk = int32_t(blockIdx.x);
  const int ti = task_of_block(L, blk);
  decode_block_vec<BITS, FP8, CDT, ODT, RBITS>(L, ti, blk - L.first_block[ti], int(threadIdx.x));
}

/// Launches the vectorised kernel of L's mode (L.bits == BITS) on `stream`.
template <int BITS>
void launch_decode_vec(const DecodeLaunch& L, cudaStream_t stream) {
  const dim3 grid(unsigned(L.blocks())), block(kDecodeThreads);
  with_decode_submode<BITS>(
      L.fp8 != 0, L.centroid_dtype, L.out_dtype, L.ref_bits, [&](auto bits, auto fp8, auto cdt, auto odt, auto rbits) {
        decode_vec_kernel<decltype(bits)::value, decltype(fp8)::value, decltype(cdt)::value, decltype(odt)::value,
                          decltype(rbits)::value><<<grid, block, 0, stream>>>(L);
        detail::check_launch("decode_vec_kernel");
      });
}

}  // namespace qvg::cuda::kernels

/// Instantiates launch_decode_vec for codes of `bits` bits (in decode_int<bits>.cu,
/// inside namespace qvg::cuda::kernels).
#define QVG_DECODE_VEC_WIDTH(bits) template void launch_decode_vec<bits>(const DecodeLaunch&, cudaStream_t);
