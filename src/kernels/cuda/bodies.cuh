// src/kernels/cuda/bodies.cuh — the decode kernel's bodies and its launch plan, as
// __host__ __device__ functions over plain structs (the encoder's are in
// encode_bodies.cuh).
//
// The decode kernel is one line per launch: it finds the task of its block and
// calls decode_block_vec<BITS, FP8, CDT, ODT, RBITS> (or decode_block_generic) with
// the block index and the thread index. Every width-dependent step reads the row of
// qvg/code_format.h (qvg::Width<bits>): the code words below, the kernel's
// instantiations (with_decode_mode, through qvg::dispatch_width). plan_decode (host) groups the tasks by mode,
// precomputes every per-task invariant and sizes the grid. So the host test
// (tests/gpu/host_arith_test.cpp) runs the whole launch — every block and thread of
// the grid the kernel gets — through the same code, and compares the bytes with the
// CPU codec's decode. What it cannot cover is the hardware itself (GPU tests).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/arith.cuh"

namespace qvg::cuda::kernels {

/// One decode range: tokens [t0, t1) and heads [h0, h1) of one encoded tensor.
/// Arrays as in spec 1.5 (device pointers, each 16-byte aligned); stage s of ids
/// and centroids at ids + s * ids_stage_stride bytes and centroid + s *
/// centroid_stage_stride bytes.
struct DecodeArgs {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zeros = nullptr;       ///< asymmetric only
  const float* scale_factor = nullptr;  ///< [G] two_level only (else factor 1)
  const float* zero_factor = nullptr;   ///< [G] two_level and asymmetric only
  const uint8_t* ids = nullptr;
  const uint8_t* centroid = nullptr;
  int64_t ids_stage_stride = 0;
  int64_t centroid_stage_stride = 0;
  int32_t B = 0, S = 0, H = 0, D = 0, K = 0;
  int32_t bits = 4, block = 64, stages = 1;
  int32_t t0 = 0, t1 = 0, h0 = 0, h1 = 0;
  int8_t asymmetric = 0, fp8 = 1;
  int8_t centroid_dtype = 0;  ///< cuda_arith::kBF16 / kF16 / kF32
  int8_t out_dtype = 0;
  void* out = nullptr;
  int64_t batch_stride = 0;  ///< elements
  int64_t token_stride = 0;  ///< elements
  /// A refinement layer of the encoding (same B, S, H, D), added in the same pass:
  /// symmetric ref_bits codes, a stored scale per ref_block channels (fp8 or bf16 as
  /// ref_fp8) times its group's ref_scale_factor (null: 1), and one f32 centroid row
  /// per group (ref_centroid, [G, D]). Each element becomes
  /// round(round_trip(value) + layer) — decode, then refine_one, bit for bit.
  /// ref_codes null: none.
  const uint8_t* ref_codes = nullptr;
  const uint8_t* ref_scales = nullptr;
  const float* ref_scale_factor = nullptr;
  const float* ref_centroid = nullptr;
  int32_t ref_bits = 0, ref_block = 0;
  int8_t ref_fp8 = 1;
};

/// 16 bytes, loaded with one 128-bit load on the device.
struct alignas(16) Word4 {
  uint32_t v[4];
};
/// 8 bytes, stored with one 64-bit store on the device.
struct alignas(8) Word2 {
  uint32_t v[2];
};
#if !defined(__CUDA_ARCH__)
/// Host only: the load_as/store_as accesses made at an address not aligned for
/// their type (on the device each would fault). The host tests require none.
inline int& host_misaligned_accesses() {
  static int n = 0;
  return n;
}
#endif
/// An aligned load of a T at p: one native load on the device; memcpy on the host,
/// which counts a misaligned address (host_misaligned_accesses).
template <class T>
QVG_HD T load_as(const void* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const T*>(p);
#else
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) ++host_misaligned_accesses();
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
#endif
}
/// An aligned store of v at p (as load_as).
template <class T>
QVG_HD void store_as(void* p, const T& v) {
#if defined(__CUDA_ARCH__)
  *static_cast<T*>(p) = v;
#else
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) ++host_misaligned_accesses();
  std::memcpy(p, &v, sizeof(T));
#endif
}
QVG_HD Word4 load_word4(const void* p) {
  return load_as<Word4>(p);
}
QVG_HD void store_word4(void* p, const Word4& w) {
  store_as(p, w);
}
QVG_HD uint32_t load_u32(const uint8_t* p) {
  return load_as<uint32_t>(p);
}
QVG_HD uint32_t load_u16(const uint8_t* p) {
  return load_as<uint16_t>(p);
}

// ---- code words (spec 1.5, for any row of qvg/code_format.h) -------------------------
//
// A code word is the codes of 8 consecutive channels starting at a multiple of 8:
// 8 / G whole groups of the row, kCodeWordBytes<W> = 8 * bits / 8 bytes (int4: 4
// groups of 1 byte, int2: 2 of 1 byte, int3: 1 group of 3 bytes). In a register,
// group k's value V_k (qvg::group_value: its bytes most significant first) sits at
// bits [8 B k, 8 B (k + 1)), so code i is (word >> code_word_shift<W>(i)) & mask. For
// rows of 1-byte groups that is the bytes as one little-endian load (int4: one 32-bit
// load, int2: one 16-bit load, aligned: a row of D channels is D / 8 whole words);
// wider groups (int3) are only byte-aligned in general and are read byte by byte.

