// The config record of a snapshot (snapshot_config.h): the CacheOptions entries (a
// table here) and the QuantArgs entries (the settings table), writer and reader side
// by side; the minor a cache needs; the kind and the caller's expectation.
#include "cache/snapshot_config.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <variant>

#include <fmt/core.h>

#include "cache/cache_common.h"
#include "core/bytes_impl.h"
#include "qvg/code_format.h"
#include "qvg/error.h"
#include "qvg/settings.h"

namespace qvg::detail::snap {

namespace {

// ---- the CacheOptions entries ---------------------------------------------------------
// One entry per CacheOptions field a snapshot stores (view_scratch is a runtime
// setting), in the config's order, after "cache" and "device".
struct OptionEntry {
  std::string_view key;
  VType type;
  bool nullable;   ///< none is a value (attention_window_size: the whole cache)
  uint16_t minor;  ///< the first format 1.x that stores it; older files: the default
  Value (*get)(const CacheOptions&);
  /// REQUIRES v of the entry's type; throws InvalidArgument for a value it cannot take.
  void (*set)(CacheOptions&, const Value& v);
  /// What the caller's expectation compares (the stored value unless said otherwise).
  Value (*compared)(const CacheOptions&);
};

constexpr std::array<OptionEntry, 9> kOptionEntries = {{
    {"batch", VType::I64, false, 0, [](const CacheOptions& o) { return Value::i64(o.batch); },
     [](CacheOptions& o, const Value& v) { o.batch = v.i; }, nullptr},
    {"cache_size", VType::I64, false, 0, [](const CacheOptions& o) { return Value::i64(o.cache_size); },
     [](CacheOptions& o, const Value& v) { o.cache_size = v.i; }, nullptr},
    {"num_heads", VType::I64, false, 0, [](const CacheOptions& o) { return Value::i64(o.heads); },
     [](CacheOptions& o, const Value& v) { o.heads = v.i; }, nullptr},
    {"head_dim", VType::I64, false, 0, [](const CacheOptions& o) { return Value::i64(o.head_dim); },
     [](CacheOptions& o, const Value& v) { o.head_dim = v.i; }, nullptr},
    {"dtype", VType::Str, false, 0, [](const CacheOptions& o) { return Value::str(std::string(dtype_name(o.dtype))); },
     [](CacheOptions& o, const Value& v) { o.dtype = parse_dtype(v.s, "entry 'dtype'"); }, nullptr},
    {"sink_tokens", VType::I64, false, 0, [](const CacheOptions& o) { return Value::i64(o.sink_tokens); },
     [](CacheOptions& o, const Value& v) { o.sink_tokens = v.i; }, nullptr},
    // An absent window equals one of cache_size for the expectation.
    {"attention_window_size", VType::I64, true, 0,
     [](const CacheOptions& o) { return Value::opt_i64(o.attention_window_size); },
     [](CacheOptions& o, const Value& v) {
       o.attention_window_size = v.type == VType::None ? std::nullopt : std::optional(v.i);
     },
     [](const CacheOptions& o) { return Value::i64(o.window()); }},
    {"allow_growth", VType::Bool, false, 0, [](const CacheOptions& o) { return Value::boolean(o.allow_growth); },
     [](CacheOptions& o, const Value& v) { o.allow_growth = v.b; }, nullptr},
    {"head_offset", VType::I64, false, kMinorHeadOffset,
     [](const CacheOptions& o) { return Value::i64(o.head_offset); },
     [](CacheOptions& o, const Value& v) { o.head_offset = v.i; }, nullptr},
}};

Value compared(const OptionEntry& e, const CacheOptions& o) {
  return e.compared ? e.compared(o) : e.get(o);
}

void put_options(KvWriter& kv, const CacheOptions& o, uint16_t minor) {
  for (const OptionEntry& e : kOptionEntries)
    if (e.minor <= minor) kv.put(e.key, e.get(o));
}

// The inverse of put_options for a file of format 1.`minor` (entries it does not
// store keep their defaults).
CacheOptions get_options(KvReader& kv, uint16_t minor) {
  CacheOptions o;
  for (const OptionEntry& e : kOptionEntries) {
    if (e.minor > minor) continue;
    const Value& v = kv.get(e.key, e.type, e.nullable);
    in_section("config", [&] {
      e.set(o, v);
      return 0;
    });
  }
  return o;
}

// The format minor a code width stored as s's value needs (its row in
// qvg/code_format.h: 0 for the engine's widths); 0 for other settings and for none.
uint16_t width_minor(const Setting& s, const SettingValue& v) {
  if ((s.kind != SettingKind::Bits && s.kind != SettingKind::Width) || !std::holds_alternative<int64_t>(v)) return 0;
  const CodeFormat* f = find_code_format(int(std::get<int64_t>(v)));
  return f ? uint16_t(f->snapshot_minor) : 0;
}

// ---- the QuantArgs entries (packed caches) --------------------------------------------
// The settings of the table, in its order, each from the minor that stores it.
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
    if (width_minor(s, v) > minor)
      corrupt("config", fmt::format("{} = {} is stored from format 1.{}, but the file is 1.{}", what, setting_text(v),
                                    width_minor(s, v), minor));
    s.set(q, v);
  }
  return q;
}

