// src/kernels/cpu/decode-inl.h — the PRQ decode (kernels::decode_rows), per SIMD
// target. Included once per SIMD target by dispatch.cpp
// (its foreach_target pass), which has no per-target include guard for it.
//
// Separate Mul and Add only (spec 1.3); the library is built with
// -ffp-contract=off so the compiler does not fuse them either: every target gives
// the bits of the scalar reference (kernels::ref::decode_rows).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/residual_impl.h"  // stored scale/zero decoding, shared with the codec
#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
// Requires convert-inl.h (ToBf16) and codes-inl.h (GroupValue), included before it
// by dispatch.cpp.
#include "kernels/kernels.h"
#include "qvg/numeric.h"

QVG_CPU_KERNELS_BEGIN

// Code values as floats, per packed byte, for a width whose group is one byte
// (W::kGroupBytes == 1: int2, int4): entry b holds the G code values of byte b, for
// symmetric (code - qmax) and asymmetric (code) decoding. Exact small integers.
template <class W>
struct ByteCodeTable {
  static_assert(W::kGroupBytes == 1, "one byte per group");
  alignas(64) float sym[256][W::kGroupCodes], asym[256][W::kGroupCodes];
  ByteCodeTable() {
    for (uint32_t b = 0; b < 256; ++b)
      for (int j = 0; j < W::kGroupCodes; ++j) {
        const int code = int((b >> W::shift(j)) & W::kMask);
        asym[b][j] = float(code);
        sym[b][j] = float(code - W::kQmaxSym);
      }
  }
};
template <class W>
const ByteCodeTable<W>& ByteCodes() {
  static const ByteCodeTable<W> t;
  return t;
}

// The code values of a row of D channels (codes of width W) as floats, code - qmax
// (symmetric) or code (asymmetric), into vals[0, D): through the byte table when a
// group is one byte, else group by group (the group's value V read most significant
// byte first, code j = (V >> shift(j)) & mask, spec 1.5).
template <class W>
void ExpandCodeRow(const uint8_t* code, int64_t D, bool asym, float* vals) {
  constexpr int G = W::kGroupCodes, B = W::kGroupBytes;
  const int64_t ngroups = D / G;
  if constexpr (B == 1) {
    const ByteCodeTable<W>& tab = ByteCodes<W>();
    const float* lut = asym ? &tab.asym[0][0] : &tab.sym[0][0];
    for (int64_t g = 0; g < ngroups; ++g) std::memcpy(vals + g * G, lut + size_t(code[g]) * size_t(G), size_t(G) * 4);
  } else {
    const int off = asym ? 0 : W::kQmaxSym;
    for (int64_t g = 0; g < ngroups; ++g) {
      const uint32_t v = GroupValue<W>(code + g * B);
      for (int j = 0; j < G; ++j) vals[g * G + j] = float(int((v >> W::shift(j)) & W::kMask) - off);
    }
  }
}

// fp8 e4m3 scale values by code (exact), so a block's scale costs one load.
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) v[i] = qvg::fp8e4m3_to_f32(uint8_t(i));
  }
};
const Fp8Table& Fp8() {
  static const Fp8Table t;
  return t;
}

// Native bf16 conversion of two vectors (AVX512-BF16 VCVTNE2PS2BF16: round to
// nearest even, like the integer path, except that it flushes denormal inputs to
// zero; callers use it only when no lane of either vector has a zero exponent).
// Highway 1.0.3 has neither a target with AVX512-BF16 nor a rounding bf16 demotion,
// so the one instruction is written as inline assembly (it needs no target
// attribute; it runs only when the CPU reports the feature, see
// kernels::native_bf16_enabled()).
#undef QVG_NATIVE_BF16_PAIR
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define QVG_NATIVE_BF16_PAIR 1
HWY_INLINE hn::Vec512<uint16_t> Bf16Pair(hn::Vec512<float> lo, hn::Vec512<float> hi) {
  __m512i r;
  // AT&T operand order: the second source fills the lower half of the result.
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi.raw), "v"(lo.raw));
  return hn::Vec512<uint16_t>{r};
}
#else
#define QVG_NATIVE_BF16_PAIR 0
#endif

