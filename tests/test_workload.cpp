// Tests of the workload generator (include/qvg/eval/workload.h): presets and scaling,
// the chunk schedule, the statistics of docs/workload.md measured with its estimators,
// spatial and temporal redundancy, rotary embedding, determinism, and errors.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include "qvg/error.h"
#include "qvg/eval/workload.h"
#include "support/data.h"

namespace qvg {
namespace {

using testing::same_bytes;

constexpr double kScale = 0.25;

TEST(WorkloadPresets, TableOfWorkloadMd) {
  ASSERT_EQ(model_presets().size(), 4u);
  struct Row {
    const char* name;
    int layers, heads, head_dim;
    int64_t tpf;
    int fpc;
    int64_t context_tokens;
    int sink_frames;
  };
  const Row rows[] = {{"self-forcing-1.3b", 30, 12, 128, 1560, 3, 262080, 0},
                      {"lingbot-world-14b", 40, 40, 128, 1560, 3, 106080, 6},
                      {"longcat-video-13.6b", 48, 32, 128, 1560, 24, 29640, 19},
                      {"hy-worldplay-8b", 30, 16, 256, 880, 4, 63360, 0}};
  for (const Row& r : rows) {
    const ModelPreset& p = find_model_preset(r.name);
    SCOPED_TRACE(r.name);
    EXPECT_EQ(p.layers, r.layers);
    EXPECT_EQ(p.heads, r.heads);
    EXPECT_EQ(p.head_dim, r.head_dim);
    EXPECT_EQ(p.tokens_per_frame(), r.tpf);
    EXPECT_EQ(p.frames_per_chunk, r.fpc);
    EXPECT_EQ(p.context_tokens(), r.context_tokens);
    EXPECT_EQ(p.sink_frames, r.sink_frames);
    EXPECT_EQ(p.cache_tokens(), p.context_tokens() + p.chunk_tokens());
  }
  // Assumptions are flagged as in the table.
  EXPECT_TRUE(find_model_preset("hy-worldplay-8b").assumed.heads);
  EXPECT_TRUE(find_model_preset("hy-worldplay-8b").assumed.context);
  EXPECT_FALSE(find_model_preset("self-forcing-1.3b").assumed.context);
  EXPECT_TRUE(find_model_preset("self-forcing-1.3b").assumed.sink);
  EXPECT_TRUE(find_model_preset("longcat-video-13.6b").assumed.frames_per_chunk);
  EXPECT_EQ(find_model_preset("longcat-video-13.6b").sink_policy, SinkSpan::Full);
  EXPECT_EQ(assumed_mark(true), " (a)");
  EXPECT_EQ(assumed_mark(false), "");
  try {
    find_model_preset("wan-14b");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("wan-14b"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("self-forcing-1.3b"), std::string::npos);
  }
}

TEST(WorkloadPresets, ScalingKeepsFramesAndStatistics) {
  const ModelPreset& p = find_model_preset("lingbot-world-14b");
  const ModelPreset s = p.scaled(0.25);
  EXPECT_EQ(s.heads, 10);
  EXPECT_EQ(s.layers, 10);
  EXPECT_EQ(s.grid_h, 15);
  EXPECT_EQ(s.grid_w, 26);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.frames_per_chunk, p.frames_per_chunk);
  EXPECT_EQ(s.context_frames, p.context_frames);
  EXPECT_EQ(s.sink_frames, p.sink_frames);
  EXPECT_EQ(s.k_wall_ratio, p.k_wall_ratio);
  EXPECT_DOUBLE_EQ(s.scale, 0.25);
  EXPECT_GE(s.k_cluster_layers, 1);
  const ModelPreset tiny = p.scaled(1e-4);
  EXPECT_EQ(tiny.heads, 1);
  EXPECT_EQ(tiny.layers, 1);
  EXPECT_EQ(tiny.grid_h, 2);
  EXPECT_THROW(p.scaled(0.0), InvalidArgument);
  EXPECT_THROW(p.scaled(1.5), InvalidArgument);
  EXPECT_THROW(p.scaled(std::nan("")), InvalidArgument);
}

TEST(WorkloadPresets, ChunkSchedule) {
  const ModelPreset& lb = find_model_preset("lingbot-world-14b");  // sink 6 frames, chunks of 3
  EXPECT_EQ(lb.sink_chunks(), 2);
  ChunkInfo c = chunk_info(lb, 1);
  EXPECT_TRUE(c.sink);
  EXPECT_EQ(c.frame0, 3);
  c = chunk_info(lb, 2);
  EXPECT_FALSE(c.sink);
  EXPECT_EQ(c.frame0, 6);
  EXPECT_EQ(c.token0, 6 * 1560);
  EXPECT_EQ(c.tokens, 3 * 1560);
  const ModelPreset& lc = find_model_preset("longcat-video-13.6b");  // sink 19 frames, chunks of 24
  c = chunk_info(lc, 0);
  EXPECT_TRUE(c.sink);
  EXPECT_EQ(c.frames, 19);
  c = chunk_info(lc, 1);
  EXPECT_EQ(c.frame0, 19);
  EXPECT_EQ(c.frames, 24);
  EXPECT_THROW(chunk_info(lc, -1), InvalidArgument);
}

class WorkloadStats : public ::testing::TestWithParam<const char*> {};

// The estimators of workload.md on a middle layer, 3 frames after the start, at scale 0.25.
TEST_P(WorkloadStats, MatchTheTargets) {
  WorkloadOptions o;
  o.scale = kScale;
  o.seed = 11;
  Workload w(find_model_preset(GetParam()), o);
  const ModelPreset& p = w.preset();
  const auto t0 = std::chrono::steady_clock::now();
  const LayerChunk c = w.generate_frames(p.layers / 2, 40, 3);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const KVStats kp = kv_stats(c.k_pre_rope), k = kv_stats(c.k), v = kv_stats(c.v);
  RecordProperty("first_call_ms", int(ms));
  std::printf(
      "%-20s K wall %.2f (target %.1f) K spread %.3f (%.2f) | V wall %.2f (%.1f) V spread %.2f (%.2f) "
      "V norm median %.1f (%.1f) | K channel median %.3f (%.2f) | K max |x| %.1f V max |x| %.1f\n",
      p.name.c_str(), kp.wall_ratio, p.k_wall_ratio, kp.norm_spread, p.k_norm_spread, v.wall_ratio, p.v_wall_ratio,
      v.norm_spread, p.v_norm_spread, v.norm_median, p.v_token_norm, kp.channel_median, p.k_channel_median, kp.abs_max,
      v.abs_max);
  // K walls before RoPE; RoPE spreads them (never raises them much).
  EXPECT_NEAR(kp.wall_ratio, p.k_wall_ratio, 0.2 * p.k_wall_ratio);
  EXPECT_LT(k.wall_ratio, kp.wall_ratio * 1.05);
  // Flat K token norms, unchanged by the rotation.
  EXPECT_GE(kp.norm_spread, 1.0);
  EXPECT_LE(kp.norm_spread, 1.4);
  EXPECT_NEAR(kp.norm_spread, p.k_norm_spread, 0.1);
  EXPECT_NEAR(k.norm_spread, kp.norm_spread, 0.01);
  // Flat V channels, spread V token norms.
  EXPECT_GE(v.wall_ratio, 1.4);
  EXPECT_LE(v.wall_ratio, 3.2 * 1.1);
  EXPECT_NEAR(v.wall_ratio, p.v_wall_ratio, 0.2 * p.v_wall_ratio);
  EXPECT_GE(v.norm_spread, 3.5 * 0.9);
  EXPECT_LE(v.norm_spread, 5.6 * 1.1);
  EXPECT_NEAR(v.norm_spread, p.v_norm_spread, 0.15 * p.v_norm_spread);
  // Magnitudes.
  EXPECT_NEAR(kp.channel_median, p.k_channel_median, 0.15 * p.k_channel_median);
  EXPECT_NEAR(v.norm_median, p.v_token_norm, 0.15 * p.v_token_norm);
}

INSTANTIATE_TEST_SUITE_P(Presets, WorkloadStats,
                         ::testing::Values("self-forcing-1.3b", "lingbot-world-14b", "longcat-video-13.6b",
                                           "hy-worldplay-8b"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(Workload, LongCatMagnitudes) {
  // V entries in the hundreds, token norms around 1000-2800; K wall channels around 12.
  WorkloadOptions o;
  o.scale = kScale;
  Workload w(find_model_preset("longcat-video-13.6b"), o);
  const LayerChunk c = w.generate_frames(w.preset().layers / 2, 30, 2);
  const KVStats kp = kv_stats(c.k_pre_rope), v = kv_stats(c.v);
  EXPECT_GT(v.abs_max, 300.0);
  EXPECT_LT(v.abs_max, 2500.0);
  EXPECT_GT(v.norm_median, 1000.0);
  EXPECT_LT(v.norm_median, 2800.0);
  EXPECT_NEAR(kp.channel_median * kp.wall_ratio, 12.0, 3.0);
  EXPECT_LT(kp.abs_max, 40.0);
}

TEST(Workload, RareIsolatedHighNormVTokens) {
  ModelPreset p = find_model_preset("self-forcing-1.3b");
  p.v_outlier_rate = 0.005;  // frequent enough to count on a small sample
  WorkloadOptions o;
  o.scale = kScale;
  o.dtype = DType::F32;
  Workload w(p, o);
  const ModelPreset& sp = w.preset();
  const LayerChunk c = w.generate_frames(sp.layers / 2, 10, 6);
  const int64_t n = c.v.shape().s, H = sp.heads, D = sp.head_dim;
  const float* vp = static_cast<const float*>(c.v.data());
  auto norm = [&](int64_t i, int64_t h) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(vp[(i * H + h) * D + d]) * vp[(i * H + h) * D + d];
    return std::sqrt(s);
  };
  const double want = p.v_outlier_norm * p.v_token_norm;
  int64_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(norm(i, 0) / want - 1.0) > 1e-3) continue;
    ++found;
    // Every head of that token, and none of its row neighbours.
    for (int64_t h = 0; h < H; ++h) EXPECT_NEAR(norm(i, h), want, 1e-3 * want);
    const int64_t x = i % sp.grid_w;
    if (x > 0) {
      EXPECT_LT(norm(i - 1, 0), 0.8 * want);
    }
    if (x + 1 < sp.grid_w) {
      EXPECT_LT(norm(i + 1, 0), 0.8 * want);
    }
  }
  const double expected = p.v_outlier_rate * double(n);
  EXPECT_GT(double(found), 0.5 * expected);
  EXPECT_LT(double(found), 1.6 * expected);
}

