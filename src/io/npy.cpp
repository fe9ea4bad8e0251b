// `.npy` reader and writer (NumPy format versions 1.0 / 2.0 / 3.0).
//
// Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE for
// 2.0/3.0), an ASCII (3.0: UTF-8) Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a final '\n', then the raw C-order data. The header dict is
// parsed by a small strict parser: exactly the three keys, string / bool / int-tuple
// values; anything else is CorruptData.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/core.h>

#include "io/io_util.h"
#include "qvg/error.h"
#include "qvg/io.h"

namespace qvg {

namespace {

using io_detail::checked_nbytes;
using io_detail::printable;

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void corrupt(const std::string& what) {
  throw CorruptData(fmt::format("invalid .npy file: {}", what));
}

// Strict parser of the header dict literal.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view s) : s_(s) {}

  struct Result {
    std::string descr;
    bool fortran_order = false;
    std::vector<int64_t> shape;
  };

  Result parse() {
    Result r;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (!at('}')) {
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (have_descr) corrupt("header repeats key 'descr'");
        have_descr = true;
        if (!at('\'') && !at('"'))
          throw InvalidArgument(
              "unsupported .npy dtype: structured 'descr' (only '<f4' float32 and '<f2' "
              "float16 are read)");
        r.descr = parse_string();
      } else if (key == "fortran_order") {
        if (have_fortran) corrupt("header repeats key 'fortran_order'");
        have_fortran = true;
        r.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (have_shape) corrupt("header repeats key 'shape'");
        have_shape = true;
        r.shape = parse_tuple();
      } else {
        corrupt(fmt::format("header has unknown key '{}' (allowed: descr, fortran_order, shape)", printable(key)));
      }
      skip_ws();
      if (at(',')) {
        ++pos_;
        skip_ws();
      } else if (!at('}')) {
        corrupt(fmt::format("header: expected ',' or '}}' at byte {}", pos_));
      }
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) corrupt(fmt::format("header: unexpected text after the dict at byte {}", pos_));
    if (!have_descr || !have_fortran || !have_shape)
      corrupt("header must have the keys descr, fortran_order and shape");
    return r;
  }

 private:
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    if (!at(c)) corrupt(fmt::format("header: expected '{}' at byte {}", c, pos_));
    ++pos_;
  }
  std::string parse_string() {
    if (!at('\'') && !at('"')) corrupt(fmt::format("header: expected a quoted string at byte {}", pos_));
    const char q = s_[pos_++];
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') corrupt("header: escapes in strings are not supported");
      ++pos_;
    }
    if (pos_ >= s_.size()) corrupt("header: unterminated string");
    std::string r(s_.substr(start, pos_ - start));
    ++pos_;
    return r;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    corrupt(fmt::format("header: fortran_order must be True or False at byte {}", pos_));
  }
  int64_t parse_int() {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (v > (INT64_MAX - 9) / 10) corrupt("header: shape dimension too large");
      v = v * 10 + (s_[pos_] - '0');
      ++pos_;
    }
    if (pos_ == start) corrupt(fmt::format("header: expected a non-negative integer at byte {}", pos_));
    return v;
  }
  std::vector<int64_t> parse_tuple() {
    expect('(');
    std::vector<int64_t> dims;
    bool trailing_comma = false;
    skip_ws();
    while (!at(')')) {
      if (dims.size() >= 64) corrupt("header: shape has more than 64 dimensions");
      dims.push_back(parse_int());
      trailing_comma = false;
      skip_ws();
      if (at(',')) {
        ++pos_;
        trailing_comma = true;
        skip_ws();
      } else if (!at(')')) {
        corrupt(fmt::format("header: expected ',' or ')' in shape at byte {}", pos_));
      }
    }
    ++pos_;
    if (dims.size() == 1 && !trailing_comma) corrupt("header: a 1-d shape must be written as a tuple '(n,)'");
    return dims;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// The fixed part of the header: magic, version, the header length field.
struct NpyPrefix {
  uint8_t major = 0;
  size_t size = 0;          ///< bytes before the dict: 10 (1.0) or 12 (2.0, 3.0)
  uint64_t header_len = 0;  ///< the dict's bytes, within the file
};

// From the first min(file_size, 12) bytes of a file of file_size bytes.
NpyPrefix parse_prefix(std::span<const uint8_t> head, uint64_t file_size) {
  if (file_size < kMagicLen + 2 || head.size() < kMagicLen + 2 || std::memcmp(head.data(), kMagic, kMagicLen) != 0)
    corrupt("missing the magic string \\x93NUMPY");
  NpyPrefix p;
  p.major = head[6];
  const uint8_t minor = head[7];
  size_t len_size;
  if (p.major == 1 && minor == 0) {
    len_size = 2;
  } else if ((p.major == 2 || p.major == 3) && minor == 0) {
    len_size = 4;
  } else {
    corrupt(fmt::format("unsupported format version {}.{} (allowed: 1.0, 2.0, 3.0)", p.major, minor));
  }
  p.size = kMagicLen + 2 + len_size;
  if (file_size < p.size || head.size() < p.size)
    corrupt(fmt::format("file is {} bytes, too short for the header length field", file_size));
  p.header_len = len_size == 2 ? io_detail::load_le16(head.data() + 8) : io_detail::load_le32(head.data() + 8);
  if (p.header_len > file_size - p.size)
    corrupt(fmt::format("header length {} runs past the end of the file ({} bytes)", p.header_len, file_size));
  return p;
}

// The header of a file of file_size bytes whose whole header is in `head`: the
// array's dtype and shape, checked against the file's size (the data must fill the
// rest exactly). data_start: where the data begins.
struct NpyHeader {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t data_start = 0;
};

NpyHeader parse_header(std::span<const uint8_t> head, uint64_t file_size) {
  const NpyPrefix p = parse_prefix(head, file_size);
  QVG_CHECK(head.size() >= p.size + p.header_len);
  const std::string_view header(reinterpret_cast<const char*>(head.data() + p.size), static_cast<size_t>(p.header_len));
  for (char c : header) {
    const auto u = static_cast<unsigned char>(c);
    if (u == 0 || (u >= 0x80 && p.major < 3)) corrupt("header contains a NUL or non-ASCII byte");
  }
  const auto h = HeaderParser(header).parse();

  NpyHeader r;
  if (h.descr == "<f4") {
    r.dtype = DType::F32;
  } else if (h.descr == "<f2") {
    r.dtype = DType::F16;
  } else {
    throw InvalidArgument(
        fmt::format("unsupported .npy dtype '{}' (only '<f4' float32 and '<f2' float16 are read)", printable(h.descr)));
  }
  if (h.fortran_order) throw InvalidArgument("unsupported .npy layout: fortran_order is True (only C order is read)");
  r.shape = h.shape;
  const auto nbytes = checked_nbytes(r.shape, dtype_size(r.dtype));
  if (!nbytes) corrupt("shape overflows the addressable size");
  r.data_start = p.size + static_cast<size_t>(p.header_len);
  const uint64_t avail = file_size - r.data_start;
  if (*nbytes > avail) corrupt(fmt::format("data truncated: shape needs {} bytes, file has {}", *nbytes, avail));
  if (*nbytes < avail) corrupt(fmt::format("{} trailing bytes after the {} data bytes", avail - *nbytes, *nbytes));
  return r;
}

}  // namespace

