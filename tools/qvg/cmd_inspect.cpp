// `qvg inspect FILE`: what a `.qvgt` file or a cache snapshot holds — kind, format
// version, shapes, configuration, sizes and checksum status — read from its header
// (and, for snapshots, its sections streamed through their checksums) without
// loading the payload. A snapshot whose checksums fail is reported in full, then the
// command exits 1 naming the failing sections.
#include <algorithm>
#include <memory>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "command.h"
#include "qvg/error.h"
#include "qvg/io.h"
#include "qvg/snapshot.h"

namespace qvg::cli {
namespace {

struct InspectOptions {
  std::string file;
  bool json = false;
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += fmt::format("{}{}", i ? ", " : "", s[i]);
  return r + "]";
}

/// An entry's text value as JSON: a number, true/false or an array of numbers when the
/// whole text is one ("1", "true", "[1,24,2,64]"), null for "none" (an absent value:
/// attention_window_size, bits with quantization off), else the text as a string
/// ("fp8_e4m3", "chunk").
nlohmann::ordered_json typed_value(const std::string& v) {
  if (v == "none") return nullptr;
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(v, nullptr, /*allow_exceptions=*/false);
  if (j.is_number() || j.is_boolean()) return j;
  if (j.is_array() && std::all_of(j.begin(), j.end(), [](const auto& x) { return x.is_number(); })) return j;
  return v;
}

std::string entries_text(const std::vector<std::pair<std::string, std::string>>& e) {
  std::string r;
  for (const auto& [k, v] : e) r += fmt::format("{}{}={}", r.empty() ? "" : " ", k, v);
  return r;
}

void inspect_snapshot_file(const InspectOptions& o) {
  const SnapshotInfo info = inspect_snapshot(o.file);
  std::string failing;
  int bad = 0;
  for (const auto& s : info.sections)
    if (!s.checksum_ok.value_or(false)) failing += fmt::format("{}{}", bad++ ? ", " : "", s.name);
  if (o.json) {
    nlohmann::ordered_json j = {{"file", o.file},
                                {"kind", "snapshot"},
                                {"format", fmt::format("{}.{}", info.major, info.minor)},
                                {"byte_order", "little-endian"},
                                {"bytes", info.file_bytes},
                                {"cache", info.cache},
                                {"device", info.device}};
    for (const char* part : {"config", "state"}) {
      nlohmann::ordered_json e = nlohmann::ordered_json::object();
      for (const auto& [k, v] : std::string(part) == "config" ? info.config : info.state) e[k] = typed_value(v);
      j[part] = e;
    }
    nlohmann::ordered_json secs = nlohmann::ordered_json::array();
    for (const auto& s : info.sections)
      secs.push_back({{"name", s.name},
                      {"offset", s.offset},
                      {"bytes", s.length},
                      {"xxh64", fmt::format("{:016x}", s.checksum)},
                      {"checksum", s.checksum_ok ? (*s.checksum_ok ? "ok" : "BAD") : "unchecked"}});
    j["sections"] = secs;
    j["checksums_ok"] = bad == 0;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("file       {}: qvg cache snapshot, format {}.{}, little-endian, {} bytes\n", o.file, info.major,
               info.minor, info.file_bytes);
    fmt::print("cache      {} (saved from device {})\n", info.cache.empty() ? "?" : info.cache,
               info.device.empty() ? "?" : info.device);
    fmt::print("config     {}\n", info.config.empty() ? "(unreadable: checksum)" : entries_text(info.config));
    fmt::print("state      {}\n", info.state.empty() ? "(unreadable: checksum)" : entries_text(info.state));
    fmt::print("sections   {:<12} {:>12} {:>12}  {:<16}  {}\n", "name", "offset", "bytes", "xxh64", "checksum");
    for (const auto& s : info.sections)
      fmt::print("           {:<12} {:>12} {:>12}  {:016x}  {}\n", s.name, s.offset, s.length, s.checksum,
                 s.checksum_ok ? (*s.checksum_ok ? "ok" : "BAD") : "unchecked");
    if (bad == 0)
      fmt::print("checksums  ok: all {} sections\n", info.sections.size());
    else
      fmt::print("checksums  BAD: {} of {} sections ({})\n", bad, info.sections.size(), failing);
  }
  if (bad)
    throw CorruptData(fmt::format("'{}': {} of {} sections fail their checksum ({})", o.file, bad,
                                  info.sections.size(), failing));
}

void inspect_qvgt_file(const InspectOptions& o) {
  const QvgtInfo info = inspect_qvgt(o.file);
  const EncodingLayout& l = info.layout;
  const double bpe = double(info.encoded_bytes) * 8.0 / double(l.shape.numel());
  if (o.json) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : info.metadata) meta[k] = typed_value(v);
    nlohmann::ordered_json arrays = nlohmann::ordered_json::array();
    for (const auto& a : info.arrays) arrays.push_back({{"name", a.name}, {"dtype", a.dtype}, {"shape", a.shape}, {"bytes", a.bytes}});
    const nlohmann::ordered_json j = {{"file", o.file},
                                      {"kind", "qvgt"},
                                      {"format", qvgt_format(l)},
                                      {"bytes", info.file_bytes},
                                      {"header_bytes", info.header_bytes},
                                      {"metadata", meta},
                                      {"arrays", arrays},
                                      {"encoded_bytes", info.encoded_bytes},
                                      {"bits_per_element", bpe},
                                      {"checksums", "none in this format"}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("file       {}: qvg packed tensor (.qvgt), format {}, {} bytes (header {})\n", o.file, qvgt_format(l),
             info.file_bytes, info.header_bytes);
  fmt::print("tensor     {} {} (layout BSHD)\n", dtype_name(l.dtype), l.shape.str());
  fmt::print("config     bits={} block_size={} stages={} centroids={} asymmetric={} scale_dtype={} scaling={}\n", l.bits,
             l.block_size, l.stages, l.centroids, l.asymmetric, name(l.scale_dtype), name(l.scaling));
  fmt::print("arrays     {:<14} {:<8} {:<22} {:>12}\n", "name", "dtype", "shape", "bytes");
  for (const auto& a : info.arrays)
    fmt::print("           {:<14} {:<8} {:<22} {:>12}\n", a.name, a.dtype, shape_text(a.shape), a.bytes);
  fmt::print("encoded    {} bytes ({:.4f} bits/element)\n", info.encoded_bytes, bpe);
  fmt::print("checksums  none: the .qvgt format carries no checksums (values are checked when it is decoded)\n");
}

void run_inspect(const InspectOptions& o) {
  if (is_snapshot_file(o.file)) {
    inspect_snapshot_file(o);
    return;
  }
  try {
    inspect_qvgt_file(o);
  } catch (const CorruptData& e) {
    throw CorruptData(fmt::format("{} (and it is not a qvg cache snapshot: no \\x89QVGSNAP magic)", e.what()));
  }
}

void register_inspect(CLI::App& root) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = root.add_subcommand(
      "inspect", "Show what a .qvgt file or a cache snapshot holds (kind, version, shapes, config, sizes, checksums)");
  cmd->add_option("file", o->file, "a .qvgt file or a cache snapshot")->required();
  cmd->add_flag("--json", o->json, "print one JSON object instead of text");
  cmd->callback([o] { run_inspect(*o); });
}

QVG_REGISTER_COMMAND(register_inspect);

}  // namespace
}  // namespace qvg::cli
