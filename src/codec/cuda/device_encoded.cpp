// The CUDA backend's device-resident encoded tensors (upload / download), span
// codebooks and the decode entry points (qvg/cuda.h): the codec layer's host code over
// the kernels of src/kernels/cuda.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "codec/cuda/range_args.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "qvg/cuda.h"

namespace qvg::cuda {
namespace {
size_t align256(size_t v) {
  return (v + 255) & ~size_t(255);
}
}  // namespace

// ---- DeviceEncodedTensor --------------------------------------------------------

namespace {
/// Whether an encoding with `parts` holds arrays of `kind`.
bool holds(EncodedParts parts, EncodedArray kind) {
  if (parts == EncodedParts::All) return true;
  return (kind == EncodedArray::Centroids) == (parts == EncodedParts::CentroidsOnly);
}
}  // namespace

DeviceEncodedTensor DeviceEncodedTensor::allocate(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                                  Allocator& alloc, EncodedParts parts) {
  if (shape.b < 1 || shape.s < 1 || shape.h < 1 || shape.d < 1)
    throw InvalidArgument(
        fmt::format("input shape must be [B, S, H, D] with every dimension >= 1, got {}", shape.str()));
  cfg.validate_for_head_dim(shape.d);
  if (shape.s >= (int64_t(1) << 31) || shape.b * shape.h >= (int64_t(1) << 31))
    throw InvalidArgument(fmt::format("input shape {} is too large (tokens and groups must be < 2^31)", shape.str()));
  DeviceEncodedTensor e;
  static_cast<EncodingLayout&>(e) = EncodingLayout::of(shape, dtype, cfg);
  e.parts_ = parts;
  // One allocation: each kind of array 256-byte aligned, the stages of a kind contiguous.
  size_t off = 0;
  for (const ArrayDesc& a : e.arrays()) {
    if (!holds(parts, a.kind)) continue;
    size_t& kind_off = e.offset_[size_t(a.kind)];
    if (a.stage == 0) kind_off = off = align256(off);
    off += a.bytes();
  }
  e.buf_ = DeviceBuffer(align256(off), stream, alloc);
  return e;
}

const uint8_t* DeviceEncodedTensor::data(EncodedArray kind) const {
  const size_t off = offset_[size_t(kind)];
  return off == kAbsent ? nullptr : static_cast<const uint8_t*>(buf_.data()) + off;
}
uint8_t* DeviceEncodedTensor::mutable_data(EncodedArray kind) {
  return const_cast<uint8_t*>(std::as_const(*this).data(kind));
}

namespace {
/// Device address of one array of `e` (stage s of centroids/ids after stage 0's).
const uint8_t* array_address(const DeviceEncodedTensor& e, const ArrayDesc& a) {
  return e.data(a.kind) + size_t(a.stage) * a.bytes();
}
}  // namespace

size_t DeviceEncodedTensor::nbytes() const {
  size_t n = 0;
  for (const ArrayDesc& a : arrays())
    if (holds(parts_, a.kind)) n += a.bytes();
  return n;
}

DeviceEncodedTensor DeviceEncodedTensor::upload(const EncodedTensor& enc, Stream stream, Allocator& alloc) {
  // A span chunk's encoding has no centroids, a codebook nothing but centroids.
  const bool no_centroids =
      std::all_of(enc.centroid.begin(), enc.centroid.end(), [](const auto& c) { return c.empty(); });
  const bool only_centroids = enc.codes.empty() && enc.scales.empty();
  const EncodedParts parts = no_centroids     ? EncodedParts::WithoutCentroids
                             : only_centroids ? EncodedParts::CentroidsOnly
                                              : EncodedParts::All;
  if (parts == EncodedParts::All) {
    enc.validate();
  } else {
    enc.check();
    // A span chunk's ids index its span's codebook (decode reads row id of K): each < K.
    for (size_t st = 0; st < enc.ids.size(); ++st)
      for (const uint8_t id : enc.ids[st])
        if (int64_t(id) >= int64_t(enc.centroids))
          throw CorruptData(fmt::format("upload: ids.{} holds id {} >= {} (centroids)", st, id, enc.centroids));
  }
  DeviceEncodedTensor e = allocate(enc.shape, enc.dtype, enc.config(), stream, alloc, parts);
  for (const ArrayDesc& a : e.arrays()) {
    if (!holds(parts, a.kind)) continue;
    const std::span<const uint8_t> src = enc.array(a);
    if (src.size() != a.bytes())
      throw InvalidArgument(
          fmt::format("upload: array {} must hold {} bytes, got {}", a.name(), a.bytes(), src.size()));
    if (!src.empty())
      QVG_CUDA(cudaMemcpyAsync(const_cast<uint8_t*>(array_address(e, a)), src.data(), src.size(),
                               cudaMemcpyHostToDevice, stream));
  }
  // The caller may free `enc` on return: a copy from pageable memory is not promised to
  // have read its source when cudaMemcpyAsync returns (it may DMA from it later where the
  // device reads host memory directly), so wait for the copies.
  QVG_CUDA(cudaStreamSynchronize(stream));
  return e;
}

EncodedTensor DeviceEncodedTensor::download(Stream stream) const {
  EncodedTensor enc = EncodedTensor::allocate(*this);
  if (parts_ != EncodedParts::All) {  // as the host span chunks and codebooks: absent arrays empty
    const EncodedTensor full = std::move(enc);
    enc = parts_ == EncodedParts::CentroidsOnly ? full.codebooks_only() : full;
    if (parts_ == EncodedParts::WithoutCentroids)
      for (auto& c : enc.centroid) c = std::vector<uint8_t>();
  }
  for (const ArrayDesc& a : arrays()) {
    if (!holds(parts_, a.kind)) continue;
    const std::span<uint8_t> dst = enc.array(a);
    if (!dst.empty())
      QVG_CUDA(cudaMemcpyAsync(dst.data(), array_address(*this, a), dst.size(), cudaMemcpyDeviceToHost, stream));
  }
  QVG_CUDA(cudaStreamSynchronize(stream));
  return enc;
}

// ---- decode ---------------------------------------------------------------------

namespace {

/// One decode task's kernel arguments, after its checks (InvalidArgument).
kernels::DecodeArgs decode_task_args(const DeviceDecodeTask& tk) {
  if (tk.enc == nullptr) throw InvalidArgument("decode task without an encoded tensor");
  const DeviceEncodedTensor& e = *tk.enc;
  if (tk.dst.base == nullptr) throw InvalidArgument("decode target base is null");
  const DeviceEncodedTensor& book = tk.codebook ? *tk.codebook : e;
  if (book.centroid_data() == nullptr || e.codes_data() == nullptr)
    throw InvalidArgument("decode task: the encoding has no centroids and no codebook was given, or no codes");
  if (tk.codebook && (book.shape.b != e.shape.b || book.shape.h != e.shape.h || book.shape.d != e.shape.d ||
                      book.centroids != e.centroids || book.stages != e.stages || book.dtype != e.dtype))
    throw InvalidArgument("decode task: the codebook must match the encoding's B, H, D, K, stages and dtype");
  kernels::DecodeArgs t = range_args("decode", e, book, tk.t0, tk.t1, tk.h0, tk.h1, tk.dst);
  if (const DeviceEncodedTensor* r = tk.refinement) {
    check_layer(*r);
    if (!(r->shape == e.shape))
      throw InvalidArgument(fmt::format("decode task: the refinement layer's shape must be the encoding's {}, got {}",
                                        e.shape.str(), r->shape.str()));
    set_refinement(t, *r, arrays_of(*r, *r));
  }
  return t;
}

}  // namespace

void decode_ranges(const std::vector<DeviceDecodeTask>& tasks, Stream stream) {
  std::vector<kernels::DecodeArgs> kt;
  for (const DeviceDecodeTask& tk : tasks) kt.push_back(decode_task_args(tk));
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

// ---- span codebooks --------------------------------------------------------------

DeviceSpanCodebook DeviceSpanCodebook::empty(Shape4 shape, DType dtype, const CodecConfig& cfg, Stream stream,
                                             Allocator& alloc) {
  DeviceSpanCodebook s;
  s.book = DeviceEncodedTensor::allocate(shape, dtype, cfg, stream, alloc, EncodedParts::CentroidsOnly);
  const size_t n = size_t(shape.b * shape.h * cfg.centroids * shape.d) * dtype_size(dtype) * size_t(cfg.stages);
  QVG_CUDA(cudaMemsetAsync(s.book.mutable_data(EncodedArray::Centroids), 0, n, stream));
  return s;
}
DeviceSpanCodebook DeviceSpanCodebook::upload(const SpanCodebook& h, Stream stream, Allocator& alloc) {
  DeviceSpanCodebook s;
  s.book = DeviceEncodedTensor::upload(h.book, stream, alloc);
  if (s.book.parts() != EncodedParts::CentroidsOnly)
    throw InvalidArgument("span codebook upload: the book must hold centroid arrays only");
  s.filled = h.filled;
  return s;
}
SpanCodebook DeviceSpanCodebook::download(Stream stream) const {
  SpanCodebook h;
  h.book = book.download(stream);
  h.filled = filled;
  return h;
}
DeviceSpanCodebook DeviceSpanCodebook::copy(Stream stream, Allocator& alloc) const {
  DeviceSpanCodebook s;
  s.book =
      DeviceEncodedTensor::allocate(book.shape, book.dtype, book.config(), stream, alloc, EncodedParts::CentroidsOnly);
  QVG_CUDA(cudaMemcpyAsync(s.book.mutable_data(EncodedArray::Centroids), book.centroid_data(), book.nbytes(),
                           cudaMemcpyDeviceToDevice, stream));
  s.filled = filled;
  return s;
}

}  // namespace qvg::cuda
