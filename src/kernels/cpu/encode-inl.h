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

// Candidates in lanes (lane j: candidate c0 + j), channels in order: every lane runs
// residual_impl::block_sq_error's operations, so the bits do not depend on the width.
void BlockErrorsImpl(const float* x, int64_t n, int qmax, bool asym, const float* s_eff, const float* z_eff, int ncand,
                     float* err) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int L = int(hn::Lanes(df));
  const float hi = float(qmax), lo = asym ? 0.0f : -hi;
  const auto vlo = hn::Set(df, lo - 1.0f), vhi = hn::Set(df, hi + 1.0f), rlo = hn::Set(df, lo), rhi = hn::Set(df, hi);
  const auto zero = hn::Zero(df), one = hn::Set(df, 1.0f), neg_one = hn::Set(df, -1.0f);
  const auto half = hn::Set(df, 0.5f), neg_half = hn::Set(df, -0.5f);
  HWY_ALIGN float sb[hn::MaxLanes(df)], zb[hn::MaxLanes(df)], eb[hn::MaxLanes(df)];
  for (int c0 = 0; c0 < ncand; c0 += L) {
    const int m = std::min(L, ncand - c0);
    for (int j = 0; j < L; ++j) {
      const int c = c0 + std::min(j, m - 1);
      sb[j] = s_eff[c];
      zb[j] = asym ? z_eff[c] : 0.0f;
    }
    const auto sv = hn::Load(df, sb), zv = hn::Load(df, zb);
    const auto s_zero = hn::Eq(sv, zero);
    const auto sdiv = hn::IfThenElse(s_zero, one, sv);  // no 0/0 in the lanes that do not use it
    // The quotient (x - z) / s decides only the code, round-half-away-from-zero of the
    // clamped quotient, whose breakpoints are the half-integers. (x - z) * (1 / s) is
    // within 2^-23 relative of the rounded quotient, so it gives the same code unless it
    // lies within `tol` of a half-integer (|quotient| <= 17 after the clamp: 2^-16 is
    // several times that bound); such an element (rare) takes the division. Needs 1 / s
    // normal in every lane (tiny or huge scales: the division throughout).
    const auto inv = hn::Div(one, sdiv);
    const bool recip = hn::AllTrue(df, hn::And(hn::IsFinite(inv), hn::Ge(hn::Abs(inv), hn::Set(df, 1.17549435e-38f))));
    const auto tol = hn::Set(df, 0x1p-16f);
    auto acc = zero;
    for (int64_t i = 0; i < n; ++i) {
      const auto xv = hn::Set(df, x[i]);
      const auto num = hn::Sub(xv, zv);
      auto v = hn::Min(hn::Max(recip ? hn::Mul(num, inv) : hn::Div(num, sdiv), vlo), vhi);
      if (recip) {
        const auto fr0 = hn::Sub(v, hn::ConvertTo(df, hn::ConvertTo(di, v)));  // exact: |v| <= 2^bits + 1
        if (!hn::AllFalse(df, hn::Le(hn::Abs(hn::Sub(hn::Abs(fr0), half)), tol)))
          v = hn::Min(hn::Max(hn::Div(num, sdiv), vlo), vhi);  // near a breakpoint: the rounded quotient
      }
      const auto t = hn::ConvertTo(df, hn::ConvertTo(di, v));
      const auto fr = hn::Sub(v, t);
      const auto adj = hn::IfThenElse(hn::Ge(fr, half), one, hn::IfThenElseZero(hn::Le(fr, neg_half), neg_one));
      const auto r = hn::Min(hn::Max(hn::Add(t, adj), rlo), rhi);
      const auto deq = hn::IfThenElse(s_zero, zv, hn::Add(hn::Mul(r, sv), zv));
      const auto d = hn::Sub(xv, deq);
      acc = hn::Add(acc, hn::Mul(d, d));
    }
    hn::Store(acc, df, eb);
    for (int j = 0; j < m; ++j) err[c0 + j] = eb[j];
  }
}

QVG_CPU_KERNELS_END
