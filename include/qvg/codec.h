// qvg/codec.h — the PRQ codec (spec 1): k-means stages + block-quantized residual.
//
// encode() turns a dense [B, S, H, D] tensor into an EncodedTensor, a value type
// holding exactly the arrays of spec 1.5; decode() reconstructs it with the pinned
// arithmetic of spec 1.3 (bit-identical on every decoder). Both are deterministic:
// the same input, config and build give identical bytes whatever `threads` is.
// Work is spread over the (b, h) groups with OpenMP.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "qvg/config.h"
#include "qvg/encoding_layout.h"
#include "qvg/tensor.h"

namespace qvg {

/// One encoded tensor: its layout (the metadata of spec 1.5/1.6, qvg/encoding_layout.h)
/// and the arrays of spec 1.5, dense row-major, on the host.
/// Invariant (checked by validate()): every array has the size the layout implies.
struct EncodedTensor : EncodingLayout {
  // --- the arrays ---
  /// centroid[s]: [B, H, K, D] elements of `dtype` (as raw bytes), one per stage.
  std::vector<std::vector<uint8_t>> centroid;
  /// ids[s]: [B, H, S] uint8, one per stage; every id < min(K, S).
  std::vector<std::vector<uint8_t>> ids;
  /// codes: [B, H, S, D*bits/8]; packing order of spec 1.5.
  std::vector<uint8_t> codes;
  /// scales: [B, H, S, D/block_size] elements, fp8 (1 byte) or bf16 (2 bytes, LE).
  std::vector<uint8_t> scales;
  /// zeros: as scales, asymmetric only (else empty).
  std::vector<uint8_t> zeros;
  /// scale_factor: [B, H] fp32, two_level only (else empty); 1 with bf16 scales.
  std::vector<float> scale_factor;
  /// zero_factor: [B, H] fp32, two_level and asymmetric only (else empty).
  std::vector<float> zero_factor;

  /// An encoding of `layout` with every array allocated and zero-filled (factors 1).
  static EncodedTensor allocate(const EncodingLayout& layout);
  /// This tensor's metadata and codebooks only (what a warm start needs); the
  /// other arrays are empty. Not a valid encoding (validate() rejects it).
  EncodedTensor codebooks_only() const;
  const EncodingLayout& layout() const { return *this; }

  /// The bytes of one array (as the layout describes it); factors as raw fp32 bytes.
  /// The span is valid until the array is resized or the tensor destroyed.
  std::span<const uint8_t> array(const ArrayDesc& a) const;
  std::span<uint8_t> array(const ArrayDesc& a);

  /// Exact encoded size in bytes: the sum of the arrays above.
  size_t nbytes() const;
  /// The size an encoding of `shape` in `dtype` with `cfg` will have (spec 1.5),
  /// computed without encoding anything (EncodingLayout::total_bytes()).
  static size_t predicted_nbytes(Shape4 shape, DType dtype, const CodecConfig& cfg);
  /// nbytes() * 8 / numel.
  double bits_per_element() const;

  /// Throws CorruptData unless parameters are in range (EncodingLayout::check()),
  /// every array has the size implied by the layout, every id < min(K, S) and
  /// every factor is finite and > 0.
  void validate() const;

  /// The largest magnitude validate_values() lets a decoded element reach: far enough
  /// below FLT_MAX that fp32 accumulation and rounding to bf16 stay finite.
  static constexpr double kMaxDecodedMagnitude = 1e37;
  /// Throws CorruptData unless every element decodes to a finite value: centroids
  /// finite; scales finite and >= 0; zeros finite; factors == 1 with bf16 scales
  /// (validate() checked them finite and > 0); symmetric codes <= 2 * qmax; and for every group the bound
  ///   sum over stages of max |centroid| + qmax * max s_eff (+ max |z_eff|)
  /// on its decoded magnitudes (computed in fp64) <= kMaxDecodedMagnitude. What a
  /// correct encoder writes always passes (inputs are |x| <= 1e16). For encodings
  /// read from outside (files, snapshots); REQUIRES validate() passed.
  void validate_values() const;

