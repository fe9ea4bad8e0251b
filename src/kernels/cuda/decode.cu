// The fused decode kernel (spec 1.3) on the device: unpack the codes, decode the
// stored scales (and zeros) with the two-level factor, add every stage's centroid
// gathered by id, round once to the output dtype, and write straight into a
// strided target. One launch serves up to kTasksPerLaunch ranges (e.g. every
// segment of a packed-cache window, K and V), so a window costs one launch.
//
// Arithmetic: the functions of arith.cuh (__fmul_rn/__fadd_rn, integer format
// conversions), the order of decode_rows_reference: residual first, then stage
// 0, 1, ... centroids, each a separately rounded fp32 operation.
#include <algorithm>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace qvg::cuda::kernels {
namespace {

constexpr int kTasksPerLaunch = 16;
constexpr int kThreads = 256;
constexpr int kTileTokens = 64;

struct LaunchTasks {
  DecodeArgs t[kTasksPerLaunch];
  long long first_block[kTasksPerLaunch + 1];
  int8_t vec[kTasksPerLaunch];     // 8 channels per thread (D % 8 == 0, block % 8 == 0, D <= 2048)
  int8_t vstore[kTasksPerLaunch];  // 16-byte aligned output rows
  int n;
};

__global__ void __launch_bounds__(kThreads) decode_kernel(const __grid_constant__ LaunchTasks L) {
  const long long blk = blockIdx.x;
  int ti = 0;
  while (ti + 1 < L.n && blk >= L.first_block[ti + 1]) ++ti;
  const DecodeArgs& T = L.t[ti];
  const long long local = blk - L.first_block[ti];
  const int hs = T.h1 - T.h0;
  const int ntile = (T.t1 - T.t0 + kTileTokens - 1) / kTileTokens;
  const long long gh = local / ntile;
  const int tile = int(local % ntile);
  const int b = int(gh / hs), h = T.h0 + int(gh % hs);
  const int tok_begin = T.t0 + tile * kTileTokens;
  const int tok_end = min(T.t1, tok_begin + kTileTokens);

  if (L.vec[ti]) {
    const int cpr = T.D / 8;  // threads per token row
    const int rows = kThreads / cpr;
    const int c = threadIdx.x % cpr, r = threadIdx.x / cpr;
    if (r >= rows) return;
    const bool vstore = L.vstore[ti] != 0;
    for (int t = tok_begin + r; t < tok_end; t += rows) decode_vec8(T, b, h, t, c, vstore);
    return;
  }
  // Generic path: one element per thread and step.
  const int64_t n = int64_t(tok_end - tok_begin) * T.D;
  for (int64_t e = threadIdx.x; e < n; e += kThreads)
    decode_one(T, b, h, tok_begin + int(e / T.D), int(e % T.D));
}

}  // namespace

void decode_tasks(const DecodeArgs* tasks, int n, cudaStream_t stream) {
  for (int base = 0; base < n; base += kTasksPerLaunch) {
    LaunchTasks L{};
    L.n = 0;
    long long blocks = 0;
    for (int i = base; i < std::min(n, base + kTasksPerLaunch); ++i) {
      const DecodeArgs& t = tasks[i];
      if (t.t1 <= t.t0 || t.h1 <= t.h0 || t.B <= 0) continue;  // empty range
      const int k = L.n++;
      L.t[k] = t;
      L.first_block[k] = blocks;
      const long long ntile = (t.t1 - t.t0 + kTileTokens - 1) / kTileTokens;
      blocks += ntile * (long long)(t.h1 - t.h0) * t.B;
      const bool vec = task_vectorizable(t) && t.D <= 8 * kThreads;
      L.vec[k] = vec ? 1 : 0;
      const int osz = t.out_dtype == qvg::cuda_arith::kF32 ? 4 : 2;
      const auto al = [](long long v) { return v % 16 == 0; };
      L.vstore[k] = vec && al((long long)reinterpret_cast<uintptr_t>(t.out)) && al(t.token_stride * osz) &&
                            al(t.batch_stride * osz) && al((long long)t.D * osz)
                        ? 1
                        : 0;
    }
    L.first_block[L.n] = blocks;
    if (L.n == 0) continue;
    decode_kernel<<<dim3(unsigned(blocks)), dim3(kThreads), 0, stream>>>(L);
    detail::check_launch("decode_kernel");
  }
}

}  // namespace qvg::cuda::kernels
