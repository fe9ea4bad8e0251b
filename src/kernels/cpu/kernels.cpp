// CPU kernels, compiled once per SIMD target with Highway (foreach_target) and
// dispatched at run time. See src/kernels/kernels.h for the contracts.
//
// Arithmetic notes:
// - assign: x.c accumulates with fused multiply-adds per channel in SIMD lanes;
//   the result may differ from the scalar reference in the last bits (spec 1.1
//   allows it for fast paths).
// - decode: separate Mul and Add only (spec 1.3); the library is built with
//   -ffp-contract=off so the compiler does not fuse them either.

// Every attainable target is compiled so that tests can force each one.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
// Arrays of vectors are used below; sizeless SVE/RVV vectors do not allow them.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "kernels/cpu/blocked_product-inl.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/residual_impl.h"  // stored scale/zero decoding and code rounding, shared with the codec
#include "kernels/kernels.h"
#include "qvg/numeric.h"

HWY_BEFORE_NAMESPACE();
namespace qvg {
namespace kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- k-means assignment -------------------------------------------------------
// Register-blocked micro-kernel: P points x NV vectors of centroids, accumulators
// in registers, centroids transposed (dim x kpad) so that one load serves P points.
template <int P, int NV>
int64_t AssignBlocked(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t tileK = NV * L;
  const int64_t kpad = (k + tileK - 1) / tileK * tileK;
  // Thread-local scratch (bounded: k <= 256), reused across calls.
  thread_local std::vector<float> cT_buf, cn_buf, zero_row;
  cT_buf.assign(size_t(dim * kpad), 0.0f);
  cn_buf.resize(size_t(kpad));
  zero_row.assign(size_t(dim), 0.0f);
  float* cT = cT_buf.data();
  float* cn = cn_buf.data();
  for (int64_t j = 0; j < kpad; ++j) {
    if (j < k) {
      float s = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const float v = c[j * dim + d];
        cT[size_t(d * kpad + j)] = v;
        s += v * v;
      }
      cn[size_t(j)] = s;
    } else {
      cn[size_t(j)] = std::numeric_limits<float>::infinity();  // padding: never nearest
    }
  }
  constexpr int64_t kChunk = 128;  // points whose rows stay in L2 while tiles sweep
  std::vector<float> best(static_cast<size_t>(kChunk));
  std::vector<int> bidx(static_cast<size_t>(kChunk));
  int64_t changed = 0;
  const V two = hn::Set(df, 2.0f);
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    std::fill(best.begin(), best.end(), std::numeric_limits<float>::infinity());
    std::fill(bidx.begin(), bidx.end(), 0);
    for (int64_t j0 = 0; j0 < kpad; j0 += tileK) {
      for (int64_t i0 = c0; i0 < c1; i0 += P) {
        const float* xp[P];
        for (int p = 0; p < P; ++p) xp[p] = (i0 + p < c1) ? x + (i0 + p) * dim : zero_row.data();
        V acc[P][NV];
        BlockedProduct<P, NV>(df, xp, cT, kpad, j0, dim, acc);
        for (int p = 0; p < P && i0 + p < c1; ++p) {
          V dist[NV];
          for (int v = 0; v < NV; ++v) dist[v] = hn::NegMulAdd(two, acc[p][v], hn::LoadU(df, cn + j0 + v * L));
          V m = dist[0];
          for (int v = 1; v < NV; ++v) m = hn::Min(m, dist[v]);
          const float mv = hn::GetLane(hn::MinOfLanes(df, m));
          const size_t slot = size_t(i0 + p - c0);
          if (mv < best[slot]) {  // strict: earlier tiles (lower indices) win ties
            best[slot] = mv;
            const V mvv = hn::Set(df, mv);
            for (int v = 0; v < NV; ++v) {
              const intptr_t lane = hn::FindFirstTrue(df, hn::Eq(dist[v], mvv));
              if (lane >= 0) {
                bidx[slot] = int(j0 + v * L + lane);
                break;
              }
            }
          }
        }
      }
    }
    for (int64_t i = c0; i < c1; ++i) {
      const int b = bidx[size_t(i - c0)];
      if (first || ids[i] != b) ++changed;
      ids[i] = uint8_t(b);
    }
  }
  return changed;
}