// fp16 output: Highway's DemoteTo is the F16C instruction (nearest even, IEEE
// denormals) on AVX2 and AVX-512; elsewhere it is an emulation that truncates, so
// those targets convert with the scalar integer routine.
#undef QVG_F16C_DEMOTE
#if (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && !defined(HWY_DISABLE_F16C)
#define QVG_F16C_DEMOTE 1
#else
#define QVG_F16C_DEMOTE 0
#endif

// What one instantiation of DecodeRowsVec is compiled for: the job's choices
// (bits, asymmetry, one stage or several, native bf16 pairs, the width of a
// refinement layer) and the constants that follow from them on this target.
template <int kBitsArg, bool kAsymArg, bool kOneStageArg, bool kPairArg, int kRefBitsArg>
struct DecodeMode {
  static constexpr int kBits = kBitsArg;           // a code width of qvg/code_format.h
  static constexpr bool kAsym = kAsymArg;          // code * s + z (else (code - qmax) * s)
  static constexpr bool kOneStage = kOneStageArg;  // exactly one codebook stage
  // bf16 output converted two vectors at a time with the native instruction
  // (REQUIRES block % (2 L) == 0).
  static constexpr bool kPair = kPairArg;
  // 0: no refinement layer; else its code width, any of qvg/code_format.h (a
  // symmetric layer of one f32 centroid, added in the same pass: kernels::RefineRows).
  static constexpr int kRefBits = kRefBitsArg;
  static constexpr size_t kLanes = hn::MaxLanes(hn::ScalableTag<float>());
};

// Whether the vector path of this target takes codes of width W: a vector of L
// channels must hold whole code groups (L a multiple of G; channel offsets are then
// multiples of G, so a vector's codes start at a group) in at most 8 bytes (one code
// word, CodeUnpack). int3 (G = 8) on 4-lane targets (SSE4, SSSE3, NEON, EMU128) does
// not qualify: those take the generic path for it.
template <class W>
constexpr bool VectorWidth() {
  constexpr size_t L = hn::MaxLanes(hn::ScalableTag<float>());
  return L >= 4 && L % size_t(W::kGroupCodes) == 0 && L / size_t(W::kGroupCodes) * size_t(W::kGroupBytes) <= 8;
}
bool VectorWidth(int bits) {
  return dispatch_width(bits, [](auto w) { return VectorWidth<decltype(w)>(); });
}

// The N <= 8 bytes at p as a little-endian word. A size that is not a power of two
// (int3: 3 or 6 bytes) is read in power-of-two pieces combined in a register: a copy
// through memory would make the following 8-byte load wait for the narrower stores.
template <size_t N>
HWY_INLINE uint64_t LoadWord(const uint8_t* p) {
  static_assert(N >= 1 && N <= 8, "one word");
  if constexpr ((N & (N - 1)) == 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, N);
    return w;
  } else {
    constexpr size_t kLow = N >= 4 ? 4 : N >= 2 ? 2 : 1;
    return LoadWord<kLow>(p) | (LoadWord<N - kLow>(p + kLow) << (8 * kLow));
  }
}

