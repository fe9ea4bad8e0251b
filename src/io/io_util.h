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

/// The bytes of a `.npy` file, read whole only once its header is checked against the
/// file's size (spec 5.1, "Files"; qvg/io.h): the magic, version and header length,
/// then the dict (read as text: a NUL byte ends it after at most 64 KiB), its dtype and
/// shape, and that the data fills the rest of the file exactly. Throws what parse_npy
/// throws on that header.
std::vector<uint8_t> read_npy_bytes(const detail::ReadOnlyFile& f);

}  // namespace qvg::io_detail
