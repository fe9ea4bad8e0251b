// Tests of the settings table (qvg/settings.h) and of what walks it:
//
//   * the caller's expectation of a snapshot covers every setting: for each one,
//     a cache saved with one value loads under an expectation differing only in that
//     setting -> InvalidArgument naming it, in both directions; a cache's own
//     snapshot always loads under its own settings (docs/reliability.md, finding 20);
//   * the table's ranges are QuantArgs::validate's (lo and hi accepted, one past
//     refused), so the CLI and the binding, which read the table, agree with it;
//   * one text parser on every surface (docs/reliability.md, finding 27): engine flags and
//     k_config/v_config read booleans, integers and reals by the same rule;
//     duplicate and empty k_config items are refused;
//   * one codec struct: the codec rows read and write CodecConfig
//     members, RoleCodec is a CodecConfig plus a mask of the rows overridden, and the
//     overrides, equality, the profiles and the CLI walk the table;
//   * every width surface accepts exactly the widths of qvg/code_format.h (int3, qvg's
//     extension, included) and lists them in its messages.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "qvg/cache.h"
#include "qvg/code_format.h"
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
  // refine_bits with refine_recent 0 (deferred and incremental spans): a setting the
  // cache does not use is still stored, so the cache's own snapshot loads.
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

// A misspelt engine flag (the settings' prefix, no setting of that
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

// The codec's fields are CodecConfig's alone; the table's codec rows
// name its members, a per-role row reads and writes the role's RoleCodec::values plus
// its bit of RoleCodec::overridden, and the overrides apply by walking the table.
TEST(Settings, TheCodecRowsAreMembersOfOneCodecConfig) {
  std::vector<CodecField> shared;
  for (const Setting& s : quant_settings()) {
    if (!s.codec_row() || s.role) continue;
    for (const CodecField& f : shared) EXPECT_FALSE(f == s.field) << s.name << ": a member named twice";
    shared.push_back(s.field);
  }
  EXPECT_EQ(shared.size(), 11u);  // every member of CodecConfig but threads and head_offset
  for (const CacheRole role : {CacheRole::Key, CacheRole::Value}) {
    const std::span<const Setting> rows = role_settings(role);
    ASSERT_EQ(rows.size(), 9u);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Setting& r = rows[i];
      EXPECT_TRUE(r.role && r.tensor == role && r.codec_row()) << r.name;
      // The same member as the shared row of its name, the same bit in both roles.
      const Setting* sh = find_setting(r.name.substr(2));
      ASSERT_NE(sh, nullptr) << r.name;
      EXPECT_TRUE(sh->field == r.field) << r.name;
      EXPECT_EQ(RoleCodec::field_bit(r.field), 1u << i) << r.name;
      EXPECT_TRUE(role_settings(role == CacheRole::Key ? CacheRole::Value : CacheRole::Key)[i].field == r.field);
    }
  }
  // Through the table: setting a role's row sets its value and bit; none clears both.
  QuantArgs q;
  const Setting& kb = *find_setting("k_centroids");
  kb.set(q, int64_t(16));
  EXPECT_TRUE(q.k.has(&CodecConfig::centroids));
  EXPECT_FALSE(q.k.has(&CodecConfig::bits));
  EXPECT_EQ(q.k.values.centroids, 16);
  EXPECT_TRUE(q.v.empty());
  EXPECT_EQ(q.k, RoleCodec{}.set(&CodecConfig::centroids, 16));
  EXPECT_EQ(kb.get(q), SettingValue(int64_t(16)));
  kb.set(q, SettingValue());
  EXPECT_TRUE(q.k.empty());
  EXPECT_EQ(kb.get(q), SettingValue());
  EXPECT_EQ(q.k, RoleCodec{});
  // Equality looks at the overridden fields only.
  RoleCodec a, b;
  a.values.stages = 3;  // not overridden: does not count
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a == RoleCodec{}.set(&CodecConfig::stages, 3));
  // codec_for = the shared codec with the role's overridden fields, and only those.
  q.enable(2);
  q.codec.centroids = 64;
  q.codec.seed = 9;
  q.k.set(&CodecConfig::bits, 4).set(&CodecConfig::scaling, Scaling::Compat);
  q.k.values.centroids = 200;  // not overridden: K keeps the shared 64
  CodecConfig want = q.codec;
  want.bits = 4;
  want.scaling = Scaling::Compat;
  EXPECT_EQ(q.codec_for(CacheRole::Key), want);
  EXPECT_EQ(q.codec_for(CacheRole::Value), q.codec);
  EXPECT_EQ(q.k.describe("k_"), "k_bits=4 k_scaling=compat");
  // The bits row: none is quantization off (the width is kept for when it is on again).
  const Setting& bits = *find_setting("bits");
  EXPECT_EQ(bits.get(q), SettingValue(int64_t(2)));
  bits.set(q, SettingValue());
  EXPECT_FALSE(q.enabled());
  EXPECT_EQ(bits.get(q), SettingValue());
  EXPECT_EQ(q.describe(), "kv_cache_quant=off");
  bits.set(q, int64_t(3));
  EXPECT_TRUE(q.enabled());
  EXPECT_EQ(q.codec.bits, 3);
}

