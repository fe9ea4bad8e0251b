// qvg/snapshot.h — cache snapshot files (docs/snapshot.md): what `qvg inspect`
// shows of one without loading its payload. Saving and loading are members of the
// caches (qvg/cache.h: save(), load(), snapshot_bytes(), from_snapshot_bytes()).
//
// A snapshot is little-endian and says so (a byte-order mark in its header); it
// holds a format version major.minor, and readers refuse a newer major version.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace qvg {

/// The newest snapshot format this build reads and writes (docs/snapshot.md,
/// "Versions"). A writer writes the lowest version its cache needs: 1.2 for a
/// head_offset other than 0, 1.1 for incremental spans or a span break ratio, else
/// 1.0, byte for byte what a 1.0 writer wrote.
inline constexpr uint16_t kSnapshotMajor = 1;
inline constexpr uint16_t kSnapshotMinor = 4;

/// One section of a snapshot, as its table lists it.
struct SnapshotSectionInfo {
  std::string name;  ///< "config", "state", "buffer_k", "buffer_v", "span 0", "segment 3", "warm_k", "warm_v"
  uint64_t offset = 0, length = 0;  ///< bytes within the file
  uint64_t checksum = 0;            ///< XXH64 (seed 0) stored in the table
  std::optional<bool> checksum_ok;  ///< nullopt: not verified
};

/// The header, configuration and cursors of a snapshot, and its sections.
struct SnapshotInfo {
  uint16_t major = 0, minor = 0;
  uint64_t file_bytes = 0;
  std::string cache;   ///< "dense" | "packed" (empty when the config section is unreadable)
  std::string device;  ///< where the saved cache lived: "cpu" (snapshots of device caches: "cuda")
  /// The config and state sections' entries as text, in file order (empty when the
  /// section's checksum fails).
  std::vector<std::pair<std::string, std::string>> config, state;
  std::vector<SnapshotSectionInfo> sections;
  /// True when every section was verified and matched.
  bool checksums_ok() const;
};

/// True when `bytes` / the file starts with the snapshot magic. Never throws for a
/// short or unreadable file (false).
bool is_snapshot_bytes(std::span<const uint8_t> bytes);
bool is_snapshot_file(const std::filesystem::path& path);

/// Reads a snapshot's header, section table, config and state — not its payload.
/// With verify_checksums every section is also streamed through XXH64 (1 MiB at a
/// time) and its status recorded: a mismatch is reported in the result, not thrown.
/// Throws CorruptData (naming the part) when the header or table is unreadable, and
/// InvalidArgument when the path cannot be read.
SnapshotInfo inspect_snapshot(const std::filesystem::path& path, bool verify_checksums = true);
SnapshotInfo inspect_snapshot_bytes(std::span<const uint8_t> bytes, bool verify_checksums = true);

}  // namespace qvg
