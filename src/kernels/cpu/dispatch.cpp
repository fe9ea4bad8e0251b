// src/kernels/cpu/dispatch.cpp — the CPU kernels of src/kernels/kernels.h: every
// op's -inl.h compiled once per SIMD target (Highway foreach_target), exported,
// and dispatched at run time to the best target of the machine (or the one a test
// forces). One translation unit for the whole kernel set, so that one target
// table serves every op.
//
// Ops, one per header: assign-inl.h (k-means assignment), attention-inl.h,
// convert-inl.h (bf16 <-> fp32), codes-inl.h (code packing, spec 1.5),
// decode-inl.h, encode-inl.h (centroid sums, block
// statistics, residual quantizer), limits-inl.h (input-limit scan).

#include "kernels/cpu/targets.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/dispatch.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Each -inl.h is included here once per target (no per-target include guards);
// the shared pieces come first (their order matters: clang-format must not sort them).
// clang-format off
#include "kernels/cpu/blocked_product-inl.h"  // used by assign and attention
#include "kernels/cpu/convert-inl.h"          // used by decode
#include "kernels/cpu/codes-inl.h"            // code packing: used by decode and encode
#include "kernels/cpu/assign-inl.h"
#include "kernels/cpu/attention-inl.h"
#include "kernels/cpu/decode-inl.h"
#include "kernels/cpu/encode-inl.h"
#include "kernels/cpu/limits-inl.h"
// clang-format on

#include <atomic>

#include "kernels/kernels.h"

QVG_CPU_KERNELS_BEGIN
const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }
QVG_CPU_KERNELS_END

#if HWY_ONCE
namespace qvg {
namespace kernels {

HWY_EXPORT(AccumulateClustersImpl);
HWY_EXPORT(AddRowsF64Impl);
HWY_EXPORT(AssignNearestImpl);
HWY_EXPORT(AttentionHeadImpl);
HWY_EXPORT(Bf16ToF32Impl);
HWY_EXPORT(Bf16ErrorRowImpl);
HWY_EXPORT(BlockAbsMaxImpl);
HWY_EXPORT(BlockErrorsBatchImpl);
HWY_EXPORT(BlockErrorsImpl);
HWY_EXPORT(BlockMinMaxImpl);
HWY_EXPORT(DecodeRowsImpl);
HWY_EXPORT(F32ToBf16Impl);
HWY_EXPORT(FirstOutOfLimitImpl);
HWY_EXPORT(KeyPaddingImpl);
HWY_EXPORT(QuantizeRowsImpl);
HWY_EXPORT(ScaleCandidatesImpl);
HWY_EXPORT(TargetNameImpl);

int64_t assign_nearest(const float* x, int64_t n, int64_t dim, const float* c, int k, uint8_t* ids, bool first) {
  return HWY_DYNAMIC_DISPATCH(AssignNearestImpl)(x, n, dim, c, k, ids, first);
}

void decode_rows(const DecodeRows& job) {
  HWY_DYNAMIC_DISPATCH(DecodeRowsImpl)(job);
}

void accumulate_clusters(const float* x, int64_t n, int64_t dim, const uint8_t* ids, double* sum, int64_t* cnt) {
  HWY_DYNAMIC_DISPATCH(AccumulateClustersImpl)(x, n, dim, ids, sum, cnt);
}
void add_rows_f64(const float* x, int64_t n, int64_t dim, const float* minus, double* sum) {
  HWY_DYNAMIC_DISPATCH(AddRowsF64Impl)(x, n, dim, minus, sum);
}
void block_absmax(const float* x, int64_t nblocks, int64_t bs, float* amax) {
  HWY_DYNAMIC_DISPATCH(BlockAbsMaxImpl)(x, nblocks, bs, amax);
}
void block_errors(const float* x, int64_t n, int qmax, bool asym, const float* s_eff, const float* z_eff, int ncand,
                  float* err) {
  HWY_DYNAMIC_DISPATCH(BlockErrorsImpl)(x, n, qmax, asym, s_eff, z_eff, ncand, err);
}
void block_errors_batch(const float* x, int64_t nblocks, int64_t bs, int qmax, bool asym, const float* s_eff,
                        const float* z_eff, int64_t stride, const int* m, float* err) {
  HWY_DYNAMIC_DISPATCH(BlockErrorsBatchImpl)(x, nblocks, bs, qmax, asym, s_eff, z_eff, stride, m, err);
}
void scale_candidates(const float* raw_s, const float* lo, const float* hi, int64_t nblocks, bool asym, bool divide,
                      float g, float gz, bool fp8, uint32_t* s_bits, uint32_t* z_bits, float* s_eff, float* z_eff) {
  HWY_DYNAMIC_DISPATCH(ScaleCandidatesImpl)
  (raw_s, lo, hi, nblocks, asym, divide, g, gz, fp8, s_bits, z_bits, s_eff, z_eff);
}
void block_minmax(const float* x, int64_t nblocks, int64_t bs, float* lo, float* hi) {
  HWY_DYNAMIC_DISPATCH(BlockMinMaxImpl)(x, nblocks, bs, lo, hi);
}
void quantize_rows(const float* r, int64_t count, int64_t dim, int64_t block, int bits, bool asym, const float* s_eff,
                   const float* z_eff, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowsImpl)(r, count, dim, block, bits, asym, s_eff, z_eff, codes);
}

void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToBf16Impl)(src, dst, n);
}
void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(Bf16ToF32Impl)(src, dst, n);
}
bool bf16_error_row(const uint16_t* x, const uint16_t* y, size_t n, float lim, float* out) {
  return HWY_DYNAMIC_DISPATCH(Bf16ErrorRowImpl)(x, y, n, lim, out);
}

void attention_head(const float* q, int64_t n, const float* kT, int64_t tpad, int64_t T, const float* v, int64_t D,
                    float scale, float* out, int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(AttentionHeadImpl)(q, n, kT, tpad, T, v, D, scale, out, out_stride);
}
int64_t attention_key_padding() {
  return HWY_DYNAMIC_DISPATCH(KeyPaddingImpl)();
}

size_t first_out_of_limit(const void* p, DType t, size_t n) {
  return HWY_DYNAMIC_DISPATCH(FirstOutOfLimitImpl)(p, t, n);
}

// ---- targets ------------------------------------------------------------------------

std::vector<Target> available_targets() {
  std::vector<Target> out;
  // Lower bits are better targets in Highway's encoding: best first.
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.push_back({t, hwy::TargetName(t)});
  return out;
}

void force_target(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
}

std::string current_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetNameImpl)();
}

// ---- native bf16 conversion ----------------------------------------------------------

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
void allow_native_bf16(bool allow) {
  g_allow_native_bf16.store(allow);
}
bool native_bf16_enabled() {
  return g_allow_native_bf16.load(std::memory_order_relaxed) && native_bf16_available();
}

}  // namespace kernels
}  // namespace qvg
#endif  // HWY_ONCE
