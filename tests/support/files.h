// tests/support/files.h — temporary directories and whole-file reads/writes for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qvg::testing {

/// A fresh directory under the system temp dir (named after `tag`, the process and
/// a counter), removed with everything in it at the end of its scope.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "qvg_test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }
  size_t entries() const;  ///< files and directories directly inside

 private:
  std::filesystem::path path_;
};

/// The whole file (empty when it cannot be read).
std::vector<uint8_t> file_bytes(const std::filesystem::path& p);
/// Writes `b` to `p` (plainly, not atomically: tests use it to plant files).
void put_file(const std::filesystem::path& p, const std::vector<uint8_t>& b);

/// A safetensors file: the 8-byte little-endian length of `header`, the header text,
/// then `data_bytes` zero bytes.
std::vector<uint8_t> st_bytes(const std::string& header, size_t data_bytes = 0);

}  // namespace qvg::testing