// The codes of one vector of L channels, for codes of width kBits (a row W of
// qvg/code_format.h: G codes per group of B bytes). They are the L / G whole groups
// of L*kBits/8 bytes, loaded as one little-endian word (LoadWord); every lane then
// holds a word in which its code lies at a per-lane bit position and shifts it down
// (per-lane shift amounts), so no per-element byte work is needed:
// - a group of one byte (int2, int4): the word broadcast; group g is byte g, its
//   code j at bit 8g + W::shift(j) (words over 32 bits: each lane picks its half);
// - a group of several bytes (int3: 8 codes in 3): one byte shuffle puts in lane i the
//   value V of its group g = i / G (bytes most significant first, spec 1.5), so its
//   code j = i mod G is at bit W::shift(j).
// When the 2^kBits code values fit one vector (kLut), a block's values are looked
// up in a per-block table whose entry c holds (c - qmax) * s_eff (symmetric) or
// c * s_eff + z_eff (asymmetric), computed with the very operations of spec 1.3 on
// the very operands, so looking a code up gives the bits of computing it; else the
// codes are converted and scaled per element. (Only for VectorWidth<W>(); DF a
// template parameter so that nothing is formed for targets that never instantiate it.)
template <int kBits, bool kAsym, class DF = hn::ScalableTag<float>>
struct CodeUnpack {
  using W = Width<kBits>;
  using V = hn::Vec<DF>;
  using DU = hn::RebindToUnsigned<DF>;
  using DI = hn::RebindToSigned<DF>;
  using DU8 = hn::Repartition<uint8_t, DU>;
  using DU64 = hn::Repartition<uint64_t, DU>;
  static constexpr size_t L = hn::MaxLanes(DF());
  static_assert(VectorWidth<W>(), "the vector path does not take this width on this target");
  static constexpr size_t G = size_t(W::kGroupCodes), B = size_t(W::kGroupBytes);
  static constexpr size_t kCodeBytes = L / G * B;                 // bytes per vector
  static constexpr bool kShuffle = B > 1;                         // groups of several bytes
  static constexpr bool kTwoWords = !kShuffle && kCodeBytes > 4;  // the word spans two 32-bit lanes
  static constexpr bool kLut = (size_t(1) << kBits) <= L;

  hn::Vec<DU> shifts, mask;
  hn::Vec<DI> qoff;
  decltype(hn::SetTableIndices(DU(), static_cast<const int32_t*>(nullptr))) words;
  hn::Vec<DU8> group_bytes;  // kShuffle: lane i's bytes (little-endian) from its group's bytes
  V lut_codes;  // lane i: code i (mod 2^kBits) minus the offset, as an exact float

  HWY_INLINE CodeUnpack() {
    const DF df;
    const DU du;
    const DI di;
    const DU8 du8;
    alignas(64) uint32_t shift_arr[L];
    alignas(64) int32_t word_arr[L];
    alignas(64) int32_t iota_arr[L];
    alignas(64) uint8_t byte_arr[4 * L];
    for (size_t i = 0; i < L; ++i) {
      const size_t g = i / G, j = i % G;
      const uint32_t p = uint32_t((kShuffle ? 0 : 8 * g) + size_t(W::shift(int(j))));
      shift_arr[i] = p % 32;
      word_arr[i] = int32_t(p / 32);
      iota_arr[i] = int32_t(i % (size_t(1) << kBits));
      // The word is broadcast to every 64-bit lane, so each 16-byte block holds it at
      // bytes 0-7: byte k of lane i is byte g * B + (B - 1 - k) of the word, or 0.
      for (size_t k = 0; k < 4; ++k) byte_arr[4 * i + k] = k < B ? uint8_t(g * B + (B - 1 - k)) : uint8_t(0x80);
    }
    shifts = hn::Load(du, shift_arr);
    words = hn::SetTableIndices(du, word_arr);
    group_bytes = hn::Load(du8, byte_arr);
    mask = hn::Set(du, W::kMask);
    qoff = hn::Set(di, kAsym ? 0 : W::kQmaxSym);
    lut_codes = hn::ConvertTo(df, hn::Sub(hn::Load(di, iota_arr), qoff));
  }
  /// A block's table (kLut): sv = s_eff, zv = z_eff broadcast.
  HWY_INLINE V Table(V sv, V zv) const {
    V tab = hn::Mul(lut_codes, sv);
    if constexpr (kAsym) tab = hn::Add(tab, zv);
    return tab;
  }
  /// The dequantized codes of channels [d, d + L) of a row of codes `code`.
  HWY_INLINE V Values(const uint8_t* code, int64_t d, V tab, V sv, V zv) const {
    const DF df;
    const DU du;
    const DI di;
    const uint64_t w = LoadWord<kCodeBytes>(code + size_t(d) / G * B);
    hn::Vec<DU> wv;
    if constexpr (kShuffle) {
      wv = hn::BitCast(du, hn::TableLookupBytesOr0(hn::BitCast(DU8(), hn::Set(DU64(), w)), group_bytes));
    } else if constexpr (kTwoWords) {
      wv = hn::TableLookupLanes(hn::BitCast(du, hn::Set(DU64(), w)), words);
    } else {
      wv = hn::Set(du, uint32_t(w));
    }
    if constexpr (kLut) {
      (void)sv;
      (void)zv;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      // vpermps reads only the low 4 index bits, and table lane i holds code
      // i mod 2^bits (2^bits divides L), so the bits above this lane's code need no
      // masking: the index read is the code plus a multiple of 2^bits.
      return hn::TableLookupLanes(tab, hn::Indices512<float>{(wv >> shifts).raw});
#elif HWY_TARGET == HWY_AVX2
      return hn::TableLookupLanes(tab, hn::Indices256<float>{(wv >> shifts).raw});  // low 3 bits, as above
#else
      return hn::TableLookupLanes(tab, hn::IndicesFromVec(df, hn::BitCast(di, hn::And(wv >> shifts, mask))));
#endif
    } else {
      (void)tab;
      const auto c = hn::And(wv >> shifts, mask);
      V v = hn::Mul(hn::ConvertTo(df, hn::Sub(hn::BitCast(di, c), qoff)), sv);  // (code - qmax) * s, exact codes
      if constexpr (kAsym) v = hn::Add(v, zv);
      return v;
    }
  }
};

