// Cache snapshots (docs/snapshot.md): the file format, its writer and its reader.
//
// Layout (all integers little-endian):
//   header   40 bytes: magic "\x89QVGSNAP", u16 major, u16 minor, u32 byte-order
//            mark 0x01020304, u32 section count N, u32 reserved (0), u64 file size,
//            u64 XXH64 of header bytes [0, 32) followed by the section table
//   table    N entries of 32 bytes: u32 kind, u32 index, u64 offset, u64 length,
//            u64 XXH64 of the section's bytes
//   sections in table order, tiling the rest of the file exactly (no gap, no padding)
// Sections: config, state, then buffer_k, buffer_v (dense) or span 0..m-1 (the
// codebooks of incremental spans, format 1.1), segment 0..n-1, and warm_k, warm_v
// when the cache holds warm-start codebooks (packed). A writer writes the lowest
// format its cache needs: 1.4 for refinement layers (refine_recent > 0), else 1.3 for
// the scale search or per-role settings, else 1.2 for a head_offset other than 0, else
// 1.1 for a packed cache with span_mode = incremental or a span_break_ratio other than
// 0, else 1.0.
//
// Reading validates everything before anything is built: the header and table
// (magic, version, byte order, sizes, tiling, checksum), each section's checksum
// before its content is parsed, the content against the configuration, and the
// caches' invariants; every allocation is bounded by the section it fills (hence by
// the file's size). Any problem is CorruptData naming the section.
#include "qvg/snapshot.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "cache/snapshot_state.h"
#include "core/bytes_impl.h"
#include "core/checksum_impl.h"
#include "core/file_impl.h"
#include "qvg/cache.h"
#include "qvg/error.h"
#include "qvg/file.h"
#include "qvg/settings.h"

namespace qvg {

namespace {

using detail::ByteReader;
using detail::ByteWriter;
using detail::printable;

constexpr std::array<uint8_t, 8> kMagic = {0x89, 'Q', 'V', 'G', 'S', 'N', 'A', 'P'};
constexpr uint32_t kByteOrderMark = 0x01020304u;
constexpr size_t kHeaderBytes = 40;
constexpr size_t kEntryBytes = 32;
constexpr size_t kMaxKey = 64, kMaxText = 256, kMaxEntries = 256;

enum class Kind : uint32_t {
  Config = 1,
  State = 2,
  BufferK = 3,
  BufferV = 4,
  Segment = 5,
  WarmK = 6,
  WarmV = 7,
  Span = 8,  // format 1.1
};

// Segment flags: the segment is a chunk of an incremental span (format 1.1); the chunk
// holds refinement layers, K then V after its encodings (format 1.4).
constexpr uint32_t kFlagSpanChunk = 1;
constexpr uint32_t kFlagRefined = 2;

std::string section_name(uint32_t kind, uint32_t index) {
  switch (Kind(kind)) {
    case Kind::Config: return "config";
    case Kind::State: return "state";
    case Kind::BufferK: return "buffer_k";
    case Kind::BufferV: return "buffer_v";
    case Kind::Segment: return fmt::format("segment {}", index);
    case Kind::WarmK: return "warm_k";
    case Kind::WarmV: return "warm_v";
    case Kind::Span: return fmt::format("span {}", index);
  }
  return fmt::format("section of unknown kind {}", kind);
}

[[noreturn]] void corrupt(const std::string& where, const std::string& what) {
  throw CorruptData(fmt::format("invalid snapshot: {}: {}", where, what));
}

// Runs f, turning an InvalidArgument or CorruptData it throws into CorruptData of
// section `where` (a value that does not validate is a corrupt file here).
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

// ---- numbers stored as text ------------------------------------------------------
// A double is a string entry: the shortest decimal that reads back to the same
// double (std::to_chars), so that it is exact and a reader can insist on the one
// spelling a writer gives it.
std::string double_text(double v) {
  std::array<char, 64> buf{};
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), res.ptr);
}

// ---- key/value entries: the config and state sections ------------------------
// u32 count, then per entry: u32-length key, u8 type, value (i64 | u64 | u8 bool |
// u32-length string | nothing).
enum class VType : uint8_t { I64 = 1, U64 = 2, Bool = 3, Str = 4, None = 5 };

struct Value {
  VType type = VType::None;
  int64_t i = 0;
  uint64_t u = 0;
  bool b = false;
  std::string s;
  std::string text() const {
    switch (type) {
      case VType::I64: return std::to_string(i);
      case VType::U64: return std::to_string(u);
      case VType::Bool: return b ? "true" : "false";
      case VType::Str: return s;
      case VType::None: return "none";
    }
    return "?";
  }
};
using Entries = std::vector<std::pair<std::string, Value>>;

class KvWriter {
 public:
  void i64(std::string_view k, int64_t v) { add(k, {VType::I64, v, 0, false, {}}); }
  void u64(std::string_view k, uint64_t v) { add(k, {VType::U64, 0, v, false, {}}); }
  void boolean(std::string_view k, bool v) { add(k, {VType::Bool, 0, 0, v, {}}); }
  void str(std::string_view k, std::string_view v) { add(k, {VType::Str, 0, 0, false, std::string(v)}); }
  void opt_i64(std::string_view k, std::optional<int64_t> v) {
    if (v)
      i64(k, *v);
    else
      add(k, {VType::None, 0, 0, false, {}});
  }
  void real(std::string_view k, double v) { str(k, double_text(v)); }
  std::vector<uint8_t> bytes() const {
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

 private:
  void add(std::string_view k, Value v) { e_.emplace_back(std::string(k), std::move(v)); }
  Entries e_;
};

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

// Typed access to entries; every entry must be read (an unknown one is refused:
// it may be state this reader would otherwise drop).
class KvReader {
 public:
  KvReader(Entries e, std::string where) : e_(std::move(e)), used_(e_.size(), false), where_(std::move(where)) {}
  int64_t i64(std::string_view k) { return get(k, VType::I64, "an integer").i; }
  uint64_t u64(std::string_view k) { return get(k, VType::U64, "an unsigned integer").u; }
  bool boolean(std::string_view k) { return get(k, VType::Bool, "a boolean").b; }
  std::string str(std::string_view k) { return get(k, VType::Str, "a string").s; }
  std::optional<int64_t> opt_i64(std::string_view k) {
    const Value& v = find(k);
    if (v.type == VType::None) return std::nullopt;
    if (v.type != VType::I64) corrupt(where_, fmt::format("entry '{}' must be an integer or none", k));
    return v.i;
  }
  int i32(std::string_view k) {
    const int64_t v = i64(k);
    if (v < INT32_MIN || v > INT32_MAX) corrupt(where_, fmt::format("entry '{}' = {} does not fit 32 bits", k, v));
    return int(v);
  }
  // A finite double written as double_text() writes it (nothing else reads back to
  // the same bytes).
  double real(std::string_view k) {
    const std::string t = str(k);
    double v = 0;
    const auto res = std::from_chars(t.data(), t.data() + t.size(), v);
    if (res.ec != std::errc() || res.ptr != t.data() + t.size() || !std::isfinite(v) || double_text(v) != t)
      corrupt(where_,
              fmt::format("entry '{}' = '{}' is not a finite number in its shortest decimal form", k, printable(t)));
    return v;
  }
  void expect_all_read() const {
    for (size_t i = 0; i < e_.size(); ++i)
      if (!used_[i])
        corrupt(where_, fmt::format("unknown entry '{}' (this reader knows format {}.{}: a newer qvg may have written "
                                    "it)",
                                    printable(e_[i].first), kSnapshotMajor, kSnapshotMinor));
  }

