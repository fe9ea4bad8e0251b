// Host side of the CUDA backend: errors, the default allocator, device buffers,
// device-resident encoded tensors (upload / download) and the decode entry points.
#include <cuda_runtime_api.h>

#include <algorithm>

#include <fmt/core.h>

#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "qvg/cuda.h"

namespace qvg::cuda {
namespace detail {

void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw CudaError(fmt::format("CUDA call {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(e),
                              cudaGetErrorString(e), file, line));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw CudaError(fmt::format("CUDA kernel launch {} failed: {} ({})", kernel, cudaGetErrorName(e),
                                cudaGetErrorString(e)));
}

}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device/driver" error
    return 0;
  }
  return n;
}

namespace {

class AsyncAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Stream stream) override {
    void* p = nullptr;
    QVG_CUDA(cudaMallocAsync(&p, std::max<size_t>(bytes, 1), stream));
    return p;
  }
  void deallocate(void* p, size_t, Stream stream) noexcept override {
    if (p) (void)cudaFreeAsync(p, stream);
  }
};

size_t align256(size_t v) { return (v + 255) & ~size_t(255); }

int arith_dtype(DType t) {
  switch (t) {
    case DType::BF16: return cuda_arith::kBF16;
    case DType::F16: return cuda_arith::kF16;
    case DType::F32: return cuda_arith::kF32;
  }
  return cuda_arith::kF32;
}

}  // namespace

Allocator& default_allocator() {
  static AsyncAllocator a;
  return a;
}

// ---- DeviceBuffer -------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes, Stream stream, Allocator& alloc)
    : p_(alloc.allocate(bytes, stream)), n_(bytes), stream_(stream), alloc_(&alloc) {}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_), stream_(o.stream_), alloc_(o.alloc_) {
  o.p_ = nullptr;
  o.n_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) alloc_->deallocate(p_, n_, stream_);
    p_ = o.p_;
    n_ = o.n_;
    stream_ = o.stream_;
    alloc_ = o.alloc_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) alloc_->deallocate(p_, n_, stream_);
}

// ---- DeviceEncodedTensor --------------------------------------------------------

DeviceEncodedTensor DeviceEncodedTensor::allocate(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                                  Allocator& alloc) {
  if (shape.b < 1 || shape.s < 1 || shape.h < 1 || shape.d < 1)
    throw InvalidArgument(
        fmt::format("input shape must be [B, S, H, D] with every dimension >= 1, got {}", shape.str()));
  cfg.validate_for_head_dim(shape.d);
  if (shape.s >= (int64_t(1) << 31) || shape.b * shape.h >= (int64_t(1) << 31))
    throw InvalidArgument(fmt::format("input shape {} is too large (tokens and groups must be < 2^31)", shape.str()));
  DeviceEncodedTensor e;
  e.dtype = dtype;
  e.shape = shape;
  e.bits = cfg.bits;
  e.block_size = cfg.block_size;
  e.stages = cfg.stages;
  e.centroids = cfg.centroids;
  e.asymmetric = cfg.asymmetric;
  e.scale_dtype = cfg.scale_dtype;
  e.scaling = cfg.scaling;
  const size_t G = size_t(e.groups()), S = size_t(shape.s), D = size_t(shape.d), K = size_t(cfg.centroids);
  const size_t nst = size_t(cfg.stages);
  const size_t nblocks = G * S * size_t(e.blocks_per_token());
  size_t off = 0;
  e.off_centroid_ = off;
  off = align256(off + nst * G * K * D * dtype_size(dtype));
  e.off_ids_ = off;
  off = align256(off + nst * G * S);
  e.off_codes_ = off;
  off = align256(off + G * S * size_t(e.code_bytes_per_token()));
  e.off_scales_ = off;
  off = align256(off + nblocks * e.scale_elem_size());
  e.off_zeros_ = off;
  if (e.asymmetric) off = align256(off + nblocks * e.scale_elem_size());
  e.off_sf_ = off;
  if (e.scaling == Scaling::TwoLevel) off = align256(off + G * 4);
  e.off_zf_ = off;
  if (e.scaling == Scaling::TwoLevel && e.asymmetric) off = align256(off + G * 4);
  e.buf_ = DeviceBuffer(off, stream, alloc);
  return e;
}

