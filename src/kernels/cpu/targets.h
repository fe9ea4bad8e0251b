// src/kernels/cpu/targets.h — the SIMD targets every Highway foreach_target file
// of qvg compiles (the CPU kernels, src/kernels/cpu/dispatch.cpp, and the FMA loop
// of the benchmarks, src/perf/fma_loop.cpp), so that both dispatch alike.
// Include first, before any Highway header.
#pragma once

// Every attainable target is compiled so that tests can force each one.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
// Arrays of vectors are used by the kernels; sizeless SVE/RVV vectors do not allow them.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

// The per-target namespace of the CPU kernels' -inl.h files (Highway's
// HWY_BEFORE_NAMESPACE / HWY_NAMESPACE / HWY_AFTER_NAMESPACE pattern), opened and
// closed the same way in every file. Use after hwy/highway.h.
#define QVG_CPU_KERNELS_BEGIN \
  HWY_BEFORE_NAMESPACE();     \
  namespace qvg::kernels::HWY_NAMESPACE {   \
  namespace hn = hwy::HWY_NAMESPACE;
#define QVG_CPU_KERNELS_END \
  }                         \
  HWY_AFTER_NAMESPACE();