TEST(Workload, FinalLayersHoldHighNormKCluster) {
  WorkloadOptions o;
  o.scale = kScale;
  Workload w(find_model_preset("self-forcing-1.3b"), o);
  const ModelPreset& p = w.preset();
  // Object 0 is a cluster of tokens; frames where it is in view show the spread.
  double best = 0;
  for (int64_t f : {0, 20, 40, 60})
    best = std::max(best, kv_stats(w.generate_frames(p.layers - 1, f, 1).k).norm_spread);
  EXPECT_GT(best, 2.0);
  EXPECT_LT(kv_stats(w.generate_frames(0, 40, 1).k).norm_spread, 1.4);
}

/// Mean over heads and token pairs of the cosine of mean-centred head vectors.
struct Redundancy {
  double neighbour = 0, temporal = 0, random = 0;
};
Redundancy redundancy(const Tensor& t, const ModelPreset& p) {
  const std::vector<float> f = t.to_f32();
  const int64_t n = t.shape().s, H = t.shape().h, D = t.shape().d, tpf = p.tokens_per_frame();
  std::vector<double> mean(static_cast<size_t>(H * D), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < H * D; ++j) mean[size_t(j)] += f[size_t(i * H * D + j)] / double(n);
  auto cosine = [&](int64_t a, int64_t b, int64_t h) {
    double s = 0, na = 0, nb = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double x = f[size_t((a * H + h) * D + d)] - mean[size_t(h * D + d)];
      const double y = f[size_t((b * H + h) * D + d)] - mean[size_t(h * D + d)];
      s += x * y;
      na += x * x;
      nb += y * y;
    }
    return s / std::sqrt(na * nb);
  };
  Redundancy r;
  int64_t cn = 0, ct = 0, cr = 0;
  std::mt19937_64 rng(5);
  for (int64_t i = 0; i < tpf; ++i)
    for (int64_t h = 0; h < H; ++h) {
      if (i % p.grid_w + 1 < p.grid_w) r.neighbour += cosine(i, i + 1, h), ++cn;  // right neighbour
      r.temporal += cosine(i, i + tpf, h), ++ct;                                  // same place, next frame
      r.random += cosine(i, int64_t(rng() % uint64_t(n)), h), ++cr;
    }
  r.neighbour /= double(cn);
  r.temporal /= double(ct);
  r.random /= double(cr);
  return r;
}

