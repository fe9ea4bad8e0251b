// Raw file access (qvg/file.h): whole-file and offset reads of regular files, and
// the atomic (temp + fsync + rename) write rule.
#include "qvg/file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include <fmt/core.h>

#include "core/file_impl.h"
#include "qvg/error.h"

namespace qvg {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Closes the descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void cannot_read(const std::filesystem::path& path, const std::string& why) {
  throw InvalidArgument(fmt::format("cannot read '{}': {}", detail::path_text(path), why));
}

// Writes all of `bytes` to fd; returns 0 or the errno of the failing write.
int write_all(int fd, std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

[[noreturn]] void cannot_write(const std::filesystem::path& path, const std::string& why) {
  throw InvalidArgument(fmt::format("cannot write '{}': {}", detail::path_text(path), why));
}

const char* file_kind(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO (named pipe)"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a regular file";
}

// A path holding a NUL byte names another file to the system (its C string ends at
// the NUL: "dir/victim\0.snap" is "dir/victim"): refused before anything is opened or
// created (qvg/file.h, "Paths").
void check_no_nul(const std::filesystem::path& path, bool write) {
  const std::string& s = path.native();
  const size_t z = s.find('\0');
  if (z == std::string::npos) return;
  throw InvalidArgument(fmt::format("cannot {} '{}': the path holds a NUL byte at byte {} (no file name can hold one)",
                                    write ? "write" : "read", detail::path_text(path), z));
}

// The temporary write_file_atomic writes for `dest`: "<name>.tmp.<pid>.<n>" in the
// destination's directory, the name cut so that the whole fits in NAME_MAX (255)
// bytes — a destination name of up to 255 bytes is valid, its temporary must be too
// (qvg/file.h).
std::string temporary_for(const std::filesystem::path& dest, unsigned n) {
  const std::string suffix = fmt::format(".tmp.{}.{}", static_cast<long>(::getpid()), n);
  std::string name = dest.filename().string();
  const size_t room = NAME_MAX > suffix.size() ? NAME_MAX - suffix.size() : 0;
  if (name.size() > room) name.resize(room);
  return (dest.parent_path() / (name + suffix)).string();
}

constexpr const char* kAllowed = "a destination must be a regular file, a symlink to one, or a new name";

// The file write_file_atomic replaces for `path`: `path` itself when it does not
// exist or is a regular file; the final target of a symlink whose target is a
// regular file (followed: the target is replaced, the link stays). Anything else —
// a FIFO, device, socket or directory, directly or behind a symlink, or a symlink
// whose target does not exist — is refused before anything is created. A path
// that cannot be examined (a missing parent, a denied search) is returned as it is:
// creating the temporary file reports the error.
std::filesystem::path destination_of(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return path;
  if (S_ISREG(st.st_mode)) return path;
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
    if (::stat(path.c_str(), &st) != 0) {
      const int e = errno;
      cannot_write(path, e == ENOENT
                             ? fmt::format("a symlink to '{}', which does not exist ({})", target.string(), kAllowed)
                             : fmt::format("a symlink that cannot be followed: {}", errno_text(e)));
    }
    if (!S_ISREG(st.st_mode))
      cannot_write(path, fmt::format("a symlink to {}, not a regular file ({})", file_kind(st.st_mode), kAllowed));
    std::filesystem::path resolved = std::filesystem::canonical(path, ec);
    if (ec) cannot_write(path, fmt::format("a symlink that cannot be resolved: {}", ec.message()));
    return resolved;
  }
  cannot_write(path, fmt::format("{}, not a regular file ({})", file_kind(st.st_mode), kAllowed));
}

}  // namespace

namespace detail {

ReadOnlyFile::ReadOnlyFile(const std::filesystem::path& path) : path_(path) {
  check_no_nul(path, false);
  // O_NONBLOCK: opening a FIFO (or a device) for reading must not wait for a writer;
  // the file type is checked on the descriptor, so there is no stat/open race.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) cannot_read(path, errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    cannot_read(path, errno_text(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    cannot_read(path, S_ISDIR(st.st_mode)    ? "a directory, not a regular file"
                      : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe), not a regular file"
                                             : "not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t ReadOnlyFile::read_some(uint64_t offset, void* dst, size_t n) const {
  for (;;) {
    const ssize_t r = ::pread(fd_, dst, n, static_cast<off_t>(offset));
    if (r >= 0) return static_cast<size_t>(r);
    if (errno != EINTR && errno != EAGAIN) cannot_read(path_, errno_text(errno));
  }
}

