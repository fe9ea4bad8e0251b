// Writers and readers at their edges (docs/reliability.md, "Reliability III: library
// and CLI"; spec 5.1, "Files"). Header checks before reads are in
// test_alloc_bounds.cpp (it counts allocations), the CLI's failing outputs and real
// flags in tests/cli/reliability_inputs_outputs.sh, the memory model's extrapolated
// peak in test_memory.cpp.
//  * ReadersAcceptTheEncoder: every factor and scale the encoder writes is accepted by
//    every reader — the instance (asymmetric fp8 two_level zeros of |z| ~ 1e-44: the
//    zero factor rounded to 0), then properties over every dtype, scale dtype, scaling,
//    bit width and magnitudes from 0 and denormals to 1e16, for stand-alone encodings,
//    span chunks, refinement layers and a cache's snapshots.
//  * NulInPath: a path holding a NUL byte is refused by every reader and writer.
//  * ReplacedFileMode: a replaced file keeps its permission bits; a new one follows the umask.
//  * LongDestinationName: a destination name of 255 bytes is written (its temporary fits).
//  * RefusedValueText: a value refused by the input limits is printed so that it
//    visibly exceeds them (float32(1e16) is not "1e+16").
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/input_limits.h"
#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/file.h"
#include "qvg/io.h"
#include "qvg/numeric.h"
#include "qvg/snapshot.h"
#include "support/files.h"

