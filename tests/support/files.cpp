#include "support/files.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>

namespace qvg::testing {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = fs::temp_directory_path() / (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

size_t TempDir::entries() const {
  return static_cast<size_t>(std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
}

std::vector<uint8_t> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_file(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> st_bytes(const std::string& header, size_t data_bytes) {
  // Filled by memcpy into a presized buffer (GCC 12 warns falsely on chained inserts).
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

}  // namespace qvg::testing
