// safetensors reader and writer.
//
// Layout: u64 LE header length N, N bytes of UTF-8 JSON, then the byte buffer. The
// header is an object: `"__metadata__": {string: string}` (optional) and, per tensor,
// `"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}` with
// offsets relative to the byte buffer. Validation follows the reference
// implementation (huggingface/safetensors): header within the file and <= 100 MB,
// offsets tiling the buffer exactly; qvg is stricter about duplicate keys and
// unknown fields.
#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "io/io_util.h"
#include "io/safetensors_impl.h"
#include "qvg/error.h"
#include "qvg/io.h"

namespace qvg {

namespace {

using io_detail::checked_nbytes;
using io_detail::printable;
using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeader = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

[[noreturn]] void corrupt(const std::string& what) {
  throw CorruptData(fmt::format("invalid safetensors file: {}", what));
}

// Dtype names of the safetensors format that qvg knows but does not handle.
bool is_other_known_dtype(std::string_view s) {
  static constexpr std::string_view kOthers[] = {"BOOL", "I8",  "U16", "I16", "U32",
                                                 "I32",  "U64", "I64", "F64", "F8_E5M2"};
  return std::find(std::begin(kOthers), std::end(kOthers), s) != std::end(kOthers);
}

StDType parse_dtype_field(std::string_view s, const std::string& tensor) {
  for (StDType t : {StDType::F32, StDType::F16, StDType::BF16, StDType::U8, StDType::F8_E4M3})
    if (s == st_dtype_name(t)) return t;
  if (is_other_known_dtype(s))
    throw InvalidArgument(
        fmt::format("unsupported safetensors dtype '{}' of tensor '{}' (qvg reads F32, F16, BF16, U8, F8_E4M3)", s,
                    printable(tensor)));
  corrupt(fmt::format("tensor '{}' has unknown dtype '{}'", printable(tensor), printable(s)));
}

// Reads a JSON array of unsigned integers (each <= INT64_MAX).
std::vector<int64_t> parse_uint_array(const Json& j, const std::string& tensor, const char* field) {
  if (!j.is_array()) corrupt(fmt::format("tensor '{}': {} must be a list", printable(tensor), field));
  std::vector<int64_t> r;
  r.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      corrupt(fmt::format("tensor '{}': {} must hold non-negative integers, got {}", printable(tensor), field,
                          printable(v.dump())));
    r.push_back(static_cast<int64_t>(v.get<uint64_t>()));
  }
  return r;
}

struct Entry {
  SafeTensor t;
  uint64_t begin = 0, end = 0;
};

}  // namespace

std::string_view st_dtype_name(StDType t) {
  switch (t) {
    case StDType::F32: return "F32";
    case StDType::F16: return "F16";
    case StDType::BF16: return "BF16";
    case StDType::U8: return "U8";
    case StDType::F8_E4M3: return "F8_E4M3";
  }
  return "?";
}

size_t st_dtype_size(StDType t) {
  switch (t) {
    case StDType::F32: return 4;
    case StDType::F16:
    case StDType::BF16: return 2;
    case StDType::U8:
    case StDType::F8_E4M3: return 1;
  }
  return 0;
}

const SafeTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const std::string* SafetensorsFile::find_metadata(std::string_view key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8) corrupt(fmt::format("file is {} bytes, shorter than the 8-byte header length", bytes.size()));
  const uint64_t n = io_detail::load_le64(bytes.data());
  if (n > bytes.size() - 8)
    corrupt(fmt::format("header length {} runs past the end of the file ({} bytes)", n, bytes.size()));
  if (n > kMaxHeader) corrupt(fmt::format("header length {} exceeds the limit of {}", n, kMaxHeader));
  const auto* hb = reinterpret_cast<const char*>(bytes.data() + 8);
  if (n < 2 || hb[0] != '{') corrupt("header is not a JSON object");

  // Parse with a callback that tracks the keys of every open object: nlohmann keeps
  // the last of duplicate keys silently, the format forbids duplicates.
  std::vector<std::set<std::string>> open_keys;
  std::string duplicate;
  Json header;
  try {
    header = Json::parse(hb, hb + n, [&](int /*depth*/, Json::parse_event_t ev, Json& parsed) {
      switch (ev) {
        case Json::parse_event_t::object_start: open_keys.emplace_back(); break;
        case Json::parse_event_t::object_end:
          if (!open_keys.empty()) open_keys.pop_back();
          break;
        case Json::parse_event_t::key:
          if (!open_keys.empty() && parsed.is_string() && !open_keys.back().insert(parsed.get<std::string>()).second &&
              duplicate.empty())
            duplicate = parsed.get<std::string>();
          break;
        default: break;
      }
      return true;
    });
  } catch (const Json::exception& e) {
    corrupt(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!duplicate.empty()) corrupt(fmt::format("header repeats the key '{}'", printable(duplicate)));
  if (!header.is_object()) corrupt("header is not a JSON object");

  SafetensorsFile f;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [key, val] : header.items()) {
    if (key == kMetadataKey) {
      if (!val.is_object()) corrupt("__metadata__ must be an object of strings");
      for (const auto& [mk, mv] : val.items()) {
        if (!mv.is_string())
          corrupt(fmt::format("__metadata__ entry '{}' must be a string, got {}", printable(mk), printable(mv.dump())));
        f.metadata.emplace_back(mk, mv.get<std::string>());
      }
      continue;
    }
    if (!val.is_object()) corrupt(fmt::format("tensor '{}' must be an object", printable(key)));
    for (const auto& [fk, fv] : val.items()) {
      (void)fv;
      if (fk != "dtype" && fk != "shape" && fk != "data_offsets")
        corrupt(fmt::format("tensor '{}' has unknown field '{}' (allowed: dtype, shape, data_offsets)", printable(key),
                            printable(fk)));
    }
    if (!val.contains("dtype") || !val.contains("shape") || !val.contains("data_offsets"))
      corrupt(fmt::format("tensor '{}' needs dtype, shape and data_offsets", printable(key)));
    const auto& jd = val["dtype"];
    if (!jd.is_string()) corrupt(fmt::format("tensor '{}': dtype must be a string", printable(key)));
    Entry e;
    e.t.name = key;
    e.t.dtype = parse_dtype_field(jd.get<std::string>(), key);
    e.t.shape = parse_uint_array(val["shape"], key, "shape");
    const auto offs = parse_uint_array(val["data_offsets"], key, "data_offsets");
    if (offs.size() != 2 || offs[0] > offs[1])
      corrupt(fmt::format("tensor '{}': data_offsets must be [begin, end] with begin <= end", printable(key)));
    e.begin = static_cast<uint64_t>(offs[0]);
    e.end = static_cast<uint64_t>(offs[1]);
    const auto need = checked_nbytes(e.t.shape, st_dtype_size(e.t.dtype));
    if (!need) corrupt(fmt::format("tensor '{}': shape overflows the addressable size", printable(key)));
    if (*need != e.end - e.begin)
      corrupt(fmt::format("tensor '{}': data_offsets span {} bytes, shape x dtype needs {}", printable(key),
                          e.end - e.begin, *need));
    entries.push_back(std::move(e));
  }

  // The tensors must tile the byte buffer: sorted by offset, each starts where the
  // previous ended, the first at 0 and the last at the end of the file.
  const uint64_t data_len = bytes.size() - 8 - n;
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const auto& e : entries) {
    if (e.begin != cursor)
      corrupt(fmt::format("tensor '{}' starts at byte {} of the data, expected {} ({})", printable(e.t.name), e.begin,
                          cursor, e.begin < cursor ? "overlap" : "gap"));
    if (e.end > data_len)
      corrupt(fmt::format("tensor '{}' ends at byte {}, past the {} data bytes", printable(e.t.name), e.end, data_len));
    cursor = e.end;
  }
  if (cursor != data_len) corrupt(fmt::format("tensors cover {} of the {} data bytes", cursor, data_len));

  const uint8_t* data = bytes.data() + 8 + n;
  f.tensors.reserve(entries.size());
  for (auto& e : entries) {
    e.t.data.assign(data + e.begin, data + e.end);
    f.tensors.push_back(std::move(e.t));
  }
  return f;
}

namespace io_detail {

std::vector<uint8_t> serialize_safetensors_refs(const std::vector<TensorRef>& tensors,
                                                const std::vector<std::pair<std::string, std::string>>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) {
      if (meta.contains(k))
        throw InvalidArgument(fmt::format("safetensors metadata key '{}' appears twice", printable(k)));
      meta[k] = v;
    }
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == kMetadataKey) throw InvalidArgument("safetensors tensor name '__metadata__' is reserved");
    if (header.contains(t.name))
      throw InvalidArgument(fmt::format("safetensors tensor name '{}' appears twice", printable(t.name)));
    const auto need = checked_nbytes(t.shape, st_dtype_size(t.dtype));
    if (!need)
      throw InvalidArgument(
          fmt::format("tensor '{}': shape has a negative or overflowing dimension", printable(t.name)));
    if (*need != t.data.size())
      throw InvalidArgument(fmt::format("tensor '{}': data has {} bytes, shape x {} needs {}", printable(t.name),
                                        t.data.size(), st_dtype_name(t.dtype), *need));
    header[t.name] = {
        {"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("safetensors names and metadata must be UTF-8: {}", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  append_le(out, text.size(), 8);
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

}  // namespace io_detail

std::vector<uint8_t> serialize_safetensors(const SafetensorsFile& f) {
  std::vector<io_detail::TensorRef> refs;
  refs.reserve(f.tensors.size());
  for (const auto& t : f.tensors) refs.push_back({t.name, t.dtype, t.shape, t.data});
  return io_detail::serialize_safetensors_refs(refs, f.metadata);
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  return io_detail::parse_with_path(path, read_file_bytes(path), [](const auto& b) { return parse_safetensors(b); });
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& f) {
  write_file_atomic(path, serialize_safetensors(f));
}

}  // namespace qvg
