// libFuzzer target: the `.npy` reader (qvg/io.h parse_npy).
// Properties: no crash or sanitizer report; only CorruptData / InvalidArgument;
// allocation within the stated bound; an accepted file re-serialises to an array
// that parses back equal.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.h"
#include "qvg/error.h"
#include "qvg/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvg;
  const std::span<const uint8_t> in(data, size);
  const auto a = fuzz::bounded_parse("parse_npy", size, true, [&] { return parse_npy(in); });
  if (!a) return 0;
  const NpyArray b = parse_npy(serialize_npy(*a));
  FUZZ_CHECK(b.dtype == a->dtype && b.shape == a->shape && b.data == a->data, "npy round trip differs");
  return 0;
}
