// tests/gpu/host_launch.h — one planned decode launch run on the host, for the host
// tests of the CUDA bodies (host_arith_test.cpp, host_code_format_test.cpp): every
// block of its grid and every thread of each block, through the same dispatch
// (with_decode_mode) and bodies as the kernels.
#pragma once

#include <cstdint>
#include <set>

#include "kernels/cuda/bodies.cuh"

namespace qvg::cuda::kernels::host_test {

/// The vectorised modes a test has run, as r * 10000 + bits * 1000 + fp8 * 100 +
/// centroid dtype * 10 + out dtype (r: the refinement layer's width, 0 = none).
inline std::set<int>& modes_run() {
  static std::set<int> m;
  return m;
}

/// Runs launch L on the host (records its mode in modes_run() when vectorised).
inline void run_launch(const DecodeLaunch& L) {
  for (int32_t blk = 0; blk < L.blocks(); ++blk) {
    const int ti = task_of_block(L, blk);
    const int32_t local = blk - L.first_block[ti];
    if (!L.vec) {
      for (int tid = 0; tid < kDecodeThreads; ++tid) decode_block_generic(L, ti, local, tid);
      continue;
    }
    with_decode_mode(L.bits, L.fp8 != 0, L.centroid_dtype, L.out_dtype, L.ref_bits,
                     [&](auto b, auto f, auto c, auto o, auto r) {
                       modes_run().insert(decltype(r)::value * 10000 + decltype(b)::value * 1000 +
                                          decltype(f)::value * 100 + decltype(c)::value * 10 + decltype(o)::value);
                       for (int tid = 0; tid < kDecodeThreads; ++tid)
                         decode_block_vec<decltype(b)::value, decltype(f)::value, decltype(c)::value,
                                          decltype(o)::value, decltype(r)::value>(L, ti, local, tid);
                     });
  }
}

}  // namespace qvg::cuda::kernels::host_test
