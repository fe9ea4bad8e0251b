// qvg/settings.h — the one table of QuantArgs' settings (docs/design.md, "One home for
// each rule").
//
// Every setting of QuantArgs (and of its per-role overrides RoleCodec k/v) is one row:
// its name (the member, the snapshot key, the Python field and the binding's dict key),
// its flag suffix (after "kv_cache_quant"), its kind and range, the first snapshot
// format minor that stores it, and how to read and write it (a codec setting: its
// member of CodecConfig; a policy setting: accessors of QuantArgs). The places that list the
// settings walk this table instead of naming fields: QuantArgs::from_flags, the
// per-role overrides (RoleCodec), the profiles, the CLI's codec and policy flags, the
// snapshot's config record (write, read, minor_needed, the caller's expectation), the
// binding's dict <-> struct and the Python dataclass (checked against the table by a
// test). `threads` is not a row: it is how a call runs, never a property of the data.
//
// Values are plain: SettingValue holds none (an unset override, or quantization off
// for `bits`), an integer, an unsigned integer (seed), a boolean, a real or a name.
// parse_setting() is the one text parser of every surface (engine flags, the CLI,
// k_config/v_config): decimal integers only, booleans true/false/1/0 (also True/False,
// as Python prints them), reals in plain decimal or exponent form (no hex, no inf/nan).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "qvg/config.h"

namespace qvg {

/// What a setting's value is.
enum class SettingKind : uint8_t {
  Bits,   ///< optional code width (none = quantization off); text also its mode "int2"
  Int,    ///< a 32-bit integer in [lo, hi]
  Width,  ///< a code width: one with a row of qvg/code_format.h (2, 3 or 4)
  Bool,
  Name,  ///< an enumeration, by name
  Real,  ///< a finite double in [lo, hi]
  Seed,  ///< an unsigned 64-bit integer
};

/// none, integer, unsigned (seed), boolean, real, name.
using SettingValue = std::variant<std::monostate, int64_t, uint64_t, bool, double, std::string>;

/// One setting. A codec row (`field` set) reads and writes its member of CodecConfig:
/// QuantArgs::codec's for a shared row (bits: none when quantization is off), the
/// role's RoleCodec for a per-role row (none when not overridden); a cache-policy row
/// reads and writes QuantArgs through get_policy / set_policy.
struct Setting {
  std::string_view name;  ///< "centroids", "k_bits"; the member, snapshot key, Python field
  std::string_view flag;  ///< suffix of the engine flag: "_centroids" -> kv_cache_quant_centroids
  SettingKind kind;
  bool role = false;            ///< a per-role override (k_* / v_*): optional, none = the shared value
  int64_t lo = 0, hi = 0;       ///< Int, Real: the allowed range (QuantArgs::validate checks the same)
  uint16_t snapshot_minor = 0;  ///< the first snapshot format 1.x that stores it
  std::string_view allowed;     ///< what is allowed, for messages ("1..256", "off, mse")
  CodecField field = {};        ///< a codec row's member of CodecConfig; none for a policy row
  CacheRole tensor = CacheRole::Key;  ///< a per-role row's role
  /// A policy row's accessors (REQUIRES a value of the setting's kind).
  SettingValue (*get_policy)(const QuantArgs&) = nullptr;
  void (*set_policy)(QuantArgs&, const SettingValue&) = nullptr;
  /// Names accepted for a Name setting, canonical first per value (parse); empty otherwise.
  SettingValue (*parse_name)(std::string_view) = nullptr;
  /// The flag of the CLI ("--span-chunks", "--centroids") and its help; "" for settings
  /// the CLI does not set by a flag of their own. The cache-policy flags of `qvg
  /// simulate` and `qvg memory` (tools/qvg/cache_flags.h) and the codec flags of every
  /// command (tools/qvg/codec_flags.h) are registered from these.
  std::string_view cli = {};
  std::string_view cli_help = {};
  /// A Name setting's value that needs a cache (the previous segment's state: init's
  /// "warm"): the CLI's commands on one tensor refuse it.
  std::string_view cache_only = {};

  bool codec_row() const { return field.index() != 0; }
  /// q's value (none: quantization off for bits, an override not set for a role's row).
  SettingValue get(const QuantArgs& q) const;
  /// Sets q's value (REQUIRES a value of the setting's kind; none only for Bits and roles).
  void set(QuantArgs& q, const SettingValue& v) const;
};

/// Every setting, in the snapshot's config order (the order of the stored entries):
/// the shared ones, then k_*, then v_*.
std::span<const Setting> quant_settings();
/// The per-role rows of `role`, in the table's order (bit i of RoleCodec::overridden
/// is the i-th of them).
std::span<const Setting> role_settings(CacheRole role);
/// The row named `name` ("centroids", "k_bits"), or nullptr.
const Setting* find_setting(std::string_view name);
/// The row whose flag suffix is `suffix` ("_iters", "_k_bits"), or nullptr.
const Setting* find_setting_by_flag(std::string_view suffix);

/// A codec row's member of `c` (REQUIRES s.codec_row()), as a value of s's kind.
SettingValue get_codec_field(const Setting& s, const CodecConfig& c);
/// Sets a codec row's member of `c` (REQUIRES s.codec_row() and a value of s's kind).
void set_codec_field(const Setting& s, CodecConfig& c, const SettingValue& v);
/// Copies a codec row's member from `from` to `to` (REQUIRES s.codec_row()).
void copy_codec_field(const Setting& s, const CodecConfig& from, CodecConfig& to);

/// The one text parser: `text` as s's value. Throws InvalidArgument "<what> must be
/// <allowed>, got '<text>'" (what: the flag or key as the caller names it).
SettingValue parse_setting(const Setting& s, std::string_view text, std::string_view what);
/// The one rule for real-valued text on every surface (settings, engine flags and
/// every real-valued CLI flag): the whole of `text` as a finite
/// number in plain decimal or exponent form ("0.5", "1e-3", "-2"); nullopt for hex
/// floats, inf/nan, a leading '+' or blank, or anything left over.
std::optional<double> parse_real(std::string_view text);
/// A value as text: "none", decimal integers, "true"/"false", shortest round-trip reals, names.
std::string setting_text(const SettingValue& v);
/// Throws InvalidArgument naming s unless `v` is of s's kind and inside its range
/// (a single-field check; cross-field rules stay in QuantArgs::validate).
void check_setting(const Setting& s, const SettingValue& v, std::string_view what);

/// The rules across policy settings (QuantArgs::validate calls it; single fields are
/// check_setting's): refinement layers need incremental spans. InvalidArgument
/// naming both settings.
void check_policy_settings(const QuantArgs& q);

/// The names of the rows that are also fields of the engine's own QVGKVQuantArgs
/// (SGLang): an object with all of them is accepted as the engine's settings.
std::span<const std::string_view> engine_quant_fields();

/// True when q's value of s is the default QuantArgs' value.
bool is_default(const Setting& s, const QuantArgs& q);
/// The cache policy of the `recommended` profile (QuantArgs::apply_profile calls it):
/// incremental spans of 4 chunks, no adaptive breaks, keep_recent 0, sink_keep 0,
/// 4-bit refinement layers on the 4 newest encoded chunks.
void set_recommended_policy(QuantArgs& q);

}  // namespace qvg