// ---- the record -----------------------------------------------------------------------
Config parse_config(std::span<const uint8_t> bytes, uint16_t minor) {
  KvReader kv(read_entries(bytes, "config"), "config");
  Config c;
  c.cache = kv.str("cache");
  if (c.cache != "dense" && c.cache != "packed")
    corrupt("config", fmt::format("entry 'cache' must be dense or packed, got '{}'", printable(c.cache)));
  c.device = kv.str("device");
  if (c.device != "cpu" && c.device != "cuda")
    corrupt("config", fmt::format("entry 'device' must be cpu or cuda, got '{}'", printable(c.device)));
  c.options = get_options(kv, minor);
  if (c.cache == "packed") c.quant = get_quant(kv, minor);
  kv.expect_all_read();
  const CacheOptions& o = c.options;
  in_section("config", [&] {
    validate_options(o);
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

void expect_equal(std::string_view field, const std::string& got, const std::string& want) {
  if (got != want)
    throw InvalidArgument(fmt::format("the snapshot's cache has {} = {}, the caller expects {}", field, got, want));
}

// Every entry of both tables (all but the runtime settings view_scratch and threads).
void check_expectation(const Config& c, const SnapshotExpectation& x) {
  if (x.options)
    for (const OptionEntry& e : kOptionEntries)
      expect_equal(e.key, compared(e, c.options).text(), compared(e, *x.options).text());
  if (x.quant && c.quant)
    for (const Setting& s : quant_settings())
      expect_equal(s.name, setting_text(s.get(*c.quant)), setting_text(s.get(*x.quant)));
}

}  // namespace

uint16_t minor_needed(const CacheOptions& o, const QuantArgs* q) {
  uint16_t m = 0;
  const CacheOptions defaults;
  for (const OptionEntry& e : kOptionEntries)
    if (e.get(o).text() != e.get(defaults).text()) m = std::max(m, e.minor);
  // Every setting whose value is not the default needs the format that stores it (so
  // the refinement width is stored whenever it is not 4, with no refined chunk too: a
  // snapshot loads into a cache of exactly its configuration, docs/snapshot.md).
  if (q)
    for (const Setting& s : quant_settings())
      if (!is_default(s, *q)) m = std::max({m, s.snapshot_minor, width_minor(s, s.get(*q))});
  return m;
}

KvWriter config_entries(const char* cache, const CacheOptions& o, const QuantArgs* q, uint16_t minor,
                        const char* device) {
  KvWriter kv;
  kv.str("cache", cache);
  kv.str("device", device);
  put_options(kv, o, minor);
  if (q) put_quant(kv, *q, minor);
  return kv;
}

Opened open_snapshot(const Source& src, const char* want_kind, const SnapshotExpectation& x) {
  check_threads("threads", x.threads);
  Opened o;
  o.table = read_table(src);
  const TableEntry& first = o.table.entries[kConfigSection];
  if (first.kind != uint32_t(Kind::Config))
    corrupt("section table", fmt::format("the first section is '{}', expected 'config'", first.name()));
  o.config = parse_config(read_section(src, first).bytes, o.table.minor);
  if (o.config.cache != want_kind)
    throw InvalidArgument(
        fmt::format("the snapshot holds a {} cache; a {} cache cannot be loaded from it", o.config.cache, want_kind));
  check_expectation(o.config, x);
  o.config.options.view_scratch = x.view_scratch;
  if (o.config.quant) o.config.quant->codec.threads = x.threads;
  return o;
}

}  // namespace qvg::detail::snap
