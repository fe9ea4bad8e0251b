// libFuzzer target: the `.qvgt` reader, then the decoder on what it accepted.
// Properties: no crash or sanitizer report; parse_qvgt throws only CorruptData;
// allocation within the stated bound; an accepted file re-serialises byte for byte
// to a file that parses back equal; its decode is finite in every output dtype.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "fuzz_support.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvg;
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
