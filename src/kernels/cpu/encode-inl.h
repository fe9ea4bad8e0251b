// src/kernels/cpu/encode-inl.h — the encoder's kernels per SIMD target: centroid
// sums (kernels::accumulate_clusters), block maxima and minima (block_absmax,
// block_minmax) and the residual quantizer (quantize_rows). Include inside a
// foreach_target translation unit (dispatch.cpp).
//
// All of these give the scalar definitions' bits (kernels::ref) on every target:
// fp64 sums are added in point order per element, max/min are exact, and the
// residual code is a correctly rounded division followed by an exact
// round-half-away-from-zero.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/residual_impl.h"  // the code rounding, shared with the codec
#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
#include "qvg/code_format.h"      // the code widths (dispatch_width)
// Requires codes-inl.h (PackGroup), included before it by dispatch.cpp.

QVG_CPU_KERNELS_BEGIN

void AccumulateClustersImpl(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum, int64_t* cnt) {
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

void AddRowsF64Impl(const float* x, int64_t n, int64_t dim, const float* minus, double* sum) {
  int64_t d0 = 0;
#if HWY_HAVE_FLOAT64
  // kV vectors of sums stay in registers while every row adds to them, in row order.
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // half-width float vector, promoted
  using VD = hn::Vec<decltype(dd)>;
  using VF = hn::Vec<decltype(dfh)>;
  const int64_t L = int64_t(hn::Lanes(dd));
  constexpr int kV = 4;
  const auto columns = [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    for (; d0 + NV * L <= dim; d0 += NV * L) {
      VD acc[NV];
      VF m[NV];
      for (int v = 0; v < NV; ++v) {
        acc[v] = hn::LoadU(dd, sum + d0 + v * L);
        m[v] = minus ? hn::LoadU(dfh, minus + d0 + v * L) : hn::Zero(dfh);
      }
      const float* row = x + d0;
      if (minus) {
        for (int64_t i = 0; i < n; ++i, row += dim)
          for (int v = 0; v < NV; ++v)
            acc[v] = hn::Add(acc[v], hn::PromoteTo(dd, hn::Sub(hn::LoadU(dfh, row + v * L), m[v])));
      } else {
        for (int64_t i = 0; i < n; ++i, row += dim)
          for (int v = 0; v < NV; ++v) acc[v] = hn::Add(acc[v], hn::PromoteTo(dd, hn::LoadU(dfh, row + v * L)));
      }
      for (int v = 0; v < NV; ++v) hn::StoreU(acc[v], dd, sum + d0 + v * L);
    }
  };
  columns(std::integral_constant<int, kV>{});
  columns(std::integral_constant<int, 1>{});
#endif
  for (; d0 < dim; ++d0) {
    double s = sum[d0];
    for (int64_t i = 0; i < n; ++i) s += double(minus ? x[i * dim + d0] - minus[d0] : x[i * dim + d0]);
    sum[d0] = s;
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

// The residual quantizer for codes of width W (a row of qvg/code_format.h).
template <class W>
void QuantizeRowsW(const float* r, int64_t count, int64_t dim, int64_t block, bool asym, const float* s_eff,
                   const float* z_eff, uint8_t* codes) {
  constexpr int G = W::kGroupCodes, B = W::kGroupBytes;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t nb = dim / block, ngroups = dim / G, cbytes = ngroups * B;
  const int qmax = residual_impl::qmax_of<W>(asym);
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
    // Packed group by group (spec 1.5): G codes fill B bytes, most significant first.
    uint8_t* out = codes + t * cbytes;
    const uint8_t* q = q8.data();
    for (int64_t g = 0; g < ngroups; ++g) PackGroup<W>(q + g * G, out + g * B);
  }
}

void QuantizeRowsImpl(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym,
                      const float* s_eff, const float* z_eff, uint8_t* codes) {
  dispatch_width(bits, [&](auto w) { QuantizeRowsW<decltype(w)>(r, count, dim, block, asym, s_eff, z_eff, codes); });
}

// The scale search's errors (residual_impl::block_sq_error) with candidates in lanes
// and channels in order, so every lane runs the scalar rule and the bits do not depend
// on the width. A task is one vector of candidates of one block; kErrTasks tasks (of
// any blocks) run side by side, so that their sums — each a chain of dependent adds —
// overlap.
struct ErrTask {
  const float* x;  // the block's elements
  const float* s;  // its candidates' effective scales
  const float* z;  // and zeros (asymmetric)
  float* err;      // their errors
  int m;           // candidates in this task (<= lanes)
};
inline constexpr int kErrTasks = 4;

// N tasks of n elements. When every task's 1 / s is normal (kRecip), most quotients
// are (x - z) * (1 / s): within 2^-23 relative of the rounded quotient, the same code
// unless it lies within `tol` of a half-integer. Only the half-integers strictly inside
// (lo - 1/2, hi + 1/2) can change a clamped code, and there |quotient| < 17: 2^-16 is
// several times the product's error; such an element (rare) takes the division. Tiny
// or huge scales take the division throughout.
template <int N>
void ErrTasksN(const ErrTask* tk, int64_t n, int qmax, bool asym) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int L = int(hn::Lanes(df));
  const float hi = float(qmax), lo = asym ? 0.0f : -hi;
  const V rlo = hn::Set(df, lo), rhi = hn::Set(df, hi);
  const V zero = hn::Zero(df), one = hn::Set(df, 1.0f), half = hn::Set(df, 0.5f), tol = hn::Set(df, 0x1p-16f);
  V sv[N], zv[N], sdiv[N], inv[N], acc[N];
  bool recip = true;
  HWY_ALIGN float sb[hn::MaxLanes(df)], zb[hn::MaxLanes(df)];
  for (int u = 0; u < N; ++u) {
    for (int j = 0; j < L; ++j) {
      const int c = std::min(j, tk[u].m - 1);  // spare lanes repeat the last candidate
      sb[j] = tk[u].s[c];
      zb[j] = asym ? tk[u].z[c] : 0.0f;
    }
    sv[u] = hn::Load(df, sb);
    zv[u] = hn::Load(df, zb);
    // A zero scale decodes every code to z: r * 0 + z is z (or a zero when z is one),
    // so x - that has the reference's square whatever the code; the quotient's lane
    // divides by 1 instead (no 0/0).
    sdiv[u] = hn::IfThenElse(hn::Eq(sv[u], zero), one, sv[u]);
    inv[u] = hn::Div(one, sdiv[u]);
    recip =
        recip && hn::AllTrue(df, hn::And(hn::IsFinite(inv[u]), hn::Ge(hn::Abs(inv[u]), hn::Set(df, 1.17549435e-38f))));
    acc[u] = zero;
  }
  // The code: the quotient rounded half away from zero, then clamped to [lo, hi]. The
  // reference clamps the quotient to [lo - 1, hi + 1] first; rounding is monotone and
  // maps that range's ends to integers outside [lo, hi], so the final clamp gives the
  // same code without it (an infinite quotient: its fraction is NaN, no step, clamped).
  const auto sums = [&](auto recip_c) {
    constexpr bool kRecip = decltype(recip_c)::value;
    const auto code = [&](V num, int u) {
      V v = kRecip ? hn::Mul(num, inv[u]) : hn::Div(num, sdiv[u]);
      V t = hn::Trunc(v);  // a -0 for -1 < v < 0: t + 0 below is +0 all the same
      V afr = hn::Abs(hn::Sub(v, t));
      if (kRecip && !hn::AllFalse(df, hn::Le(hn::Abs(hn::Sub(afr, half)), tol))) {
        v = hn::Div(num, sdiv[u]);  // near a breakpoint: the rounded quotient
        t = hn::Trunc(v);
        afr = hn::Abs(hn::Sub(v, t));
      }
      // Round half away from zero: |fraction| >= 1/2 steps away from zero (its sign is v's).
      const V r = hn::IfThenElse(hn::Ge(afr, half), hn::Add(t, hn::CopySign(one, v)), t);
      return hn::Min(hn::Max(r, rlo), rhi);
    };
    for (int64_t i = 0; i < n; ++i) {
      for (int u = 0; u < N; ++u) {
        const V xv = hn::Set(df, tk[u].x[i]);
        const V r = code(hn::Sub(xv, zv[u]), u);
        const V d = hn::Sub(xv, hn::Add(hn::Mul(r, sv[u]), zv[u]));
        acc[u] = hn::Add(acc[u], hn::Mul(d, d));
      }
    }
  };
  if (recip)
    sums(std::true_type{});
  else
    sums(std::false_type{});
  HWY_ALIGN float eb[hn::MaxLanes(df)];
  for (int u = 0; u < N; ++u) {
    hn::Store(acc[u], df, eb);
    std::copy_n(eb, tk[u].m, tk[u].err);
  }
}

void BlockErrorsBatchImpl(const float* x, int64_t nblocks, int64_t bs, int qmax, bool asym, const float* s_eff,
                          const float* z_eff, int64_t stride, const int* m, float* err) {
  constexpr int64_t kStride = residual_impl::kScaleSearchSteps;
  const int L = int(hn::Lanes(hn::ScalableTag<float>()));
  ErrTask tk[kErrTasks];
  int k = 0;
  for (int64_t b = 0; b < nblocks; ++b) {
    const int mb = m ? m[b] : int(kStride);
    for (int c0 = 0; c0 < mb; c0 += L) {
      tk[k++] = {x + b * bs, s_eff + b * stride + c0, asym ? z_eff + b * stride + c0 : nullptr, err + b * kStride + c0,
                 std::min(L, mb - c0)};
      if (k == kErrTasks) {
        ErrTasksN<kErrTasks>(tk, bs, qmax, asym);
        k = 0;
      }
    }
  }
  for (int u = 0; u < k; ++u) ErrTasksN<1>(tk + u, bs, qmax, asym);
}

void BlockErrorsImpl(const float* x, int64_t n, int qmax, bool asym, const float* s_eff, const float* z_eff, int ncand,
                     float* err) {
  const int L = int(hn::Lanes(hn::ScalableTag<float>()));
  for (int c0 = 0; c0 < ncand; c0 += L) {
    const ErrTask t{x, s_eff + c0, asym ? z_eff + c0 : nullptr, err + c0, std::min(L, ncand - c0)};
    ErrTasksN<1>(&t, n, qmax, asym);
  }
}

// The scale search's candidates, candidate k in lane k: residual_impl::
// scale_search_candidate's operations in lanes (the stored formats' conversions as
// integer operations with the scalar definitions' rounding), so the bits equal it.

// numeric_impl::f32_to_fp8e4m3: nearest even, |x| >= 448 (and inf) saturate to 0x7E,
// NaN to 0x7F, below 2^-6 the subnormals: |x| * 2^9 (exact) rounded to nearest even.
template <class DF, class VF>
hn::Vec<hn::RebindToUnsigned<DF>> E4M3Bits(DF df, VF x) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(du, x);
  const auto sign = hn::And(hn::ShiftRight<24>(u), hn::Set(du, 0x80u));
  const auto a = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  auto v = hn::Sub(a, hn::Set(du, 120u << 23));  // rebias (normal range; wraps below it, not used there)
  v = hn::Add(v, hn::Add(hn::Set(du, 0x7FFFFu), hn::And(hn::ShiftRight<20>(v), hn::Set(du, 1u))));
  auto r = hn::Min(hn::ShiftRight<20>(v), hn::Set(du, 0x7Eu));
  const auto sub = hn::BitCast(du, hn::ConvertTo(di, hn::Round(hn::Mul(hn::Abs(x), hn::Set(df, 512.0f)))));
  const auto ai = hn::BitCast(di, a);  // the magnitude's bits compare as signed integers (sign cleared)
  r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 121 << 23))), sub, r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x43E00000 - 1))), hn::Set(du, 0x7Eu), r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))), hn::Set(du, 0x7Fu), r);
  return hn::Or(r, sign);
}
// numeric_impl::fp8e4m3_to_f32 (as its branch-free form fp8e4m3_to_f32_scaled).
template <class DF, class VU>
hn::Vec<DF> E4M3Value(DF df, VU b) {
  const hn::RebindToUnsigned<DF> du;
  const auto m = hn::And(b, hn::Set(du, 0x7Fu)), sign = hn::ShiftLeft<24>(hn::And(b, hn::Set(du, 0x80u)));
  const auto mag = hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(m)), hn::Set(df, 0x1p120f));
  const auto v = hn::Or(hn::BitCast(du, mag), sign);
  return hn::BitCast(df, hn::IfThenElse(hn::Eq(m, hn::Set(du, 0x7Fu)), hn::Or(sign, hn::Set(du, 0x7FC00000u)), v));
}
// numeric_impl::f32_to_bf16 (nearest even; a NaN quieted) and bf16_to_f32.
template <class DF, class VF>
hn::Vec<hn::RebindToUnsigned<DF>> Bf16Bits(DF, VF x) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, x);
  const auto hi = hn::ShiftRight<16>(u);
  const auto r = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hi, hn::Set(du, 1u)))));
  const hn::RebindToSigned<DF> di;
  const auto a = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7FFFFFFFu)));
  const auto nan = hn::RebindMask(du, hn::Gt(a, hn::Set(di, 0x7F800000)));
  return hn::IfThenElse(nan, hn::Or(hi, hn::Set(du, 0x0040u)), r);
}
template <class DF, class VU>
hn::Vec<DF> Bf16Value(DF df, VU b) {
  return hn::BitCast(df, hn::ShiftLeft<16>(b));
}

