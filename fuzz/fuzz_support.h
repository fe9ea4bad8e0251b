// fuzz/fuzz_support.h — shared by the libFuzzer targets (docs/reliability.md).
//
//   FUZZ_CHECK(cond, ...)  a property of the target: prints and aborts (libFuzzer
//                          then reports a crash and writes the reproducer);
//   AllocMeter             the peak of bytes allocated and not yet freed during a
//                          call (every malloc, new and aligned_alloc: sanitizer
//                          allocator hooks), to check each reader's allocation
//                          bound: at most kAllocMultiple x its input + kAllocSlack.
#pragma once

#include <sanitizer/allocator_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include <fmt/core.h>

#include "qvg/config.h"
#include "qvg/error.h"

#define FUZZ_CHECK(cond, ...)                                                                          \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s at %s:%d: %s\n", #cond, __FILE__, __LINE__,          \
                   fmt::format(__VA_ARGS__).c_str());                                                  \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)

namespace qvg::fuzz {

/// The stated allocation bound of every reader (docs/reliability.md): the peak of
/// live bytes a parse allocates is at most kAllocMultiple x the input's size plus
/// kAllocSlack.
inline constexpr uint64_t kAllocMultiple = 16;
inline constexpr uint64_t kAllocSlack = uint64_t(1) << 20;

namespace detail {
inline std::atomic<bool> g_active{false};
inline std::atomic<int64_t> g_live{0}, g_peak{0};
inline void on_malloc(const volatile void* p, size_t n) {
  if (!p || !g_active.load(std::memory_order_relaxed)) return;
  const int64_t live = g_live.fetch_add(int64_t(n), std::memory_order_relaxed) + int64_t(n);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}
inline void on_free(const volatile void* p) {
  if (!p || !g_active.load(std::memory_order_relaxed)) return;
  g_live.fetch_sub(int64_t(__sanitizer_get_allocated_size(const_cast<const void*>(p))), std::memory_order_relaxed);
}
inline const bool g_installed = [] {
  __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
  // One-time runtime initialisation is not the reader's allocation: the OpenMP
  // runtime allocates ~1 MiB on its first call (max_threads() asks it).
  (void)qvg::max_threads();
  return true;
}();
}  // namespace detail

/// Measures the peak of live bytes allocated between construction and peak().
class AllocMeter {
 public:
  AllocMeter() {
    (void)detail::g_installed;
    detail::g_live = 0;
    detail::g_peak = 0;
    detail::g_active = true;
  }
  ~AllocMeter() { detail::g_active = false; }
  uint64_t peak() const { return uint64_t(detail::g_peak.load()); }
  AllocMeter(const AllocMeter&) = delete;
  AllocMeter& operator=(const AllocMeter&) = delete;
};

/// The largest peak / input ratio seen, printed when the process exits (for the
/// campaign reports).
inline void record_ratio(const char* what, uint64_t peak, size_t input) {
  static double worst = 0;
  static size_t worst_input = 0;
  static uint64_t worst_peak = 0;
  static const bool once = [] {
    std::atexit([] {
      if (worst_input)
        std::fprintf(stderr, "alloc: worst peak %llu bytes for a %zu-byte input (%.2f x)\n",
                     (unsigned long long)worst_peak, worst_input, double(worst_peak) / double(worst_input));
    });
    return true;
  }();
  (void)once;
  const double r = input ? double(peak) / double(input) : 0.0;
  if (r > worst && input >= 1024) {  // small inputs: the constant part dominates
    worst = r;
    worst_input = input;
    worst_peak = peak;
  }
  FUZZ_CHECK(peak <= kAllocMultiple * input + kAllocSlack, "{} allocated {} bytes at its peak for a {}-byte input",
             what, peak, input);
}

/// Runs `parse` (a reader on `size` input bytes) under an AllocMeter: its result, or
/// nullopt when it threw CorruptData (or InvalidArgument, when allowed: a well-formed
/// input qvg does not handle); any other exception escapes (a finding). Checks the
/// allocation bound.
template <class Parse>
auto bounded_parse(const char* what, size_t size, bool invalid_argument_allowed, Parse&& parse)
    -> std::optional<decltype(parse())> {
  std::optional<decltype(parse())> r;
  {
    AllocMeter meter;
    try {
      r.emplace(parse());
    } catch (const qvg::CorruptData&) {
    } catch (const qvg::InvalidArgument& e) {
      FUZZ_CHECK(invalid_argument_allowed, "{} threw InvalidArgument: {}", what, e.what());
    }
    record_ratio(what, meter.peak(), size);
  }
  return r;
}

}  // namespace qvg::fuzz
