// libFuzzer target: the `.qvgt` reader, then the decoder on what it accepted.
// Properties: no crash or sanitizer report; parse_qvgt throws only CorruptData;
// allocation within the stated bound; an accepted file re-serialises byte for byte to a
// file that parses back equal; its decode is finite in every output dtype. And the
// other way round (every encoding the encoder writes is readable): an input whose first
// byte has its top bit set is also read as an encoder's job — a configuration from the
// first 3 bytes (every bit width, dtype, scale dtype, scaling, asymmetric or not, scale
// search, 1-8 centroids, 1-2 stages), then up to 8 tokens of values of the job's dtype
// taken bit for bit (denormals, the smallest normals, up to 1e16: every value the input
// limits allow; one outside them is read as 0) — is encoded, and the reader accepts the
// encoding: parse_qvgt of its serialisation equals it.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "fuzz_support.h"
#include "qvg/code_format.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/io.h"
#include "qvg/tensor.h"

namespace {

// The encoder's job of `data` (see above); its encoding must be accepted.
void encode_job(const uint8_t* data, size_t size) {
  using namespace qvg;
  if (size < 3 || (data[0] & 0x80) == 0) return;  // a job only when the first byte's top bit is set
  CodecConfig c;
  const uint8_t a = data[0], b = data[1], d = data[2];
  // The engine's widths as the seeds always chose them; with d's bit 4 set, any row of
  // the code-format table (int3 included).
  c.bits = (d & 16) ? kCodeFormats[size_t((d >> 5) + (a & 1)) % size_t(kCodeFormatCount)].bits : (a & 1) ? 4 : 2;
  c.asymmetric = (a & 2) != 0;
  c.scale_dtype = (a & 4) ? ScaleDType::BF16 : ScaleDType::FP8_E4M3;
  c.scaling = (a & 8) ? Scaling::Compat : Scaling::TwoLevel;
  c.scale_search = (a & 16) ? ScaleSearch::Mse : ScaleSearch::Off;
  constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16, DType::F32};
  const DType dt = kDTypes[(a >> 5) & 3];
  c.centroids = 1 + (b & 7);
  c.stages = 1 + ((b >> 3) & 1);
  c.kmeans_iters = 1 + ((b >> 4) & 1);
  c.threads = 1;
  constexpr int64_t kDims[] = {8, 16, 32, 16};
  const int64_t D = kDims[d & 3], H = 1 + ((d >> 2) & 1);
  c.block_size = (d & 8) ? 8 : int(D);
  const size_t es = dtype_size(dt), n = (size - 3) / es;
  const int64_t S = std::clamp<int64_t>(int64_t(n) / (H * D), 1, 8);
  Tensor x(dt, {1, S, H, D});
  for (int64_t i = 0; i < x.shape().numel(); ++i) {
    float v = 0.0f;
    if (n > 0) {
      alignas(4) uint8_t e[4] = {};
      std::memcpy(e, data + 3 + (size_t(i) % n) * es, es);  // the job's bytes, bit for bit
      v = load_f32(e, dt, 0);
    }
    if (!(std::fabs(double(v)) <= kMaxAbsInput)) v = 0.0f;  // NaN, Inf or beyond the limits
    store_f32(x.data(), dt, size_t(i), v);
  }
  EncodedTensor enc;
  try {
    enc = encode(x.view(), c);
  } catch (const Error& err) {
    FUZZ_CHECK(false, "encode refused a job inside the limits: {}", err.what());
  }
  try {
    FUZZ_CHECK(parse_qvgt(serialize_qvgt(enc)) == enc, "the encoder's output does not read back equal");
  } catch (const Error& err) {
    FUZZ_CHECK(false, "the reader refused the encoder's output: {}", err.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvg;
  encode_job(data, size);
  const auto e = fuzz::bounded_parse("parse_qvgt", size, false,
                                     [&] { return parse_qvgt(std::span<const uint8_t>(data, size)); });
  if (!e) return 0;
  const std::vector<uint8_t> again = serialize_qvgt(*e);
  FUZZ_CHECK(parse_qvgt(again) == *e, "qvgt round trip differs");
  // Decode what was accepted: no NaN or Inf from an accepted file (spec 1.6).
  for (DType out : {DType::F32, DType::BF16, DType::F16}) {
    Tensor t(out, e->shape);
    decode(*e, t.view(), 1);
    const size_t n = size_t(e->shape.numel());
    for (size_t i = 0; i < n; ++i) {
      const float v = load_f32(t.data(), out, i);
      FUZZ_CHECK(std::isfinite(v), "decoded element {} is {} ({} output)", i, v, dtype_name(out));
    }
  }
  return 0;
}
