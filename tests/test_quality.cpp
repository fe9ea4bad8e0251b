// The MSE-optimal scale search (docs/quality.md; same stored form, spec 1.2's bound,
// never worse than the block maximum), per-role codec settings (config, flags, packed
// cache, memory model, snapshots 1.3), the profiles, and the frontier's report.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "codec/encode_impl.h"
#include "core/residual_impl.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "qvg/eval/frontier.h"
#include "qvg/eval/memory.h"
#include "qvg/eval/workload.h"
#include "qvg/numeric.h"
#include "support/data.h"

namespace qvg {
using testing::random_tensor;

namespace {

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> v(size_t(t.shape().numel()));
  convert_to_f32(t.data(), t.dtype(), v.data(), v.size());
  return v;
}

struct Case {
  int bits;
  bool asym;
  Scaling scaling;
  ScaleDType sd;
};

std::vector<Case> all_cases() {
  std::vector<Case> c;
  for (int bits : {2, 4})
    for (bool asym : {false, true})
      for (Scaling sc : {Scaling::TwoLevel, Scaling::Compat})
        for (ScaleDType sd : {ScaleDType::FP8_E4M3, ScaleDType::BF16}) c.push_back({bits, asym, sc, sd});
  return c;
}

// The codec of a case (16 centroids, scale search off).
CodecConfig config_of(const Case& k) {
  CodecConfig c;
  c.bits = k.bits, c.asymmetric = k.asym, c.scaling = k.scaling, c.scale_dtype = k.sd, c.centroids = 16;
  return c;
}

// V-like data: magnitudes in the hundreds (compat int2 scales saturate at 448).
Tensor v_like(uint64_t seed) {
  return random_tensor({1, 200, 2, 64}, DType::F32, seed, 300.0f, 20.0f);
}

// `off` is the default, and it changes no byte: its stored scales (and zeros) are
// spec 1.2's block-maximum rule, recomputed here from the encoding's own final
// residual (x minus its centroids) — while `mse` changes some of them.
TEST(ScaleSearch, OffIsTheDefaultAndChangesNoByte) {
  EXPECT_EQ(CodecConfig{}.scale_search, ScaleSearch::Off);
  EXPECT_EQ(QuantArgs{}.codec.scale_search, ScaleSearch::Off);
  const Tensor x = v_like(1);
  int cases_where_mse_differs = 0;
  for (const Case& k : all_cases()) {
    SCOPED_TRACE(::testing::Message() << "bits " << k.bits << " asym " << k.asym << " scaling " << name(k.scaling)
                                      << " scales " << name(k.sd));
    const CodecConfig off = config_of(k);  // scale_search left at its default
    const EncodedTensor e = encode(x.view(), off);
    const bool fp8 = k.sd == ScaleDType::FP8_E4M3, divide = fp8 && k.scaling == Scaling::TwoLevel;
    const int qmax = k.asym ? (1 << k.bits) - 1 : (1 << (k.bits - 1)) - 1;
    const Shape4 sh = x.shape();
    const int64_t nb = sh.d / e.block_size;
    int64_t blocks = 0, equal = 0;
    for (int64_t h = 0; h < sh.h; ++h) {
      // The final residual of every block (one stage: x - centroid[id]) and its raw scale.
      std::vector<float> raw_s, raw_z;
      for (int64_t t = 0; t < sh.s; ++t)
        for (int64_t blk = 0; blk < nb; ++blk) {
          float lo = INFINITY, hi = -INFINITY, amax = 0;
          for (int64_t d = blk * e.block_size; d < (blk + 1) * e.block_size; ++d) {
            const int id = e.ids[0][size_t(h * sh.s + t)];
            const float r = x.at(0, t, h, d) - e.centroid_at(0, 0, h, id, d);
            lo = std::min(lo, r), hi = std::max(hi, r), amax = std::max(amax, std::fabs(r));
          }
          raw_s.push_back(k.asym ? std::max((hi - lo) / float(qmax), 1e-10f) : std::max(amax, 1e-10f) / float(qmax));
          raw_z.push_back(lo);
        }
      float ms = 0, mz = 0;
      for (size_t i = 0; i < raw_s.size(); ++i) ms = std::max(ms, raw_s[i]), mz = std::max(mz, std::fabs(raw_z[i]));
      const float g = divide ? (ms / 448.0f > 0 ? ms / 448.0f : 1.0f) : 1.0f;
      const float gz = divide && k.asym ? (mz / 448.0f > 0 ? mz / 448.0f : 1.0f) : 1.0f;
      auto stored = [&](float v) { return fp8 ? fp8e4m3_to_f32(f32_to_fp8e4m3(v)) : bf16_to_f32(f32_to_bf16(v)); };
      for (int64_t t = 0; t < sh.s; ++t)
        for (int64_t blk = 0; blk < nb; ++blk) {
          const size_t i = size_t(t * nb + blk);
          const bool s_ok = e.scale_eff(0, h, t, blk) == stored(raw_s[i] / g) * g;
          const bool z_ok = !k.asym || e.zero_eff(0, h, t, blk) == stored(raw_z[i] / gz) * gz;
          ++blocks;
          equal += s_ok && z_ok;
        }
    }
    EXPECT_EQ(equal, blocks);  // every block: the block-maximum rule
    CodecConfig mse = off;
    mse.scale_search = ScaleSearch::Mse;
    cases_where_mse_differs += !(encode(x.view(), mse) == e);
  }
  EXPECT_EQ(cases_where_mse_differs, int(all_cases().size()));
}

TEST(ScaleSearch, WithinTheBoundAndNeverWorseThanTheBlockMaximum) {
  for (uint64_t seed : {1u, 2u, 3u})
    for (const Case& k : all_cases()) {
      SCOPED_TRACE(::testing::Message() << "bits " << k.bits << " asym " << k.asym << " scaling " << name(k.scaling)
                                        << " scales " << name(k.sd) << " seed " << seed);
      const Tensor x = v_like(seed);
      const CodecConfig off = config_of(k);
      CodecConfig mse = off;
      mse.scale_search = ScaleSearch::Mse;
      const EncodedTensor eo = encode(x.view(), off), em = encode(x.view(), mse);
      // Same k-means (the search changes only the residual's scales and zeros).
      EXPECT_EQ(eo.ids, em.ids);
      EXPECT_EQ(eo.centroid, em.centroid);
      const std::vector<float> xv = as_f32(x), dm = as_f32(decode(em)), dof = as_f32(decode(eo));
      const int qmax = residual_impl::qmax_of(k.bits, k.asym);
      double err_m = 0, err_o = 0;
      const Shape4 sh = x.shape();
      for (int64_t s = 0; s < sh.s; ++s)
        for (int64_t h = 0; h < sh.h; ++h)
          for (int64_t d = 0; d < sh.d; ++d) {
            const size_t i = size_t((s * sh.h + h) * sh.d + d);
            // The residual the codec quantized: x minus the (shared) stored centroid.
            const float c = em.centroid_at(0, 0, h, em.ids[0][size_t(h * sh.s + s)], d);
            const float r = xv[i] - c;
            const float se = em.scale_eff(0, h, s, d / em.block_size);
            const float lo = k.asym ? em.zero_eff(0, h, s, d / em.block_size) : -float(qmax) * se;
            const float hi = k.asym ? lo + float(qmax) * se : float(qmax) * se;
            const double dist = r < lo ? lo - r : (r > hi ? r - hi : 0.0);
            const double bound = se / 2 + dist + 1e-4 * (std::fabs(xv[i]) + 1);
            ASSERT_LE(std::fabs(double(dm[i]) - double(xv[i])), bound) << "element " << i;
            err_m += (double(dm[i]) - xv[i]) * (double(dm[i]) - xv[i]);
            err_o += (double(dof[i]) - xv[i]) * (double(dof[i]) - xv[i]);
          }
      EXPECT_LE(err_m, err_o * (1 + 1e-5));
    }
}

TEST(ScaleSearch, HelpsInt2OnVLikeData) {
  // Why a search: a block scale at the block maximum is far from MSE-optimal for
  // the 3-level symmetric int2 quantizer.
  const Tensor x = v_like(7);
  CodecConfig off;
  off.bits = 2;
  off.centroids = 16;
  CodecConfig mse = off;
  mse.scale_search = ScaleSearch::Mse;
  const std::vector<float> xv = as_f32(x), a = as_f32(decode(encode(x.view(), off))),
                           b = as_f32(decode(encode(x.view(), mse)));
  double ea = 0, eb = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    ea += (a[i] - xv[i]) * (a[i] - xv[i]);
    eb += (b[i] - xv[i]) * (b[i] - xv[i]);
  }
  EXPECT_LT(eb, 0.8 * ea);
}