// v rounded to the output dtype and widened back to fp32 (exact): the value a
// decoded element holds before a refinement layer is added to it. bf16: the integer
// rounding of ToBf16 (nearest even); fp16 (F16C targets only): the saturating
// conversion of the store; f32: v.
template <class DF, class V>
HWY_INLINE V RoundTrip(DF df, V v, DType out) {
  if (out == DType::BF16) return hn::BitCast(df, hn::ShiftLeft<16>(RoundedBf16Bits(df, v)));
#if QVG_F16C_DEMOTE
  if (out == DType::F16) {
    const hn::Rebind<hwy::float16_t, DF> df16;
    const V c = hn::Min(hn::Max(v, hn::Set(df, -65504.0f)), hn::Set(df, 65504.0f));
    return hn::PromoteTo(df, hn::DemoteTo(df16, c));
  }
#endif
  return v;
}

// Decode of one token row by vectors (codes unpacked as CodeUnpack says), then the
// stages' centroids added; with a refinement layer (Mode::kRefBits), the value
// rounded to the output dtype and widened back, and the layer's value (its codes
// dequantized, its centroid added) added before the store.
// REQUIRES L >= 4, dim % L == 0, block % L == 0, stages <= 8; with a layer also its
// block == block, one stage, and an out dtype RoundTrip handles on this target.
template <class Mode>
void DecodeRowsVec(const DecodeRows& j) {
  const hn::ScalableTag<float> df;
  [[maybe_unused]] const hn::Rebind<hwy::float16_t, decltype(df)> df16;
  using V = hn::Vec<decltype(df)>;
  [[maybe_unused]] const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  constexpr size_t L = Mode::kLanes;
  constexpr bool kRef = Mode::kRefBits != 0;
  const CodeUnpack<Mode::kBits, Mode::kAsym> unpack;
  // The layer's codes (symmetric); without a layer, an unused instance of the job's width.
  const CodeUnpack<kRef ? Mode::kRefBits : Mode::kBits, false> runpack;
  const int64_t D = j.dim, blk = j.block, nb = D / blk, cbytes = D * Mode::kBits / 8;
  const bool fp8 = j.scale_dtype == ScaleDType::FP8_E4M3;
  const float* fp8v = Fp8().v;
  auto stored = [&](const uint8_t* arr, bool is_fp8, size_t i) {
    return is_fp8 ? fp8v[arr[i]] : residual_impl::stored_value(arr, false, int64_t(i));
  };
  const RefineRows* rr = j.refine;
  const bool rfp8 = kRef && rr->scale_dtype == ScaleDType::FP8_E4M3;
  const int64_t rcbytes = kRef ? D * Mode::kRefBits / 8 : 0;
  auto acc = hwy::AllocateAligned<float>(size_t(D));
  // Non-temporal stores for bf16 rows when every row start is aligned to the
  // store width (the output is not re-read from cache by this call; streaming
  // saves the read-for-ownership of each line). Partial-vector streams would
  // write past the row on narrow targets, so only for stores of >= 16 bytes.
  constexpr bool kCanStream = L * 2 >= 16;
  const size_t align = Mode::kPair ? L * 4 : L * 2;
  const bool stream = kCanStream && j.out_dtype == DType::BF16 && (reinterpret_cast<uintptr_t>(j.out) % align) == 0 &&
                      (size_t(j.out_token_stride) * 2) % align == 0;
  const auto store16 = [&](hn::Vec<decltype(du16)> r, uint16_t* p) {
    if constexpr (kCanStream) {
      if (stream) return hn::Stream(r, du16, p);
    }
    hn::StoreU(r, du16, p);
  };
  const float* crow[8];
  const int ns = Mode::kOneStage ? 1 : j.stages;
  // Value of the L channels at d of a block with table `tab` (its scale sv, zero zv);
  // with a layer, of the layer's codes `rcode` with its table rtab (scale rsv).
  const auto value = [&](const uint8_t* code, int64_t d, V tab, V sv, V zv, const uint8_t* rcode, V rtab, V rsv) {
    V v = unpack.Values(code, d, tab, sv, zv);
    if constexpr (Mode::kOneStage) {
      v = hn::Add(v, hn::LoadU(df, crow[0] + d));
    } else {
      for (int s = 0; s < ns; ++s) v = hn::Add(v, hn::LoadU(df, crow[s] + d));
    }
    if constexpr (kRef) {
      const V layer = hn::Add(runpack.Values(rcode, d, rtab, rsv, rsv), hn::LoadU(df, rr->centroid + d));
      v = hn::Add(RoundTrip(df, v, j.out_dtype), layer);
    } else {
      (void)rcode;
      (void)rtab;
      (void)rsv;
    }
    return v;
  };
  for (int64_t t = 0; t < j.count; ++t) {
    const uint8_t* code = j.codes + t * cbytes;
    const uint8_t* rcode = kRef ? rr->codes + t * rcbytes : nullptr;
    for (int s = 0; s < ns; ++s) crow[s] = j.centroids[s] + int64_t(j.ids[s][t]) * D;
    uint16_t* obf = j.out_dtype == DType::BF16 ? static_cast<uint16_t*>(j.out) + t * j.out_token_stride : nullptr;
    float* of32 = j.out_dtype == DType::F32 ? static_cast<float*>(j.out) + t * j.out_token_stride : acc.get();
#if QVG_F16C_DEMOTE
    uint16_t* of16 = j.out_dtype == DType::F16 ? static_cast<uint16_t*>(j.out) + t * j.out_token_stride : nullptr;
#endif
    for (int64_t k = 0; k < nb; ++k) {
      const size_t si = size_t(t * nb + k);
      const V sv = hn::Set(df, stored(j.scales, fp8, si) * j.scale_factor);
      V zv = hn::Zero(df);
      if constexpr (Mode::kAsym) zv = hn::Set(df, stored(j.zeros, fp8, si) * j.zero_factor);
      V tab = hn::Zero(df);
      if constexpr (decltype(unpack)::kLut) tab = unpack.Table(sv, zv);
      V rsv = hn::Zero(df), rtab = hn::Zero(df);
      if constexpr (kRef) {
        rsv = hn::Set(df, stored(rr->scales, rfp8, si) * rr->scale_factor);
        if constexpr (decltype(runpack)::kLut) rtab = runpack.Table(rsv, rsv);
      }
#if QVG_NATIVE_BF16_PAIR
      if constexpr (Mode::kPair) {
        if (obf) {
          const auto expo = hn::Set(du, 0x7F800000u);
          for (int64_t d = k * blk; d < (k + 1) * blk; d += 2 * int64_t(L)) {
            const V v0 = value(code, d, tab, sv, zv, rcode, rtab, rsv);
            const V v1 = value(code, d + int64_t(L), tab, sv, zv, rcode, rtab, rsv);
            // Lanes with a zero exponent (zeros, denormals) take the integer path.
            const auto normal = hn::And(hn::TestBit(hn::BitCast(du, v0), expo), hn::TestBit(hn::BitCast(du, v1), expo));
            if (HWY_LIKELY(hn::AllTrue(du, normal))) {
              const auto r = Bf16Pair(v0, v1);
              const hn::Full512<uint16_t> d32;
              if (stream) {
                hn::Stream(r, d32, obf + d);
              } else {
                hn::StoreU(r, d32, obf + d);
              }
            } else {
              store16(ToBf16NoNaN(df, v0), obf + d);
              store16(ToBf16NoNaN(df, v1), obf + d + L);
            }
          }
          continue;
        }
      }
#endif
      for (int64_t d = k * blk; d < (k + 1) * blk; d += int64_t(L)) {
        const V v = value(code, d, tab, sv, zv, rcode, rtab, rsv);
        if (obf) {
          store16(ToBf16NoNaN(df, v), obf + d);
        } else {
#if QVG_F16C_DEMOTE
          if (of16) {
            // Saturating fp16: clamping to +-65504 first leaves every value that
            // rounds to a finite fp16 unchanged and turns the rest into 65504.
            const V c = hn::Min(hn::Max(v, hn::Set(df, -65504.0f)), hn::Set(df, 65504.0f));
            hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, c)), du16, of16 + d);
            continue;
          }
#endif
          hn::StoreU(v, df, of32 + d);
        }
      }
    }
    if (!QVG_F16C_DEMOTE && j.out_dtype == DType::F16) {
      uint16_t* o = static_cast<uint16_t*>(j.out) + t * j.out_token_stride;
      for (int64_t d = 0; d < D; ++d) o[d] = qvg::f32_to_f16_sat(acc[size_t(d)]);
    }
  }
  if (stream) hwy::FlushStream();
}

