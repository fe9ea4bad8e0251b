// src/io/safetensors_impl.h — private: parsing with a format's own tensor limit, and
// serialising tensors that live elsewhere (e.g. the arrays of an EncodedTensor)
// without copying them into SafeTensor first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/file_impl.h"
#include "qvg/io.h"

namespace qvg::io_detail {

/// A tensor to serialise; `data` must outlive the call.
struct TensorRef {
  std::string name;
  StDType dtype = StDType::U8;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;
};

/// A tensor entry of a safetensors header: name, dtype and shape (t.data empty) and
/// its byte range within the data buffer.
struct TensorEntry {
  SafeTensor t;
  uint64_t begin = 0, end = 0;
};

/// A parsed safetensors header: the tensors sorted by offset (tiling the data
/// buffer exactly) and the metadata in header order.
struct SafetensorsHeader {
  uint64_t header_len = 0;  ///< N of the 8-byte length field: the data starts at 8 + N
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<TensorEntry> tensors;
};

/// The header length N of a safetensors file of file_size bytes, from its first 8
/// bytes: CorruptData unless 8 + N <= file_size and N <= 100 MB.
uint64_t safetensors_header_length(std::span<const uint8_t> head, uint64_t file_size);

/// Parses the header of a safetensors file of file_size bytes whose first
/// 8 + N bytes are in `head` (what parse_safetensors checks, without the data).
SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> head, uint64_t file_size, size_t max_tensors);

/// The header of the safetensors file f, read and checked before anything else of
/// the file is (qvg/io.h): the length field, then the JSON header read as
/// text (a NUL byte ends it after at most 64 KiB), then parse_safetensors_header
/// against f.size() (tensors tiling the rest of the file exactly). Throws what
/// parse_safetensors throws on that header.
SafetensorsHeader read_safetensors_header(const detail::ReadOnlyFile& f, size_t max_tensors);

/// parse_safetensors() accepting at most `max_tensors` tensors (InvalidArgument as
/// soon as the header holds more: a format with a known array count passes it).
SafetensorsFile parse_safetensors_limited(std::span<const uint8_t> bytes, size_t max_tensors);

/// serialize_safetensors() for borrowed tensors; same format, same errors.
std::vector<uint8_t> serialize_safetensors_refs(const std::vector<TensorRef>& tensors,
                                                const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace qvg::io_detail
