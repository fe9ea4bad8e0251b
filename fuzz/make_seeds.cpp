// fuzz/make_seeds.cpp — writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/):
// valid files of every kind the readers take, covering the format's variants, plus a
// few random call sequences for the cache API. Deterministic (fixed seeds); run on
// the SCALAR SIMD target so that encodings do not depend on the machine.
// Usage: qvg_fuzz_seeds OUT_DIR   (scripts/fuzz.sh --seeds writes fuzz/corpus)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "kernels/kernels.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/io.h"
#include "support/snapshot_fixtures.h"

namespace fs = std::filesystem;
using namespace qvg;
using Bytes = std::vector<uint8_t>;

namespace {

void put(const fs::path& dir, const std::string& name, const Bytes& b) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

Tensor data(DType dt, Shape4 s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  Tensor t(dt, s);
  for (int64_t i = 0; i < s.numel(); ++i) store_f32(t.data(), dt, size_t(i), nd(rng) + float(i % 5));
  return t;
}

CodecConfig cfg(int bits, int k, int block, int stages, bool asym, ScaleDType sd, Scaling sc) {
  CodecConfig c;
  c.bits = bits, c.centroids = k, c.block_size = block, c.stages = stages;
  c.asymmetric = asym, c.scale_dtype = sd, c.scaling = sc, c.threads = 1;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: qvg_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  kernels::force_target(kernels::available_targets().back().id);

  // .npy: every dtype, rank 0..4, format versions 1 and 2 (a long header).
  int n = 0;
  for (DType dt : {DType::F32, DType::F16})
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {3}, {2, 3}, {4, 1, 8}, {1, 2, 2, 4}, {0, 5}}) {
      NpyArray a;
      a.dtype = dt;
      a.shape = shape;
      size_t numel = 1;
      for (int64_t d : shape) numel *= size_t(d);
      a.data.resize(numel * dtype_size(dt));
      for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = uint8_t(i * 37 + 11);
      put(out / "npy", fmt::format("seed_{:02}.npy", n++), serialize_npy(a));
    }

  // .qvgt (also valid safetensors): the variants of spec 1.5.
  struct Q {
    DType dt;
    Shape4 s;
    CodecConfig c;
  };
  const std::vector<Q> qs = {
      {DType::F32, {1, 6, 1, 8}, cfg(4, 4, 8, 1, false, ScaleDType::FP8_E4M3, Scaling::TwoLevel)},
      {DType::BF16, {1, 5, 2, 16}, cfg(2, 4, 16, 2, true, ScaleDType::FP8_E4M3, Scaling::TwoLevel)},
      {DType::F16, {2, 4, 1, 8}, cfg(4, 2, 8, 1, true, ScaleDType::BF16, Scaling::Compat)},
      {DType::F32, {1, 3, 1, 16}, cfg(2, 8, 8, 1, false, ScaleDType::BF16, Scaling::TwoLevel)},
      {DType::BF16, {1, 9, 1, 8}, cfg(4, 4, 8, 3, false, ScaleDType::FP8_E4M3, Scaling::Compat)},
      // int3 (a `qvg.prq/2` file): appended, so the seeds above keep their bytes.
      {DType::BF16, {1, 7, 2, 16}, cfg(3, 4, 8, 1, false, ScaleDType::FP8_E4M3, Scaling::TwoLevel)},
      {DType::F32, {1, 5, 1, 24}, cfg(3, 2, 24, 2, true, ScaleDType::BF16, Scaling::Compat)},
  };
  n = 0;
  for (const Q& q : qs) {
    const Bytes b = serialize_qvgt(encode(data(q.dt, q.s, uint64_t(n + 1)), q.c));
    put(out / "qvgt", fmt::format("seed_{:02}.qvgt", n), b);
    put(out / "safetensors", fmt::format("seed_qvgt_{:02}.safetensors", n), b);
    ++n;
  }
  SafetensorsFile st;
  st.metadata = {{"format", "pt"}, {"note", "h\xc3\xa9llo"}};
  st.tensors.push_back({"a.f32", StDType::F32, {2, 3}, Bytes(24, 1)});
  st.tensors.push_back({"b.f16", StDType::F16, {3}, Bytes(6, 2)});
  st.tensors.push_back({"c.bf16", StDType::BF16, {1, 1, 2}, Bytes(4, 3)});
  st.tensors.push_back({"d.u8", StDType::U8, {0}, {}});
  st.tensors.push_back({"e.f8", StDType::F8_E4M3, {2, 2}, Bytes{0x38, 0x40, 0x00, 0x7e}});
  put(out / "safetensors", "seed_mixed.safetensors", serialize_safetensors(st));
  SafetensorsFile kv;
  kv.tensors.push_back({"k", StDType::BF16, {1, 4, 2, 8}, Bytes(128, 0x3f)});
  put(out / "safetensors", "seed_kv.safetensors", serialize_safetensors(kv));

  // Snapshots (one flags byte first: bit 0 fix checksums, bit 1 dense).
  auto snap = [&](const std::string& name, uint8_t flags, const Bytes& b) {
    Bytes x = {flags};
    x.insert(x.end(), b.begin(), b.end());
    put(out / "snapshot", name, x);
  };
  auto kvt = [&](DType dt, int64_t tokens, int64_t heads, int64_t d, uint64_t seed) {
    return data(dt, {1, tokens, heads, d}, seed);
  };
  {
    const DenseCausalCache d = testing::small_dense_cache();
    snap("seed_dense_grown.snap", 2, d.snapshot_bytes());
    snap("seed_dense_grown_fix.snap", 3, d.snapshot_bytes());
    CacheOptions o = testing::small_cache_options();
    o.cache_size = 8;
    o.attention_window_size = 6;
    o.dtype = DType::BF16;
    DenseCausalCache e(o);
    for (int64_t c = 0; c < 16; c += 3)
      e.update(kvt(DType::BF16, 3, 2, 8, uint64_t(c)), kvt(DType::BF16, 3, 2, 8, uint64_t(c + 7)), c);
    snap("seed_dense_evicted.snap", 2, e.snapshot_bytes());
  }
  {
    const PackedCausalCache p = testing::small_packed_cache();
    snap("seed_packed_warm.snap", 0, p.snapshot_bytes());
    snap("seed_packed_warm_fix.snap", 1, p.snapshot_bytes());
    CacheOptions o = testing::small_cache_options();
    QuantArgs q2 = testing::small_quant();
    q2.enable(2);
    q2.codec.asymmetric = true;
    q2.codec.scale_dtype = ScaleDType::BF16;
    q2.codec.scaling = Scaling::Compat;
    q2.codec.init = Init::Random;
    q2.span_chunks = 2;
    q2.sink_span = SinkSpan::Full;
    o.dtype = DType::BF16;
    o.attention_window_size = 12;
    o.cache_size = 24;
    PackedCausalCache p2(o, q2);
    for (int64_t c = 0; c < 40; c += 4)
      p2.update(kvt(DType::BF16, 4, 2, 8, uint64_t(c)), kvt(DType::BF16, 4, 2, 8, uint64_t(c + 5)), c);
    snap("seed_packed_span.snap", 0, p2.snapshot_bytes());
    snap("seed_packed_span_fix.snap", 5, p2.snapshot_bytes());
    PackedCausalCache off(o, QuantArgs{});
    for (int64_t c = 0; c < 20; c += 5)
      off.update(kvt(DType::BF16, 5, 2, 8, uint64_t(c)), kvt(DType::BF16, 5, 2, 8, uint64_t(c)), c);
    snap("seed_packed_off.snap", 1, off.snapshot_bytes());
    PackedCausalCache empty(o, q2);
    snap("seed_packed_empty.snap", 0, empty.snapshot_bytes());
    // Incremental spans (format 1.1): span sections, span chunks, an open span, breaks.
    const PackedCausalCache inc = testing::small_incremental_cache();
    snap("seed_packed_incremental.snap", 0, inc.snapshot_bytes());
    snap("seed_packed_incremental_fix.snap", 1, inc.snapshot_bytes());
    QuantArgs q3 = q2;
    q3.span_mode = SpanMode::Incremental;
    q3.span_break_ratio = 1.5;
    q3.keep_recent_chunks = 1;
    q3.sink_span = SinkSpan::Chunk;
    // A packed cache after chunks of 4 bf16 tokens up to `end`, K and V of seeds c + dk, c + dv.
    auto streamed = [&](const CacheOptions& co, const QuantArgs& q, int64_t end, uint64_t dk, uint64_t dv) {
      PackedCausalCache c(co, q);
      for (int64_t g = 0; g < end; g += 4)
        c.update(kvt(DType::BF16, 4, 2, 8, uint64_t(g) + dk), kvt(DType::BF16, 4, 2, 8, uint64_t(g) + dv), g);
      return c;
    };
    snap("seed_packed_incremental_bf16_fix.snap", 5, streamed(o, q3, 40, 1, 3).snapshot_bytes());
    // A head shard (format 1.2: the config entry head_offset).
    CacheOptions os = o;
    os.head_offset = 7;
    const PackedCausalCache shard = streamed(os, q3, 24, 2, 4);
    snap("seed_packed_shard.snap", 0, shard.snapshot_bytes());
    snap("seed_packed_shard_fix.snap", 1, shard.snapshot_bytes());
    // Per-role codec settings and the MSE scale search (format 1.3: the config entries
    // scale_search and the k_/v_ overrides; each role's encodings with its own layout).
    QuantArgs q4 = q2;
    q4.codec.scale_search = ScaleSearch::Mse;
    q4.k.set(&CodecConfig::bits, 4);
    q4.v.set(&CodecConfig::asymmetric, false);
    q4.v.set(&CodecConfig::scale_dtype, ScaleDType::FP8_E4M3);
    const PackedCausalCache roles = streamed(o, q4, 40, 6, 8);
    snap("seed_packed_roles.snap", 0, roles.snapshot_bytes());
    snap("seed_packed_roles_fix.snap", 1, roles.snapshot_bytes());
    // Refinement layers of the newest chunks (format 1.4: the config entries
    // refine_recent and refine_bits, segment flag 0x2 and the layers' f32 encodings).
    QuantArgs q5 = q3;
    q5.refine_recent = 2;
    q5.refine_bits = 2;
    const PackedCausalCache refined = streamed(o, q5, 32, 9, 11);
    snap("seed_packed_refined.snap", 0, refined.snapshot_bytes());
    snap("seed_packed_refined_fix.snap", 1, refined.snapshot_bytes());
  }

  // The cache API: random byte strings (the target reads them as calls).
  std::mt19937_64 rng(7);
  for (int i = 0; i < 12; ++i) {
    Bytes b(size_t(200 + 100 * i));
    for (auto& x : b) x = uint8_t(rng());
    put(out / "cache_api", fmt::format("seed_{:02}", i), b);
  }
  std::printf("seed corpora written to %s\n", out.c_str());
  return 0;
}