/// Bytes of the 8-channel code word of width W.
template <class W>
inline constexpr int kCodeWordBytes = 8 / W::kGroupCodes* W::kGroupBytes;
/// Whether a word of width W fits the 32-bit register the vectorised bodies keep it in.
template <class W>
inline constexpr bool kCodeWordFits = 8 % W::kGroupCodes == 0 && kCodeWordBytes<W> <= 4;
/// The bit of the word where code i (0..7) starts.
template <class W>
QVG_HD constexpr int code_word_shift(int i) {
  return 8 * W::kGroupBytes * (i / W::kGroupCodes) + W::shift(i % W::kGroupCodes);
}
/// Code i (0..7) of a code word.
template <class W>
QVG_HD uint32_t code_of_word(uint32_t word, int i) {
  return (word >> code_word_shift<W>(i)) & W::kMask;
}
/// The code word at p (the codes of 8 channels, kCodeWordBytes<W> bytes): one aligned
/// native load when the groups are single bytes (p then word-aligned), else one byte
/// load per byte (any alignment).
template <class W>
QVG_HD uint32_t load_code_word(const uint8_t* p) {
  static_assert(kCodeWordFits<W>, "an 8-channel code word must fit 32 bits");
  constexpr int N = kCodeWordBytes<W>;
  if constexpr (W::kGroupBytes == 1 && N == 4) {
    return load_as<uint32_t>(p);
  } else if constexpr (W::kGroupBytes == 1 && N == 2) {
    return load_as<uint16_t>(p);
  } else if constexpr (W::kGroupBytes == 1 && N == 1) {
    return p[0];
  } else {
    uint32_t w = 0;
    QVG_UNROLL
    for (int k = 0; k < 8 / W::kGroupCodes; ++k)
      w |= qvg::group_value<W>(p + k * W::kGroupBytes) << (8 * W::kGroupBytes * k);
    return w;
  }
}
/// Writes a code word at p (load_code_word's inverse, the same accesses).
template <class W>
QVG_HD void store_code_word(uint8_t* p, uint32_t w) {
  static_assert(kCodeWordFits<W>, "an 8-channel code word must fit 32 bits");
  constexpr int N = kCodeWordBytes<W>;
  if constexpr (W::kGroupBytes == 1 && N == 4) {
    store_as<uint32_t>(p, w);
  } else if constexpr (W::kGroupBytes == 1 && N == 2) {
    store_as<uint16_t>(p, uint16_t(w));
  } else if constexpr (W::kGroupBytes == 1 && N == 1) {
    p[0] = uint8_t(w);
  } else {
    QVG_UNROLL
    for (int k = 0; k < 8 / W::kGroupCodes; ++k) {
      const uint32_t v = w >> (8 * W::kGroupBytes * k);
      QVG_UNROLL
      for (int i = 0; i < W::kGroupBytes; ++i) p[k * W::kGroupBytes + i] = uint8_t(v >> (8 * (W::kGroupBytes - 1 - i)));
    }
  }
}
/// Whether codes of `bits` bits have a row whose code words the vectorised bodies
/// decode (host: plan_decode's choice; a width without a row is never vectorised).
inline bool code_words_decodable(int bits) {
  return qvg::find_code_format(bits) != nullptr &&
         qvg::dispatch_width(bits, [](auto w) { return kCodeWordFits<decltype(w)>; });
}

/// Whether a task can use the vectorised bodies (8 channels per thread, code words of
/// its width, a block's channels never split across a thread; a refinement layer's
/// blocks and width likewise, and an output of the centroids' dtype, the only refined
/// modes compiled: a cache's view has its encodings' dtype). Host only.
inline bool task_vectorizable(const DecodeArgs& t) {
  return t.D % 8 == 0 && t.block % 8 == 0 && code_words_decodable(t.bits) &&
         (t.ref_codes == nullptr ||
          (t.ref_block % 8 == 0 && code_words_decodable(t.ref_bits) && t.centroid_dtype == t.out_dtype));
}

// ---- the launch plan ----------------------------------------------------------------

inline constexpr int kDecodeTasksPerLaunch = 16;  ///< tasks one launch serves
inline constexpr int kDecodeThreads = 256;        ///< threads per block
inline constexpr int kDecodeTokensPerThread = 8;  ///< tokens each thread of a vectorised tile decodes
inline constexpr int kDecodeBatch = 4;            ///< of which decoded together (their loads in flight at once)
/// Resident blocks per multiprocessor the vectorised kernel is compiled for (4: at most
/// 64 registers, 32 warps; measured on the H200 faster than 3 blocks without the cap:
/// 0.107 against 0.115 ms for the LongCat tensor, when the kernel still spilled 4 bytes
/// at int2/int4 and 12-16 at int3 under it; the batches of DecodeVecThread spill none,
/// nvcc 13, sm_90a); 2 for fp32 centroids and for the kernels with a fused refinement
/// layer, which spilled below 85 registers (76-224 bytes per thread at 64; none at
/// 128). The refined kernels' choice is not measured on a device yet (gpu-check's
/// update() rows time it).
inline constexpr int kDecodeMinBlocks = 4;
inline constexpr int kDecodeMinBlocksWide = 2;  ///< fp32 centroids, a fused refinement layer
/// Blocks per multiprocessor in the "two waves" below which plan_decode shrinks the
/// tiles (the launcher passes 2 x multiprocessors x this). 2 measured best on the H200
/// for the Self-Forcing chunk (9.9 us; 4: 13.2 us, 8: 19.9 us): a larger tile amortizes
/// each thread's setup better than a fuller last wave.
inline constexpr int kDecodeWaveBlocks = 2;
inline constexpr int kDecodeGenericTile = 64;  ///< tokens per block on the per-element path

