// qvg/cuda.h — the CUDA backend of the PRQ codec (docs/cuda.md).
//
// Available when the library was built with the CUDA backend (CMake option
// QVG_ENABLE_CUDA; the target `qvg_cuda` defines QVG_HAVE_CUDA=1). Link `qvg_cuda`.
// The device-resident packed K/V cache built on these pieces is in qvg/cuda_cache.h.
//
// Contracts shared by every function here:
// - Streams are explicit. A function that takes a `Stream` enqueues its work on
//   that stream and returns without waiting for the device, unless its comment
//   says it synchronizes (download, check_input_limits, the benchmarks). Pointers
//   named "device" must be device memory (cudaMalloc, cudaMallocAsync or the
//   caller's allocator) of the current device.
// - Memory comes from an Allocator. Every allocation is stream-ordered: a buffer
//   allocated on stream s is freed on stream s when its owner is destroyed, so it
//   is safe to destroy an owner once all work that uses it was enqueued on s (or
//   on streams that s waits for).
// - CUDA errors throw qvg::cuda::CudaError (a qvg::DeviceError, kind Device, which
//   the Python binding maps to RuntimeError) naming the failing call. Errors of
//   asynchronous kernel execution surface at the next call that synchronizes.
// - Results have the format of the CPU codec: an encoding made on the device and
//   downloaded is an EncodedTensor the CPU decodes, and decode on the device gives
//   the bits the CPU decoder gives (spec 1.3).
//
// Verified on an H200 (docs/cuda.md lists what ran there and what did not); compiled
// for sm_90a, sm_80 and sm_89. The device runtime (streams, errors, Allocator,
// DeviceBuffer) is qvg/cuda_runtime.h, which this header includes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/cuda_runtime.h"
#include "qvg/encoding_layout.h"
#include "qvg/error.h"
#include "qvg/tensor.h"

namespace qvg::cuda {

/// An encoded tensor kept on the device: its layout (qvg/encoding_layout.h, the
/// metadata of EncodedTensor) and its arrays (spec 1.5, the same dense row-major
/// layouts) inside one device allocation. Each kind of array starts 256-byte
/// aligned; stages are contiguous: the centroids of stage s start s * (B*H*K*D)
/// elements after stage 0's, the ids of stage s s * (B*H*S) bytes after stage 0's.
/// Which arrays of its layout a DeviceEncodedTensor holds: all of them; all but the
/// centroids (a chunk of an incremental span, decoded with its span's codebook, as
/// the host encode_span_chunk's result); or the centroids only (a span's codebook, a
/// warm-start codebook: EncodedTensor::codebooks_only()).
enum class EncodedParts : uint8_t { All, WithoutCentroids, CentroidsOnly };

class DeviceEncodedTensor : public EncodingLayout {
 public:
  /// Allocates (uninitialised) arrays for an encoding of `shape` in `dtype` with cfg
  /// (the arrays `parts` names). Throws InvalidArgument for a bad config or shape.
  static DeviceEncodedTensor allocate(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                      Allocator& alloc = default_allocator(), EncodedParts parts = EncodedParts::All);
  /// Copies a host encoding to the device on `stream`: a complete one (validated
  /// first), a span chunk's (no centroid arrays; its ids checked < K: CorruptData) or a
  /// codebook (centroid arrays only), which are copied as they are. Synchronizes
  /// `stream` (`enc` may be freed on return).
  static DeviceEncodedTensor upload(const EncodedTensor& enc, Stream stream, Allocator& alloc = default_allocator());
  /// Copies the arrays back into a host EncodedTensor (arrays this tensor does not
  /// hold are empty there, as in the host span chunks and codebooks). Synchronizes `stream`.
  EncodedTensor download(Stream stream) const;
  /// The arrays held.
  EncodedParts parts() const { return parts_; }

  /// Device address of an array (stage 0 for centroids and ids); nullptr when this
  /// layout has no such array (zeros when symmetric, factors with compat scaling).
  const uint8_t* data(EncodedArray kind) const;
  uint8_t* mutable_data(EncodedArray kind);
  const uint8_t* centroid_data() const { return data(EncodedArray::Centroids); }  ///< stage 0, dtype elements
  const uint8_t* ids_data() const { return data(EncodedArray::Ids); }             ///< stage 0
  const uint8_t* codes_data() const { return data(EncodedArray::Codes); }
  const uint8_t* scales_data() const { return data(EncodedArray::Scales); }
  const uint8_t* zeros_data() const { return data(EncodedArray::Zeros); }
  const float* scale_factor_data() const { return reinterpret_cast<const float*>(data(EncodedArray::ScaleFactor)); }
  const float* zero_factor_data() const { return reinterpret_cast<const float*>(data(EncodedArray::ZeroFactor)); }

