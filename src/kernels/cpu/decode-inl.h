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
// Requires convert-inl.h (ToBf16), included before it by dispatch.cpp.
#include "kernels/kernels.h"
#include "qvg/numeric.h"

QVG_CPU_KERNELS_BEGIN

// Code values as floats, per packed byte: int4 -> 2 values, int2 -> 4 values, for
// symmetric (code - qmax) and asymmetric (code) decoding. Exact small integers.
struct CodeTables {
  alignas(64) float s4[256][2], a4[256][2], s2[256][4], a2[256][4];
  CodeTables() {
    for (int b = 0; b < 256; ++b) {
      a4[b][0] = float(b >> 4);
      a4[b][1] = float(b & 0xF);
      s4[b][0] = float((b >> 4) - 7);
      s4[b][1] = float((b & 0xF) - 7);
      for (int u = 0; u < 4; ++u) {
        const int code = (b >> (6 - 2 * u)) & 3;
        a2[b][u] = float(code);
        s2[b][u] = float(code - 1);
      }
    }
  }
};
const CodeTables& Tables() {
  static const CodeTables t;
  return t;
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
// (bits, asymmetry, one stage or several, native bf16 pairs) and the constants
// that follow from them on this target.
template <int kBitsArg, bool kAsymArg, bool kOneStageArg, bool kPairArg>
struct DecodeMode {
  static constexpr int kBits = kBitsArg;           // 2 or 4
  static constexpr bool kAsym = kAsymArg;          // code * s + z (else (code - qmax) * s)
  static constexpr bool kOneStage = kOneStageArg;  // exactly one codebook stage
  // bf16 output converted two vectors at a time with the native instruction
  // (REQUIRES block % (2 L) == 0).
  static constexpr bool kPair = kPairArg;
  static constexpr size_t kLanes = hn::MaxLanes(hn::ScalableTag<float>());
  // The 2^bits values of a block's codes fit one vector: they are looked up in a
  // per-block table (else codes are converted and scaled per element).
  static constexpr bool kLut = (size_t(1) << kBits) <= kLanes;
  // Bytes of codes per vector of channels. (Never used with L < 4; the guard keeps
  // the instantiation well-formed.)
  static constexpr size_t kCodeBytes = kLanes * kBits / 8 >= 1 ? kLanes * kBits / 8 : 1;
  static_assert(kCodeBytes <= 8, "one word of codes per vector");
};

// Decode of one token row by vectors. Residual values come from a per-block table:
// entry c holds (c - qmax) * s_eff (symmetric) or c * s_eff + z_eff (asymmetric),
// computed with the very operations of spec 1.3 on the very operands, so looking a
// code up gives the bits of computing it; then the stages' centroids are added.
// Unpack: the codes of one vector of L channels are L*bits/8 bytes; they are
// loaded as one little-endian word, broadcast, and every lane shifts its own code
// down (per-lane shift amounts), so no byte shuffles or tables are needed.
// REQUIRES L >= 4, dim % L == 0, block % L == 0, stages <= 8.
template <class Mode>
void DecodeRowsVec(const DecodeRows& j) {
  const hn::ScalableTag<float> df;
  [[maybe_unused]] const hn::Rebind<hwy::float16_t, decltype(df)> df16;
  using V = hn::Vec<decltype(df)>;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Repartition<uint64_t, decltype(du)> du64;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  constexpr size_t L = Mode::kLanes;
  alignas(64) uint32_t shift_arr[L];
  alignas(64) int32_t word_arr[L];
  alignas(64) int32_t iota_arr[L];
  for (size_t i = 0; i < L; ++i) {
    const uint32_t p =
        Mode::kBits == 4 ? uint32_t(8 * (i / 2) + ((i % 2) == 0 ? 4 : 0)) : uint32_t(8 * (i / 4) + 6 - 2 * (i % 4));
    shift_arr[i] = p % 32;
    word_arr[i] = int32_t(p / 32);
    iota_arr[i] = int32_t(i % (size_t(1) << Mode::kBits));
  }
  const auto shifts = hn::Load(du, shift_arr);
  const auto words = hn::SetTableIndices(du, word_arr);
  const auto mask = hn::Set(du, (1u << Mode::kBits) - 1u);
  const auto qoff = hn::Set(di, Mode::kAsym ? 0 : (1 << (Mode::kBits - 1)) - 1);
  // Table lane i: code i (mod 2^bits) minus the offset, as an exact float.
  const V lut_codes = hn::ConvertTo(df, hn::Sub(hn::Load(di, iota_arr), qoff));
  const int64_t D = j.dim, blk = j.block, nb = D / blk, cbytes = D * Mode::kBits / 8;
  const bool fp8 = j.scale_dtype == ScaleDType::FP8_E4M3;
  const float* fp8v = Fp8().v;
  auto stored = [&](const uint8_t* arr, size_t i) {
    return fp8 ? fp8v[arr[i]] : residual_impl::stored_value(arr, false, int64_t(i));
  };
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
  // Value of the L channels at d of a block with table `tab` (Mode::kLut) or scale/zero.
  const auto value = [&](const uint8_t* code, int64_t d, V tab, V sv, V zv) {
    uint64_t w = 0;
    std::memcpy(&w, code + size_t(d) * Mode::kBits / 8, Mode::kCodeBytes);
    hn::Vec<decltype(du)> wv;
    if constexpr (Mode::kCodeBytes > 4) {
      wv = hn::TableLookupLanes(hn::BitCast(du, hn::Set(du64, w)), words);
    } else {
      wv = hn::Set(du, uint32_t(w));
    }
    V v;
    if constexpr (Mode::kLut) {
      (void)sv;
      (void)zv;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      // vpermps reads only the low 4 index bits, and table lane i holds code
      // i mod 2^bits, so the bits above this lane's code need no masking.
      v = hn::TableLookupLanes(tab, hn::Indices512<float>{(wv >> shifts).raw});
#elif HWY_TARGET == HWY_AVX2
      v = hn::TableLookupLanes(tab, hn::Indices256<float>{(wv >> shifts).raw});  // low 3 bits, as above
#else
      v = hn::TableLookupLanes(tab, hn::IndicesFromVec(df, hn::BitCast(di, hn::And(wv >> shifts, mask))));
#endif
    } else {
      const auto c = hn::And(wv >> shifts, mask);
      (void)tab;
      v = hn::Mul(hn::ConvertTo(df, hn::Sub(hn::BitCast(di, c), qoff)), sv);  // (code - qmax) * s, exact codes
      if constexpr (Mode::kAsym) v = hn::Add(v, zv);
    }
    if constexpr (Mode::kOneStage) {
      v = hn::Add(v, hn::LoadU(df, crow[0] + d));
    } else {
      for (int s = 0; s < ns; ++s) v = hn::Add(v, hn::LoadU(df, crow[s] + d));
    }
    return v;
  };
  for (int64_t t = 0; t < j.count; ++t) {
    const uint8_t* code = j.codes + t * cbytes;
    for (int s = 0; s < ns; ++s) crow[s] = j.centroids[s] + int64_t(j.ids[s][t]) * D;
    uint16_t* obf = j.out_dtype == DType::BF16 ? static_cast<uint16_t*>(j.out) + t * j.out_token_stride : nullptr;
    float* of32 = j.out_dtype == DType::F32 ? static_cast<float*>(j.out) + t * j.out_token_stride : acc.get();
#if QVG_F16C_DEMOTE
    uint16_t* of16 = j.out_dtype == DType::F16 ? static_cast<uint16_t*>(j.out) + t * j.out_token_stride : nullptr;
#endif
    for (int64_t k = 0; k < nb; ++k) {
      const size_t si = size_t(t * nb + k);
      const V sv = hn::Set(df, stored(j.scales, si) * j.scale_factor);
      V zv = hn::Zero(df);
      if constexpr (Mode::kAsym) zv = hn::Set(df, stored(j.zeros, si) * j.zero_factor);
      V tab = hn::Zero(df);
      if constexpr (Mode::kLut) {
        tab = hn::Mul(lut_codes, sv);
        if constexpr (Mode::kAsym) tab = hn::Add(tab, zv);
      }
#if QVG_NATIVE_BF16_PAIR
      if constexpr (Mode::kPair) {
        if (obf) {
          const auto expo = hn::Set(du, 0x7F800000u);
          for (int64_t d = k * blk; d < (k + 1) * blk; d += 2 * int64_t(L)) {
            const V v0 = value(code, d, tab, sv, zv), v1 = value(code, d + int64_t(L), tab, sv, zv);
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
        const V v = value(code, d, tab, sv, zv);
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
// of the two types, would need the variant built at run time for nothing.)
template <class F>
HWY_INLINE void WithConstant(bool flag, const F& f) {
  if (flag) {
    f(std::true_type());
  } else {
    f(std::false_type());
  }
}

// DecodeRowsVec instantiated for the job's mode (16 kernels on targets with the
// native bf16 pair, 8 elsewhere). REQUIRES as DecodeRowsVec.
void DecodeRowsVecAnyMode(const DecodeRows& j) {
  bool pair = false;
#if QVG_NATIVE_BF16_PAIR
  constexpr int64_t L = int64_t(hn::MaxLanes(hn::ScalableTag<float>()));
  pair = j.out_dtype == DType::BF16 && j.block % (2 * L) == 0 && kernels::native_bf16_enabled();
#endif
  WithConstant(j.bits == 4, [&](auto int4) {
    WithConstant(j.asymmetric, [&](auto asym) {
      WithConstant(j.stages == 1, [&](auto one_stage) {
        WithConstant(pair, [&](auto native_pair) {
          DecodeRowsVec<DecodeMode<decltype(int4)::value ? 4 : 2, decltype(asym)::value, decltype(one_stage)::value,
                                   decltype(native_pair)::value && QVG_NATIVE_BF16_PAIR>>(j);
        });
      });
    });
  });
}

// Any job: per token, the codes are expanded through a byte table, scaled block by
// block (per vector when a block spans whole vectors, else per element) and the
// centroids added, with the operations and order of the vector path.
void DecodeRowsGeneric(const DecodeRows& j) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t D = j.dim, nb = D / j.block, cbytes = D * j.bits / 8;
  const bool uniform = (j.block % L) == 0;  // one scale per vector
  const CodeTables& tab = Tables();
  const float* lut =
      j.bits == 4 ? (j.asymmetric ? &tab.a4[0][0] : &tab.s4[0][0]) : (j.asymmetric ? &tab.a2[0][0] : &tab.s2[0][0]);
  const int per = 8 / j.bits;
  auto vals = hwy::AllocateAligned<float>(size_t(D));
  auto acc = hwy::AllocateAligned<float>(size_t(D));
  auto sc = hwy::AllocateAligned<float>(size_t(D));
  auto zc = hwy::AllocateAligned<float>(size_t(D));
  std::vector<float> s_eff(static_cast<size_t>(nb)), z_eff(static_cast<size_t>(nb));
  const int64_t dvec = D / L * L;
  for (int64_t t = 0; t < j.count; ++t) {
    const uint8_t* code = j.codes + t * cbytes;
    for (int64_t b = 0; b < cbytes; ++b)
      std::memcpy(vals.get() + b * per, lut + size_t(code[b]) * size_t(per), size_t(per) * 4);
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
    if (j.dim % int64_t(L) == 0 && j.block % int64_t(L) == 0 && j.stages <= 8) return DecodeRowsVecAnyMode(j);
  }
  DecodeRowsGeneric(j);
}

QVG_CPU_KERNELS_END
