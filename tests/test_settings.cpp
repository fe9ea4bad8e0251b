// Tests of the settings table (qvg/settings.h, issue 23) and of what walks it:
//
//   * the caller's expectation of a snapshot (issue 23's defect): for every setting,
//     a cache saved with one value loads under an expectation differing only in that
//     setting -> InvalidArgument naming it, in both directions; a cache's own
//     snapshot always loads under its own settings (issue 27, item 3);
//   * the table's ranges are QuantArgs::validate's (lo and hi accepted, one past
//     refused), so the CLI and the binding, which read the table, agree with it;
//   * one text parser on every surface (issue 27, item 13): engine flags and
//     k_config/v_config read booleans, integers and reals by the same rule;
//     duplicate and empty k_config items are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "qvg/cache.h"
#include "qvg/error.h"
#include "qvg/settings.h"
#include "support/snapshot_fixtures.h"

namespace qvg {
namespace {

using Bytes = std::vector<uint8_t>;

// Every name of every enumeration of the table (canonical names).
const char* const kNames[] = {"chunk", "full",   "deferred", "incremental", "two_level", "compat", "fp8_e4m3",
                              "bf16",  "random", "kmeans++", "warm",        "off",       "mse"};

// A base where every setting matters: int4, incremental spans with refinement layers,
// block 8 of head_dim 8, per-role settings unset.
QuantArgs base_quant() {
  QuantArgs q = testing::small_incremental_quant(2.0);
  q.refine_recent = 1;
  q.refine_bits = 2;
  return q;
}

// Values of `s` other than q's that make a valid cache with small_cache_options().
std::vector<SettingValue> other_values(const Setting& s, const QuantArgs& q) {
  std::vector<SettingValue> cand;
  const SettingValue cur = s.get(q);
  switch (s.kind) {
    case SettingKind::Bits: cand = {SettingValue(), int64_t(2), int64_t(4)}; break;
    case SettingKind::Width: cand = {SettingValue(), int64_t(2), int64_t(4)}; break;
    case SettingKind::Int: {
      const int64_t c = std::holds_alternative<int64_t>(cur) ? std::get<int64_t>(cur) : 2;
      cand = {SettingValue(), c + 1, c - 1, c * 2, c / 2, int64_t(1), int64_t(8)};
      break;
    }
    case SettingKind::Bool: cand = {SettingValue(), true, false}; break;
    case SettingKind::Name:
      cand.push_back(SettingValue());
      for (const char* n : kNames) cand.push_back(std::string(n));
      break;
    case SettingKind::Real: cand = {0.0, 0.5, 3.0}; break;
    case SettingKind::Seed: cand = {uint64_t(1), uint64_t(99)}; break;
  }
  std::vector<SettingValue> out;
  for (const SettingValue& v : cand) {
    if (v == cur) continue;
    try {
      check_setting(s, v, s.name);
      QuantArgs t = q;
      s.set(t, v);
      if (s.get(t) == cur) continue;  // an alias of the current value
      t.validate_for_head_dim(testing::small_cache_options().head_dim);
      out.push_back(v);
    } catch (const InvalidArgument&) {
    }
  }
  return out;
}

// A cache of `q` after five chunks of 4 tokens, as snapshot bytes.
Bytes saved_with(const QuantArgs& q) {
  PackedCausalCache c(testing::small_cache_options(), q);
  for (int64_t i = 0; i < 5; ++i)
    (void)c.update(testing::lcg_kv(4, uint64_t(2 * i)), testing::lcg_kv(4, uint64_t(2 * i + 1)), 4 * i);
  return c.snapshot_bytes();
}

std::string load_error(const Bytes& b, const QuantArgs& want) {
  SnapshotExpectation x;
  x.options = testing::small_cache_options();
  x.quant = want;
  try {
    (void)PackedCausalCache::from_snapshot_bytes(b, x);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Settings, EverySettingOfTheSnapshotIsComparedWithTheCallersExpectation) {
  int checked = 0;
  for (const Setting& s : quant_settings()) {
    // The first base where the setting has another valid value (span_mode = deferred
    // needs refine_recent 0).
    QuantArgs base = base_quant();
    std::vector<SettingValue> others = other_values(s, base);
    if (others.empty()) {
      base.refine_recent = 0;
      others = other_values(s, base);
    }
    ASSERT_FALSE(others.empty()) << "no other valid value of " << s.name;
    for (const SettingValue& v : others) {
      QuantArgs other = base;
      s.set(other, v);
      const std::string want = "the snapshot's cache has " + std::string(s.name) + " = ";
      const Bytes a = saved_with(base), b = saved_with(other);
      EXPECT_EQ(load_error(a, base), "") << s.name;  // a cache's own snapshot loads
      EXPECT_EQ(load_error(b, other), "") << s.name;
      const std::string e1 = load_error(a, other), e2 = load_error(b, base);
      EXPECT_NE(e1.find(want), std::string::npos) << s.name << " = " << setting_text(v) << ": '" << e1 << "'";
      EXPECT_NE(e2.find(want), std::string::npos) << s.name << " = " << setting_text(v) << ": '" << e2 << "'";
      ++checked;
    }
  }
  EXPECT_GE(checked, int(quant_settings().size()));
}

TEST(Settings, ACachesOwnSnapshotLoadsWhateverItsUnusedSettings) {
  // Issue 27, item 3: refine_bits with refine_recent 0 (deferred and incremental spans).
  for (SpanMode mode : {SpanMode::Deferred, SpanMode::Incremental}) {
    QuantArgs q = testing::small_quant();
    q.span_mode = mode;
    q.refine_bits = 2;
    EXPECT_EQ(load_error(saved_with(q), q), "") << name(mode);
    QuantArgs four = q;
    four.refine_bits = 4;
    EXPECT_NE(load_error(saved_with(q), four).find("refine_bits = 2, the caller expects 4"), std::string::npos);
    EXPECT_NE(load_error(saved_with(four), q).find("refine_bits = 4, the caller expects 2"), std::string::npos);
  }
}

TEST(Settings, TheTableIsOneRowPerSettingWithItsOwnFlag) {
  std::vector<std::string> names;
  for (const Setting& s : quant_settings()) {
    EXPECT_EQ(find_setting(s.name), &s);
    if (!s.flag.empty()) {
      EXPECT_EQ(find_setting_by_flag(s.flag), &s);
    }
    for (const std::string& n : names) EXPECT_NE(n, s.name);
    names.emplace_back(s.name);
  }
  EXPECT_EQ(find_setting("threads"), nullptr);  // how a call runs, not a setting of the data
  EXPECT_EQ(quant_settings().size(), 20u + 2 * 9u);
}

TEST(Settings, TheTablesRangesAreValidatesRanges) {
  for (const Setting& s : quant_settings()) {
    if (s.kind != SettingKind::Int && s.kind != SettingKind::Real) continue;
    QuantArgs q = base_quant();
    q.codec.block_size = 8;
    auto valid = [&](double x) {
      QuantArgs t = q;
      s.set(t, s.kind == SettingKind::Real ? SettingValue(x) : SettingValue(int64_t(x)));
      try {
        t.validate();
        return true;
      } catch (const InvalidArgument&) {
        return false;
      }
    };
    if (s.name.ends_with("block_size")) continue;  // validate adds "a multiple of 8/bits": checked below
    EXPECT_TRUE(valid(double(s.lo))) << s.name;
    EXPECT_FALSE(valid(double(s.lo) - 1)) << s.name;
    if (s.hi < INT32_MAX) {
      EXPECT_TRUE(valid(double(s.hi))) << s.name;
      EXPECT_FALSE(valid(double(s.hi) + (s.kind == SettingKind::Real ? 0.5 : 1))) << s.name;
    }
  }
  QuantArgs q = base_quant();
  q.codec.block_size = 0;
  EXPECT_THROW(q.validate(), InvalidArgument);
}

TEST(Settings, OneParserOnEverySurface) {
  const Setting& asym = *find_setting("asymmetric");
  for (const char* t : {"true", "True", "1"}) EXPECT_EQ(parse_setting(asym, t, "x"), SettingValue(true)) << t;
  for (const char* t : {"false", "False", "0"}) EXPECT_EQ(parse_setting(asym, t, "x"), SettingValue(false)) << t;
  for (const char* t : {"yes", "on", "no", "off", "TRUE", " 1", ""})
    EXPECT_THROW((void)parse_setting(asym, t, "x"), InvalidArgument) << t;
  const Setting& ratio = *find_setting("span_break_ratio");
  for (const char* t : {"0x10", "0X1p3", "inf", "nan", "+1", " 1", "1,5", ""})
    EXPECT_THROW((void)parse_setting(ratio, t, "--span-break-ratio"), InvalidArgument) << t;
  EXPECT_EQ(parse_setting(ratio, "2.5", "x"), SettingValue(2.5));
  EXPECT_EQ(parse_setting(ratio, "1e3", "x"), SettingValue(1000.0));
  // The engine's flags and k_config read the same way.
  for (const char* t : {"yes", "on"}) {
    EXPECT_THROW((void)QuantArgs::from_flags({{"kv_cache_quant", "int4"}, {"kv_cache_quant_asymmetric", t}}),
                 InvalidArgument);
    EXPECT_THROW((void)parse_role_codec(std::string("asymmetric=") + t, "k_config"), InvalidArgument);
  }
  EXPECT_THROW((void)QuantArgs::from_flags({{"kv_cache_quant", "int4"}, {"kv_cache_quant_span_break_ratio", "0x10"}}),
               InvalidArgument);
  // k_config: no empty items, no field twice.
  for (const char* spec : {"bits=4,", ",bits=4", "bits=4,,centroids=8", "bits=4,bits=2", "centroids=8,centroids=8"})
    EXPECT_THROW((void)parse_role_codec(spec, "k_config"), InvalidArgument) << spec;
  const RoleCodec r = parse_role_codec("bits=int2,iters=3,asymmetric=1,scale_search=mse", "k_config");
  EXPECT_EQ(r.values.bits, 2);
  EXPECT_EQ(r.values.kmeans_iters, 3);
  EXPECT_EQ(r.values.asymmetric, true);
  EXPECT_EQ(r.values.scale_search, ScaleSearch::Mse);
  EXPECT_EQ(r, RoleCodec{}
                   .set(&CodecConfig::bits, 2)
                   .set(&CodecConfig::kmeans_iters, 3)
                   .set(&CodecConfig::asymmetric, true)
                   .set(&CodecConfig::scale_search, ScaleSearch::Mse));
  EXPECT_TRUE(parse_role_codec("", "k_config").empty());
}

// Issue 42, item 15: a misspelt engine flag (the settings' prefix, no setting of that
// name) is an error naming the nearest known one, for every flag of the table; keys
// outside the prefix stay ignored, as the engine ignores them.
TEST(Settings, AMisspeltFlagIsRefusedNamingTheNearestSetting) {
  auto message = [](const std::string& key) -> std::string {
    try {
      (void)QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {key, "64"}});
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("kv_cache_quant_centriods").find("nearest known setting: kv_cache_quant_centroids"),
            std::string::npos)
      << message("kv_cache_quant_centriods");
  int rows = 0;
  for (const Setting& s : quant_settings()) {
    if (s.flag.empty()) continue;
    const std::string flag = "kv_cache_quant" + std::string(s.flag);
    for (const std::string& typo : {flag + "s", flag.substr(0, flag.size() - 1) + "x"}) {
      const std::string m = message(typo);
      EXPECT_NE(m.find("unknown flag '" + typo + "'"), std::string::npos) << typo << ": " << m;
      EXPECT_NE(m.find("nearest known setting: " + flag + ")"), std::string::npos) << typo << ": " << m;
    }
    ++rows;
  }
  EXPECT_GT(rows, 30);
  EXPECT_NO_THROW((void)QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_qaunt_centroids", "64"}}));
  EXPECT_NO_THROW((void)QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"other_centriods", "64"}}));
}

}  // namespace
}  // namespace qvg
