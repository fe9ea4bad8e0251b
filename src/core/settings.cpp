// The settings table (qvg/settings.h).
#include "qvg/settings.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/core.h>

#include "core/enum_names.h"
#include "qvg/error.h"

namespace qvg {

namespace {

constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();

// ---- accessors, one template per kind (member pointers) -------------------------------
template <auto M>
SettingValue get_int(const QuantArgs& q) {
  return int64_t(q.*M);
}
template <auto M>
void set_int(QuantArgs& q, const SettingValue& v) {
  q.*M = int(std::get<int64_t>(v));
}
template <auto M>
SettingValue get_bool(const QuantArgs& q) {
  return bool(q.*M);
}
template <auto M>
void set_bool(QuantArgs& q, const SettingValue& v) {
  q.*M = std::get<bool>(v);
}
template <auto M>
SettingValue get_name(const QuantArgs& q) {
  return std::string(name(q.*M));
}
template <auto M, auto Parse>
void set_name(QuantArgs& q, const SettingValue& v) {
  q.*M = Parse(std::get<std::string>(v));
}
template <auto Parse>
SettingValue parse_name(std::string_view s) {
  return std::string(name(Parse(s)));  // the canonical name of an alias
}
SettingValue get_bits(const QuantArgs& q) {
  return q.bits ? SettingValue(int64_t(*q.bits)) : SettingValue();
}
void set_bits(QuantArgs& q, const SettingValue& v) {
  if (std::holds_alternative<std::monostate>(v))
    q.bits.reset();
  else
    q.bits = int(std::get<int64_t>(v));
}
SettingValue get_ratio(const QuantArgs& q) {
  return q.span_break_ratio;
}
void set_ratio(QuantArgs& q, const SettingValue& v) {
  q.span_break_ratio = std::get<double>(v);
}
SettingValue get_seed(const QuantArgs& q) {
  return q.seed;
}
void set_seed(QuantArgs& q, const SettingValue& v) {
  q.seed = std::get<uint64_t>(v);
}

// Per-role overrides: R selects k or v, M the RoleCodec member.
template <auto R, auto M>
SettingValue get_role(const QuantArgs& q) {
  const auto& o = (q.*R).*M;
  if (!o) return {};
  using T = std::decay_t<decltype(*o)>;
  if constexpr (std::is_same_v<T, int>)
    return int64_t(*o);
  else if constexpr (std::is_same_v<T, bool>)
    return *o;
  else
    return std::string(name(*o));
}
template <auto R, auto M, auto Parse = nullptr>
void set_role(QuantArgs& q, const SettingValue& v) {
  auto& o = (q.*R).*M;
  if (std::holds_alternative<std::monostate>(v)) {
    o.reset();
    return;
  }
  using T = std::decay_t<decltype(*o)>;
  if constexpr (std::is_same_v<T, int>)
    o = int(std::get<int64_t>(v));
  else if constexpr (std::is_same_v<T, bool>)
    o = std::get<bool>(v);
  else
    o = Parse(std::get<std::string>(v));
}

constexpr std::string_view kScaleDTypes = "fp8_e4m3 (or fp8), bf16";
constexpr std::string_view kScalings = "two_level, compat";
constexpr std::string_view kScaleSearches = "off, mse";

// clang-format off
// The per-role rows of one role (prefix "k_"/"v_", flag "_k_"/"_v_"), R = &QuantArgs::k or ::v:
// optional overrides of the shared codec settings, first stored by format 1.3.
#define QVG_ROLE_ROWS(P, R)                                                                                          \
  Setting{P "bits", "_" P "bits", SettingKind::Width, true, 2, 4, 3, "2, 4, int2 or int4",                          \
          get_role<R, &RoleCodec::bits>, set_role<R, &RoleCodec::bits>},                                             \
  Setting{P "centroids", "_" P "centroids", SettingKind::Int, true, 1, 256, 3, "in 1..256",                         \
          get_role<R, &RoleCodec::centroids>, set_role<R, &RoleCodec::centroids>},                                   \
  Setting{P "block_size", "_" P "block_size", SettingKind::Int, true, 1, kI32, 3, "> 0",                             \
          get_role<R, &RoleCodec::block_size>, set_role<R, &RoleCodec::block_size>},                                 \
  Setting{P "stages", "_" P "stages", SettingKind::Int, true, 1, kMaxStages, 3, "in 1..64",                         \
          get_role<R, &RoleCodec::stages>, set_role<R, &RoleCodec::stages>},                                         \
  Setting{P "kmeans_iters", "_" P "iters", SettingKind::Int, true, 1, kI32, 3, "> 0",                                \
          get_role<R, &RoleCodec::kmeans_iters>, set_role<R, &RoleCodec::kmeans_iters>},                             \
  Setting{P "asymmetric", "_" P "asymmetric", SettingKind::Bool, true, 0, 0, 3, "true, false, 1 or 0",               \
          get_role<R, &RoleCodec::asymmetric>, set_role<R, &RoleCodec::asymmetric>},                                 \
  Setting{P "scale_dtype", "_" P "scale_dtype", SettingKind::Name, true, 0, 0, 3, kScaleDTypes,                      \
          get_role<R, &RoleCodec::scale_dtype>, set_role<R, &RoleCodec::scale_dtype, parse_scale_dtype>,             \
          parse_name<parse_scale_dtype>},                                                                            \
  Setting{P "scaling", "_" P "scaling", SettingKind::Name, true, 0, 0, 3, kScalings,                                 \
          get_role<R, &RoleCodec::scaling>, set_role<R, &RoleCodec::scaling, parse_scaling>,                         \
          parse_name<parse_scaling>},                                                                                \
  Setting{P "scale_search", "_" P "scale_search", SettingKind::Name, true, 0, 0, 3, kScaleSearches,                  \
          get_role<R, &RoleCodec::scale_search>, set_role<R, &RoleCodec::scale_search, parse_scale_search>,          \
          parse_name<parse_scale_search>}

// The rows, in the snapshot's config order (a 1.x file is written in this order).
const Setting kSettings[] = {
    {"bits", "", SettingKind::Bits, false, 2, 4, 0, "2 or 4 (or none to disable quantization)", get_bits, set_bits},
    {"centroids", "_centroids", SettingKind::Int, false, 1, 256, 0, "in 1..256", get_int<&QuantArgs::centroids>,
     set_int<&QuantArgs::centroids>},
    {"block_size", "_block_size", SettingKind::Int, false, 1, kI32, 0, "> 0", get_int<&QuantArgs::block_size>,
     set_int<&QuantArgs::block_size>},
    {"stages", "_stages", SettingKind::Int, false, 1, kMaxStages, 0, "in 1..64", get_int<&QuantArgs::stages>,
     set_int<&QuantArgs::stages>},
    {"kmeans_iters", "_iters", SettingKind::Int, false, 1, kI32, 0, "> 0", get_int<&QuantArgs::kmeans_iters>,
     set_int<&QuantArgs::kmeans_iters>},
    {"asymmetric", "_asymmetric", SettingKind::Bool, false, 0, 0, 0, "true, false, 1 or 0",
     get_bool<&QuantArgs::asymmetric>, set_bool<&QuantArgs::asymmetric>},
    {"keep_recent_chunks", "_keep_recent", SettingKind::Int, false, 0, kI32, 0, ">= 0",
     get_int<&QuantArgs::keep_recent_chunks>, set_int<&QuantArgs::keep_recent_chunks>, nullptr, "--keep-recent",
     "completed non-sink chunks kept raw"},
    {"sink", "_sink", SettingKind::Bool, false, 0, 0, 0, "true, false, 1 or 0", get_bool<&QuantArgs::sink>,
     set_bool<&QuantArgs::sink>},
    {"sink_span", "_sink_span", SettingKind::Name, false, 0, 0, 0, "chunk, full", get_name<&QuantArgs::sink_span>,
     set_name<&QuantArgs::sink_span, parse_sink_span>, parse_name<parse_sink_span>, "--sink-span",
     "chunk | full (default: the preset's sink policy)"},
    {"sink_keep_chunks", "_sink_keep", SettingKind::Int, false, 0, kI32, 0, ">= 0",
     get_int<&QuantArgs::sink_keep_chunks>, set_int<&QuantArgs::sink_keep_chunks>, nullptr, "--sink-keep",
     "leading sink chunks never packed"},
    {"span_chunks", "_span_chunks", SettingKind::Int, false, 1, kI32, 0, ">= 1", get_int<&QuantArgs::span_chunks>,
     set_int<&QuantArgs::span_chunks>, nullptr, "--span-chunks", "chunks per encoded span (one codebook)"},
    {"span_mode", "_span_mode", SettingKind::Name, false, 0, 0, 1, "deferred, incremental",
     get_name<&QuantArgs::span_mode>, set_name<&QuantArgs::span_mode, parse_span_mode>, parse_name<parse_span_mode>,
     "--span-mode",
     "deferred (a span is encoded once full) | incremental (each chunk at once, against the span's codebook; "
     "docs/spans.md)"},
    {"span_break_ratio", "_span_break_ratio", SettingKind::Real, false, 0, 1'000'000, 1,
     "in [0, 1e6] (0 = never break a span)", get_ratio, set_ratio, nullptr, "--span-break-ratio",
     "incremental spans: start a new span when a chunk's residual energy exceeds this factor times the span's first "
     "chunk's (0 = never)"},
    {"scaling", "_scaling", SettingKind::Name, false, 0, 0, 0, kScalings, get_name<&QuantArgs::scaling>,
     set_name<&QuantArgs::scaling, parse_scaling>, parse_name<parse_scaling>},
    {"scale_dtype", "_scale_dtype", SettingKind::Name, false, 0, 0, 0, kScaleDTypes,
     get_name<&QuantArgs::scale_dtype>, set_name<&QuantArgs::scale_dtype, parse_scale_dtype>,
     parse_name<parse_scale_dtype>},
    {"init", "_init", SettingKind::Name, false, 0, 0, 0, "random, kmeans++, warm", get_name<&QuantArgs::init>,
     set_name<&QuantArgs::init, parse_init>, parse_name<parse_init>},
    {"seed", "_seed", SettingKind::Seed, false, 0, 0, 0, "an integer in 0..2^64-1", get_seed, set_seed},
    {"refine_recent", "_refine_recent", SettingKind::Int, false, 0, 1'000'000, 4, "in 0..1000000 (0 = no refinement)",
     get_int<&QuantArgs::refine_recent>, set_int<&QuantArgs::refine_recent>, nullptr, "--refine-recent",
     "incremental spans: the newest N encoded chunks also keep a refinement layer of their error (0 = none; "
     "docs/spans.md)"},
    {"refine_bits", "_refine_bits", SettingKind::Width, false, 2, 4, 4, "2 or 4", get_int<&QuantArgs::refine_bits>,
     set_int<&QuantArgs::refine_bits>, nullptr, "--refine-bits", "the refinement layer's code width: 2 or 4"},
    {"scale_search", "_scale_search", SettingKind::Name, false, 0, 0, 3, kScaleSearches,
     get_name<&QuantArgs::scale_search>, set_name<&QuantArgs::scale_search, parse_scale_search>,
     parse_name<parse_scale_search>},
    QVG_ROLE_ROWS("k_", &QuantArgs::k),
    QVG_ROLE_ROWS("v_", &QuantArgs::v),
};
// clang-format on
#undef QVG_ROLE_ROWS

// The whole of `t` as a decimal T (no sign for unsigned, no spaces, no "+").
template <class T>
bool decimal(std::string_view t, T& out) {
  const char* e = t.data() + t.size();
  const auto [p, ec] = std::from_chars(t.data(), e, out);
  return !t.empty() && ec == std::errc() && p == e;
}

[[noreturn]] void bad(std::string_view what, std::string_view allowed, std::string_view text) {
  throw InvalidArgument(fmt::format("{} must be {}, got '{}'", what, allowed, text));
}

}  // namespace

std::span<const Setting> quant_settings() {
  return kSettings;
}

const Setting* find_setting(std::string_view n) {
  for (const Setting& s : kSettings)
    if (s.name == n) return &s;
  return nullptr;
}

const Setting* find_setting_by_flag(std::string_view suffix) {
  if (suffix.empty()) return nullptr;
  for (const Setting& s : kSettings)
    if (s.flag == suffix) return &s;
  return nullptr;
}

SettingValue parse_setting(const Setting& s, std::string_view t, std::string_view what) {
  // Only the form is checked here; ranges are the value's (check_setting, and
  // QuantArgs::validate with the field's name), so a flag and a field give one message.
  switch (s.kind) {
    case SettingKind::Bits:
    case SettingKind::Width:
      // bits and a role's bits take int2/int4 too; refine_bits is an integer whose
      // range QuantArgs::validate checks (its message names the field).
      if (s.kind == SettingKind::Bits || s.role) {
        if (t == "2" || t == "int2") return int64_t(2);
        if (t == "4" || t == "int4") return int64_t(4);
        bad(what, s.allowed, t);
      }
      [[fallthrough]];
    case SettingKind::Int: {
      int64_t x = 0;
      if (!decimal(t, x)) bad(what, "an integer", t);
      if (x < std::numeric_limits<int32_t>::min() || x > kI32) bad(what, "an integer that fits in 32 bits", t);
      return x;
    }
    case SettingKind::Bool:
      // One rule on every surface: true/false/1/0 (True/False as Python prints them).
      if (t == "true" || t == "True" || t == "1") return true;
      if (t == "false" || t == "False" || t == "0") return false;
      bad(what, "a boolean (true/false/1/0)", t);
    case SettingKind::Name: return s.parse_name(t);  // the enum's own message, naming the field
    case SettingKind::Real: {
      const std::optional<double> x = parse_real(t);
      if (!x) bad(what, "a number", t);
      return *x;
    }
    case SettingKind::Seed: {
      uint64_t x = 0;
      if (!decimal(t, x)) bad(what, s.allowed, t);
      return x;
    }
  }
  bad(what, s.allowed, t);
}

std::optional<double> parse_real(std::string_view text) {
  // std::from_chars' general format: plain decimal or exponent form, no hex, no inf
  // or nan, no leading '+' or spaces.
  double x = 0;
  if (!decimal(text, x) || !std::isfinite(x)) return std::nullopt;
  return x;
}

std::string setting_text(const SettingValue& v) {
  struct Text {
    std::string operator()(std::monostate) const { return "none"; }
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(uint64_t x) const { return std::to_string(x); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) const { return s; }
  };
  return std::visit(Text{}, v);
}

void check_setting(const Setting& s, const SettingValue& v, std::string_view what) {
  const bool none = std::holds_alternative<std::monostate>(v);
  if (none) {
    if (s.kind == SettingKind::Bits || s.role) return;
    throw InvalidArgument(fmt::format("{} must be {}, got none", what, s.allowed));
  }
  switch (s.kind) {
    case SettingKind::Bits:
    case SettingKind::Width:
      if (const int64_t* x = std::get_if<int64_t>(&v); x && (*x == 2 || *x == 4)) return;
      break;
    case SettingKind::Int:
      if (const int64_t* x = std::get_if<int64_t>(&v)) {
        if (*x >= s.lo && *x <= s.hi) return;
        throw InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, *x));
      }
      break;
    case SettingKind::Bool:
      if (std::holds_alternative<bool>(v)) return;
      break;
    case SettingKind::Name:
      if (const std::string* n = std::get_if<std::string>(&v)) {
        (void)parse_setting(s, *n, what);
        return;
      }
      break;
    case SettingKind::Real:
      if (const double* x = std::get_if<double>(&v)) {
        if (std::isfinite(*x) && *x >= double(s.lo) && *x <= double(s.hi)) return;
        throw InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, *x));
      }
      break;
    case SettingKind::Seed:
      if (std::holds_alternative<uint64_t>(v)) return;
      break;
  }
  throw InvalidArgument(fmt::format("{} must be {}, got {}", what, s.allowed, setting_text(v)));
}