TEST(Workload, SpatialAndTemporalRedundancy) {
  WorkloadOptions o;
  o.scale = kScale;
  o.seed = 3;
  Workload w(find_model_preset("self-forcing-1.3b"), o);
  const ModelPreset& p = w.preset();
  const LayerChunk c = w.generate_frames(p.layers / 2, 40, 2);
  for (const Tensor* t : {&c.k_pre_rope, &c.k, &c.v}) {
    const Redundancy r = redundancy(*t, p);
    std::printf("redundancy: neighbour %.3f temporal %.3f random %.3f\n", r.neighbour, r.temporal, r.random);
    EXPECT_GT(r.neighbour, 0.35);
    EXPECT_GT(r.temporal, 0.45);
    EXPECT_LT(std::fabs(r.random), 0.1);
    EXPECT_GT(r.neighbour, r.random + 0.3);
  }
}

TEST(Workload, RotaryEmbeddingIsARotationAtTheTokenPosition) {
  WorkloadOptions o;
  o.scale = kScale;
  o.dtype = DType::F32;
  Workload w(find_model_preset("hy-worldplay-8b"), o);  // rope over the first 128 of 256 channels
  const ModelPreset& p = w.preset();
  const LayerChunk c = w.generate_frames(1, 0, 2);
  const int64_t H = p.heads, D = p.head_dim;
  const float* pre = static_cast<const float*>(c.k_pre_rope.data());
  const float* post = static_cast<const float*>(c.k.data());
  // Token (frame 0, row 0, column 0): every angle is 0.
  for (int64_t j = 0; j < H * D; ++j) EXPECT_EQ(pre[j], post[j]);
  for (int64_t i = 0; i < c.k.shape().s; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const float* a = pre + (i * H + h) * D;
      const float* b = post + (i * H + h) * D;
      for (int64_t d = p.rope_dims; d < D; ++d) ASSERT_EQ(a[d], b[d]);  // the unrotated branch
      for (int64_t pr = 0; pr < p.rope_dims / 2; ++pr) {                // each pair keeps its length
        const double la = std::hypot(a[2 * pr], a[2 * pr + 1]), lb = std::hypot(b[2 * pr], b[2 * pr + 1]);
        ASSERT_NEAR(la, lb, 1e-5 * (la + 1e-3));
      }
    }
  // A later frame actually rotates the time section.
  const int64_t tok = p.tokens_per_frame();  // frame 1, row 0, column 0
  EXPECT_NE(pre[tok * H * D], post[tok * H * D]);
}

