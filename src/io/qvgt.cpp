// `.qvgt`: one EncodedTensor as a safetensors file (spec 1.6).
//
// Arrays (spec 1.5), written in this order:
//   centroids.<s>  BF16|F16|F32  [B, H, K, D]            s = 0 .. stages-1
//   ids.<s>        U8            [B, H, S]               s = 0 .. stages-1
//   codes          U8            [B, H, S, D*bits/8]
//   scales         F8_E4M3|BF16  [B, H, S, D/block_size]
//   zeros          as scales     [B, H, S, D/block_size] asymmetric only
//   scale_factor   F32           [B, H]                  two_level only
//   zero_factor    F32           [B, H]                  two_level and asymmetric
// Metadata (all strings): format, dtype, shape, layout, bits, block_size, stages,
// centroids, asymmetric, scale_dtype, scaling. The reader accepts the canonical
// spellings the writer produces and nothing else (qvg/io.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "core/file_impl.h"
#include "io/io_util.h"
#include "io/safetensors_impl.h"
#include "qvg/error.h"
#include "qvg/io.h"

#include "qvg/code_format.h"
#include "qvg/numeric.h"

namespace qvg {

std::string qvgt_format(const EncodingLayout& layout) {
  const CodeFormat* f = find_code_format(layout.bits);
  if (!f) unknown_code_width(layout.bits);
  return fmt::format("qvg.prq/{}", f->qvgt_version);
}

namespace {

// The newest `.qvgt` version any code width is stored in.
constexpr int kQvgtVersionMax = [] {
  int v = 1;
  for (const CodeFormat& f : kCodeFormats) v = f.qvgt_version > v ? f.qvgt_version : v;
  return v;
}();

using io_detail::printable;

// Arrays of a `.qvgt` file: centroids and ids per stage, codes, scales, zeros and
// two factors at most.
constexpr size_t kMaxQvgtArrays = 2 * kMaxStages + 5;

constexpr const char* kMetadataKeys[] = {"format", "dtype",     "shape",      "layout",      "bits",   "block_size",
                                         "stages", "centroids", "asymmetric", "scale_dtype", "scaling"};

[[noreturn]] void corrupt(const std::string& what) {
  throw CorruptData(fmt::format("invalid .qvgt file: {}", what));
}

StDType st_dtype_of(DType t) {
  switch (t) {
    case DType::BF16: return StDType::BF16;
    case DType::F16: return StDType::F16;
    case DType::F32: return StDType::F32;
  }
  return StDType::F32;
}

StDType st_dtype_of(ScaleDType t) {
  return t == ScaleDType::FP8_E4M3 ? StDType::F8_E4M3 : StDType::BF16;
}

// The safetensors dtype of an array of `layout`.
StDType st_dtype_of(const EncodingLayout& layout, const ArrayDesc& a) {
  switch (a.elem) {
    case ArrayElem::Input: return st_dtype_of(layout.dtype);
    case ArrayElem::U8: return StDType::U8;
    case ArrayElem::Scale: return st_dtype_of(layout.scale_dtype);
    case ArrayElem::F32: return StDType::F32;
  }
  return StDType::U8;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += fmt::format("{}{}", i ? "," : "", s[i]);
  return r + "]";
}

// Strict decimal integer in [lo, hi]: digits only, no sign, no leading zeros.
std::optional<int64_t> strict_decimal(std::string_view v, int64_t lo, int64_t hi) {
  if (v.empty() || v.size() > 19 || (v.size() > 1 && v[0] == '0')) return std::nullopt;
  int64_t x = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    x = x * 10 + (c - '0');  // at most 19 digits: no overflow
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

int parse_meta_int(const std::string& key, const std::string& v, int lo, int hi) {
  const auto x = strict_decimal(v, lo, hi);
  if (!x) corrupt(fmt::format("metadata '{}' must be a decimal integer in {}..{}, got '{}'", key, lo, hi, printable(v)));
  return static_cast<int>(*x);
}

// The canonical `shape` value, exactly as the writer spells it: "[B,S,H,D]" with
// four strict decimal integers >= 1 and no spaces.
Shape4 parse_meta_shape(const std::string& v) {
  int64_t d[4] = {0, 0, 0, 0};
  bool ok = v.size() >= 9 && v.front() == '[' && v.back() == ']';
  std::string_view rest = ok ? std::string_view(v).substr(1, v.size() - 2) : std::string_view();
  for (int i = 0; ok && i < 4; ++i) {
    const size_t comma = i < 3 ? rest.find(',') : rest.size();
    ok = comma != std::string_view::npos;
    if (!ok) break;
    const auto x = strict_decimal(rest.substr(0, comma), 1, INT64_MAX);
    ok = x.has_value();
    if (ok) d[i] = *x;
    rest = rest.substr(std::min(rest.size(), comma + 1));
  }
  if (!ok)
    corrupt(
        fmt::format("metadata 'shape' must be a list of 4 positive integers written as '[B,S,H,D]' (no spaces), "
                    "got '{}'",
                    printable(v)));
  return {d[0], d[1], d[2], d[3]};
}

// A metadata value that must be one of `allowed`; returns its index.
size_t parse_meta_choice(const std::string& key, const std::string& v,
                         std::initializer_list<std::string_view> allowed) {
  size_t i = 0;
  std::string list;
  for (auto a : allowed) {
    if (v == a) return i;
    list += fmt::format("{}'{}'", i ? ", " : "", a);
    ++i;
  }
  corrupt(fmt::format("metadata '{}' must be one of {}, got '{}'", key, list, printable(v)));
}

// The `format` entry: "qvg.prq/<v>" with v in 1..the newest version a code width is
// stored in (qvg/code_format.h); another version is refused by name. Whether v is the
// one the file's width needs is checked with the width.
int parse_format_version(const std::string& v) {
  constexpr std::string_view kPrefix = "qvg.prq/";
  std::string known;
  for (int ver = 1, i = 0; ver <= kQvgtVersionMax; ++ver) {
    known += fmt::format("{}'qvg.prq/{}'", i++ ? ", " : "", ver);
    if (v == fmt::format("{}{}", kPrefix, ver)) return ver;
  }
  corrupt(fmt::format("metadata 'format' must be one of {} (the versions this reader knows), got '{}'", known,
                      printable(v)));
}

// The `bits` entry: a width with a row in qvg/code_format.h, in decimal.
const CodeFormat& parse_meta_width(const std::string& v) {
  for (const CodeFormat& f : kCodeFormats)
    if (v == std::to_string(f.bits)) return f;
  corrupt(fmt::format("metadata 'bits' must be one of {}, got '{}'", known_code_widths(), printable(v)));
}

std::vector<float> floats_of(const std::vector<uint8_t>& bytes) {
  std::vector<float> r(bytes.size() / 4);
  if (!r.empty()) std::memcpy(r.data(), bytes.data(), r.size() * 4);
  return r;
}

}  // namespace

std::vector<uint8_t> serialize_qvgt(const EncodedTensor& enc) {
  try {
    enc.validate();
  } catch (const CorruptData& e) {
    throw InvalidArgument(fmt::format("cannot write an inconsistent EncodedTensor: {}", e.what()));
  }
  const Shape4& x = enc.shape;
  const std::vector<std::pair<std::string, std::string>> meta = {
      {"format", qvgt_format(enc.layout())},
      {"dtype", std::string(dtype_name(enc.dtype))},
      {"shape", shape_str({x.b, x.s, x.h, x.d})},
      {"layout", "BSHD"},
      {"bits", std::to_string(enc.bits)},
      {"block_size", std::to_string(enc.block_size)},
      {"stages", std::to_string(enc.stages)},
      {"centroids", std::to_string(enc.centroids)},
      {"asymmetric", enc.asymmetric ? "true" : "false"},
      {"scale_dtype", std::string(name(enc.scale_dtype))},
      {"scaling", std::string(name(enc.scaling))},
  };
  std::vector<io_detail::TensorRef> refs;
  for (ArrayDesc& a : enc.arrays()) refs.push_back({a.name(), st_dtype_of(enc, a), std::move(a.shape), enc.array(a)});
  return io_detail::serialize_safetensors_refs(refs, meta);
}

namespace {

// A `.qvgt` header checked against spec 1.6: its layout, and for each array of the
// layout (in EncodingLayout::arrays() order) the file's entry for it.
struct QvgtHeader {
  EncodingLayout layout;
  std::vector<std::pair<ArrayDesc, const io_detail::TensorEntry*>> arrays;
};

// Everything parse_qvgt checks that does not need the arrays' values: exactly the
// metadata keys with canonical values, exactly the arrays they imply, with their
// dtypes and logical shapes.
QvgtHeader check_qvgt_header(const io_detail::SafetensorsHeader& h) {
  // --- metadata: exactly the keys of spec 1.6 ---
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : h.metadata) {
    bool known = false;
    for (const char* key : kMetadataKeys) known = known || k == key;
    if (!known)
      corrupt(
          fmt::format("unknown metadata entry '{}' (allowed: format, dtype, shape, layout, bits, "
                      "block_size, stages, centroids, asymmetric, scale_dtype, scaling)",
                      printable(k)));
    m[k] = v;
  }
  for (const char* key : kMetadataKeys)
    if (!m.count(key)) corrupt(fmt::format("missing metadata entry '{}'", key));