const float* DeviceEncodedTensor::scale_factor_data() const {
  return scaling == Scaling::TwoLevel ? reinterpret_cast<const float*>(at(off_sf_)) : nullptr;
}
const float* DeviceEncodedTensor::zero_factor_data() const {
  return scaling == Scaling::TwoLevel && asymmetric ? reinterpret_cast<const float*>(at(off_zf_)) : nullptr;
}

size_t DeviceEncodedTensor::nbytes() const {
  const size_t G = size_t(groups()), S = size_t(shape.s), D = size_t(shape.d), K = size_t(centroids);
  const size_t nblocks = G * S * size_t(blocks_per_token());
  size_t n = size_t(stages) * (G * K * D * dtype_size(dtype) + G * S);
  n += G * S * size_t(code_bytes_per_token()) + nblocks * scale_elem_size() * (asymmetric ? 2 : 1);
  if (scaling == Scaling::TwoLevel) n += G * 4 * (asymmetric ? 2 : 1);
  return n;
}

DeviceEncodedTensor DeviceEncodedTensor::upload(const EncodedTensor& enc, Stream stream, Allocator& alloc) {
  enc.validate();
  DeviceEncodedTensor e = allocate(enc.shape, enc.dtype, enc.config(), stream, alloc);
  uint8_t* base = e.mutable_base();
  const auto put = [&](size_t off, const void* src, size_t n) {
    if (n) QVG_CUDA(cudaMemcpyAsync(base + off, src, n, cudaMemcpyHostToDevice, stream));
  };
  const size_t csz = enc.centroid.empty() ? 0 : enc.centroid[0].size(), isz = enc.ids.empty() ? 0 : enc.ids[0].size();
  for (int s = 0; s < enc.stages; ++s) {
    put(e.off_centroid_ + size_t(s) * csz, enc.centroid[size_t(s)].data(), csz);
    put(e.off_ids_ + size_t(s) * isz, enc.ids[size_t(s)].data(), isz);
  }
  put(e.off_codes_, enc.codes.data(), enc.codes.size());
  put(e.off_scales_, enc.scales.data(), enc.scales.size());
  if (enc.asymmetric) put(e.off_zeros_, enc.zeros.data(), enc.zeros.size());
  if (enc.scaling == Scaling::TwoLevel) {
    put(e.off_sf_, enc.scale_factor.data(), enc.scale_factor.size() * 4);
    if (enc.asymmetric) put(e.off_zf_, enc.zero_factor.data(), enc.zero_factor.size() * 4);
  }
  return e;
}

EncodedTensor DeviceEncodedTensor::download(Stream stream) const {
  EncodedTensor enc;
  enc.dtype = dtype;
  enc.shape = shape;
  enc.bits = bits;
  enc.block_size = block_size;
  enc.stages = stages;
  enc.centroids = centroids;
  enc.asymmetric = asymmetric;
  enc.scale_dtype = scale_dtype;
  enc.scaling = scaling;
  const size_t G = size_t(groups()), S = size_t(shape.s), D = size_t(shape.d), K = size_t(centroids);
  const size_t csz = G * K * D * dtype_size(dtype), isz = G * S;
  const size_t nblocks = G * S * size_t(blocks_per_token());
  enc.centroid.assign(size_t(stages), std::vector<uint8_t>(csz));
  enc.ids.assign(size_t(stages), std::vector<uint8_t>(isz));
  enc.codes.resize(G * S * size_t(code_bytes_per_token()));
  enc.scales.resize(nblocks * scale_elem_size());
  if (asymmetric) enc.zeros.resize(nblocks * scale_elem_size());
  if (scaling == Scaling::TwoLevel) {
    enc.scale_factor.resize(G);
    if (asymmetric) enc.zero_factor.resize(G);
  }
  const auto get = [&](void* dst, size_t off, size_t n) {
    if (n) QVG_CUDA(cudaMemcpyAsync(dst, at(off), n, cudaMemcpyDeviceToHost, stream));
  };
  for (int s = 0; s < stages; ++s) {
    get(enc.centroid[size_t(s)].data(), off_centroid_ + size_t(s) * csz, csz);
    get(enc.ids[size_t(s)].data(), off_ids_ + size_t(s) * isz, isz);
  }
  get(enc.codes.data(), off_codes_, enc.codes.size());
  get(enc.scales.data(), off_scales_, enc.scales.size());
  if (asymmetric) get(enc.zeros.data(), off_zeros_, enc.zeros.size());
  if (scaling == Scaling::TwoLevel) {
    get(enc.scale_factor.data(), off_sf_, G * 4);
    if (asymmetric) get(enc.zero_factor.data(), off_zf_, G * 4);
  }
  QVG_CUDA(cudaStreamSynchronize(stream));
  return enc;
}

