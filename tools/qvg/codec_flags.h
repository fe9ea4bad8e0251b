// tools/qvg/codec_flags.h — the codec flags shared by `encode`, `eval`, `simulate`,
// `compare` and `memory`: one flag per shared codec row of the settings table
// (qvg/settings.h: Setting::cli, e.g. --bits --centroids --block-size --stages --iters
// --asymmetric --scaling --scale-dtype --init --seed --scale-search), plus --threads
// and --profile. Registered, read and explained from the table: a new codec setting is
// a row, not a flag here.
//
// Defaults are those of the command's group (CodecDefaults; the help says each
// group's default and why they differ). Values are parsed while the command line is
// parsed, into the CodecConfig given to add_codec_flags (which must outlive the
// CLI::App), by the table's one parser (parse_setting): a malformed value (not an
// integer, a name outside its set, a width without a code format) throws
// qvg::InvalidArgument naming the flag, the value and what is allowed; range checks
// run in check_codec_flags (those that need the data, block size vs head_dim, once the
// input is read).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_util.h"
#include "qvg/config.h"
#include "qvg/settings.h"
#include "qvg/tensor.h"

namespace qvg::cli {

/// The groups of commands with their own codec defaults (each flag's help names them).
enum class CodecDefaults : uint8_t {
  TensorFile,  ///< encode, eval: spec 1's (CodecConfig{}), the finer 4-bit width for a tensor file
  Stream,      ///< simulate, compare: the published QVG runs' (default_packed_config()), which they reproduce
  Engine,      ///< memory: the engine's (a cache built with kv_cache_quant=int2)
};

/// Which codec flags a command has and how they read.
struct CodecFlagsOf {
  CodecDefaults defaults = CodecDefaults::TensorFile;
  /// The command runs a cache: a value that needs one (Setting::cache_only, init=warm)
  /// is accepted; the others refuse it naming the flag.
  bool cache = false;
  /// The settings (rows' names, or "threads") without a flag here.
  std::span<const std::string_view> skip = {};
};

/// The codec defaults of a group of commands.
CodecConfig codec_defaults(CodecDefaults which);

/// Adds the codec flags and --profile to `cmd`, writing into `cfg` (reset to the
/// group's defaults here).
void add_codec_flags(CLI::App& cmd, CodecConfig& cfg, const CodecFlagsOf& how = {});

/// The option add_codec_flags registered for each shared codec row that has one.
using CodecFlagOptions = std::vector<std::pair<const Setting*, const CLI::Option*>>;

/// Adds `--profile NAME` (QuantArgs::apply_profile: reference | hq | recommended); once
/// the command line is parsed, every shared codec setting of cfg whose flag in `flags`
/// was not given, or that has no flag there, takes the profile's value (of K's codec),
/// so explicit flags override the profile whatever their order, and an option of the
/// same name that is not the codec's (simulate's --bits list, compare's video --seed)
/// never decides. add_codec_flags calls it. The profile's policy settings
/// (recommended's) are the caller's to apply: apply_cache_flags with given_profile(cmd).
void add_profile_flag(CLI::App& cmd, CodecConfig& cfg, std::shared_ptr<const CodecFlagOptions> flags);

/// The name given to cmd's `--profile` (after parsing), or nullopt when it was not given.
std::optional<std::string> given_profile(const CLI::App& cmd);

/// Adds `--k-config LIST` and `--v-config LIST`: K's and V's own codec settings over the
/// shared ones, as "field=value,..." text (read with parse_role_codec; the fields are
/// the settings table's per-role rows).
void add_role_config_flags(CLI::App& cmd, std::string& k_config, std::string& v_config);

/// Adds `--codec-seed UINT` (the codec's seed as text; parse with parse_seed_flag).
CLI::Option* add_codec_seed_flag(CLI::App& cmd, std::string& codec_seed);

/// For a float32 input: the sentence saying that its codebooks are stored in float32
/// (the input's dtype, spec 1.5) and what the same tensor would cost in bf16, e.g.
/// "codebooks stored in float32, the input's dtype (3.94 bits per element; in bf16 the
/// same tensor would take 3.06)". Empty for 16-bit inputs.
std::string codebook_dtype_note(const Shape4& shape, DType input, const CodecConfig& cfg);

/// Post-parse checks before any input is read: cfg.validate() (bits, centroids, ...).
/// Throws InvalidArgument ("invalid codec flags: ...").
void check_codec_flags(const CodecConfig& cfg);

/// Post-parse checks once the input's head_dim is known: cfg.validate_for_head_dim().
void check_codec_flags(const CodecConfig& cfg, int64_t head_dim);

}  // namespace qvg::cli
