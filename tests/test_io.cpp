// Tests of include/qvg/io.h: .npy, safetensors, .qvgt and the CLI tensor files.
//
// Round trips for every supported dtype and codec configuration, a byte-exact
// golden .qvgt, and every malformed input we can think of: each must raise the
// documented qvg error (CorruptData / InvalidArgument) and never crash or read out
// of bounds (run under ASan/UBSan). Parsers are fed exact-size heap copies so that
// ASan sees any read past the end.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/io.h"
#include "qvg/numeric.h"
#include "support/data.h"
#include "support/files.h"

namespace qvg {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using testing::file_bytes;
using testing::put_file;
using testing::random_tensor;
using testing::same_bytes;
using testing::TempDir;

Bytes bytes_of(std::string_view s) {
  return Bytes(s.begin(), s.end());
}
Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
std::string header_text(const Bytes& st) {  // the JSON header of a safetensors file
  uint64_t n;
  std::memcpy(&n, st.data(), 8);
  return std::string(st.begin() + 8, st.begin() + 8 + static_cast<std::ptrdiff_t>(n));
}
Bytes f32_bytes(std::initializer_list<float> v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), std::data(v), b.size());
  return b;
}

// Calls f(bytes) on an exact-size heap copy: its result, or nullopt after one of the
// allowed error types (any other error fails the test).
template <class Parse>
auto parse_outcome(const Bytes& bytes, Parse parse, bool invalid_argument_allowed)
    -> std::optional<decltype(parse(std::span<const uint8_t>()))> {
  const Bytes copy(bytes);  // exact size: ASan flags any read past the end
  try {
    return parse(std::span<const uint8_t>(copy.data(), copy.size()));
  } catch (const CorruptData&) {
  } catch (const InvalidArgument&) {
    if (!invalid_argument_allowed) ADD_FAILURE() << "InvalidArgument where only CorruptData is allowed";
  }
  return std::nullopt;
}

// ====================================================================================
// .npy
// ====================================================================================

// A .npy file with the given header dict text (padded by us) and data.
Bytes npy_with_header(std::string dict, const Bytes& data, int major = 1) {
  const size_t len_size = major == 1 ? 2 : 4;
  const size_t total = 8 + len_size + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  for (size_t i = 0; i < len_size; ++i) out.push_back(static_cast<uint8_t>(dict.size() >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  return concat(out, data);
}

TEST(Npy, RoundTripF32AndF16AllRanks) {
  for (DType dt : {DType::F32, DType::F16}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{}, {5}, {0}, {2, 3}, {3, 2, 4}, {1, 3, 2, 4}, {2, 0, 1, 4}}) {
      NpyArray a;
      a.dtype = dt;
      a.shape = shape;
      int64_t n = 1;
      for (auto d : shape) n *= d;
      a.data.resize(static_cast<size_t>(n) * dtype_size(dt));
      for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<uint8_t>(i * 37 + 11);
      const Bytes b = serialize_npy(a);
      // NumPy's layout: header block a multiple of 64 bytes, ending in '\n'.
      const size_t hl = static_cast<size_t>(b[8] | (b[9] << 8));
      EXPECT_EQ((10 + hl) % 64, 0u);
      EXPECT_EQ(b[10 + hl - 1], '\n');
      const NpyArray back = parse_npy(b);
      EXPECT_EQ(back.dtype, dt);
      EXPECT_EQ(back.shape, shape);
      EXPECT_EQ(back.data, a.data);
    }
  }
}

TEST(Npy, WritesNumpysExactHeader) {
  NpyArray a;
  a.shape = {2, 3};
  a.data.resize(24);
  const Bytes b = serialize_npy(a);
  std::string expect = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expect.append(128 - 10 - expect.size() - 1, ' ');  // 61 characters: a 128-byte block
  expect.push_back('\n');
  EXPECT_EQ(std::string(b.begin() + 10, b.begin() + 128), expect);
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 10), (Bytes{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0}));
  EXPECT_EQ(b.size(), 128u + 24u);
  a.shape = {6};
  const Bytes b1 = serialize_npy(a);
  EXPECT_NE(std::string(b1.begin(), b1.end()).find("'shape': (6,)"), std::string::npos);
}

TEST(Npy, ReadsVersion2And3AndHeaderVariants) {
  const Bytes data = f32_bytes({1, 2, 3, 4, 5, 6});
  for (int major : {1, 2, 3}) {
    const NpyArray a =
        parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, major));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.data, data);
  }
  // Double quotes, other key order, no trailing comma, odd whitespace.
  const NpyArray b = parse_npy(npy_with_header("{ \"shape\" :(2,3),\"fortran_order\":False , 'descr':'<f4'}", data));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  const NpyArray c =
      parse_npy(npy_with_header("{'descr': '<f2', 'fortran_order': False, 'shape': (3, ), }", Bytes(6, 0)));
  EXPECT_EQ(c.dtype, DType::F16);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{3}));
}

TEST(Npy, RejectsUnsupportedContentWithInvalidArgument) {
  const Bytes d8(8, 0);
  EXPECT_THROW(parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", d8)),
               InvalidArgument);
  for (const char* descr : {"<f8", ">f4", "|u1", "<i4", "<c8", "=f4", "<f4 "})
    EXPECT_THROW(parse_npy(npy_with_header(
                     std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }", d8)),
                 InvalidArgument)
        << descr;
  EXPECT_THROW(parse_npy(npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", d8)),
               InvalidArgument);
  try {
    parse_npy(npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", d8));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'<f8'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("<f4"), std::string::npos) << e.what();
  }
}

TEST(Npy, RejectsMalformedHeadersWithCorruptData) {
  const Bytes d = f32_bytes({1, 2});
  const char* bad[] = {
      "",
      "{}",
      "{'descr': '<f4', 'fortran_order': False}",                                   // no shape
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1, }",      // unknown key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",  // duplicate
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }",                   // int, not tuple
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }",
      "{'descr': '<f4', 'fortran_order': false, 'shape': (2,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x",
      "{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,,), }",
      "{'descr': '<f4' 'fortran_order': False, 'shape': (2,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",
  };
  for (const char* h : bad) EXPECT_THROW(parse_npy(npy_with_header(h, d)), CorruptData) << h;
  // Data size must match the shape exactly.
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  EXPECT_THROW(parse_npy(npy_with_header(ok, f32_bytes({1}))), CorruptData);
  EXPECT_THROW(parse_npy(npy_with_header(ok, f32_bytes({1, 2, 3}))), CorruptData);
  // Magic, version, header length.
  Bytes good = npy_with_header(ok, d);
  Bytes m = good;
  m[1] = 'X';
  EXPECT_THROW(parse_npy(m), CorruptData);
  m = good;
  m[6] = 4;
  EXPECT_THROW(parse_npy(m), CorruptData);
  m = good;
  m[8] = 0xff;
  m[9] = 0xff;
  EXPECT_THROW(parse_npy(m), CorruptData);
  m = good;
  m[20] = 0;  // NUL inside the header
  EXPECT_THROW(parse_npy(m), CorruptData);
}

