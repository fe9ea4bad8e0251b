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
#include <array>
#include <cstring>
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

using io_detail::TensorEntry;
using Entry = TensorEntry;

constexpr const char* kArrayText = "a JSON array";
constexpr const char* kObjectText = "a JSON object";

// A streaming (SAX) reader of the safetensors header that builds the entries
// directly: linear in the header size (an ordered JSON object looks every key up
// linearly, which made 40,000 tensors take seconds), no JSON tree, and no nesting
// beyond the format's three levels (header object -> tensor object -> shape or
// data_offsets list): a container anywhere else is refused where it opens, and an
// unexpected container is described by its kind, never printed, so no untrusted
// depth is ever recursed over.
class HeaderReader final : public nlohmann::json_sax<Json> {
 public:
  explicit HeaderReader(size_t max_tensors) : max_tensors_(max_tensors) {}

  std::vector<Entry> entries;
  std::vector<std::pair<std::string, std::string>> metadata;

  bool null() override { return unexpected("null"); }
  bool boolean(bool v) override { return unexpected(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return unexpected(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    if (state_ == State::List && v <= static_cast<uint64_t>(INT64_MAX)) {
      list_.push_back(static_cast<int64_t>(v));
      return true;
    }
    return unexpected(std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& text) override { return unexpected(printable(text)); }
  bool binary(binary_t&) override { return unexpected("binary data"); }
  bool string(string_t& v) override {
    if (state_ == State::Metadata) {
      metadata.emplace_back(std::move(key_), std::move(v));
      return true;
    }
    if (state_ == State::Tensor && field_ == Field::DType) {
      cur_.t.dtype = parse_dtype_field(v, cur_.t.name);
      return true;
    }
    return unexpected("\"" + printable(v) + "\"");
  }
  bool start_object(std::size_t) override {
    if (state_ == State::Start) {
      state_ = State::Top;
      return true;
    }
    if (state_ != State::Top) return unexpected(kObjectText);
    if (key_ == kMetadataKey) {
      state_ = State::Metadata;
      return true;
    }
    if (entries.size() >= max_tensors_)
      throw InvalidArgument(
          fmt::format("safetensors header holds more than {} tensors (the most qvg reads)", max_tensors_));
    state_ = State::Tensor;
    cur_ = Entry();
    cur_.t.name = std::move(key_);
    have_ = {false, false, false};
    return true;
  }
  bool key(string_t& k) override {
    if (state_ == State::Top) {
      if (k == kMetadataKey && seen_metadata_) corrupt(fmt::format("header repeats the key '{}'", kMetadataKey));
      seen_metadata_ = seen_metadata_ || k == kMetadataKey;
    } else if (state_ == State::Tensor) {  // a tensor's field
      if (k == "dtype") {
        field_ = Field::DType;
      } else if (k == "shape") {
        field_ = Field::Shape;
      } else if (k == "data_offsets") {
        field_ = Field::Offsets;
      } else {
        corrupt(fmt::format("tensor '{}' has unknown field '{}' (allowed: dtype, shape, data_offsets)",
                            printable(cur_.t.name), printable(k)));
      }
      if (have_[size_t(field_)]) corrupt(fmt::format("header repeats the key '{}'", printable(k)));
      have_[size_t(field_)] = true;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (state_ == State::Tensor) finish_tensor();
    state_ = state_ == State::Top ? State::Done : State::Top;
    return true;
  }
  bool start_array(std::size_t) override {
    if (state_ != State::Tensor || field_ == Field::DType) return unexpected(kArrayText);
    state_ = State::List;
    list_.clear();
    return true;
  }
  bool end_array() override {
    (field_ == Field::Shape ? cur_.t.shape : offsets_) = std::move(list_);
    list_ = {};
    state_ = State::Tensor;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    corrupt(fmt::format("header is not valid JSON: {}", e.what()));
  }

 private:
  enum class State { Start, Top, Metadata, Tensor, List, Done };
  enum class Field { DType, Shape, Offsets };

  const char* field_name() const {
    return field_ == Field::DType ? "dtype" : field_ == Field::Shape ? "shape" : "data_offsets";
  }
  // A value (described by `got`) where the format allows none of its kind.
  [[noreturn]] bool unexpected(const std::string& got) {
    const std::string tensor = printable(state_ == State::Top ? key_ : cur_.t.name);
    switch (state_) {
      case State::Top:
        if (key_ == kMetadataKey) corrupt("__metadata__ must be an object of strings");
        corrupt(fmt::format("tensor '{}' must be an object", tensor));
      case State::Metadata:
        corrupt(fmt::format("__metadata__ entry '{}' must be a string, got {}", printable(key_), got));
      case State::Tensor:
        if (field_ == Field::DType) corrupt(fmt::format("tensor '{}': dtype must be a string", tensor));
        corrupt(fmt::format("tensor '{}': {} must be a list", tensor, field_name()));
      case State::List:
        corrupt(fmt::format("tensor '{}': {} must hold non-negative integers, got {}", tensor, field_name(), got));
      case State::Start:
      case State::Done: break;
    }
    corrupt("header is not a JSON object");
  }
  void finish_tensor() {
    const std::string name = printable(cur_.t.name);
    if (!have_[0] || !have_[1] || !have_[2])
      corrupt(fmt::format("tensor '{}' needs dtype, shape and data_offsets", name));
    if (offsets_.size() != 2 || offsets_[0] > offsets_[1])
      corrupt(fmt::format("tensor '{}': data_offsets must be [begin, end] with begin <= end", name));
    cur_.begin = static_cast<uint64_t>(offsets_[0]);
    cur_.end = static_cast<uint64_t>(offsets_[1]);
    const auto need = checked_nbytes(cur_.t.shape, st_dtype_size(cur_.t.dtype));
    if (!need) corrupt(fmt::format("tensor '{}': shape overflows the addressable size", name));
    if (*need != cur_.end - cur_.begin)
      corrupt(fmt::format("tensor '{}': data_offsets span {} bytes, shape x dtype needs {}", name,
                          cur_.end - cur_.begin, *need));
    entries.push_back(std::move(cur_));
  }

  size_t max_tensors_;
  State state_ = State::Start;
  Field field_ = Field::DType;
  std::string key_;
  bool seen_metadata_ = false;
  std::array<bool, 3> have_{};
  Entry cur_;
  std::vector<int64_t> list_, offsets_;
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
  return io_detail::parse_safetensors_limited(bytes, kMaxSafetensorsTensors);
}

namespace io_detail {

uint64_t safetensors_header_length(std::span<const uint8_t> head, uint64_t file_size) {
  if (file_size < 8 || head.size() < 8)
    corrupt(fmt::format("file is {} bytes, shorter than the 8-byte header length", file_size));
  const uint64_t n = io_detail::load_le64(head.data());
  if (n > file_size - 8) corrupt(fmt::format("header length {} runs past the end of the file ({} bytes)", n, file_size));
  if (n > kMaxHeader) corrupt(fmt::format("header length {} exceeds the limit of {}", n, kMaxHeader));
  return n;
}

SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> head, uint64_t file_size, size_t max_tensors) {
  SafetensorsHeader h;
  const uint64_t n = h.header_len = safetensors_header_length(head, file_size);
  QVG_CHECK(head.size() >= 8 + n);
  const auto* hb = reinterpret_cast<const char*>(head.data() + 8);
  if (n < 2 || hb[0] != '{') corrupt("header is not a JSON object");
  // JSON holds no raw NUL byte, and the JSON parser would read one as the end of its
  // input: whatever followed it in the header (padding or not) would go unread.
  if (const void* z = std::memchr(hb, 0, size_t(n)))
    corrupt(fmt::format("header holds a NUL byte at byte {} (a JSON header holds none)",
                        8 + (static_cast<const char*>(z) - hb)));

  HeaderReader reader(max_tensors);
  Json::sax_parse(hb, hb + n, &reader);  // throws on the first problem (the reader's or the parser's)
  h.metadata = std::move(reader.metadata);
  h.tensors = std::move(reader.entries);
  std::vector<Entry>& entries = h.tensors;
  // Duplicate keys (the format forbids them): sorted views of the names, no set.
  auto check_unique = [](std::vector<const std::string*> names) {
    std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    for (size_t i = 1; i < names.size(); ++i)
      if (*names[i] == *names[i - 1]) corrupt(fmt::format("header repeats the key '{}'", printable(*names[i])));
  };
  {
    std::vector<const std::string*> names;
    names.reserve(entries.size());
    for (const Entry& e : entries) names.push_back(&e.t.name);
    check_unique(std::move(names));
    names.clear();
    for (const auto& [k, v] : h.metadata) names.push_back(&k);
    check_unique(std::move(names));
  }

  // The tensors must tile the byte buffer: sorted by offset, each starts where the
  // previous ended, the first at 0 and the last at the end of the file.
  const uint64_t data_len = file_size - 8 - n;
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
  return h;
}

SafetensorsHeader read_safetensors_header(const detail::ReadOnlyFile& f, size_t max_tensors) {
  std::vector<uint8_t> head(size_t(std::min<uint64_t>(f.size(), 8)));
  if (!f.read_at(0, head.data(), head.size())) corrupt("the file shrank while it was read");
  const uint64_t n = safetensors_header_length(head, f.size());
  if (const auto nul = f.append_text(8, n, head))
    corrupt(fmt::format("header holds a NUL byte at byte {} (a JSON header holds none)", *nul));
  if (head.size() != 8 + n) corrupt("the file shrank while it was read");
  return parse_safetensors_header(head, f.size(), max_tensors);
}

SafetensorsFile parse_safetensors_limited(std::span<const uint8_t> bytes, size_t max_tensors) {
  SafetensorsHeader h = parse_safetensors_header(bytes, bytes.size(), max_tensors);
  SafetensorsFile f;
  f.metadata = std::move(h.metadata);
  const uint8_t* data = bytes.data() + 8 + h.header_len;
  f.tensors.reserve(h.tensors.size());
  for (auto& e : h.tensors) {
    e.t.data.assign(data + e.begin, data + e.end);
    f.tensors.push_back(std::move(e.t));
  }
  return f;
}

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
  const detail::ReadOnlyFile f(path);
  return detail::with_path(path, [&] {
    (void)io_detail::read_safetensors_header(f, kMaxSafetensorsTensors);  // before the file is read
    return parse_safetensors(f.read_all());
  });
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& f) {
  write_file_atomic(path, serialize_safetensors(f));
}

}  // namespace qvg
