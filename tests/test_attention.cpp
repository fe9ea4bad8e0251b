// Reference attention (qvg/attention.h): against an fp64 restatement, strided
// views, thread independence, errors; then the quality yardstick — attention
// over the packed cache's view vs the dense cache's view on clustered K/V.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "qvg/attention.h"
#include "qvg/cache.h"
#include "qvg/error.h"
#include "support/cache_model.h"

using namespace qvg;
using namespace qvg::testing;

namespace {

/// softmax(q k^T / sqrt(D)) v in fp64, straight from the definition.
std::vector<double> attention_fp64(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Shape4 qs = q.shape();
  const int64_t T = k.shape().s;
  std::vector<double> out(size_t(qs.numel()));
  for (int64_t b = 0; b < qs.b; ++b)
    for (int64_t i = 0; i < qs.s; ++i)
      for (int64_t h = 0; h < qs.h; ++h) {
        std::vector<double> w(static_cast<size_t>(T));
        double m = -INFINITY;
        for (int64_t t = 0; t < T; ++t) {
          double dot = 0;
          for (int64_t d = 0; d < qs.d; ++d) dot += double(q.at(b, i, h, d)) * double(k.at(b, t, h, d));
          w[size_t(t)] = dot / std::sqrt(double(qs.d));
          m = std::max(m, w[size_t(t)]);
        }
        double l = 0;
        for (auto& x : w) l += (x = std::exp(x - m));
        for (int64_t d = 0; d < qs.d; ++d) {
          double acc = 0;
          for (int64_t t = 0; t < T; ++t) acc += w[size_t(t)] * double(v.at(b, t, h, d));
          out[size_t(((b * qs.s + i) * qs.h + h) * qs.d + d)] = acc / l;
        }
      }
  return out;
}

}  // namespace

TEST(Attention, MatchesFp64Definition) {
  std::mt19937_64 rng(1);
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  for (int it = 0; it < 30; ++it) {
    const int64_t B = 1 + it % 2, n = 1 + it % 5, H = 1 + it % 3, D = 8 << (it % 3), T = 1 + (it * 7) % 40;
    const DType dt = dts[it % 3];
    Tensor q = random_tensor(rng, dt, {B, n, H, D}, 3.0f);
    Tensor k = random_tensor(rng, dt, {B, T, H, D}, 3.0f);
    Tensor v = random_tensor(rng, dt, {B, T, H, D}, 3.0f);
    Tensor out = attention(q, StridedView::of(k), StridedView::of(v));
    ASSERT_EQ(out.dtype(), DType::F32);
    ASSERT_EQ(out.shape(), q.shape());
    const std::vector<double> want = attention_fp64(q, k, v);
    const std::vector<float> got = out.to_f32();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
  }
}

TEST(Attention, SingleTokenReturnsItsValueAndLargeLogitsStayFinite) {
  Tensor q(DType::F32, {1, 2, 1, 8}), k(DType::F32, {1, 1, 1, 8}), v(DType::F32, {1, 1, 1, 8});
  for (int d = 0; d < 8; ++d) {
    q.set(0, 0, 0, d, 1e3f);
    q.set(0, 1, 0, d, -1e3f);
    k.set(0, 0, 0, d, 1e3f);
    v.set(0, 0, 0, d, float(d) - 3.5f);
  }
  Tensor out = attention(q, StridedView::of(k), StridedView::of(v));
  for (int i = 0; i < 2; ++i)
    for (int d = 0; d < 8; ++d) EXPECT_EQ(out.at(0, i, 0, d), float(d) - 3.5f);
  // Two tokens with logits 1e6 apart: all weight on the larger, no overflow.
  Tensor k2(DType::F32, {1, 2, 1, 8}), v2(DType::F32, {1, 2, 1, 8});
  for (int d = 0; d < 8; ++d) {
    k2.set(0, 0, 0, d, 1e3f);
    k2.set(0, 1, 0, d, -1e3f);
    v2.set(0, 0, 0, d, 1.0f);
    v2.set(0, 1, 0, d, 2.0f);
  }
  out = attention(q, StridedView::of(k2), StridedView::of(v2));
  EXPECT_EQ(out.at(0, 0, 0, 0), 1.0f);
  EXPECT_EQ(out.at(0, 1, 0, 0), 2.0f);
}

TEST(Attention, StridedViewsAndThreadCountGiveIdenticalBits) {
  std::mt19937_64 rng(2);
  // A head slice [1, 3) of a [2, 20, 4, 16] buffer, as a cache returns it.
  Tensor big_k = random_tensor(rng, DType::BF16, {2, 20, 4, 16}), big_v = random_tensor(rng, DType::BF16, {2, 20, 4, 16});
  StridedView sk = StridedView::of(big_k), sv = StridedView::of(big_v);
  for (StridedView* s : {&sk, &sv}) {
    s->data = static_cast<const std::byte*>(s->data) + (3 * 4 + 1) * 16 * 2;  // token 3, head 1
    s->shape = {2, 12, 2, 16};
  }
  Tensor q = random_tensor(rng, DType::BF16, {2, 5, 2, 16});
  Tensor a = attention(q, sk, sv, 1);
  Tensor b = attention(q, StridedView::of(sk.to_tensor()), StridedView::of(sv.to_tensor()), 2);
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
}