// Every truncation is CorruptData; every byte flip of the header (magic, version,
// length, dict) is an error; a flip of a data byte reads back exactly: the same
// array with that byte flipped (each flip is checked, not only that nothing crashes).
TEST(Npy, EveryTruncationAndHeaderByteFlipIsAnErrorADataFlipReadsExactly) {
  NpyArray a;
  a.shape = {1, 2, 2, 3};
  a.data = Bytes(48, 0x3f);
  const Bytes good = serialize_npy(a);
  const size_t data_start = good.size() - a.data.size();
  for (size_t n = 0; n < good.size(); ++n) {
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_npy(cut), CorruptData) << "prefix " << n;
  }
  int header_flips = 0, data_flips = 0;
  for (size_t i = 0; i < good.size(); ++i)
    for (uint8_t x : {0x01, 0x08, 0x20, 0x80, 0xff}) {
      Bytes m = good;
      m[i] ^= x;
      const auto r = parse_outcome(
          m, [](auto s) { return parse_npy(s); }, /*invalid_argument_allowed=*/true);
      if (i < data_start) {
        EXPECT_FALSE(r.has_value()) << "header byte " << i << " ^ " << int(x) << " was accepted";
        ++header_flips;
      } else {
        ASSERT_TRUE(r.has_value()) << "data byte " << i << " ^ " << int(x) << " was refused";
        NpyArray want = a;
        want.data[i - data_start] ^= x;
        EXPECT_EQ(r->shape, want.shape);
        EXPECT_EQ(r->dtype, want.dtype);
        EXPECT_EQ(r->data, want.data) << "data byte " << i;
        ++data_flips;
      }
    }
  EXPECT_EQ(header_flips, int(data_start) * 5);
  EXPECT_EQ(data_flips, 48 * 5);
}

TEST(Npy, WriterRejectsBadInput) {
  NpyArray a;
  a.dtype = DType::BF16;
  a.shape = {1};
  a.data.resize(2);
  EXPECT_THROW(serialize_npy(a), InvalidArgument);
  a.dtype = DType::F32;
  EXPECT_THROW(serialize_npy(a), InvalidArgument);  // 2 bytes for one f32
  a.shape = {-1};
  EXPECT_THROW(serialize_npy(a), InvalidArgument);
}

// ====================================================================================
// safetensors
// ====================================================================================

// A safetensors file from a raw header string (unpadded) and data bytes.
Bytes st_raw(const std::string& header, const Bytes& data) {
  Bytes out(8);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  return concat(out, data);
}

SafetensorsFile sample_st() {
  SafetensorsFile f;
  f.metadata = {{"format", "pt"}, {"note", "h\xc3\xa9llo"}};
  f.tensors.push_back({"a.f32", StDType::F32, {2, 3}, Bytes(24, 1)});
  f.tensors.push_back({"b.f16", StDType::F16, {3}, Bytes(6, 2)});
  f.tensors.push_back({"c.bf16", StDType::BF16, {1, 1, 2}, Bytes(4, 3)});
  f.tensors.push_back({"d.u8", StDType::U8, {5}, Bytes{1, 2, 3, 4, 5}});
  f.tensors.push_back({"e.fp8", StDType::F8_E4M3, {2, 2}, Bytes{0x38, 0x40, 0xb8, 0}});
  f.tensors.push_back({"scalar", StDType::F32, {}, f32_bytes({7})});
  f.tensors.push_back({"empty", StDType::F16, {0, 4}, {}});
  return f;
}

TEST(Safetensors, RoundTripAllDtypesAndMetadata) {
  const SafetensorsFile f = sample_st();
  const Bytes b = serialize_safetensors(f);
  EXPECT_EQ(header_text(b).size() % 8, 0u);  // padded to 8 bytes
  const SafetensorsFile back = parse_safetensors(b);
  EXPECT_EQ(back, f);
  EXPECT_EQ(serialize_safetensors(back), b);
  ASSERT_NE(back.find("d.u8"), nullptr);
  EXPECT_EQ(back.find("nope"), nullptr);
  ASSERT_NE(back.find_metadata("format"), nullptr);
  EXPECT_EQ(*back.find_metadata("format"), "pt");
  for (StDType t : {StDType::F32, StDType::F16, StDType::BF16, StDType::U8, StDType::F8_E4M3})
    EXPECT_FALSE(st_dtype_name(t).empty());
}

TEST(Safetensors, KnownBytes) {
  SafetensorsFile f;
  f.metadata = {{"k", "v"}};
  f.tensors.push_back({"x", StDType::U8, {2}, Bytes{7, 9}});
  const Bytes b = serialize_safetensors(f);
  const std::string h = R"({"__metadata__":{"k":"v"},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  std::string padded = h;
  padded.append((8 - h.size() % 8) % 8, ' ');
  Bytes expect(8);
  expect[0] = static_cast<uint8_t>(padded.size());
  expect = concat(concat(expect, bytes_of(padded)), Bytes{7, 9});
  EXPECT_EQ(b, expect);
}

TEST(Safetensors, ReadsForeignLayouts) {
  // Keys in any order; offsets define the data order; no metadata; trailing spaces.
  const Bytes data = {1, 2, 3, 4, 5, 6};
  const auto f = parse_safetensors(st_raw(
      R"({"b":{"data_offsets":[2,6],"shape":[2],"dtype":"F16"},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )",
      data));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "a");
  EXPECT_EQ(f.tensors[1].name, "b");
  EXPECT_EQ(f.tensors[1].data, (Bytes{3, 4, 5, 6}));
  EXPECT_TRUE(f.metadata.empty());
  // An empty header object holds no tensors.
  EXPECT_TRUE(parse_safetensors(st_raw("{}", {})).tensors.empty());
}

TEST(Safetensors, RejectsMalformedHeaders) {
  const Bytes d4 = {1, 2, 3, 4};
  const std::string ok = R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  EXPECT_NO_THROW(parse_safetensors(st_raw(ok, d4)));
  const char* bad[] = {
      R"([1,2])",
      R"("x")",
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})",  // unterminated
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}} junk)",
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"x":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
      R"({"x":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
      R"({"__metadata__":{"a":"1","a":"2"},"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
      R"({"__metadata__":{"a":1},"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
      R"({"__metadata__":["a"],"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"extra":0}})",
      R"({"x":{"shape":[4],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":[4]}})",
      R"({"x":[1]})",
      R"({"x":{"dtype":"Q7","shape":[4],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":8,"shape":[4],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":4,"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,4]}})",   // size != shape
      R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,4]}})",  // size != shape x 4
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}})",   // reversed
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4,4]}})",
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[1,5]}})",  // gap + past end
      R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})",  // not covering
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"y":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
      R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})",
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551615,3]}})",
      R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})",  // overflow
      R"({"x":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,4]}})",
      "{\"x\xff\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",  // not UTF-8
  };
  for (const char* h : bad) EXPECT_THROW(parse_safetensors(st_raw(h, d4)), CorruptData) << h;
  // A valid dtype qvg does not handle.
  EXPECT_THROW(parse_safetensors(st_raw(R"({"x":{"dtype":"F64","shape":[0],"data_offsets":[0,0]}})", {})),
               InvalidArgument);
}