/// Per-task invariants, computed once on the host (no division on the device
/// beyond the thread's own coordinates).
struct DecodePlan {
  int32_t cpr = 0;     ///< threads per token row: D / 8 (vectorised)
  int32_t rows = 0;    ///< token rows a block decodes at once: kDecodeThreads / cpr
  int32_t tile = 0;    ///< tokens per block
  int32_t ntile = 0;   ///< blocks per (b, h)
  int32_t hs = 0;      ///< heads of the range: h1 - h0
  int32_t cbytes = 0;  ///< code bytes per token: D * bits / 8
  int32_t nb = 0;      ///< scale blocks per token: D / block
  int8_t vstore = 0;   ///< output rows 16-byte aligned: 128-bit stores
};

/// One launch: up to kDecodeTasksPerLaunch tasks of one mode. Block i belongs to
/// task ti with first_block[ti] <= i < first_block[ti + 1].
struct DecodeLaunch {
  DecodeArgs t[kDecodeTasksPerLaunch];
  DecodePlan p[kDecodeTasksPerLaunch];
  int32_t first_block[kDecodeTasksPerLaunch + 1] = {};
  int32_t n = 0;
  int8_t vec = 0;  ///< decode_block_vec (then every task has the mode below) or decode_block_generic
  int8_t bits = 4, fp8 = 1, centroid_dtype = 0, out_dtype = 0;
  /// The width of the tasks' refinement layers, 0: none (vectorised launches: every
  /// task has a layer of this width, or none has one).
  int8_t ref_bits = 0;
  int32_t blocks() const { return first_block[n]; }
};

/// The task of block `blk`.
QVG_HD int task_of_block(const DecodeLaunch& L, int32_t blk) {
  int ti = 0;
  while (ti + 1 < L.n && blk >= L.first_block[ti + 1]) ++ti;
  return ti;
}

/// Sets the vectorised tasks' tiles of L to `tokens_per_thread` tokens per thread
/// (the tile is rows x that) and recomputes the block ranges.
inline void set_decode_tiles(DecodeLaunch& L, int tokens_per_thread) {
  for (int k = 0; k < L.n; ++k) {
    DecodePlan& P = L.p[k];
    const DecodeArgs& t = L.t[k];
    if (L.vec) P.tile = P.rows * tokens_per_thread;
    P.ntile = (t.t1 - t.t0 + P.tile - 1) / P.tile;
    L.first_block[k + 1] = L.first_block[k] + P.ntile * P.hs * t.B;
  }
}

/// The launches that decode tasks[0..n): non-empty tasks grouped by mode (bits,
/// fp8, centroid dtype, output dtype, the refinement layer's width; every
/// non-vectorisable task in generic launches), in task order within a group, kDecodeTasksPerLaunch per launch.
/// A vectorised launch whose grid would be under `min_blocks` blocks (the launcher
/// passes two waves of the device) gets smaller tiles: 4, 2, then 1 token per thread,
/// so that a small decode still spreads over every multiprocessor.
/// Host only. REQUIRES the tasks valid (ranges inside the tensor, B >= 1).
inline std::vector<DecodeLaunch> plan_decode(const DecodeArgs* tasks, int n, int32_t min_blocks = 0) {
  std::vector<DecodeLaunch> out;
  std::vector<int> open;  // index in `out` of the open launch of each key (-1: none)
  std::vector<int> keys;
  for (int i = 0; i < n; ++i) {
    const DecodeArgs& t = tasks[i];
    if (t.t1 <= t.t0 || t.h1 <= t.h0 || t.B <= 0) continue;  // empty range
    const bool vec = task_vectorizable(t) && t.D <= 8 * kDecodeThreads;
    const bool ref = t.ref_codes != nullptr;
    const int rbits = vec && ref ? t.ref_bits : 0;
    // The mode: widths (below 16), scale format, centroid and output dtypes (0..2).
    const int key = vec ? 1 + (t.fp8 != 0) + 2 * (t.centroid_dtype + 3 * (t.out_dtype + 3 * (rbits + 16 * t.bits))) : 0;
    size_t ki = 0;
    while (ki < keys.size() && keys[ki] != key) ++ki;
    if (ki == keys.size()) {
      keys.push_back(key);
      open.push_back(-1);
    }
    if (open[ki] < 0 || out[size_t(open[ki])].n == kDecodeTasksPerLaunch) {
      open[ki] = int(out.size());
      DecodeLaunch L;
      L.vec = int8_t(vec ? 1 : 0);
      L.bits = int8_t(t.bits);
      L.fp8 = t.fp8;
      L.centroid_dtype = t.centroid_dtype;
      L.out_dtype = t.out_dtype;
      L.ref_bits = int8_t(rbits);
      out.push_back(L);
    }
    DecodeLaunch& L = out[size_t(open[ki])];
    const int k = L.n++;
    DecodePlan& P = L.p[k];
    P.hs = t.h1 - t.h0;
    P.cbytes = t.D * t.bits / 8;
    P.nb = t.D / t.block;
    if (vec) {
      P.cpr = t.D / 8;
      P.rows = kDecodeThreads / P.cpr;
      P.tile = P.rows * kDecodeTokensPerThread;
    } else {
      P.tile = kDecodeGenericTile;
    }
    P.ntile = (t.t1 - t.t0 + P.tile - 1) / P.tile;
    const int osz = t.out_dtype == qvg::cuda_arith::kF32 ? 4 : 2;
    const auto al = [](long long v) { return v % 16 == 0; };
    P.vstore = int8_t(vec && al((long long)reinterpret_cast<uintptr_t>(t.out)) && al(t.token_stride * osz) &&
                              al(t.batch_stride * osz) && al((long long)t.D * osz)
                          ? 1
                          : 0);
    L.t[k] = t;
    L.first_block[k + 1] = L.first_block[k] + P.ntile * P.hs * t.B;
  }
  for (DecodeLaunch& L : out)
    for (int tpt = kDecodeTokensPerThread / 2; L.vec && tpt >= 1 && L.blocks() < min_blocks; tpt /= 2)
      set_decode_tiles(L, tpt);
  return out;
}

