// src/cache/snapshot_config.h — private: the config record of a snapshot
// (docs/snapshot.md, "Config"), writer and reader side by side, and what follows from
// it: the format minor a cache needs, the cache kind and the caller's expectation.
// Its entries are driven by tables: the CacheOptions entries by the table in
// snapshot_config.cpp, the QuantArgs entries by the settings table (qvg/settings.h);
// each row carries the minor that first stores it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "cache/snapshot_entries.h"
#include "cache/snapshot_io.h"
#include "qvg/cache_options.h"
#include "qvg/config.h"
#include "qvg/snapshot.h"

namespace qvg::detail::snap {

/// The lowest format minor that holds a cache of these settings (q: packed caches):
/// the highest first minor of a setting whose value is not the default. A 1.0 file is
/// byte for byte what a 1.0 writer wrote.
uint16_t minor_needed(const CacheOptions& o, const QuantArgs* q);

/// The config entries of a cache of kind `cache` ("dense", "packed"; q for packed
/// caches) in a file of format 1.`minor`: the entries that minor stores.
KvWriter config_entries(const char* cache, const CacheOptions& o, const QuantArgs* q, uint16_t minor,
                        const char* device = "cpu");

/// A config record read and validated.
struct Config {
  std::string cache, device;
  CacheOptions options;
  std::optional<QuantArgs> quant;  ///< packed caches
};

/// A snapshot's table and its config (the kind and the caller's expectation checked).
struct Opened {
  Table table;
  Config config;
};

/// Reads the header, the table and the config of a file of a `want_kind` cache
/// ("dense", "packed"); checks the expectation and sets the runtime settings it
/// gives (view_scratch, threads). Throws CorruptData naming the part, or
/// InvalidArgument for the other cache kind or a differing expectation (naming the
/// field).
Opened open_snapshot(const Source& src, const char* want_kind, const SnapshotExpectation& x);

}  // namespace qvg::detail::snap