TEST(Safetensors, RejectsBadHeaderLengths) {
  const Bytes good = serialize_safetensors(sample_st());
  EXPECT_THROW(parse_safetensors(Bytes{}), CorruptData);
  EXPECT_THROW(parse_safetensors(Bytes{1, 0, 0}), CorruptData);
  for (uint64_t n : {uint64_t(0), uint64_t(1), uint64_t(good.size() - 7), uint64_t(good.size()), uint64_t(1) << 40,
                     ~uint64_t(0), ~uint64_t(0) - 7}) {
    Bytes m = good;
    std::memcpy(m.data(), &n, 8);
    EXPECT_THROW(parse_safetensors(m), CorruptData) << n;
  }
}

// Every truncation is CorruptData. A byte flip of the header is an error unless it
// only renames a tensor, changes a metadata string or another dimension of a tensor
// of zero elements (a valid file of other names: dtypes and data unchanged, and it
// writes back to exactly the flipped bytes); a flip of a data byte reads back as that
// byte of that tensor flipped (this found a NUL byte in the header's padding
// accepted: the JSON parser read a NUL as the end of its input).
TEST(Safetensors, EveryTruncationIsAnErrorAndEveryByteFlipAnErrorOrReadExactly) {
  const SafetensorsFile f = sample_st();
  const Bytes good = serialize_safetensors(f);
  uint64_t n_header = 0;
  std::memcpy(&n_header, good.data(), 8);
  const size_t data_start = 8 + size_t(n_header);
  for (size_t n = 0; n < good.size(); ++n) {
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_safetensors(cut), CorruptData) << "prefix " << n;
  }
  int refused = 0, renamed = 0, data_flips = 0;
  for (size_t i = 0; i < good.size(); ++i)
    for (uint8_t x : {0x01, 0x02, 0x10, 0x20, 0x80, 0xff}) {
      Bytes m = good;
      m[i] ^= x;
      const auto r = parse_outcome(
          m, [](auto s) { return parse_safetensors(s); }, true);
      if (!r) {
        ++refused;
        continue;
      }
      ASSERT_EQ(r->tensors.size(), f.tensors.size()) << "byte " << i << " ^ " << int(x);
      ASSERT_EQ(r->metadata.size(), f.metadata.size()) << "byte " << i << " ^ " << int(x);
      if (i < data_start) {
        // A name or a metadata string changed: everything else is as it was, and the
        // file is exactly what the writer writes for what was read.
        EXPECT_EQ(serialize_safetensors(*r), m) << "header byte " << i << " ^ " << int(x);
        int changed = 0;
        for (const SafeTensor& t : r->tensors) {
          const SafeTensor* o = f.find(t.name);
          if (!o) {
            ++changed;
            continue;
          }
          EXPECT_EQ(t.dtype, o->dtype) << t.name;
          EXPECT_EQ(t.data, o->data) << t.name;
          if (t.shape != o->shape) {
            EXPECT_TRUE(t.data.empty()) << t.name << ": a shape changed under data";
            ++changed;
          }
        }
        for (size_t k = 0; k < f.metadata.size(); ++k) changed += r->metadata[k] != f.metadata[k];
        EXPECT_EQ(changed, 1) << "header byte " << i << " ^ " << int(x)
                              << " changed other than one string or empty shape";
        ++renamed;
      } else {
        // Exactly one byte of one tensor's data differs, by x.
        int differing = 0;
        for (size_t k = 0; k < f.tensors.size(); ++k) {
          ASSERT_EQ(r->tensors[k].name, f.tensors[k].name);
          ASSERT_EQ(r->tensors[k].data.size(), f.tensors[k].data.size());
          for (size_t b = 0; b < f.tensors[k].data.size(); ++b)
            if (r->tensors[k].data[b] != f.tensors[k].data[b]) {
              EXPECT_EQ(r->tensors[k].data[b], uint8_t(f.tensors[k].data[b] ^ x));
              ++differing;
            }
        }
        EXPECT_EQ(differing, 1) << "data byte " << i << " ^ " << int(x);
        ++data_flips;
      }
    }
  EXPECT_EQ(data_flips, int(good.size() - data_start) * 6);  // every data flip read, none refused
  EXPECT_GT(refused, int(data_start) * 6 * 3 / 4);           // most header flips refused
  EXPECT_GT(renamed, 0);
}

