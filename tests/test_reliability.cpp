// Regression tests of the findings of an adversarial run against the readers, the CLI
// and the caches (docs/reliability.md, "Findings and their fixes"), one test (or more)
// per finding. CLI-level behaviour (exit statuses, the FIFO and thread flags end to
// end) is in tests/cli/reliability.sh.
//
//   1  deeply nested JSON crashed the error formatting (stack overflow)
//   2  huge thread counts crashed OpenMP
//   3  finite but huge scales / factors decoded to Inf and NaN
//   4  a FIFO input blocked forever
//   5  header parsing was quadratic in the number of tensors
//   7  a 20-digit metadata integer overflowed (UB)   -> test_io.cpp (bad metadata list)
//   8  stages > 64 accepted                          -> test_codec.cpp (Config.*)
//   10 a non-canonical `shape` accepted              -> test_io.cpp (Qvgt.*NonCanonicalShape*)
//   11 a key aliasing the cache's own memory
//   12 sizes of 2^40 accepted                        -> test_cache_errors.cpp (ConstructorOptions)
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/attention.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "qvg/eval/workload.h"
#include "qvg/io.h"
#include "qvg/numeric.h"
#include "support/cache_model.h"
#include "support/files.h"

namespace qvg {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using testing::st_bytes;

std::string error_text(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A small valid encoding of random data.
EncodedTensor small_encoding(DType dt, ScaleDType sd, bool asym, Scaling sc = Scaling::TwoLevel) {
  std::mt19937_64 rng(3);
  const Tensor x = testing::random_tensor(rng, dt, {1, 12, 2, 16}, 3.0f);
  CodecConfig c;
  c.centroids = 4;
  c.block_size = 8;
  c.stages = 2;
  c.scale_dtype = sd;
  c.asymmetric = asym;
  c.scaling = sc;
  c.threads = 1;
  return encode(x, c);
}

// ---- finding 1: deep nesting ----------------------------------------------------

TEST(NestedJson, DeeplyNestedJsonIsRefusedWithoutRecursion) {
  const std::string deep(100000, '[');
  const std::vector<std::string> headers = {
      R"({"__metadata__":{"a":)" + deep + "}}",
      R"({"x":{"dtype":"U8","shape":[)" + deep + R"(],"data_offsets":[0,0]}})",
      R"({"x":{"dtype":"U8","shape":)" + deep + "}}",
      R"({"x":{"dtype":)" + deep + "}}",
      R"({"x":)" + deep + "}",
      deep,
      "{\"x\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,0],\"y\":" + std::string(100000, '{') + "}}",
  };
  for (const std::string& h : headers) {
    const Bytes b = st_bytes(h);
    EXPECT_THROW(parse_safetensors(b), CorruptData) << h.substr(0, 40);
    EXPECT_THROW(parse_qvgt(b), CorruptData) << h.substr(0, 40);
  }
  // The message describes the unexpected container, it does not print it.
  const std::string m = error_text([&] { parse_safetensors(st_bytes(headers[0])); });
  EXPECT_NE(m.find("__metadata__ entry 'a' must be a string, got a JSON array"), std::string::npos) << m;
  EXPECT_LT(m.size(), 200u);
  // A deep `shape` string of a .qvgt is refused as a non-canonical shape.
  const std::string qm = error_text([&] {
    SafetensorsFile st = parse_safetensors(serialize_qvgt(small_encoding(DType::F32, ScaleDType::FP8_E4M3, false)));
    for (auto& [k, v] : st.metadata)
      if (k == "shape") v = deep;
    parse_qvgt(serialize_safetensors(st));
  });
  EXPECT_NE(qm.find("metadata 'shape'"), std::string::npos) << qm.substr(0, 200);
}

// ---- finding 2: thread counts ---------------------------------------------------

TEST(ThreadCaps, ThreadCountsAreCappedEverywhere) {
  const int limit = max_threads();
  EXPECT_GE(limit, 16);
  EXPECT_NO_THROW(check_threads("threads", 0));
  EXPECT_NO_THROW(check_threads("threads", limit));
  for (int64_t bad : {int64_t(-1), int64_t(limit) + 1, int64_t(32768), int64_t(65536), int64_t(100000)}) {
    const std::string m = error_text([&] { check_threads("--threads", bad); });
    EXPECT_NE(m.find(fmt::format("--threads must be in 0..{}", limit)), std::string::npos) << m;
    EXPECT_NE(m.find(fmt::format("got {}", bad)), std::string::npos) << m;
  }
  const EncodedTensor enc = small_encoding(DType::F32, ScaleDType::FP8_E4M3, false);
  Tensor out(DType::F32, enc.shape);
  EXPECT_THROW(decode(enc, out.view(), 65536), InvalidArgument);
  EXPECT_THROW(decode(enc, out.view(), -1), InvalidArgument);
  EXPECT_NO_THROW(decode(enc, out.view(), limit));
  CodecConfig c;
  c.threads = 100000;
  EXPECT_THROW(c.validate(), InvalidArgument);
  QuantArgs q;
  q.codec.threads = 32768;
  EXPECT_THROW(q.validate(), InvalidArgument);
  CacheOptions o;
  o.cache_size = 8;
  o.head_dim = 16;
  EXPECT_THROW(PackedCausalCache(o, q), InvalidArgument);
  const Tensor t(DType::F32, {1, 2, 1, 16});
  EXPECT_THROW(attention(t.view(), StridedView::of(t.view()), StridedView::of(t.view()), 65536), InvalidArgument);
  WorkloadOptions wo;
  wo.threads = 65536;
  EXPECT_THROW(Workload(find_model_preset("self-forcing-1.3b"), wo), InvalidArgument);
  EXPECT_EQ(resolve_threads(3), 3);
  EXPECT_GE(resolve_threads(0), 1);
  EXPECT_LE(resolve_threads(0), limit);
}

// ---- finding 3: scales and factors that decode to Inf/NaN --------------------------

// Re-serialises `e` with f applied to its safetensors image.
template <class F>
Bytes edited(const EncodedTensor& e, F f) {
  SafetensorsFile st = parse_safetensors(serialize_qvgt(e));
  for (SafeTensor& t : st.tensors) f(t);
  return serialize_safetensors(st);
}

bool all_finite(const Tensor& t) {
  for (float v : t.to_f32())
    if (!std::isfinite(v)) return false;
  return true;
}

TEST(HugeScales, ScalesAndFactorsThatWouldDecodeToInfAreRefused) {
  const EncodedTensor fp8 = small_encoding(DType::BF16, ScaleDType::FP8_E4M3, true);
  const EncodedTensor bf16 = small_encoding(DType::BF16, ScaleDType::BF16, false, Scaling::Compat);
  // The two files as found: a finite scale_factor of 3e38, a bf16 scale of 0x7f7f (the
  // largest finite bf16).
  const Bytes huge_factor = edited(fp8, [](SafeTensor& t) {
    if (t.name == "scale_factor") {
      const float f = 3e38f;
      std::memcpy(t.data.data(), &f, 4);
    }
  });
  const Bytes huge_scale = edited(bf16, [](SafeTensor& t) {
    if (t.name == "scales") t.data[0] = 0x7f, t.data[1] = 0x7f;
  });
  for (const Bytes* b : {&huge_factor, &huge_scale}) {
    const std::string m = error_text([&] { parse_qvgt(*b); });
    EXPECT_NE(m.find("keeps every decoded value finite"), std::string::npos) << m;
  }
  // Huge centroids (finite in f32) and huge zeros likewise.
  const EncodedTensor f32 = small_encoding(DType::F32, ScaleDType::FP8_E4M3, true);
  EXPECT_THROW(parse_qvgt(edited(f32,
                                 [](SafeTensor& t) {
                                   if (t.name != "centroids.0") return;
                                   const float f = 3e38f;
                                   std::memcpy(t.data.data(), &f, 4);
                                 })),
               CorruptData);
  EXPECT_THROW(parse_qvgt(edited(f32,
                                 [](SafeTensor& t) {
                                   if (t.name != "zero_factor") return;
                                   const float f = 1e36f;
                                   std::memcpy(t.data.data(), &f, 4);
                                 })),
               CorruptData);
  // What the bound allows still decodes, finite: a factor 1e30 on scales <= 448 is
  // within 1e37.
  const Bytes big_ok = edited(fp8, [](SafeTensor& t) {
    if (t.name != "scale_factor") return;
    const float f = 1e30f;
    std::memcpy(t.data.data(), &f, 4);
  });
  const EncodedTensor ok = parse_qvgt(big_ok);
  EXPECT_TRUE(all_finite(decode(ok)));
}

// Every accepted mutation of the scales, zeros, factors and centroids decodes to
// finite values in every output dtype (spec 1.6: no NaN from accepted input).
TEST(HugeScales, AcceptedEncodingsAlwaysDecodeFinite) {
  std::mt19937_64 rng(11);
  const std::vector<EncodedTensor> bases = {small_encoding(DType::BF16, ScaleDType::FP8_E4M3, true),
                                            small_encoding(DType::F16, ScaleDType::BF16, true, Scaling::Compat),
                                            small_encoding(DType::F32, ScaleDType::FP8_E4M3, false)};
  const float magnitudes[] = {1e3f, 1e20f, 1e30f, 1e35f, 1e37f, 3e38f};
  int accepted = 0, refused = 0;
  for (int it = 0; it < testing::scaled(600, 150); ++it) {
    const EncodedTensor& base = bases[size_t(it) % bases.size()];
    const float mag = magnitudes[rng() % std::size(magnitudes)];
    const Bytes b = edited(base, [&](SafeTensor& t) {
      if (t.name == "codes" || t.name.rfind("ids", 0) == 0 || t.data.empty()) return;
      const size_t esz = st_dtype_size(t.dtype);
      const size_t i = (rng() % (t.data.size() / esz)) * esz;
      if (t.dtype == StDType::F32) {
        const float v = (rng() & 1 ? mag : 0.5f * mag) * (t.name.find("factor") != std::string::npos ? 1.0f : -1.0f);
        std::memcpy(t.data.data() + i, &v, 4);
      } else if (t.dtype == StDType::BF16 || t.dtype == StDType::F16) {
        const uint16_t v = uint16_t(rng() & 0x7fff);
        std::memcpy(t.data.data() + i, &v, 2);
      } else {
        t.data[i] = uint8_t(rng() & 0x7e);  // any finite non-negative fp8
      }
    });
    EncodedTensor e;
    try {
      e = parse_qvgt(b);
    } catch (const CorruptData&) {
      ++refused;
      continue;
    }
    ++accepted;
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      Tensor t(out, e.shape);
      decode(e, t.view(), 1);
      ASSERT_TRUE(all_finite(t)) << "iteration " << it << " output " << dtype_name(out);
    }
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(refused, 20);
}

// ---- finding 4: FIFO ------------------------------------------------------------------

TEST(FifoInput, FifoIsRefusedWithoutBlocking) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("qvg_fifo_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path fifo = dir / "in.qvgt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto fut = std::async(std::launch::async, [&] { return error_text([&] { read_qvgt(fifo); }); });
  if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock the reader so that the test can end, then fail.
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
    fut.wait();
    FAIL() << "reading a FIFO blocked";
  }
  const std::string m = fut.get();
  EXPECT_NE(m.find("FIFO"), std::string::npos) << m;
  EXPECT_THROW(read_file_bytes(fifo), InvalidArgument);
  EXPECT_THROW(read_tensor_file(dir / "in.npy"), InvalidArgument);  // missing: plain error
  EXPECT_THROW(read_file_bytes(dir), InvalidArgument);              // a directory
  fs::remove_all(dir);
}

// ---- finding 5: many tensors -----------------------------------------------------------

std::string many_tensors_header(size_t n) {
  std::string h = "{";
  for (size_t i = 0; i < n; ++i)
    h += fmt::format(R"({}"t{}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", i ? "," : "", i);
  return h + "}";
}

// CPU time of this thread (not wall time: other processes do not count), best of 5.
double seconds_to_parse(const Bytes& b) {
  auto cpu = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = cpu();
    (void)parse_safetensors(b);
    best = std::min(best, cpu() - t0);
  }
  return best;
}

TEST(HeaderParsing, HeaderParsingIsLinearAndTheTensorCountBounded) {
  // 300,000 tensors (20 MB of header): refused at the 100,001st.
  const Bytes huge = st_bytes(many_tensors_header(300000));
  const std::string m = error_text([&] { parse_safetensors(huge); });
  EXPECT_NE(m.find("more than 100000 tensors"), std::string::npos) << m;
  // Refused there, without reading on (was > 60 s): a header whose 100,001st entry
  // is followed by bytes that are not JSON gets the same error, not the parser's
  // (checked so, not by a wall-clock limit).
  std::string cut = many_tensors_header(100001);
  cut.back() = ',';
  cut += "\x01 not JSON at all";
  const std::string m2 = error_text([&] { parse_safetensors(st_bytes(cut)); });
  EXPECT_NE(m2.find("more than 100000 tensors"), std::string::npos) << m2;
  // A .qvgt holds at most 2 * 64 + 5 arrays: refused after 133.
  EXPECT_NE(error_text([&] { parse_qvgt(huge); }).find("more than 133 tensors"), std::string::npos);
  // Linear: 8x the tensors costs ~8x the time (quadratic was 64x).
  const double small = seconds_to_parse(st_bytes(many_tensors_header(5000)));
  const double large = seconds_to_parse(st_bytes(many_tensors_header(40000)));
  EXPECT_LT(large / small, 24.0) << small << " s vs " << large << " s";
  EXPECT_EQ(parse_safetensors(st_bytes(many_tensors_header(100000))).tensors.size(), 100000u);
}

// ---- finding 11: a key that aliases the cache's own memory -----------------------------

CacheOptions alias_opts() {
  CacheOptions o;
  o.batch = 1;
  o.cache_size = 12;
  o.heads = 2;
  o.head_dim = 8;
  o.dtype = DType::F32;
  o.sink_tokens = 2;
  return o;
}

TEST(AliasedInputs, DenseKeyThatIsASliceOfItsOwnBufferActsAsAClone) {
  std::mt19937_64 rng(5);
  DenseCausalCache a(alias_opts()), b(alias_opts());
  for (int64_t c = 0; c < 12; c += 4) {
    const Tensor k = testing::random_tensor(rng, DType::F32, {1, 4, 2, 8});
    const Tensor v = testing::random_tensor(rng, DType::F32, {1, 4, 2, 8});
    a.update(k, v, c);
    b.update(k, v, c);
  }
  // The next chunk evicts (the buffer rolls) and its key is buffer[:, 0:8]: rolled
  // before it is read unless the cache copies it first.
  const ConstTensorView kb = a.k_buffer(), vb = a.v_buffer();
  const ConstTensorView key{kb.data, kb.dtype, {1, 8, 2, 8}};
  const ConstTensorView value{static_cast<const std::byte*>(vb.data) + 4 * 16 * 4, vb.dtype, {1, 8, 2, 8}};
  const Tensor key_clone = Tensor::copy_of(key), value_clone = Tensor::copy_of(value);
  const KVView va = a.update(key, value, 12);
  const KVView vb2 = b.update(key_clone, value_clone, 12);
  EXPECT_EQ(testing::compare_views(va, vb2), "");
  EXPECT_EQ(qvg::detail::debug_state(a).k, qvg::detail::debug_state(b).k);
  EXPECT_EQ(qvg::detail::debug_state(a).v, qvg::detail::debug_state(b).v);
  // The view a copied call returned (scratch memory) used as the next key.
  const Tensor k4 = testing::random_tensor(rng, DType::F32, {1, 4, 2, 8});
  const KVView sa = a.update(k4, k4, 20, std::nullopt, 2);  // sink + recent: two ranges, copied
  b.update(k4, k4, 20, std::nullopt, 2);
  ASSERT_FALSE(sa.zero_copy);
  const ConstTensorView sk{sa.k.data, DType::F32, {1, 4, 2, 8}}, sv{sa.v.data, DType::F32, {1, 4, 2, 8}};
  const Tensor skc = Tensor::copy_of(sk), svc = Tensor::copy_of(sv);
  EXPECT_EQ(testing::compare_views(a.update(sk, sv, 24), b.update(skc, svc, 24)), "");
  EXPECT_EQ(qvg::detail::debug_state(a).k, qvg::detail::debug_state(b).k);
}

TEST(AliasedInputs, PackedKeyThatIsAnEarlierViewActsAsAClone) {
  std::mt19937_64 rng(6);
  CacheOptions o = alias_opts();
  o.cache_size = 16;
  o.sink_tokens = 0;
  QuantArgs q;
  q.enable(4);
  q.codec.block_size = 8;
  q.codec.centroids = 4;
  q.keep_recent_chunks = 0;
  PackedCausalCache a(o, q), b(o, q);
  const Tensor k0 = testing::random_tensor(rng, DType::F32, {1, 4, 2, 8});
  const Tensor v0 = testing::random_tensor(rng, DType::F32, {1, 4, 2, 8});
  a.update(k0, v0, 0);
  b.update(k0, v0, 0);
  // rw = 0: the view is the current chunk, returned without a copy (it aliases the
  // current raw segment, which the next advance encodes and frees).
  const KVView z = a.update(k0, v0, 4, std::nullopt, 0);
  b.update(k0, v0, 4, std::nullopt, 0);
  ASSERT_TRUE(z.zero_copy);
  const ConstTensorView zk{z.k.data, DType::F32, {1, 4, 2, 8}}, zv{z.v.data, DType::F32, {1, 4, 2, 8}};
  const Tensor zkc = Tensor::copy_of(zk), zvc = Tensor::copy_of(zv);
  const KVView va = a.update(zk, zv, 8);
  const KVView vb = b.update(zkc, zvc, 8);
  EXPECT_EQ(testing::compare_views(va, vb), "");
  EXPECT_EQ(qvg::detail::debug_state(a).segments, qvg::detail::debug_state(b).segments);
  // And a copied view as the next key.
  const ConstTensorView ck{va.k.data, DType::F32, {1, 4, 2, 8}}, cv{va.v.data, DType::F32, {1, 4, 2, 8}};
  ASSERT_FALSE(va.zero_copy);
  const Tensor ckc = Tensor::copy_of(ck), cvc = Tensor::copy_of(cv);
  EXPECT_EQ(testing::compare_views(a.update(ck, cv, 12), b.update(ckc, cvc, 12)), "");
  EXPECT_EQ(qvg::detail::debug_state(a).segments, qvg::detail::debug_state(b).segments);
}

}  // namespace
}  // namespace qvg
