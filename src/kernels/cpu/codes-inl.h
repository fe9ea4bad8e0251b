// src/kernels/cpu/codes-inl.h — the packing of residual codes (spec 1.5) for the
// CPU kernels, per SIMD target: qvg::group_value and qvg::pack_group of
// qvg/code_format.h written as single expressions over the row's compile-time G and
// B, so that every width compiles to straight-line code (the compiler does not
// always unroll the table's loops). Used by decode-inl.h and encode-inl.h; included
// once per target by dispatch.cpp, before them.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
#include "qvg/code_format.h"

QVG_CPU_KERNELS_BEGIN

template <class W, size_t... K>
HWY_INLINE uint32_t GroupValueOf(const uint8_t* p, std::index_sequence<K...>) {
  return ((uint32_t(p[K]) << (8 * (W::kGroupBytes - 1 - int(K)))) | ...);
}
/// The value V of the group whose W::kGroupBytes bytes start at p (most significant
/// byte first): qvg::group_value<W>.
template <class W>
HWY_INLINE uint32_t GroupValue(const uint8_t* p) {
  return GroupValueOf<W>(p, std::make_index_sequence<size_t(W::kGroupBytes)>());
}

template <class W, size_t... J, size_t... K>
HWY_INLINE void PackGroupOf(const uint8_t* q, uint8_t* out, std::index_sequence<J...>, std::index_sequence<K...>) {
  if constexpr (W::kGroupBytes == 1) {
    // One byte (int2, int4): in int, as the byte it is (the compiler then ORs bytes).
    out[0] = uint8_t(((q[J] << W::shift(int(J))) | ...));
  } else {
    const uint32_t v = ((uint32_t(q[J]) << W::shift(int(J))) | ...);
    ((out[K] = uint8_t(v >> (8 * (W::kGroupBytes - 1 - int(K))))), ...);
  }
}
/// Codes q[0, G) (each < 2^bits) packed into the group's W::kGroupBytes bytes at out:
/// qvg::pack_group<W>.
template <class W>
HWY_INLINE void PackGroup(const uint8_t* q, uint8_t* out) {
  PackGroupOf<W>(q, out, std::make_index_sequence<size_t(W::kGroupCodes)>(),
                 std::make_index_sequence<size_t(W::kGroupBytes)>());
}

QVG_CPU_KERNELS_END