  /// Effective scale s_eff of (b, h, s, block) per spec 1.4 (decode(stored) * factor).
  float scale_eff(int64_t b, int64_t h, int64_t s, int64_t blk) const;
  /// Effective zero z_eff (asymmetric only).
  float zero_eff(int64_t b, int64_t h, int64_t s, int64_t blk) const;
  /// Centroid value of stage st, group (b, h), entry k, channel d as fp32.
  float centroid_at(int st, int64_t b, int64_t h, int64_t k, int64_t d) const;
  /// Residual code of (b, h, s, d) (0 .. 2^bits-1), unpacked.
  int code_at(int64_t b, int64_t h, int64_t s, int64_t d) const;

  bool operator==(const EncodedTensor&) const = default;
};

/// Optional statistics of one encode call.
struct EncodeStats {
  /// Lloyd iterations actually run, per stage and group: [stages][B*H] (those of
  /// the new centroids for a span chunk; 0 when it added none).
  std::vector<std::vector<int>> iterations;
  /// Sum over every element of the final residual squared (the input minus the
  /// stored centroids of all stages, before residual quantization), in fp64, and
  /// the number of elements: the codebook's fit to the data.
  double residual_energy = 0;
  int64_t residual_elements = 0;
};

/// Encodes x ([B, S, H, D], bf16/f16/f32) with cfg.
/// `warm`: previous encoding whose centroids seed k-means when cfg.init == Warm;
/// it must have the same B, H, D, K and stages (else InvalidArgument). With
/// cfg.init == Warm and warm == nullptr, the random init is used (first segment).
/// Throws InvalidArgument for a bad config, empty or mismatched shape, non-finite
/// or out-of-limit (|x| > 1e16) elements.
EncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, const EncodedTensor* warm = nullptr,
                     EncodeStats* stats = nullptr);

/// The codebooks of an incremental span (docs/spans.md): `book` holds the centroid
/// arrays of spec 1.5 ([B, H, K, D] of the cache dtype per stage, all K slots
/// allocated; its other arrays are empty) and the span's chunks fill its slots in
/// order: slots [0, filled) are in use, the rest are zero. A chunk encoded into the
/// span only appends centroids, so the ids already stored stay valid.
struct SpanCodebook {
  EncodedTensor book;
  int filled = 0;  ///< slots in use, the same for every stage
  /// An empty span codebook for chunks of `shape` (B, H, D; any S) in `dtype` with cfg.
  static SpanCodebook empty(Shape4 shape, DType dtype, const CodecConfig& cfg);
  bool operator==(const SpanCodebook&) const = default;
};

/// Encodes x as the next chunk of an incremental span. Per stage: first trains
/// min(add, S, K - filled) new centroids on x's residual of that stage (k-means of
/// spec 1.1: cfg.init, cfg.kmeans_iters and the PRNG stream of (seed, stage, b, h);
/// init warm takes slots [filled, filled + add) of `warm`, or random without it) and
/// stores them, rounded to the dtype, in the next free slots of span.book; then
/// assigns every point to the nearest of the slots in use (spec 1.1's assignment, no
/// update), subtracts the stored centroid, and quantizes the final residual (spec
/// 1.2). span.filled grows by the centroids added. With add = 0 the chunk is encoded
/// against the span's codebook as it is (assignment and quantization only).
/// The result has the arrays of spec 1.5 except the centroids (empty arrays): decode
/// it with DecodeTask::codebook = &span.book, or with_codebook(). Its ids are <
/// span.filled (possibly >= S: it is not a stand-alone encoding, and validate()
/// rejects with_codebook() of it then). Throws InvalidArgument as encode() does, for
/// a span codebook that does not match x and cfg, and when no slot would be in use.
EncodedTensor encode_span_chunk(ConstTensorView x, const CodecConfig& cfg, SpanCodebook& span, int add,
                                const EncodedTensor* warm = nullptr, EncodeStats* stats = nullptr);
/// A complete encoding: `part` (from encode_span_chunk) with the centroids of
/// `codebook`. For inspection and tests; the caches keep them apart.
EncodedTensor with_codebook(const EncodedTensor& part, const EncodedTensor& codebook);