/// Eight decoded values as bf16 pairs (element 2i in the low half of w[i]), nearest
/// even as f32_to_bf16.
QVG_HD void pack_bf16_row_exact(const float (&acc)[8], uint32_t (&w)[4]) {
  for (int i = 0; i < 4; ++i)
    w[i] = uint32_t(qvg::cuda_arith::f32_to_bf16(acc[2 * i])) |
           (uint32_t(qvg::cuda_arith::f32_to_bf16(acc[2 * i + 1])) << 16);
}
/// pack_bf16_row_exact's bits; on the device one cvt.rn.bf16x2.f32 per pair (a NaN
/// would get the hardware's canonical NaN, so a row holding one takes
/// pack_bf16_row_exact instead; the test is one unordered compare per pair).
QVG_HD void pack_bf16_row(const float (&acc)[8], uint32_t (&w)[4]) {
#if defined(__CUDA_ARCH__)
  bool nan = false;
  QVG_UNROLL
  for (int i = 0; i < 4; ++i) nan |= acc[2 * i] != acc[2 * i] || acc[2 * i + 1] != acc[2 * i + 1];
  if (!nan) {
    QVG_UNROLL
    for (int i = 0; i < 4; ++i)
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(acc[2 * i + 1]), "f"(acc[2 * i]));
    return;
  }
#endif
  pack_bf16_row_exact(acc, w);
}

/// A stored scale or zero as fp32 (spec 1.4) from its raw bits (the fp8 byte or the
/// bf16 word), fp8 without branches (fp8e4m3_to_f32_scaled).
template <bool FP8>
QVG_HD float stored_scale(uint32_t raw) {
  namespace A = qvg::cuda_arith;
  return FP8 ? A::fp8e4m3_to_f32_scaled(uint8_t(raw)) : A::bf16_to_f32(uint16_t(raw));
}

/// A width whose code words the vectorised bodies decode (kCodeWordFits) as a
/// compile-time constant: g(std::integral_constant<int, bits>); nothing for another.
template <class G>
void with_decodable_width(int bits, G&& g) {
  qvg::dispatch_width(bits, [&](auto w) {
    using W = decltype(w);
    if constexpr (kCodeWordFits<W>) g(std::integral_constant<int, W::kBits>{});
  });
}

/// An element type (cuda_arith's kBF16, kF16, kF32; any other value as kF32) as a
/// compile-time constant: g(std::integral_constant<int, dt>), so that a kernel's loads
/// do not branch on it. Host code (the launchers, and the host tests of the bodies).
template <class G>
decltype(auto) with_dtype(int dt, G&& g) {
  using std::integral_constant;
  namespace A = qvg::cuda_arith;
  switch (dt) {
    case A::kBF16: return g(integral_constant<int, A::kBF16>{});
    case A::kF16: return g(integral_constant<int, A::kF16>{});
    default: return g(integral_constant<int, A::kF32>{});
  }
}

/// Calls f(bits, fp8, centroid dtype, output dtype, ref_bits) with each argument as a
/// compile-time constant (std::integral_constant), for every supported mode of codes
/// of width BITS: fp8 or bf16 scales, bf16/f16/f32 centroids and outputs (ref_bits 0)
/// — and, with a refinement layer of any width whose words fit (ref_bits != 0), the
/// modes whose output dtype is the centroids' (task_vectorizable). Each code width
/// (BITS) has its own translation unit of kernels (decode_int<bits>.cu).
template <int BITS, class F>
void with_decode_submode(bool fp8, int cdt, int odt, int ref_bits, F&& f) {
  using std::integral_constant;
  const integral_constant<int, BITS> b;
  const auto modes = [&](auto f8) {
    if (ref_bits != 0)  // cdt == odt
      with_decodable_width(ref_bits, [&](auto rb) { with_dtype(cdt, [&](auto c) { f(b, f8, c, c, rb); }); });
    else
      with_dtype(cdt, [&](auto c) { with_dtype(odt, [&](auto o) { f(b, f8, c, o, integral_constant<int, 0>{}); }); });
  };
  if (fp8)
    modes(std::true_type{});
  else
    modes(std::false_type{});
}

/// with_decode_submode for a run-time width: every supported mode of every code width
/// of qvg/code_format.h whose words fit (kCodeWordFits). Widths become constants only
/// through qvg::dispatch_width. The host test dispatches through this function, the
/// decode launcher through its two parts. REQUIRES a vectorisable launch's mode
/// (plan_decode's).
template <class F>
void with_decode_mode(int bits, bool fp8, int cdt, int odt, int ref_bits, F&& f) {
  with_decodable_width(bits, [&](auto b) {
    with_decode_submode<decltype(b)::value>(fp8, cdt, odt, ref_bits, f);
  });
}

// ---- the bodies ---------------------------------------------------------------------

/// Coordinates of block `local` of a task: batch b, head h (absolute), tokens
/// [t_begin, t_end).
struct DecodeTile {
  int b = 0, h = 0, t_begin = 0, t_end = 0;
};
QVG_HD DecodeTile decode_tile(const DecodeArgs& T, const DecodePlan& P, int32_t local) {
  const int32_t gh = local / P.ntile, tile = local - gh * P.ntile;
  const int32_t b = gh / P.hs;
  DecodeTile d;
  d.b = b;
  d.h = T.h0 + (gh - b * P.hs);
  d.t_begin = T.t0 + tile * P.tile;
  d.t_end = T.t1 < d.t_begin + P.tile ? T.t1 : d.t_begin + P.tile;
  return d;
}