TEST(Workload, AttentionIsNonTrivial) {
  WorkloadOptions o;
  o.scale = kScale;
  Workload w(find_model_preset("self-forcing-1.3b"), o);
  const ModelPreset& p = w.preset();
  const LayerChunk c = w.generate(p.layers / 2, 5);
  const std::vector<float> q = c.q.to_f32(), k = c.k.to_f32();
  const int64_t n = c.k.shape().s, H = p.heads, D = p.head_dim;
  double entropy = 0, top = 0;
  int cnt = 0;
  for (int64_t i = 0; i < n; i += 37)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> lg(static_cast<size_t>(n));
      double mx = -1e300;
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += double(q[size_t((i * H + h) * D + d)]) * k[size_t((j * H + h) * D + d)];
        lg[size_t(j)] = s / std::sqrt(double(D));
        mx = std::max(mx, lg[size_t(j)]);
      }
      double z = 0;
      for (double& x : lg) z += (x = std::exp(x - mx));
      double e = 0, t = 0;
      for (double x : lg) {
        const double pr = x / z;
        if (pr > 0) e -= pr * std::log(pr);
        t = std::max(t, pr);
      }
      entropy += e / std::log(double(n));
      top += t;
      ++cnt;
    }
  entropy /= cnt;
  top /= cnt;
  std::printf("attention over one chunk: normalised entropy %.3f, mean top probability %.4f\n", entropy, top);
  EXPECT_GT(entropy, 0.3);   // not one-hot
  EXPECT_LT(entropy, 0.95);  // not uniform
  EXPECT_LT(top, 0.5);
}

