// Host-side test of qvg::cuda::PackedCausalCache's argument errors (no GPU needed):
// its constructor and its update()'s argument errors are raised before any CUDA
// call, so they are checked on a GPU-less machine. Built with the CUDA backend
// (cmake/QvgCuda.cmake, ctest `cuda.host_device_errors`) in the in-repo harness
// (the device machine has no GoogleTest). The policy the device cache runs is
// checked against the independent model by tests/gpu/cache_plan_test.cpp (ci).
#include <memory>
#include <optional>
#include <string>

#include "gpu/call_kind.h"
#include "gpu/harness.h"
#include "qvg/cache.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"

namespace {

using Kind = qvg::testing::CallKind;
template <class F>
Kind kind_of(F&& f, std::string* msg = nullptr) {
  return qvg::testing::call_kind(f, msg);
}

QVG_TEST(device_cache_constructor_errors) {
  qvg::CacheOptions o;
  o.cache_size = 16;
  o.head_dim = 64;
  qvg::QuantArgs q;
  q.bits = 4;
  std::string msg;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::Ok);
  q.init = qvg::Init::Warm;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }, &msg) == Kind::Unsupported &&
             msg.find("init") != std::string::npos && msg.find("warm") != std::string::npos)
      << msg;
  q.init = qvg::Init::KMeansPlusPlus;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }, &msg) == Kind::Unsupported &&
             msg.find("kmeans++") != std::string::npos)
      << msg;
  q.init = qvg::Init::Random;
  q.block_size = 48;  // does not divide 64
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::InvalidArgument);
  q.block_size = 64;
  qvg::CacheOptions g = o;
  g.allow_growth = true;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(g, q); }) == Kind::Unsupported);
  g = o;
  g.view_scratch = std::make_shared<qvg::ViewScratch>();
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(g, q); }, &msg) == Kind::Unsupported &&
             msg.find("view_scratch") != std::string::npos)
      << msg;
  g = o;
  g.sink_tokens = 17;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(g, q); }, &msg) == Kind::InvalidArgument &&
             msg.find("sink_tokens") != std::string::npos)
      << msg;
}

// update() validates its arguments before any CUDA call, so the argument errors
// can be checked here (the tensors' pointers are never dereferenced).
QVG_TEST(device_cache_update_argument_errors_before_any_cuda_call) {
  qvg::CacheOptions o;
  o.cache_size = 16;
  o.heads = 2;
  o.head_dim = 8;
  qvg::cuda::PackedCausalCache c(o);
  alignas(16) static char dummy[64];
  const qvg::ConstTensorView k{dummy, qvg::DType::BF16, {1, 4, 2, 8}};
  std::string msg;
  QVG_EXPECT(kind_of([&] { (void)c.update(k, k, 3, nullptr); }, &msg) == Kind::Unsupported &&
             msg.find("non-sequential") != std::string::npos)
      << msg;
  const qvg::ConstTensorView kf{dummy, qvg::DType::F32, {1, 4, 2, 8}};
  QVG_EXPECT(kind_of([&] { (void)c.update(kf, kf, 0, nullptr); }, &msg) == Kind::InvalidArgument &&
             msg.find("dtype") != std::string::npos)
      << msg;
  const qvg::ConstTensorView k1{dummy, qvg::DType::BF16, {1, 4, 1, 8}};
  QVG_EXPECT(kind_of([&] { (void)c.update(k1, k1, 0, nullptr); }, &msg) == Kind::InvalidArgument &&
             msg.find("cache_head_start") != std::string::npos)
      << msg;
  const qvg::ConstTensorView big{dummy, qvg::DType::BF16, {1, 17, 2, 8}};
  QVG_EXPECT(kind_of([&] { (void)c.update(big, big, 0, nullptr); }) == Kind::OutOfRange);
  QVG_EXPECT(kind_of([&] { (void)c.update(k, k, 0, nullptr, std::nullopt, -1); }, &msg) == Kind::InvalidArgument &&
             msg.find("recent_window_tokens") != std::string::npos)
      << msg;
  QVG_EXPECT(c.global_end() == 0 && c.num_segments() == 0 && c.view_buffer_nbytes() == 0);
  QVG_EXPECT(kind_of([&] { (void)c.segment(0); }) == Kind::InvalidArgument);
}

}  // namespace

int main(int argc, char** argv) {
  return qvg::testing::run_all(argc, argv);
}
