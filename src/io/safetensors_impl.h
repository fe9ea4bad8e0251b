// src/io/safetensors_impl.h — private: parsing with a format's own tensor limit, and
// serialising tensors that live elsewhere (e.g. the arrays of an EncodedTensor)
// without copying them into SafeTensor first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "qvg/io.h"

namespace qvg::io_detail {

/// A tensor to serialise; `data` must outlive the call.
struct TensorRef {
  std::string name;
  StDType dtype = StDType::U8;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;
};

/// parse_safetensors() accepting at most `max_tensors` tensors (InvalidArgument as
/// soon as the header holds more: a format with a known array count passes it).
SafetensorsFile parse_safetensors_limited(std::span<const uint8_t> bytes, size_t max_tensors);

/// serialize_safetensors() for borrowed tensors; same format, same errors.
std::vector<uint8_t> serialize_safetensors_refs(const std::vector<TensorRef>& tensors,
                                                const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace qvg::io_detail
