// What `qvg inspect` shows of a snapshot (qvg/snapshot.h): its header, table, config
// and state, and each section's checksum status, without loading the payload.
#include <algorithm>
#include <array>
#include <vector>

#include "cache/snapshot_entries.h"
#include "cache/snapshot_io.h"
#include "core/checksum_impl.h"
#include "core/file_impl.h"
#include "qvg/snapshot.h"

namespace qvg {

namespace {

using namespace detail::snap;

/// Sections other than config and state are streamed through their checksum in
/// pieces of this size.
constexpr uint64_t kStreamBytes = uint64_t(1) << 20;

SnapshotInfo inspect_source(const Source& src, bool verify) {
  const Table t = read_table(src);
  SnapshotInfo info;
  info.major = t.major;
  info.minor = t.minor;
  info.file_bytes = src.size();
  for (const TableEntry& e : t.entries) {
    SnapshotSectionInfo s{e.name(), e.offset, e.length, e.checksum, std::nullopt};
    const bool entries = e.kind == uint32_t(Kind::Config) || e.kind == uint32_t(Kind::State);
    if (entries) {
      // Read (they are small: bounded by the file) and shown when intact.
      std::vector<uint8_t> b(size_t(e.length));
      src.read(e.offset, b.data(), b.size());
      s.checksum_ok = detail::xxh64(b) == e.checksum;
      if (*s.checksum_ok) {
        try {
          for (auto& [k, v] : read_entries(b, s.name))
            (e.kind == uint32_t(Kind::Config) ? info.config : info.state).emplace_back(k, v.text());
        } catch (const CorruptData&) {
          s.checksum_ok = false;  // intact bytes that do not parse: shown as unreadable
        }
      }
    } else if (verify) {
      detail::Xxh64Stream h;
      std::vector<uint8_t> chunk(size_t(std::min(e.length, kStreamBytes)));
      for (uint64_t done = 0; done < e.length;) {
        const size_t n = size_t(std::min<uint64_t>(chunk.size(), e.length - done));
        src.read(e.offset + done, chunk.data(), n);
        h.update({chunk.data(), n});
        done += n;
      }
      s.checksum_ok = h.digest() == e.checksum;
    }
    info.sections.push_back(std::move(s));
  }
  for (const auto& [k, v] : info.config) {
    if (k == "cache") info.cache = v;
    if (k == "device") info.device = v;
  }
  return info;
}

}  // namespace

bool SnapshotInfo::checksums_ok() const {
  return std::all_of(sections.begin(), sections.end(),
                     [](const SnapshotSectionInfo& s) { return s.checksum_ok.value_or(false); });
}

bool is_snapshot_bytes(std::span<const uint8_t> bytes) {
  return has_magic(bytes);
}

bool is_snapshot_file(const std::filesystem::path& path) {
  try {
    const detail::ReadOnlyFile f(path);
    std::array<uint8_t, kMagic.size()> m{};
    return f.size() >= m.size() && f.read_at(0, m.data(), m.size()) && has_magic(m);
  } catch (const Error&) {
    return false;
  }
}

SnapshotInfo inspect_snapshot(const std::filesystem::path& path, bool verify_checksums) {
  return detail::with_path(path, [&] {
    const FileSource src(path);
    return inspect_source(src, verify_checksums);
  });
}

SnapshotInfo inspect_snapshot_bytes(std::span<const uint8_t> bytes, bool verify_checksums) {
  return inspect_source(MemorySource(bytes), verify_checksums);
}

}  // namespace qvg