// A NUL byte anywhere in the header is refused: JSON holds none raw, and
// the JSON parser read one as the end of its input, so a header whose padding held a
// NUL — or a NUL followed by anything — was accepted with the rest unread.
TEST(Safetensors, ANulByteInTheHeaderIsRefused) {
  const std::string h = R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_NO_THROW(parse_safetensors(st_raw(h + "  ", Bytes{7})));
  for (const std::string& tail : {std::string("\0 ", 2), std::string(" \0", 2), std::string("\0garbage", 8)}) {
    try {
      (void)parse_safetensors(st_raw(h + tail, Bytes{7}));
      ADD_FAILURE() << "accepted a NUL in the header";
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find("NUL byte"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_qvgt(st_raw(h + std::string("\0", 1), Bytes{7})), CorruptData);
}

TEST(Safetensors, WriterRejectsBadInput) {
  SafetensorsFile f;
  f.tensors.push_back({"x", StDType::U8, {2}, Bytes{1, 2}});
  f.tensors.push_back({"x", StDType::U8, {0}, {}});
  EXPECT_THROW(serialize_safetensors(f), InvalidArgument);
  f.tensors[1].name = "__metadata__";
  EXPECT_THROW(serialize_safetensors(f), InvalidArgument);
  f.tensors[1] = {"y", StDType::F32, {2}, Bytes(4)};
  EXPECT_THROW(serialize_safetensors(f), InvalidArgument);
  f.tensors[1] = {"y", StDType::F32, {-1}, {}};
  EXPECT_THROW(serialize_safetensors(f), InvalidArgument);
  f.tensors.resize(1);
  f.metadata = {{"a", "1"}, {"a", "2"}};
  EXPECT_THROW(serialize_safetensors(f), InvalidArgument);
  f.metadata = {{"a", "\xff"}};
  EXPECT_THROW(serialize_safetensors(f), InvalidArgument);
}

// Random files round trip exactly.
RC_GTEST_PROP(SafetensorsProp, RandomFilesRoundTrip, ()) {
  SafetensorsFile f;
  const auto ntensors = *rc::gen::inRange(0, 6);
  for (int i = 0; i < ntensors; ++i) {
    SafeTensor t;
    t.name = "t" + std::to_string(i) + *rc::gen::container<std::string>(rc::gen::inRange('a', 'z'));
    t.dtype = *rc::gen::element(StDType::F32, StDType::F16, StDType::BF16, StDType::U8, StDType::F8_E4M3);
    const auto rank = *rc::gen::inRange(0, 4);
    size_t n = 1;
    for (int r = 0; r < rank; ++r) {
      const auto d = *rc::gen::inRange(0, 5);
      t.shape.push_back(d);
      n *= static_cast<size_t>(d);
    }
    t.data = *rc::gen::container<Bytes>(n * st_dtype_size(t.dtype), rc::gen::arbitrary<uint8_t>());
    f.tensors.push_back(std::move(t));
  }
  const auto nmeta = *rc::gen::inRange(0, 4);
  for (int i = 0; i < nmeta; ++i)
    f.metadata.emplace_back("m" + std::to_string(i), *rc::gen::container<std::string>(rc::gen::inRange(' ', '~')));
  const Bytes b = serialize_safetensors(f);
  RC_ASSERT(parse_safetensors(b) == f);
}

// ====================================================================================
// .qvgt
// ====================================================================================

// A hand-built tiny encoding: f32 [1, 2, 1, 8], int4, block 8, K = 2, one stage,
// symmetric fp8 two_level.
EncodedTensor tiny_enc() {
  EncodedTensor e;
  e.dtype = DType::F32;
  e.shape = {1, 2, 1, 8};
  e.bits = 4;
  e.block_size = 8;
  e.stages = 1;
  e.centroids = 2;
  e.asymmetric = false;
  e.scale_dtype = ScaleDType::FP8_E4M3;
  e.scaling = Scaling::TwoLevel;
  std::vector<float> c(16);
  for (int i = 0; i < 16; ++i) c[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 3.0f;
  e.centroid = {Bytes(64)};
  std::memcpy(e.centroid[0].data(), c.data(), 64);
  e.ids = {Bytes{0, 1}};
  e.codes = {0x77, 0x77, 0x78, 0x96, 0x00, 0xee, 0x7e, 0x07};
  e.scales = {0x38, 0x40};
  e.scale_factor = {0.25f};
  return e;
}

const char* kTinyHeader = R"({"__metadata__":{"format":"qvg.prq/1","dtype":"f32","shape":"[1,2,1,8]","layout":"BSHD",)"
                          R"("bits":"4","block_size":"8","stages":"1","centroids":"2","asymmetric":"false",)"
                          R"("scale_dtype":"fp8_e4m3","scaling":"two_level"},)"
                          R"("centroids.0":{"dtype":"F32","shape":[1,1,2,8],"data_offsets":[0,64]},)"
                          R"("ids.0":{"dtype":"U8","shape":[1,1,2],"data_offsets":[64,66]},)"
                          R"("codes":{"dtype":"U8","shape":[1,1,2,4],"data_offsets":[66,74]},)"
                          R"("scales":{"dtype":"F8_E4M3","shape":[1,1,2,1],"data_offsets":[74,76]},)"
                          R"("scale_factor":{"dtype":"F32","shape":[1,1],"data_offsets":[76,80]}})";

TEST(Qvgt, TinyFileIsByteExact) {
  const EncodedTensor e = tiny_enc();
  ASSERT_NO_THROW(e.validate());
  const Bytes b = serialize_qvgt(e);
  std::string h = kTinyHeader;
  h.append((8 - h.size() % 8) % 8, ' ');
  Bytes expect(8);
  const uint64_t n = h.size();
  std::memcpy(expect.data(), &n, 8);
  expect = concat(expect, bytes_of(h));
  for (const auto& a : {e.centroid[0], e.ids[0], e.codes, e.scales}) expect = concat(expect, a);
  expect = concat(expect, f32_bytes({0.25f}));
  EXPECT_EQ(header_text(b), h);
  EXPECT_EQ(b, expect);
  EXPECT_EQ(parse_qvgt(b), e);
}

struct EncodeCase {
  const char* name;
  DType dtype;
  Shape4 shape;
  CodecConfig cfg;
};

std::vector<EncodeCase> encode_cases() {
  auto cfg = [](auto f) {
    CodecConfig c;
    c.bits = 4;
    c.centroids = 16;
    c.block_size = 32;
    c.threads = 1;
    f(c);
    return c;
  };
  const Shape4 s{2, 40, 3, 64};
  return {
      {"int4", DType::BF16, s, cfg([](CodecConfig&) {})},
      {"int2", DType::BF16, s, cfg([](CodecConfig& c) { c.bits = 2; })},
      {"asymmetric", DType::BF16, s, cfg([](CodecConfig& c) { c.asymmetric = true; })},
      {"bf16_scales", DType::F32, s, cfg([](CodecConfig& c) { c.scale_dtype = ScaleDType::BF16; })},
      {"bf16_scales_asym", DType::F16, s,
       cfg([](CodecConfig& c) { c.scale_dtype = ScaleDType::BF16, c.asymmetric = true; })},
      {"compat", DType::BF16, s, cfg([](CodecConfig& c) { c.scaling = Scaling::Compat; })},
      {"compat_asym_int2", DType::F32, s,
       cfg([](CodecConfig& c) { c.scaling = Scaling::Compat, c.asymmetric = true, c.bits = 2; })},
      {"stages2", DType::BF16, s, cfg([](CodecConfig& c) { c.stages = 2; })},
      {"stages3_asym_kmeanspp", DType::F16, s,
       cfg([](CodecConfig& c) { c.stages = 3, c.asymmetric = true, c.init = Init::KMeansPlusPlus; })},
      {"f32_block64_k128", DType::F32, s, cfg([](CodecConfig& c) { c.block_size = 64, c.centroids = 128; })},
      {"tokens_lt_k", DType::BF16, {1, 5, 2, 32}, cfg([](CodecConfig& c) { c.block_size = 8; })},
  };
}

TEST(Qvgt, EncodedTensorsRoundTripBitExact) {
  TempDir dir;
  for (const auto& c : encode_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor(c.shape, c.dtype, 7, 2.0f);
    const EncodedTensor enc = encode(x, c.cfg);
    const Bytes b = serialize_qvgt(enc);
    const EncodedTensor back = parse_qvgt(b);
    EXPECT_EQ(back, enc);
    EXPECT_EQ(serialize_qvgt(back), b);
    EXPECT_EQ(enc.nbytes() + 8 + header_text(b).size(), b.size());  // arrays are all the data
    EXPECT_TRUE(same_bytes(decode(back, 1), decode(enc, 1)));
    // Metadata as spec 1.6 writes it.
    const SafetensorsFile st = parse_safetensors(b);
    EXPECT_EQ(*st.find_metadata("shape"), "[" + std::to_string(c.shape.b) + "," + std::to_string(c.shape.s) + "," +
                                              std::to_string(c.shape.h) + "," + std::to_string(c.shape.d) + "]");
    EXPECT_EQ(*st.find_metadata("dtype"), dtype_name(c.dtype));
    EXPECT_EQ(*st.find_metadata("asymmetric"), c.cfg.asymmetric ? "true" : "false");
    EXPECT_EQ(*st.find_metadata("stages"), std::to_string(c.cfg.stages));
    EXPECT_EQ(st.metadata.size(), 11u);
    // Through a file.
    const fs::path p = dir / (std::string(c.name) + ".qvgt");
    write_qvgt(p, enc);
    EXPECT_EQ(file_bytes(p), b);
    EXPECT_EQ(read_qvgt(p), enc);
  }
  EXPECT_EQ(dir.entries(), encode_cases().size());  // no temporaries left behind
}

// Parses, mutates with f and re-serialises a safetensors image of a .qvgt.
template <class F>
Bytes mutated(const Bytes& qvgt, F f) {
  SafetensorsFile st = parse_safetensors(qvgt);
  f(st);
  return serialize_safetensors(st);
}
void set_meta(SafetensorsFile& st, const std::string& k, const std::string& v) {
  for (auto& [mk, mv] : st.metadata)
    if (mk == k) {
      mv = v;
      return;
    }
  st.metadata.emplace_back(k, v);
}
SafeTensor& tensor(SafetensorsFile& st, const std::string& name) {
  for (auto& t : st.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("test: no tensor " + name);
}

// Bases for the mutation tests: the tiny file and encodings covering zeros,
// zero_factor, bf16 scales, compat and several stages.
std::vector<Bytes> qvgt_bases() {
  std::vector<Bytes> r = {serialize_qvgt(tiny_enc())};
  CodecConfig c;
  c.centroids = 4;
  c.block_size = 8;
  c.threads = 1;
  c.asymmetric = true;
  c.stages = 2;
  r.push_back(serialize_qvgt(encode(random_tensor({1, 6, 2, 16}, DType::BF16, 3, 2.0f), c)));
  c.scale_dtype = ScaleDType::BF16;
  c.stages = 1;
  r.push_back(serialize_qvgt(encode(random_tensor({2, 5, 1, 16}, DType::F16, 4, 2.0f), c)));
  c.scaling = Scaling::Compat;
  c.bits = 2;
  r.push_back(serialize_qvgt(encode(random_tensor({1, 9, 1, 16}, DType::F32, 5, 2.0f), c)));
  return r;
}

// Reordered arrays and metadata are the same file; a `shape` spelled otherwise than
// the writer spells it is not (qvg/io.h promises canonical values).
TEST(Qvgt, ReorderedArraysAreAcceptedNonCanonicalShapeIsNot) {
  for (const Bytes& base : qvgt_bases()) {
    const EncodedTensor e = parse_qvgt(base);
    EXPECT_EQ(parse_qvgt(mutated(base,
                                 [](SafetensorsFile& st) {
                                   std::reverse(st.tensors.begin(), st.tensors.end());
                                   std::reverse(st.metadata.begin(), st.metadata.end());
                                 })),
              e);
    const std::string spaced = "[ " + std::to_string(e.shape.b) + ", " + std::to_string(e.shape.s) + " , " +
                               std::to_string(e.shape.h) + ",\t" + std::to_string(e.shape.d) + " ]";
    EXPECT_THROW(parse_qvgt(mutated(base, [&](SafetensorsFile& st) { set_meta(st, "shape", spaced); })),
                 CorruptData);
    const std::string canonical = fmt::format("[{},{},{},{}]", e.shape.b, e.shape.s, e.shape.h, e.shape.d);
    EXPECT_EQ(parse_qvgt(mutated(base, [&](SafetensorsFile& st) { set_meta(st, "shape", canonical); })), e);
    for (const std::string& v : {fmt::format("[{}, {}, {}, {}]", e.shape.b, e.shape.s, e.shape.h, e.shape.d),
                                 " " + canonical, canonical + " ", "[0" + canonical.substr(1),
                                 fmt::format("[{},{},{},{}.0]", e.shape.b, e.shape.s, e.shape.h, e.shape.d),
                                 fmt::format("[{},{},{},+{}]", e.shape.b, e.shape.s, e.shape.h, e.shape.d)}) {
      try {
        parse_qvgt(mutated(base, [&](SafetensorsFile& st) { set_meta(st, "shape", v); }));
        ADD_FAILURE() << "accepted shape '" << v << "'";
      } catch (const CorruptData& err) {
        EXPECT_NE(std::string(err.what()).find("'[B,S,H,D]' (no spaces)"), std::string::npos) << err.what();
      }
    }
  }
}

TEST(Qvgt, RejectsMissingUnknownAndBadMetadata) {
  const Bytes base = serialize_qvgt(tiny_enc());
  const SafetensorsFile st0 = parse_safetensors(base);
  for (size_t i = 0; i < st0.metadata.size(); ++i) {
    SCOPED_TRACE(st0.metadata[i].first);
    EXPECT_THROW(parse_qvgt(mutated(base,
                                    [&](SafetensorsFile& st) {
                                      st.metadata.erase(st.metadata.begin() + static_cast<std::ptrdiff_t>(i));
                                    })),
                 CorruptData);
  }
  EXPECT_THROW(parse_qvgt(mutated(base, [](SafetensorsFile& st) { st.metadata.clear(); })), CorruptData);
  EXPECT_THROW(parse_qvgt(mutated(base, [](SafetensorsFile& st) { set_meta(st, "comment", "hi"); })), CorruptData);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"format", "qvg.prq/2"},
      {"format", ""},
      {"dtype", "bfloat16"},
      {"dtype", "F32"},
      {"dtype", "f64"},
      {"shape", "[1,2,1]"},
      {"shape", "[1,2,1,8,1]"},
      {"shape", "[1,2,1,0]"},
      {"shape", "1,2,1,8"},
      {"shape", "[1,2,1,8.0]"},
      {"shape", "[-1,2,1,8]"},
      {"shape", "[1,2,1,\"8\"]"},
      {"shape", "[1,3,1,8]"},
      {"shape", "[1,2,2,8]"},
      {"shape", "[1,2,1,16]"},
      {"shape", "[1,2,1,99999999999999999999]"},
      {"layout", "BHSD"},
      {"layout", "bshd"},
      {"bits", "3"},
      {"bits", "04"},
      {"bits", "2"},
      {"bits", ""},
      {"block_size", "0"},
      {"block_size", "-8"},
      {"block_size", "3"},
      {"block_size", "16"},
      {"block_size", "4"},
      {"block_size", "08"},
      {"block_size", " 8"},
      {"block_size", "8.0"},
      {"block_size", "99999999999"},
      // 20 digits: no signed overflow (UBSan; docs/reliability.md, finding 7)
      {"block_size", "12345678901234567890"},
      {"centroids", "99999999999999999999999999999999"},
      {"stages", "0"},
      {"stages", "2"},
      {"stages", "99999999999"},
      {"stages", "1e3"},
      {"stages", "65"},
      {"centroids", "0"},
      {"centroids", "257"},
      {"centroids", "3"},
      {"centroids", "1"},
      {"centroids", "+2"},
      {"asymmetric", "True"},
      {"asymmetric", "1"},
      {"asymmetric", "true"},
      {"scale_dtype", "fp8"},
      {"scale_dtype", "bf16"},
      {"scale_dtype", "f16"},
      {"scaling", "compat"},
      {"scaling", "twolevel"},
  };
  for (const auto& [k, v] : bad) {
    SCOPED_TRACE(k + "=" + v);
    EXPECT_THROW(parse_qvgt(mutated(base, [&](SafetensorsFile& st) { set_meta(st, k, v); })), CorruptData);
  }
}

// A width stored in a later form carries its row's version (qvg/code_format.h, spec
// 1.6): an int3 file is `qvg.prq/2` and reads back exactly; the same bytes labelled
// /1, an int4 file labelled /2 and a version no reader knows are refused, by name.
TEST(Qvgt, Int3FilesCarryTheirFormatVersion) {
  EncodedTensor e = tiny_enc();
  e.bits = 3;
  e.shape = {1, 2, 1, 8};
  e.codes = {0x05, 0x39, 0x73, 0x6D, 0xB6, 0xDB};  // codes 0 1 2 3 4 5 6 3, then eight 3s (spec 1.5)
  ASSERT_NO_THROW(e.validate());
  const Bytes b = serialize_qvgt(e);
  EXPECT_NE(header_text(b).find(R"("format":"qvg.prq/2")"), std::string::npos) << header_text(b);
  EXPECT_NE(header_text(b).find(R"("codes":{"dtype":"U8","shape":[1,1,2,3])"), std::string::npos);
  EXPECT_EQ(parse_qvgt(b), e);
  EXPECT_EQ(qvgt_format(e), "qvg.prq/2");
  EXPECT_EQ(qvgt_format(tiny_enc()), "qvg.prq/1");
  auto refused = [](const Bytes& file, const std::string& want) {
    try {
      parse_qvgt(file);
      ADD_FAILURE() << "accepted; wanted " << want;
    } catch (const CorruptData& err) {
      EXPECT_NE(std::string(err.what()).find(want), std::string::npos) << err.what();
    }
  };
  refused(mutated(b, [](SafetensorsFile& st) { set_meta(st, "format", "qvg.prq/1"); }),
          "metadata 'format' is 'qvg.prq/1' but bits=3 is stored as 'qvg.prq/2'");
  refused(mutated(serialize_qvgt(tiny_enc()), [](SafetensorsFile& st) { set_meta(st, "format", "qvg.prq/2"); }),
          "bits=4 is stored as 'qvg.prq/1'");
  refused(mutated(b, [](SafetensorsFile& st) { set_meta(st, "format", "qvg.prq/3"); }),
          "must be one of 'qvg.prq/1', 'qvg.prq/2' (the versions this reader knows), got 'qvg.prq/3'");
  refused(mutated(b, [](SafetensorsFile& st) { set_meta(st, "bits", "5"); }),
          "metadata 'bits' must be one of 2, 3 or 4");
  EncodedTensor odd = e;  // an int3 block must fill whole 3-byte groups: 8 channels
  odd.block_size = 4;
  EXPECT_THROW(odd.validate(), CorruptData);
}

TEST(Qvgt, RejectsMissingUnknownAndMisshapedArrays) {
  for (const Bytes& base : qvgt_bases()) {
    const SafetensorsFile st0 = parse_safetensors(base);
    for (size_t i = 0; i < st0.tensors.size(); ++i) {
      const std::string name = st0.tensors[i].name;
      SCOPED_TRACE(name);
      // Missing.
      EXPECT_THROW(parse_qvgt(mutated(base,
                                      [&](SafetensorsFile& st) {
                                        st.tensors.erase(st.tensors.begin() + static_cast<std::ptrdiff_t>(i));
                                      })),
                   CorruptData);
      // Every other dtype (data resized to stay a valid safetensors file).
      for (StDType dt : {StDType::F32, StDType::F16, StDType::BF16, StDType::U8, StDType::F8_E4M3}) {
        if (dt == st0.tensors[i].dtype) continue;
        EXPECT_THROW(parse_qvgt(mutated(base,
                                        [&](SafetensorsFile& st) {
                                          auto& t = tensor(st, name);
                                          t.data.resize(t.data.size() / st_dtype_size(t.dtype) * st_dtype_size(dt));
                                          t.dtype = dt;
                                        })),
                     CorruptData)
            << st_dtype_name(dt);
      }
      // Same bytes, other shapes: flattened, an extra unit dim, two dims swapped.
      EXPECT_THROW(parse_qvgt(mutated(base,
                                      [&](SafetensorsFile& st) {
                                        auto& t = tensor(st, name);
                                        int64_t n = 1;
                                        for (auto d : t.shape) n *= d;
                                        t.shape = {n};
                                      })),
                   CorruptData);
      EXPECT_THROW(
          parse_qvgt(mutated(
              base, [&](SafetensorsFile& st) { tensor(st, name).shape.insert(tensor(st, name).shape.begin(), 1); })),
          CorruptData);
      EXPECT_THROW(parse_qvgt(mutated(base,
                                      [&](SafetensorsFile& st) {
                                        auto& s = tensor(st, name).shape;
                                        s.push_back(1);
                                        std::reverse(s.begin(), s.end());
                                      })),
                   CorruptData);
    }
    // Unknown arrays.
    for (const char* extra : {"extra", "centroids.9", "ids.9", "zeros", "zero_factor", "scale_factor"}) {
      if (st0.find(extra)) continue;
      EXPECT_THROW(parse_qvgt(mutated(base,
                                      [&](SafetensorsFile& st) {
                                        st.tensors.push_back({extra, StDType::U8, {1}, Bytes{0}});
                                      })),
                   CorruptData)
          << extra;
    }
  }
}

TEST(Qvgt, RejectsBadValues) {
  const Bytes base = serialize_qvgt(tiny_enc());
  auto with = [&](auto f) { return mutated(base, f); };
  const float nan = std::nanf("");
  const float inf = INFINITY;
  // Ids must be < min(K, S) = 2.
  EXPECT_THROW(parse_qvgt(with([](SafetensorsFile& st) { tensor(st, "ids.0").data[1] = 2; })), CorruptData);
  EXPECT_THROW(parse_qvgt(with([](SafetensorsFile& st) { tensor(st, "ids.0").data[0] = 255; })), CorruptData);
  // Non-finite centroids.
  for (float v : {nan, inf, -inf})
    EXPECT_THROW(
        parse_qvgt(with([&](SafetensorsFile& st) { std::memcpy(tensor(st, "centroids.0").data.data() + 20, &v, 4); })),
        CorruptData);
  // Scales: NaN (0x7f / 0xff) and negative.
  for (uint8_t v : {0x7f, 0xff, 0xb8})
    EXPECT_THROW(parse_qvgt(with([&](SafetensorsFile& st) { tensor(st, "scales").data[1] = v; })), CorruptData);
  EXPECT_NO_THROW(parse_qvgt(with([](SafetensorsFile& st) { tensor(st, "scales").data[1] = 0; })));
  // Factors.
  for (float v : {0.0f, -1.0f, nan, inf})
    EXPECT_THROW(
        parse_qvgt(with([&](SafetensorsFile& st) { std::memcpy(tensor(st, "scale_factor").data.data(), &v, 4); })),
        CorruptData);
  // Symmetric int4 codes are 0..14.
  EXPECT_THROW(parse_qvgt(with([](SafetensorsFile& st) { tensor(st, "codes").data[3] = 0x7f; })), CorruptData);
  EXPECT_THROW(parse_qvgt(with([](SafetensorsFile& st) { tensor(st, "codes").data[3] = 0xf0; })), CorruptData);
  EXPECT_NO_THROW(parse_qvgt(with([](SafetensorsFile& st) { tensor(st, "codes").data[3] = 0xee; })));

  // With bf16 scales the factors are 1; bf16 scales must be finite and >= 0.
  for (const Bytes& b : qvgt_bases()) {
    const EncodedTensor e = parse_qvgt(b);
    if (e.scale_dtype != ScaleDType::BF16) continue;
    if (e.scaling == Scaling::TwoLevel) {
      EXPECT_THROW(parse_qvgt(mutated(b,
                                      [](SafetensorsFile& st) {
                                        const float two = 2.0f;
                                        std::memcpy(tensor(st, "scale_factor").data.data(), &two, 4);
                                      })),
                   CorruptData);
    }
    for (uint16_t v : {uint16_t(0x7fc0), uint16_t(0x7f80), uint16_t(0xbf80)})
      EXPECT_THROW(parse_qvgt(mutated(
                       b, [&](SafetensorsFile& st) { std::memcpy(tensor(st, "scales").data.data() + 2, &v, 2); })),
                   CorruptData);
    EXPECT_THROW(parse_qvgt(mutated(b,
                                    [&](SafetensorsFile& st) {
                                      const uint16_t v = 0x7fc0;
                                      std::memcpy(tensor(st, "zeros").data.data(), &v, 2);
                                    })),
                 CorruptData);
  }
}

TEST(Qvgt, UnsupportedSafetensorsDtypeIsCorruptData) {
  const std::string h = kTinyHeader;
  std::string m = h;
  m.replace(m.find(R"("dtype":"U8")"), 12, R"("dtype":"I8")");
  Bytes b = serialize_qvgt(tiny_enc());
  const Bytes data(b.begin() + 8 + static_cast<std::ptrdiff_t>(header_text(b).size()), b.end());
  EXPECT_THROW(parse_qvgt(st_raw(m, data)), CorruptData);
  EXPECT_NO_THROW(parse_qvgt(st_raw(h, data)));
}

// Every truncation and every flip of a header byte is CorruptData (the header holds
// only canonical spellings); a flip of a data byte is CorruptData or reads back as
// an encoding holding exactly the flipped bytes — it writes back to them byte for
// byte — that validates and decodes finite.
TEST(Qvgt, EveryTruncationAndHeaderFlipIsCorruptDataADataFlipIsRefusedOrReadExactly) {
  const std::vector<Bytes> bases = qvgt_bases();
  int header_flips = 0, data_refused = 0, data_read = 0;
  for (size_t b = 0; b < bases.size(); ++b) {
    const Bytes& good = bases[b];
    const size_t header_end = 8 + header_text(good).size();
    // The tiny file (b == 0) completely; in the larger ones every header byte, the
    // last 16 bytes and a sample of the data (keeps the ASan run short).
    auto sampled = [&](size_t i) { return b == 0 || i < header_end || i + 16 >= good.size() || i % 7 == 0; };
    for (size_t n = 0; n < good.size(); ++n) {
      if (!sampled(n)) continue;
      const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_THROW(parse_qvgt(cut), CorruptData) << "prefix " << n;
    }
    for (size_t i = 0; i < good.size(); ++i) {
      if (!sampled(i)) continue;
      for (uint8_t x : {0x01, 0x04, 0x20, 0x80, 0xff}) {
        if (b != 0 && x != 0x01 && x != 0x80) continue;
        Bytes m = good;
        m[i] ^= x;
        const auto r = parse_outcome(
            m, [](auto s) { return parse_qvgt(s); }, /*invalid_argument_allowed=*/false);
        if (i < header_end) {
          EXPECT_FALSE(r.has_value()) << "base " << b << ": header byte " << i << " ^ " << int(x) << " was accepted";
          ++header_flips;
        } else if (!r) {
          ++data_refused;
        } else {
          EXPECT_EQ(serialize_qvgt(*r), m) << "base " << b << ": data byte " << i << " ^ " << int(x);
          EXPECT_NO_THROW(r->validate_values());
          ++data_read;
        }
      }
    }
  }
  EXPECT_GT(header_flips, 1000);
  EXPECT_GT(data_read, 100);    // most data bytes may hold any value (codes, ids below K, scales)
  EXPECT_GT(data_refused, 10);  // and some may not (an id >= K, a symmetric code above 2 qmax, NaN)
}

TEST(Qvgt, RejectsHeaderLengthPastTheEnd) {
  const Bytes good = serialize_qvgt(tiny_enc());
  for (uint64_t n : {uint64_t(good.size() - 7), uint64_t(good.size()), ~uint64_t(0), uint64_t(1) << 63}) {
    Bytes m = good;
    std::memcpy(m.data(), &n, 8);
    try {
      parse_qvgt(m);
      FAIL() << n;
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find("past the end"), std::string::npos) << e.what();
    }
  }
}

RC_GTEST_PROP(QvgtProp, RandomByteEditsNeverCrash, ()) {
  static const std::vector<Bytes> bases = qvgt_bases();
  Bytes m = *rc::gen::elementOf(bases);
  const auto edits = *rc::gen::inRange(1, 8);
  for (int i = 0; i < edits; ++i) {
    const auto pos = *rc::gen::inRange<size_t>(0, m.size());
    m[pos] = *rc::gen::arbitrary<uint8_t>();
  }
  if (*rc::gen::arbitrary<bool>()) m.resize(*rc::gen::inRange<size_t>(0, m.size() + 1));
  const Bytes copy(m);
  try {
    (void)parse_qvgt(copy);
  } catch (const CorruptData&) {
  }
}

TEST(Qvgt, WriteIsAtomicAndValidates) {
  TempDir dir;
  const fs::path p = dir / "t.qvgt";
  write_qvgt(p, tiny_enc());
  const Bytes before = file_bytes(p);
  EncodedTensor broken = tiny_enc();
  broken.codes.pop_back();
  EXPECT_THROW(write_qvgt(p, broken), InvalidArgument);
  EXPECT_THROW(serialize_qvgt(broken), InvalidArgument);
  EXPECT_THROW(write_qvgt(dir / "new.qvgt", broken), InvalidArgument);
  EXPECT_EQ(file_bytes(p), before);
  EXPECT_EQ(dir.entries(), 1u);  // no temporaries, no new.qvgt
  EXPECT_THROW(write_qvgt(dir / "no_such_dir" / "t.qvgt", tiny_enc()), InvalidArgument);
  EXPECT_THROW(read_qvgt(dir / "missing.qvgt"), InvalidArgument);
  EXPECT_THROW(read_qvgt(dir.path()), InvalidArgument);  // a directory
  put_file(dir / "bad.qvgt", Bytes{1, 2, 3});
  try {
    read_qvgt(dir / "bad.qvgt");
    FAIL();
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("bad.qvgt"), std::string::npos) << e.what();
  }
}