bool ReadOnlyFile::read_at(uint64_t offset, void* dst, size_t n) const {
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < n) {
    const size_t r = read_some(offset + done, out + done, n - done);
    if (r == 0) return false;  // the file shrank since it was opened
    done += r;
  }
  return true;
}

std::vector<uint8_t> ReadOnlyFile::read_all() const {
  std::vector<uint8_t> out;
  try {
    out.resize(static_cast<size_t>(size_));
  } catch (const std::bad_alloc&) {
    cannot_read(path_, fmt::format("its {} bytes do not fit in memory", size_));
  } catch (const std::length_error&) {
    cannot_read(path_, fmt::format("its {} bytes do not fit in memory", size_));
  }
  size_t done = 0;
  while (done < out.size()) {
    const size_t r = read_some(done, out.data() + done, out.size() - done);
    if (r == 0) break;  // the file shrank while we read it
    done += r;
  }
  out.resize(done);
  return out;
}

std::optional<uint64_t> ReadOnlyFile::append_text(uint64_t offset, uint64_t n, std::vector<uint8_t>& out) const {
  constexpr uint64_t kPiece = uint64_t(1) << 16;
  for (uint64_t done = 0; done < n;) {
    const size_t want = static_cast<size_t>(std::min(kPiece, n - done));
    const size_t at = out.size();
    out.resize(at + want);
    const size_t got = read_some(offset + done, out.data() + at, want);
    out.resize(at + got);
    if (got == 0) return std::nullopt;  // the file ends (shrank): the parser reports it
    if (const void* z = std::memchr(out.data() + at, 0, got))
      return offset + done + uint64_t(static_cast<const uint8_t*>(z) - (out.data() + at));
    done += got;
  }
  return std::nullopt;
}

}  // namespace detail

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  return detail::ReadOnlyFile(path).read_all();
}

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  const std::span<const uint8_t> one[] = {bytes};
  write_file_atomic(path, std::span<const std::span<const uint8_t>>(one));
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const uint8_t>> pieces) {
  static std::atomic<unsigned> counter{0};
  check_no_nul(path, true);
  const std::filesystem::path dest = destination_of(path);  // refuses what is not a regular file
  const std::string tmp = temporary_for(dest, counter++);
  // A file replaced keeps its permission bits (and, where the process may set them,
  // its owner and group); a new file gets 0666 less the process's umask (qvg/file.h,
  // "Permissions"). Set-user-ID, set-group-ID and sticky bits are not carried over.
  struct stat old {};
  const bool replaces = ::stat(dest.c_str(), &old) == 0 && S_ISREG(old.st_mode);
  auto fail = [&](const char* what, int e) {
    ::unlink(tmp.c_str());
    if (e == EFBIG)  // RLIMIT_FSIZE (with SIGXFSZ ignored) or the file system's maximum
      cannot_write(path, fmt::format("file too large: it exceeds the file-size limit (ulimit -f) or the file "
                                     "system's maximum file size ({})",
                                     what));
    cannot_write(path, fmt::format("{} ({})", errno_text(e), what));
  };
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f.fd < 0) cannot_write(path, errno_text(errno));
    if (replaces) {
      // Best effort: only root may give a file away (or a member take its group).
      if ((old.st_uid != ::geteuid() || old.st_gid != ::getegid()) && ::fchown(f.fd, old.st_uid, old.st_gid) != 0) {
      }
      if (::fchmod(f.fd, old.st_mode & 0777) != 0) fail("fchmod", errno);
    }
    for (std::span<const uint8_t> p : pieces)
      if (const int e = write_all(f.fd, p)) fail("write", e);
    if (::fsync(f.fd) != 0) fail("fsync", errno);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) fail("close", errno);
  }
  if (::rename(tmp.c_str(), dest.c_str()) != 0) fail("rename", errno);
  // Make the rename itself durable (best effort: some filesystems refuse fsync on a
  // directory; the file is in place either way).
  std::filesystem::path dir = dest.parent_path();
  if (dir.empty()) dir = ".";
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0) (void)::fsync(d.fd);
}

}  // namespace qvg
