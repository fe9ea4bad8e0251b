#include "qvg/config.h"

#include <omp.h>

#include <algorithm>
#include <charconv>

#include <fmt/core.h>

#include "core/enum_names.h"
#include "qvg/error.h"

namespace qvg {

namespace {
using detail::EnumName;
constexpr EnumName<ScaleDType> kScaleDTypes[] = {
    {ScaleDType::FP8_E4M3, "fp8_e4m3"}, {ScaleDType::FP8_E4M3, "fp8"}, {ScaleDType::FP8_E4M3, "f8_e4m3"},
    {ScaleDType::BF16, "bf16"}};
constexpr EnumName<Scaling> kScalings[] = {{Scaling::TwoLevel, "two_level"}, {Scaling::Compat, "compat"}};
constexpr EnumName<Init> kInits[] = {
    {Init::Random, "random"}, {Init::KMeansPlusPlus, "kmeans++"}, {Init::KMeansPlusPlus, "kmeanspp"}, {Init::Warm, "warm"}};
constexpr EnumName<SinkSpan> kSinkSpans[] = {{SinkSpan::Chunk, "chunk"}, {SinkSpan::Full, "full"}};
constexpr EnumName<SpanMode> kSpanModes[] = {{SpanMode::Deferred, "deferred"}, {SpanMode::Incremental, "incremental"}};
}  // namespace

std::string_view name(ScaleDType v) { return detail::name_in(kScaleDTypes, v); }
std::string_view name(Scaling v) { return detail::name_in(kScalings, v); }
std::string_view name(Init v) { return detail::name_in(kInits, v); }
std::string_view name(SinkSpan v) { return detail::name_in(kSinkSpans, v); }
std::string_view name(SpanMode v) { return detail::name_in(kSpanModes, v); }

ScaleDType parse_scale_dtype(std::string_view s) {
  return detail::parse_in(kScaleDTypes, s, "scale_dtype", "fp8_e4m3 (or fp8), bf16");
}
Scaling parse_scaling(std::string_view s) { return detail::parse_in(kScalings, s, "scaling", "two_level, compat"); }
Init parse_init(std::string_view s) { return detail::parse_in(kInits, s, "init", "random, kmeans++, warm"); }
SinkSpan parse_sink_span(std::string_view s) { return detail::parse_in(kSinkSpans, s, "sink_span", "chunk, full"); }
SpanMode parse_span_mode(std::string_view s) {
  return detail::parse_in(kSpanModes, s, "span_mode", "deferred, incremental");
}

int max_threads() { return std::max(16, 4 * omp_get_num_procs()); }

void check_threads(std::string_view what, int64_t threads) {
  if (threads < 0 || threads > max_threads())
    throw InvalidArgument(fmt::format("{} must be in 0..{} (0 = all cores; at most 4 x the {} processors, and at "
                                      "least 16, are accepted), got {}",
                                      what, max_threads(), omp_get_num_procs(), threads));
}

int resolve_threads(int threads) { return threads > 0 ? threads : std::min(omp_get_max_threads(), max_threads()); }

namespace {

void check_bits(int bits) {
  if (bits != 2 && bits != 4)
    throw InvalidArgument(fmt::format("bits must be 2 or 4 (or none to disable quantization), got {}", bits));
}

// The codec fields of spec 2 that do not depend on bits (checked with quantization
// off too, so that a bad flag never waits silently for the day it is switched on).
void check_sizes(int centroids, int block_size, int stages, int iters) {
  if (centroids <= 0 || centroids > 256)
    throw InvalidArgument(fmt::format("centroids must be in 1..256, got {}", centroids));
  if (block_size <= 0) throw InvalidArgument(fmt::format("block_size must be > 0, got {}", block_size));
  if (stages <= 0 || stages > kMaxStages)
    throw InvalidArgument(fmt::format("stages must be in 1..{}, got {}", kMaxStages, stages));
  if (iters <= 0) throw InvalidArgument(fmt::format("kmeans_iters must be > 0, got {}", iters));
}

// Shared by CodecConfig and QuantArgs: the codec fields of spec 2.
void check_codec_fields(int bits, int centroids, int block_size, int stages, int iters) {
  check_bits(bits);
  check_sizes(centroids, block_size, stages, iters);
  const int per_byte = 8 / bits;
  if (block_size % per_byte != 0)
    throw InvalidArgument(fmt::format(
        "block_size must be a multiple of {} (8/bits, so codes fill whole bytes) at bits={}, got {}", per_byte,
        bits, block_size));
}

void check_head_dim(int block_size, int64_t head_dim) {
  if (head_dim <= 0) throw InvalidArgument(fmt::format("head_dim must be > 0, got {}", head_dim));
  if (head_dim % block_size != 0)
    throw InvalidArgument(
        fmt::format("block_size must divide head_dim ({}), got block_size={}", head_dim, block_size));
}

}  // namespace

void CodecConfig::validate() const {
  check_codec_fields(bits, centroids, block_size, stages, kmeans_iters);
  check_threads("threads", threads);
  if (head_offset < 0 || head_offset > (int64_t(1) << 40))
    throw InvalidArgument(fmt::format("head_offset must be in [0, 2^40], got {}", head_offset));
}

void CodecConfig::validate_for_head_dim(int64_t head_dim) const {
  validate();
  check_head_dim(block_size, head_dim);
}

std::string CodecConfig::describe() const {
  return fmt::format(
      "bits={} centroids={} stages={} kmeans_iters={} block_size={} asymmetric={} scale_dtype={} scaling={} "
      "init={} seed={}",
      bits, centroids, stages, kmeans_iters, block_size, asymmetric, name(scale_dtype), name(scaling), name(init),
      seed);
}

void QuantArgs::validate() const {
  if (bits) {
    check_codec_fields(*bits, centroids, block_size, stages, kmeans_iters);
  } else {
    check_sizes(centroids, block_size, stages, kmeans_iters);
  }
  if (keep_recent_chunks < 0)
    throw InvalidArgument(fmt::format("keep_recent_chunks must be >= 0, got {}", keep_recent_chunks));
  if (sink_keep_chunks < 0)
    throw InvalidArgument(fmt::format("sink_keep_chunks must be >= 0, got {}", sink_keep_chunks));
  if (span_chunks < 1) throw InvalidArgument(fmt::format("span_chunks must be >= 1, got {}", span_chunks));
  if (!(span_break_ratio >= 0.0 && span_break_ratio <= 1e6))
    throw InvalidArgument(
        fmt::format("span_break_ratio must be in [0, 1e6] (0 = never break a span), got {}", span_break_ratio));
  check_threads("threads", threads);
}

void QuantArgs::validate_for_head_dim(int64_t head_dim) const {
  validate();
  if (bits) check_head_dim(block_size, head_dim);
}

std::string QuantArgs::describe() const {
  if (!bits) return "kv_cache_quant=off";
  return fmt::format(
      "kv_cache_quant=int{} centroids={} block_size={} stages={} kmeans_iters={} asymmetric={} "
      "keep_recent_chunks={} sink={} sink_span={} sink_keep_chunks={} span_chunks={} scaling={} scale_dtype={} "
      "init={} seed={}",
      *bits, centroids, block_size, stages, kmeans_iters, asymmetric, keep_recent_chunks, sink, name(sink_span),
      sink_keep_chunks, span_chunks, name(scaling), name(scale_dtype), name(init), seed) +
         (span_mode == SpanMode::Deferred
              ? std::string()
              : fmt::format(" span_mode={} span_break_ratio={}", name(span_mode), span_break_ratio));
}

CodecConfig QuantArgs::codec() const {
  QVG_CHECK(bits.has_value());
  return {.bits = *bits, .centroids = centroids, .stages = stages, .kmeans_iters = kmeans_iters,
          .block_size = block_size, .asymmetric = asymmetric, .scale_dtype = scale_dtype, .scaling = scaling,
          .init = init, .seed = seed, .threads = threads};
}

namespace {

int64_t parse_int_flag(const std::string& key, const std::string& v) {
  int64_t out = 0;
  const char* b = v.data();
  const char* e = v.data() + v.size();
  auto [p, ec] = std::from_chars(b, e, out);
  if (ec != std::errc() || p != e || v.empty())
    throw InvalidArgument(fmt::format("{} must be an integer, got '{}'", key, v));
  return out;
}

// A seed: an unsigned 64-bit decimal (a negative value is an error, not a wrap).
uint64_t parse_seed_flag(const std::string& key, const std::string& v) {
  uint64_t out = 0;
  const char* b = v.data();
  const char* e = v.data() + v.size();
  auto [p, ec] = std::from_chars(b, e, out);
  if (ec != std::errc() || p != e || v.empty())
    throw InvalidArgument(fmt::format("{} must be an integer in 0..2^64-1, got '{}'", key, v));
  return out;
}

int parse_int32_flag(const std::string& key, const std::string& v) {
  int64_t x = parse_int_flag(key, v);
  if (x < -2147483647 || x > 2147483647)
    throw InvalidArgument(fmt::format("{} must fit in 32 bits, got '{}'", key, v));
  return int(x);
}

double parse_double_flag(const std::string& key, const std::string& v) {
  double out = 0;
  const char* b = v.data();
  const char* e = v.data() + v.size();
  auto [p, ec] = std::from_chars(b, e, out);
  if (ec != std::errc() || p != e || v.empty())
    throw InvalidArgument(fmt::format("{} must be a number, got '{}'", key, v));
  return out;
}

bool parse_bool_flag(const std::string& key, const std::string& v) {
  if (v == "true" || v == "True" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "False" || v == "0" || v == "no" || v == "off") return false;
  throw InvalidArgument(fmt::format("{} must be a boolean (true/false/1/0), got '{}'", key, v));
}

}  // namespace

QuantArgs QuantArgs::from_flags(const std::map<std::string, std::string>& flags) {
  QuantArgs a;
  auto it = flags.find("kv_cache_quant");
  // Spec 2 (and the engine): without kv_cache_quant everything is default (off);
  // sub-flags are then not read.
  if (it == flags.end()) return a;
  {
    const std::string& m = it->second;
    if (m == "off" || m == "none" || m == "bf16" || m == "None") {
      a.bits.reset();
    } else if (m == "int4") {
      a.bits = 4;
    } else if (m == "int2") {
      a.bits = 2;
    } else {
      throw InvalidArgument(
          fmt::format("kv_cache_quant must be one of off, none, bf16, int4, int2, got '{}'", m));
    }
  }
  for (const auto& [key, value] : flags) {
    if (key == "kv_cache_quant") continue;
    if (key.rfind("kv_cache_quant", 0) != 0) continue;  // not ours
    if (key == "kv_cache_quant_config") continue;  // the engine's own key: no cache setting in it
    std::string f = key.substr(std::string("kv_cache_quant").size());
    if (f == "_centroids") a.centroids = parse_int32_flag(key, value);
    else if (f == "_block_size") a.block_size = parse_int32_flag(key, value);
    else if (f == "_stages") a.stages = parse_int32_flag(key, value);
    else if (f == "_iters") a.kmeans_iters = parse_int32_flag(key, value);
    else if (f == "_keep_recent") a.keep_recent_chunks = parse_int32_flag(key, value);
    else if (f == "_sink_keep") a.sink_keep_chunks = parse_int32_flag(key, value);
    else if (f == "_asymmetric") a.asymmetric = parse_bool_flag(key, value);
    else if (f == "_sink") a.sink = parse_bool_flag(key, value);
    else if (f == "_sink_span") a.sink_span = parse_sink_span(value);
    else if (f == "_span_chunks") a.span_chunks = parse_int32_flag(key, value);
    else if (f == "_span_mode") a.span_mode = parse_span_mode(value);
    else if (f == "_span_break_ratio") a.span_break_ratio = parse_double_flag(key, value);
    else if (f == "_scaling") a.scaling = parse_scaling(value);
    else if (f == "_scale_dtype") a.scale_dtype = parse_scale_dtype(value);
    else if (f == "_init") a.init = parse_init(value);
    else if (f == "_seed") a.seed = parse_seed_flag(key, value);
    else
      throw InvalidArgument(fmt::format(
          "unknown flag '{}'; accepted: kv_cache_quant, kv_cache_quant_centroids, _block_size, _stages, _iters, "
          "_keep_recent, _sink_keep, _asymmetric, _sink, _sink_span, _span_chunks, _span_mode, _span_break_ratio, "
          "_scaling, _scale_dtype, _init, _seed",
          key));
  }
  a.validate();
  return a;
}

}  // namespace qvg