 private:
  const Value& find(std::string_view k) {
    for (size_t i = 0; i < e_.size(); ++i)
      if (e_[i].first == k) {
        used_[i] = true;
        return e_[i].second;
      }
    corrupt(where_, fmt::format("missing entry '{}'", k));
  }
  const Value& get(std::string_view k, VType t, const char* what) {
    const Value& v = find(k);
    if (v.type != t) corrupt(where_, fmt::format("entry '{}' must be {}", k, what));
    return v;
  }
  Entries e_;
  std::vector<bool> used_;
  std::string where_;
};

// ---- writing ------------------------------------------------------------------
// A section: owned field bytes and borrowed array bytes, in order (no copy of the
// cache's data is made). The pieces point into `owned`'s vectors, whose data stays
// put when the vectors themselves move.
struct SectionOut {
  Kind kind = Kind::Config;
  uint32_t index = 0;
  std::vector<std::vector<uint8_t>> owned;
  std::vector<std::span<const uint8_t>> pieces;

  void own(std::vector<uint8_t> b) {
    owned.push_back(std::move(b));
    pieces.emplace_back(owned.back());
  }
  void ref(std::span<const uint8_t> b) { pieces.push_back(b); }
  void ref(std::span<const std::byte> b) { pieces.emplace_back(reinterpret_cast<const uint8_t*>(b.data()), b.size()); }
  uint64_t length() const {
    uint64_t n = 0;
    for (const auto& p : pieces) n += p.size();
    return n;
  }
  uint64_t checksum() const {
    detail::Xxh64Stream h;
    for (const auto& p : pieces) h.update(p);
    return h.digest();
  }
};

void put_layout(ByteWriter& w, const EncodingLayout& l) {
  w.put_str(dtype_name(l.dtype));
  for (int64_t d : {l.shape.b, l.shape.s, l.shape.h, l.shape.d}) w.put(d);
  for (int v : {l.bits, l.block_size, l.stages, l.centroids}) w.put(static_cast<int32_t>(v));
  w.put_bool(l.asymmetric);
  w.put_str(name(l.scale_dtype));
  w.put_str(name(l.scaling));
}

// Which arrays of an encoding a section holds: all of them; the centroid arrays
// alone (warm-start state, span codebooks); all but the centroid arrays (a chunk of
// an incremental span, whose centroids are its span's).
enum class Arrays { All, CodebooksOnly, WithoutCodebooks };

bool holds(Arrays which, const ArrayDesc& a) {
  const bool c = a.kind == EncodedArray::Centroids;
  return which == Arrays::All || (which == Arrays::CodebooksOnly) == c;
}

// An encoding: its layout, then the arrays `which` selects in spec 1.5 order (borrowed).
void put_encoded(SectionOut& s, const EncodedTensor& e, Arrays which) {
  ByteWriter w;
  put_layout(w, e);
  s.own(std::move(w.bytes()));
  for (const ArrayDesc& a : e.arrays())
    if (holds(which, a)) s.ref(e.array(a));
}

void put_options(KvWriter& kv, const char* cache, const CacheOptions& o, uint16_t minor) {
  kv.str("cache", cache);
  kv.str("device", "cpu");
  kv.i64("batch", o.batch);
  kv.i64("cache_size", o.cache_size);
  kv.i64("num_heads", o.heads);
  kv.i64("head_dim", o.head_dim);
  kv.str("dtype", dtype_name(o.dtype));
  kv.i64("sink_tokens", o.sink_tokens);
  kv.opt_i64("attention_window_size", o.attention_window_size);
  kv.boolean("allow_growth", o.allow_growth);
  if (minor >= 2) kv.i64("head_offset", o.head_offset);  // format 1.2
}

// The lowest minor version that holds a cache of these settings (a 1.0 file is byte
// for byte what a 1.0 writer wrote).
uint16_t minor_needed(const CacheOptions& o, const QuantArgs* q) {
  uint16_t m = o.head_offset != 0 ? 2 : 0;  // format 1.2
  // Every setting whose value is not the default needs the format that stores it
  // (issue 27, item 3: refine_bits is stored whenever it is not 4, refine_recent 0 too).
  if (q)
    for (const Setting& s : quant_settings())
      if (!is_default(s, *q)) m = std::max(m, s.snapshot_minor);
  return m;
}

// The quant settings of the table, in its order, each from the minor that stores it.
// Shared fields: bits as an optional integer, integers, booleans, names, the ratio as a
// real, the seed unsigned; per-role overrides: integers as optional integers, booleans
// and names as strings ("" = unset, the shared value applies).
void put_quant(KvWriter& kv, const QuantArgs& q, uint16_t minor) {
  for (const Setting& s : quant_settings()) {
    if (s.snapshot_minor > minor) continue;
    const SettingValue v = s.get(q);
    const bool none = std::holds_alternative<std::monostate>(v);
    switch (s.kind) {
      case SettingKind::Bits: kv.opt_i64(s.name, none ? std::nullopt : std::optional(std::get<int64_t>(v))); break;
      case SettingKind::Int:
      case SettingKind::Width:
        if (s.role)
          kv.opt_i64(s.name, none ? std::nullopt : std::optional(std::get<int64_t>(v)));
        else
          kv.i64(s.name, std::get<int64_t>(v));
        break;
      case SettingKind::Bool:
        if (s.role)
          kv.str(s.name, none ? std::string() : setting_text(v));
        else
          kv.boolean(s.name, std::get<bool>(v));
        break;
      case SettingKind::Name: kv.str(s.name, none ? std::string() : std::get<std::string>(v)); break;
      case SettingKind::Real: kv.real(s.name, std::get<double>(v)); break;
      case SettingKind::Seed: kv.u64(s.name, std::get<uint64_t>(v)); break;
    }
  }
}

// The inverse of put_quant for a file of format 1.`minor` (settings it does not store
// keep their defaults). Values are checked as the table's parser checks them.
QuantArgs get_quant(KvReader& kv, uint16_t minor) {
  QuantArgs q;
  for (const Setting& s : quant_settings()) {
    if (s.snapshot_minor > minor) continue;
    const std::string what = fmt::format("entry '{}'", s.name);
    SettingValue v;
    switch (s.kind) {
      case SettingKind::Bits:
      case SettingKind::Int:
      case SettingKind::Width: {
        std::optional<int64_t> x;
        if (s.kind == SettingKind::Bits || s.role)
          x = kv.opt_i64(s.name);
        else
          x = kv.i64(s.name);
        if (x && (*x < INT32_MIN || *x > INT32_MAX))
          corrupt("config", fmt::format("{} = {} does not fit in 32 bits", what, *x));
        if (x) v = *x;
        break;
      }
      case SettingKind::Bool:
        if (s.role) {
          const std::string t = kv.str(s.name);
          if (t == "true" || t == "false")
            v = t == "true";
          else if (!t.empty())
            corrupt("config", fmt::format("{} must be true, false or empty, got '{}'", what, printable(t)));
        } else {
          v = kv.boolean(s.name);
        }
        break;
      case SettingKind::Name: {
        const std::string t = kv.str(s.name);
        if (!(s.role && t.empty())) v = in_section("config", [&] { return parse_setting(s, t, what); });
        break;
      }
      case SettingKind::Real: v = kv.real(s.name); break;
      case SettingKind::Seed: v = kv.u64(s.name); break;
    }
    s.set(q, v);
  }
  return q;
}

SectionOut kv_section(Kind kind, const KvWriter& kv) {
  SectionOut s;
  s.kind = kind;
  s.own(kv.bytes());
  return s;
}

// The config and state sections, first in every snapshot.
std::vector<SectionOut> head_sections(const KvWriter& config, const KvWriter& state) {
  std::vector<SectionOut> out;
  out.push_back(kv_section(Kind::Config, config));
  out.push_back(kv_section(Kind::State, state));
  return out;
}

uint16_t minor_of(const detail::DenseStateRef& st) {
  return minor_needed(st.options, nullptr);
}
uint16_t minor_of(const detail::PackedStateRef& st) {
  return minor_needed(st.options, &st.quant);
}

std::vector<SectionOut> sections_of(const detail::DenseStateRef& st) {
  KvWriter cfg, state;
  put_options(cfg, "dense", st.options, minor_of(st));
  state.i64("cache_size", st.cache_size);
  state.i64("attention_window_size", st.window);
  state.i64("global_end", st.global_end);
  state.i64("local_end", st.local_end);
  std::vector<SectionOut> out = head_sections(cfg, state);
  for (Kind k : {Kind::BufferK, Kind::BufferV}) {
    SectionOut s;
    s.kind = k;
    s.ref(k == Kind::BufferK ? st.k : st.v);
    out.push_back(std::move(s));
  }
  return out;
}


std::vector<SectionOut> sections_of(const detail::PackedStateRef& st) {
  const bool incremental = st.quant.span_mode == SpanMode::Incremental;
  KvWriter cfg, state;
  put_options(cfg, "packed", st.options, minor_of(st));
  put_quant(cfg, st.quant, minor_of(st));
  state.i64("global_end", st.global_end);
  state.opt_i64("chunk_tokens", st.chunk_tokens);
  state.i64("segments", int64_t(st.segments.size()));
  state.boolean("warm", st.warm_k != nullptr);
  if (incremental) {  // format 1.1
    const detail::SpanState& ss = st.span_state;
    state.i64("spans", int64_t(st.spans.size()));
    state.i64("open_span", ss.open_span);
    state.i64("open_span_chunks", ss.open_span_chunks);
    state.i64("next_span", ss.next_span);
    state.i64("span_breaks", ss.span_breaks);
    state.real("open_k_energy", ss.open_k_energy);
    state.real("open_v_energy", ss.open_v_energy);
  }
  std::vector<SectionOut> out = head_sections(cfg, state);
  for (size_t i = 0; i < st.spans.size(); ++i) {
    const detail::PackedSpanRef& sp = st.spans[i];
    SectionOut s;
    s.kind = Kind::Span;
    s.index = uint32_t(i);
    for (const SpanCodebook* b : {sp.k, sp.v}) {
      ByteWriter w;
      if (b == sp.k) w.put(sp.id);
      w.put(static_cast<uint32_t>(b->filled));
      s.own(std::move(w.bytes()));
      put_encoded(s, b->book, Arrays::CodebooksOnly);
    }
    out.push_back(std::move(s));
  }
  for (size_t i = 0; i < st.segments.size(); ++i) {
    const detail::PackedSegmentRef& g = st.segments[i];
    SectionOut s;
    s.kind = Kind::Segment;
    s.index = uint32_t(i);
    ByteWriter w;
    w.put(g.g0);
    w.put(g.g1);
    w.put_bool(g.is_sink);
    w.put_bool(g.packed);
    w.put(static_cast<uint32_t>(g.chunks));
    w.put((g.span >= 0 ? kFlagSpanChunk : uint32_t(0)) | (g.k_ref ? kFlagRefined : uint32_t(0)));  // flags
    if (g.span >= 0) w.put(g.span);
    s.own(std::move(w.bytes()));
    if (g.packed) {
      const Arrays which = g.span >= 0 ? Arrays::WithoutCodebooks : Arrays::All;
      put_encoded(s, *g.k_enc, which);
      put_encoded(s, *g.v_enc, which);
      if (g.k_ref) {
        put_encoded(s, *g.k_ref, Arrays::All);
        put_encoded(s, *g.v_ref, Arrays::All);
      }
    } else {
      s.ref(g.k_raw);
      s.ref(g.v_raw);
    }
    out.push_back(std::move(s));
  }
  if (st.warm_k) {
    for (Kind k : {Kind::WarmK, Kind::WarmV}) {
      SectionOut s;
      s.kind = k;
      put_encoded(s, k == Kind::WarmK ? *st.warm_k : *st.warm_v, Arrays::CodebooksOnly);
      out.push_back(std::move(s));
    }
  }
  return out;
}

// The header (format 1.`minor`) and table for `sections`; the file is head ++ every
// section's pieces.
std::vector<uint8_t> head_of(const std::vector<SectionOut>& sections, uint16_t minor) {
  const uint64_t table_end = kHeaderBytes + kEntryBytes * sections.size();
  uint64_t size = table_end;
  for (const SectionOut& s : sections) size += s.length();
  ByteWriter w;
  w.put_bytes(kMagic);
  w.put(kSnapshotMajor);
  w.put(minor);
  w.put(kByteOrderMark);
  w.put(static_cast<uint32_t>(sections.size()));
  w.put(static_cast<uint32_t>(0));
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
  std::vector<uint8_t> covered(head.begin(), head.begin() + 32);
  covered.insert(covered.end(), head.begin() + kHeaderBytes, head.end());
  detail::store_le64(head.data() + 32, detail::xxh64(covered));
  return head;
}

template <class State>
void save_state(const std::filesystem::path& path, const State& st) {
  const std::vector<SectionOut> sections = sections_of(st);
  const std::vector<uint8_t> head = head_of(sections, minor_of(st));
  std::vector<std::span<const uint8_t>> pieces = {head};
  for (const SectionOut& s : sections) pieces.insert(pieces.end(), s.pieces.begin(), s.pieces.end());
  write_file_atomic(path, pieces);
}

template <class State>
std::vector<uint8_t> bytes_of_state(const State& st) {
  const std::vector<SectionOut> sections = sections_of(st);
  std::vector<uint8_t> out = head_of(sections, minor_of(st));
  for (const SectionOut& s : sections)
    for (const auto& p : s.pieces) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- reading: header and table ----------------------------------------------------
// Where the bytes come from: a file read at offsets, or memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  /// Reads [off, off + n); REQUIRES within size() (the file may still have shrunk).
  virtual void read(uint64_t off, void* dst, size_t n) const = 0;
  /// Memory sources: the bytes without a copy; files: empty.
  virtual std::span<const uint8_t> view(uint64_t, size_t) const { return {}; }
};

class MemorySource final : public Source {
 public:
  explicit MemorySource(std::span<const uint8_t> b) : b_(b) {}
  uint64_t size() const override { return b_.size(); }
  void read(uint64_t off, void* dst, size_t n) const override {
    if (n) std::memcpy(dst, b_.data() + off, n);
  }
  std::span<const uint8_t> view(uint64_t off, size_t n) const override { return b_.subspan(off, n); }

