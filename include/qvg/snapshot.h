// qvg/snapshot.h — cache snapshot files (docs/snapshot.md): what a caller of load()
// expects of one, and what `qvg inspect` shows of one without loading its payload.
//
// Saving and loading are members of the two caches (qvg/cache.h, which includes this
// header), with one contract:
//   save(path)             writes the cache — configuration, cursors, its buffers or
//                          segments as in memory, format version, XXH64 checksums —
//                          atomically (qvg/file.h: a crash leaves the previous file);
//                          InvalidArgument naming the path on an I/O error; the cache
//                          is unchanged either way.
//   snapshot_bytes()       the bytes save() writes.
//   load(path, expect)     a cache equal to the saved one: every later call returns the
//   from_snapshot_bytes()  same views, cursors and resident_nbytes(). CorruptData
//                          naming the section for a truncated, corrupted or foreign
//                          file (nothing is built; allocation is bounded by the file's
//                          size); InvalidArgument for an unreadable path, a snapshot of
//                          the other cache kind, or one that differs from `expect`
//                          (naming the field).
//
// A snapshot is little-endian and says so (a byte-order mark in its header); it
// holds a format version major.minor, and readers refuse a newer major version.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "qvg/cache_options.h"
#include "qvg/code_format.h"
#include "qvg/config.h"

namespace qvg {

/// The newest snapshot format this build reads and writes (docs/snapshot.md,
/// "Versions"; each setting's first version is its row's in the settings table,
/// qvg/settings.h): 1.0 both caches; 1.1 incremental spans (their mode and break
/// ratio, the span state and sections, segment flag 0x1); 1.2 head shards
/// (head_offset); 1.3 the scale search and per-role codec settings; 1.4 refinement
/// layers (their settings, segment flag 0x2); 1.5 a 3-bit residual (int3, from its
/// row in qvg/code_format.h). A writer writes the lowest version its
/// cache needs — the latest that introduced a setting whose value is not the
/// default (or, for a code width, the minor of its row: 1.5 for int3): 1.4 for refinement layers, else 1.3 for a scale
/// search or a per-role setting, else 1.2 for a head_offset other than 0, else 1.1 for incremental spans or a span
/// break ratio, else 1.0, byte for byte what a 1.0 writer wrote.
inline constexpr uint16_t kSnapshotMajor = 1;
/// The newest minor: kSnapshotMinorBeforeWidths (the newest of a form other than a
/// code width; a new form raises it and is described in src/cache/snapshot_format.h),
/// or the newest a code width needs (qvg/code_format.h: 1.5 for int3). A file holding
/// only other widths is written as before, in the lowest minor it needs.
inline constexpr uint16_t kSnapshotMinorBeforeWidths = 4;
inline constexpr uint16_t kSnapshotMinor = [] {
  uint16_t m = kSnapshotMinorBeforeWidths;
  for (const CodeFormat& f : kCodeFormats) m = f.snapshot_minor > m ? uint16_t(f.snapshot_minor) : m;
  return m;
}();

/// What a caller of load() expects of a snapshot, and the runtime settings of the
/// loaded cache (which a snapshot does not hold).
struct SnapshotExpectation {
  /// When set, the snapshot's constructor options must equal these: batch,
  /// cache_size, num_heads, head_dim, dtype, sink_tokens, attention_window_size (an
  /// absent window equals one of cache_size), allow_growth, head_offset. Else
  /// InvalidArgument naming the first differing field. (view_scratch is not compared.)
  std::optional<CacheOptions> options;
  /// Packed caches: when set, the snapshot's QuantArgs must equal these, every field
  /// but threads (InvalidArgument naming the first differing field).
  std::optional<QuantArgs> quant;
  /// The loaded cache's view memory (CacheOptions::view_scratch); nullptr: its own.
  std::shared_ptr<ViewScratch> view_scratch;
  /// Packed caches: QuantArgs::threads of the loaded cache (0..max_threads()).
  int threads = 0;
};

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