// ====================================================================================
// Tensor files for the CLI
// ====================================================================================

TEST(TensorFile, RoundTripsEveryDtypeThroughNpyAndSafetensors) {
  TempDir dir;
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor x = random_tensor({2, 3, 2, 8}, dt, 11, 2.0f);
    write_tensor_file(dir / "x.safetensors", x, "k");
    EXPECT_TRUE(same_bytes(read_tensor_file(dir / "x.safetensors"), x));
    EXPECT_TRUE(same_bytes(read_tensor_file(dir / "x.safetensors", std::string("k")), x));
    write_tensor_file(dir / "x.npy", x);
    const Tensor y = read_tensor_file(dir / "x.npy");
    if (dt == DType::BF16) {
      // .npy has no bf16: float32 holding exactly the bf16 values.
      ASSERT_EQ(y.dtype(), DType::F32);
      EXPECT_TRUE(same_bytes(y.to(DType::BF16), x));
      EXPECT_EQ(y.to_f32(), x.to_f32());
    } else {
      EXPECT_TRUE(same_bytes(y, x));
    }
    EXPECT_EQ(parse_npy(file_bytes(dir / "x.npy")).shape, (std::vector<int64_t>{2, 3, 2, 8}));
  }
  EXPECT_EQ(dir.entries(), 2u);
}

