// src/perf/fma_loop.cpp — the FMA throughput loop of the machine-limit benchmark
// (perf::fma_loop), compiled per SIMD target with Highway like the CPU kernels and
// dispatched the same way (same target set), so that the peak it measures is that
// of the target the kernels run on.
#include "kernels/cpu/targets.h"  // the kernels' target set; before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "perf/fma_loop.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "perf/perf.h"

HWY_BEFORE_NAMESPACE();
namespace qvg {
namespace perf {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

double FmaLoopImpl(int64_t iters) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  constexpr int kAcc = 12;  // enough independent chains to cover FMA latency x ports
  V a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = hn::Set(df, float(i) * 1e-3f);
  const V m = hn::Set(df, 0.9999999f), c = hn::Set(df, 1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAcc; ++i) a[i] = hn::MulAdd(a[i], m, c);
  }
  V s = a[0];
  for (int i = 1; i < kAcc; ++i) s = hn::Add(s, a[i]);
  volatile float sink = hn::GetLane(s);
  (void)sink;
  return double(iters) * kAcc * double(hn::Lanes(df)) * 2.0;
}

}  // namespace HWY_NAMESPACE
}  // namespace perf
}  // namespace qvg
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qvg {
namespace perf {

HWY_EXPORT(FmaLoopImpl);

double fma_loop(int64_t iters) {
  return HWY_DYNAMIC_DISPATCH(FmaLoopImpl)(iters);
}

}  // namespace perf
}  // namespace qvg
#endif  // HWY_ONCE
