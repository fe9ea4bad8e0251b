// The records of a dense cache's snapshot (snapshot_records.h), writer and reader
// side by side: config, state (the cursors, current size and window), buffer_k,
// buffer_v (the buffers as they are in memory, every slot).
#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cache/snapshot_config.h"
#include "cache/snapshot_entries.h"
#include "cache/snapshot_records.h"
#include "cache/snapshot_validate.h"

namespace qvg::detail::snap {

namespace {

// ---- the state record: four i64 entries, in this order; written and read from one list ----
template <class State>
std::array<std::pair<std::string_view, int64_t State::*>, 4> state_fields() {
  return {{{"cache_size", &State::cache_size},
           {"attention_window_size", &State::window},
           {"global_end", &State::global_end},
           {"local_end", &State::local_end}}};
}

KvWriter state_entries(const DenseStateRef& st) {
  KvWriter kv;
  for (const auto& [key, member] : state_fields<DenseStateRef>()) kv.i64(key, st.*member);
  return kv;
}

void get_state(KvReader kv, DenseStateData& d) {
  for (const auto& [key, member] : state_fields<DenseStateData>()) d.*member = kv.i64(key);
  kv.expect_all_read();
}

}  // namespace

// ---- the file ---------------------------------------------------------------------------
Written write_dense(const DenseStateRef& st) {
  Written w;
  w.minor = minor_needed(st.options, nullptr);
  w.sections.push_back(kv_section(Kind::Config, config_entries("dense", st.options, nullptr, w.minor)));
  w.sections.push_back(kv_section(Kind::State, state_entries(st)));
  for (Kind k : {Kind::BufferK, Kind::BufferV}) {
    SectionOut s;
    s.kind = k;
    s.ref(k == Kind::BufferK ? st.k : st.v);
    w.sections.push_back(std::move(s));
  }
  return w;
}

DenseStateData read_dense(const Source& src, const SnapshotExpectation& x) {
  Opened o = open_snapshot(src, "dense", x);
  expect_sections(o.table, {{Kind::Config, 0}, {Kind::State, 0}, {Kind::BufferK, 0}, {Kind::BufferV, 0}});
  DenseStateData d;
  d.options = o.config.options;
  const CacheOptions& opt = d.options;
  const std::vector<TableEntry>& t = o.table.entries;
  get_state(KvReader(read_entries(read_section(src, t[kStateSection]).bytes, "state"), "state"), d);
  check_dense_state(d);
  const uint64_t buf = uint64_t(opt.batch * d.cache_size * opt.heads * opt.head_dim) * dtype_size(opt.dtype);
  size_t next = kPayloadSection;
  for (AlignedBuffer* dst : {&d.k, &d.v}) {
    const TableEntry& e = t[next++];
    if (e.length != buf)
      corrupt(e.name(), fmt::format("{} bytes, a [{}, {}, {}, {}] {} buffer has {}", e.length, opt.batch, d.cache_size,
                                    opt.heads, opt.head_dim, dtype_name(opt.dtype), buf));
    *dst = read_raw_section(src, e);
  }
  return d;
}

}  // namespace qvg::detail::snap
