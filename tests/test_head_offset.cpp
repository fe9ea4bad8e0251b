// CodecConfig::head_offset and CacheOptions::head_offset: a shard of heads
// [o, o + h) encoded with head offset o equals the wide tensor's (or cache's)
// encoding of those heads byte for byte, for every init that draws random numbers.
// The default (0) is pinned by test_golden's digests.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "support/data.h"

namespace qvg {
namespace {

using testing::clustered_tensor;
using testing::same_bytes;

/// Heads [h0, h0 + n) of x, dense.
Tensor heads_of(const Tensor& x, int64_t h0, int64_t n) {
  const Shape4 s = x.shape();
  Tensor out(x.dtype(), {s.b, s.s, n, s.d});
  const size_t row = size_t(n * s.d) * dtype_size(x.dtype()), esz = dtype_size(x.dtype());
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t t = 0; t < s.s; ++t)
      std::memcpy(static_cast<uint8_t*>(out.data()) + size_t((b * s.s + t) * n * s.d) * esz,
                  static_cast<const uint8_t*>(x.data()) + size_t(((b * s.s + t) * s.h + h0) * s.d) * esz, row);
  return out;
}

/// Every array of `shard` (groups (b, j), j < shard heads) equals the groups (b, h0 + j)
/// of `wide`. Returns the first difference ("" when none).
std::string shard_diff(const EncodedTensor& wide, const EncodedTensor& shard, int64_t h0) {
  const int64_t B = wide.shape.b, H = wide.shape.h, Hs = shard.shape.h;
  const auto wa = wide.arrays(), sa = shard.arrays();
  if (wa.size() != sa.size()) return "different array lists";
  for (size_t i = 0; i < wa.size(); ++i) {
    const auto w = wide.array(wa[i]), s = shard.array(sa[i]);
    const size_t per_group = w.size() / size_t(B * H);
    if (s.size() != per_group * size_t(B * Hs)) return wa[i].name() + ": shard size";
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < Hs; ++j)
        if (std::memcmp(w.data() + size_t(b * H + h0 + j) * per_group, s.data() + size_t(b * Hs + j) * per_group,
                        per_group) != 0)
          return wa[i].name() + " of group (b=" + std::to_string(b) + ", h=" + std::to_string(h0 + j) + ")";
  }
  return "";
}

class HeadOffsetCodec : public ::testing::TestWithParam<Init> {};

TEST_P(HeadOffsetCodec, ShardEncodingEqualsTheWideTensorsHeads) {
  const Tensor x = clustered_tensor({2, 96, 6, 32}, DType::BF16, 7);
  CodecConfig cfg;
  cfg.bits = 2;
  cfg.centroids = 16;
  cfg.block_size = 16;
  cfg.stages = 2;
  cfg.init = GetParam();
  const EncodedTensor wide = encode(x, cfg);
  bool differs_without_offset = false;
  for (int64_t h0 : {0, 2, 4}) {
    const Tensor part = heads_of(x, h0, 2);
    CodecConfig shard_cfg = cfg;
    shard_cfg.head_offset = h0;
    EXPECT_EQ(shard_diff(wide, encode(part, shard_cfg), h0), "") << "head_offset " << h0;
    // Control: without the offset a shard at h0 > 0 draws other streams.
    if (h0 > 0 && !shard_diff(wide, encode(part, cfg), h0).empty()) differs_without_offset = true;
  }
  EXPECT_TRUE(differs_without_offset) << "the test data does not depend on the PRNG stream";
}

INSTANTIATE_TEST_SUITE_P(Inits, HeadOffsetCodec, ::testing::Values(Init::Random, Init::KMeansPlusPlus),
                         [](const auto& p) { return p.param == Init::Random ? "random" : "kmeanspp"; });

TEST(HeadOffsetCodec, RejectsOutOfRange) {
  const Tensor x = clustered_tensor({1, 8, 1, 16}, DType::F32, 1);
  CodecConfig cfg;
  cfg.block_size = 16;
  cfg.head_offset = -1;
  try {
    encode(x, cfg);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "head_offset must be in [0, 2^40], got -1");
  }
  cfg.head_offset = (int64_t(1) << 40) + 1;
  EXPECT_THROW(encode(x, cfg), InvalidArgument);
}

