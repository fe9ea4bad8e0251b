// Write destinations and data written through lent views (spec 5.1, "Files" and
// "Aliasing"; docs/reliability.md, findings 14, 15 and 16; finding 17 is a CLI test,
// tests/cli/compare_flags.sh).
//  * WriterDestination: a writer refuses a destination that exists and is not a regular
//    file (FIFO, a symlink to one, a directory); a symlink to a regular file is
//    followed (the target is replaced, the link stays).
//  * WriterFileSizeLimit: under a file-size limit (SIGXFSZ ignored, as the CLI does)
//    the writer reports EFBIG as the size limit and removes its temporary file.
//  * LentViewWrites: stored data made non-finite through a lent zero-copy view: the
//    advance that would encode it throws InvalidArgument naming the stored chunk
//    before any change; the dense cache and the unquantized packed cache (which
//    encode nothing) are not affected.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "qvg/cache.h"
#include "qvg/detail/test_access.h"
#include "qvg/error.h"
#include "qvg/file.h"
#include "qvg/io.h"
#include "support/data.h"
#include "support/files.h"

namespace qvg {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Names in `dir` other than `keep` (temporaries a writer left behind).
std::vector<std::string> other_entries(const fs::path& dir, const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), n) == keep.end()) out.push_back(n);
  }
  return out;
}

const std::vector<uint8_t> kBytes = {1, 2, 3, 4, 5};

// Expects write_file_atomic(path) to throw InvalidArgument whose message names the
// path and `what`; returns the message.
std::string expect_refused(const fs::path& path, const std::string& what) {
  try {
    write_file_atomic(path, kBytes);
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path.string()), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
    EXPECT_NE(m.find("regular file"), std::string::npos) << m;  // what is allowed
    return m;
  }
  ADD_FAILURE() << "write to " << path << " was not refused";
  return {};
}

TEST(WriterDestination, WriterRefusesAFifo) {
  TempDir d("qvg_f14");
  const fs::path fifo = d / "out.qvgt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  expect_refused(fifo, "FIFO");
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));  // still the FIFO
  EXPECT_EQ(other_entries(d.path(), {"out.qvgt"}), std::vector<std::string>{});
}

TEST(WriterDestination, WriterRefusesASymlinkToAFifo) {
  TempDir d("qvg_f14");
  const fs::path fifo = d / "pipe", link = d / "out.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  fs::create_symlink(fifo, link);
  expect_refused(link, "FIFO");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));  // the link stays a link ...
  EXPECT_TRUE(fs::is_fifo(fs::status(link)));             // ... to the FIFO
  EXPECT_EQ(other_entries(d.path(), {"pipe", "out.npy"}), std::vector<std::string>{});
}

TEST(WriterDestination, WriterRefusesADirectoryAndADanglingSymlink) {
  TempDir d("qvg_f14");
  const fs::path dir = d / "out.qvgt";
  fs::create_directory(dir);
  expect_refused(dir, "directory");
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  const fs::path dangling = d / "dangling.npy";
  fs::create_symlink(d / "missing", dangling);
  expect_refused(dangling, "does not exist");
  EXPECT_FALSE(fs::exists(d / "missing"));  // nothing created
  EXPECT_EQ(other_entries(d.path(), {"out.qvgt", "dangling.npy"}), std::vector<std::string>{});
}

TEST(WriterDestination, CharDeviceIsRefusedWithoutTouchingIt) {
  // As root the old writer replaced /dev/null with a regular file. /dev/null itself
  // is never risked: as root (mknod allowed) a device node with /dev/null's numbers
  // is made in a temp dir; otherwise /dev/null is used only where /dev is not
  // writable (the refusal comes before anything is created next to it).
  TempDir d("qvg_f14");
  fs::path dev = d / "null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    if (::access("/dev", W_OK) == 0) GTEST_SKIP() << "mknod refused and /dev is writable: not risking /dev/null";
    if (!fs::is_character_file("/dev/null")) GTEST_SKIP() << "no /dev/null";
    dev = "/dev/null";
  }
  expect_refused(dev, "character device");
  EXPECT_TRUE(fs::is_character_file(fs::symlink_status(dev)));
  EXPECT_EQ(other_entries(d.path(), {"null"}), std::vector<std::string>{});
}