TEST(Attention, RejectsMismatchedShapes) {
  Tensor q(DType::F32, {1, 2, 2, 8}), k(DType::F32, {1, 3, 2, 8}), k4(DType::F32, {1, 3, 2, 4}),
      k1(DType::F32, {1, 3, 1, 8}), v(DType::F32, {1, 4, 2, 8});
  EXPECT_THROW(attention(q, StridedView::of(k4), StridedView::of(k4)), InvalidArgument);
  EXPECT_THROW(attention(q, StridedView::of(k1), StridedView::of(k1)), InvalidArgument);
  EXPECT_THROW(attention(q, StridedView::of(k), StridedView::of(v)), InvalidArgument);
  Tensor empty(DType::F32, {1, 0, 2, 8});
  EXPECT_THROW(attention(q, StridedView::of(empty), StridedView::of(empty)), InvalidArgument);
  EXPECT_THROW(attention(q, StridedView{}, StridedView{}), InvalidArgument);
}

// ---------------------------------------------------------------------------
// Packed vs dense views on clustered data (tokens = cluster centres + noise).

namespace {

struct Quality {
  double rel_l2 = 0, cosine = 1;
};

Quality compare_outputs(const Tensor& ref, const Tensor& got) {
  const auto a = ref.to_f32(), b = got.to_f32();
  double num = 0, den = 0, ab = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
    ab += double(a[i]) * b[i];
    bb += double(b[i]) * b[i];
  }
  return {std::sqrt(num / den), ab / std::sqrt(den * bb)};
}

}  // namespace

TEST(Attention, PackedVsDenseOnClusteredData) {
  const int64_t H = 2, D = 64, chunk = scaled(256, 64), window_chunks = 6, chunks = 12;
  CacheOptions o;
  o.heads = H;
  o.head_dim = D;
  o.dtype = DType::BF16;
  o.cache_size = window_chunks * chunk;
  o.sink_tokens = chunk;
  auto quant = [](int bits) {
    QuantArgs q;
    q.enable(bits);
    q.codec.centroids = 32;
    q.codec.block_size = 32;
    q.codec.kmeans_iters = 2;
    return q;
  };
  DenseCausalCache dense(o);
  PackedCausalCache p2(o, quant(2)), p4(o, quant(4));
  std::mt19937_64 rng(42);
  // 24 cluster centres per tensor; K near-unit scale with a channel "wall", V larger.
  std::vector<Tensor> kc, vc;
  for (int i = 0; i < 24; ++i) {
    kc.push_back(random_tensor(rng, DType::F32, {1, 1, H, D}, 1.5f));
    vc.push_back(random_tensor(rng, DType::F32, {1, 1, H, D}, 4.0f));
  }
  std::normal_distribution<float> noise(0.0f, 0.2f);
  std::uniform_int_distribution<int> pick(0, 23);
  auto clustered = [&](const std::vector<Tensor>& centres, int64_t n, float wall) {
    Tensor t(DType::BF16, {1, n, H, D});
    for (int64_t s = 0; s < n; ++s) {
      const Tensor& c = centres[size_t(pick(rng))];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          t.set(0, s, h, d, (c.at(0, 0, h, d) + noise(rng)) * (d % 16 == 3 ? wall : 1.0f));
    }
    return t;
  };
  double sum2 = 0, sum4 = 0;
  int counted = 0;
  bool int4_below_int2_each = true;
  std::printf("chunk  T     int2 rel-L2  int2 cosine   int4 rel-L2  int4 cosine   encoded tokens in view\n");
  for (int64_t ci = 0; ci < chunks; ++ci) {
    const int64_t c = ci * chunk;
    KVView vd{}, v2{}, v4{};
    Tensor q;
    for (int step = 0; step < 2; ++step) {  // denoising steps rewrite the chunk
      Tensor k = clustered(kc, chunk, 4.0f), v = clustered(vc, chunk, 1.0f);
      q = clustered(kc, chunk, 1.0f);
      vd = dense.update(k, v, c);
      v2 = p2.update(k, v, c);
      v4 = p4.update(k, v, c);
    }
    ASSERT_EQ(vd.k.shape, v2.k.shape);
    ASSERT_EQ(vd.k.shape, v4.k.shape);
    const Tensor ref = attention(q, vd);
    const Quality q2 = compare_outputs(ref, attention(q, v2));
    const Quality q4 = compare_outputs(ref, attention(q, v4));
    int64_t encoded = 0;
    for (size_t i = 0; i < p2.num_segments(); ++i)
      if (p2.segment(i).packed) encoded += p2.segment(i).g1 - p2.segment(i).g0;
    std::printf("%5lld  %4lld  %11.5f  %11.6f   %11.5f  %11.6f   %lld\n", (long long)ci, (long long)vd.k.shape.s,
                q2.rel_l2, q2.cosine, q4.rel_l2, q4.cosine, (long long)encoded);
    if (encoded > 0) {
      sum2 += q2.rel_l2;
      sum4 += q4.rel_l2;
      ++counted;
      int4_below_int2_each = int4_below_int2_each && q4.rel_l2 < q2.rel_l2;
      EXPECT_GT(q2.cosine, 0.95) << "chunk " << ci;
      EXPECT_GT(q4.cosine, 0.995) << "chunk " << ci;
    } else {
      EXPECT_EQ(q2.rel_l2, 0.0);  // nothing encoded yet: views are identical
      EXPECT_EQ(q4.rel_l2, 0.0);
    }
  }
  ASSERT_GT(counted, 0);
  std::printf("mean attention rel-L2 over chunks with encoded tokens: int2 %.5f, int4 %.5f\n", sum2 / counted,
              sum4 / counted);
  EXPECT_LT(sum4, sum2);
  EXPECT_TRUE(int4_below_int2_each);
}
