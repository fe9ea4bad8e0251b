// tools/qvg/codec_flags.h — the codec flags shared by `encode`, `eval` and later
// commands: --bits --centroids --block-size --stages --iters --asymmetric
// --scale-dtype --scaling --init --seed --threads.
//
// Defaults are those of spec section 1, with --bits 4. Values are parsed while the
// command line is parsed, into the CodecConfig given to add_codec_flags (which must
// outlive the CLI::App). A malformed value (not an integer, a name outside its set)
// throws qvg::InvalidArgument naming the flag, the value and what is allowed; range
// checks that need the data (block size vs head_dim) run in check_codec_flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_util.h"
#include "qvg/config.h"
#include "qvg/tensor.h"

namespace qvg::cli {

/// Adds the codec flags to `cmd`, writing into `cfg` (reset to the defaults here).
void add_codec_flags(CLI::App& cmd, CodecConfig& cfg);

/// Adds `--profile NAME` (QuantArgs::apply_profile: reference | hq | recommended); once
/// the command line is parsed, every codec field of cfg whose flag was not given takes
/// the profile's value, so explicit flags override the profile whatever their order.
/// add_codec_flags calls it. The profile's policy settings (recommended's) are the
/// caller's to apply: apply_cache_flags with given_profile(cmd).
void add_profile_flag(CLI::App& cmd, CodecConfig& cfg);

/// The name given to cmd's `--profile` (after parsing), or nullopt when it was not given.
std::optional<std::string> given_profile(const CLI::App& cmd);

/// add_codec_flags for the commands that stream a workload (simulate, compare): the
/// published QVG configuration's defaults (--bits 2, --centroids 256), and no --seed
/// (theirs names the workload's video; add_codec_seed_flag adds the codec's).
void add_stream_codec_flags(CLI::App& cmd, CodecConfig& cfg);

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