TEST(WriterDestination, SymlinkToARegularFileIsFollowed) {
  TempDir d("qvg_f14");
  fs::create_directory(d / "sub");
  const fs::path target = d / "sub" / "real.bin", link = d / "link.bin";
  testing::put_file(target, {9, 9});
  fs::create_symlink(fs::path("sub") / "real.bin", link);  // relative to the link's directory
  write_file_atomic(link, kBytes);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));  // the link stays ...
  EXPECT_EQ(testing::file_bytes(target), kBytes);         // ... and the target holds the bytes
  EXPECT_EQ(other_entries(d.path(), {"sub", "link.bin"}), std::vector<std::string>{});
  EXPECT_EQ(other_entries(d / "sub", {"real.bin"}), std::vector<std::string>{});
  // A plain regular file is still replaced, and a new one created.
  write_file_atomic(target, std::vector<uint8_t>{7});
  EXPECT_EQ(testing::file_bytes(target), std::vector<uint8_t>{7});
  write_file_atomic(d / "new.bin", kBytes);
  EXPECT_EQ(testing::file_bytes(d / "new.bin"), kBytes);
}

TEST(WriterDestination, CacheSaveAndTensorWritersRefuseAFifo) {
  TempDir d("qvg_f14");
  const fs::path fifo = d / "snap.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  CacheOptions o;
  o.batch = 1;
  o.heads = 1;
  o.head_dim = 8;
  o.cache_size = 8;
  o.dtype = DType::F32;
  PackedCausalCache c(o);
  const Tensor k = testing::random_tensor({1, 4, 1, 8}, DType::F32, 1);
  c.update(k, k, 0);
  EXPECT_THROW(c.save(fifo), InvalidArgument);
  DenseCausalCache dc(o);
  dc.update(k, k, 0);
  EXPECT_THROW(dc.save(fifo), InvalidArgument);
  EXPECT_THROW(write_tensor_file(fifo, k), InvalidArgument);
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
  EXPECT_EQ(other_entries(d.path(), {"snap.npy"}), std::vector<std::string>{});
}

// ---- finding 15: a write beyond the file-size limit -------------------------------
TEST(WriterFileSizeLimit, FileSizeLimitIsReportedAndTheTemporaryRemoved) {
  TempDir d("qvg_f15");
  const fs::path out = d / "big.bin";
  // In a child: the signal ignored (as the CLI does) and a 4 KiB limit; the write
  // of 64 KiB must fail with the size limit named and leave nothing behind.
  EXPECT_EXIT(
      {
        std::signal(SIGXFSZ, SIG_IGN);
        struct rlimit r {};
        r.rlim_cur = r.rlim_max = 4096;
        if (::setrlimit(RLIMIT_FSIZE, &r) != 0) std::_Exit(3);
        const std::vector<uint8_t> big(65536, 7);
        try {
          write_file_atomic(out, big);
        } catch (const InvalidArgument& e) {
          const std::string m = e.what();
          const bool named =
              m.find("file-size limit") != std::string::npos && m.find(out.string()) != std::string::npos;
          const bool clean = fs::is_empty(d.path());
          std::fprintf(stderr, "%s\n", m.c_str());
          std::_Exit(named && clean ? 0 : 4);
        }
        std::_Exit(5);
      },
      ::testing::ExitedWithCode(0), "file-size limit");
  EXPECT_TRUE(fs::is_empty(d.path()));
}

// ---- finding 16: stored data written through a lent view --------------------------
CacheOptions f16_opts() {
  CacheOptions o;
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 8;
  o.dtype = DType::F32;
  o.sink_tokens = 0;
  o.cache_size = 48;  // 3 chunks of 16
  return o;
}

QuantArgs f16_quant(int keep_recent) {
  QuantArgs q;
  q.enable(2);
  q.codec.centroids = 4;
  q.codec.block_size = 8;
  q.keep_recent_chunks = keep_recent;
  return q;
}

std::string fmt_range(int64_t g0, int64_t g1) {
  return "[" + std::to_string(g0) + ", " + std::to_string(g1) + ")";
}

Tensor chunk(uint64_t seed) {
  return testing::random_tensor({1, 16, 2, 8}, DType::F32, seed);
}

// Writes `x` into channel 3 of token `t`, head 0, of a lent zero-copy view's K
// (the caller's write).
void write_through(const KVView& v, int64_t t, float x) {
  EXPECT_TRUE(v.zero_copy);
  auto* p = static_cast<float*>(const_cast<void*>(v.k.data));
  p[t * v.k.stride_t + 3] = x;
}