/// The view's rows of heads [h0, h0 + n) as a dense tensor.
Tensor view_heads(const StridedView& v, int64_t h0, int64_t n) {
  Tensor out(v.dtype, {v.shape.b, v.shape.s, n, v.shape.d});
  const size_t row = size_t(v.shape.d) * dtype_size(v.dtype);
  for (int64_t b = 0; b < v.shape.b; ++b)
    for (int64_t t = 0; t < v.shape.s; ++t)
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(static_cast<uint8_t*>(out.data()) + size_t(((b * v.shape.s + t) * n + j)) * row,
                    v.row(b, t, h0 + j), row);
  return out;
}

TEST(HeadOffsetCache, ShardsOfAPackedCacheEqualTheWideCache) {
  const int64_t B = 1, H = 4, D = 32, chunk = 24, shards = 2, Hs = H / shards;
  CacheOptions o;
  o.batch = B;
  o.cache_size = 8 * chunk;
  o.heads = H;
  o.head_dim = D;
  o.dtype = DType::BF16;
  o.sink_tokens = chunk;
  QuantArgs q = QuantArgs::from_flags({{"kv_cache_quant", "int2"},
                                       {"kv_cache_quant_centroids", "8"},
                                       {"kv_cache_quant_block_size", "16"},
                                       {"kv_cache_quant_span_chunks", "2"}});
  PackedCausalCache wide(o, q);
  std::vector<PackedCausalCache> parts;
  for (int64_t r = 0; r < shards; ++r) {
    CacheOptions so = o;
    so.heads = Hs;
    so.head_offset = r * Hs;
    parts.emplace_back(so, q);
  }
  int packed_views = 0;
  for (int64_t c = 0; c < 12; ++c) {
    for (int step = 0; step < 2; ++step) {  // an advance, then a rewrite (denoising step)
      const Tensor k = clustered_tensor({B, chunk, H, D}, DType::BF16, uint64_t(100 + 2 * c + step));
      const Tensor v = clustered_tensor({B, chunk, H, D}, DType::BF16, uint64_t(500 + 2 * c + step));
      const KVView wv = wide.update(k, v, c * chunk);
      for (int64_t r = 0; r < shards; ++r) {
        const KVView sv = parts[size_t(r)].update(heads_of(k, r * Hs, Hs), heads_of(v, r * Hs, Hs), c * chunk);
        ASSERT_TRUE(same_bytes(sv.k.to_tensor(), view_heads(wv.k, r * Hs, Hs))) << "chunk " << c << " rank " << r;
        ASSERT_TRUE(same_bytes(sv.v.to_tensor(), view_heads(wv.v, r * Hs, Hs))) << "chunk " << c << " rank " << r;
        ASSERT_EQ(parts[size_t(r)].num_segments(), wide.num_segments());
        for (size_t i = 0; i < wide.num_segments(); ++i) {
          const auto ws = wide.segment(i), ss = parts[size_t(r)].segment(i);
          ASSERT_EQ(ss.packed, ws.packed);
          if (!ws.packed) continue;
          EXPECT_EQ(shard_diff(*ws.k_enc, *ss.k_enc, r * Hs), "") << "segment " << i << " rank " << r;
          EXPECT_EQ(shard_diff(*ws.v_enc, *ss.v_enc, r * Hs), "") << "segment " << i << " rank " << r;
        }
      }
      if (!wv.zero_copy) ++packed_views;
    }
  }
  EXPECT_GT(packed_views, 0);
  size_t shard_bytes = 0;
  for (const auto& p : parts) shard_bytes += p.resident_nbytes();
  // Every array of an encoding is per (b, h) group: the shards hold exactly the wide cache's bytes.
  EXPECT_EQ(shard_bytes, wide.resident_nbytes());
}

TEST(HeadOffsetCache, RejectsOutOfRange) {
  CacheOptions o;
  o.cache_size = 8;
  o.head_dim = 8;
  o.head_offset = -3;
  try {
    PackedCausalCache c(o, {});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "head_offset must be in [0, 2^40], got -3");
  }
  EXPECT_THROW(DenseCausalCache{o}, InvalidArgument);
}

}  // namespace
}  // namespace qvg