// Calls f(std::true_type()) or f(std::false_type()) as `flag` is: a run-time flag
// made a compile-time constant, so that each of f's instantiations is one kernel.
// (Written here: the standard library's nearest tool, std::visit over a variant
// of the two types, would need the variant built at run time for nothing.) Code
// widths become compile-time constants through qvg::dispatch_width only.
template <class F>
HWY_INLINE void WithConstant(bool flag, const F& f) {
  if (flag) {
    f(std::true_type());
  } else {
    f(std::false_type());
  }
}

void DecodeRowsGeneric(const DecodeRows& j);  // below: any job

// DecodeRowsVec instantiated for the job's mode: per code width W this target's vector
// path takes (VectorWidth), 8 kernels on targets with the native bf16 pair, 4
// elsewhere; a refined job of one stage: 4 (2) more per layer width it takes.
// REQUIRES as DecodeRowsVec, VectorWidth(j.bits) (RefinedVectorizable for a job
// with a layer).
void DecodeRowsVecAnyMode(const DecodeRows& j) {
  bool pair = false;
#if QVG_NATIVE_BF16_PAIR
  constexpr int64_t L = int64_t(hn::MaxLanes(hn::ScalableTag<float>()));
  pair = j.out_dtype == DType::BF16 && j.block % (2 * L) == 0 && kernels::native_bf16_enabled();
#endif
  dispatch_width(j.bits, [&](auto w) {
    using W = decltype(w);
    if constexpr (VectorWidth<W>()) {
      WithConstant(j.asymmetric, [&](auto asym) {
        constexpr bool kAsym = decltype(asym)::value;
        WithConstant(pair, [&](auto native_pair) {
          constexpr bool kPair = decltype(native_pair)::value && QVG_NATIVE_BF16_PAIR;
          if (j.refine) {  // one stage (RefinedVectorizable)
            dispatch_width(j.refine->bits, [&](auto rw) {
              using RW = decltype(rw);
              if constexpr (VectorWidth<RW>())
                DecodeRowsVec<DecodeMode<W::kBits, kAsym, true, kPair, RW::kBits>>(j);
              else
                DecodeRowsGeneric(j);  // unreachable through RefinedVectorizable; never leaves rows unwritten
            });
            return;
          }
          WithConstant(j.stages == 1, [&](auto one_stage) {
            DecodeRowsVec<DecodeMode<W::kBits, kAsym, decltype(one_stage)::value, kPair, 0>>(j);
          });
        });
      });
    } else {
      DecodeRowsGeneric(j);  // unreachable through DecodeRowsImpl; never leaves rows unwritten
    }
  });
}