TEST(TensorFile, RanksAndNames) {
  TempDir dir;
  NpyArray a;
  a.shape = {3, 2, 4};
  a.data.resize(24 * 4);
  put_file(dir / "r3.npy", serialize_npy(a));
  EXPECT_EQ(read_tensor_file(dir / "r3.npy").shape(), (Shape4{1, 3, 2, 4}));
  EXPECT_THROW(read_tensor_file(dir / "r3.npy", std::string("x")), InvalidArgument);
  for (std::vector<int64_t> shape : {std::vector<int64_t>{24}, {6, 4}, {1, 1, 3, 2, 4}}) {
    a.shape = shape;
    put_file(dir / "r.npy", serialize_npy(a));
    EXPECT_THROW(read_tensor_file(dir / "r.npy"), InvalidArgument) << shape.size();
  }

  SafetensorsFile f;
  f.tensors.push_back({"model.k", StDType::BF16, {1, 2, 1, 8}, Bytes(32, 0x3f)});
  f.tensors.push_back({"model.v", StDType::F32, {2, 1, 8}, Bytes(64, 0)});
  f.tensors.push_back({"ids", StDType::U8, {1, 2, 1, 8}, Bytes(16, 0)});
  f.tensors.push_back({"flat", StDType::F32, {4}, Bytes(16, 0)});
  write_safetensors(dir / "m.safetensors", f);
  try {
    read_tensor_file(dir / "m.safetensors");
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    for (const char* n : {"model.k", "model.v", "ids", "flat"}) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
  EXPECT_EQ(read_tensor_file(dir / "m.safetensors", std::string("model.k")).dtype(), DType::BF16);
  EXPECT_EQ(read_tensor_file(dir / "m.safetensors", std::string("model.v")).shape(), (Shape4{1, 2, 1, 8}));
  EXPECT_THROW(read_tensor_file(dir / "m.safetensors", std::string("model.q")), InvalidArgument);
  EXPECT_THROW(read_tensor_file(dir / "m.safetensors", std::string("ids")), InvalidArgument);
  EXPECT_THROW(read_tensor_file(dir / "m.safetensors", std::string("flat")), InvalidArgument);
  write_safetensors(dir / "none.safetensors", SafetensorsFile{});
  EXPECT_THROW(read_tensor_file(dir / "none.safetensors"), InvalidArgument);
}

TEST(TensorFile, PathAndFormatErrors) {
  TempDir dir;
  const Tensor x = random_tensor({1, 2, 1, 4}, DType::F32, 1, 2.0f);
  EXPECT_THROW(read_tensor_file(dir / "x.pt"), InvalidArgument);
  EXPECT_THROW(write_tensor_file(dir / "x.pt", x), InvalidArgument);
  EXPECT_THROW(write_tensor_file(dir / "x.safetensors", x, ""), InvalidArgument);
  EXPECT_THROW(read_tensor_file(dir / "missing.npy"), InvalidArgument);
  EXPECT_THROW(write_tensor_file(dir / "nodir" / "x.npy", x), InvalidArgument);
  EXPECT_EQ(dir.entries(), 0u);
  put_file(dir / "bad.npy", bytes_of("\x93NUMPY garbage"));
  EXPECT_THROW(read_tensor_file(dir / "bad.npy"), CorruptData);
  put_file(dir / "bad.safetensors", Bytes{9, 0, 0, 0, 0, 0, 0, 0, '{'});
  EXPECT_THROW(read_tensor_file(dir / "bad.safetensors"), CorruptData);
  // Upper-case extensions are accepted.
  write_tensor_file(dir / "X.NPY", x);
  EXPECT_TRUE(same_bytes(read_tensor_file(dir / "X.NPY"), x));
}

}  // namespace
}  // namespace qvg