// Every surface accepts exactly the widths of qvg/code_format.h, from the
// rows alone (int3 is qvg's; int2 and int4 the engine's), and names them in its messages.
// A refinement layer is quantized over its encoding's blocks: each role's block_size
// must hold whole code groups of refine_bits' width too (8 channels at 3 bits), or
// the cache would refuse its first refined chunk in the middle of an update.
TEST(Settings, RefinementWidthNeedsWholeCodeGroupsInEveryRolesBlocks) {
  auto flags = [](std::string block, std::string refine_bits, std::string v_block = "") {
    std::map<std::string, std::string> f = {{"kv_cache_quant", "int2"},
                                            {"kv_cache_quant_block_size", block},
                                            {"kv_cache_quant_span_mode", "incremental"},
                                            {"kv_cache_quant_refine_recent", "2"},
                                            {"kv_cache_quant_refine_bits", refine_bits}};
    if (!v_block.empty()) f["kv_cache_quant_v_block_size"] = v_block;
    return f;
  };
  EXPECT_NO_THROW(QuantArgs::from_flags(flags("8", "3")));
  EXPECT_NO_THROW(QuantArgs::from_flags(flags("4", "2")));
  for (const auto& [f, want] : std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {flags("4", "3"),
            "refine_bits = 3 needs a block_size that is a multiple of 8 (the 3-bit code group; a refinement layer "
            "shares the encoding's blocks), got block_size = 4 for K"},
           {flags("8", "3", "12"), "got block_size = 12 for V"}}) {
    try {
      (void)QuantArgs::from_flags(f);
      ADD_FAILURE() << "accepted; wanted " << want;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  // Without refinement layers (refine_recent 0) the width is not used: accepted.
  auto off = flags("4", "3");
  off["kv_cache_quant_refine_recent"] = "0";
  EXPECT_NO_THROW(QuantArgs::from_flags(off));
}

TEST(Settings, EveryWidthSurfaceTakesTheCodeFormatTable) {
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  for (const CodeFormat& f : kCodeFormats) {
    const std::string mode = f.mode, w = std::to_string(f.bits);
    SCOPED_TRACE(mode);
    // The engine's master flag, the per-role flags (number or mode) and refine_bits.
    const QuantArgs q = QuantArgs::from_flags({{"kv_cache_quant", mode},
                                               {"kv_cache_quant_k_bits", mode},
                                               {"kv_cache_quant_v_bits", w},
                                               {"kv_cache_quant_span_mode", "incremental"},
                                               {"kv_cache_quant_refine_recent", "1"},
                                               {"kv_cache_quant_refine_bits", w}});
    EXPECT_TRUE(q.enabled());
    EXPECT_EQ(q.codec.bits, f.bits);
    EXPECT_EQ(q.codec_for(CacheRole::Key).bits, f.bits);
    EXPECT_EQ(q.codec_for(CacheRole::Value).bits, f.bits);
    EXPECT_EQ(q.refine_bits, f.bits);
    EXPECT_EQ(q.describe().substr(0, 20), "kv_cache_quant=" + mode + " ");
    // k_config / v_config.
    EXPECT_EQ(parse_role_codec("bits=" + mode, "k_config").values.bits, f.bits);
    EXPECT_EQ(parse_role_codec("bits=" + w, "k_config").values.bits, f.bits);
    // The table's own checks.
    for (const char* name : {"bits", "k_bits", "v_bits", "refine_bits"})
      EXPECT_NO_THROW(check_setting(*find_setting(name), int64_t(f.bits), name)) << name;
    // The block-size rule is the row's group.
    QuantArgs b = q;
    b.codec.block_size = f.group_codes * 8;
    EXPECT_NO_THROW(b.validate());
    if (f.group_codes > 1) {
      b.codec.block_size = f.group_codes * 8 + 1;
      EXPECT_NE(
          error_of([&] { b.validate(); }).find("block_size must be a multiple of " + std::to_string(f.group_codes)),
          std::string::npos);
    }
  }
  // Widths without a row: refused everywhere, the message listing the table's.
  const std::string widths = known_code_widths(), modes = known_code_widths(true);
  EXPECT_EQ(widths, "2, 3 or 4");
  EXPECT_EQ(error_of([] {
              (void)QuantArgs::from_flags({{"kv_cache_quant", "int5"}});
            }),
            "kv_cache_quant must be one of off, none, bf16, " + modes + ", got 'int5'");
  EXPECT_EQ(error_of([] {
              (void)QuantArgs::from_flags({{"kv_cache_quant", "int4"}, {"kv_cache_quant_k_bits", "8"}});
            }),
            "kv_cache_quant_k_bits must be " + widths + " (or " + modes + "), got '8'");
  EXPECT_EQ(error_of([] {
              (void)QuantArgs::from_flags({{"kv_cache_quant", "int4"},
                                           {"kv_cache_quant_span_mode", "incremental"},
                                           {"kv_cache_quant_refine_bits", "5"}});
            }),
            "refine_bits must be " + widths + ", got 5");
  EXPECT_NE(error_of([] { (void)parse_role_codec("bits=int1", "--k-config"); }).find("must be " + widths),
            std::string::npos);
  QuantArgs q;
  q.enable(5);
  EXPECT_EQ(error_of([&] { q.validate(); }), "bits must be " + widths + " (or none to disable quantization), got 5");
  for (const char* name : {"bits", "k_bits", "refine_bits"})
    EXPECT_THROW(check_setting(*find_setting(name), int64_t(1), name), InvalidArgument) << name;
}

// The profiles set every codec setting but the width and the seed (walking the table),
// and leave threads alone.
TEST(Settings, AProfileSetsEveryCodecSettingButWidthAndSeed) {
  QuantArgs q;
  q.enable(3);
  q.codec.centroids = 7;
  q.codec.block_size = 16;
  q.codec.stages = 3;
  q.codec.kmeans_iters = 9;
  q.codec.scale_dtype = ScaleDType::BF16;
  q.codec.init = Init::KMeansPlusPlus;
  q.codec.seed = 77;
  q.codec.threads = 2;
  q.k.set(&CodecConfig::centroids, 5);
  q.apply_profile("reference");
  CodecConfig want;
  want.bits = 3;
  want.seed = 77;
  want.threads = 2;
  want.scaling = Scaling::Compat;
  EXPECT_EQ(q.codec, want);
  EXPECT_TRUE(q.k.empty() && q.v.empty());
  QuantArgs off;
  off.apply_profile("hq");
  EXPECT_TRUE(off.enabled());
  EXPECT_EQ(off.codec.bits, 2);  // a profile turns quantization on at the engine's int2
}

}  // namespace
}  // namespace qvg