namespace qvg {
namespace {

namespace fs = std::filesystem;
using testing::put_file;
using testing::TempDir;

/// Options of a cache of `cache_size` tokens, `heads` x `head_dim`, in dtype dt.
CacheOptions options(int64_t cache_size, int64_t heads, int64_t head_dim, DType dt = DType::BF16) {
  CacheOptions o;
  o.cache_size = cache_size, o.heads = heads, o.head_dim = head_dim, o.dtype = dt;
  return o;
}

// ---- encoder output against the readers -------------------------------------------------

/// The f32 value of bits.
float f32_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// Every reader of an encoding, on `enc`: validate() and validate_values() (what
/// decode, the snapshot reader and the `.qvgt` reader ask), the `.qvgt` round trip,
/// and a finite decode into every dtype. Returns "" or what failed.
std::string readers_refuse(const EncodedTensor& enc) {
  try {
    enc.validate();
    enc.validate_values();
    const EncodedTensor back = parse_qvgt(serialize_qvgt(enc));
    if (!(back == enc)) return ".qvgt round trip changed the encoding";
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      Tensor out(dt, enc.shape);
      decode(back, out.view(), 1);
      for (int64_t i = 0; i < out.shape().numel(); ++i)
        if (!std::isfinite(load_f32(out.data(), dt, size_t(i))))
          return std::string("decodes to a non-finite value in ") + std::string(dtype_name(dt));
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReadersAcceptTheEncoder, TinyAsymmetricZerosAreAcceptedByEveryReader) {
  // The case as found: asymmetric, fp8 scales, two_level scaling, f32, values about
  // 1e-44 (finite, within the limits). The zero factor (largest |z| / 448) rounded
  // to 0 and every reader refused what the encoder wrote.
  Tensor x(DType::F32, {1, 16, 2, 64});
  for (int64_t i = 0; i < x.shape().numel(); ++i)
    static_cast<float*>(x.data())[i] = (i % 3 == 0 ? -1.0f : 1.0f) * f32_of(uint32_t(1 + i % 7));  // k * 2^-149
  CodecConfig c;
  c.asymmetric = true;
  c.centroids = 4;
  const EncodedTensor enc = encode(x.view(), c);
  for (float f : enc.zero_factor) EXPECT_TRUE(std::isfinite(f) && f > 0) << f;
  EXPECT_EQ(readers_refuse(enc), "");
  TempDir dir("qvg_writer_reader");
  EXPECT_NO_THROW(write_qvgt(dir / "x.qvgt", enc));
  EXPECT_NO_THROW(read_qvgt(dir / "x.qvgt"));

  // A cache of such values saves a snapshot it loads.
  QuantArgs q;
  q.enable(2), q.codec.centroids = 4, q.codec.asymmetric = true, q.keep_recent_chunks = 0;
  PackedCausalCache cache(options(64, 2, 64, DType::F32), q);
  for (int64_t c0 = 0; c0 < 48; c0 += 16) cache.update(x.view(), x.view(), c0);
  ASSERT_TRUE(cache.segment(0).packed);
  cache.save(dir / "tiny.snap");
  const PackedCausalCache loaded = PackedCausalCache::load(dir / "tiny.snap");
  EXPECT_EQ(loaded.snapshot_bytes(), cache.snapshot_bytes());
}

/// A value of the magnitude class `cls` (0: zero, 1: denormal, 2: smallest normals,
/// 3: tiny, 4: ordinary, 5: large, 6: huge up to 1e16) representable in dt after
/// rounding and inside the input limits; `u` in [0, 1) picks it in the class.
float value_of(int cls, double u, bool negative, DType dt) {
  // log10 ranges per class; f16's range is 6e-8 (denormal) .. 65504.
  const bool f16 = dt == DType::F16;
  double lo = 0, hi = 0;
  switch (cls) {
    case 0: return negative ? -0.0f : 0.0f;
    case 1: lo = f16 ? -7.2 : -44.8, hi = f16 ? -4.3 : -38.2; break;
    case 2: lo = f16 ? -4.2 : -37.9, hi = f16 ? -3.5 : -35.0; break;
    case 3: lo = f16 ? -3.0 : -30, hi = f16 ? -1.0 : -8; break;
    case 4: lo = -2, hi = 2; break;
    case 5: lo = 2.5, hi = f16 ? 4.0 : 9; break;
    default: lo = f16 ? 4.5 : 12, hi = f16 ? 4.8 : 15.99; break;
  }
  const double v = std::pow(10.0, lo + (hi - lo) * u);
  float f = float(v);
  // Round as the tensor will hold it, staying inside the input limits.
  uint8_t b[4];
  store_f32(b, dt, 0, f);
  f = load_f32(b, dt, 0);
  if (!(std::fabs(double(f)) <= kMaxAbsInput) || !std::isfinite(f)) f = 0.0f;
  return negative ? -f : f;
}

/// A magnitude class, the extremes weighted up (the denormals most: their asymmetric
/// zeros once gave a zero factor that rounded to 0).
int any_class() {
  return *rc::gen::weightedElement<int>({{1, 0}, {4, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {2, 6}});
}

/// A tensor whose (b, h) groups each have a largest magnitude T from a class, and
/// elements that are T (a constant group: zero-range blocks), spread over [-T, T], or
/// mixed with elements of a second class.
Tensor extreme_tensor(Shape4 s, DType dt) {
  Tensor x(dt, s);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int c1 = any_class(), c2 = any_class();
      const int mode = *rc::gen::weightedElement<int>({{1, 0}, {3, 1}, {2, 2}});  // constant, spread, mixed
      std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
      std::uniform_real_distribution<double> u(0, 1);
      const float top = value_of(c1, u(rng), false, dt);
      for (int64_t t = 0; t < s.s; ++t)
        for (int64_t d = 0; d < s.d; ++d) {
          const bool neg = (rng() & 1) != 0;
          float v = top;
          if (mode == 2 && (rng() & 3) == 0) {
            v = value_of(c2, u(rng), neg, dt);
          } else if (mode != 0) {
            uint8_t e[4];
            store_f32(e, dt, 0, float(double(top) * u(rng)));
            v = (neg ? -1.0f : 1.0f) * load_f32(e, dt, 0);
          }
          x.set(b, t, h, d, v);
        }
    }
  return x;
}

CodecConfig any_codec(int64_t d) {
  CodecConfig c;
  c.bits = *rc::gen::element(2, 4);
  c.block_size = int(*rc::gen::element<int64_t>(8, 16, d));
  c.centroids = *rc::gen::inRange(1, 5);  // fewer than the tokens mostly: residuals left
  c.stages = *rc::gen::inRange(1, 3);
  c.kmeans_iters = *rc::gen::inRange(1, 3);
  c.asymmetric = *rc::gen::arbitrary<bool>();
  // Every combination; fp8 and two_level (the defaults, where factors apply) weighted up.
  c.scale_dtype = *rc::gen::weightedElement<ScaleDType>({{3, ScaleDType::FP8_E4M3}, {1, ScaleDType::BF16}});
  c.scaling = *rc::gen::weightedElement<Scaling>({{3, Scaling::TwoLevel}, {1, Scaling::Compat}});
  c.scale_search = *rc::gen::element(ScaleSearch::Off, ScaleSearch::Mse);
  c.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  c.threads = 1;
  return c;
}

// The class: whatever the dtype, scale dtype, scaling and magnitudes (zero,
// denormal, the smallest normals, tiny, ordinary, large, up to 1e16, mixed in a
// group or constant), what the encoder writes — a stand-alone encoding, a span chunk
// against its codebook, a refinement layer — is accepted by every reader.
RC_GTEST_PROP(ReadersAcceptTheEncoderProperty, EveryEncodingTheEncoderWritesIsAccepted, ()) {
  const DType dt = *rc::gen::element(DType::F32, DType::BF16, DType::F16);
  const int64_t D = *rc::gen::element(16, 32);
  const Shape4 s{*rc::gen::inRange<int64_t>(1, 3), *rc::gen::inRange<int64_t>(1, 13), *rc::gen::inRange<int64_t>(1, 3),
                 D};
  const CodecConfig c = any_codec(D);
  const Tensor x = extreme_tensor(s, dt);
  const EncodedTensor enc = encode(x.view(), c);
  RC_ASSERT(readers_refuse(enc) == "");

  // A span chunk (what the packed cache's incremental spans store): factors as the
  // snapshot reader asks, values against the span's codebook.
  SpanCodebook span = SpanCodebook::empty(s, dt, c);
  const EncodedTensor part = encode_span_chunk(x.view(), c, span, c.centroids);
  for (const std::vector<float>* fv : {&part.scale_factor, &part.zero_factor})
    for (float f : *fv) RC_ASSERT(std::isfinite(f) && f > 0);
  RC_ASSERT_FALSE(part.scale_factor.empty() && c.scaling == Scaling::TwoLevel);
  const EncodedTensor whole = with_codebook(part, span.book);
  try {
    whole.validate_values();
  } catch (const Error& e) {
    RC_FAIL(std::string("span chunk: ") + e.what());
  }

  // A refinement layer of the decoding error (an f32 encoding of tiny values when
  // the base is good: its zero factor is where the case as found hid).
  const Tensor dec = decode(enc, 1);
  const EncodedTensor layer =
      encode_refinement(x.view(), dec.view(), refinement_config(*rc::gen::element(2, 4), 8, 1, /*threads=*/1));
  RC_ASSERT(readers_refuse(layer) == "");
}

// The same through a cache: the packed cache fed chunks of such values (random
// policy settings) always writes a snapshot that both loaders accept.
RC_GTEST_PROP(ReadersAcceptTheEncoderProperty, ACachesSnapshotOfExtremeValuesLoads, ()) {
  const DType dt = *rc::gen::element(DType::F32, DType::BF16, DType::F16);
  CacheOptions o = options(24, 2, 16, dt);
  o.sink_tokens = *rc::gen::element<int64_t>(0, 4);
  const CodecConfig c = any_codec(o.head_dim);
  QuantArgs q;
  q.quantize = true;
  q.codec = c;
  q.keep_recent_chunks = *rc::gen::inRange(0, 2);
  q.span_chunks = *rc::gen::inRange(1, 3);
  q.span_mode = *rc::gen::element(SpanMode::Deferred, SpanMode::Incremental);
  if (q.span_mode == SpanMode::Incremental) q.refine_recent = *rc::gen::inRange(0, 2);
  PackedCausalCache cache(o, q);
  for (int64_t c0 = 0; c0 < 40; c0 += 4) {
    const Tensor k = extreme_tensor({1, 4, 2, 16}, dt), v = extreme_tensor({1, 4, 2, 16}, dt);
    cache.update(k.view(), v.view(), c0);
  }
  const std::vector<uint8_t> bytes = cache.snapshot_bytes();
  try {
    RC_ASSERT(PackedCausalCache::from_snapshot_bytes(bytes).snapshot_bytes() == bytes);
  } catch (const Error& e) {
    RC_FAIL(std::string("snapshot refused: ") + e.what());
  }
}

// ---- a NUL byte in a path ---------------------------------------------------------------

TEST(NulInPath, APathWithANulByteIsRefusedByEveryReaderAndWriter) {
  TempDir dir("qvg_writer_reader");
  const std::string victim = (dir / "victim").string();
  put_file(dir / "victim", {7, 7, 7});
  const fs::path nul(victim + std::string("\0.snap", 6));
  ASSERT_EQ(nul.native().size(), victim.size() + 6);
  auto refused = [&](const char* what, auto&& f) {
    try {
      f();
      ADD_FAILURE() << what << ": accepted a path with a NUL byte";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("NUL byte"), std::string::npos) << what << ": " << e.what();
    }
  };
  DenseCausalCache dense(options(8, 1, 8));
  QuantArgs q;
  q.enable(2), q.codec.centroids = 2, q.codec.block_size = 8;
  PackedCausalCache packed(options(8, 1, 8), q);
  Tensor t(DType::F32, {1, 2, 1, 8});
  refused("write_file_atomic", [&] { write_file_atomic(nul, std::vector<uint8_t>{1, 2}); });
  refused("DenseCausalCache::save", [&] { dense.save(nul); });
  refused("PackedCausalCache::save", [&] { packed.save(nul); });
  refused("write_tensor_file", [&] { write_tensor_file(fs::path(victim + std::string("\0.npy", 5)), t.view()); });
  refused("read_file_bytes", [&] { (void)read_file_bytes(nul); });
  refused("read_tensor_file", [&] { (void)read_tensor_file(fs::path(victim + std::string("\0.npy", 5))); });
  refused("read_qvgt", [&] { (void)read_qvgt(nul); });
  refused("DenseCausalCache::load", [&] { (void)DenseCausalCache::load(nul); });
  refused("PackedCausalCache::load", [&] { (void)PackedCausalCache::load(nul); });
  refused("inspect_snapshot", [&] { (void)inspect_snapshot(nul); });
  // Nothing was written: the victim is as it was, and nothing else appeared.
  EXPECT_EQ(testing::file_bytes(dir / "victim"), (std::vector<uint8_t>{7, 7, 7}));
  EXPECT_EQ(dir.entries(), 1u);
  // The message shows the NUL (a message must not end at it).
  try {
    dense.save(nul);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("victim\\x00.snap"), std::string::npos) << e.what();
  }
}

// ---- permissions of a replaced file -----------------------------------------------------

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST(ReplacedFileMode, AReplacedFileKeepsItsModeANewOneFollowsTheUmask) {
  TempDir dir("qvg_writer_reader");
  DenseCausalCache cache(options(8, 1, 8));
  for (const mode_t m : {mode_t(0600), mode_t(0640), mode_t(0444), mode_t(0755)}) {
    const fs::path p = dir / ("m" + std::to_string(m) + ".snap");
    put_file(p, {1});
    ASSERT_EQ(::chmod(p.c_str(), m), 0);
    cache.save(p);
    EXPECT_EQ(mode_of(p), m) << std::oct << m;
    write_file_atomic(p, std::vector<uint8_t>{1, 2, 3});
    EXPECT_EQ(mode_of(p), m) << std::oct << m;
  }
  // Set-user-ID and the like are not carried over.
  const fs::path s = dir / "suid.snap";
  put_file(s, {1});
  ASSERT_EQ(::chmod(s.c_str(), 04755), 0);
  cache.save(s);
  EXPECT_EQ(mode_of(s), mode_t(0755));
  // A new file: 0666 less the umask.
  for (const mode_t mask : {mode_t(022), mode_t(077), mode_t(002)}) {
    const mode_t before = ::umask(mask);
    const fs::path p = dir / ("new" + std::to_string(mask) + ".snap");
    cache.save(p);
    ::umask(before);
    EXPECT_EQ(mode_of(p), mode_t(0666 & ~mask)) << std::oct << mask;
  }
}

// ---- a long file name -------------------------------------------------------------------

TEST(LongDestinationName, ADestinationNameOf255BytesIsWritten) {
  TempDir dir("qvg_writer_reader");
  const DenseCausalCache cache(options(8, 1, 8));
  for (const size_t n : {size_t(200), size_t(245), size_t(255)}) {
    const fs::path p = dir / (std::string(n - 5, 'a') + ".snap");
    ASSERT_EQ(p.filename().string().size(), n);
    ASSERT_NO_THROW(cache.save(p)) << n;
    EXPECT_NO_THROW((void)DenseCausalCache::load(p)) << n;
    Tensor t(DType::F32, {1, 2, 1, 8});
    const fs::path npy = dir / (std::string(n - 4, 'b') + ".npy");
    ASSERT_NO_THROW(write_tensor_file(npy, t.view())) << n;
    // The temporaries are gone (the cut name is not left behind).
    for (const auto& e : fs::directory_iterator(dir.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  // 256 bytes is no name at all: the system's error, nothing created.
  const fs::path too_long = dir / std::string(256, 'c');
  EXPECT_THROW(cache.save(too_long), InvalidArgument);
  std::error_code ec;
  EXPECT_FALSE(fs::exists(too_long, ec));
  EXPECT_EQ(dir.entries(), 6u);  // the three .snap and three .npy files
}

// ---- the refused value is printed as exceeding the limit --------------------------------

TEST(RefusedValueText, ARefusedValueVisiblyExceedsTheLimit) {
  const float over = 1e16f;  // 10000000272564224 > 1e16
  ASSERT_GT(double(over), kMaxAbsInput);
  for (const DType dt : {DType::F32}) {
    Tensor x(dt, {1, 2, 1, 8});
    x.set(0, 1, 0, 3, -over);
    try {
      check_finite_and_bounded(x.view(), "key");
      FAIL() << "accepted " << over;
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("got -10000000272564224 at [0, 1, 0, 3]"), std::string::npos) << m;
      EXPECT_EQ(m.find("1e+16,"), std::string::npos) << m;
    }
  }
  // The helper's rule: the shortest form unless it reads as allowed.
  EXPECT_EQ(detail::limit_value_text(over), "10000000272564224");
  EXPECT_EQ(detail::limit_value_text(2e16f), "2e+16");
  EXPECT_EQ(detail::limit_value_text(std::numeric_limits<float>::quiet_NaN()), "nan");
  EXPECT_EQ(detail::limit_value_text(-std::numeric_limits<float>::infinity()), "-inf");
  EXPECT_EQ(detail::limit_value_text(1.5f), "1.5");
  // Through a cache's update and the codec alike.
  DenseCausalCache cache(options(8, 1, 8, DType::F32));
  Tensor k(DType::F32, {1, 2, 1, 8});
  k.set(0, 0, 0, 0, over);
  try {
    cache.update(k.view(), k.view(), 0);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("got 10000000272564224"), std::string::npos) << e.what();
  }
  CodecConfig c;
  c.centroids = 2;
  c.block_size = 8;
  try {
    (void)encode(k.view(), c);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("got 10000000272564224"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qvg