// The next advance must throw InvalidArgument naming the stored chunk [g0, g1) and
// the lent view, and change nothing.
void expect_refused_advance(PackedCausalCache& c, int64_t at, int64_t g0, int64_t g1, uint64_t seed) {
  const auto before = qvg::detail::debug_state(c);
  const int64_t ge = c.global_end();
  const size_t resident = c.resident_nbytes();
  const Tensor k = chunk(seed);  // finite
  try {
    c.update(k, k, at);
    ADD_FAILURE() << "advance at " << at << " did not throw";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt_range(g0, g1)), std::string::npos) << m;
    EXPECT_NE(m.find("zero-copy view"), std::string::npos) << m;
    EXPECT_NE(m.find("stored"), std::string::npos) << m;
    EXPECT_EQ(m.find("input must hold"), std::string::npos) << m;  // not blamed on the input
  }
  EXPECT_EQ(c.global_end(), ge);
  EXPECT_EQ(c.resident_nbytes(), resident);
  EXPECT_TRUE(qvg::detail::debug_state(c) == before);
}

TEST(LentViewWrites, NanWrittenThroughAZeroCopyViewIsRefusedBeforeAnyChange) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e30f}) {
    SCOPED_TRACE(bad);
    PackedCausalCache c(f16_opts(), f16_quant(0));
    c.update(chunk(1), chunk(2), 0);
    c.update(chunk(3), chunk(4), 16);
    c.update(chunk(5), chunk(6), 32);
    const KVView vw = c.update(chunk(7), chunk(8), 48, std::nullopt, 0);  // the current chunk, lent
    ASSERT_TRUE(vw.zero_copy);
    write_through(vw, 5, bad);
    // Every advance encodes [48, 64): refused, naming it, nothing changes (twice).
    expect_refused_advance(c, 64, 48, 64, 9);
    expect_refused_advance(c, 64, 48, 64, 10);
    // The remedy the message names: a rewrite of the current chunk, then advances go on.
    c.update(chunk(11), chunk(12), 48);
    c.update(chunk(13), chunk(14), 64);
    EXPECT_EQ(c.global_end(), 80);
  }
}

TEST(LentViewWrites, ARawChunkKeptBehindTheCurrentOneIsCheckedWhenItIsEncoded) {
  // keep_recent_chunks 1: the lent chunk [16, 32) stays raw after the next advance
  // and is encoded by the one after it.
  PackedCausalCache c(f16_opts(), f16_quant(1));
  c.update(chunk(1), chunk(2), 0);
  const KVView vw = c.update(chunk(3), chunk(4), 16, std::nullopt, 0);
  ASSERT_TRUE(vw.zero_copy);
  // [16, 32) is kept raw by the next advance (nothing to encode yet); the view
  // still aliases it.
  c.update(chunk(5), chunk(6), 32);
  write_through(vw, 0, std::numeric_limits<float>::quiet_NaN());
  expect_refused_advance(c, 48, 16, 32, 7);
  // The cache cannot go on with it: reset_indices() starts over.
  c.reset_indices();
  c.update(chunk(1), chunk(2), 0);
  EXPECT_EQ(c.global_end(), 16);
}

TEST(LentViewWrites, CachesThatEncodeNothingAreNotAffected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  {  // packed, quantization off: the NaN is stored and shown as written
    PackedCausalCache c(f16_opts());
    c.update(chunk(1), chunk(2), 0);
    const KVView vw = c.update(chunk(3), chunk(4), 16, std::nullopt, 0);
    write_through(vw, 2, nan);
    const KVView next = c.update(chunk(5), chunk(6), 32);
    EXPECT_EQ(c.global_end(), 48);
    EXPECT_TRUE(std::isnan(next.k.at(0, 18, 0, 3)));
  }
  {  // dense
    DenseCausalCache c(f16_opts());
    c.update(chunk(1), chunk(2), 0);
    const KVView vw = c.update(chunk(3), chunk(4), 16);
    ASSERT_TRUE(vw.zero_copy);
    auto* p = static_cast<float*>(const_cast<void*>(vw.k.data));
    p[3] = nan;
    c.update(chunk(5), chunk(6), 32);
    c.update(chunk(7), chunk(8), 48);
    EXPECT_EQ(c.global_end(), 64);
  }
}

}  // namespace
}  // namespace qvg
