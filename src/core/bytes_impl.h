// src/core/bytes_impl.h — private helpers of every reader and writer of qvg's binary
// files (tensor files, `.qvgt`, cache snapshots): overflow-checked sizes,
// little-endian integers, a bounds-checked little-endian cursor over untrusted bytes
// and quoting of untrusted text in error messages. Header-only, not public API.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg::detail {

static_assert(std::endian::native == std::endian::little,
              "qvg file formats are little-endian; big-endian hosts are not supported");

/// a * b, or nullopt if it overflows uint64.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// Product of `dims` (all >= 0) times `elem_size`, or nullopt on overflow (or a
/// result beyond what size_t / int64 can index).
inline std::optional<uint64_t> checked_nbytes(std::span<const int64_t> dims, uint64_t elem_size) {
  uint64_t n = elem_size;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto m = checked_mul(n, static_cast<uint64_t>(d));
    if (!m) return std::nullopt;
    n = *m;
  }
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return n;
}

inline uint16_t load_le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t load_le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store_le64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline void append_le(std::vector<uint8_t>& out, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

/// `s` with control and non-ASCII bytes escaped, cut to `max` characters: for quoting
/// untrusted file content in error messages.
inline std::string printable(std::string_view s, size_t max = 64) {
  std::string r;
  size_t i = 0;
  for (; i < s.size() && r.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      r.push_back(static_cast<char>(c));
    } else {
      static const char* hex = "0123456789abcdef";
      r += "\\x";
      r.push_back(hex[c >> 4]);
      r.push_back(hex[c & 15]);
    }
  }
  if (i < s.size()) r += "...";
  return r;
}

/// Appends little-endian fields to a byte vector.
class ByteWriter {
 public:
  template <class T>
    requires std::is_integral_v<T>
  void put(T v) {
    append_le(out_, static_cast<uint64_t>(static_cast<std::make_unsigned_t<T>>(v)), int(sizeof(T)));
  }
  void put_bool(bool v) { out_.push_back(v ? 1 : 0); }
  /// u32 length + bytes.
  void put_str(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void put_bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

/// Reads little-endian fields from untrusted bytes; every read past the end throws
/// CorruptData "<context>: truncated ...". Never reads outside the span.
class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> b, std::string context) : b_(b), ctx_(std::move(context)) {}

  template <class T>
    requires std::is_integral_v<T>
  T get(const char* field) {
    need(sizeof(T), field);
    std::make_unsigned_t<T> u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) u = static_cast<decltype(u)>(u | (decltype(u)(b_[pos_ + i]) << (8 * i)));
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }
  bool get_bool(const char* field) {
    const uint8_t v = get<uint8_t>(field);
    if (v > 1) fail(fmt::format("{} must be 0 or 1, got {}", field, v));
    return v == 1;
  }
  /// A u32-length-prefixed string of at most max_len bytes.
  std::string get_str(const char* field, size_t max_len = 256) {
    const uint32_t n = get<uint32_t>(field);
    if (n > max_len) fail(fmt::format("{} is {} bytes long, at most {} allowed", field, n, max_len));
    need(n, field);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  /// The next n bytes (a view into the input).
  std::span<const uint8_t> get_bytes(size_t n, const char* field) {
    need(n, field);
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t remaining() const { return b_.size() - pos_; }
  size_t pos() const { return pos_; }
  /// Throws unless every byte was consumed.
  void expect_end() const {
    if (pos_ != b_.size()) fail(fmt::format("{} unexpected trailing bytes", b_.size() - pos_));
  }
  [[noreturn]] void fail(const std::string& what) const { throw CorruptData(fmt::format("{}: {}", ctx_, what)); }
  const std::string& context() const { return ctx_; }

 private:
  void need(size_t n, const char* field) const {
    if (n > b_.size() - pos_)
      fail(fmt::format("truncated: {} needs {} bytes at offset {}, {} left", field, n, pos_, b_.size() - pos_));
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  std::string ctx_;
};

}  // namespace qvg::detail
