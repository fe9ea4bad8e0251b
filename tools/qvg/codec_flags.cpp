// The shared codec flags (see codec_flags.h).
#include "codec_flags.h"

#include <charconv>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "qvg/codec.h"
#include "qvg/error.h"

namespace qvg::cli {

namespace {

uint64_t parse_u64_flag(const char* flag, const std::string& value) {
  uint64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end)
    throw InvalidArgument(fmt::format("{} must be an unsigned 64-bit integer, got '{}'", flag, value));
  return v;
}

// An integer flag bound to `target`. Only "is it an int" is checked here; the
// ranges are CodecConfig::validate's (one place, one message per field).
void add_int(CLI::App& cmd, const char* flag, int& target, const std::string& help) {
  cmd.add_option_function<std::string>(
         flag,
         [flag, &target](const std::string& v) {
           int x = 0;
           const char* end = v.data() + v.size();
           const auto [p, ec] = std::from_chars(v.data(), end, x);
           if (ec == std::errc::result_out_of_range)
             throw InvalidArgument(fmt::format("{} is out of range, got '{}'", flag, v));
           if (v.empty() || ec != std::errc() || p != end)
             throw InvalidArgument(fmt::format("{} must be an integer, got '{}'", flag, v));
           target = x;
         },
         help)
      ->type_name("INT")
      ->default_str(std::to_string(target));
}

// A flag naming an enum value, bound to `target` and read with `parse` (the enum's own
// parser: one list of names and one message); the default shown is the target's name.
template <class E, class Parse>
void add_named(CLI::App& cmd, const char* flag, E& target, Parse parse, const std::string& help) {
  cmd.add_option_function<std::string>(
         flag, [flag, &target, parse](const std::string& v) { target = named(flag, [&] { return parse(v); }); }, help)
      ->type_name("NAME")
      ->default_str(std::string(name(target)));
}

}  // namespace

void add_codec_flags(CLI::App& cmd, CodecConfig& cfg) {
  cfg = CodecConfig{};
  cfg.bits = 4;
  add_int(cmd, "--bits", cfg.bits,
          "residual code width: 2 or 4 (default 4 for a tensor file, the finer width; simulate, compare and memory "
          "default to 2, the width of the engine's int2 mode and of the published runs)");
  add_int(cmd, "--centroids", cfg.centroids,
          "k-means codebook size per stage and group: 1..256 (default 128, spec 1 and the engine's; simulate and "
          "compare default to 256, the published runs')");
  add_int(cmd, "--block-size", cfg.block_size,
          "channels sharing one residual scale; divides head_dim, multiple of 8/bits");
  add_int(cmd, "--stages", cfg.stages, "k-means (progressive residual) stages: >= 1");
  add_int(cmd, "--iters", cfg.kmeans_iters, "Lloyd iterations per stage: >= 1");
  cmd.add_flag("--asymmetric", cfg.asymmetric, "min/max + zero point per block instead of absmax");
  add_named(cmd, "--scale-dtype", cfg.scale_dtype, parse_scale_dtype,
            "storage of block scales and zeros: fp8_e4m3 (or fp8) | bf16");
  add_named(cmd, "--scaling", cfg.scaling, parse_scaling,
            "two_level (fp32 factor per group) | compat (the QVG Triton layout)");
  add_named(cmd, "--scale-search", cfg.scale_search, parse_scale_search,
            "the encoder's choice of each block's stored scale: off (the block maximum, spec 1.2) | mse (the "
            "least-squared-error candidate among shrunk ranges; same stored form, docs/quality.md)");
  cmd.add_option_function<std::string>(
         "--init",
         [&cfg](const std::string& v) {
           if (v == "warm")
             throw InvalidArgument(
                 "--init must be random or kmeans++, got 'warm' (warm starts need the previous "
                 "segment of a cache)");
           cfg.init = named("--init", [&] { return parse_init(v); });
         },
         "k-means initialisation: random | kmeans++")
      ->type_name("NAME")
      ->default_str("random");
  cmd.add_option_function<std::string>(
         "--seed", [&cfg](const std::string& v) { cfg.seed = parse_u64_flag("--seed", v); },
         "seed every random choice derives from")
      ->type_name("UINT")
      ->default_str(std::to_string(cfg.seed));
  add_int(cmd, "--threads", cfg.threads, "worker threads (0 = all cores); never changes bytes");
  add_profile_flag(cmd, cfg);
}

