// libFuzzer target: the safetensors reader (qvg/io.h parse_safetensors).
// Properties: no crash or sanitizer report; only CorruptData / InvalidArgument;
// allocation within the stated bound; an accepted file serialises to bytes that
// parse back to the same file.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "fuzz_support.h"
#include "qvg/error.h"
#include "qvg/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvg;
  const auto f = fuzz::bounded_parse("parse_safetensors", size, true,
                                     [&] { return parse_safetensors(std::span<const uint8_t>(data, size)); });
  if (!f) return 0;
  std::vector<uint8_t> again;
  try {
    again = serialize_safetensors(*f);
  } catch (const InvalidArgument&) {
    return 0;  // names the writer refuses (e.g. not UTF-8 after escapes): reading is what is fuzzed
  }
  FUZZ_CHECK(parse_safetensors(again) == *f, "safetensors round trip differs");
  return 0;
}