int64_t AssignNearestImpl(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
#if HWY_MAX_BYTES >= 64
  return AssignBlocked<4, 4>(x, n, dim, c, k, ids, first);
#else
  return AssignBlocked<4, 3>(x, n, dim, c, k, ids, first);
#endif
}

// ---- conversions -----------------------------------------------------------------
template <class DF, class V>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> ToBf16(DF /*df*/, V v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  auto r = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  // NaN stays a quiet NaN (rounding could otherwise carry it into infinity).
  const auto nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
  r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, r);
  return hn::DemoteTo(du16, hn::BitCast(di, r));
}

// As ToBf16 for inputs known not to be NaN (decoded values are finite).
template <class DF, class V>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> ToBf16NoNaN(DF /*df*/, V v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto r = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  return hn::DemoteTo(du16, hn::BitCast(di, r));
}

void F32ToBf16Impl(const float* src, uint16_t* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  const hn::Rebind<uint16_t, decltype(df)> du16;
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(ToBf16(df, hn::LoadU(df, src + i)), du16, dst + i);
  for (; i < n; ++i) dst[i] = qvg::f32_to_bf16(src[i]);
}

void Bf16ToF32Impl(const uint16_t* src, float* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const size_t L = hn::Lanes(df);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, src + i)))), df, dst + i);
  for (; i < n; ++i) dst[i] = qvg::bf16_to_f32(src[i]);
}

// ---- decode ----------------------------------------------------------------------
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


// Vector unpack: the codes of one vector of L channels are L*bits/8 bytes; they are
// loaded as one little-endian word, broadcast, and every lane shifts its own code
// down (per-lane shift amounts), so no byte shuffles or tables are needed.
// REQUIRES L >= 4, dim % L == 0, block % L == 0.
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
// attribute; it runs only when the CPU reports the feature, see NativeBf16()).
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

// Decode of one token row by vectors. Residual values come from a per-block table:
// entry c holds (c - qmax) * s_eff (symmetric) or c * s_eff + z_eff (asymmetric),
// computed with the very operations of spec 1.3 on the very operands, so looking a
// code up gives the bits of computing it; then the stages' centroids are added.
// kLut: the 2^bits entries fit one vector (else codes are converted and scaled per
// element). kPair: bf16 output converted two vectors at a time with the native
// instruction (REQUIRES block % (2 L) == 0).
// fp16 output: Highway's DemoteTo is the F16C instruction (nearest even, IEEE
// denormals) on AVX2 and AVX-512; elsewhere it is an emulation that truncates, so
// those targets convert with the scalar integer routine.
#undef QVG_F16C_DEMOTE
#if (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && !defined(HWY_DISABLE_F16C)
#define QVG_F16C_DEMOTE 1
#else
#define QVG_F16C_DEMOTE 0
#endif