void add_profile_flag(CLI::App& cmd, CodecConfig& cfg) {
  auto profile = std::make_shared<std::string>();
  cmd.add_option("--profile", *profile,
                 "settings by name: reference (the engine's defaults, compat scaling) | hq (a codec, "
                 "docs/quality.md) | recommended (hq's codec with V's scale search off, and a "
                 "cache policy where the command has one, docs/quality.md); explicit flags override it, whatever their "
                 "order")
      ->type_name("NAME");
  // After parsing: the profile's value for every codec field whose flag was not given.
  cmd.parse_complete_callback([&cmd, &cfg, profile] {
    // Not given: nothing to apply. Given, even as '' (issue 27, item 13): a name that
    // apply_profile accepts, or its error, as from the engine's flags.
    if (cmd.get_option("--profile")->count() == 0) return;
    QuantArgs q;
    named("--profile", [&] {
      q.apply_profile(*profile);
      return 0;
    });
    const CodecConfig p = q.codec(CacheRole::Key);
    auto given = [&cmd](const char* flag) {
      const CLI::Option* o = cmd.get_option_no_throw(flag);
      return o != nullptr && o->count() > 0;
    };
    if (!given("--bits")) cfg.bits = p.bits;
    if (!given("--centroids")) cfg.centroids = p.centroids;
    if (!given("--block-size")) cfg.block_size = p.block_size;
    if (!given("--stages")) cfg.stages = p.stages;
    if (!given("--iters")) cfg.kmeans_iters = p.kmeans_iters;
    if (!given("--asymmetric")) cfg.asymmetric = p.asymmetric;
    if (!given("--scale-dtype")) cfg.scale_dtype = p.scale_dtype;
    if (!given("--scaling")) cfg.scaling = p.scaling;
    if (!given("--scale-search")) cfg.scale_search = p.scale_search;
    if (!given("--init")) cfg.init = p.init;
  });
}

std::optional<std::string> given_profile(const CLI::App& cmd) {
  const CLI::Option* o = cmd.get_option_no_throw("--profile");
  if (o == nullptr || o->count() == 0) return std::nullopt;
  return o->as<std::string>();
}

void add_stream_codec_flags(CLI::App& cmd, CodecConfig& cfg) {
  add_codec_flags(cmd, cfg);
  cmd.remove_option(cmd.get_option("--seed"));
  cfg.bits = 2;
  cfg.centroids = 256;
  // The published QVG configuration these workloads reproduce (default_packed_config).
  cmd.get_option("--bits")->default_str("2")->description(
      "residual code width: 2 or 4 (default 2: the published QVG runs' width, which these workloads reproduce; "
      "encode and eval default to 4)");
  cmd.get_option("--centroids")
      ->default_str("256")
      ->description(
          "k-means codebook size per stage and group: 1..256 (default 256: the published QVG runs'; encode, eval "
          "and memory default to 128, spec 1 and the engine's)");
}

CLI::Option* add_codec_seed_flag(CLI::App& cmd, std::string& codec_seed) {
  return add_value(cmd, "--codec-seed", codec_seed, "seed of the codec's random choices", "UINT");
}

std::string codebook_dtype_note(const Shape4& shape, DType input, const CodecConfig& cfg) {
  if (input != DType::F32) return {};
  const double elements = double(shape.numel());
  auto bpe = [&](DType t) { return double(EncodedTensor::predicted_nbytes(shape, t, cfg)) * 8.0 / elements; };
  return fmt::format(
      "codebooks stored in float32, the input's dtype ({:.4f} bits per element; in bf16 the same tensor would take "
      "{:.4f})",
      bpe(DType::F32), bpe(DType::BF16));
}

void check_codec_flags(const CodecConfig& cfg) {
  try {
    cfg.validate();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("invalid codec flags: {}", e.what()));
  }
}

void check_codec_flags(const CodecConfig& cfg, int64_t head_dim) {
  try {
    cfg.validate_for_head_dim(head_dim);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("invalid codec flags for this input: {}", e.what()));
  }
}

}  // namespace qvg::cli