/// Decodes the whole tensor into `out` ([B, S, H, D] like the input; any dtype:
/// the result is rounded once, nearest even, fp16 saturating). `threads`: 0 = all.
void decode(const EncodedTensor& enc, TensorView out, int threads = 0);
/// Decodes into a new tensor of the input dtype.
Tensor decode(const EncodedTensor& enc, int threads = 0);

/// Where a decoded sub-range goes: element (b, t, h, d) of the decoded range
/// [tokens t0..t1) x [heads h0..h1) lands at
///   base + b * batch_stride + (t - t0) * token_stride + (h - h0) * D + d   (elements).
struct DecodeTarget {
  void* base = nullptr;
  DType dtype = DType::F32;
  int64_t batch_stride = 0;  ///< elements between batches
  int64_t token_stride = 0;  ///< elements between tokens
};
/// Decodes tokens [t0, t1) and heads [h0, h1) of enc into `dst` (spec 1.3 arithmetic).
/// REQUIRES: 0 <= t0 <= t1 <= S, 0 <= h0 < h1 <= H; dst large enough (unchecked).
void decode_range(const EncodedTensor& enc, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                  const DecodeTarget& dst, int threads = 0);

/// One range of decode_ranges(): tokens [t0, t1), heads [h0, h1) of *enc into dst.
/// The centroids come from *codebook when it is set (a chunk of an incremental span,
/// made by encode_span_chunk, whose own centroid arrays are empty), else from *enc.
/// With *refinement set (a layer encode_refinement made of enc's decoded values: the
/// same shape, f32, one stage of one centroid, symmetric), the layer is added in the
/// same pass: the bits of decode_range() followed by add_refinement() on the range.
struct DecodeTask {
  const EncodedTensor* enc = nullptr;
  int64_t t0 = 0, t1 = 0, h0 = 0, h1 = 0;
  DecodeTarget dst;
  const EncodedTensor* codebook = nullptr;
  const EncodedTensor* refinement = nullptr;
};
/// decode_range() for several ranges (e.g. every span of a window, K and V) in one
/// parallel pass. REQUIRES each task as decode_range requires; targets disjoint.
void decode_ranges(const std::vector<DecodeTask>& tasks, int threads = 0);

/// Refinement layers (docs/spans.md, "Refinement of the newest chunks"). A layer is a
/// PRQ encoding, in f32, of the error e = x - decoded of an encoding's decoded values:
/// one stage of one centroid (the group's mean error) and a `bits`-bit symmetric block
/// residual (block_size channels per fp8 scale, two-level factors). It is a complete
/// encoding (validate() accepts it); its element error is spec 1.2's bound of that
/// encoding, and x is then reproduced within it plus one rounding to x's dtype.
/// The codec settings of a layer (centroids 1, stages 1, one Lloyd iteration).
CodecConfig refinement_config(int bits, int block_size, uint64_t seed, int threads = 0);
/// The settings of the layers a packed cache with settings q makes for one role, whose
/// codec settings are `role` (q.codec(role), maybe with a head_offset): q's refinement
/// width, the role's block size, seed, threads and head_offset.
CodecConfig refinement_config(const QuantArgs& q, const CodecConfig& role);
/// Encodes x - decoded (both [B, S, H, D] of one dtype; the difference is one fp32
/// subtraction per element, clamped to +-kMaxAbsInput) with cfg (from refinement_config). Throws InvalidArgument
/// for mismatched tensors or a config without one stage of one centroid, and as
/// encode() does.
EncodedTensor encode_refinement(ConstTensorView x, ConstTensorView decoded, const CodecConfig& cfg);
/// Adds the decoded layer to a decoded range in place: each element of tokens [t0, t1)
/// and heads [h0, h1) at dst (laid out as decode_range() writes) becomes
/// round(dst + layer), once, in fp32 then to dst.dtype (nearest even).
/// REQUIRES: `ref` from encode_refinement; the range inside it; dst as decode_range().
void add_refinement(const EncodedTensor& ref, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const DecodeTarget& dst,
                    int threads = 0);

/// Inertia of points under centroids (spec 1.1): sum over points of the squared
/// distance to the nearest centroid, in fp64. points: n * dim, centroids: k * dim.
double inertia_fp64(const float* points, int64_t n, const float* centroids, int64_t k, int64_t dim);

}  // namespace qvg
