// The container of a snapshot file (snapshot_io.h): header and table, writer and
// reader side by side.
#include "cache/snapshot_io.h"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/core.h>

#include "core/bytes_impl.h"
#include "core/checksum_impl.h"
#include "qvg/file.h"

namespace qvg::detail::snap {

void corrupt(const std::string& where, const std::string& what) {
  throw CorruptData(fmt::format("invalid snapshot: {}: {}", where, what));
}

std::string section_name(uint32_t kind, uint32_t index) {
  const KindInfo* k = kind_info(kind);
  if (!k) return fmt::format("section of unknown kind {}", kind);
  return k->indexed ? fmt::format("{} {}", k->name, index) : std::string(k->name);
}

// ---- sections to write ----------------------------------------------------------------
void SectionOut::own(std::vector<uint8_t> b) {
  owned.push_back(std::move(b));
  pieces.emplace_back(owned.back());
}

uint64_t SectionOut::length() const {
  uint64_t n = 0;
  for (const auto& p : pieces) n += p.size();
  return n;
}

uint64_t SectionOut::checksum() const {
  Xxh64Stream h;
  for (const auto& p : pieces) h.update(p);
  return h.digest();
}

// ---- the header and the table: writer -------------------------------------------------
namespace {

// The header (format 1.`minor`) and table for `sections`; the file is these bytes
// followed by every section's pieces.
std::vector<uint8_t> head_of(const std::vector<SectionOut>& sections, uint16_t minor) {
  const uint64_t table_end = kHeaderBytes + kTableEntryBytes * sections.size();
  uint64_t size = table_end;
  for (const SectionOut& s : sections) size += s.length();
  ByteWriter w;  // the fields in the order of their offsets (snapshot_format.h)
  w.put_bytes(kMagic);
  w.put(kSnapshotMajor);
  w.put(minor);
  w.put(kByteOrderMark);
  w.put(static_cast<uint32_t>(sections.size()));
  w.put(static_cast<uint32_t>(0));  // reserved
  w.put(size);
  w.put(static_cast<uint64_t>(0));  // header checksum, filled below
  uint64_t offset = table_end;
  for (const SectionOut& s : sections) {
    w.put(static_cast<uint32_t>(s.kind));
    w.put(s.index);
    w.put(offset);
    w.put(s.length());
    w.put(s.checksum());
    offset += s.length();
  }
  std::vector<uint8_t> head = std::move(w.bytes());
  std::vector<uint8_t> covered(head.begin(), head.begin() + kHeaderChecksumOffset);
  covered.insert(covered.end(), head.begin() + kHeaderBytes, head.end());
  store_le64(head.data() + kHeaderChecksumOffset, xxh64(covered));
  return head;
}

}  // namespace

void write_snapshot(const std::filesystem::path& path, const std::vector<SectionOut>& sections, uint16_t minor) {
  const std::vector<uint8_t> head = head_of(sections, minor);
  std::vector<std::span<const uint8_t>> pieces = {head};
  for (const SectionOut& s : sections) pieces.insert(pieces.end(), s.pieces.begin(), s.pieces.end());
  write_file_atomic(path, pieces);
}

std::vector<uint8_t> snapshot_file_bytes(const std::vector<SectionOut>& sections, uint16_t minor) {
  std::vector<uint8_t> out = head_of(sections, minor);
  for (const SectionOut& s : sections)
    for (const auto& p : s.pieces) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- sources --------------------------------------------------------------------------
void MemorySource::read(uint64_t off, void* dst, size_t n) const {
  if (n) std::memcpy(dst, b_.data() + off, n);
}

void FileSource::read(uint64_t off, void* dst, size_t n) const {
  if (!f_.read_at(off, dst, n)) corrupt("file", "it shrank while it was read");
}

// ---- the header and the table: reader -------------------------------------------------
bool has_magic(std::span<const uint8_t> b) {
  return b.size() >= kMagic.size() && std::equal(kMagic.begin(), kMagic.end(), b.begin());
}

Table read_table(const Source& src) {
  const uint64_t size = src.size();
  if (size < kHeaderBytes) {
    std::vector<uint8_t> some(size);
    src.read(0, some.data(), some.size());
    if (!has_magic(some)) corrupt("header", "not a qvg snapshot (no \\x89QVGSNAP magic)");
    corrupt("header", fmt::format("truncated: the file is {} bytes, the header alone is {}", size, kHeaderBytes));
  }
  std::array<uint8_t, kHeaderBytes> h{};
  src.read(0, h.data(), h.size());
  if (!has_magic(h)) corrupt("header", "not a qvg snapshot (no \\x89QVGSNAP magic)");
  Table t;
  t.major = load_le16(h.data() + kMajorOffset);
  t.minor = load_le16(h.data() + kMinorOffset);
  if (t.major != kSnapshotMajor)
    corrupt("header", fmt::format("format version {}.{}: this reader reads {}.x{}", t.major, t.minor, kSnapshotMajor,
                                  t.major > kSnapshotMajor ? " (written by a newer qvg)" : ""));
  const uint32_t bom = load_le32(h.data() + kByteOrderOffset);
  if (bom != kByteOrderMark)
    corrupt("header", fmt::format("byte-order mark 0x{:08x}, expected 0x{:08x} (snapshots are little-endian{})", bom,
                                  kByteOrderMark, bom == kByteOrderMarkSwapped ? "; this one is big-endian" : ""));
  const uint32_t n = load_le32(h.data() + kSectionCountOffset);
  const uint32_t reserved = load_le32(h.data() + kReservedOffset);
  const uint64_t file_size = load_le64(h.data() + kFileSizeOffset);
  const uint64_t header_sum = load_le64(h.data() + kHeaderChecksumOffset);
  if (file_size != size)
    corrupt("header", fmt::format("the header gives a file size of {} bytes, the file has {}{}", file_size, size,
                                  size < file_size ? " (truncated)" : ""));
  if (n < kMinSections || n > (size - kHeaderBytes) / kTableEntryBytes)
    corrupt("header", fmt::format("section count {} does not fit a {}-byte file", n, size));
  // The bytes the header checksum covers: the header before the checksum, the table.
  std::vector<uint8_t> covered(kHeaderChecksumOffset + size_t(n) * kTableEntryBytes);
  std::memcpy(covered.data(), h.data(), kHeaderChecksumOffset);
  src.read(kHeaderBytes, covered.data() + kHeaderChecksumOffset, size_t(n) * kTableEntryBytes);
  const uint64_t got = xxh64(covered);
  if (got != header_sum)
    corrupt("header", fmt::format("checksum mismatch over the header and section table (stored 0x{:016x}, computed "
                                  "0x{:016x})",
                                  header_sum, got));
  if (reserved != 0) corrupt("header", fmt::format("reserved field is {}, must be 0", reserved));
  ByteReader tr(std::span<const uint8_t>(covered).subspan(kHeaderChecksumOffset), "invalid snapshot: section table");
  uint64_t cursor = kHeaderBytes + uint64_t(n) * kTableEntryBytes;
  t.entries.resize(n);
  for (TableEntry& e : t.entries) {
    e.kind = tr.get<uint32_t>("section kind");
    e.index = tr.get<uint32_t>("section index");
    e.offset = tr.get<uint64_t>("section offset");
    e.length = tr.get<uint64_t>("section length");
    e.checksum = tr.get<uint64_t>("section checksum");
    const KindInfo* k = kind_info(e.kind);
    if (!k || k->minor > t.minor)
      corrupt("section table", fmt::format("{} (a newer qvg may have written it)", e.name()));
    if (e.offset != cursor)
      corrupt("section table", fmt::format("section '{}' starts at byte {}, expected {} (sections tile the file)",
                                           e.name(), e.offset, cursor));
    if (e.length > size - cursor)
      corrupt("section table", fmt::format("section '{}' of {} bytes runs past the end of the file ({} bytes)",
                                           e.name(), e.length, size));
    cursor += e.length;
  }
  if (cursor != size) corrupt("section table", fmt::format("sections end at byte {}, the file at {}", cursor, size));
  return t;
}

void expect_sections(const Table& t, const std::vector<std::pair<Kind, uint32_t>>& want) {
  for (size_t i = 0; i < std::max(want.size(), t.entries.size()); ++i) {
    if (i < want.size() && i < t.entries.size() && t.entries[i].kind == uint32_t(want[i].first) &&
        t.entries[i].index == want[i].second)
      continue;
    const std::string got = i < t.entries.size() ? fmt::format("'{}'", t.entries[i].name()) : "nothing";
    const std::string exp = i < want.size() ? fmt::format("'{}'", section_name(uint32_t(want[i].first), want[i].second))
                                            : "the end of the file";
    corrupt("section table", fmt::format("section {} is {}, expected {}", i, got, exp));
  }
}

// ---- sections read --------------------------------------------------------------------
namespace {

void check_sum(const TableEntry& e, uint64_t got) {
  if (got != e.checksum)
    corrupt(e.name(), fmt::format("checksum mismatch (stored 0x{:016x}, computed 0x{:016x})", e.checksum, got));
}

}  // namespace

SectionBytes read_section(const Source& src, const TableEntry& e) {
  SectionBytes s;
  s.bytes = src.view(e.offset, size_t(e.length));
  if (s.bytes.data() == nullptr) {
    s.owned.resize(size_t(e.length));
    src.read(e.offset, s.owned.data(), s.owned.size());
    s.bytes = s.owned;
  }
  check_sum(e, xxh64(s.bytes));
  return s;
}

AlignedBuffer read_raw_section(const Source& src, const TableEntry& e) {
  AlignedBuffer b = AlignedBuffer::uninitialized(size_t(e.length));
  src.read(e.offset, b.data(), b.size());
  check_sum(e, xxh64({reinterpret_cast<const uint8_t*>(b.data()), b.size()}));
  return b;
}

}  // namespace qvg::detail::snap