/// Byte permutation (PTX prmt, CUDA __byte_perm): byte j of the result is byte
/// (s >> 4j) & 7 of the 8 bytes x (0-3), y (4-7). One instruction on the device.
template <uint32_t S>
QVG_HD uint32_t byte_perm(uint32_t x, uint32_t y) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "n"(S));
  return r;
#else
  constexpr uint32_t s = S;
  const uint64_t xy = uint64_t(x) | (uint64_t(y) << 32);
  uint32_t r = 0;
  for (int j = 0; j < 4; ++j) r |= uint32_t((xy >> (8 * ((s >> (4 * j)) & 7))) & 0xFFu) << (8 * j);
  return r;
#endif
}
/// The float bits 0x4B000000 | code of each code of a code word (out[i]: code i), the
/// operands of dequant_biased_float. For groups of one byte, from one mask of the word per
/// distinct in-byte shift (shared by the word's codes: 2 masks for int4, 4 for int2)
/// and one byte permutation per code with the constant in a register, instead of a
/// shift, a mask and an or per code.
template <class W, int... I>
QVG_HD void codes_float_bits_at(uint32_t word, uint32_t (&out)[8], std::integer_sequence<int, I...>) {
  if constexpr (W::kGroupBytes == 1) {  // every code inside one byte (int2, int4; not int3)
    constexpr uint32_t kByteMask = W::kMask * 0x01010101u;
    const uint32_t magic = 0x4B000000u;
    ((out[I] = byte_perm<uint32_t(code_word_shift<W>(I) / 8) | 0x7540u>(
          (word >> (code_word_shift<W>(I) % 8)) & kByteMask, magic)),
     ...);
  } else {
    ((out[I] = 0x4B000000u | code_of_word<W>(word, I)), ...);
  }
}
template <class W>
QVG_HD void codes_float_bits(uint32_t word, uint32_t (&out)[8]) {
  codes_float_bits_at<W>(word, out, std::make_integer_sequence<int, 8>{});
}
/// How a vectorised body knows whether its task is asymmetric: symmetric or asymmetric
/// as a constant (a loop without the other's operations: the unrefined kernels hold
/// both copies), or the task's flag read at run time (the refined kernels: one copy of
/// their larger loop).
enum : int { kSymmetric = 0, kAsymmetric = 1, kAsymmetricAtRunTime = 2 };

/// One thread of a vectorised launch (decode_block_vec): channels [8c, 8c + 8) of the
/// tokens t, t + rows, ... of its tile, spec 1.3 arithmetic in the order of
/// decode_rows_reference. BITS (the codes' row of qvg/code_format.h), FP8 (scale
/// format), CDT (centroid dtype) and ODT (output dtype) are the launch's mode; ASYM
/// as above; two_level and stages are uniform per task. Invariants (group, factors,
/// pointers, scale block) are set up once per thread (decode_thread_vec); a batch
/// adds its tokens' offsets (32-bit: at most 7 steps of at most 256 x 4 bytes, the
/// output's in 64 bits). RBITS != 0: the task has a refinement layer of that width
/// (DecodeArgs::ref_*; ODT == CDT), added after the stages as refine_one adds it.
///
/// The tokens go in batches of kDecodeBatch (batch), the last one padded with the
/// thread's last token again, so that no batch tests which of its tokens exist; a task
/// with later stages (rare) goes one token at a time, so that the common loop holds no
/// stage loop.
template <int BITS, bool FP8, int ASYM, int CDT, int ODT, int RBITS>
struct DecodeVecThread {
  using W = qvg::Width<BITS>;
  static constexpr bool REF = RBITS != 0;
  using RW = qvg::Width<REF ? RBITS : BITS>;  // the layer's row (unused without one)
  static constexpr int WB = kCodeWordBytes<W>, RWB = kCodeWordBytes<RW>;  // bytes of 8 channels' codes
  static constexpr int ESZ = CDT == qvg::cuda_arith::kF32 ? 4 : 2;       // centroid element bytes
  static constexpr int OSZ = ODT == qvg::cuda_arith::kF32 ? 4 : 2;       // output element bytes
  static constexpr int SB = FP8 ? 1 : 2;                                  // stored scale bytes

  const DecodeArgs& T;  // the task and its plan (kernel parameters: read in place, not
  const DecodePlan& P;  // copied into registers)
  // The thread's first token: its codes, scale (and zero), stage-0 id and output row;
  // and the byte distances to the thread's token after it (step tokens on).
  const uint8_t *cp = nullptr, *sp = nullptr, *zp = nullptr, *idp = nullptr;
  uint8_t* op = nullptr;
  uint32_t step = 0, cstep = 0, sstep = 0;
  int64_t ostep = 0;
  // The group's stage-0 centroids at the thread's channels, the code bias, the factors.
  const uint8_t* cent = nullptr;
  float qbias = 0, gf = 1, gz = 1;
  // The refinement layer (REF only): codes, scales, their steps, its factor, its
  // bias, and the group's centroid at the thread's channels.
  const uint8_t *rcp = nullptr, *rsp = nullptr;
  uint32_t rcstep = 0, rsstep = 0;
  float rgf = 1.0f, rbias = 0.0f;
  float rc[REF ? 8 : 1] = {};
  bool asym_flag = false;  // the task's flag (ASYM == kAsymmetricAtRunTime)

  QVG_HD DecodeVecThread(const DecodeArgs& t, const DecodePlan& p) : T(t), P(p) {}
  QVG_HD bool asym() const { return ASYM == kAsymmetricAtRunTime ? asym_flag : ASYM == kAsymmetric; }

