// src/io/io_util.h — private helpers of the file readers/writers. The byte-level
// helpers (overflow-checked sizes, little-endian integers, quoting) live in core
// (src/core/bytes_impl.h), shared with the cache snapshots; this adds what only the
// path-taking readers need. Not part of the public API.
#pragma once

#include <filesystem>
#include <vector>

#include <fmt/core.h>

#include "core/bytes_impl.h"
#include "core/file_impl.h"
#include "qvg/error.h"

namespace qvg::io_detail {

using detail::append_le;
using detail::checked_mul;
using detail::checked_nbytes;
using detail::load_le16;
using detail::load_le32;
using detail::load_le64;
using detail::printable;

/// parse(bytes) with the path in front of the message of a CorruptData or
/// InvalidArgument it throws (detail::with_path).
template <class Parse>
auto parse_with_path(const std::filesystem::path& path, const std::vector<uint8_t>& bytes, Parse&& parse) {
  return detail::with_path(path, [&] { return parse(bytes); });
}

}  // namespace qvg::io_detail
