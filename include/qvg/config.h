// qvg/config.h — codec parameters (spec 1) and the engine's QVGKVQuantArgs (spec 2).
//
// Plain structs with defaults; `validate()` throws InvalidArgument naming the field,
// the value and what is allowed. Components validate once at construction and
// trust the struct afterwards.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace qvg {

/// The most worker threads any qvg call accepts: 4 x the processors available to the
/// process (OpenMP's count), and at least 16. More is never faster, and OpenMP fails
/// badly (crashes, "Thread creation failed") when asked for tens of thousands.
int max_threads();
/// Throws InvalidArgument "<what> must be in 0..<max_threads()> (0 = all cores; ...),
/// got <threads>" unless 0 <= threads <= max_threads().
void check_threads(std::string_view what, int64_t threads);
/// The thread count a call runs with: `threads` if > 0, else OpenMP's default team
/// size, capped at max_threads(). REQUIRES check_threads passed.
int resolve_threads(int threads);

/// Largest `stages` of an encoding (spec 2; the `.qvgt` format allows 1..64).
inline constexpr int kMaxStages = 64;

/// Storage of block scales and zeros (spec 1.4). Persisted by name.
enum class ScaleDType : uint8_t { FP8_E4M3, BF16 };
/// `two_level` stores a per-group fp32 factor; `compat` is the QVG Triton layout.
enum class Scaling : uint8_t { TwoLevel, Compat };
/// k-means initialisation (spec 1.1).
enum class Init : uint8_t { Random, KMeansPlusPlus, Warm };
/// How sink chunks are grouped into spans (spec 2).
enum class SinkSpan : uint8_t { Chunk, Full };
/// When the chunks of a non-sink span are encoded (docs/spans.md):
/// `deferred` (spec 4, the engine's behaviour): once span_chunks eligible chunks
/// wait raw, together, with one codebook trained on all of them;
/// `incremental`: each chunk as soon as it is eligible — the first chunk of a span
/// trains the span's codebook, later ones are encoded against it.
enum class SpanMode : uint8_t { Deferred, Incremental };
/// How the encoder chooses each block's stored residual scale (and zero):
/// `off` (spec 1.2, the reference): from the block's absmax (or min/max); `mse`: the
/// candidate, among a fixed set of shrunk ranges (the `off` choice first), whose
/// stored values give the least squared error of the block's decoded residual. Only
/// the encoder's choice changes: the stored form and its decode are spec 1.5/1.3's,
/// and spec 1.2's error bound (clipping included) holds. docs/quality.md.
enum class ScaleSearch : uint8_t { Off, Mse };
/// Which tensor of a layer's cache a setting applies to (per-role settings).
enum class CacheRole : uint8_t { Key, Value };

std::string_view name(ScaleDType v);  ///< "fp8_e4m3" | "bf16"
std::string_view name(Scaling v);     ///< "two_level" | "compat"
std::string_view name(Init v);        ///< "random" | "kmeans++" | "warm"
std::string_view name(SinkSpan v);    ///< "chunk" | "full"
std::string_view name(SpanMode v);    ///< "deferred" | "incremental"
std::string_view name(ScaleSearch v);              ///< "off" | "mse"
std::string_view name(CacheRole v);                ///< "k" | "v"
ScaleDType parse_scale_dtype(std::string_view s);  ///< also accepts "fp8"
Scaling parse_scaling(std::string_view s);
Init parse_init(std::string_view s);
SinkSpan parse_sink_span(std::string_view s);
SpanMode parse_span_mode(std::string_view s);
ScaleSearch parse_scale_search(std::string_view s);

/// The codec parameters an encoding stores (spec 1.5; the `.qvgt` metadata of spec
/// 1.6 and a snapshot's segments): the base of CodecConfig (what an encoder is asked
/// for) and of EncodingLayout (what an encoding is), so that each codec field is
/// declared once.
struct StoredCodec {
  int bits = 4;                 ///< residual code width: a width of qvg/code_format.h (2, 3 or 4)
  int centroids = 128;          ///< K, codebook size per stage and group: 1..256
  int stages = 1;               ///< k-means stages: 1..64
  int block_size = 64;          ///< channels sharing one scale; divides D, a multiple of the width's code group
  bool asymmetric = false;      ///< min/max + zero point instead of absmax
  ScaleDType scale_dtype = ScaleDType::FP8_E4M3;
  Scaling scaling = Scaling::TwoLevel;

  bool operator==(const StoredCodec&) const = default;
};