  /// Decodes the thread's n tokens (see above).
  QVG_HD void run(int n) {
    if (T.stages > 1) {
      for (int k0 = 0; k0 < n; ++k0) batch<1, true>(k0, n - 1);
      return;
    }
    for (int k0 = 0; k0 < n; k0 += kDecodeBatch) batch<kDecodeBatch, false>(k0, n - 1);
  }

  /// Decodes the thread's tokens k0, k0 + 1, ..., k0 + NB - 1, each index clamped to
  /// `last` (a clamped token is its predecessor again: decoded and written twice, with
  /// the same bytes); STAGES: with the task's later stages. Every load of the batch
  /// (codes, scales, zeros, ids, then the stage-0 centroid rows, whose addresses needed
  /// the ids) is issued before the batch's arithmetic and stores, so that NB rows of
  /// loads are in flight (the target may alias nothing the loads read, but the
  /// compiler cannot know that).
  template <int NB, bool STAGES>
  QVG_HD void batch(int k0, int last) {
    namespace A = qvg::cuda_arith;
    const bool asym = this->asym();
    const int32_t crow = T.D * ESZ;  // bytes per centroid row
    uint32_t word[NB], sraw[NB], zraw[NB], rword[REF ? NB : 1], rsraw[REF ? NB : 1];
    Word4 c0[NB], c1[CDT == qvg::cuda_arith::kF32 ? NB : 1];
    uint32_t kk[NB];  // the tokens' indices, clamped (unsigned: zero-extended offsets)
    QVG_UNROLL
    for (int k = 0; k < NB; ++k) kk[k] = uint32_t(k0 + k < last ? k0 + k : last);
    QVG_UNROLL
    for (int k = 0; k < NB; ++k) {
      word[k] = load_code_word<W>(cp + kk[k] * cstep);
      const uint32_t so = kk[k] * sstep;
      sraw[k] = FP8 ? uint32_t(sp[so]) : load_u16(sp + so);
      zraw[k] = asym ? (FP8 ? uint32_t(zp[so]) : load_u16(zp + so)) : 0u;
      if constexpr (REF) {
        rword[k] = load_code_word<RW>(rcp + kk[k] * rcstep);
        const uint8_t* rs = rsp + kk[k] * rsstep;
        rsraw[k] = T.ref_fp8 ? uint32_t(*rs) : load_u16(rs);
      }
    }
    QVG_UNROLL
    for (int k = 0; k < NB; ++k) {
      const uint8_t* q = cent + uint32_t(idp[kk[k] * step]) * crow;
      c0[k] = load_word4(q);
      if constexpr (CDT == A::kF32) c1[k] = load_word4(q + 16);
    }
    QVG_UNROLL
    for (int k = 0; k < NB; ++k) {
      const float s_eff = A::effective(stored_scale<FP8>(sraw[k]), gf);
      const float z_eff = asym ? A::effective(stored_scale<FP8>(zraw[k]), gz) : 0.0f;
      float acc[8];
      uint32_t fb[8];
      codes_float_bits<W>(word[k], fb);
      QVG_UNROLL
      for (int j = 0; j < 8; ++j) acc[j] = A::dequant_biased_float(A::from_bits(fb[j]), qbias, asym, s_eff, z_eff);
      if constexpr (CDT == A::kF32)
        add_centroid(acc, c0[k], c1[k]);
      else
        add_centroid(acc, c0[k], c0[k]);
      if constexpr (STAGES) later_stages(acc, idp + kk[k] * step);
      if constexpr (REF) {  // refine_one: round(round_trip(value) + layer), the layer's value by decoded_value
        const float rs = T.ref_fp8 ? stored_scale<true>(rsraw[k]) : stored_scale<false>(rsraw[k]);
        const float rs_eff = A::effective(rs, rgf);
        uint32_t rfb[8];
        codes_float_bits<RW>(rword[k], rfb);
        round_trip_row(acc);
        QVG_UNROLL
        for (int j = 0; j < 8; ++j)
          acc[j] = A::add_rn(acc[j], A::add_rn(A::dequant_biased_float(A::from_bits(rfb[j]), rbias, false, rs_eff, 0.0f), rc[j]));
      }
      store_row(op + int64_t(kk[k]) * ostep, acc);
    }
  }