 private:
  std::span<const uint8_t> b_;
};

class FileSource final : public Source {
 public:
  explicit FileSource(const std::filesystem::path& p) : f_(p) {}
  uint64_t size() const override { return f_.size(); }
  void read(uint64_t off, void* dst, size_t n) const override {
    if (!f_.read_at(off, dst, n)) corrupt("file", "it shrank while it was read");
  }

 private:
  detail::ReadOnlyFile f_;
};

struct TableEntry {
  uint32_t kind = 0, index = 0;
  uint64_t offset = 0, length = 0, checksum = 0;
  std::string name() const { return section_name(kind, index); }
};

struct Table {
  uint16_t major = 0, minor = 0;
  std::vector<TableEntry> entries;
};

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
  ByteReader r(h, "invalid snapshot: header");
  r.get_bytes(kMagic.size(), "magic");
  Table t;
  t.major = r.get<uint16_t>("major version");
  t.minor = r.get<uint16_t>("minor version");
  if (t.major != kSnapshotMajor)
    corrupt("header", fmt::format("format version {}.{}: this reader reads {}.x{}", t.major, t.minor, kSnapshotMajor,
                                  t.major > kSnapshotMajor ? " (written by a newer qvg)" : ""));
  const uint32_t bom = r.get<uint32_t>("byte-order mark");
  if (bom != kByteOrderMark)
    corrupt("header", fmt::format("byte-order mark 0x{:08x}, expected 0x{:08x} (snapshots are little-endian{})", bom,
                                  kByteOrderMark, bom == 0x04030201u ? "; this one is big-endian" : ""));
  const uint32_t n = r.get<uint32_t>("section count");
  const uint32_t reserved = r.get<uint32_t>("reserved");
  const uint64_t file_size = r.get<uint64_t>("file size");
  const uint64_t header_sum = r.get<uint64_t>("header checksum");
  if (file_size != size)
    corrupt("header", fmt::format("the header gives a file size of {} bytes, the file has {}{}", file_size, size,
                                  size < file_size ? " (truncated)" : ""));
  if (n < 2 || n > (size - kHeaderBytes) / kEntryBytes)
    corrupt("header", fmt::format("section count {} does not fit a {}-byte file", n, size));
  std::vector<uint8_t> covered(32 + size_t(n) * kEntryBytes);
  std::memcpy(covered.data(), h.data(), 32);
  src.read(kHeaderBytes, covered.data() + 32, size_t(n) * kEntryBytes);
  const uint64_t got = detail::xxh64(covered);
  if (got != header_sum)
    corrupt("header", fmt::format("checksum mismatch over the header and section table (stored 0x{:016x}, computed "
                                  "0x{:016x})",
                                  header_sum, got));
  if (reserved != 0) corrupt("header", fmt::format("reserved field is {}, must be 0", reserved));
  ByteReader tr(std::span<const uint8_t>(covered).subspan(32), "invalid snapshot: section table");
  uint64_t cursor = kHeaderBytes + uint64_t(n) * kEntryBytes;
  t.entries.resize(n);
  for (TableEntry& e : t.entries) {
    e.kind = tr.get<uint32_t>("section kind");
    e.index = tr.get<uint32_t>("section index");
    e.offset = tr.get<uint64_t>("section offset");
    e.length = tr.get<uint64_t>("section length");
    e.checksum = tr.get<uint64_t>("section checksum");
    if (e.kind < uint32_t(Kind::Config) || e.kind > uint32_t(Kind::Span) ||
        (e.kind == uint32_t(Kind::Span) && t.minor < 1))
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

// A section's bytes, checksum verified: a view for memory sources, a copy (bounded by
// the section's length) for files.
struct SectionBytes {
  std::vector<uint8_t> owned;
  std::span<const uint8_t> bytes;
};

void check_sum(const TableEntry& e, uint64_t got) {
  if (got != e.checksum)
    corrupt(e.name(), fmt::format("checksum mismatch (stored 0x{:016x}, computed 0x{:016x})", e.checksum, got));
}

SectionBytes read_section(const Source& src, const TableEntry& e) {
  SectionBytes s;
  s.bytes = src.view(e.offset, size_t(e.length));
  if (s.bytes.data() == nullptr) {
    s.owned.resize(size_t(e.length));
    src.read(e.offset, s.owned.data(), s.owned.size());
    s.bytes = s.owned;
  }
  check_sum(e, detail::xxh64(s.bytes));
  return s;
}

// A raw section read straight into a buffer of its size, checksum verified.
AlignedBuffer read_raw_section(const Source& src, const TableEntry& e) {
  AlignedBuffer b = AlignedBuffer::uninitialized(size_t(e.length));
  src.read(e.offset, b.data(), b.size());
  check_sum(e, detail::xxh64({reinterpret_cast<const uint8_t*>(b.data()), b.size()}));
  return b;
}

// ---- reading: configuration ---------------------------------------------------------
struct Config {
  std::string cache, device;
  CacheOptions options;
  std::optional<QuantArgs> quant;  // packed caches
};

Config parse_config(std::span<const uint8_t> bytes, uint16_t minor) {
  KvReader kv(read_entries(bytes, "config"), "config");
  Config c;
  c.cache = kv.str("cache");
  if (c.cache != "dense" && c.cache != "packed")
    corrupt("config", fmt::format("entry 'cache' must be dense or packed, got '{}'", printable(c.cache)));
  c.device = kv.str("device");
  if (c.device != "cpu" && c.device != "cuda")
    corrupt("config", fmt::format("entry 'device' must be cpu or cuda, got '{}'", printable(c.device)));
  CacheOptions& o = c.options;
  o.batch = kv.i64("batch");
  o.cache_size = kv.i64("cache_size");
  o.heads = kv.i64("num_heads");
  o.head_dim = kv.i64("head_dim");
  o.dtype = in_section("config", [&] { return parse_dtype(kv.str("dtype"), "entry 'dtype'"); });
  o.sink_tokens = kv.i64("sink_tokens");
  o.attention_window_size = kv.opt_i64("attention_window_size");
  o.allow_growth = kv.boolean("allow_growth");
  if (minor >= 2) o.head_offset = kv.i64("head_offset");  // format 1.2
  if (c.cache == "packed") {
    QuantArgs q = get_quant(kv, minor);
    c.quant = q;
  }
  kv.expect_all_read();
  in_section("config", [&] {
    detail::validate_options(o);
    if (c.quant) {
      if (o.allow_growth) throw InvalidArgument("allow_growth must be false for a packed cache");
      if (c.quant->enabled())
        c.quant->validate_for_head_dim(o.head_dim);
      else
        c.quant->validate();
    }
    return 0;
  });
  return c;
}

// ---- expectations ---------------------------------------------------------------------
template <class T>
void expect_equal(const char* field, const T& got, const T& want) {
  if (!(got == want))
    throw InvalidArgument(fmt::format("the snapshot's cache has {} = {}, the caller expects {}", field, got, want));
}

void check_expectation(const Config& c, const SnapshotExpectation& x) {
  if (x.options) {
    const CacheOptions &g = c.options, &w = *x.options;
    expect_equal("batch", g.batch, w.batch);
    expect_equal("cache_size", g.cache_size, w.cache_size);
    expect_equal("num_heads", g.heads, w.heads);
    expect_equal("head_dim", g.head_dim, w.head_dim);
    expect_equal("dtype", std::string(dtype_name(g.dtype)), std::string(dtype_name(w.dtype)));
    expect_equal("sink_tokens", g.sink_tokens, w.sink_tokens);
    expect_equal("attention_window_size", g.window(), w.window());
    expect_equal("allow_growth", g.allow_growth, w.allow_growth);
    expect_equal("head_offset", g.head_offset, w.head_offset);
  }
  if (x.quant && c.quant) {
    // Every setting of the table (all but threads, which is how a call runs).
    for (const Setting& s : quant_settings())
      expect_equal(std::string(s.name).c_str(), setting_text(s.get(*c.quant)), setting_text(s.get(*x.quant)));
  }
}

// Reads the header, the table and the config; checks the kind and the expectation.
struct Opened {
  Table table;
  Config config;
};

Opened open_snapshot(const Source& src, const char* want_kind, const SnapshotExpectation& x) {
  check_threads("threads", x.threads);
  Opened o;
  o.table = read_table(src);
  const TableEntry& first = o.table.entries[0];
  if (first.kind != uint32_t(Kind::Config))
    corrupt("section table", fmt::format("the first section is '{}', expected 'config'", first.name()));
  o.config = parse_config(read_section(src, first).bytes, o.table.minor);
  if (o.config.cache != want_kind)
    throw InvalidArgument(
        fmt::format("the snapshot holds a {} cache; a {} cache cannot be loaded from it", o.config.cache, want_kind));
  check_expectation(o.config, x);
  o.config.options.view_scratch = x.view_scratch;
  if (o.config.quant) o.config.quant->threads = x.threads;
  return o;
}

// The table must list exactly these kinds in this order.
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

// ---- reading: the dense cache -------------------------------------------------------------
detail::DenseStateData read_dense(const Source& src, const SnapshotExpectation& x) {
  Opened o = open_snapshot(src, "dense", x);
  expect_sections(o.table, {{Kind::Config, 0}, {Kind::State, 0}, {Kind::BufferK, 0}, {Kind::BufferV, 0}});
  detail::DenseStateData d;
  d.options = o.config.options;
  const CacheOptions& opt = d.options;
  {
    KvReader kv(read_entries(read_section(src, o.table.entries[1]).bytes, "state"), "state");
    d.cache_size = kv.i64("cache_size");
    d.window = kv.i64("attention_window_size");
    d.global_end = kv.i64("global_end");
    d.local_end = kv.i64("local_end");
    kv.expect_all_read();
  }
  in_section("state", [&] {
    if (d.cache_size < opt.cache_size || (d.cache_size != opt.cache_size && !opt.allow_growth))
      throw InvalidArgument(fmt::format("cache_size {} must equal the configured {}{}", d.cache_size, opt.cache_size,
                                        opt.allow_growth ? " or exceed it (growth)" : ""));
    CacheOptions grown = opt;
    grown.cache_size = d.cache_size;
    grown.attention_window_size = d.window;
    detail::validate_options(grown);
    // The window follows growth when it was the whole cache (spec 3.2).
    const int64_t want_window = opt.window() == opt.cache_size ? d.cache_size : opt.window();
    if (d.window != want_window)
      throw InvalidArgument(fmt::format("attention_window_size {} must be {}", d.window, want_window));
    if (d.local_end < 0 || d.local_end > d.cache_size || d.global_end < d.local_end ||
        d.global_end > detail::kMaxPosition || (d.global_end != d.local_end && d.local_end != d.cache_size))
      throw InvalidArgument(fmt::format("cursors global_end = {}, local_end = {} are impossible for cache_size {}",
                                        d.global_end, d.local_end, d.cache_size));
    return 0;
  });
  const uint64_t buf = uint64_t(opt.batch * d.cache_size * opt.heads * opt.head_dim) * dtype_size(opt.dtype);
  for (size_t i : {size_t(2), size_t(3)}) {
    const TableEntry& e = o.table.entries[i];
    if (e.length != buf)
      corrupt(e.name(), fmt::format("{} bytes, a [{}, {}, {}, {}] {} buffer has {}", e.length, opt.batch, d.cache_size,
                                    opt.heads, opt.head_dim, dtype_name(opt.dtype), buf));
    (i == 2 ? d.k : d.v) = read_raw_section(src, e);
  }
  return d;
}

// ---- reading: the packed cache -------------------------------------------------------------
EncodingLayout get_layout(ByteReader& r) {
  EncodingLayout l;
  l.dtype = parse_dtype(r.get_str("dtype", kMaxKey), "encoding dtype");
  l.shape.b = r.get<int64_t>("shape");
  l.shape.s = r.get<int64_t>("shape");
  l.shape.h = r.get<int64_t>("shape");
  l.shape.d = r.get<int64_t>("shape");
  l.bits = r.get<int32_t>("bits");
  l.block_size = r.get<int32_t>("block_size");
  l.stages = r.get<int32_t>("stages");
  l.centroids = r.get<int32_t>("centroids");
  l.asymmetric = r.get_bool("asymmetric");
  l.scale_dtype = parse_scale_dtype(r.get_str("scale_dtype", kMaxKey));
  l.scaling = parse_scaling(r.get_str("scaling", kMaxKey));
  l.check();  // ranges: every size below is then computed without overflow
  return l;
}

// Reads an encoding's layout and the arrays `which` selects; they must fit the rest
// of the section before anything is allocated. Validates what it reads: a whole
// encoding as EncodedTensor::validate() and validate_values() do; codebooks finite;
// a span chunk's factors (its ids and values are checked against its span's
// codebooks by check_span_chunk()).
EncodedTensor get_encoded(ByteReader& r, Arrays which) {
  const EncodingLayout l = get_layout(r);
  std::vector<ArrayDesc> arrays = l.arrays();
  std::erase_if(arrays, [&](const ArrayDesc& a) { return !holds(which, a); });
  uint64_t need = 0;
  for (const ArrayDesc& a : arrays) need += a.bytes();
  if (need > r.remaining())
    r.fail(fmt::format("truncated: the arrays of a {} encoding need {} bytes, {} left", l.shape.str(), need,
                       r.remaining()));
  EncodedTensor e;
  if (which == Arrays::All) {
    e = EncodedTensor::allocate(l);
  } else {  // only the arrays read (every allocation bounded by the section)
    static_cast<EncodingLayout&>(e) = l;
    e.centroid.resize(size_t(l.stages));
    if (which == Arrays::WithoutCodebooks) e.ids.resize(size_t(l.stages));
  }
  for (const ArrayDesc& a : arrays) {
    const auto b = r.get_bytes(a.bytes(), "array");
    std::vector<uint8_t>* v = nullptr;
    switch (a.kind) {
      case EncodedArray::Centroids: v = &e.centroid[size_t(a.stage)]; break;
      case EncodedArray::Ids: v = &e.ids[size_t(a.stage)]; break;
      case EncodedArray::Codes: v = &e.codes; break;
      case EncodedArray::Scales: v = &e.scales; break;
      case EncodedArray::Zeros: v = &e.zeros; break;
      case EncodedArray::ScaleFactor: e.scale_factor.resize(b.size() / 4); break;
      case EncodedArray::ZeroFactor: e.zero_factor.resize(b.size() / 4); break;
    }
    if (v && which != Arrays::All) v->resize(b.size());
    std::span<uint8_t> dst = e.array(a);
    if (!b.empty()) std::memcpy(dst.data(), b.data(), b.size());
  }
  switch (which) {
    case Arrays::All:
      e.validate();
      e.validate_values();
      break;
    case Arrays::CodebooksOnly:
      for (const auto& c : e.centroid)
        for (size_t i = 0; i < c.size() / dtype_size(l.dtype); ++i)
          if (!std::isfinite(load_f32(c.data(), l.dtype, i)))
            r.fail(fmt::format("a centroid of a codebook is not finite (element {})", i));
      break;
    case Arrays::WithoutCodebooks:
      for (const std::vector<float>* fv : {&e.scale_factor, &e.zero_factor})
        for (float f : *fv)
          if (!(std::isfinite(f) && f > 0))
            r.fail(fmt::format("{} must be finite and > 0, got {}",
                               fv == &e.scale_factor ? "scale_factor" : "zero_factor", f));
      break;
  }
  return e;
}

// The encodings of a packed segment or warm state must be what this cache would encode.
void check_layout_fits(const EncodingLayout& l, const CacheOptions& o, const QuantArgs& q, CacheRole role,
                       bool check_tokens, int64_t tokens, const char* what) {
  const CodecConfig c = q.codec(role);
  const bool ok = l.dtype == o.dtype && l.shape.b == o.batch && l.shape.h == o.heads && l.shape.d == o.head_dim &&
                  (!check_tokens || l.shape.s == tokens) && l.bits == c.bits && l.block_size == c.block_size &&
                  l.stages == c.stages && l.centroids == c.centroids && l.asymmetric == c.asymmetric &&
                  l.scale_dtype == c.scale_dtype && l.scaling == c.scaling;
  if (!ok)
    throw InvalidArgument(fmt::format(
        "{} is a {} {} encoding (bits={} block_size={} stages={} centroids={} asymmetric={} scale_dtype={} "
        "scaling={}); this cache encodes [{}, {}, {}, {}] {} with {}",
        what, l.shape.str(), dtype_name(l.dtype), l.bits, l.block_size, l.stages, l.centroids, l.asymmetric,
        name(l.scale_dtype), name(l.scaling), o.batch, check_tokens ? std::to_string(tokens) : std::string("S"),
        o.heads, o.head_dim, dtype_name(o.dtype), c.describe()));
}

// A span section (format 1.1): the span's id, then per K and V the slots in use
// (u32 filled) and the codebook (layout and centroid arrays, all K slots).
detail::PackedSpanData get_span(std::span<const uint8_t> bytes, const std::string& where, const CacheOptions& o,
                                const QuantArgs& q) {
  ByteReader r(bytes, "invalid snapshot: " + where);
  if (!q.enabled()) r.fail("a span codebook in a cache with quantization off");
  detail::PackedSpanData sp;
  sp.id = r.get<int64_t>("span id");
  if (sp.id < 0 || sp.id > detail::kMaxPosition) r.fail(fmt::format("span id {} is out of [0, 2^60]", sp.id));
  for (SpanCodebook* b : {&sp.k, &sp.v}) {
    const char* what = b == &sp.k ? "the K codebook" : "the V codebook";
    const uint32_t filled = r.get<uint32_t>("filled");
    b->book = get_encoded(r, Arrays::CodebooksOnly);
    const EncodingLayout& l = b->book;
    check_layout_fits(l, o, q, b == &sp.k ? CacheRole::Key : CacheRole::Value, false, 0, what);
    if (l.shape.s < 1 || l.shape.s > o.cache_size)
      r.fail(fmt::format("{} was made for a chunk of {} tokens, outside [1, cache_size = {}]", what, l.shape.s,
                         o.cache_size));
    if (filled < 1 || filled > uint32_t(l.centroids))
      r.fail(fmt::format("{} has {} slots in use, must be 1..{} (centroids)", what, filled, l.centroids));
    b->filled = int(filled);
    // Slots not yet in use are zero (a later chunk fills them; a warm start reads them).
    const size_t row = size_t(l.shape.d) * dtype_size(l.dtype);
    for (size_t st = 0; st < b->book.centroid.size(); ++st)
      for (int64_t g = 0; g < l.groups(); ++g) {
        const uint8_t* p = b->book.centroid[st].data() + size_t(g * l.centroids) * row;
        if (std::any_of(p + size_t(filled) * row, p + size_t(l.centroids) * row, [](uint8_t x) { return x != 0; }))
          r.fail(
              fmt::format("{}: stage {}, group {} holds a centroid in a slot not in use (>= {})", what, st, g, filled));
      }
  }
  r.expect_end();
  return sp;
}

// The arrays of a chunk of an incremental span against its span's codebook: every
// id a slot in use, every element decoding finite (validate_values() with the
// span's centroids).
void check_span_chunk(EncodedTensor& part, SpanCodebook& book, const char* what) {
  for (size_t st = 0; st < part.ids.size(); ++st)
    for (uint8_t id : part.ids[st])
      if (int(id) >= book.filled)
        throw CorruptData(
            fmt::format("{}: ids.{} holds id {}, its span's codebook has {} slots in use", what, st, id, book.filled));
  std::swap(part.centroid, book.book.centroid);
  try {
    part.validate_values();
  } catch (...) {
    std::swap(part.centroid, book.book.centroid);
    throw;
  }
  std::swap(part.centroid, book.book.centroid);
}

detail::PackedSegmentData get_segment(std::span<const uint8_t> bytes, const std::string& where, const CacheOptions& o,
                                      const QuantArgs& q, uint16_t minor, std::vector<detail::PackedSpanData>& spans) {
  ByteReader r(bytes, "invalid snapshot: " + where);
  detail::PackedSegmentData s;
  s.g0 = r.get<int64_t>("g0");
  s.g1 = r.get<int64_t>("g1");
  s.is_sink = r.get_bool("is_sink");
  s.packed = r.get_bool("packed");
  const uint32_t chunks = r.get<uint32_t>("chunks");
  const uint32_t flags = r.get<uint32_t>("flags");
  const uint32_t known = (minor >= 1 ? kFlagSpanChunk : 0) | (minor >= 4 ? kFlagRefined : 0);
  if (flags & ~known)
    r.fail(fmt::format("flags 0x{:x}: format {}.{} defines {} (a newer qvg may have written them)", flags,
                       kSnapshotMajor, minor,
                       known == 3 ? "0x1 and 0x2 only"
                       : known    ? "0x1 only"
                                  : "none"));
  if ((flags & kFlagRefined) && (!(flags & kFlagSpanChunk) || q.refine_recent == 0))
    r.fail(
        fmt::format("a refined segment (flag 0x2) must be a chunk of an incremental span (flag 0x1) of a cache "
                    "with refine_recent > 0 (flags 0x{:x}, refine_recent = {})",
                    flags, q.refine_recent));
  if (s.g0 < 0 || s.g1 <= s.g0 || s.g1 > detail::kMaxPosition)
    r.fail(fmt::format("token range [{}, {}) is empty or out of [0, 2^60]", s.g0, s.g1));
  if (chunks < 1 || chunks > uint32_t(INT32_MAX)) r.fail(fmt::format("chunks = {}, must be >= 1", chunks));
  s.chunks = int(chunks);
  if (s.is_sink != (s.g0 < o.sink_tokens))
    r.fail(fmt::format("is_sink = {} for a segment starting at {} (sink_tokens = {})", s.is_sink, s.g0, o.sink_tokens));
  if (flags & kFlagSpanChunk) {
    s.span = r.get<int64_t>("span");
    if (q.span_mode != SpanMode::Incremental || !s.packed || s.is_sink || s.chunks != 1 || s.span < 0)
      r.fail(
          fmt::format("a chunk of span {} must be one packed non-sink chunk (chunks = 1) of a cache with span_mode "
                      "= incremental, and its span id >= 0 (packed = {}, is_sink = {}, chunks = {}, span_mode = {})",
                      s.span, s.packed, s.is_sink, s.chunks, name(q.span_mode)));
  } else if (s.packed && !s.is_sink && q.span_mode == SpanMode::Incremental) {
    r.fail("a packed non-sink segment of a cache with span_mode = incremental must be a chunk of a span (flag 0x1)");
  }
  const int64_t n = s.g1 - s.g0;
  if (!s.packed) {
    if (s.chunks != 1) r.fail(fmt::format("a raw segment holds one chunk, got chunks = {}", s.chunks));
    if (n > o.cache_size)
      r.fail(fmt::format("a raw chunk of {} tokens is longer than the cache ({})", n, o.cache_size));
    const size_t raw = size_t(o.batch * n * o.heads * o.head_dim) * dtype_size(o.dtype);
    if (r.remaining() != 2 * raw)
      r.fail(fmt::format("{} bytes of K and V, a raw [{}, {}, {}, {}] {} chunk has {}", r.remaining(), o.batch, n,
                         o.heads, o.head_dim, dtype_name(o.dtype), 2 * raw));
    for (AlignedBuffer* dst : {&s.k_raw, &s.v_raw}) {
      const auto b = r.get_bytes(raw, "raw K/V");
      *dst = AlignedBuffer::uninitialized(raw);
      std::memcpy(dst->data(), b.data(), raw);
      // Raw chunks are encoded later: they must hold what update() accepts.
      const ConstTensorView t{dst->data(), o.dtype, {o.batch, n, o.heads, o.head_dim}};
      check_finite_and_bounded(t, dst == &s.k_raw ? "raw K" : "raw V");
    }
    return s;
  }
  if (!q.enabled()) r.fail("a packed segment in a cache with quantization off");
  if (s.span < 0) {
    s.k_enc = get_encoded(r, Arrays::All);
    s.v_enc = get_encoded(r, Arrays::All);
    r.expect_end();
    check_layout_fits(s.k_enc, o, q, CacheRole::Key, true, n, "K");
    check_layout_fits(s.v_enc, o, q, CacheRole::Value, true, n, "V");
    return s;
  }
  const auto sp = std::lower_bound(spans.begin(), spans.end(), s.span,
                                   [](const detail::PackedSpanData& a, int64_t id) { return a.id < id; });
  if (sp == spans.end() || sp->id != s.span) r.fail(fmt::format("span {} has no span section", s.span));
  s.k_enc = get_encoded(r, Arrays::WithoutCodebooks);
  s.v_enc = get_encoded(r, Arrays::WithoutCodebooks);
  check_layout_fits(s.k_enc, o, q, CacheRole::Key, true, n, "K");
  check_layout_fits(s.v_enc, o, q, CacheRole::Value, true, n, "V");
  check_span_chunk(s.k_enc, sp->k, "K");
  check_span_chunk(s.v_enc, sp->v, "V");
  if (flags & kFlagRefined) {  // format 1.4: the refinement layers, whole f32 encodings
    for (std::optional<EncodedTensor>* ref : {&s.k_ref, &s.v_ref}) {
      const bool is_k = ref == &s.k_ref;
      *ref = get_encoded(r, Arrays::All);
      const CodecConfig want =
          refinement_config(q.refine_bits, q.codec(is_k ? CacheRole::Key : CacheRole::Value).block_size, q.seed);
      const EncodingLayout expect = EncodingLayout::of({o.batch, n, o.heads, o.head_dim}, DType::F32, want);
      if (!(static_cast<const EncodingLayout&>(**ref) == expect))
        r.fail(fmt::format(
            "the {} refinement layer is a {} {} encoding (bits={} centroids={} stages={}); this cache's "
            "layers are {} {} encodings with {}",
            is_k ? "K" : "V", (*ref)->shape.str(), dtype_name((*ref)->dtype), (*ref)->bits, (*ref)->centroids,
            (*ref)->stages, expect.shape.str(), dtype_name(expect.dtype), want.describe()));
    }
  }
  r.expect_end();
  return s;
}

// The incremental-span bookkeeping against the segments and span sections
// (docs/snapshot.md): ids in order, a span's chunks adjacent and at most span_chunks
// of them, every span section used, the open span the last one started.
void check_span_state(const detail::PackedStateData& d) {
  const QuantArgs& q = d.quant;
  const detail::SpanState& ss = d.span_state;
  if (q.span_mode != SpanMode::Incremental) return;  // no span state (entries and sections absent)
  auto bad = [](const std::string& m) { corrupt("state", m); };
  if (ss.next_span < 0 || ss.next_span > detail::kMaxPosition)
    bad(fmt::format("next_span = {} is out of [0, 2^60]", ss.next_span));
  if (ss.open_span != ss.next_span - 1)
    bad(fmt::format("open_span = {} must be the last span started (next_span - 1 = {})", ss.open_span,
                    ss.next_span - 1));
  if (ss.open_span < 0 ? ss.open_span_chunks != 0 : ss.open_span_chunks < 1 || ss.open_span_chunks > q.span_chunks)
    bad(fmt::format("open_span_chunks = {} is out of [{}, {}] (open_span = {}, span_chunks = {})", ss.open_span_chunks,
                    ss.open_span < 0 ? 0 : 1, ss.open_span < 0 ? 0 : q.span_chunks, ss.open_span, q.span_chunks));
  if (ss.span_breaks < 0 || ss.span_breaks > std::max<int64_t>(0, ss.next_span - 1))
    bad(fmt::format("span_breaks = {} is out of [0, {}] (every break starts one of the {} spans after the first)",
                    ss.span_breaks, std::max<int64_t>(0, ss.next_span - 1), ss.next_span));
  for (double e : {ss.open_k_energy, ss.open_v_energy})
    if (std::signbit(e) || (ss.open_span < 0 && e != 0))
      bad(fmt::format("open span energies {} and {} must be >= 0 (and 0 without an open span)", ss.open_k_energy,
                      ss.open_v_energy));
  if (ss.open_span >= 0 && (d.spans.empty() || d.spans.back().id != ss.open_span))
    bad(fmt::format("the open span {} has no span section (the last one)", ss.open_span));
  for (const detail::PackedSpanData& sp : d.spans)
    if (sp.id >= ss.next_span) bad(fmt::format("span {} is not below next_span = {}", sp.id, ss.next_span));
  // Chunks: spans oldest first, each span's chunks adjacent, at most span_chunks (the
  // open span: open_span_chunks, some of them maybe evicted).
  std::vector<bool> used(d.spans.size(), false);
  const auto& segs = d.segments;
  int64_t last = -1, run = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const int64_t id = segs[i].span;
    if (id < 0) continue;
    if (id < last || (id == last && segs[i - 1].span != id))
      bad(
          fmt::format("segment {} is a chunk of span {} after a chunk of span {}: the chunks of a span are adjacent, "
                      "spans in order",
                      i, id, last));
    run = id == last ? run + 1 : 1;
    last = id;
    const int64_t limit = id == ss.open_span ? ss.open_span_chunks : q.span_chunks;
    if (run > limit) bad(fmt::format("span {} has more than {} chunks (segment {})", id, limit, i));
    const auto sp = std::lower_bound(d.spans.begin(), d.spans.end(), id,
                                     [](const detail::PackedSpanData& a, int64_t x) { return a.id < x; });
    used[size_t(sp - d.spans.begin())] = true;  // get_segment() found it
  }
  // Chunks of a span can only be missing by eviction, which drops the oldest non-sink
  // segments: the open span holds all its chunks, or it starts the non-sink segments.
  const auto first_nonsink = std::find_if(segs.begin(), segs.end(), [](const auto& g) { return !g.is_sink; });
  const auto first_open = std::find_if(segs.begin(), segs.end(), [&](const auto& g) { return g.span == ss.open_span; });
  const auto held = std::count_if(segs.begin(), segs.end(), [&](const auto& g) { return g.span == ss.open_span; });
  if (ss.open_span >= 0 && held > 0 && held < ss.open_span_chunks && first_open != first_nonsink)
    bad(
        fmt::format("the open span {} holds {} of its {} chunks, but only evicted chunks (before the first non-sink "
                    "segment) can be missing",
                    ss.open_span, held, ss.open_span_chunks));
  for (size_t i = 0; i < d.spans.size(); ++i)
    if (!used[i] && d.spans[i].id != ss.open_span)
      corrupt(section_name(uint32_t(Kind::Span), uint32_t(i)),
              fmt::format("span {} has no chunk and is not the open span", d.spans[i].id));
}

// The invariants the packed cache and its policy rely on (docs/snapshot.md).
void check_packed_state(const detail::PackedStateData& d) {
  const CacheOptions& o = d.options;
  const QuantArgs& q = d.quant;
  const auto& segs = d.segments;
  auto bad = [](const std::string& m) { corrupt("state", m); };
  if (d.global_end < 0 || d.global_end > detail::kMaxPosition)
    bad(fmt::format("global_end = {} is out of [0, 2^60]", d.global_end));
  if (segs.empty() != (d.global_end == 0) || segs.empty() != !d.chunk_tokens)
    bad(fmt::format("{} segments, global_end = {} and chunk_tokens = {} do not agree", segs.size(), d.global_end,
                    d.chunk_tokens ? std::to_string(*d.chunk_tokens) : "none"));
  if (d.chunk_tokens && (*d.chunk_tokens < 1 || *d.chunk_tokens > o.cache_size))
    bad(fmt::format("chunk_tokens = {} is out of [1, cache_size = {}]", *d.chunk_tokens, o.cache_size));
  if (segs.empty()) {
    if (d.warm_k) bad("warm-start codebooks in an empty cache");
    return;
  }
  // Sorted; adjacent segments touch, except for the evicted tokens between the sink
  // segments and the first non-sink segment, which must all lie before the window's
  // tail: every token a view can show, [0, sink_end) and [tail_start, global_end),
  // is held.
  const int64_t sink_end = std::min(o.sink_tokens, d.global_end);
  const int64_t tail = std::max(sink_end, d.global_end - std::max<int64_t>(0, o.window() - sink_end));
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    const auto &a = segs[i], &b = segs[i + 1];
    if (a.g1 == b.g0) continue;
    // The sink is never evicted: the gap starts at or after its end (fuzz finding 13).
    if (a.g1 > b.g0 || !a.is_sink || b.is_sink || a.g1 < sink_end || b.g0 > tail)
      bad(
          fmt::format("segment {} ends at {} but segment {} starts at {} (only the evicted tokens between the "
                      "sink's end at {} and the window's tail at {} may be missing)",
                      i, a.g1, i + 1, b.g0, sink_end, tail));
  }
  if (segs.back().g1 != d.global_end)
    bad(fmt::format("the last segment ends at {}, global_end is {}", segs.back().g1, d.global_end));
  if (segs.back().packed) bad("the last segment (the current chunk) is packed");
  if (sink_end > 0 ? segs.front().g0 != 0 : segs.front().g0 > tail)
    bad(fmt::format("the segments start at {}; the window needs {}", segs.front().g0, sink_end > 0 ? 0 : tail));
  // Encoding order: packed non-sink spans come before raw non-sink chunks (oldest
  // first); with sink_span = full no raw sink chunk follows a packed one.
  bool raw_nonsink = false, packed_sink = false;
  for (size_t i = 0; i < segs.size(); ++i) {
    const auto& s = segs[i];
    if (!s.is_sink) {
      if (s.packed && raw_nonsink) bad(fmt::format("packed segment {} follows a raw non-sink chunk", i));
      raw_nonsink = raw_nonsink || !s.packed;
    } else {
      if (!s.packed && packed_sink && q.sink_span == SinkSpan::Full)
        bad(fmt::format("raw sink segment {} follows the packed sink span (sink_span = full)", i));
      packed_sink = packed_sink || s.packed;
    }
  }
  // Refinement layers (format 1.4): exactly the refine_recent newest packed chunks of
  // incremental spans hold them (all of them when there are fewer).
  int64_t newer = 0;
  for (size_t i = segs.size(); i-- > 0;) {
    const auto& s = segs[i];
    if (s.span < 0) continue;
    const bool want = newer++ < q.refine_recent;
    if (s.k_ref.has_value() != want)
      bad(
          fmt::format("segment {} {} refinement layers; with refine_recent = {} exactly the {} newest chunks of "
                      "incremental spans hold them",
                      i, s.k_ref ? "holds" : "lacks", q.refine_recent, q.refine_recent));
  }
  if (d.warm_k.has_value() != d.warm_v.has_value()) bad("warm-start codebooks for only one of K and V");
  if (d.warm_k && (!q.enabled() || q.init != Init::Warm)) bad("warm-start codebooks in a cache with init != warm");
}

