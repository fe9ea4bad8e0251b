// qvg/code_format.h — the residual's code formats (spec 1.2, 1.5): one row per code
// width, and the one place that turns a run-time width into a compile-time constant.
//
// Everything that depends on what a width means — codes per packed group, bytes per
// group, qmax, the block-size rule, the formats' version, whether the engine knows
// the width — is read from a row here; nothing else restates a width's arithmetic
// (docs/design.md, "Code formats"). The encoders and decoders of every backend (the
// scalar reference, each SIMD target, CUDA) are templates over `Width<bits>` and are
// instantiated for every row through `dispatch_width`, so a new width is a new row.
//
// Packing (spec 1.5), one rule for every width: along D, codes are packed in groups
// of G = group_codes codes that fill B = group_bytes whole bytes; the group's value
// V = sum over i < G of code[i] << ((G - 1 - i) * bits) is stored most significant
// byte first (int4: 2 codes in 1 byte, int2: 4 in 1, int3: 8 in 3).
//
// Usable from nvcc device code (QVG_HD): the CUDA bodies include it. Two host functions
// are defined out of line (unknown_code_width, known_code_widths: src/core/code_format.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "qvg/host_device.h"

namespace qvg {

/// One residual code width (a row of the table).
struct CodeFormat {
  int bits;         ///< code width in bits
  int group_codes;  ///< G: codes per packed group (also the block_size multiple: a block fills whole groups)
  int group_bytes;  ///< B: bytes per packed group, G * bits / 8
  int qmax_sym;     ///< symmetric qmax, 2^(bits-1) - 1 (spec 1.2)
  int qmax_asym;    ///< asymmetric qmax, 2^bits - 1
  /// The `.qvgt` format version (`qvg.prq/<v>`, spec 1.6) and the snapshot format minor
  /// (docs/snapshot.md) a file needs to hold this width: the reference's widths are in
  /// the first versions; a width added later raises them, so older readers refuse it by
  /// the version's name instead of misreading it.
  int qvgt_version;
  int snapshot_minor;
  bool engine;       ///< a width of the engine's own `kv_cache_quant` (int2, int4); else a qvg extension
  const char* mode;  ///< the engine flag value: "int2"
};

// The rows, one X(bits, G, B, qvgt_version, snapshot_minor, engine) per width, in
// increasing width. Adding a width is adding its row (the static_asserts below check
// it); every backend is instantiated for it through dispatch_width.
// clang-format off
#define QVG_CODE_WIDTHS(X) \
  X(2, 4, 1, 1, 0, true)   \
  X(3, 8, 3, 2, 5, false)  \
  X(4, 2, 1, 1, 0, true)
// clang-format on

inline constexpr CodeFormat kCodeFormats[] = {
#define QVG_CODE_ROW(b, g, n, qv, sm, eng) CodeFormat{b, g, n, (1 << (b - 1)) - 1, (1 << b) - 1, qv, sm, eng, "int" #b},
    QVG_CODE_WIDTHS(QVG_CODE_ROW)
#undef QVG_CODE_ROW
};
inline constexpr int kCodeFormatCount = int(sizeof kCodeFormats / sizeof kCodeFormats[0]);

/// The index of a width's row in kCodeFormats, or -1 when no row has it. Usable in
/// constant expressions (by index, not pointer: GCC's sanitizer builds refuse pointer
/// comparisons in constant expressions).
constexpr int code_format_index(int bits) {
  for (int i = 0; i < kCodeFormatCount; ++i)
    if (kCodeFormats[i].bits == bits) return i;
  return -1;
}
/// The row of a width, or nullptr when no row has it.
constexpr const CodeFormat* find_code_format(int bits) {
  const int i = code_format_index(bits);
  return i < 0 ? nullptr : &kCodeFormats[i];
}

/// The compile-time form of a row, for kernels: `Width<bits>::kGroupCodes` etc.
/// REQUIRES a width with a row (a static_assert says so otherwise).
template <int B>
struct Width {
  static_assert(code_format_index(B) >= 0, "no code-format row for this width (qvg/code_format.h)");
  static constexpr CodeFormat kRow = kCodeFormats[code_format_index(B) < 0 ? 0 : code_format_index(B)];
  static constexpr int kBits = B;
  static constexpr int kGroupCodes = kRow.group_codes;
  static constexpr int kGroupBytes = kRow.group_bytes;
  static constexpr int kQmaxSym = kRow.qmax_sym;
  static constexpr int kQmaxAsym = kRow.qmax_asym;
  static constexpr uint32_t kMask = (1u << B) - 1u;
  /// The right shift of code j (0 <= j < G) of a group value V (spec 1.5).
  static constexpr int shift(int j) { return (kGroupCodes - 1 - j) * B; }
};

namespace code_format_detail {
constexpr bool rows_valid() {
  int prev = 0;
  for (const CodeFormat& f : kCodeFormats) {
    if (f.bits <= prev || f.bits < 1 || f.bits > 8) return false;   // increasing, 1..8 bits
    if (f.group_codes * f.bits != 8 * f.group_bytes) return false;  // a group fills whole bytes
    if (f.group_bytes < 1 || f.group_bytes > 4) return false;       // a group's value fits 32 bits
    for (int k = 1; k < f.group_codes; ++k)                         // and no smaller group would
      if ((k * f.bits) % 8 == 0) return false;
    if (f.qmax_sym < 1 || f.qmax_asym != 2 * f.qmax_sym + 1) return false;
    if (f.qvgt_version < 1 || f.snapshot_minor < 0) return false;
    if (f.engine && (f.qvgt_version != 1 || f.snapshot_minor != 0)) return false;  // the reference's formats
    prev = f.bits;
  }
  return true;
}
}  // namespace code_format_detail
static_assert(code_format_detail::rows_valid(), "a code-format row is inconsistent (qvg/code_format.h)");
// The engine's two widths are pinned by the reference's layout (spec 1.5).
static_assert(Width<2>::kGroupCodes == 4 && Width<2>::kGroupBytes == 1 && Width<2>::kQmaxSym == 1);
static_assert(Width<4>::kGroupCodes == 2 && Width<4>::kGroupBytes == 1 && Width<4>::kQmaxSym == 7);

/// Called by dispatch_width for a width without a row: on the host it throws
/// InvalidArgument ("no code format for <bits>-bit codes (known: 2, 3, 4)"); device code
/// traps. Never reached through validated settings (every reader checks the width).
[[noreturn]] void unknown_code_width(int bits);

/// Calls f(Width<bits>{}) for the row of `bits` and returns its result: the one place a
/// run-time width becomes a compile-time constant, for every kernel backend. A width
/// without a row fails loudly (unknown_code_width; __trap() on the device).
template <class F>
QVG_HD decltype(auto) dispatch_width(int bits, F&& f) {
  switch (bits) {
#define QVG_CODE_CASE(b, ...) \
  case b: return f(Width<b>{});
    QVG_CODE_WIDTHS(QVG_CODE_CASE)
#undef QVG_CODE_CASE
    default: break;
  }
#if defined(__CUDA_ARCH__)
  __trap();
  return f(Width<kCodeFormats[0].bits>{});  // unreachable; gives the return type
#else
  unknown_code_width(bits);
#endif
}

/// The widths with a row, for messages: "2, 3 or 4" (as_modes: "int2, int3 or int4").
std::string known_code_widths(bool as_modes = false);

// ---- packing (spec 1.5), for any row -----------------------------------------------

/// Bytes of the codes of `d` channels (REQUIRES d a multiple of the row's group_codes).
constexpr int64_t code_bytes(const CodeFormat& f, int64_t d) {
  return d / f.group_codes * f.group_bytes;
}

/// The value V of the group of codes starting at `p` (its group_bytes bytes, most
/// significant first).
template <class W>
QVG_HD uint32_t group_value(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < W::kGroupBytes; ++i) v = (v << 8) | p[i];
  return v;
}
/// Code i of a packed row of codes of width W.
template <class W>
QVG_HD int code_at(const uint8_t* row, int64_t i) {
  const int64_t g = i / W::kGroupCodes;
  const int j = int(i - g * W::kGroupCodes);
  return int((group_value<W>(row + g * W::kGroupBytes) >> W::shift(j)) & W::kMask);
}
/// Writes the group of W::kGroupCodes codes `c` (each < 2^bits) at `p`.
template <class W, class Codes>
QVG_HD void pack_group(const Codes& c, uint8_t* p) {
  uint32_t v = 0;
  for (int j = 0; j < W::kGroupCodes; ++j) v |= uint32_t(c[j]) << W::shift(j);
  for (int i = 0; i < W::kGroupBytes; ++i) p[i] = uint8_t(v >> (8 * (W::kGroupBytes - 1 - i)));
}
/// Code i of a packed row, width chosen at run time (scalar paths; kernels use code_at<W>).
QVG_HD int code_at(const uint8_t* row, int bits, int64_t i) {
  return dispatch_width(bits, [&](auto w) { return code_at<decltype(w)>(row, i); });
}

}  // namespace qvg
