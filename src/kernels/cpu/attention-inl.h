// src/kernels/cpu/attention-inl.h — attention of one (batch, head)
// (kernels::attention_head), per SIMD target. Included once per SIMD target by dispatch.cpp
// (its foreach_target pass), which has no per-target include guard for it.
//
// Scores are a register-blocked product of P queries with NV vectors of keys
// (keys transposed), the softmax subtracts the row maximum and uses Highway's
// Exp, and the weighted sum of values is a second blocked product. Each output
// element is computed by one thread in a fixed order: the result does not depend
// on the thread count (it may differ from the scalar formula in the last bits).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/cpu/targets.h"  // QVG_CPU_KERNELS_BEGIN / END
// Requires blocked_product-inl.h, included before it by dispatch.cpp.

QVG_CPU_KERNELS_BEGIN

constexpr int kP = 4;  // queries per register block

template <int NV>
void ScoresBlock(const float* const* qp, const float* kT, int64_t tpad, int64_t D, float* s /* kP x tpad */) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t t0 = 0; t0 < tpad; t0 += NV * L) {
    V acc[kP][NV];
    BlockedProduct<kP, NV>(df, qp, kT, tpad, t0, D, acc);
    for (int p = 0; p < kP; ++p)
      for (int v = 0; v < NV; ++v) hn::StoreU(acc[p][v], df, s + p * tpad + t0 + v * L);
  }
}

template <int NV>
void WeightedSum(const float* s /* kP x tpad, probabilities */, int64_t tpad, int64_t T, const float* v, int64_t D,
                 float* o /* kP x D */) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t d0 = 0;
  for (; d0 + NV * L <= D; d0 += NV * L) {
    V acc[kP][NV];
    for (int p = 0; p < kP; ++p)
      for (int u = 0; u < NV; ++u) acc[p][u] = hn::Zero(df);
    for (int64_t t = 0; t < T; ++t) {
      V vv[NV];
      for (int u = 0; u < NV; ++u) vv[u] = hn::LoadU(df, v + t * D + d0 + u * L);
      for (int p = 0; p < kP; ++p) {
        const V pv = hn::Set(df, s[p * tpad + t]);
        for (int u = 0; u < NV; ++u) acc[p][u] = hn::MulAdd(pv, vv[u], acc[p][u]);
      }
    }
    for (int p = 0; p < kP; ++p)
      for (int u = 0; u < NV; ++u) hn::StoreU(acc[p][u], df, o + p * D + d0 + u * L);
  }
  for (; d0 < D; ++d0) {  // channels past the last full block: scalar, same order over t
    for (int p = 0; p < kP; ++p) {
      float a = 0.0f;
      for (int64_t t = 0; t < T; ++t) a += s[p * tpad + t] * v[t * D + d0];
      o[p * D + d0] = a;
    }
  }
}

void AttentionHeadImpl(const float* q, int64_t n, const float* kT, int64_t tpad, int64_t T, const float* v, int64_t D,
                       float scale, float* out, int64_t out_stride) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  std::vector<float> s(static_cast<size_t>(kP * tpad)), o(static_cast<size_t>(kP * D));
  std::vector<float> zero(static_cast<size_t>(D), 0.0f);
  for (int64_t i0 = 0; i0 < n; i0 += kP) {
    const float* qp[kP];
    for (int p = 0; p < kP; ++p) qp[p] = i0 + p < n ? q + (i0 + p) * D : zero.data();
#if HWY_MAX_BYTES >= 64
    ScoresBlock<4>(qp, kT, tpad, D, s.data());
#else
    ScoresBlock<3>(qp, kT, tpad, D, s.data());
#endif
    // Softmax numerators over the T real keys.
    const V vscale = hn::Set(df, scale);
    for (int p = 0; p < kP; ++p) {
      float* sp = s.data() + p * tpad;
      V mv = hn::Set(df, -INFINITY);
      int64_t t = 0;
      for (; t + L <= T; t += L) {
        const V x = hn::Mul(hn::LoadU(df, sp + t), vscale);
        hn::StoreU(x, df, sp + t);
        mv = hn::Max(mv, x);
      }
      float m = hn::GetLane(hn::MaxOfLanes(df, mv));
      for (; t < T; ++t) {
        sp[t] = sp[t] * scale;
        m = std::max(m, sp[t]);
      }
      const V vm = hn::Set(df, m);
      V lv = hn::Zero(df);
      t = 0;
      for (; t + L <= T; t += L) {
        const V e = hn::Exp(df, hn::Sub(hn::LoadU(df, sp + t), vm));
        hn::StoreU(e, df, sp + t);
        lv = hn::Add(lv, e);
      }
      float l = hn::GetLane(hn::SumOfLanes(df, lv));
      for (; t < T; ++t) {
        sp[t] = std::exp(sp[t] - m);
        l += sp[t];
      }
      // Normalise the probabilities once (T multiplies instead of D divides per key).
      const float inv = 1.0f / l;
      for (t = 0; t < T; ++t) sp[t] *= inv;
    }
#if HWY_MAX_BYTES >= 64
    WeightedSum<4>(s.data(), tpad, T, v, D, o.data());
#else
    WeightedSum<2>(s.data(), tpad, T, v, D, o.data());
#endif
    for (int p = 0; p < kP && i0 + p < n; ++p) std::copy_n(o.data() + p * D, D, out + (i0 + p) * out_stride);
  }
}

int64_t KeyPaddingImpl() {
  const hn::ScalableTag<float> df;
#if HWY_MAX_BYTES >= 64
  return 4 * int64_t(hn::Lanes(df));
#else
  return 3 * int64_t(hn::Lanes(df));
#endif
}

QVG_CPU_KERNELS_END