TEST(Workload, DeterministicBySeedChunkingAndThreads) {
  WorkloadOptions o;
  o.scale = 0.1;
  o.seed = 42;
  o.threads = 1;
  const ModelPreset& p = find_model_preset("lingbot-world-14b");
  Workload a(p, o);
  o.threads = 2;
  Workload b(p, o);
  const LayerChunk x = a.generate(2, 3), y = b.generate(2, 3);
  EXPECT_TRUE(same_bytes(x.k, y.k));
  EXPECT_TRUE(same_bytes(x.v, y.v));
  EXPECT_TRUE(same_bytes(x.q, y.q));
  EXPECT_TRUE(same_bytes(x.k_pre_rope, y.k_pre_rope));
  EXPECT_EQ(x.chunk.index, 3);
  EXPECT_EQ(x.chunk.frame0, 9);  // 2 sink chunks of 3 frames, then chunk 2 at frame 6

  // Order and chunking do not matter: frames one at a time give the same rows.
  const int64_t tpf = a.preset().tokens_per_frame();
  const size_t frame_bytes = size_t(tpf) * size_t(a.preset().heads * a.preset().head_dim) * 2;
  for (int64_t f = 0; f < 3; ++f) {
    const LayerChunk one = b.generate_frames(2, x.chunk.frame0 + 2 - f, 1);
    const size_t off = size_t(2 - f) * frame_bytes;
    EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(x.v.data()) + off, one.v.data(), frame_bytes), 0);
    EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(x.k.data()) + off, one.k.data(), frame_bytes), 0);
  }

  // Another seed is another video.
  o.seed = 43;
  Workload c(p, o);
  const LayerChunk z = c.generate(2, 3);
  EXPECT_FALSE(same_bytes(x.k, z.k));
  EXPECT_FALSE(same_bytes(x.v, z.v));
  // Layers differ too.
  EXPECT_FALSE(same_bytes(x.v, a.generate(1, 3).v));

  // generate_into reuses the buffers and gives the same bytes; parts can be skipped.
  LayerChunk buf;
  a.generate_into(2, 3, buf);
  const void* kdata = buf.k.data();
  a.generate_into(2, 4, buf);
  EXPECT_EQ(buf.k.data(), kdata);
  a.generate_into(2, 3, buf, GenerateParts{false, false});
  EXPECT_TRUE(same_bytes(buf.k, x.k));
  EXPECT_TRUE(same_bytes(buf.v, x.v));
  EXPECT_EQ(buf.q.nbytes(), 0u);
  EXPECT_EQ(buf.k_pre_rope.nbytes(), 0u);
}

