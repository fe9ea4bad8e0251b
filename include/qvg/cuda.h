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
// - CUDA errors throw qvg::cuda::CudaError (a qvg::Error of kind OutOfRange, which
//   the Python binding maps to RuntimeError) naming the failing call. Errors of
//   asynchronous kernel execution surface at the next call that synchronizes.
// - Results have the format of the CPU codec: an encoding made on the device and
//   downloaded is an EncodedTensor the CPU decodes, and decode on the device gives
//   the bits the CPU decoder gives (spec 1.3).
//
// NOT YET VERIFIED ON A GPU: this backend compiles for sm_90a/sm_80/sm_89 and its
// per-element arithmetic is tested on the host, but no kernel of it has run on a
// GPU yet (docs/cuda.md lists what has and has not been checked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/error.h"
#include "qvg/tensor.h"

struct CUstream_st;

namespace qvg::cuda {

/// The same type as cudaStream_t (nullptr = the legacy default stream).
using Stream = CUstream_st*;

/// A failed CUDA runtime or cuBLAS call; the message names the call and the error.
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& m) : Error(ErrorKind::OutOfRange, m) {}
};

/// Number of CUDA devices visible (0 when there is no driver or no device; never throws).
int device_count();

/// Stream-ordered device memory. An embedding framework (the PyTorch extension's
/// caching allocator, say) implements this to supply qvg's device memory.
struct Allocator {
  virtual ~Allocator() = default;
  /// `bytes` of device memory usable by work enqueued on `stream` after this call;
  /// at least 256-byte aligned. Throws on failure (CudaError for CUDA failures).
  virtual void* allocate(size_t bytes, Stream stream) = 0;
  /// Returns memory from allocate(bytes, ...) once the work enqueued on `stream`
  /// so far has finished with it. Must not throw.
  virtual void deallocate(void* p, size_t bytes, Stream stream) noexcept = 0;
};
/// The default allocator: cudaMallocAsync / cudaFreeAsync on the device's default pool.
Allocator& default_allocator();

/// One owning allocation from an Allocator, freed on the stream it was made on.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, Stream stream, Allocator& alloc = default_allocator());
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* data() const { return p_; }
  size_t size() const { return n_; }
  Stream stream() const { return stream_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  Stream stream_ = nullptr;
  Allocator* alloc_ = nullptr;
};

/// An encoded tensor kept on the device: the metadata of EncodedTensor and its
/// arrays (spec 1.5, the same dense row-major layouts) inside one device
/// allocation, each array 256-byte aligned. Stages are contiguous: the centroids
/// of stage s start s * (B*H*K*D) elements after stage 0's, the ids of stage s
/// s * (B*H*S) bytes after stage 0's.
class DeviceEncodedTensor {
 public:
  DType dtype = DType::BF16;
  Shape4 shape;
  int bits = 4;
  int block_size = 64;
  int stages = 1;
  int centroids = 128;
  bool asymmetric = false;
  ScaleDType scale_dtype = ScaleDType::FP8_E4M3;
  Scaling scaling = Scaling::TwoLevel;

  /// Allocates (uninitialised) arrays for an encoding of `shape` in `dtype` with cfg.
  static DeviceEncodedTensor allocate(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                      Allocator& alloc = default_allocator());
  /// Copies a host encoding to the device (validates it first; async on `stream`).
  static DeviceEncodedTensor upload(const EncodedTensor& enc, Stream stream, Allocator& alloc = default_allocator());
  /// Copies the arrays back into a host EncodedTensor. Synchronizes `stream`.
  EncodedTensor download(Stream stream) const;

  const uint8_t* centroid_data() const { return at(off_centroid_); }  ///< stage 0, dtype elements
  const uint8_t* ids_data() const { return at(off_ids_); }            ///< stage 0
  const uint8_t* codes_data() const { return at(off_codes_); }
  const uint8_t* scales_data() const { return at(off_scales_); }
  const uint8_t* zeros_data() const { return asymmetric ? at(off_zeros_) : nullptr; }
  const float* scale_factor_data() const;  ///< nullptr unless two_level
  const float* zero_factor_data() const;   ///< nullptr unless two_level and asymmetric
  uint8_t* mutable_base() { return static_cast<uint8_t*>(buf_.data()); }

  int64_t groups() const { return shape.b * shape.h; }
  int64_t blocks_per_token() const { return shape.d / block_size; }
  int64_t code_bytes_per_token() const { return shape.d * bits / 8; }
  size_t scale_elem_size() const { return scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 2; }
  /// Bytes of the arrays of spec 1.5 (equal to the host EncodedTensor's nbytes()).
  size_t nbytes() const;
  /// Bytes of the device allocation (the arrays plus alignment padding).
  size_t allocated_bytes() const { return buf_.size(); }

  // Byte offsets of the arrays inside the allocation (for the kernels).
  size_t off_centroid_ = 0, off_ids_ = 0, off_codes_ = 0, off_scales_ = 0, off_zeros_ = 0, off_sf_ = 0, off_zf_ = 0;

 private:
  const uint8_t* at(size_t off) const { return static_cast<const uint8_t*>(buf_.data()) + off; }
  DeviceBuffer buf_;
};

/// Encodes x (device memory, [B, S, H, D] bf16/f16/f32, dense) on the device
/// (spec 1.1, 1.2). k-means assignment uses tensor cores (bf16 operands, fp32
/// accumulation, spec 1.1's expanded form on group-centred data) when D is 64 or
/// 128, else an fp32 expanded-form kernel; centroid means are accumulated exactly
/// (fixed point, 64-bit integers), so results do not depend on scheduling; the
/// residual quantizer is bit-identical to the CPU's for the same residual.
/// Supported: init random (and S <= K), every other codec option. Throws
/// Unsupported for init kmeans++ or warm, InvalidArgument for a bad config/shape.
/// The input limits of spec 1 (finite, |x| <= 1e16) are the caller's
/// responsibility here (checking needs a synchronization): see check_input_limits.
/// Scratch memory (about 6 bytes per input element plus the codebooks) comes from
/// `alloc` and is released on `stream` before returning. Asynchronous.
DeviceEncodedTensor encode(ConstTensorView x, const CodecConfig& cfg, Stream stream,
                           Allocator& alloc = default_allocator());

/// Throws InvalidArgument (naming `what` and the first bad flat index) unless every
/// element of the device tensor x is finite with |x| <= 1e16. Synchronizes `stream`.
void check_input_limits(ConstTensorView x, const char* what, Stream stream);

/// Where a decoded range goes on the device: as qvg::DecodeTarget, device memory.
using DeviceDecodeTarget = DecodeTarget;

/// One range of decode_ranges: tokens [t0, t1), heads [h0, h1) of *enc into dst.
struct DeviceDecodeTask {
  const DeviceEncodedTensor* enc = nullptr;
  int64_t t0 = 0, t1 = 0, h0 = 0, h1 = 0;
  DeviceDecodeTarget dst;
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

/// Results of the GPU benchmarks (`qvg bench --device cuda`, qvg_gpu_bench).
struct BenchOptions {
  bool quick = false;  ///< smaller shapes, fewer repetitions (smoke run)
  int repeats = 20;    ///< timed repetitions per measurement (median reported)
};
/// Runs the GPU benchmarks on the current device and returns a JSON document
/// (object) as text; `table` receives a human-readable table. Synchronizes.
std::string run_benchmarks(const BenchOptions& opt, std::string* table = nullptr);

}  // namespace qvg::cuda