void set_recommended_policy(QuantArgs& q) {
  // Issue 25 (docs/quality.md, "The recommended profile"): kept beside the rows, so
  // that a policy setting is named here and where it is used, not in the profiles too.
  q.span_chunks = 4;
  q.span_mode = SpanMode::Incremental;
  q.span_break_ratio = 0.0;
  q.keep_recent_chunks = 0;
  q.sink_keep_chunks = 0;
  q.refine_recent = 4;
  q.refine_bits = 4;
}

bool is_default(const Setting& s, const QuantArgs& q) {
  static const QuantArgs d;
  return s.get(q) == s.get(d);
}

// The names of the settings' enumeration values (qvg/config.h's name() and parse_*())
// and the rule across policy settings: beside the table, so that the policy settings
// are named by their rows, their members, the policy (src/cache/cache_policy.h) and
// at most one more file (scripts/check-setting-names.py).
namespace {
using detail::EnumName;
constexpr EnumName<ScaleDType> kScaleDTypeNames[] = {{ScaleDType::FP8_E4M3, "fp8_e4m3"},
                                                     {ScaleDType::FP8_E4M3, "fp8"},
                                                     {ScaleDType::FP8_E4M3, "f8_e4m3"},
                                                     {ScaleDType::BF16, "bf16"}};
constexpr EnumName<Scaling> kScalingNames[] = {{Scaling::TwoLevel, "two_level"}, {Scaling::Compat, "compat"}};
constexpr EnumName<Init> kInitNames[] = {{Init::Random, "random"},
                                         {Init::KMeansPlusPlus, "kmeans++"},
                                         {Init::KMeansPlusPlus, "kmeanspp"},
                                         {Init::Warm, "warm"}};
constexpr EnumName<ScaleSearch> kSearchNames[] = {{ScaleSearch::Off, "off"}, {ScaleSearch::Mse, "mse"}};
constexpr EnumName<SinkSpan> kSinkSpans[] = {{SinkSpan::Chunk, "chunk"}, {SinkSpan::Full, "full"}};
constexpr EnumName<SpanMode> kSpanModes[] = {{SpanMode::Deferred, "deferred"}, {SpanMode::Incremental, "incremental"}};
constexpr EnumName<CacheRole> kRoleNames[] = {{CacheRole::Key, "k"}, {CacheRole::Value, "v"}};
}  // namespace

