// Tests of the measurements' bookkeeping behind `qvg bench` (src/perf/perf.h) that
// need no timing: the load check's verdict from given timings (issue 39, item 7). No
// test here measures or asserts a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "perf/perf.h"

namespace qvg::perf {
namespace {

Timing timing(double min_s, double median_s, double max_s) {
  Timing t;
  t.min_s = min_s;
  t.median_s = median_s;
  t.max_s = max_s;
  t.reps = 5;
  return t;
}

TEST(LoadCheck, QuietWhenEverySignalIsWithinItsLimit) {
  const LoadCheck c = assess_load(timing(1.0, 1.1, 1.2), timing(1.0, 1.2, 1.3), 0.4, 2);
  EXPECT_FALSE(c.loaded) << c.reason;
  EXPECT_TRUE(c.reason.empty());
  EXPECT_DOUBLE_EQ(c.copy_spread, 1.2);
  EXPECT_DOUBLE_EQ(c.copy_drift, 1.2 / 1.1);
  EXPECT_EQ(c.cores, 2);
  // An unavailable load average (< 0) is not a signal.
  EXPECT_FALSE(assess_load(timing(1.0, 1.1, 1.2), timing(1.0, 1.1, 1.2), -1, 2).loaded);
}

TEST(LoadCheck, EachSignalAloneMakesTheRunBusyAndIsNamed) {
  const LoadCheck spread = assess_load(timing(1.0, 1.5, 3.0), timing(1.0, 1.5, 3.0), 0.1, 2);
  EXPECT_TRUE(spread.loaded);
  EXPECT_NE(spread.reason.find("3.00x apart"), std::string::npos) << spread.reason;
  const LoadCheck slower = assess_load(timing(1.0, 1.0, 1.1), timing(2.0, 2.0, 2.1), 0.1, 2);
  EXPECT_TRUE(slower.loaded);
  EXPECT_NE(slower.reason.find("2.00x as long at the end"), std::string::npos) << slower.reason;
  const LoadCheck faster = assess_load(timing(2.0, 2.0, 2.1), timing(1.0, 1.0, 1.1), 0.1, 2);
  EXPECT_TRUE(faster.loaded) << "a run that sped up was slowed down at its start";
  const LoadCheck busy = assess_load(timing(1.0, 1.0, 1.1), timing(1.0, 1.0, 1.1), 3.5, 2);
  EXPECT_TRUE(busy.loaded);
  EXPECT_NE(busy.reason.find("load average was 3.50 on 2 cores"), std::string::npos) << busy.reason;
  const LoadCheck all = assess_load(timing(1.0, 1.5, 3.0), timing(3.0, 3.0, 3.1), 3.5, 2);
  EXPECT_EQ(std::count(all.reason.begin(), all.reason.end(), ';'), 2) << all.reason;
}

}  // namespace
}  // namespace qvg::perf
