// src/cache/snapshot_io.h — private: the container of a snapshot file
// (docs/snapshot.md, "Layout"): the header and section table, each written and read
// side by side, the sections' checksums, and where a reader's bytes come from. The
// records inside the sections are other files' (snapshot_format.h lists them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/snapshot_format.h"
#include "core/file_impl.h"
#include "qvg/error.h"
#include "qvg/tensor.h"

namespace qvg::detail::snap {

// ---- errors ---------------------------------------------------------------------
/// Throws CorruptData "invalid snapshot: <where>: <what>".
[[noreturn]] void corrupt(const std::string& where, const std::string& what);

/// Runs f, turning an InvalidArgument or CorruptData it throws into CorruptData of
/// section `where` (a value that does not validate is a corrupt file here); an
/// error that already names its snapshot section passes unchanged.
template <class F>
auto in_section(const std::string& where, F&& f) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    corrupt(where, e.what());
  } catch (const CorruptData& e) {
    if (std::string_view(e.what()).starts_with("invalid snapshot: ")) throw;
    corrupt(where, e.what());
  }
}

/// "config", "segment 3", or "section of unknown kind 9".
std::string section_name(uint32_t kind, uint32_t index);

// ---- writing ------------------------------------------------------------------------
/// A section to write: owned field bytes and borrowed array bytes, in order (no copy
/// of the cache's data is made). The pieces point into `owned`'s vectors, whose data
/// stays put when the vectors themselves move.
struct SectionOut {
  Kind kind = Kind::Config;
  uint32_t index = 0;
  std::vector<std::vector<uint8_t>> owned;
  std::vector<std::span<const uint8_t>> pieces;

  void own(std::vector<uint8_t> b);
  void ref(std::span<const uint8_t> b) { pieces.push_back(b); }
  void ref(std::span<const std::byte> b) { pieces.emplace_back(reinterpret_cast<const uint8_t*>(b.data()), b.size()); }
  uint64_t length() const;
  uint64_t checksum() const;
};

/// The file of format 1.`minor` holding `sections`, written atomically to `path`
/// (qvg::write_file_atomic), or as bytes.
void write_snapshot(const std::filesystem::path& path, const std::vector<SectionOut>& sections, uint16_t minor);
std::vector<uint8_t> snapshot_file_bytes(const std::vector<SectionOut>& sections, uint16_t minor);

// ---- reading ------------------------------------------------------------------------
/// Where a reader's bytes come from: a file read at offsets, or memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  /// Reads [off, off + n); REQUIRES within size() (a file may still have shrunk:
  /// CorruptData).
  virtual void read(uint64_t off, void* dst, size_t n) const = 0;
  /// Memory sources: the bytes without a copy; files: empty.
  virtual std::span<const uint8_t> view(uint64_t, size_t) const { return {}; }
};

class MemorySource final : public Source {
 public:
  explicit MemorySource(std::span<const uint8_t> b) : b_(b) {}
  uint64_t size() const override { return b_.size(); }
  void read(uint64_t off, void* dst, size_t n) const override;
  std::span<const uint8_t> view(uint64_t off, size_t n) const override { return b_.subspan(off, n); }

 private:
  std::span<const uint8_t> b_;
};

class FileSource final : public Source {
 public:
  /// Throws InvalidArgument when `p` cannot be read (detail::ReadOnlyFile).
  explicit FileSource(const std::filesystem::path& p) : f_(p) {}
  uint64_t size() const override { return f_.size(); }
  void read(uint64_t off, void* dst, size_t n) const override;

 private:
  ReadOnlyFile f_;
};

/// One entry of the section table.
struct TableEntry {
  uint32_t kind = 0, index = 0;
  uint64_t offset = 0, length = 0, checksum = 0;
  std::string name() const { return section_name(kind, index); }
};

/// The header's version and the section table of a file whose header, table and
/// tiling have been checked (docs/snapshot.md, "What a reader checks", 1).
struct Table {
  uint16_t major = 0, minor = 0;
  std::vector<TableEntry> entries;  ///< at least kMinSections
};

/// True when `b` starts with the snapshot magic.
bool has_magic(std::span<const uint8_t> b);

/// Reads and checks the header and the table. Throws CorruptData naming the header
/// or the table (a newer major version, a kind this file's minor does not define).
Table read_table(const Source& src);

/// The table must list exactly these sections in this order (CorruptData naming
/// the first difference).
void expect_sections(const Table& t, const std::vector<std::pair<Kind, uint32_t>>& want);

/// A section's bytes, checksum verified: a view for memory sources, a copy (bounded
/// by the section's length) for files.
struct SectionBytes {
  std::vector<uint8_t> owned;
  std::span<const uint8_t> bytes;
};
SectionBytes read_section(const Source& src, const TableEntry& e);
/// A raw section read straight into a buffer of its size, checksum verified.
AlignedBuffer read_raw_section(const Source& src, const TableEntry& e);

}  // namespace qvg::detail::snap
