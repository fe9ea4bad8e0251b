// qvg/io.h — tensor files: `.npy`, safetensors, and the packed tensor file `.qvgt`
// (spec 1.6).
//
// Every parser takes the whole file as a byte span, validates it completely before
// trusting any offset or size, and never reads outside the span. Every writer
// builds the complete file in memory first and the path variants write it to a
// temporary file in the same directory that is renamed into place, so a failing
// call leaves no file behind (and an existing file untouched).
//
// Error policy (spec 5):
//   CorruptData      bytes that are not a well-formed file of the format: bad magic,
//                    malformed header or JSON, truncated or trailing data, offsets out
//                    of range / overlapping / not covering the data, size != shape x
//                    dtype, duplicate names; for `.qvgt` also any inconsistency between
//                    metadata and arrays (every `.qvgt` problem is CorruptData).
//   InvalidArgument  a well-formed file whose content qvg does not handle (npy dtype
//                    other than little-endian float32/float16, Fortran order, a known
//                    safetensors dtype qvg does not read, a tensor rank other than 3/4),
//                    an unknown extension, a missing tensor name, a path that cannot be
//                    read or written, or a writer given inconsistent input.
//
// Byte order: all formats are little-endian; qvg supports little-endian hosts only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qvg/codec.h"
#include "qvg/file.h"
#include "qvg/tensor.h"

namespace qvg {

// ---- raw files: read_file_bytes, write_file_atomic (qvg/file.h) -----------------
//
// The path-taking readers below (read_safetensors, read_qvgt, inspect_qvgt,
// read_tensor_file) read a file's header first and check it against the file's size
// before anything else of the file is read or allocated (spec 5.1, "Files"): the
// length fields, then the header itself read as text in pieces of 64 KiB (a NUL byte
// ends it: a zero-filled or sparse file is refused after one piece), then that the
// data the header describes fills the rest of the file exactly. So a sparse file of
// gigabytes with a bad header costs no more than a small file; only a file whose
// header accounts for every byte is read whole (the bound of docs/reliability.md
// holds for its actual size).

// ---- .npy (format versions 1.0, 2.0 and 3.0 read; 1.0 written, 2.0 if needed) ----

/// One `.npy` array: C order, little-endian.
struct NpyArray {
  DType dtype = DType::F32;    ///< F32 (`<f4`) or F16 (`<f2`); never BF16
  std::vector<int64_t> shape;  ///< any rank (0-d = one element); every dim >= 0
  std::vector<uint8_t> data;   ///< numel * dtype_size(dtype) bytes
};

/// Parses a `.npy` file. Rejects Fortran order, other dtypes and big-endian data
/// (InvalidArgument), bad magic/header and truncated or trailing data (CorruptData).
NpyArray parse_npy(std::span<const uint8_t> bytes);
/// Serialises `a` (InvalidArgument if dtype is BF16 or data.size() != numel * size).
std::vector<uint8_t> serialize_npy(const NpyArray& a);

// ---- safetensors ------------------------------------------------------------------

/// Element types qvg reads and writes in safetensors files. Persisted by name.
enum class StDType : uint8_t { F32, F16, BF16, U8, F8_E4M3 };
std::string_view st_dtype_name(StDType t);  ///< "F32", "F16", "BF16", "U8", "F8_E4M3"
size_t st_dtype_size(StDType t);

/// One named tensor of a safetensors file.
struct SafeTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;  ///< any rank; every dim >= 0
  std::vector<uint8_t> data;   ///< numel * st_dtype_size(dtype) bytes, little-endian
  bool operator==(const SafeTensor&) const = default;
};

/// A whole safetensors file: its tensors and its `__metadata__` (string -> string).
struct SafetensorsFile {
  std::vector<SafeTensor> tensors;                            ///< in byte-buffer order
  std::vector<std::pair<std::string, std::string>> metadata;  ///< in header order
  const SafeTensor* find(std::string_view name) const;        ///< nullptr if absent
  const std::string* find_metadata(std::string_view key) const;
  bool operator==(const SafetensorsFile&) const = default;
};

/// The most tensors parse_safetensors accepts in one file (InvalidArgument beyond).
inline constexpr size_t kMaxSafetensorsTensors = 100'000;

