// src/kernels/cuda/guard_bodies.cuh — the deferred input check of the device caches
// (docs/cuda.md, "update() does not wait"): what the device records of a
// call whose key or value holds a value outside spec 1's limits, and the rule that
// decides whether the call's rows are written. __host__ __device__ over plain structs,
// so that the host test (tests/gpu/host_arith_test.cpp) runs the same code.
//
// Per call: the first-bad-index flags are set to "none" (all bits set), the two
// limit scans lower them (atomicMin), guarded copies write the call's rows only when
// both stayed "none", and one thread publishes a bad call into a slot of a small ring
// in pinned host memory that the device writes directly (no copy back, no waiting);
// the cache's host code reads the ring at its next call.
#pragma once

#include <cstdint>

#include "kernels/cuda/arith.cuh"

namespace qvg::cuda::kernels {

/// One cache's check state in device memory: the current call's first bad element
/// index of key (first[0]) and value (first[1]) — ~0 (all bits) when none — and the
/// number of calls found bad so far (numbers the published slots from 1).
struct CheckFlags {
  unsigned long long first[2];
  unsigned long long bad_calls;
};

/// A published bad call: its chunk [chunk_start, chunk_start + n), the tensor
/// (which: 0 key, 1 value), the first bad element's [b, t, h, d] and its value.
/// `call` is the number of the bad call (CheckFlags::bad_calls after it), written
/// last: 0 while the slot is being written.
struct CheckSlot {
  unsigned long long call;
  long long chunk_start, n;
  long long b, t, h, d;
  int which;
  float value;
};
/// Slots of the ring (slot call % kCheckSlots): more bad calls than this unread by the
/// host overwrite the oldest (the host still reports the newer ones).
inline constexpr int kCheckSlots = 16;

/// Whether the call whose flags are f wrote values within the limits: both scans
/// found no element (the indices stayed at or above the tensors' sizes).
QVG_HD bool input_ok(const CheckFlags& f, unsigned long long n_key, unsigned long long n_value) {
  return f.first[0] >= n_key && f.first[1] >= n_value;
}

/// The slot of a bad call (REQUIRES !input_ok): the key's first bad element when it
/// has one, else the value's; `numel` = B * n * H * D elements each, [B, n, H, D]
/// dense, of `dtype` (cuda_arith::kBF16 / kF16 / kF32). `call` is left 0.
QVG_HD CheckSlot bad_call_slot(const CheckFlags& f, const void* key, const void* value, int dtype, long long B,
                               long long n, long long H, long long D, long long chunk_start) {
  const unsigned long long numel = (unsigned long long)(B * n * H * D);
  CheckSlot s{};
  s.which = f.first[0] < numel ? 0 : 1;
  const unsigned long long e = f.first[s.which];
  s.chunk_start = chunk_start;
  s.n = n;
  s.b = (long long)(e / (unsigned long long)(D * H * n));
  s.t = (long long)((e / (unsigned long long)(D * H)) % (unsigned long long)n);
  s.h = (long long)((e / (unsigned long long)D) % (unsigned long long)H);
  s.d = (long long)(e % (unsigned long long)D);
  s.value = qvg::cuda_arith::load_elem(s.which == 0 ? key : value, dtype, (int64_t)e);
  return s;
}

}  // namespace qvg::cuda::kernels
