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

std::string_view name(ScaleDType v);  ///< "fp8_e4m3" | "bf16"
std::string_view name(Scaling v);     ///< "two_level" | "compat"
std::string_view name(Init v);        ///< "random" | "kmeans++" | "warm"
std::string_view name(SinkSpan v);    ///< "chunk" | "full"
std::string_view name(SpanMode v);    ///< "deferred" | "incremental"
ScaleDType parse_scale_dtype(std::string_view s);  ///< also accepts "fp8"
Scaling parse_scaling(std::string_view s);
Init parse_init(std::string_view s);
SinkSpan parse_sink_span(std::string_view s);
SpanMode parse_span_mode(std::string_view s);

/// Parameters of one PRQ encoding (spec 1).
struct CodecConfig {
  int bits = 4;                 ///< residual code width: 2 or 4
  int centroids = 128;          ///< K, codebook size per stage and group: 1..256
  int stages = 1;               ///< k-means stages: 1..64
  int kmeans_iters = 2;         ///< Lloyd iterations per stage: >= 1
  int block_size = 64;          ///< channels sharing one scale; divides D, multiple of 8/bits
  bool asymmetric = false;      ///< min/max + zero point instead of absmax
  ScaleDType scale_dtype = ScaleDType::FP8_E4M3;
  Scaling scaling = Scaling::TwoLevel;
  Init init = Init::Random;     ///< Warm needs previous centroids passed to encode()
  uint64_t seed = 1234;         ///< every random choice derives from it
  int threads = 0;              ///< worker threads for encode/decode: 0..max_threads(), 0 = all cores. Never changes bytes.
  /// Added to the head index of the PRNG streams only: group (b, h) draws from the
  /// stream (seed, stage, b, h + head_offset) of spec 1.1. An encoding of heads
  /// [o, o + H) of a wider tensor made with head_offset = o therefore equals that
  /// tensor's encoding of those heads byte for byte (a head-sharded cache, e.g.
  /// qvg.distributed). 0 <= head_offset <= 2^40; 0 changes nothing.
  int64_t head_offset = 0;

  /// Throws InvalidArgument for any field outside its range.
  void validate() const;
  /// Also checks that block_size divides head_dim (and head_dim > 0).
  void validate_for_head_dim(int64_t head_dim) const;
  std::string describe() const;
};

/// The engine's QVGKVQuantArgs plus qvg's extensions (spec 2).
struct QuantArgs {
  std::optional<int> bits;      ///< nullopt = quantization off (every segment stays raw)
  int centroids = 128;
  int block_size = 64;
  int stages = 1;
  int kmeans_iters = 2;
  bool asymmetric = false;
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
  Scaling scaling = Scaling::TwoLevel;
  ScaleDType scale_dtype = ScaleDType::FP8_E4M3;
  Init init = Init::Random;     ///< Warm: seed each encoding from the previous one's centroids
  uint64_t seed = 1234;
  int threads = 0;              ///< 0..max_threads(), 0 = all cores

  bool enabled() const { return bits.has_value(); }
  void validate() const;
  /// validate() plus block_size dividing head_dim (checked when a cache is built).
  void validate_for_head_dim(int64_t head_dim) const;
  std::string describe() const;
  /// The codec parameters of one encoding (requires enabled()).
  CodecConfig codec() const;

  /// Reads the engine's flat flags: `kv_cache_quant` in {off, none, bf16, int4, int2},
  /// `kv_cache_quant_centroids`, `_block_size`, `_stages`, `_iters`, `_keep_recent`,
  /// `_sink_keep`, `_asymmetric`, `_sink`, `_sink_span`, and qvg's `_span_chunks`,
  /// `_span_mode`, `_span_break_ratio`,
  /// `_scaling`, `_scale_dtype`, `_init`, `_seed`. Values are strings as on a command
  /// line ("true"/"false"/"1"/"0" for booleans). Without `kv_cache_quant` the
  /// result is the default (off) and no other flag is read (spec 2, as the engine).
  /// Unknown keys starting with `kv_cache_quant` are an error (the engine's
  /// `kv_cache_quant_config` is ignored); other keys are ignored. Validates the result.
  static QuantArgs from_flags(const std::map<std::string, std::string>& flags);
};

}  // namespace qvg