/// Parses and strictly validates a safetensors file: the 8-byte header length within
/// the file (header <= 100 MB, at most kMaxSafetensorsTensors tensors; parsed in one
/// linear pass, with no JSON nesting beyond the format's three levels), a JSON object
/// header without duplicate keys, dtype
/// strings, shapes and `data_offsets` of unsigned integers, size == numel x dtype size,
/// and offsets that tile the byte buffer exactly (no overlap, gap or out-of-range
/// byte). Unknown keys inside a tensor entry and non-string metadata are CorruptData;
/// a valid safetensors dtype that qvg does not handle (e.g. F64) is InvalidArgument.
SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes);
/// Serialises `f`: `__metadata__` first (if not empty), then tensors in order with
/// contiguous offsets; compact JSON padded with spaces to a multiple of 8 bytes.
/// Throws InvalidArgument for duplicate or reserved names (`__metadata__`), duplicate
/// metadata keys, data sizes not matching shape x dtype, or strings that are not UTF-8.
std::vector<uint8_t> serialize_safetensors(const SafetensorsFile& f);

/// parse_safetensors of the file, read whole only after its header was checked
/// against its size (above); error messages are prefixed with the path.
SafetensorsFile read_safetensors(const std::filesystem::path& path);
/// serialize_safetensors + write_file_atomic.
void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& f);

// ---- .qvgt: one encoded tensor (spec 1.5, 1.6) -------------------------------------

/// The `format` entry a file holding `layout` carries: `qvg.prq/<v>`, v the version of
/// its code width's row in qvg/code_format.h (int2, int4: 1; int3: 2). Readers accept
/// exactly that version for that layout, and refuse a version they do not know by name.
/// REQUIRES a width with a row.
std::string qvgt_format(const EncodingLayout& layout);

/// The `.qvgt` bytes of `enc`. Arrays in the order centroids.0.., ids.0.., codes,
/// scales, zeros, scale_factor, zero_factor (absent ones skipped). Calls
/// enc.validate() first; an inconsistent `enc` is InvalidArgument.
std::vector<uint8_t> serialize_qvgt(const EncodedTensor& enc);
/// Parses a `.qvgt` file: exactly the metadata entries of spec 1.6 with canonical
/// values (the writer's spelling: `shape` is "[B,S,H,D]" without spaces, integers
/// without signs or leading zeros, stages 1..64), exactly the arrays the metadata
/// implies with their dtypes and logical shapes (so at most 2 * 64 + 5 arrays); then
/// EncodedTensor::validate() and validate_values() (every element decodes finite).
/// Every problem is CorruptData.
EncodedTensor parse_qvgt(std::span<const uint8_t> bytes);

/// What `qvg inspect` shows of a `.qvgt` file.
struct QvgtInfo {
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;  ///< the 8-byte length and the JSON header
  std::vector<std::pair<std::string, std::string>> metadata;  ///< in header order
  EncodingLayout layout;
  struct Array {
    std::string name, dtype;  ///< e.g. "codes", "U8"
    std::vector<int64_t> shape;
    uint64_t bytes = 0;
  };
  std::vector<Array> arrays;  ///< in spec 1.5 order
  uint64_t encoded_bytes = 0; ///< sum of the arrays (spec 1.5's encoded size)
};
/// Reads only the header of a `.qvgt` file (never its arrays) and checks everything
/// parse_qvgt checks there: metadata, the array set, dtypes, shapes and offsets. The
/// values are not read (parse_qvgt does that). CorruptData prefixed with the path;
/// InvalidArgument for an unreadable path. The format carries no checksums.
QvgtInfo inspect_qvgt(const std::filesystem::path& path);

/// serialize_qvgt + write_file_atomic: nothing is written if `enc` is inconsistent.
void write_qvgt(const std::filesystem::path& path, const EncodedTensor& enc);
/// parse_qvgt of the file, read whole only after its header was checked against its
/// size (above); CorruptData messages are prefixed with the path.
EncodedTensor read_qvgt(const std::filesystem::path& path);

// ---- K/V tensors for the CLI ------------------------------------------------------

/// Reads a [B, S, H, D] tensor, dispatching on the extension: `.npy` (float32/float16)
/// or `.safetensors` (F32/F16/BF16). Rank 3 means [S, H, D] with B = 1; rank 4 is
/// [B, S, H, D]; other ranks are InvalidArgument. `name` selects a safetensors tensor;
/// without it the file must hold exactly one tensor (else InvalidArgument listing the
/// names). A name given for a `.npy` file is InvalidArgument. The result has the file's
/// dtype (npy float16 -> F16).
Tensor read_tensor_file(const std::filesystem::path& path, const std::optional<std::string>& name = std::nullopt);

/// Writes `t` as a 4-D [B, S, H, D] array, dispatching on the extension: `.npy` stores
/// F32 and F16 as they are and BF16 as float32 holding exactly the bf16 values (spec
/// 1.6); `.safetensors` stores F32/F16/BF16 as they are, under `name`.
void write_tensor_file(const std::filesystem::path& path, ConstTensorView t, std::string_view name = "tensor");

}  // namespace qvg