/// Parameters of one PRQ encoding (spec 1): the stored ones (StoredCodec) and how the
/// encoder runs. With StoredCodec, the one definition of the codec's fields: QuantArgs
/// holds one for the shared codec and one per role for the overrides (RoleCodec); the
/// settings table (qvg/settings.h) reads and writes them through member pointers
/// (CodecField).
struct CodecConfig : StoredCodec {
  int kmeans_iters = 2;         ///< Lloyd iterations per stage: >= 1
  Init init = Init::Random;     ///< Warm needs previous centroids passed to encode()
  ScaleSearch scale_search = ScaleSearch::Off;  ///< the encoder's choice of stored scales (not stored)
  uint64_t seed = 1234;         ///< every random choice derives from it
  int threads = 0;              ///< worker threads for encode/decode: 0..max_threads(), 0 = all cores. Never changes bytes.
  /// Added to the head index of the PRNG streams only: group (b, h) draws from the
  /// stream (seed, stage, b, h + head_offset) of spec 1.1. An encoding of heads
  /// [o, o + H) of a wider tensor made with head_offset = o therefore equals that
  /// tensor's encoding of those heads byte for byte (a head-sharded cache, e.g.
  /// qvg.distributed). 0 <= head_offset <= 2^40; 0 changes nothing. Not a setting of
  /// QuantArgs: a cache takes it from its CacheOptions.
  int64_t head_offset = 0;

  /// Throws InvalidArgument for any field outside its range.
  void validate() const;
  /// Also checks that block_size divides head_dim (and head_dim > 0).
  void validate_for_head_dim(int64_t head_dim) const;
  std::string describe() const;
  bool operator==(const CodecConfig&) const = default;
};

/// A member of CodecConfig, as a row of the settings table names it (none for the
/// cache-policy rows).
using CodecField =
    std::variant<std::monostate, int CodecConfig::*, bool CodecConfig::*, ScaleDType CodecConfig::*,
                 Scaling CodecConfig::*, Init CodecConfig::*, ScaleSearch CodecConfig::*, uint64_t CodecConfig::*>;

/// Per-role overrides of QuantArgs' shared codec: a field set here replaces
/// the shared value for that role's tensor (K or V); unset fields take the shared one.
/// The fields that may be overridden are the per-role rows of the settings table
/// (`k_<field>` / `v_<field>`, flags `kv_cache_quant_k_<suffix>`, qvg/settings.h): bit
/// i of `overridden` says that the field of the role's i-th row is set, its value in
/// `values`. `init` and `seed` have no per-role row (one warm-start chain per cache).
struct RoleCodec {
  CodecConfig values;       ///< the overriding values (only the fields in `overridden` count)
  uint32_t overridden = 0;  ///< the fields set, one bit per per-role row of the settings table

  bool empty() const { return overridden == 0; }
  /// Whether `field` is overridden. REQUIRES a field with a per-role row.
  template <class T, class C>
  bool has(T C::*field) const {
    return (overridden & field_bit(static_cast<T CodecConfig::*>(field))) != 0;
  }
  /// Overrides `field` with `value`. REQUIRES a field with a per-role row.
  template <class T, class C>
  RoleCodec& set(T C::*field, T value) {
    values.*field = value;
    overridden |= field_bit(static_cast<T CodecConfig::*>(field));
    return *this;
  }
  /// `shared` with the overridden fields replaced (walks the settings table).
  CodecConfig over(CodecConfig shared) const;
  /// The fields set, as "k_bits=4 k_asymmetric=true" (prefix "k_" or "v_"); "" if empty.
  std::string describe(std::string_view prefix) const;
  /// The same fields overridden, with the same values.
  bool operator==(const RoleCodec&) const;
  /// The bit of `overridden` for `field`: the index of its per-role row among its
  /// role's rows. A field without a per-role row (init, seed, threads, head_offset) is a
  /// programming error (QVG_CHECK aborts).
  static uint32_t field_bit(const CodecField& field);
};

/// Parses "bits=4,asymmetric=true,centroids=64" (fields as the flag suffixes: bits,
/// centroids, block_size, stages, iters, asymmetric, scale_dtype, scaling,
/// scale_search); "" is empty. Throws InvalidArgument naming `what` (e.g. "--k-config").
RoleCodec parse_role_codec(std::string_view spec, std::string_view what);

