// Raw file access: whole-file reads and atomic (temp + rename) writes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/core.h>

#include "qvg/error.h"
#include "qvg/io.h"

namespace qvg {

namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

// Closes the descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw InvalidArgument(fmt::format("cannot read '{}': {}", path.string(), errno_text(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    throw InvalidArgument(fmt::format("cannot read '{}': {}", path.string(), errno_text(errno)));
  if (!S_ISREG(st.st_mode)) throw InvalidArgument(fmt::format("cannot read '{}': not a regular file", path.string()));
  std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(f.fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument(fmt::format("cannot read '{}': {}", path.string(), errno_text(errno)));
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path.string(), static_cast<long>(::getpid()), counter++);
  auto fail = [&](const char* what, int e) {
    ::unlink(tmp.c_str());
    throw InvalidArgument(fmt::format("cannot write '{}': {} ({})", path.string(), errno_text(e), what));
  };
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f.fd < 0) throw InvalidArgument(fmt::format("cannot write '{}': {}", path.string(), errno_text(errno)));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write", errno);
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(f.fd) != 0) fail("fsync", errno);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) fail("close", errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", errno);
}

}  // namespace qvg
