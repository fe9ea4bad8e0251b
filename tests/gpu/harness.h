// tests/gpu/harness.h — a tiny assertion harness for the CUDA backend's test
// executables, which must build on the device machine without gtest.
//
//   QVG_TEST(name) { ... QVG_EXPECT(cond) << "context"; ... }
//   int main() { return qvg::testing::run_all(argc, argv); }   // optional name filter
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace qvg::testing {

struct TestCase {
  const char* name;
  std::function<void()> fn;
};
inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}
inline int& failures() {
  static int f = 0;
  return f;
}
struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

/// Collects a failure message; reports it when destroyed (after `<<` context).
class Failure {
 public:
  Failure(const char* expr, const char* file, int line) { os_ << file << ":" << line << ": FAILED: " << expr; }
  ~Failure() {
    std::fprintf(stderr, "%s\n", os_.str().c_str());
    ++failures();
  }
  template <class T>
  Failure& operator<<(const T& v) {
    os_ << " " << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

/// Whether test `name` passes the filter: comma-separated words, "text" (the name
/// contains text) or "-text" (it does not); a name runs when it contains one of the
/// positive words (or none is given) and none of the negative ones.
inline bool selected(const std::string& name, const std::string& filter) {
  bool any_positive = false, positive_hit = false;
  size_t at = 0;
  while (at <= filter.size()) {
    const size_t end = std::min(filter.find(',', at), filter.size());
    std::string word = filter.substr(at, end - at);
    at = end + 1;
    if (word.empty()) continue;
    const bool exclude = word[0] == '-';
    if (exclude) word.erase(0, 1);
    const bool hit = name.find(word) != std::string::npos;
    if (exclude && hit) return false;
    if (!exclude) {
      any_positive = true;
      positive_hit |= hit;
    }
  }
  return !any_positive || positive_hit;
}

/// Runs every registered test that argv[1] selects (all without an argument; see
/// selected(): "text", "-text", comma-separated).
inline int run_all(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  int run = 0, failed_tests = 0;
  for (const TestCase& t : registry()) {
    if (!selected(t.name, filter)) continue;
    const int before = failures();
    const auto t0 = std::chrono::steady_clock::now();
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    try {
      t.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: uncaught exception: %s\n", t.name, e.what());
      ++failures();
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const bool ok = failures() == before;
    failed_tests += ok ? 0 : 1;
    ++run;
    std::printf("[ %s ] %s (%.0f ms)\n", ok ? " OK " : "FAIL", t.name, ms);
    std::fflush(stdout);
  }
  std::printf("%d test(s) run, %d failed\n", run, failed_tests);
  return failed_tests == 0 && run > 0 ? 0 : 1;
}

}  // namespace qvg::testing

#define QVG_TEST_CAT2(a, b) a##b
#define QVG_TEST_CAT(a, b) QVG_TEST_CAT2(a, b)
#define QVG_TEST(name)                                                                                          \
  static void QVG_TEST_CAT(qvg_test_fn_, name)();                                                               \
  static ::qvg::testing::Registrar QVG_TEST_CAT(qvg_test_reg_, name)(#name, &QVG_TEST_CAT(qvg_test_fn_, name)); \
  static void QVG_TEST_CAT(qvg_test_fn_, name)()
/// Checks cond; on failure prints the expression and any `<<` context.
#define QVG_EXPECT(cond) \
  if (cond) {            \
  } else                 \
    ::qvg::testing::Failure(#cond, __FILE__, __LINE__)