TEST(Workload, F32OutputRoundsToTheBf16Output) {
  WorkloadOptions o;
  o.scale = 0.1;
  Workload a(find_model_preset("self-forcing-1.3b"), o);
  o.dtype = DType::F32;
  Workload b(find_model_preset("self-forcing-1.3b"), o);
  const LayerChunk x = a.generate(1, 2), y = b.generate(1, 2);
  EXPECT_EQ(y.v.dtype(), DType::F32);
  EXPECT_TRUE(same_bytes(y.v.to(DType::BF16), x.v));
  EXPECT_TRUE(same_bytes(y.k.to(DType::BF16), x.k));
  EXPECT_TRUE(same_bytes(y.q.to(DType::BF16), x.q));
}

// The streaming simulation calls generate_into per chunk and layer, so a chunk of a
// layer must cost only its tokens: the layer's parameters (the costly part) are
// built once, on the layer's first use, and a streaming loop's buffers are reused,
// not reallocated (checked as such, not by a wall-clock limit;
// the time is printed, ~20 ms per chunk-layer here, docs/performance.md).
TEST(Workload, OneChunkLayerBuildsTheLayerOnceAndReusesTheBuffers) {
  WorkloadOptions o;
  o.scale = kScale;
  Workload w(find_model_preset("self-forcing-1.3b"), o);
  EXPECT_EQ(w.layers_built(), 0);  // construction is cheap
  LayerChunk buf;
  w.generate_into(3, 0, buf);  // builds the layer's parameters
  EXPECT_EQ(w.layers_built(), 1);
  const void* k = buf.k.data();
  const void* v = buf.v.data();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 1; c <= 5; ++c) {
    w.generate_into(3, c, buf);
    EXPECT_EQ(buf.k.data(), k) << "chunk " << c << ": K reallocated";
    EXPECT_EQ(buf.v.data(), v) << "chunk " << c << ": V reallocated";
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
  EXPECT_EQ(w.layers_built(), 1);  // not rebuilt per chunk
  std::printf("self-forcing-1.3b at scale %.2f: %.1f ms per chunk-layer (%lld tokens x %d heads)\n", kScale, ms,
              static_cast<long long>(buf.k.shape().s), w.preset().heads);
  w.generate_into(4, 0, buf);
  w.generate_into(3, 6, buf);
  EXPECT_EQ(w.layers_built(), 2);  // one more layer, built once
}

TEST(Workload, TypedErrors) {
  WorkloadOptions o;
  o.scale = 0.1;
  Workload w(find_model_preset("self-forcing-1.3b"), o);
  EXPECT_THROW(w.generate(-1, 0), InvalidArgument);
  EXPECT_THROW(w.generate(w.preset().layers, 0), InvalidArgument);
  EXPECT_THROW(w.generate(0, -1), InvalidArgument);
  EXPECT_THROW(w.generate_frames(0, -1, 1), InvalidArgument);
  EXPECT_THROW(w.generate_frames(0, 0, 0), InvalidArgument);
  o.scale = 0;
  EXPECT_THROW(Workload(find_model_preset("self-forcing-1.3b"), o), InvalidArgument);
  o.scale = 1;
  o.threads = -1;
  EXPECT_THROW(Workload(find_model_preset("self-forcing-1.3b"), o), InvalidArgument);
  ModelPreset bad = find_model_preset("self-forcing-1.3b");
  bad.rope_dims = 3;
  try {
    Workload x(bad);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rope_dims"), std::string::npos);
  }
  bad = find_model_preset("self-forcing-1.3b");
  bad.sink_frames = bad.context_frames + 1;
  EXPECT_THROW(bad.validate(), InvalidArgument);
  EXPECT_THROW(kv_stats(ConstTensorView{}), InvalidArgument);
}

}  // namespace
}  // namespace qvg