  /// Bytes of the arrays held (equal to the host EncodedTensor's nbytes()).
  size_t nbytes() const;
  /// Bytes of the device allocation (the arrays plus alignment padding).
  size_t allocated_bytes() const { return buf_.size(); }

 private:
  /// Byte offset of each kind of array (stage 0) in buf_; kAbsent when not present.
  static constexpr size_t kAbsent = ~size_t(0);
  size_t offset_[7] = {kAbsent, kAbsent, kAbsent, kAbsent, kAbsent, kAbsent, kAbsent};
  EncodedParts parts_ = EncodedParts::All;
  DeviceBuffer buf_;
};

/// The codebooks of an incremental span on the device (the host SpanCodebook):
/// `book` holds the centroid arrays only (all K slots; slots [0, filled) in use).
struct DeviceSpanCodebook {
  DeviceEncodedTensor book;
  int filled = 0;
  /// An empty (zeroed) span codebook for chunks of `shape` (B, H, D) in `dtype` with cfg.
  static DeviceSpanCodebook empty(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                  Allocator& alloc = default_allocator());
  static DeviceSpanCodebook upload(const SpanCodebook& s, Stream stream, Allocator& alloc = default_allocator());
  SpanCodebook download(Stream stream) const;  ///< synchronizes `stream`
  /// A device copy (a trial encode into the open span works on one).
  DeviceSpanCodebook copy(Stream stream, Allocator& alloc = default_allocator()) const;
};

/// Encodes x (device memory, [B, S, H, D] bf16/f16/f32, dense) on the device
/// (spec 1.1, 1.2). k-means assignment uses tensor cores (bf16 operands, fp32
/// accumulation, spec 1.1's expanded form on group-centred data) when D is 64,
/// 128 or 256 (and the device has the shared memory for the codebook: D = 256 with
/// K = 256 needs 133 KB), else an fp32 expanded-form kernel; centroid means are accumulated exactly
/// (fixed point, 64-bit integers), so results do not depend on scheduling; the
/// residual quantizer is bit-identical to the CPU's for the same residual.
/// Supported: every init (random and kmeans++ with the host's PRNG stream; S <= K;
/// warm: the overload below) and every other codec option. init kmeans++ makes the
/// host codec's picks (the same point indices) from the device's group-centred
/// points; it costs k_eff - 1 dependent rounds per stage, each a pass over the
/// group's points whose distances can change (exact triangle-inequality pruning), on a
/// cluster of up to 8 thread blocks per group on sm_90 and later (one block before).
/// Throws InvalidArgument for a bad config/shape, and for a head dim above what the
/// device's shared memory serves (the assignment keeps an fp32 centroid row there:
/// 24,576 channels on a device with 96 KB or more per block).
/// The input limits of spec 1 (finite, |x| <= 1e16) are the caller's
/// responsibility here (checking needs a synchronization): see check_input_limits.
/// Scratch memory (about 2 bytes per input element plus the codebooks with one stage
/// and a 16-byte aligned input, 6 with later stages or a misaligned input; init
/// kmeans++ adds 5 bytes per (batch, token, head)) comes from `alloc` and is released
/// on `stream` before returning. Asynchronous.
DeviceEncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, Stream stream,
                           Allocator& alloc = default_allocator());
/// encode() with cfg.init warm: k-means of each stage starts from `warm`'s centroids
/// (a complete encoding or a codebook of the same B, H, D, K and stages; the first
/// min(K, S) slots), as the host encode(x, cfg, warm). `warm` null: random init.
/// `energy`: when not null, receives the per-group sum of the squared final residual
/// (before quantization) as the host EncodeStats sums it (spec 1.1's exact,
/// order-independent sum, exact_sum::energy_of; groups added in order by the caller):
/// G doubles of device memory. Also accepts scale_search mse (bit-identical choice to the host).
DeviceEncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, const DeviceEncodedTensor* warm, Stream stream,
                           Allocator& alloc = default_allocator(), double* energy = nullptr);
