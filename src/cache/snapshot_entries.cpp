// The entries of the config and state sections (snapshot_entries.h): writer and
// reader side by side.
#include "cache/snapshot_entries.h"

#include <array>
#include <charconv>
#include <cmath>

#include <fmt/core.h>

#include "cache/snapshot_io.h"
#include "core/bytes_impl.h"

namespace qvg::detail::snap {

std::string Value::text() const {
  switch (type) {
    case VType::I64: return std::to_string(i);
    case VType::U64: return std::to_string(u);
    case VType::Bool: return b ? "true" : "false";
    case VType::Str: return s;
    case VType::None: return "none";
  }
  return "?";
}

std::string double_text(double v) {
  std::array<char, 64> buf{};
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), res.ptr);
}

// ---- the entry list: writer and reader ------------------------------------------------
std::vector<uint8_t> KvWriter::bytes() const {
  ByteWriter w;
  w.put(static_cast<uint32_t>(e_.size()));
  for (const auto& [k, v] : e_) {
    w.put_str(k);
    w.put(static_cast<uint8_t>(v.type));
    switch (v.type) {
      case VType::I64: w.put(v.i); break;
      case VType::U64: w.put(v.u); break;
      case VType::Bool: w.put_bool(v.b); break;
      case VType::Str: w.put_str(v.s); break;
      case VType::None: break;
    }
  }
  return std::move(w.bytes());
}

SectionOut kv_section(Kind kind, const KvWriter& kv) {
  SectionOut s;
  s.kind = kind;
  s.own(kv.bytes());
  return s;
}

Entries read_entries(std::span<const uint8_t> bytes, const std::string& where) {
  ByteReader r(bytes, fmt::format("invalid snapshot: {}", where));
  const uint32_t n = r.get<uint32_t>("entry count");
  if (n > kMaxEntries) r.fail(fmt::format("{} entries, at most {} are allowed", n, kMaxEntries));
  Entries e;
  e.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string key = r.get_str("entry key", kMaxKey);
    Value v;
    const uint8_t t = r.get<uint8_t>("entry type");
    v.type = VType(t);
    switch (v.type) {
      case VType::I64: v.i = r.get<int64_t>("integer value"); break;
      case VType::U64: v.u = r.get<uint64_t>("integer value"); break;
      case VType::Bool: v.b = r.get_bool("boolean value"); break;
      case VType::Str: v.s = r.get_str("string value", kMaxText); break;
      case VType::None: break;
      default: r.fail(fmt::format("entry '{}' has unknown type {}", printable(key), t));
    }
    for (const auto& [k, old] : e)
      if (k == key) r.fail(fmt::format("entry '{}' appears twice", printable(key)));
    e.emplace_back(std::move(key), std::move(v));
  }
  r.expect_end();
  return e;
}

// ---- typed access -----------------------------------------------------------------------
namespace {

const char* type_text(VType t) {
  switch (t) {
    case VType::I64: return "an integer";
    case VType::U64: return "an unsigned integer";
    case VType::Bool: return "a boolean";
    case VType::Str: return "a string";
    case VType::None: return "none";
  }
  return "?";
}

}  // namespace

const Value& KvReader::find(std::string_view k) {
  for (size_t i = 0; i < e_.size(); ++i)
    if (e_[i].first == k) {
      used_[i] = true;
      return e_[i].second;
    }
  corrupt(where_, fmt::format("missing entry '{}'", k));
}

const Value& KvReader::get(std::string_view k, VType t, bool nullable) {
  const Value& v = find(k);
  if (v.type != t && !(nullable && v.type == VType::None))
    corrupt(where_, fmt::format("entry '{}' must be {}{}", k, type_text(t), nullable ? " or none" : ""));
  return v;
}

std::optional<int64_t> KvReader::opt_i64(std::string_view k) {
  const Value& v = get(k, VType::I64, true);
  if (v.type == VType::None) return std::nullopt;
  return v.i;
}

int KvReader::i32(std::string_view k) {
  const int64_t v = i64(k);
  if (v < INT32_MIN || v > INT32_MAX) corrupt(where_, fmt::format("entry '{}' = {} does not fit 32 bits", k, v));
  return int(v);
}

double KvReader::real(std::string_view k) {
  const std::string t = str(k);
  double v = 0;
  const auto res = std::from_chars(t.data(), t.data() + t.size(), v);
  if (res.ec != std::errc() || res.ptr != t.data() + t.size() || !std::isfinite(v) || double_text(v) != t)
    corrupt(where_,
            fmt::format("entry '{}' = '{}' is not a finite number in its shortest decimal form", k, printable(t)));
  return v;
}

void KvReader::expect_all_read() const {
  for (size_t i = 0; i < e_.size(); ++i)
    if (!used_[i])
      corrupt(where_, fmt::format("unknown entry '{}' (this reader knows format {}.{}: a newer qvg may have written "
                                  "it)",
                                  printable(e_[i].first), kSnapshotMajor, kSnapshotMinor));
}

}  // namespace qvg::detail::snap
