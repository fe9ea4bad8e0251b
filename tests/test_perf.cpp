// Tests of the bookkeeping behind `qvg bench` (src/perf/perf.h) that needs no timing
// (docs/performance.md): the load check's verdict from given timings, and the report's
// table and JSON. No test here measures or asserts a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

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

// What `qvg bench` prints and writes (bench_report): the alias row labelled and its
// figures not repeated, the machine-load line, the WARNING only when busy, the JSON's
// machine_load object.
TEST(BenchReport, LabelsTheAliasAndReportsTheLoad) {
  Measurement a;
  a.name = "reconstruct_window_int2";
  a.t = timing(0.01, 0.02, 0.03);
  a.figures["ratio_to_copy"] = 1.5;
  a.note = "a window";
  Measurement alias = a;
  alias.name = "reconstruct_window";
  alias.alias_of = a.name;
  const LoadCheck busy = assess_load(timing(1.0, 1.5, 3.0), timing(1.0, 1.5, 3.0), 3.5, 2);
  const BenchReport r = bench_report({a, alias}, busy, "AVX2", true);
  EXPECT_NE(r.table.find(fmt::format("{:<28} {:>11} {:>11} {:>11}  ratio_to_copy=1.5 \n", "reconstruct_window_int2",
                                     "0.020000", "0.010000", "0.030000")),
            std::string::npos)
      << r.table;
  EXPECT_NE(r.table.find("\nreconstruct_window                     =           =           =  the row "
                         "reconstruct_window_int2 under a second name\n"),
            std::string::npos)
      << r.table;
  EXPECT_NE(r.table.find("machine load: copy spread 3.00x, drift 1.00x, load average 3.50 on 2 cores: BUSY\n"),
            std::string::npos)
      << r.table;
  EXPECT_NE(r.table.find("WARNING: this machine was busy during the run (" + busy.reason + ")"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(r.json);
  EXPECT_EQ(j["reconstruct_window"]["alias_of"], "reconstruct_window_int2");
  EXPECT_FALSE(j["reconstruct_window"].contains("ratio_to_copy"));
  EXPECT_EQ(j["reconstruct_window_int2"]["ratio_to_copy"], 1.5);
  EXPECT_EQ(j["target"], "AVX2");
  EXPECT_EQ(j["machine_load"]["loaded"], true);
  EXPECT_EQ(j["machine_load"]["reason"], busy.reason);
  EXPECT_EQ(j["machine_load"]["cores"], 2);
  // Quiet, and a load average that could not be read: no WARNING, null in the JSON.
  const LoadCheck quiet = assess_load(timing(1.0, 1.0, 1.1), timing(1.0, 1.0, 1.1), -1, 2);
  const BenchReport q = bench_report({a}, quiet, "AVX2", false);
  EXPECT_EQ(q.table.find("WARNING"), std::string::npos) << q.table;
  EXPECT_NE(q.table.find("load average n/a on 2 cores: quiet\n"), std::string::npos) << q.table;
  EXPECT_TRUE(nlohmann::json::parse(q.json)["machine_load"]["load_average_1m"].is_null());
}

}  // namespace
}  // namespace qvg::perf
