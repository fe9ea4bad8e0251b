// src/core/file_impl.h — private: a read-only regular file read at offsets (readers
// that need only part of a file, e.g. `qvg inspect` and the snapshot reader), and the
// path prefix of every path-taking reader's errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg::detail {

/// An open regular file. Opening refuses anything but a regular file without
/// blocking (O_NONBLOCK, then fstat). Errors are InvalidArgument naming the path.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::filesystem::path& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  /// The size at open time.
  uint64_t size() const { return size_; }
  /// Reads exactly n bytes at `offset` into dst; returns false if the file ends first
  /// (it shrank since it was opened). Throws InvalidArgument on an I/O error.
  bool read_at(uint64_t offset, void* dst, size_t n) const;
  /// Reads up to n bytes at `offset`; returns how many (0 at the end of the file).
  size_t read_some(uint64_t offset, void* dst, size_t n) const;
  /// The whole file (size() bytes, fewer if it shrank since it was opened). A
  /// reader calls it only once the file's header has justified size() (qvg/io.h);
  /// an allocation that fails is InvalidArgument naming the path and the size.
  std::vector<uint8_t> read_all() const;
  /// Appends bytes [offset, offset + n) of a text header to `out`, read in pieces of
  /// at most 64 KiB, and stops after the first piece that holds a NUL byte, returning
  /// that byte's offset (a text header holds none: a zero-filled or sparse region is
  /// refused after one piece, never read whole); nullopt when all n bytes were
  /// appended. Returns early, without a NUL, if the file ends first.
  std::optional<uint64_t> append_text(uint64_t offset, uint64_t n, std::vector<uint8_t>& out) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// A path as messages print it: as it is, but a NUL byte written "\x00" (a message
/// must not end where the path's NUL is; qvg/file.h, "Paths").
inline std::string path_text(const std::filesystem::path& path) {
  std::string out;
  for (const char c : path.native()) {
    if (c == '\0')
      out += "\\x00";
    else
      out.push_back(c);
  }
  return out;
}

/// f(), with "'<path>': " in front of the message of a CorruptData or InvalidArgument
/// it throws (the kind kept): how every path-taking reader reports errors.
template <class F>
auto with_path(const std::filesystem::path& path, F&& f) {
  try {
    return f();
  } catch (const CorruptData& e) {
    throw CorruptData(fmt::format("'{}': {}", path_text(path), e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("'{}': {}", path_text(path), e.what()));
  }
}

}  // namespace qvg::detail