// One line per function, so that the overloads read as a table.
using detail::name_in;
using detail::parse_in;
// clang-format off
std::string_view name(ScaleDType v) { return name_in(kScaleDTypeNames, v); }
std::string_view name(Scaling v) { return name_in(kScalingNames, v); }
std::string_view name(Init v) { return name_in(kInitNames, v); }
std::string_view name(SinkSpan v) { return name_in(kSinkSpans, v); }
std::string_view name(SpanMode v) { return name_in(kSpanModes, v); }
std::string_view name(ScaleSearch v) { return name_in(kSearchNames, v); }
std::string_view name(CacheRole v) { return name_in(kRoleNames, v); }
ScaleSearch parse_scale_search(std::string_view s) { return parse_in(kSearchNames, s, "scale_search", kScaleSearches); }
ScaleDType parse_scale_dtype(std::string_view s) { return parse_in(kScaleDTypeNames, s, "scale_dtype", kScaleDTypes); }
Scaling parse_scaling(std::string_view s) { return parse_in(kScalingNames, s, "scaling", kScalings); }
Init parse_init(std::string_view s) { return parse_in(kInitNames, s, "init", "random, kmeans++, warm"); }
SinkSpan parse_sink_span(std::string_view s) { return parse_in(kSinkSpans, s, "sink_span", "chunk, full"); }
SpanMode parse_span_mode(std::string_view s) { return parse_in(kSpanModes, s, "span_mode", "deferred, incremental"); }
// clang-format on

void check_policy_settings(const QuantArgs& q) {
  if (q.refine_recent > 0 && q.span_mode != SpanMode::Incremental)
    throw InvalidArgument(fmt::format(
        "refine_recent must be 0 unless span_mode is incremental (a refinement layer belongs to a chunk encoded on "
        "its own), got refine_recent = {} with span_mode = {}",
        q.refine_recent, name(q.span_mode)));
}

std::span<const std::string_view> engine_quant_fields() {
  // SGLang 0.5.23's QVGKVQuantArgs (sglang/multimodal_gen/.../qvg_packed_cache.py).
  static constexpr std::string_view kFields[] = {
      "bits",       "centroids",          "block_size", "stages",          "kmeans_iters",
      "asymmetric", "keep_recent_chunks", "sink",       "sink_keep_chunks"};
  return kFields;
}

}  // namespace qvg