/// The host encode_span_chunk on the device: per stage, min(add, S, K - filled) new
/// centroids trained by k-means on the chunk's residual (init random or kmeans++ with
/// the host's PRNG stream, or slots [filled, filled + add) of `warm` with init warm),
/// stored in the next free slots of span.book; then every point assigned to the
/// nearest slot in use (no update), the stored centroid subtracted, and the final
/// residual quantized. span.filled grows by the centroids added. The result holds
/// no centroids (EncodedParts::WithoutCentroids: decode it with span.book).
/// `energy` as for encode(). Differences from the host: those of encode() (bf16
/// assignment operands; near-ties may pick another centroid).
DeviceEncodedTensor encode_span_chunk(ConstTensorView x, const CodecConfig& cfg, DeviceSpanCodebook& span, int add,
                                      const DeviceEncodedTensor* warm, Stream stream,
                                      Allocator& alloc = default_allocator(), double* energy = nullptr);
/// The host encode_refinement on the device: e = x - decoded (one fp32 subtraction
/// per element, clamped to +-kMaxAbsInput), encoded in f32 with cfg (from
/// refinement_config). Asynchronous; scratch from `alloc`.
DeviceEncodedTensor encode_refinement(ConstTensorView x, ConstTensorView decoded, const CodecConfig& cfg, Stream stream,
                                      Allocator& alloc = default_allocator());
/// The host add_refinement on the device: tokens [t0, t1), heads [h0, h1) of `dst`
/// (laid out as decode_ranges writes) become round(dst + layer) once, in fp32 then
/// to dst.dtype: bit-identical to the host. REQUIRES `ref` from encode_refinement.
struct DeviceRefineTask {
  const DeviceEncodedTensor* ref = nullptr;
  int64_t t0 = 0, t1 = 0, h0 = 0, h1 = 0;
  DecodeTarget dst;
};
void add_refinements(const std::vector<DeviceRefineTask>& tasks, Stream stream);

/// Throws InvalidArgument (naming `what` and the first bad flat index) unless every
/// element of the device tensor x is finite with |x| <= 1e16. Synchronizes `stream`.
void check_input_limits(ConstTensorView x, const char* what, Stream stream);
/// Both tensors of a cache update checked at once: one flag buffer (2 x 8 bytes from
/// `alloc`), two scans, one copy back and one synchronization. The error names
/// `what_a` or `what_b` (the first tensor with a bad element) as above.
void check_input_limits(ConstTensorView a, const char* what_a, ConstTensorView b, const char* what_b, Stream stream,
                        Allocator& alloc);

/// Where a decoded range goes on the device: as qvg::DecodeTarget, device memory.
using DeviceDecodeTarget = DecodeTarget;

/// One range of decode_ranges: tokens [t0, t1), heads [h0, h1) of *enc into dst.
struct DeviceDecodeTask {
  const DeviceEncodedTensor* enc = nullptr;
  int64_t t0 = 0, t1 = 0, h0 = 0, h1 = 0;
  DeviceDecodeTarget dst;
  /// The centroids come from *codebook when set (a chunk of an incremental span,
  /// EncodedParts::WithoutCentroids), else from *enc.
  const DeviceEncodedTensor* codebook = nullptr;
  /// A refinement layer of *enc (encode_refinement of its decoded values: the same
  /// shape, f32, one symmetric stage of one centroid), added in the same pass: the
  /// bits of decoding and then add_refinements on the range. Null: none.
  const DeviceEncodedTensor* refinement = nullptr;
};
/// Decodes every task (spec 1.3 arithmetic, bit-identical to the CPU decoder) in as
/// few kernel launches as possible (one per 16 tasks): e.g. every visible segment
/// of a packed-cache window, K and V, into one strided window buffer. Element
/// (b, t, h, d) of a task lands at dst.base + b * batch_stride + (t - t0) *
/// token_stride + (h - h0) * D + d. Throws InvalidArgument for ranges outside the
/// tensor. REQUIRES targets disjoint and large enough (unchecked). Asynchronous.
void decode_ranges(const std::vector<DeviceDecodeTask>& tasks, Stream stream);
/// Decodes the whole tensor into `out` (device memory, shape == enc.shape, any dtype).
void decode(const DeviceEncodedTensor& enc, TensorView out, Stream stream);

}  // namespace qvg::cuda
