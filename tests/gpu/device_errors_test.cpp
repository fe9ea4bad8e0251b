// Host-side test of qvg::cuda::PackedCausalCache's argument errors (no GPU needed):
// its constructor and its update()'s argument errors are raised before any CUDA
// call, so they are checked on a GPU-less machine. Built with the CUDA backend
// (cmake/QvgCuda.cmake, ctest `cuda.host_device_errors`) in the in-repo harness
// (the device machine has no GoogleTest). The policy the device cache runs is
// checked against the independent model by tests/test_cache_plan.cpp (ci).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <fmt/core.h>

#include "gpu/call_kind.h"
#include "gpu/harness.h"
#include "qvg/cache.h"
#include "qvg/cuda_cache.h"
#include "qvg/error.h"
#include "qvg/settings.h"

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
  q.enable(4);
  std::string msg;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::Ok);
  q.codec.init = qvg::Init::Warm;
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::Ok);
  q.codec.init = qvg::Init::KMeansPlusPlus;  // the device encoder seeds with kmeans++ too
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }, &msg) == Kind::Ok) << msg;
  q.codec.init = qvg::Init::Random;
  q.codec.block_size = 48;  // does not divide 64
  QVG_EXPECT(kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }) == Kind::InvalidArgument);
  q.codec.block_size = 64;
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

namespace {

/// Values of setting s to try on top of q: none (an unset override), each kind's
/// typical values and its range's ends, every name of a Name setting.
std::vector<qvg::SettingValue> values_to_try(const qvg::Setting& s) {
  std::vector<qvg::SettingValue> cand(1);  // none
  const auto ints = [&](std::initializer_list<int64_t> vs) {
    for (const int64_t v : vs) cand.emplace_back(std::in_place_type<int64_t>, v);
  };
  switch (s.kind) {
    case qvg::SettingKind::Bits:
    case qvg::SettingKind::Width: ints({2, 4}); break;
    case qvg::SettingKind::Int: ints({s.lo, s.lo + 1, 2, 4, 8, 16, 32, 64, 128, s.hi}); break;
    case qvg::SettingKind::Bool:
      cand.emplace_back(std::in_place_type<bool>, true);
      cand.emplace_back(std::in_place_type<bool>, false);
      break;
    case qvg::SettingKind::Name:
      for (const char* n : {"random", "kmeans++", "warm", "off", "mse", "deferred", "incremental", "chunk", "full",
                            "fp8_e4m3", "bf16", "two_level", "compat"})
        cand.emplace_back(std::in_place_type<std::string>, n);
      break;
    case qvg::SettingKind::Real:
      for (const double v : {0.0, 0.5, 1.5, double(s.hi)}) cand.emplace_back(std::in_place_type<double>, v);
      break;
    case qvg::SettingKind::Seed:
      for (const uint64_t v : {uint64_t(0), uint64_t(99), ~uint64_t(0)})
        cand.emplace_back(std::in_place_type<uint64_t>, v);
      break;
  }
  return cand;
}

}  // namespace

// The device packed cache accepts every setting the CPU packed cache
// accepts. Walks the settings table (qvg/settings.h); for each setting and each value
// of its kind (on bases that quantize: deferred and incremental spans, with and
// without refinement), a QuantArgs the CPU cache accepts must construct the device
// cache too, and one the CPU cache refuses must be refused with the same error kind.
// Constructing the device cache makes no CUDA call (it allocates nothing), so this
// runs without a device. No exception: init kmeans++ (for either role) is accepted
// too (the device encoder makes the CPU's kmeans++ picks); the walk counts the
// accepted values that set it.
QVG_TEST(device_cache_accepts_every_setting_the_cpu_cache_accepts) {
  qvg::CacheOptions o;
  o.cache_size = 64;
  o.head_dim = 64;
  o.heads = 2;
  std::vector<qvg::QuantArgs> bases(3);
  for (qvg::QuantArgs& b : bases) b.enable(4);
  bases[1].span_mode = qvg::SpanMode::Incremental;
  bases[1].span_chunks = 4;
  bases[2] = bases[1];
  bases[2].refine_recent = 2;
  int settings = 0, accepted = 0, refused = 0, kmeanspp = 0;
  for (const qvg::Setting& s : qvg::quant_settings()) {
    int accepted_here = 0;
    for (const qvg::QuantArgs& base : bases)
      for (const qvg::SettingValue& v : values_to_try(s)) {
        qvg::QuantArgs q = base;
        try {
          qvg::check_setting(s, v, s.name);
          s.set(q, v);
        } catch (const qvg::InvalidArgument&) {
          continue;  // not a value of this setting
        }
        if (qvg::is_default(s, q)) continue;
        std::string cpu_msg, dev_msg;
        const Kind cpu = kind_of([&] { qvg::PackedCausalCache c(o, q); }, &cpu_msg);
        const Kind dev = kind_of([&] { qvg::cuda::PackedCausalCache c(o, q); }, &dev_msg);
        const std::string what = fmt::format("{} = {} on {}", s.name, qvg::setting_text(v), base.describe());
        bool pp = false;
        if (q.enabled())
          for (const qvg::CacheRole r : {qvg::CacheRole::Key, qvg::CacheRole::Value})
            pp = pp || q.codec_for(r).init == qvg::Init::KMeansPlusPlus;
        kmeanspp += cpu == Kind::Ok && pp;
        QVG_EXPECT(dev == cpu) << what << "cpu:" << cpu_msg << "device:" << dev_msg;
        accepted += cpu == Kind::Ok;
        accepted_here += cpu == Kind::Ok;
        refused += cpu != Kind::Ok;
      }
    QVG_EXPECT(accepted_here > 0) << "no non-default value of" << std::string(s.name) << "was accepted";
    ++settings;
  }
  std::printf(
      "  %d settings, %d accepted non-default values (device == cpu; %d of them with kmeans++), %d refused by both\n",
      settings, accepted, kmeanspp, refused);
  QVG_EXPECT(settings == int(qvg::quant_settings().size()) && kmeanspp > 0);
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
