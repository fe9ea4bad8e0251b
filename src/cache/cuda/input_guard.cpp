// The deferred input check of the device caches: src/cache/cuda/input_guard.h.
#include "cache/cuda/input_guard.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "core/input_limits.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "qvg/error.h"

namespace qvg::cuda::detail {

using kernels::CheckSlot;
using kernels::kCheckSlots;

void InputGuard::prepare(Stream s, Allocator& alloc) {
  if (slots_ != nullptr && flags_.size() != 0) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  QVG_CUDA(cudaStreamIsCapturing(s, &st));
  if (st != cudaStreamCaptureStatusNone)
    throw Unsupported(
        "the first update() of a device cache allocates its pinned input-check record (cudaHostAlloc), which a CUDA "
        "graph capture cannot hold: run one update() before capturing");
  if (flags_.size() == 0) {  // zeroed once: bad_calls counts for the cache's lifetime
    DeviceBuffer f(sizeof(kernels::CheckFlags), s, alloc);
    QVG_CUDA(cudaMemsetAsync(f.data(), 0, sizeof(kernels::CheckFlags), s));
    flags_ = std::move(f);
  }
  if (slots_ != nullptr) return;
  void* p = nullptr;
  QVG_CUDA(cudaHostAlloc(&p, sizeof(CheckSlot) * kCheckSlots, cudaHostAllocMapped));
  std::memset(p, 0, sizeof(CheckSlot) * kCheckSlots);
  slots_ = static_cast<CheckSlot*>(p);
  void* d = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
    qvg::cuda::detail::throw_cuda(e, "cudaHostGetDevicePointer", __FILE__, __LINE__);
  }
  dev_slots_ = static_cast<CheckSlot*>(d);
}

InputGuard::~InputGuard() {
  if (slots_ == nullptr) return;
  // A publish kernel of the last call may still be queued on the cache's stream (the
  // flags' stream): wait for it before the ring is freed (cudaFreeHost is not promised
  // to). Not inside a capture (a wait would end it; the captured kernels run only when
  // the graph is launched, which must not happen after its cache is destroyed:
  // docs/cuda.md). Failures are cleared, not thrown.
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (flags_.size() != 0 && cudaStreamIsCapturing(flags_.stream(), &st) == cudaSuccess &&
      st == cudaStreamCaptureStatusNone && cudaStreamSynchronize(flags_.stream()) != cudaSuccess)
    (void)cudaGetLastError();
  if (cudaFreeHost(slots_) != cudaSuccess) (void)cudaGetLastError();
}

InputGuard::InputGuard(InputGuard&& o) noexcept
    : slots_(std::exchange(o.slots_, nullptr)),
      dev_slots_(std::exchange(o.dev_slots_, nullptr)),
      flags_(std::move(o.flags_)),
      reported_(o.reported_),
      n_key_(o.n_key_),
      n_value_(o.n_value_) {}

InputGuard& InputGuard::operator=(InputGuard&& o) noexcept {
  if (this != &o) {
    if (slots_ != nullptr) (void)cudaFreeHost(slots_);
    slots_ = std::exchange(o.slots_, nullptr);
    dev_slots_ = std::exchange(o.dev_slots_, nullptr);
    flags_ = std::move(o.flags_);
    reported_ = o.reported_;
    n_key_ = o.n_key_;
    n_value_ = o.n_value_;
  }
  return *this;
}

namespace {
/// The slot's call number as the device last wrote it (0 while it writes the slot).
unsigned long long call_of(CheckSlot& s) {
  return std::atomic_ref<unsigned long long>(s.call).load(std::memory_order_acquire);
}
}  // namespace

void InputGuard::raise_published() {
  if (slots_ == nullptr) return;  // nothing enqueued yet
  // The oldest published call after the last one raised; a slot whose number changes
  // while it is read is being rewritten and is skipped (seen again later).
  unsigned long long best = 0;
  CheckSlot got{};
  for (int i = 0; i < kCheckSlots; ++i) {
    const unsigned long long c = call_of(slots_[i]);
    if (c <= reported_ || (best != 0 && c >= best)) continue;
    CheckSlot copy;
    std::memcpy(&copy, &slots_[i], sizeof copy);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (call_of(slots_[i]) != c) continue;
    best = c;
    got = copy;
  }
  if (best == 0) return;
  reported_ = best;
  throw InvalidArgument(fmt::format(
      "{} (the update() of chunk [{}, {}), checked on the device after it returned: its rows were not written into "
      "the cache; a new chunk's rows are zeros)",
      qvg::detail::input_limit_message(got.which == 0 ? "key" : "value", got.value, got.b, got.t, got.h, got.d),
      got.chunk_start, got.chunk_start + got.n));
}

void InputGuard::wait_and_raise(Stream s) {
  QVG_CUDA(cudaStreamSynchronize(s));
  raise_published();
}

void InputGuard::enqueue(ConstTensorView key, ConstTensorView value, int64_t chunk_start, Stream s) {
  QVG_CHECK(slots_ != nullptr && flags_.size() != 0);  // prepare() first
  auto* f = static_cast<kernels::CheckFlags*>(flags_.data());
  QVG_CUDA(cudaMemsetAsync(f->first, 0xFF, sizeof f->first, s));
  n_key_ = uint64_t(key.shape.numel());
  n_value_ = uint64_t(value.shape.numel());
  const int dt = arith_dtype(key.dtype);
  if (n_key_ > 0) kernels::first_out_of_limit(key.data, dt, int64_t(n_key_), &f->first[0], s);
  if (n_value_ > 0) kernels::first_out_of_limit(value.data, arith_dtype(value.dtype), int64_t(n_value_), &f->first[1], s);
  const Shape4& sh = key.shape;
  kernels::publish_check(f, key.data, value.data, dt, sh.b, sh.s, sh.h, sh.d, chunk_start, dev_slots_, s);
}

void InputGuard::copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                        bool zero_if_bad, Stream s) const {
  kernels::guarded_copy2d(dst, dpitch, src, spitch, width, rows, static_cast<const kernels::CheckFlags*>(flags_.data()),
                          n_key_, n_value_, zero_if_bad, s);
}

}  // namespace qvg::cuda::detail