detail::PackedStateData read_packed(const Source& src, const SnapshotExpectation& x) {
  Opened o = open_snapshot(src, "packed", x);
  detail::PackedStateData d;
  d.options = o.config.options;
  d.quant = *o.config.quant;
  const uint16_t minor = o.table.minor;
  const std::vector<TableEntry>& t = o.table.entries;
  if (t[1].kind != uint32_t(Kind::State))
    corrupt("section table", fmt::format("section 1 is '{}', expected 'state'", t[1].name()));
  int64_t nseg = 0, nspan = 0;
  bool warm = false;
  {
    KvReader kv(read_entries(read_section(src, t[1]).bytes, "state"), "state");
    d.global_end = kv.i64("global_end");
    d.chunk_tokens = kv.opt_i64("chunk_tokens");
    nseg = kv.i64("segments");
    warm = kv.boolean("warm");
    if (d.quant.span_mode == SpanMode::Incremental) {  // format 1.1
      detail::SpanState& ss = d.span_state;
      nspan = kv.i64("spans");
      ss.open_span = kv.i64("open_span");
      ss.open_span_chunks = kv.i32("open_span_chunks");
      ss.next_span = kv.i64("next_span");
      ss.span_breaks = kv.i64("span_breaks");
      ss.open_k_energy = kv.real("open_k_energy");
      ss.open_v_energy = kv.real("open_v_energy");
    }
    kv.expect_all_read();
  }
  if (nseg < 0 || uint64_t(nseg) > t.size())
    corrupt("state", fmt::format("segments = {} but the file has {} sections", nseg, t.size()));
  if (nspan < 0 || uint64_t(nspan) > t.size())
    corrupt("state", fmt::format("spans = {} but the file has {} sections", nspan, t.size()));
  std::vector<std::pair<Kind, uint32_t>> want = {{Kind::Config, 0}, {Kind::State, 0}};
  for (int64_t i = 0; i < nspan; ++i) want.emplace_back(Kind::Span, uint32_t(i));
  for (int64_t i = 0; i < nseg; ++i) want.emplace_back(Kind::Segment, uint32_t(i));
  if (warm) want.insert(want.end(), {{Kind::WarmK, 0}, {Kind::WarmV, 0}});
  expect_sections(o.table, want);
  size_t next = 2;
  d.spans.reserve(size_t(nspan));
  for (int64_t i = 0; i < nspan; ++i) {
    const TableEntry& e = t[next++];
    const SectionBytes b = read_section(src, e);
    d.spans.push_back(in_section(e.name(), [&] { return get_span(b.bytes, e.name(), d.options, d.quant); }));
    if (i > 0 && d.spans[size_t(i)].id <= d.spans[size_t(i) - 1].id)
      corrupt(e.name(), fmt::format("span id {} follows span id {} (span sections are in increasing id order)",
                                    d.spans[size_t(i)].id, d.spans[size_t(i) - 1].id));
  }
  d.segments.reserve(size_t(nseg));
  for (int64_t i = 0; i < nseg; ++i) {
    const TableEntry& e = t[next++];
    const SectionBytes b = read_section(src, e);
    d.segments.push_back(
        in_section(e.name(), [&] { return get_segment(b.bytes, e.name(), d.options, d.quant, minor, d.spans); }));
  }
  if (warm) {
    for (size_t i = 0; i < 2; ++i) {
      const TableEntry& e = t[next++];
      const SectionBytes b = read_section(src, e);
      in_section(e.name(), [&] {
        ByteReader r(b.bytes, "invalid snapshot: " + e.name());
        EncodedTensor w = get_encoded(r, Arrays::CodebooksOnly);
        r.expect_end();
        if (!d.quant.enabled()) throw InvalidArgument("warm-start codebooks in a cache with quantization off");
        check_layout_fits(w, d.options, d.quant, i == 0 ? CacheRole::Key : CacheRole::Value, false, 0,
                          "the warm-start codebook");
        (i == 0 ? d.warm_k : d.warm_v) = std::move(w);
        return 0;
      });
    }
  }
  check_packed_state(d);
  check_span_state(d);
  return d;
}