// A job with a refinement layer runs the vector path when the layer shares the
// job's blocks, the encoding has one stage (the common case; more stages take the
// generic path rather than twice the kernels), the vector path takes the layer's
// width (VectorWidth) and this target rounds the output dtype in vectors (RoundTrip).
bool RefinedVectorizable(const DecodeRows& j) {
  const RefineRows& r = *j.refine;
  return r.block == j.block && j.stages == 1 && VectorWidth(r.bits) && (j.out_dtype != DType::F16 || QVG_F16C_DEMOTE);
}

// Row t of a refinement layer added to the decoded row `acc` (D values) element by
// element: acc = round-trip(acc) + ((code - qmax) * s_eff + centroid), each operation
// rounded once, round-trip the output dtype's rounding widened back (RoundTrip).
void AddLayerScalar(const RefineRows& r, int64_t t, int64_t D, DType out, float* acc) {
  const bool fp8 = r.scale_dtype == ScaleDType::FP8_E4M3;
  dispatch_width(r.bits, [&](auto w) {  // the layer's width once per row, not per element
    using W = decltype(w);
    constexpr int qmax = residual_impl::qmax_of<W>(false);
    const uint8_t* code = r.codes + t * (D / W::kGroupCodes * W::kGroupBytes);
    for (int64_t d = 0; d < D; ++d) {
      const float s = residual_impl::stored_value(r.scales, fp8, t * (D / r.block) + d / r.block) * r.scale_factor;
      const float layer = residual_impl::dequant(code_at<W>(code, d), qmax, false, s, 0.0f) + r.centroid[d];
      float v = acc[d];
      if (out == DType::BF16) v = qvg::bf16_to_f32(qvg::f32_to_bf16(v));
      if (out == DType::F16) v = qvg::f16_to_f32(qvg::f32_to_f16_sat(v));
      acc[d] = v + layer;
    }
  });
}