  /// acc += one stage's centroid row (w0: its first 16 bytes, w1: the next 16 for f32).
  static QVG_HD void add_centroid(float (&acc)[8], const Word4& w0, const Word4& w1) {
    namespace A = qvg::cuda_arith;
    if constexpr (CDT == A::kF32) {
      QVG_UNROLL
      for (int i = 0; i < 4; ++i) {
        acc[i] = A::add_rn(acc[i], A::from_bits(w0.v[i]));
        acc[4 + i] = A::add_rn(acc[4 + i], A::from_bits(w1.v[i]));
      }
    } else {
      (void)w1;
      QVG_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint16_t lo = uint16_t(w0.v[i] & 0xFFFFu), hi = uint16_t(w0.v[i] >> 16);
        acc[2 * i] = A::add_rn(acc[2 * i], CDT == A::kBF16 ? A::bf16_to_f32(lo) : A::f16_to_f32(lo));
        acc[2 * i + 1] = A::add_rn(acc[2 * i + 1], CDT == A::kBF16 ? A::bf16_to_f32(hi) : A::f16_to_f32(hi));
      }
    }
  }

  /// Rounds the 8 values to ODT and back (round_trip): bf16 through pack_bf16_row (on
  /// the device a conversion per pair, not per element).
  static QVG_HD void round_trip_row(float (&acc)[8]) {
    namespace A = qvg::cuda_arith;
    if constexpr (ODT == A::kBF16) {
      uint32_t w[4];
      pack_bf16_row(acc, w);
      QVG_UNROLL
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = A::from_bits(w[i] << 16);
        acc[2 * i + 1] = A::from_bits(w[i] & 0xFFFF0000u);
      }
    } else {
      QVG_UNROLL
      for (int j = 0; j < 8; ++j) acc[j] = A::round_trip(acc[j], ODT);
    }
  }

  /// Stages 1, 2, ... of the token whose stage-0 id is at id0 (rare).
  QVG_HD void later_stages(float (&acc)[8], const uint8_t* id0) const {
    const int32_t crow = T.D * ESZ;
    for (int st = 1; st < T.stages; ++st) {
      const uint8_t* q = cent + st * T.centroid_stage_stride + int32_t(id0[st * T.ids_stage_stride]) * crow;
      add_centroid(acc, load_word4(q), CDT == qvg::cuda_arith::kF32 ? load_word4(q + 16) : Word4{});
    }
  }

  /// Rounds the 8 values to ODT and stores them at o (one or two 128-bit stores when
  /// the rows are aligned for them, else element stores).
  QVG_HD void store_row(uint8_t* o, const float (&acc)[8]) const {
    namespace A = qvg::cuda_arith;
    const bool vstore = P.vstore != 0;
    if constexpr (ODT == A::kF32) {
      float* p = reinterpret_cast<float*>(o);
      if (vstore) {
        Word4 w0, w1;
        QVG_UNROLL
        for (int i = 0; i < 4; ++i) {
          w0.v[i] = A::bits_of(acc[i]);
          w1.v[i] = A::bits_of(acc[4 + i]);
        }
        store_word4(p, w0);
        store_word4(p + 4, w1);
      } else {
        QVG_UNROLL
        for (int i = 0; i < 8; ++i) store_as<float>(p + i, acc[i]);
      }
    } else {
      uint16_t* p = reinterpret_cast<uint16_t*>(o);
      Word4 w;
      if constexpr (ODT == A::kBF16) {
        pack_bf16_row(acc, w.v);
      } else {
        QVG_UNROLL
        for (int i = 0; i < 4; ++i)
          w.v[i] = A::encode_elem(acc[2 * i], ODT) | (A::encode_elem(acc[2 * i + 1], ODT) << 16);
      }
      if (vstore) {
        store_word4(p, w);
      } else {
        QVG_UNROLL
        for (int i = 0; i < 8; ++i) store_as<uint16_t>(p + i, uint16_t(w.v[i / 2] >> (16 * (i % 2))));
      }
    }
  }
};

/// Sets up the thread's DecodeVecThread and runs it.
template <int BITS, bool FP8, int ASYM, int CDT, int ODT, int RBITS>
QVG_HD void decode_thread_vec(const DecodeArgs& T, const DecodePlan& P, const DecodeTile& tl, int t, int c) {
  namespace A = qvg::cuda_arith;
  using V = DecodeVecThread<BITS, FP8, ASYM, CDT, ODT, RBITS>;
  V v(T, P);
  v.step = uint32_t(P.rows);                                   // tokens between two of this thread's rows
  const int n = (tl.t_end - t + P.rows - 1) / P.rows;  // the thread's tokens (<= kDecodeTokensPerThread)
  const int64_t g = int64_t(tl.b) * T.H + tl.h;
  const int64_t row = g * T.S + t;
  v.asym_flag = T.asymmetric != 0;
  const bool asym = v.asym();
  v.qbias = A::dequant_bias(A::qmax_of<typename V::W>(asym), asym);
  v.gf = T.scale_factor ? T.scale_factor[g] : 1.0f;
  v.gz = asym && T.zero_factor ? T.zero_factor[g] : 1.0f;
  v.cp = T.codes + row * P.cbytes + c * V::WB;
  v.cstep = v.step * uint32_t(P.cbytes);
  const int64_t si = row * P.nb + (c * 8) / T.block;
  v.sp = T.scales + si * V::SB;
  v.zp = asym ? T.zeros + si * V::SB : nullptr;
  v.sstep = v.step * uint32_t(P.nb * V::SB);
  v.idp = T.ids + row;
  v.cent = T.centroid + (g * T.K * T.D + c * 8) * V::ESZ;
  v.op = static_cast<uint8_t*>(T.out) +
         (int64_t(tl.b) * T.batch_stride + int64_t(t - T.t0) * T.token_stride + int64_t(tl.h - T.h0) * T.D + c * 8) *
             V::OSZ;
  v.ostep = int64_t(v.step) * T.token_stride * V::OSZ;
  if constexpr (V::REF) {  // the layer's codes and scales (as the encoding's, of its own width and blocks), its centroid
    const int32_t rcbytes = T.D / 8 * V::RWB, rnb = T.D / T.ref_block, rsb = T.ref_fp8 ? 1 : 2;
    v.rcp = T.ref_codes + row * rcbytes + c * V::RWB;
    v.rcstep = v.step * uint32_t(rcbytes);
    v.rsp = T.ref_scales + (row * rnb + (c * 8) / T.ref_block) * rsb;
    v.rsstep = v.step * uint32_t(rnb * rsb);
    v.rgf = T.ref_scale_factor ? T.ref_scale_factor[g] : 1.0f;
    v.rbias = A::dequant_bias(A::qmax_of<typename V::RW>(false), false);
    const Word4 r0 = load_word4(T.ref_centroid + g * T.D + c * 8), r1 = load_word4(T.ref_centroid + g * T.D + c * 8 + 4);
    QVG_UNROLL
    for (int i = 0; i < 4; ++i) {
      v.rc[i] = A::from_bits(r0.v[i]);
      v.rc[4 + i] = A::from_bits(r1.v[i]);
    }
  }
  v.run(n);
}