/// The engine's QVGKVQuantArgs plus qvg's extensions (spec 2): whether the cache
/// quantizes, the shared codec, the per-role overrides and the cache policy. Every
/// setting but `threads` (and the codec's head_offset, a cache's) is a row of the
/// settings table (qvg/settings.h), which names them for every surface.
struct QuantArgs {
  bool quantize = false;  ///< false: quantization off (every segment stays raw); codec.bits is then unused
  CodecConfig codec;      ///< the shared codec (bits, seed and threads included)
  /// Per-role overrides (K, V) of codec's fields; empty = both roles use codec.
  RoleCodec k, v;
  // The cache policy (spec 4).
  int keep_recent_chunks = 1;   ///< completed non-sink chunks kept raw
  bool sink = true;             ///< quantize sink chunks too
  SinkSpan sink_span = SinkSpan::Chunk;
  int sink_keep_chunks = 0;     ///< leading sink chunks never packed
  // qvg extensions
  int span_chunks = 1;          ///< chunks sharing one codebook
  SpanMode span_mode = SpanMode::Deferred;  ///< when a non-sink span's chunks are encoded
  /// Incremental spans only: a chunk whose residual energy per element against the
  /// open span's codebook exceeds this factor times the span's first chunk's (after
  /// training) starts a new span instead (adaptive boundary); 0 = never. >= 0.
  double span_break_ratio = 0.0;
  /// Incremental spans only: the `refine_recent` newest encoded non-sink chunks also
  /// hold a refinement layer, their decoding error block-quantized with `refine_bits`
  /// (docs/spans.md, "Refinement of the newest chunks"); a chunk's layer is dropped
  /// when refine_recent newer chunks are encoded, which leaves its base encoding
  /// exactly as without refinement. 0 = none. 0..1000000.
  int refine_recent = 0;
  int refine_bits = 4;  ///< the refinement layer's code width: a width of qvg/code_format.h

  bool enabled() const { return quantize; }
  /// Turns quantization on with `bits`-bit codes (the engine's `kv_cache_quant=int<bits>`).
  void enable(int bits) {
    quantize = true;
    codec.bits = bits;
  }
  /// True when K and V are encoded with different settings or any role override is set.
  bool per_role() const { return !k.empty() || !v.empty(); }
  void validate() const;
  /// validate() plus block_size dividing head_dim (checked when a cache is built).
  void validate_for_head_dim(int64_t head_dim) const;
  std::string describe() const;
  /// The codec parameters of one role's encodings: the shared codec with that role's
  /// overrides applied (RoleCodec::over).
  CodecConfig codec_for(CacheRole role) const;
  /// Applies a named profile: "reference" (the engine's defaults, every codec
  /// field as a default-constructed CodecConfig, `compat` scaling), "hq" (a
  /// codec, docs/quality.md) or "recommended" (hq's codec with V's scale
  /// search off — per role, for the time per step —, plus a cache policy —
  /// incremental spans of 4 chunks, keep_recent 0, sink_keep 0, 4-bit refinement
  /// layers on the 4 newest encoded chunks; docs/quality.md, "The recommended
  /// profile"). Every
  /// profile sets every codec setting (shared and per-role) but bits and seed, and turns
  /// quantization on at 2 bits if it is off;
  /// "recommended" also sets span_chunks, span_mode, span_break_ratio,
  /// keep_recent_chunks, sink_keep_chunks, refine_recent and refine_bits (the other
  /// two leave the policy as it is). sink, sink_span, seed and threads are never set.
  /// Throws InvalidArgument for another name, leaving *this unchanged.
  void apply_profile(std::string_view profile);

  /// Reads the engine's flat flags: `kv_cache_quant` in {off, none, bf16} or a code
  /// width's mode (int2, int4, and qvg's int3: qvg/code_format.h),
  /// `kv_cache_quant_centroids`, `_block_size`, `_stages`, `_iters`, `_keep_recent`,
  /// `_sink_keep`, `_asymmetric`, `_sink`, `_sink_span`, and qvg's `_span_chunks`,
  /// `_span_mode`, `_span_break_ratio`, `_refine_recent`, `_refine_bits`,
  /// `_scaling`, `_scale_dtype`, `_init`, `_seed`, `_scale_search`, `_profile` (applied
  /// first, whatever the order: explicit keys override it), and the per-role codec
  /// keys `kv_cache_quant_k_<f>` / `kv_cache_quant_v_<f>` for f in bits (a width, as
  /// 4 or int4), centroids, block_size, stages, iters, asymmetric, scale_dtype,
  /// scaling, scale_search. Values are strings as on a command
  /// line ("true"/"false"/"1"/"0" for booleans). Without `kv_cache_quant` the
  /// result is the default (off) and no other flag is read (spec 2, as the engine).
  /// Unknown keys starting with `kv_cache_quant` are an error (the engine's
  /// `kv_cache_quant_config` is ignored); other keys are ignored. Validates the result.
  static QuantArgs from_flags(const std::map<std::string, std::string>& flags);
};

}  // namespace qvg