// ---- inspect ---------------------------------------------------------------------------------
SnapshotInfo inspect_source(const Source& src, bool verify) {
  const Table t = read_table(src);
  SnapshotInfo info;
  info.major = t.major;
  info.minor = t.minor;
  info.file_bytes = src.size();
  for (const TableEntry& e : t.entries) {
    SnapshotSectionInfo s{e.name(), e.offset, e.length, e.checksum, std::nullopt};
    const bool small = e.kind == uint32_t(Kind::Config) || e.kind == uint32_t(Kind::State);
    if (small) {
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
      std::vector<uint8_t> chunk(size_t(std::min<uint64_t>(e.length, uint64_t(1) << 20)));
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

// ---- public ---------------------------------------------------------------------------------
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
    std::array<uint8_t, 8> m{};
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

void DenseCausalCache::save(const std::filesystem::path& path) const {
  save_state(path, detail::SnapshotAccess::state(*this));
}
std::vector<uint8_t> DenseCausalCache::snapshot_bytes() const {
  return bytes_of_state(detail::SnapshotAccess::state(*this));
}
DenseCausalCache DenseCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect,
                                        GrowStorage storage) {
  return detail::with_path(path, [&] {
    const FileSource src(path);
    return detail::SnapshotAccess::make(read_dense(src, expect), std::move(storage));
  });
}
DenseCausalCache DenseCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                       const SnapshotExpectation& expect, GrowStorage storage) {
  return detail::SnapshotAccess::make(read_dense(MemorySource(bytes), expect), std::move(storage));
}

void PackedCausalCache::save(const std::filesystem::path& path) const {
  save_state(path, detail::SnapshotAccess::state(*this));
}
std::vector<uint8_t> PackedCausalCache::snapshot_bytes() const {
  return bytes_of_state(detail::SnapshotAccess::state(*this));
}
PackedCausalCache PackedCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect) {
  return detail::with_path(path, [&] {
    const FileSource src(path);
    return detail::SnapshotAccess::make(read_packed(src, expect));
  });
}
PackedCausalCache PackedCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                         const SnapshotExpectation& expect) {
  return detail::SnapshotAccess::make(read_packed(MemorySource(bytes), expect));
}

}  // namespace qvg
