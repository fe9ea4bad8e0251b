// src/io/io_util.h — private helpers of the file readers/writers: overflow-checked
// sizes and little-endian integer access. Not part of the public API.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg::io_detail {

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

inline uint16_t load_le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
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
inline void append_le(std::vector<uint8_t>& out, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

/// `s` with control and non-ASCII bytes escaped, cut to `max` characters: for quoting
/// untrusted file content in error messages.
/// parse(bytes) with the path in front of the message of a CorruptData or
/// InvalidArgument it throws (as every path-taking reader reports errors).
template <class Parse>
auto parse_with_path(const std::filesystem::path& path, const std::vector<uint8_t>& bytes, Parse&& parse) {
  try {
    return parse(bytes);
  } catch (const CorruptData& e) {
    throw CorruptData(fmt::format("'{}': {}", path.string(), e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("'{}': {}", path.string(), e.what()));
  }
}

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

}  // namespace qvg::io_detail
