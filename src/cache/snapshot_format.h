// src/cache/snapshot_format.h — private: the constants of the snapshot format
// (docs/snapshot.md, "Layout" and "Versions"), in the manner of LevelDB's
// log_format.h: every magic number, size, offset, section kind, segment flag, entry
// type and limit, and the format minor that introduced each addition. Nothing here
// reads or writes; the records' writers and readers are
//   snapshot_io       header, section table, checksums, sections of a file
//   snapshot_entries  the named, typed entries of the config and state sections
//   snapshot_encoding an encoding's layout and arrays inside a section
//   snapshot_config   the config record (driven by the settings tables)
//   snapshot_dense, snapshot_packed   the state records of the two caches
//   snapshot_validate the invariants of a loaded state
//   snapshot_inspect  `qvg inspect`; snapshot.cpp the caches' save/load entry points.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "qvg/snapshot.h"

namespace qvg::detail::snap {

// ---- versions -------------------------------------------------------------------
// The minor version that introduced each addition (kSnapshotMajor/kSnapshotMinor,
// qvg/snapshot.h, are the newest this build reads and writes). The settings of
// QuantArgs carry their own first minor in their table (qvg/settings.h).
inline constexpr uint16_t kMinorSpans = 1;       ///< incremental spans: span sections, flag 0x1, span state
inline constexpr uint16_t kMinorHeadOffset = 2;  ///< config entry head_offset
// 3: the scale search and the per-role settings (their rows in the settings table).
inline constexpr uint16_t kMinorRefinement = 4;  ///< refinement layers: flag 0x2 (refine_* in the settings table)
/// A code width's first minor is its row's (qvg/code_format.h: 5 for int3).
inline constexpr uint16_t kMinorCodeWidths = [] {
  uint16_t m = 0;
  for (const CodeFormat& f : kCodeFormats) m = f.snapshot_minor > m ? uint16_t(f.snapshot_minor) : m;
  return m;
}();
static_assert(kMinorRefinement == kSnapshotMinorBeforeWidths, "a new minor version is described here");
static_assert(kMinorCodeWidths == 0 || kMinorCodeWidths > kSnapshotMinorBeforeWidths,
              "a code width's minor is one no other form uses");

// ---- header (40 bytes) ----------------------------------------------------------
inline constexpr std::array<uint8_t, 8> kMagic = {0x89, 'Q', 'V', 'G', 'S', 'N', 'A', 'P'};
/// Stored little-endian as 04 03 02 01; a big-endian writer's file reads as the swap.
inline constexpr uint32_t kByteOrderMark = 0x01020304u;
inline constexpr uint32_t kByteOrderMarkSwapped = 0x04030201u;
inline constexpr size_t kMajorOffset = 8;            ///< u16
inline constexpr size_t kMinorOffset = 10;           ///< u16
inline constexpr size_t kByteOrderOffset = 12;       ///< u32
inline constexpr size_t kSectionCountOffset = 16;    ///< u32, at least kMinSections
inline constexpr size_t kReservedOffset = 20;        ///< u32, 0
inline constexpr size_t kFileSizeOffset = 24;        ///< u64, the whole file
inline constexpr size_t kHeaderChecksumOffset = 32;  ///< u64: XXH64 of [0, here) ++ the section table
inline constexpr size_t kHeaderBytes = 40;
static_assert(kMajorOffset == kMagic.size() && kMinorOffset == kMajorOffset + 2 &&
              kByteOrderOffset == kMinorOffset + 2 && kSectionCountOffset == kByteOrderOffset + 4 &&
              kReservedOffset == kSectionCountOffset + 4 && kFileSizeOffset == kReservedOffset + 4 &&
              kHeaderChecksumOffset == kFileSizeOffset + 8 && kHeaderBytes == kHeaderChecksumOffset + 8);

// ---- section table (from kHeaderBytes; the sections follow it, tiling the file) --
/// One entry: u32 kind, u32 index, u64 offset, u64 length, u64 XXH64 of the section.
inline constexpr size_t kTableEntryBytes = 32;
/// Every file starts with the config and the state section; its payload follows.
inline constexpr size_t kConfigSection = 0, kStateSection = 1, kPayloadSection = 2;
inline constexpr uint32_t kMinSections = kPayloadSection;

enum class Kind : uint32_t {
  Config = 1,
  State = 2,
  BufferK = 3,
  BufferV = 4,
  Segment = 5,
  WarmK = 6,
  WarmV = 7,
  Span = 8,
};

/// A section kind: its name (with the index for indexed kinds: "segment 3") and the
/// minor that introduced it. A reader refuses a kind its file's minor predates.
struct KindInfo {
  Kind kind;
  std::string_view name;
  bool indexed;  ///< the table's index names the section (segment i, span i); else 0
  uint16_t minor;
};
inline constexpr std::array<KindInfo, 8> kKinds = {{
    {Kind::Config, "config", false, 0},
    {Kind::State, "state", false, 0},
    {Kind::BufferK, "buffer_k", false, 0},
    {Kind::BufferV, "buffer_v", false, 0},
    {Kind::Segment, "segment", true, 0},
    {Kind::WarmK, "warm_k", false, 0},
    {Kind::WarmV, "warm_v", false, 0},
    {Kind::Span, "span", true, kMinorSpans},
}};
/// The row of a stored kind, or nullptr for a kind no version defines.
constexpr const KindInfo* kind_info(uint32_t kind) {
  for (const KindInfo& k : kKinds)
    if (uint32_t(k.kind) == kind) return &k;
  return nullptr;
}

// ---- segment flags (u32 in a segment section) -----------------------------------
/// A chunk of an incremental span; its span id (i64) follows the flags.
inline constexpr uint32_t kFlagSpanChunk = 0x1;
/// With kFlagSpanChunk: a refined chunk; its K and V refinement layers follow its encodings.
inline constexpr uint32_t kFlagRefined = 0x2;
struct FlagInfo {
  uint32_t bit;
  uint16_t minor;
};
inline constexpr std::array<FlagInfo, 2> kSegmentFlags = {
    {{kFlagSpanChunk, kMinorSpans}, {kFlagRefined, kMinorRefinement}}};
/// The segment flags a file of format 1.`minor` may hold.
constexpr uint32_t known_segment_flags(uint16_t minor) {
  uint32_t m = 0;
  for (const FlagInfo& f : kSegmentFlags)
    if (f.minor <= minor) m |= f.bit;
  return m;
}

// ---- entries of the config and state sections -----------------------------------
/// u32 count, then per entry a u32-length key, a u8 type and the value.
enum class VType : uint8_t {
  I64 = 1,
  U64 = 2,
  Bool = 3,  ///< one byte, 0 or 1
  Str = 4,   ///< u32 length and the bytes; also a real number (its shortest round-trip decimal)
  None = 5,  ///< no value
};
inline constexpr size_t kMaxEntries = 256;
inline constexpr size_t kMaxKey = 64;    ///< bytes of an entry key, and of a name inside an encoding's layout
inline constexpr size_t kMaxText = 256;  ///< bytes of a string value

// ---- encodings inside sections ----------------------------------------------------
/// Which arrays of an encoding a record holds after its layout: all of them; the
/// centroid arrays alone (warm-start state, span codebooks); all but the centroid
/// arrays (a chunk of an incremental span, whose centroids are its span's).
enum class Arrays { All, CodebooksOnly, WithoutCodebooks };

}  // namespace qvg::detail::snap