void ScaleCandidatesImpl(const float* raw_s, const float* lo, const float* hi, int64_t nblocks, bool asym, bool divide,
                         float g, float gz, bool fp8, uint32_t* s_bits, uint32_t* z_bits, float* s_eff, float* z_eff) {
  namespace R = residual_impl;
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const int64_t L = int64_t(hn::Lanes(df));
  constexpr int64_t S = kCandidateStride;
  static_assert(S >= R::kScaleSearchSteps);
  static_assert(HWY_MAX_BYTES / sizeof(float) <= size_t(S), "a vector's stores stay inside a block's slots");
  // The factors f and (1 - f) / 2 of every lane, as the scalar rule forms them.
  HWY_ALIGN float fk[S], wk[S];
  for (int k = 0; k < S; ++k) {
    fk[k] = R::scale_search_factor(k);
    wk[k] = R::mul_rn(R::sub_rn(1.0f, fk[k]), 0.5f);
  }
  const auto vg = hn::Set(df, g), vgz = hn::Set(df, gz);
  const auto store = [&](auto x, auto factor) {  // stored bits and effective value of x
    const auto st = divide ? hn::Div(x, factor) : x;
    const auto bits = fp8 ? E4M3Bits(df, st) : Bf16Bits(df, st);
    return std::make_pair(bits, hn::Mul(fp8 ? E4M3Value(df, bits) : Bf16Value(df, bits), factor));
  };
  for (int64_t b = 0; b < nblocks; ++b)
    for (int64_t k0 = 0; k0 < R::kScaleSearchSteps; k0 += L) {  // lanes past the last candidate: unused values
      const int64_t o = b * S + k0;
      const auto [sb, se] = store(hn::Mul(hn::Set(df, raw_s[b]), hn::Load(df, fk + k0)), vg);
      hn::StoreU(sb, du, s_bits + o);
      hn::StoreU(se, df, s_eff + o);
      if (asym) {
        const auto cz =
            hn::Add(hn::Set(df, lo[b]), hn::Mul(hn::Set(df, R::sub_rn(hi[b], lo[b])), hn::Load(df, wk + k0)));
        const auto [zb, ze] = store(cz, vgz);
        hn::StoreU(zb, du, z_bits + o);
        hn::StoreU(ze, df, z_eff + o);
      }
    }
}

QVG_CPU_KERNELS_END