TEST(ScaleSearch, SameBytesWhateverTheThreadCount) {
  const Tensor x = random_tensor({2, 150, 3, 64}, DType::BF16, 11, 5.0f);
  CodecConfig c;
  c.bits = 2;
  c.asymmetric = true;
  c.centroids = 32;
  c.scale_search = ScaleSearch::Mse;
  c.threads = 1;
  const EncodedTensor one = encode(x.view(), c);
  c.threads = 3;
  EXPECT_EQ(one, encode(x.view(), c));
}

TEST(QuantArgsPerRole, FlagsProfileAndValidation) {
  QuantArgs a = QuantArgs::from_flags({{"kv_cache_quant", "int2"},
                                       {"kv_cache_quant_v_asymmetric", "true"},
                                       {"kv_cache_quant_k_bits", "int4"},
                                       {"kv_cache_quant_k_centroids", "64"},
                                       {"kv_cache_quant_scale_search", "mse"}});
  EXPECT_TRUE(a.per_role());
  EXPECT_EQ(a.codec_for(CacheRole::Key).bits, 4);
  EXPECT_EQ(a.codec_for(CacheRole::Key).centroids, 64);
  EXPECT_FALSE(a.codec_for(CacheRole::Key).asymmetric);
  EXPECT_EQ(a.codec_for(CacheRole::Value).bits, 2);
  EXPECT_TRUE(a.codec_for(CacheRole::Value).asymmetric);
  EXPECT_EQ(a.codec_for(CacheRole::Value).scale_search, ScaleSearch::Mse);
  EXPECT_NE(a.describe().find("k_bits=4"), std::string::npos);
  // Unknown per-role fields are still errors, naming the key.
  try {
    QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_k_seed", "3"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("kv_cache_quant_k_seed"), std::string::npos);
  }
  EXPECT_THROW(QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_v_bits", "5"}}), InvalidArgument);
  // A per-role value out of range names the role.
  try {
    QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_v_centroids", "300"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("V settings"), std::string::npos) << e.what();
  }
  // The profile: applied first, explicit keys override it (std::map orders the keys,
  // so "_asymmetric" precedes "_profile" and must still win).
  const QuantArgs hq = QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", "hq"}});
  EXPECT_EQ(hq.codec.scale_search, ScaleSearch::Mse);
  EXPECT_TRUE(hq.codec.asymmetric);
  const QuantArgs o = QuantArgs::from_flags(
      {{"kv_cache_quant", "int4"}, {"kv_cache_quant_asymmetric", "false"}, {"kv_cache_quant_profile", "hq"}});
  EXPECT_FALSE(o.codec.asymmetric);
  EXPECT_EQ(o.codec.bits, 4);
  EXPECT_EQ(o.codec.scale_search, ScaleSearch::Mse);
  const QuantArgs ref = QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", "reference"}});
  EXPECT_EQ(ref.codec.scaling, Scaling::Compat);
  EXPECT_EQ(ref.codec.scale_search, ScaleSearch::Off);
  EXPECT_THROW(QuantArgs::from_flags({{"kv_cache_quant", "int2"}, {"kv_cache_quant_profile", "best"}}),
               InvalidArgument);
  // The engine's defaults are unchanged.
  const QuantArgs d = QuantArgs::from_flags({{"kv_cache_quant", "int2"}});
  EXPECT_EQ(d.codec.scaling, Scaling::TwoLevel);
  EXPECT_FALSE(d.per_role());
  EXPECT_EQ(d.codec_for(CacheRole::Key), d.codec);
  // parse_role_codec.
  const RoleCodec r = parse_role_codec("bits=4,asymmetric=true", "--k-config");
  EXPECT_TRUE(r.has(&CodecConfig::bits) && r.has(&CodecConfig::asymmetric) && !r.has(&CodecConfig::centroids));
  EXPECT_EQ(r.values.bits, 4);
  EXPECT_EQ(r.values.asymmetric, true);
  EXPECT_THROW(parse_role_codec("nope=1", "--k-config"), InvalidArgument);
  EXPECT_THROW(parse_role_codec("bits", "--k-config"), InvalidArgument);
}

// The recommended profile (docs/quality.md) is hq's codec (more k-means) plus a cache
// policy; explicit flags override any of it; an unknown name changes nothing.
TEST(Profiles, RecommendedIsHqsCodecInAnIncrementalPolicy) {
  QuantArgs r;
  r.apply_profile("recommended");
  EXPECT_TRUE(r.enabled());
  EXPECT_EQ(r.codec.bits, 2);
  EXPECT_EQ(r.codec.scaling, Scaling::TwoLevel);
  EXPECT_EQ(r.codec.scale_search, ScaleSearch::Mse);
  EXPECT_TRUE(r.codec.asymmetric);
  EXPECT_EQ(r.codec.centroids, QuantArgs{}.codec.centroids);
  EXPECT_EQ(r.codec.block_size, QuantArgs{}.codec.block_size);
  // V's scale search off (per role), 2 k-means iterations (the default).
  EXPECT_TRUE(r.per_role());
  EXPECT_EQ(r.codec_for(CacheRole::Key).scale_search, ScaleSearch::Mse);
  EXPECT_EQ(r.codec_for(CacheRole::Value).scale_search, ScaleSearch::Off);
  EXPECT_EQ(r.codec.kmeans_iters, QuantArgs{}.codec.kmeans_iters);
  EXPECT_EQ(r.codec.init, Init::Random);  // what the device cache runs too
  EXPECT_EQ(r.span_chunks, 4);
  EXPECT_EQ(r.span_mode, SpanMode::Incremental);
  EXPECT_EQ(r.span_break_ratio, 0.0);
  EXPECT_EQ(r.keep_recent_chunks, 0);
  EXPECT_EQ(r.sink_keep_chunks, 0);
  EXPECT_EQ(r.refine_recent, 4);
  EXPECT_EQ(r.refine_bits, 4);
  EXPECT_TRUE(r.sink);
  EXPECT_NO_THROW(r.validate());
  // Its codec is hq's, V's without the scale search.
  QuantArgs hq;
  hq.apply_profile("hq");
  EXPECT_EQ(r.codec_for(CacheRole::Key), hq.codec_for(CacheRole::Key));
  hq.v.set(&CodecConfig::scale_search, ScaleSearch::Off);
  EXPECT_EQ(r.codec_for(CacheRole::Value), hq.codec_for(CacheRole::Value));
  // hq and reference leave the policy as it is.
  QuantArgs p;
  p.span_chunks = 3;
  p.keep_recent_chunks = 2;
  p.apply_profile("hq");
  p.apply_profile("reference");
  EXPECT_EQ(p.span_chunks, 3);
  EXPECT_EQ(p.keep_recent_chunks, 2);
  EXPECT_EQ(p.span_mode, SpanMode::Deferred);
  // The engine's flags: the profile first, explicit keys override it whatever their order.
  const QuantArgs f = QuantArgs::from_flags({{"kv_cache_quant", "int4"},
                                             {"kv_cache_quant_keep_recent", "1"},
                                             {"kv_cache_quant_refine_recent", "2"},
                                             {"kv_cache_quant_profile", "recommended"}});
  EXPECT_EQ(f.codec.bits, 4);
  EXPECT_EQ(f.keep_recent_chunks, 1);
  EXPECT_EQ(f.refine_recent, 2);
  EXPECT_EQ(f.span_mode, SpanMode::Incremental);
  EXPECT_EQ(f.codec.scale_search, ScaleSearch::Mse);
  // Without kv_cache_quant nothing is read (the engine's default: off).
  EXPECT_FALSE(QuantArgs::from_flags({{"kv_cache_quant_profile", "recommended"}}).enabled());
  // An unknown name: InvalidArgument naming the accepted ones; nothing changed.
  QuantArgs u;
  u.span_chunks = 5;
  const std::string before = u.describe();
  try {
    u.apply_profile("recommend");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("reference, hq, recommended, got 'recommend'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(u.describe(), before);
  EXPECT_FALSE(u.enabled());
}

// The recommended profile's memory: at full size its policy peak is at
// most the engine's default's (int2, the reference profile's codec, spans of one
// chunk, keep_recent 1) on Self-Forcing, LingBot-World and HY-WorldPlay (the memory
// model `qvg simulate` reports; the quality half is measured in docs/quality.md).
TEST(Profiles, RecommendedPeaksNoHigherThanTheEnginesDefault) {
  for (const char* name : {"self-forcing-1.3b", "lingbot-world-14b", "hy-worldplay-8b"}) {
    const ModelPreset& preset = find_model_preset(name);
    QuantArgs engine, rec;
    engine.enable(2);
    engine.apply_profile("reference");
    rec.apply_profile("recommended");
    engine.sink_span = rec.sink_span = preset.sink_policy;
    const MemoryShape s = MemoryShape::of(preset);
    const MemoryReport e = memory_report(s, engine), r = memory_report(s, rec);
    EXPECT_LE(r.policy_peak_bytes, e.policy_peak_bytes) << name;
    EXPECT_GT(r.peak_step.refine_bytes, 0u) << name;
  }
}

TEST(QuantArgsPerRole, MemoryModelCountsEachRole) {
  MemoryShape s;
  s.heads = 4;
  s.head_dim = 128;
  s.chunk_tokens = 100;
  s.context_tokens = 800;
  s.dtype = DType::BF16;
  QuantArgs a;
  a.enable(2);
  const MemoryReport base = memory_report(s, a);
  QuantArgs b = a;
  b.v.set(&CodecConfig::bits, 4);
  const MemoryReport r = memory_report(s, b);
  // V's codes double: the difference is V's extra 2 bits per element.
  EXPECT_EQ(r.packed_context_bytes - base.packed_context_bytes,
            size_t(s.context_tokens * s.heads * s.head_dim) * 2 / 8);
}

TEST(QuantArgsPerRole, PackedCacheEncodesEachRoleWithItsSettingsAndSnapshotsThem) {
  CacheOptions o;
  o.cache_size = 64;
  o.heads = 2;
  o.head_dim = 64;
  o.dtype = DType::F32;
  QuantArgs q;
  q.enable(2);
  q.codec.centroids = 8;
  q.keep_recent_chunks = 0;
  q.codec.scale_search = ScaleSearch::Mse;
  q.k.set(&CodecConfig::bits, 4);
  q.v.set(&CodecConfig::asymmetric, true);
  PackedCausalCache c(o, q);
  for (int i = 0; i < 3; ++i) {
    const Tensor k = random_tensor({1, 16, 2, 64}, DType::F32, uint64_t(10 + i));
    const Tensor v = random_tensor({1, 16, 2, 64}, DType::F32, uint64_t(20 + i), 50.0f);
    c.update(k.view(), v.view(), 16 * i);
  }
  ASSERT_GE(c.num_segments(), 2u);
  const auto s = c.segment(0);
  ASSERT_TRUE(s.packed);
  EXPECT_EQ(s.k_enc->bits, 4);
  EXPECT_FALSE(s.k_enc->asymmetric);
  EXPECT_EQ(s.v_enc->bits, 2);
  EXPECT_TRUE(s.v_enc->asymmetric);
  // The encodings are the codec's with each role's settings: segment 0 holds chunk
  // [0, 16), encoded exactly as encode() encodes it with q.codec(Key) / q.codec(Value)
  // (and not as with the other role's settings, which differ in bits and asymmetry).
  {
    const Tensor k0 = random_tensor({1, 16, 2, 64}, DType::F32, 10);
    const Tensor v0 = random_tensor({1, 16, 2, 64}, DType::F32, 20, 50.0f);
    ASSERT_EQ(s.g0, 0);
    ASSERT_EQ(s.g1, 16);
    EXPECT_TRUE(*s.k_enc == encode(k0.view(), q.codec_for(CacheRole::Key)));
    EXPECT_TRUE(*s.v_enc == encode(v0.view(), q.codec_for(CacheRole::Value)));
    EXPECT_FALSE(*s.k_enc == encode(k0.view(), q.codec_for(CacheRole::Value)));
    EXPECT_FALSE(*s.v_enc == encode(v0.view(), q.codec_for(CacheRole::Key)));
    EXPECT_EQ(q.codec_for(CacheRole::Key).scale_search, ScaleSearch::Mse);  // the shared setting reaches both
    EXPECT_EQ(q.codec_for(CacheRole::Value).scale_search, ScaleSearch::Mse);
  }
  // Snapshot format 1.3 holds the per-role settings and the scale search.
  const std::vector<uint8_t> bytes = c.snapshot_bytes();
  ASSERT_GE(bytes.size(), 12u);
  EXPECT_EQ(bytes[10] | (bytes[11] << 8), 3);
  PackedCausalCache l = PackedCausalCache::from_snapshot_bytes(bytes);
  auto same = [](const PackedCausalCache& x, const PackedCausalCache& y) {
    auto a = qvg::detail::debug_state(x), b = qvg::detail::debug_state(y);
    a.view_scratch.clear(), b.view_scratch.clear();
    a.peak_transient_nbytes = b.peak_transient_nbytes = 0;
    return a == b;
  };
  EXPECT_TRUE(same(l, c));
  // Both encode the next chunk alike (K with K's settings, V with V's).
  const Tensor k = random_tensor({1, 16, 2, 64}, DType::F32, 99);
  const Tensor v = random_tensor({1, 16, 2, 64}, DType::F32, 98, 50.0f);
  c.update(k.view(), v.view(), 48);
  l.update(k.view(), v.view(), 48);
  EXPECT_TRUE(same(l, c));
  // Without the new settings a snapshot stays 1.0.
  QuantArgs plain;
  plain.enable(2);
  plain.codec.centroids = 8;
  PackedCausalCache p(o, plain);
  const std::vector<uint8_t> pb = p.snapshot_bytes();
  EXPECT_EQ(pb[10] | (pb[11] << 8), 0);
}

TEST(Frontier, QuickRunMarksParetoReferenceAndProfile) {
  FrontierConfig f;
  f.scale = 0.05;
  f.layers = 1;
  f.context_chunks = 2;
  f.quick = true;
  f.max_rounds = 1;
  f.query_stride = 16;
  const FrontierResult r = frontier(f);
  ASSERT_GT(r.points.size(), 10u);
  EXPECT_EQ(r.points[r.reference].label, "reference default");
  EXPECT_EQ(r.points[r.reference].codec, [] {
    FrontierCodec c = reference_codec();
    c.k.seed = c.v.seed = 1234;
    return c;
  }());
  EXPECT_EQ(r.points[r.profile].label, "hq profile");
  bool any_pareto = false;
  for (const FrontierPoint& p : r.points) any_pareto = any_pareto || p.pareto;
  EXPECT_TRUE(any_pareto);
  // No Pareto point is dominated.
  for (const FrontierPoint& p : r.points) {
    if (!p.pareto) continue;
    for (const FrontierPoint& o : r.points)
      EXPECT_FALSE(o.bits_per_element < p.bits_per_element && o.attention.rel_l2() < p.attention.rel_l2());
  }
  // Baselines at 2, 3 and 4 bits, two group sizes, three methods.
  int baselines = 0;
  for (const FrontierPoint& p : r.points) baselines += p.method != "qvg";
  EXPECT_EQ(baselines, 18);
  // qvg's own points cover the baselines' range of rates (docs/quality.md), quick runs
  // included: hq with V at 4 bits, hq at 4 bits, the reference at 4 bits, and hq with a
  // 2-bit refinement layer on every chunk, whose bytes are exactly the layers'.
  std::map<std::string, const FrontierPoint*> range;
  for (const FrontierPoint& p : r.points)
    if (p.stage == "range") range[p.label] = &p;
  ASSERT_EQ(range.size(), 4u);
  const FrontierPoint& hq = r.points[r.profile];
  const FrontierPoint *v4 = range["hq, V at 4 bits"], *hq4 = range["hq at 4 bits"],
                      *ref4 = range["reference at 4 bits"], *refined = range["hq + 2-bit refinement layers"];
  ASSERT_TRUE(v4 && hq4 && ref4 && refined);
  EXPECT_NEAR(v4->bits_per_element, hq.bits_per_element + 1.0, 1e-9) << "V's codes: 2 more bits, half the elements";
  EXPECT_NEAR(hq4->bits_per_element, hq.bits_per_element + 2.0, 1e-9);
  EXPECT_GT(ref4->bits_per_element, 4.0);
  EXPECT_EQ(refined->codec.refinement_layer_bits, 2);
  const int64_t ct = r.preset.chunk_tokens(), H = r.preset.heads, D = r.preset.head_dim;
  const size_t layer =
      EncodedTensor::predicted_nbytes({1, ct, H, D}, DType::F32, refinement_config(2, hq.codec.k.block_size, 1234));
  const double elements = 2.0 * double(r.context_tokens * H * D) * double(r.layers.size());
  const double layers = 2.0 * double(r.context_chunks) * double(r.layers.size());  // K and V, every chunk and layer
  EXPECT_NEAR(refined->bits_per_element - hq.bits_per_element, layers * double(layer) * 8.0 / elements, 1e-9);
  for (const FrontierPoint* p : {v4, hq4, refined}) EXPECT_LT(p->attention.rel_l2(), hq.attention.rel_l2()) << p->label;
  const std::string svg = frontier_svg(r);
  EXPECT_NE(svg.find("id=\"x-label\""), std::string::npos);
  EXPECT_NE(svg.find("bits per element"), std::string::npos);
  EXPECT_NE(svg.find("id=\"y-label\""), std::string::npos);
  EXPECT_NE(svg.find("attention relative L2 error"), std::string::npos);
  EXPECT_NE(svg.find("id=\"pareto\""), std::string::npos);
  EXPECT_NE(svg.find("class=\"pareto-point\""), std::string::npos);
  EXPECT_NE(svg.find("id=\"reference\""), std::string::npos);
  EXPECT_NE(svg.find("reference default ("), std::string::npos);
  const std::string json = frontier_json(r);
  EXPECT_NE(json.find("\"hq_vs_reference\""), std::string::npos);
  EXPECT_NE(json.find("\"pareto\": true"), std::string::npos);
}

}  // namespace
}  // namespace qvg