  const int version = parse_format_version(m["format"]);
  if (m["layout"] != "BSHD") corrupt(fmt::format("metadata 'layout' must be 'BSHD', got '{}'", printable(m["layout"])));
  QvgtHeader q;
  EncodingLayout& e = q.layout;
  constexpr DType kDTypes[] = {DType::BF16, DType::F16, DType::F32};
  e.dtype = kDTypes[parse_meta_choice("dtype", m["dtype"], {"bf16", "f16", "f32"})];
  e.shape = parse_meta_shape(m["shape"]);
  const CodeFormat& width = parse_meta_width(m["bits"]);
  e.bits = width.bits;
  if (width.qvgt_version != version)
    corrupt(fmt::format("metadata 'format' is '{}' but bits={} is stored as '{}'", printable(m["format"]), e.bits,
                        qvgt_format(e)));
  e.block_size = parse_meta_int("block_size", m["block_size"], 1, INT32_MAX);
  e.stages = parse_meta_int("stages", m["stages"], 1, kMaxStages);
  e.centroids = parse_meta_int("centroids", m["centroids"], 1, 256);
  e.asymmetric = parse_meta_choice("asymmetric", m["asymmetric"], {"false", "true"}) == 1;
  e.scale_dtype = parse_meta_choice("scale_dtype", m["scale_dtype"], {"fp8_e4m3", "bf16"}) == 0 ? ScaleDType::FP8_E4M3
                                                                                                : ScaleDType::BF16;
  e.scaling =
      parse_meta_choice("scaling", m["scaling"], {"two_level", "compat"}) == 0 ? Scaling::TwoLevel : Scaling::Compat;
  if (e.block_size % width.group_codes != 0)
    corrupt(fmt::format("metadata 'block_size' must be a multiple of {} at bits={}, got {}", width.group_codes, e.bits,
                        e.block_size));
  if (e.shape.d % e.block_size != 0)
    corrupt(fmt::format("metadata 'block_size' must divide head_dim {}, got {}", e.shape.d, e.block_size));
  // Each stage has two arrays: a stage count beyond that cannot match.
  if (static_cast<size_t>(e.stages) > h.tensors.size() / 2)
    corrupt(fmt::format("metadata 'stages' is {} but the file holds only {} arrays", e.stages, h.tensors.size()));