// Any job: per token, the codes are expanded to floats (ExpandCodeRow: a byte table
// for one-byte groups, else group by group), scaled block by block (per vector when
// a block spans whole vectors, else per element) and the centroids added, with the
// operations and order of the vector path. Also int3 on 4-lane targets (VectorWidth).
void DecodeRowsGeneric(const DecodeRows& j) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t D = j.dim, nb = D / j.block, cbytes = D * j.bits / 8;
  const bool uniform = (j.block % L) == 0;  // one scale per vector
  void (*const expand)(const uint8_t*, int64_t, bool, float*) =
      dispatch_width(j.bits, [](auto w) { return &ExpandCodeRow<decltype(w)>; });
  auto vals = hwy::AllocateAligned<float>(size_t(D));
  auto acc = hwy::AllocateAligned<float>(size_t(D));
  auto sc = hwy::AllocateAligned<float>(size_t(D));
  auto zc = hwy::AllocateAligned<float>(size_t(D));
  std::vector<float> s_eff(static_cast<size_t>(nb)), z_eff(static_cast<size_t>(nb));
  const int64_t dvec = D / L * L;
  for (int64_t t = 0; t < j.count; ++t) {
    const uint8_t* code = j.codes + t * cbytes;
    expand(code, D, j.asymmetric, vals.get());
    for (int64_t k = 0; k < nb; ++k) {
      const size_t si = size_t(t * nb + k);
      s_eff[size_t(k)] =
          residual_impl::stored_value(j.scales, j.scale_dtype == ScaleDType::FP8_E4M3, int64_t(si)) * j.scale_factor;
      if (j.asymmetric)
        z_eff[size_t(k)] =
            residual_impl::stored_value(j.zeros, j.scale_dtype == ScaleDType::FP8_E4M3, int64_t(si)) * j.zero_factor;
    }
    if (!uniform) {
      for (int64_t d = 0; d < D; ++d) {
        sc[size_t(d)] = s_eff[size_t(d / j.block)];
        zc[size_t(d)] = z_eff[size_t(d / j.block)];
      }
    }
    const float* crow[8];
    const int ns = std::min(j.stages, 8);
    for (int s = 0; s < ns; ++s) crow[s] = j.centroids[s] + int64_t(j.ids[s][t]) * D;
    for (int64_t d = 0; d < dvec; d += L) {
      V sv, zv;
      if (uniform) {
        sv = hn::Set(df, s_eff[size_t(d / j.block)]);
        zv = hn::Set(df, z_eff[size_t(d / j.block)]);
      } else {
        sv = hn::Load(df, sc.get() + d);
        zv = hn::Load(df, zc.get() + d);
      }
      V v = hn::Mul(hn::Load(df, vals.get() + d), sv);
      if (j.asymmetric) v = hn::Add(v, zv);
      for (int s = 0; s < ns; ++s) v = hn::Add(v, hn::LoadU(df, crow[s] + d));
      hn::Store(v, df, acc.get() + d);
    }
    for (int64_t d = dvec; d < D; ++d) {  // tail: the same operations, scalar
      const int64_t k = d / j.block;
      float v = vals[size_t(d)] * s_eff[size_t(k)];
      if (j.asymmetric) v = v + z_eff[size_t(k)];
      for (int s = 0; s < ns; ++s) v = v + crow[s][d];
      acc[size_t(d)] = v;
    }
    for (int s = 8; s < j.stages; ++s) {  // rare: more than 8 stages
      const float* cr = j.centroids[s] + int64_t(j.ids[s][t]) * D;
      for (int64_t d = 0; d < D; ++d) acc[size_t(d)] = acc[size_t(d)] + cr[d];
    }
    if (j.refine) AddLayerScalar(*j.refine, t, D, j.out_dtype, acc.get());
    switch (j.out_dtype) {
      case DType::F32:
        std::memcpy(static_cast<float*>(j.out) + t * j.out_token_stride, acc.get(), size_t(D) * 4);
        break;
      case DType::BF16: {
        uint16_t* o = static_cast<uint16_t*>(j.out) + t * j.out_token_stride;
        int64_t d = 0;
        for (; d + L <= D; d += L) hn::StoreU(ToBf16(df, hn::Load(df, acc.get() + d)), du16, o + d);
        for (; d < D; ++d) o[d] = qvg::f32_to_bf16(acc[size_t(d)]);
        break;
      }
      case DType::F16: {  // scalar integer conversion (Highway 1.0.3's demotion is not RNE everywhere)
        uint16_t* o = static_cast<uint16_t*>(j.out) + t * j.out_token_stride;
        for (int64_t d = 0; d < D; ++d) o[d] = qvg::f32_to_f16_sat(acc[size_t(d)]);
        break;
      }
    }
  }
}

void DecodeRowsImpl(const DecodeRows& j) {
  constexpr size_t L = hn::MaxLanes(hn::ScalableTag<float>());
  if constexpr (L >= 4) {
    if (j.dim % int64_t(L) == 0 && j.block % int64_t(L) == 0 && j.stages <= 8 && VectorWidth(j.bits) &&
        (!j.refine || RefinedVectorizable(j)))
      return DecodeRowsVecAnyMode(j);
  }
  DecodeRowsGeneric(j);
}

QVG_CPU_KERNELS_END
