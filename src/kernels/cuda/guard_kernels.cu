// The deferred input check's kernels (guard_bodies.cuh): the publication of a bad
// call into pinned host memory, and the guarded row copies that write a call's rows
// only when its check passed.
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/guard_bodies.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace qvg::cuda::kernels {
namespace {

// One thread: a bad call gets the next number and a slot of the ring, its fields
// written before its number (a system-scope fence between), so the host never reads
// a half-written slot as complete.
__global__ void publish_kernel(CheckFlags* f, const void* key, const void* value, int dtype, long long B, long long n,
                               long long H, long long D, long long chunk_start, CheckSlot* slots) {
  const unsigned long long numel = (unsigned long long)(B * n * H * D);
  if (input_ok(*f, numel, numel)) return;
  const unsigned long long call = ++f->bad_calls;
  CheckSlot s = bad_call_slot(*f, key, value, dtype, B, n, H, D, chunk_start);
  volatile CheckSlot* out = slots + call % kCheckSlots;
  out->call = 0;
  __threadfence_system();
  out->chunk_start = s.chunk_start;
  out->n = s.n;
  out->b = s.b;
  out->t = s.t;
  out->h = s.h;
  out->d = s.d;
  out->which = s.which;
  out->value = s.value;
  __threadfence_system();
  out->call = call;
}

// Rows of `words` 16-byte words (vec) or `width` bytes: block r copies rows r, r +
// gridDim.x, ...; all or nothing by the call's flags (zeros instead when asked).
__global__ void guarded_copy_kernel(uint8_t* dst, size_t dpitch, const uint8_t* src, size_t spitch, size_t width,
                                    size_t rows, const CheckFlags* f, unsigned long long n_key,
                                    unsigned long long n_value, int zero_if_bad, int vec) {
  const bool ok = input_ok(*f, n_key, n_value);
  if (!ok && !zero_if_bad) return;
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    uint8_t* d = dst + r * dpitch;
    const uint8_t* s = src + r * spitch;
    if (vec) {
      for (size_t w = threadIdx.x; w < width / 16; w += blockDim.x)
        reinterpret_cast<uint4*>(d)[w] = ok ? reinterpret_cast<const uint4*>(s)[w] : make_uint4(0, 0, 0, 0);
    } else {
      for (size_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = ok ? s[i] : uint8_t(0);
    }
  }
}

}  // namespace

void publish_check(CheckFlags* flags, const void* key, const void* value, int dtype, int64_t B, int64_t n, int64_t H,
                   int64_t D, int64_t chunk_start, CheckSlot* slots, cudaStream_t stream) {
  publish_kernel<<<1, 1, 0, stream>>>(flags, key, value, dtype, B, n, H, D, chunk_start, slots);
  detail::check_launch("publish_kernel");
}

void guarded_copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                    const CheckFlags* flags, uint64_t n_key, uint64_t n_value, bool zero_if_bad, cudaStream_t stream) {
  if (rows == 0 || width == 0) return;
  const auto al = [](size_t v) { return v % 16 == 0; };
  const int vec = al(reinterpret_cast<uintptr_t>(dst)) && al(reinterpret_cast<uintptr_t>(src)) && al(dpitch) &&
                  al(spitch) && al(width);
  const unsigned grid = unsigned(rows < 132 * 16 ? rows : 132 * 16);
  guarded_copy_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(dst), dpitch,
                                                     static_cast<const uint8_t*>(src), spitch, width, rows, flags,
                                                     n_key, n_value, zero_if_bad ? 1 : 0, vec);
  detail::check_launch("guarded_copy_kernel");
}

}  // namespace qvg::cuda::kernels
