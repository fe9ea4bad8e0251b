// tests/gpu/device_support.h — the device helpers of the GPU test executable
// (gpu_tests.cpp, all_settings_tests.cpp, async_update_tests.cpp,
// kmeanspp_gpu_tests.cpp): checked CUDA calls, a stream per test, and synchronous
// copies between host and device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "qvg/cuda_runtime.h"
#include "qvg/tensor.h"
#include "qvg/view.h"

/// Throws std::runtime_error naming the call unless it returned cudaSuccess.
#define QVG_GPU_CHECK(call)                                                                              \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

namespace qvg::testing::gpu {

/// A non-blocking stream owned by one test.
struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { QVG_GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
};

/// `n` bytes at host `p` in a new device buffer (allocated on `s`); synchronizes `s`.
inline cuda::DeviceBuffer to_device(const void* p, size_t n, cudaStream_t s) {
  cuda::DeviceBuffer b(n, s);
  QVG_GPU_CHECK(cudaMemcpyAsync(b.data(), p, n, cudaMemcpyHostToDevice, s));
  QVG_GPU_CHECK(cudaStreamSynchronize(s));
  return b;
}
inline cuda::DeviceBuffer to_device(const Tensor& t, cudaStream_t s) {
  return to_device(t.data(), t.nbytes(), s);
}

/// `count` values of T at device `p`, copied to the host after the work on `s`.
template <class T = uint8_t>
std::vector<T> to_host(const void* p, size_t count, cudaStream_t s) {
  std::vector<T> v(count);
  QVG_GPU_CHECK(cudaMemcpyAsync(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost, s));
  QVG_GPU_CHECK(cudaStreamSynchronize(s));
  return v;
}

/// A (possibly strided) device view downloaded as dense [B, T, h, D] bytes.
inline std::vector<uint8_t> view_to_host(const StridedView& v, cudaStream_t s) {
  const size_t esz = dtype_size(v.dtype), row = size_t(v.shape.h * v.shape.d) * esz;
  std::vector<uint8_t> out(size_t(v.shape.b * v.shape.s) * row);
  for (int64_t b = 0; b < v.shape.b; ++b)
    QVG_GPU_CHECK(cudaMemcpy2DAsync(out.data() + size_t(b * v.shape.s) * row, row,
                                    static_cast<const uint8_t*>(v.data) + size_t(b * v.stride_b) * esz,
                                    size_t(v.stride_t) * esz, row, size_t(v.shape.s), cudaMemcpyDeviceToHost, s));
  QVG_GPU_CHECK(cudaStreamSynchronize(s));
  return out;
}
/// A host view as dense [B, T, h, D] bytes (to compare with view_to_host's).
inline std::vector<uint8_t> host_view_bytes(const StridedView& v) {
  const Tensor t = v.to_tensor();
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

}  // namespace qvg::testing::gpu