/// Thread `tid` of block `local` of task `ti` of a vectorised launch: decodes channels
/// [8c, 8c + 8) of the tokens t_begin + r, t_begin + r + rows, ... of its tile (c = tid
/// % cpr, r = tid / cpr) with DecodeVecThread.
template <int BITS, bool FP8, int CDT, int ODT, int RBITS>
QVG_HD void decode_block_vec(const DecodeLaunch& L, int ti, int32_t local, int tid) {
  const DecodeArgs& T = L.t[ti];
  const DecodePlan& P = L.p[ti];
  const int r = tid / P.cpr, c = tid - r * P.cpr;
  if (r >= P.rows) return;
  const DecodeTile tl = decode_tile(T, P, local);
  const int t = tl.t_begin + r;
  if (t >= tl.t_end) return;
  if constexpr (RBITS != 0)
    decode_thread_vec<BITS, FP8, kAsymmetricAtRunTime, CDT, ODT, RBITS>(T, P, tl, t, c);
  else if (T.asymmetric != 0)
    decode_thread_vec<BITS, FP8, kAsymmetric, CDT, ODT, RBITS>(T, P, tl, t, c);
  else
    decode_thread_vec<BITS, FP8, kSymmetric, CDT, ODT, RBITS>(T, P, tl, t, c);
}

/// The decoded value of channel d of token t of group (b, h) in fp32 (spec 1.3: the
/// dequantized code, then each stage's centroid added in order), before any rounding
/// to the target's dtype: decode_one's and refine_one's arithmetic.
QVG_HD float decoded_value(const DecodeArgs& T, int b, int h, int t, int d) {
  namespace A = qvg::cuda_arith;
  const int64_t g = int64_t(b) * T.H + h;
  const int D = T.D, bits = T.bits;
  const bool asym = T.asymmetric != 0, fp8 = T.fp8 != 0;
  const int64_t row = g * T.S + t;
  const int64_t si = row * (D / T.block) + d / T.block;
  const float s_eff = A::effective(A::stored_value(T.scales, fp8, si), T.scale_factor ? T.scale_factor[g] : 1.0f);
  const float z_eff =
      asym ? A::effective(A::stored_value(T.zeros, fp8, si), T.zero_factor ? T.zero_factor[g] : 1.0f) : 0.0f;
  float acc = A::dequant(A::code_of_row(T.codes + row * (int64_t(D) * bits / 8), bits, d), A::qmax_of(bits, asym), asym,
                         s_eff, z_eff);
  for (int s = 0; s < T.stages; ++s) {
    const int id = T.ids[s * T.ids_stage_stride + row];
    acc = A::add_rn(acc,
                    A::load_elem(T.centroid + s * T.centroid_stage_stride, T.centroid_dtype, (g * T.K + id) * D + d));
  }
  return acc;
}

/// The element index of channel d of token t of group (b, h) in the task's target.
QVG_HD int64_t target_index(const DecodeArgs& T, int b, int h, int t, int d) {
  return int64_t(b) * T.batch_stride + int64_t(t - T.t0) * T.token_stride + int64_t(h - T.h0) * T.D + d;
}

/// The value of a task's refinement layer at channel d of token t of group (b, h):
/// decoded_value's arithmetic for the layer (one symmetric stage of one f32 centroid).
QVG_HD float layer_value(const DecodeArgs& T, int b, int h, int t, int d) {
  namespace A = qvg::cuda_arith;
  const int64_t g = int64_t(b) * T.H + h, row = g * T.S + t;
  const float s_eff = A::effective(A::stored_value(T.ref_scales, T.ref_fp8 != 0, row * (T.D / T.ref_block) + d / T.ref_block),
                                   T.ref_scale_factor ? T.ref_scale_factor[g] : 1.0f);
  const int code = A::code_of_row(T.ref_codes + row * (int64_t(T.D) * T.ref_bits / 8), T.ref_bits, d);
  return A::add_rn(A::dequant(code, A::qmax_of(T.ref_bits, false), false, s_eff, 0.0f), T.ref_centroid[g * T.D + d]);
}

/// Decodes channel d of token t of group (b, h) into the task's target (any D/block),
/// its refinement layer added when it has one.
QVG_HD void decode_one(const DecodeArgs& T, int b, int h, int t, int d) {
  namespace A = qvg::cuda_arith;
  float acc = decoded_value(T, b, h, t, d);
  if (T.ref_codes) acc = A::add_rn(A::round_trip(acc, T.out_dtype), layer_value(T, b, h, t, d));
  const int64_t e = target_index(T, b, h, t, d);
  if (T.out_dtype == A::kF32)
    store_as<float>(static_cast<float*>(T.out) + e, acc);
  else
    store_as<uint16_t>(static_cast<uint16_t*>(T.out) + e, uint16_t(A::encode_elem(acc, T.out_dtype)));
}

/// Thread `tid` of block `local` of task `ti` of a generic launch (any D and block
/// size): elements tid, tid + kDecodeThreads, ... of the block's tile.
QVG_HD void decode_block_generic(const DecodeLaunch& L, int ti, int32_t local, int tid) {
  const DecodeArgs& T = L.t[ti];
  const DecodeTile tl = decode_tile(T, L.p[ti], local);
  const int64_t n = int64_t(tl.t_end - tl.t_begin) * T.D;
  for (int64_t e = tid; e < n; e += kDecodeThreads) decode_one(T, tl.b, tl.h, tl.t_begin + int(e / T.D), int(e % T.D));
}

}  // namespace qvg::cuda::kernels