NpyArray parse_npy(std::span<const uint8_t> bytes) {
  NpyHeader h = parse_header(bytes, bytes.size());
  NpyArray a;
  a.dtype = h.dtype;
  a.shape = std::move(h.shape);
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(h.data_start), bytes.end());
  return a;
}

namespace io_detail {

std::vector<uint8_t> read_npy_bytes(const detail::ReadOnlyFile& f) {
  // The header first (qvg/io.h): the fixed prefix, then the dict read as
  // text (a NUL ends it), checked against the file's size; only then the file.
  std::vector<uint8_t> head(static_cast<size_t>(std::min<uint64_t>(f.size(), kMagicLen + 6)));
  if (!f.read_at(0, head.data(), head.size())) corrupt("the file shrank while it was read");
  const NpyPrefix p = parse_prefix(head, f.size());
  head.resize(p.size);
  if (f.append_text(p.size, p.header_len, head)) corrupt("header contains a NUL or non-ASCII byte");
  if (head.size() != p.size + p.header_len) corrupt("the file shrank while it was read");
  (void)parse_header(head, f.size());
  return f.read_all();
}

}  // namespace io_detail

std::vector<uint8_t> serialize_npy(const NpyArray& a) {
  if (a.dtype == DType::BF16)
    throw InvalidArgument("serialize_npy: dtype bf16 cannot be stored in .npy (allowed: f32, f16)");
  const auto nbytes = checked_nbytes(a.shape, dtype_size(a.dtype));
  if (!nbytes) throw InvalidArgument("serialize_npy: shape has a negative or overflowing dimension");
  if (*nbytes != a.data.size())
    throw InvalidArgument(
        fmt::format("serialize_npy: data has {} bytes, shape x dtype needs {}", a.data.size(), *nbytes));
  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) shape += fmt::format("{}, ", a.shape[i]);
  if (a.shape.size() > 1)
    shape.resize(shape.size() - 2);  // "(2, 3)"; 1-d keeps "(n,"
  else if (a.shape.size() == 1)
    shape.resize(shape.size() - 1);
  shape += ")";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 a.dtype == DType::F32 ? "<f4" : "<f2", shape);
  // Pad with spaces so that magic + version + length + header is a multiple of 64,
  // the header ending in '\n' (what NumPy writes).
  size_t len_size = 2;
  size_t total = kMagicLen + 2 + len_size + dict.size() + 1;
  if ((total + 63) / 64 * 64 - (kMagicLen + 2 + len_size) > 0xffff) {
    len_size = 4;
    total = kMagicLen + 2 + len_size + dict.size() + 1;
  }
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict.push_back('\n');
  // Filled by memcpy into a presized buffer (GCC 12 warns falsely on chained inserts).
  const size_t prefix = kMagicLen + 2 + len_size;
  std::vector<uint8_t> out(prefix + dict.size() + a.data.size());
  std::memcpy(out.data(), kMagic, kMagicLen);
  out[6] = len_size == 2 ? 1 : 2;
  out[7] = 0;
  for (size_t i = 0; i < len_size; ++i) out[8 + i] = static_cast<uint8_t>(dict.size() >> (8 * i));
  std::memcpy(out.data() + prefix, dict.data(), dict.size());
  if (!a.data.empty()) std::memcpy(out.data() + prefix + dict.size(), a.data.data(), a.data.size());
  return out;
}

}  // namespace qvg