template <int kBits, bool kAsym, bool kOneStage, bool kLut, bool kPair>
void DecodeRowsVec(const DecodeRows& j) {
  const hn::ScalableTag<float> df;
  [[maybe_unused]] const hn::Rebind<hwy::float16_t, decltype(df)> df16;
  using V = hn::Vec<decltype(df)>;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Repartition<uint64_t, decltype(du)> du64;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  constexpr size_t L = hn::MaxLanes(df);
  // (Never called with L < 4; the guard keeps the instantiation well-formed.)
  constexpr size_t kBytes = L * kBits / 8 >= 1 ? L * kBits / 8 : 1;
  static_assert(kBytes <= 8, "one word of codes per vector");
  static_assert(!kLut || (size_t(1) << kBits) <= L, "the table fits one vector");
  alignas(64) uint32_t shift_arr[L];
  alignas(64) int32_t word_arr[L];
  alignas(64) int32_t iota_arr[L];
  for (size_t i = 0; i < L; ++i) {
    const uint32_t p =
        kBits == 4 ? uint32_t(8 * (i / 2) + ((i % 2) == 0 ? 4 : 0)) : uint32_t(8 * (i / 4) + 6 - 2 * (i % 4));
    shift_arr[i] = p % 32;
    word_arr[i] = int32_t(p / 32);
    iota_arr[i] = int32_t(i % (size_t(1) << kBits));
  }
  const auto shifts = hn::Load(du, shift_arr);
  const auto words = hn::SetTableIndices(du, word_arr);
  const auto mask = hn::Set(du, (1u << kBits) - 1u);
  const auto qoff = hn::Set(di, kAsym ? 0 : (1 << (kBits - 1)) - 1);
  // Table lane i: code i (mod 2^bits) minus the offset, as an exact float.
  const V lut_codes = hn::ConvertTo(df, hn::Sub(hn::Load(di, iota_arr), qoff));
  const int64_t D = j.dim, blk = j.block, nb = D / blk, cbytes = D * kBits / 8;
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
  const size_t align = kPair ? L * 4 : L * 2;
  const bool stream = kCanStream && j.out_dtype == DType::BF16 &&
                      (reinterpret_cast<uintptr_t>(j.out) % align) == 0 &&
                      (size_t(j.out_token_stride) * 2) % align == 0;
  const auto store16 = [&](hn::Vec<decltype(du16)> r, uint16_t* p) {
    if constexpr (kCanStream) {
      if (stream) return hn::Stream(r, du16, p);
    }
    hn::StoreU(r, du16, p);
  };
  const float* crow[8];
  const int ns = kOneStage ? 1 : j.stages;
  // Value of the L channels at d of a block with table `tab` (kLut) or scale/zero.
  const auto value = [&](const uint8_t* code, int64_t d, V tab, V sv, V zv) {
    uint64_t w = 0;
    std::memcpy(&w, code + size_t(d) * kBits / 8, kBytes);
    hn::Vec<decltype(du)> wv;
    if constexpr (kBytes > 4) {
      wv = hn::TableLookupLanes(hn::BitCast(du, hn::Set(du64, w)), words);
    } else {
      wv = hn::Set(du, uint32_t(w));
    }
    V v;
    if constexpr (kLut) {
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
      if constexpr (kAsym) v = hn::Add(v, zv);
    }
    if constexpr (kOneStage) {
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
      if constexpr (kAsym) zv = hn::Set(df, stored(j.zeros, si) * j.zero_factor);
      V tab = hn::Zero(df);
      if constexpr (kLut) {
        tab = hn::Mul(lut_codes, sv);
        if constexpr (kAsym) tab = hn::Add(tab, zv);
      }
#if QVG_NATIVE_BF16_PAIR
      if constexpr (kPair) {
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

template <int kBits, bool kAsym, bool kOneStage>
void DecodeRowsVecSelect(const DecodeRows& j) {
  const hn::ScalableTag<float> df;
  constexpr size_t L = hn::MaxLanes(df);
  constexpr bool kLut = (size_t(1) << kBits) <= L;
#if QVG_NATIVE_BF16_PAIR
  if (j.out_dtype == DType::BF16 && j.block % int64_t(2 * L) == 0 && kernels::native_bf16_enabled())
    return DecodeRowsVec<kBits, kAsym, kOneStage, kLut, true>(j);
#endif
  return DecodeRowsVec<kBits, kAsym, kOneStage, kLut, false>(j);
}

template <int kBits>
void DecodeRowsVecDispatch(const DecodeRows& j) {
  if (j.asymmetric) {
    if (j.stages == 1) return DecodeRowsVecSelect<kBits, true, true>(j);
    return DecodeRowsVecSelect<kBits, true, false>(j);
  }
  if (j.stages == 1) return DecodeRowsVecSelect<kBits, false, true>(j);
  return DecodeRowsVecSelect<kBits, false, false>(j);
}

void DecodeRowsImpl(const DecodeRows& j) {
  {
    const hn::ScalableTag<float> dfl;
    constexpr size_t L = hn::MaxLanes(dfl);
    if constexpr (L >= 4) {
      if (j.dim % int64_t(L) == 0 && j.block % int64_t(L) == 0 && j.stages <= 8) {
        if (j.bits == 4) return DecodeRowsVecDispatch<4>(j);
        return DecodeRowsVecDispatch<2>(j);
      }
    }
  }
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t D = j.dim, nb = D / j.block, cbytes = D * j.bits / 8;
  const bool uniform = (j.block % L) == 0;  // one scale per vector
  const CodeTables& tab = Tables();
  const float* lut = j.bits == 4 ? (j.asymmetric ? &tab.a4[0][0] : &tab.s4[0][0])
                                 : (j.asymmetric ? &tab.a2[0][0] : &tab.s2[0][0]);
  const int per = 8 / j.bits;
  auto vals = hwy::AllocateAligned<float>(size_t(D));
  auto acc = hwy::AllocateAligned<float>(size_t(D));
  auto sc = hwy::AllocateAligned<float>(size_t(D));
  auto zc = hwy::AllocateAligned<float>(size_t(D));
  std::vector<float> s_eff(static_cast<size_t>(nb)), z_eff(static_cast<size_t>(nb));
  const int64_t dvec = D / L * L;
  for (int64_t t = 0; t < j.count; ++t) {
    const uint8_t* code = j.codes + t * cbytes;
    for (int64_t b = 0; b < cbytes; ++b) std::memcpy(vals.get() + b * per, lut + size_t(code[b]) * size_t(per), size_t(per) * 4);
    for (int64_t k = 0; k < nb; ++k) {
      const size_t si = size_t(t * nb + k);
      s_eff[size_t(k)] = residual_impl::stored_value(j.scales, j.scale_dtype == ScaleDType::FP8_E4M3, int64_t(si)) * j.scale_factor;
      if (j.asymmetric) z_eff[size_t(k)] = residual_impl::stored_value(j.zeros, j.scale_dtype == ScaleDType::FP8_E4M3, int64_t(si)) * j.zero_factor;
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

// ---- encoder: centroid update and residual quantizer ------------------------------
// All of these give the scalar definitions' bits on every target: fp64 sums are
// added in point order per element, max/min are exact, and the residual code is
// a correctly rounded division followed by an exact round-half-away-from-zero.

void AccumulateClustersImpl(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum,
                            int64_t* cnt) {
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // half-width float vector, promoted
  const int64_t L = int64_t(hn::Lanes(dd));
#else
  const int64_t L = 1 << 30;  // no fp64 vectors: scalar loop only
#endif
  for (int64_t i = 0; i < n; ++i) {
    double* srow = sum + int64_t(ids[i]) * dim;
    const float* xi = x + i * dim;
    int64_t d = 0;
#if HWY_HAVE_FLOAT64
    for (; d + L <= dim; d += L)
      hn::StoreU(hn::Add(hn::LoadU(dd, srow + d), hn::PromoteTo(dd, hn::LoadU(dfh, xi + d))), dd, srow + d);
#endif
    for (; d < dim; ++d) srow[d] += double(xi[d]);
    ++cnt[ids[i]];
  }
}

void BlockAbsMaxImpl(const float* x, int64_t nblocks, int64_t bs, float* amax) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* p = x + b * bs;
    float a = 0;
    if (bs % L == 0) {
      auto m = hn::Zero(df);
      for (int64_t i = 0; i < bs; i += L) m = hn::Max(m, hn::Abs(hn::LoadU(df, p + i)));
      a = hn::GetLane(hn::MaxOfLanes(df, m));
    } else {
      for (int64_t i = 0; i < bs; ++i) a = std::max(a, std::fabs(p[i]));
    }
    amax[b] = a;
  }
}

void BlockMinMaxImpl(const float* x, int64_t nblocks, int64_t bs, float* lo_out, float* hi_out) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* p = x + b * bs;
    float lo = p[0], hi = p[0];
    bool scalar = bs % L != 0;
    if (!scalar) {
      auto vlo = hn::LoadU(df, p), vhi = vlo;
      for (int64_t i = L; i < bs; i += L) {
        const auto v = hn::LoadU(df, p + i);
        vlo = hn::Min(vlo, v);
        vhi = hn::Max(vhi, v);
      }
      lo = hn::GetLane(hn::MinOfLanes(df, vlo));
      hi = hn::GetLane(hn::MaxOfLanes(df, vhi));
      // Which zero a sequential scan keeps (+0 or -0) depends on the order; the
      // sign of a zero minimum is stored, so such blocks are scanned in order.
      scalar = lo == 0.0f || hi == 0.0f;
    }
    if (scalar) {
      lo = p[0];
      hi = p[0];
      for (int64_t i = 1; i < bs; ++i) {
        lo = std::min(lo, p[i]);
        hi = std::max(hi, p[i]);
      }
    }
    lo_out[b] = lo;
    hi_out[b] = hi;
  }
}

void QuantizeRowsImpl(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym,
                      const float* s_eff, const float* z_eff, uint8_t* codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t nb = dim / block, cbytes = dim * bits / 8;
  const int qmax = residual_impl::qmax_of(bits, asym);
  const float fq = float(qmax);
  const float qlo = asym ? 0.0f : -fq;
  const int qadd = asym ? 0 : qmax;
  std::vector<uint8_t> q8(static_cast<size_t>(dim + L));
  const auto half = hn::Set(df, 0.5f), one = hn::Set(df, 1.0f), vlo = hn::Set(df, qlo), vhi = hn::Set(df, fq);
  const auto vadd = hn::Set(di, qadd);
  for (int64_t t = 0; t < count; ++t) {
    const float* row = r + t * dim;
    for (int64_t k = 0; k < nb; ++k) {
      const float s = s_eff[t * nb + k];
      const float z = asym ? z_eff[t * nb + k] : 0.0f;
      const float* x = row + k * block;
      uint8_t* qk = q8.data() + k * block;
      if (s == 0.0f) {
        std::fill_n(qk, block, uint8_t(qadd));
        continue;
      }
      int64_t i = 0;
      if (block % L == 0) {
        const auto sv = hn::Set(df, s), zv = hn::Set(df, z);
        for (; i < block; i += L) {
          auto v = hn::LoadU(df, x + i);
          if (asym) v = hn::Sub(v, zv);
          v = hn::Div(v, sv);
          // round half away from zero: v - trunc(v) is exact; infinities keep their
          // value (their fraction is NaN, which compares false) and are clamped.
          const auto tr = hn::Trunc(v);
          const auto adj = hn::IfThenElseZero(hn::Ge(hn::Abs(hn::Sub(v, tr)), half), hn::CopySign(one, v));
          const auto rq = hn::Min(hn::Max(hn::Add(tr, adj), vlo), vhi);
          hn::StoreU(hn::DemoteTo(du8, hn::Add(hn::ConvertTo(di, rq), vadd)), du8, qk + i);
        }
      }
      for (; i < block; ++i) {
        const float v = asym ? (x[i] - z) / s : x[i] / s;
        qk[i] = uint8_t(residual_impl::round_clamp(v, qlo, fq) + qadd);
      }
    }
    uint8_t* out = codes + t * cbytes;
    if (bits == 4) {
      for (int64_t j = 0; j < cbytes; ++j) out[j] = uint8_t((q8[size_t(2 * j)] << 4) | q8[size_t(2 * j + 1)]);
    } else {
      for (int64_t j = 0; j < cbytes; ++j) {
        const uint8_t* qq = q8.data() + 4 * j;
        out[j] = uint8_t((qq[0] << 6) | (qq[1] << 4) | (qq[2] << 2) | qq[3]);
      }
    }
  }
}

// ---- input limits ------------------------------------------------------------------
// |x| <= 1e16 compared on magnitude bits: the largest float <= 1e16 is
// 9999999198822400 (0x5A0E1BC9); NaN and infinity have larger magnitude bits.
constexpr uint32_t kLimitBits = 0x5A0E1BC9u;

template <typename T, class DU, class Pred>
size_t FirstBad(DU du, const T* p, size_t n, Pred bad_vec, bool (*bad_scalar)(T)) {
  const size_t L = hn::Lanes(du);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    if (!hn::AllFalse(du, bad_vec(hn::LoadU(du, p + i)))) break;
  }
  for (; i < n; ++i)
    if (bad_scalar(p[i])) return i;
  return n;
}

size_t FirstOutOfLimitImpl(const void* p, DType t, size_t n) {
  const hn::ScalableTag<uint32_t> du32;
  const hn::ScalableTag<uint16_t> du16;
  switch (t) {
    case DType::F32: {
      const auto absm = hn::Set(du32, 0x7FFFFFFFu), lim = hn::Set(du32, kLimitBits);
      return FirstBad<uint32_t>(
          du32, static_cast<const uint32_t*>(p), n, [&](auto v) { return hn::Gt(hn::And(v, absm), lim); },
          +[](uint32_t v) { return (v & 0x7FFFFFFFu) > kLimitBits; });
    }
    case DType::BF16: {
      // bf16 magnitude bits m: value bits m << 16 > kLimitBits  <=>  m > kLimitBits >> 16 (low bits of the
      // limit are non-zero, so m == kLimitBits >> 16 is still within the limit).
      const auto absm = hn::Set(du16, uint16_t(0x7FFF)), lim = hn::Set(du16, uint16_t(kLimitBits >> 16));
      return FirstBad<uint16_t>(
          du16, static_cast<const uint16_t*>(p), n, [&](auto v) { return hn::Gt(hn::And(v, absm), lim); },
          +[](uint16_t v) { return uint32_t(v & 0x7FFF) > (kLimitBits >> 16); });
    }
    case DType::F16: {
      // Every finite fp16 is within the limit: only infinity and NaN (exponent all ones) fail.
      const auto expm = hn::Set(du16, uint16_t(0x7C00));
      return FirstBad<uint16_t>(
          du16, static_cast<const uint16_t*>(p), n, [&](auto v) { return hn::Eq(hn::And(v, expm), expm); },
          +[](uint16_t v) { return (v & 0x7C00) == 0x7C00; });
    }
  }
  return n;
}

// ---- machine limit: FMA throughput -------------------------------------------------
double FmaLoopImpl(int64_t iters) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  constexpr int kAcc = 12;  // enough independent chains to cover FMA latency x ports
  V a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = hn::Set(df, float(i) * 1e-3f);
  const V m = hn::Set(df, 0.9999999f), c = hn::Set(df, 1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAcc; ++i) a[i] = hn::MulAdd(a[i], m, c);
  }
  V s = a[0];
  for (int i = 1; i < kAcc; ++i) s = hn::Add(s, a[i]);
  volatile float sink = hn::GetLane(s);
  (void)sink;
  return double(iters) * kAcc * double(hn::Lanes(df)) * 2.0;
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace qvg
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qvg {
namespace kernels {

HWY_EXPORT(AssignNearestImpl);
HWY_EXPORT(F32ToBf16Impl);
HWY_EXPORT(Bf16ToF32Impl);
HWY_EXPORT(DecodeRowsImpl);
HWY_EXPORT(FmaLoopImpl);
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(FirstOutOfLimitImpl);
HWY_EXPORT(AccumulateClustersImpl);
HWY_EXPORT(BlockAbsMaxImpl);
HWY_EXPORT(BlockMinMaxImpl);
HWY_EXPORT(QuantizeRowsImpl);

void accumulate_clusters(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum, int64_t* cnt) {
  HWY_DYNAMIC_DISPATCH(AccumulateClustersImpl)(x, n, dim, ids, sum, cnt);
}
void block_absmax(const float* x, int64_t nblocks, int64_t bs, float* amax) {
  HWY_DYNAMIC_DISPATCH(BlockAbsMaxImpl)(x, nblocks, bs, amax);
}
void block_minmax(const float* x, int64_t nblocks, int64_t bs, float* lo, float* hi) {
  HWY_DYNAMIC_DISPATCH(BlockMinMaxImpl)(x, nblocks, bs, lo, hi);
}
void quantize_rows(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym,
                   const float* s_eff, const float* z_eff, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowsImpl)(r, count, dim, block, bits, asym, s_eff, z_eff, codes);
}

size_t first_out_of_limit(const void* p, DType t, size_t n) {
  return HWY_DYNAMIC_DISPATCH(FirstOutOfLimitImpl)(p, t, n);
}

int64_t assign_nearest(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
  return HWY_DYNAMIC_DISPATCH(AssignNearestImpl)(x, n, dim, c, k, ids, first);
}
void f32_to_bf16(const float* src, uint16_t* dst, size_t n) { HWY_DYNAMIC_DISPATCH(F32ToBf16Impl)(src, dst, n); }
void bf16_to_f32(const uint16_t* src, float* dst, size_t n) { HWY_DYNAMIC_DISPATCH(Bf16ToF32Impl)(src, dst, n); }
void decode_rows(const DecodeRows& job) { HWY_DYNAMIC_DISPATCH(DecodeRowsImpl)(job); }
double fma_loop(int64_t iters) { return HWY_DYNAMIC_DISPATCH(FmaLoopImpl)(iters); }
std::string current_target_name() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

std::vector<Target> available_targets() {
  std::vector<Target> out;
  // Lower bits are better targets in Highway's encoding: best first.
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.push_back({t, hwy::TargetName(t)});
  return out;
}

void force_target(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

namespace {
std::atomic<bool> g_allow_native_bf16{true};
}  // namespace

bool native_bf16_available() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512bf16") != 0;
  return has;
#else
  return false;
#endif
}
void allow_native_bf16(bool allow) { g_allow_native_bf16.store(allow); }
bool native_bf16_enabled() { return g_allow_native_bf16.load(std::memory_order_relaxed) && native_bf16_available(); }

}  // namespace kernels
}  // namespace qvg
#endif  // HWY_ONCE
