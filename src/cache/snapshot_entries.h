// src/cache/snapshot_entries.h — private: the named, typed entries of a snapshot's
// config and state sections (docs/snapshot.md, "Entries"), writer and reader side by
// side: u32 count (at most kMaxEntries), then per entry a u32-length key, a u8 VType
// and the value (i64 | u64 | u8 bool | u32-length string | nothing). A real number is
// a string: the shortest decimal that reads back to the same double.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/snapshot_format.h"
#include "cache/snapshot_io.h"

namespace qvg::detail::snap {

/// One entry's value.
struct Value {
  VType type = VType::None;
  int64_t i = 0;
  uint64_t u = 0;
  bool b = false;
  std::string s;

  static Value i64(int64_t v) { return {VType::I64, v, 0, false, {}}; }
  static Value u64(uint64_t v) { return {VType::U64, 0, v, false, {}}; }
  static Value boolean(bool v) { return {VType::Bool, 0, 0, v, {}}; }
  static Value str(std::string v) { return {VType::Str, 0, 0, false, std::move(v)}; }
  static Value none() { return {}; }
  static Value opt_i64(std::optional<int64_t> v) { return v ? i64(*v) : none(); }
  /// As `qvg inspect` shows it: decimal, true/false, the string, "none".
  std::string text() const;
};
using Entries = std::vector<std::pair<std::string, Value>>;

/// The text of a real number entry: the shortest decimal that reads back to `v`.
std::string double_text(double v);

/// Collects entries in order; bytes() is the section.
class KvWriter {
 public:
  void put(std::string_view k, Value v) { e_.emplace_back(std::string(k), std::move(v)); }
  void i64(std::string_view k, int64_t v) { put(k, Value::i64(v)); }
  void u64(std::string_view k, uint64_t v) { put(k, Value::u64(v)); }
  void boolean(std::string_view k, bool v) { put(k, Value::boolean(v)); }
  void str(std::string_view k, std::string_view v) { put(k, Value::str(std::string(v))); }
  void opt_i64(std::string_view k, std::optional<int64_t> v) { put(k, Value::opt_i64(v)); }
  void real(std::string_view k, double v) { str(k, double_text(v)); }
  std::vector<uint8_t> bytes() const;

 private:
  Entries e_;
};

/// The section of kind `kind` holding kv's entries.
SectionOut kv_section(Kind kind, const KvWriter& kv);

/// The entries of a section, each key at most once, every type known. Throws
/// CorruptData naming `where`.
Entries read_entries(std::span<const uint8_t> bytes, const std::string& where);

/// Typed access to entries. Every entry must be read (expect_all_read): an unknown one
/// is refused, it may be state this reader would otherwise drop. Errors are
/// CorruptData naming the section and the entry.
class KvReader {
 public:
  KvReader(Entries e, std::string where) : e_(std::move(e)), used_(e_.size(), false), where_(std::move(where)) {}
  int64_t i64(std::string_view k) { return get(k, VType::I64, false).i; }
  uint64_t u64(std::string_view k) { return get(k, VType::U64, false).u; }
  bool boolean(std::string_view k) { return get(k, VType::Bool, false).b; }
  std::string str(std::string_view k) { return get(k, VType::Str, false).s; }
  std::optional<int64_t> opt_i64(std::string_view k);
  /// An i64 entry that fits 32 bits.
  int i32(std::string_view k);
  /// A finite double written as double_text() writes it (nothing else reads back to
  /// the same bytes).
  double real(std::string_view k);
  /// The entry `k` of type `t` (or, `nullable`, none).
  const Value& get(std::string_view k, VType t, bool nullable);
  void expect_all_read() const;

 private:
  const Value& find(std::string_view k);
  Entries e_;
  std::vector<bool> used_;
  std::string where_;
};

}  // namespace qvg::detail::snap
