// src/core/file_impl.h — private: a read-only regular file read at offsets (readers
// that need only part of a file, e.g. `qvg inspect` and the snapshot reader), and the
// path prefix of every path-taking reader's errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

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
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// f(), with "'<path>': " in front of the message of a CorruptData or InvalidArgument
/// it throws (the kind kept): how every path-taking reader reports errors.
template <class F>
auto with_path(const std::filesystem::path& path, F&& f) {
  try {
    return f();
  } catch (const CorruptData& e) {
    throw CorruptData(fmt::format("'{}': {}", path.string(), e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("'{}': {}", path.string(), e.what()));
  }
}

}  // namespace qvg::detail