// ---- decode ---------------------------------------------------------------------

void decode_ranges(const std::vector<DeviceDecodeTask>& tasks, Stream stream) {
  std::vector<kernels::DecodeTask> kt;
  kt.reserve(tasks.size());
  for (const DeviceDecodeTask& tk : tasks) {
    if (tk.enc == nullptr) throw InvalidArgument("decode task without an encoded tensor");
    const DeviceEncodedTensor& e = *tk.enc;
    if (!(0 <= tk.t0 && tk.t0 <= tk.t1 && tk.t1 <= e.shape.s && 0 <= tk.h0 && tk.h0 < tk.h1 && tk.h1 <= e.shape.h))
      throw InvalidArgument(fmt::format("decode range tokens [{}, {}) heads [{}, {}) is outside the tensor {}", tk.t0,
                                        tk.t1, tk.h0, tk.h1, e.shape.str()));
    if (tk.dst.base == nullptr) throw InvalidArgument("decode target base is null");
    kernels::DecodeTask t;
    t.codes = e.codes_data();
    t.scales = e.scales_data();
    t.zeros = e.zeros_data();
    t.scale_factor = e.scale_factor_data();
    t.zero_factor = e.zero_factor_data();
    t.ids = e.ids_data();
    t.centroid = e.centroid_data();
    t.ids_stage_stride = e.groups() * e.shape.s;
    t.centroid_stage_stride = e.groups() * e.centroids * e.shape.d * int64_t(dtype_size(e.dtype));
    t.B = int32_t(e.shape.b);
    t.S = int32_t(e.shape.s);
    t.H = int32_t(e.shape.h);
    t.D = int32_t(e.shape.d);
    t.K = e.centroids;
    t.bits = e.bits;
    t.block = e.block_size;
    t.stages = e.stages;
    t.t0 = int32_t(tk.t0);
    t.t1 = int32_t(tk.t1);
    t.h0 = int32_t(tk.h0);
    t.h1 = int32_t(tk.h1);
    t.asymmetric = e.asymmetric ? 1 : 0;
    t.fp8 = e.scale_dtype == ScaleDType::FP8_E4M3 ? 1 : 0;
    t.centroid_dtype = int8_t(arith_dtype(e.dtype));
    t.out_dtype = int8_t(arith_dtype(tk.dst.dtype));
    t.out = tk.dst.base;
    t.batch_stride = tk.dst.batch_stride;
    t.token_stride = tk.dst.token_stride;
    kt.push_back(t);
  }
  kernels::decode_tasks(kt.data(), int(kt.size()), stream);
}

void decode(const DeviceEncodedTensor& enc, TensorView out, Stream stream) {
  if (!(out.shape == enc.shape))
    throw InvalidArgument(fmt::format("decode output shape must be {}, got {}", enc.shape.str(), out.shape.str()));
  DeviceDecodeTask t;
  t.enc = &enc;
  t.t0 = 0;
  t.t1 = enc.shape.s;
  t.h0 = 0;
  t.h1 = enc.shape.h;
  t.dst = DecodeTarget{out.data, out.dtype, enc.shape.s * enc.shape.h * enc.shape.d, enc.shape.h * enc.shape.d};
  decode_ranges({t}, stream);
}

}  // namespace qvg::cuda