  // --- arrays: exactly the expected set, with their dtypes and shapes ---
  std::map<std::string, const io_detail::TensorEntry*> by_name;
  for (const auto& t : h.tensors) by_name[t.t.name] = &t;
  std::map<std::string, const ArrayDesc*> expected;
  const std::vector<ArrayDesc> specs = e.arrays();
  for (const ArrayDesc& s : specs) expected[s.name()] = &s;
  for (const auto& t : h.tensors)
    if (!expected.count(t.t.name)) corrupt(fmt::format("unexpected array '{}' for this metadata", printable(t.t.name)));
  for (const ArrayDesc& s : specs) {
    const std::string name = s.name();
    auto it = by_name.find(name);
    if (it == by_name.end()) corrupt(fmt::format("missing array '{}'", name));
    const SafeTensor& t = it->second->t;
    const StDType want = st_dtype_of(e, s);
    if (t.dtype != want)
      corrupt(fmt::format("array '{}' has dtype {}, expected {}", name, st_dtype_name(t.dtype), st_dtype_name(want)));
    if (t.shape != s.shape)
      corrupt(fmt::format("array '{}' has shape {}, expected {}", name, shape_str(t.shape), shape_str(s.shape)));
    q.arrays.emplace_back(s, it->second);
  }
  return q;
}

}  // namespace

EncodedTensor parse_qvgt(std::span<const uint8_t> bytes) {
  io_detail::SafetensorsHeader h;
  try {
    h = io_detail::parse_safetensors_header(bytes, bytes.size(), kMaxQvgtArrays);
  } catch (const Error& e) {  // an unsupported dtype is corruption here
    corrupt(e.what());
  }
  const QvgtHeader q = check_qvgt_header(h);
  EncodedTensor e;
  static_cast<EncodingLayout&>(e) = q.layout;
  e.centroid.resize(static_cast<size_t>(e.stages));
  e.ids.resize(static_cast<size_t>(e.stages));
  const uint8_t* data = bytes.data() + 8 + h.header_len;
  for (const auto& [s, t] : q.arrays) {
    std::vector<uint8_t> a(data + t->begin, data + t->end);
    switch (s.kind) {
      case EncodedArray::Centroids: e.centroid[size_t(s.stage)] = std::move(a); break;
      case EncodedArray::Ids: e.ids[size_t(s.stage)] = std::move(a); break;
      case EncodedArray::Codes: e.codes = std::move(a); break;
      case EncodedArray::Scales: e.scales = std::move(a); break;
      case EncodedArray::Zeros: e.zeros = std::move(a); break;
      case EncodedArray::ScaleFactor: e.scale_factor = floats_of(a); break;
      case EncodedArray::ZeroFactor: e.zero_factor = floats_of(a); break;
    }
  }

  try {
    e.validate();
    e.validate_values();
  } catch (const CorruptData& err) {
    corrupt(err.what());
  }
  return e;
}

namespace {
// The safetensors header of the `.qvgt` file f, read before anything else of it
// (io_detail::read_safetensors_header); every refusal is CorruptData.
io_detail::SafetensorsHeader read_header(const detail::ReadOnlyFile& f) {
  try {
    return io_detail::read_safetensors_header(f, kMaxQvgtArrays);
  } catch (const CorruptData& e) {
    corrupt(e.what());
  } catch (const InvalidArgument& e) {
    corrupt(e.what());
  }
}
}  // namespace

QvgtInfo inspect_qvgt(const std::filesystem::path& path) {
  const detail::ReadOnlyFile f(path);
  return detail::with_path(path, [&] {
    const io_detail::SafetensorsHeader h = read_header(f);
    const QvgtHeader q = check_qvgt_header(h);
    QvgtInfo info;
    info.file_bytes = f.size();
    info.header_bytes = 8 + h.header_len;
    info.metadata = h.metadata;
    info.layout = q.layout;
    for (const auto& [s, t] : q.arrays) {
      info.arrays.push_back({s.name(), std::string(st_dtype_name(t->t.dtype)), t->t.shape, t->end - t->begin});
      info.encoded_bytes += t->end - t->begin;
    }
    return info;
  });
}

void write_qvgt(const std::filesystem::path& path, const EncodedTensor& enc) {
  write_file_atomic(path, serialize_qvgt(enc));
}

EncodedTensor read_qvgt(const std::filesystem::path& path) {
  const detail::ReadOnlyFile f(path);
  return detail::with_path(path, [&] {
    (void)check_qvgt_header(read_header(f));  // the header, checked against the file's size, first
    return parse_qvgt(f.read_all());
  });
}

}  // namespace qvg
