// src/kernels/cuda/bodies.cuh — the per-thread bodies of the decode and residual
// quantizer kernels, as __host__ __device__ functions over plain structs.
//
// The kernels only map blocks and threads to (task, group, token, channel) and
// call these bodies; tests/gpu/host_arith_test.cpp runs the same bodies on the
// host over every element of CPU-encoded tensors and compares the bytes with the
// CPU codec (decode_rows_reference, quantize_residual_group). What the host test
// cannot cover is the block/thread mapping of the kernels themselves (GPU tests).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/arith.cuh"

namespace qvg::cuda::kernels {

/// One decode range: tokens [t0, t1) and heads [h0, h1) of one encoded tensor.
/// Arrays as in spec 1.5 (device pointers, each 16-byte aligned); stage s of ids
/// and centroids at ids + s * ids_stage_stride bytes and centroid + s *
/// centroid_stage_stride bytes.
struct DecodeArgs {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zeros = nullptr;          ///< asymmetric only
  const float* scale_factor = nullptr;     ///< [G] two_level only (else factor 1)
  const float* zero_factor = nullptr;      ///< [G] two_level and asymmetric only
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
  int64_t batch_stride = 0;   ///< elements
  int64_t token_stride = 0;   ///< elements
};

/// Arguments of the residual quantize-and-pack kernels (device pointers).
struct QuantizeArgs {
  const float* r = nullptr;  ///< [G, S, D] final residual
  int64_t G = 0, S = 0, D = 0;
  int bits = 4, block = 64;
  bool asymmetric = false, fp8 = true, two_level = true;
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  uint8_t* zeros = nullptr;
  float* scale_factor = nullptr;  ///< [G], two_level only
  float* zero_factor = nullptr;   ///< [G], two_level and asymmetric only
  float* raw_s = nullptr;         ///< scratch: G * S * D/block
  float* raw_z = nullptr;         ///< scratch: as raw_s, asymmetric only
  float* group_max = nullptr;     ///< scratch: 2 * G (largest raw scale, then largest |zero|)
};

/// 16 bytes, loaded with one 128-bit load on the device.
struct alignas(16) Word4 {
  uint32_t v[4];
};
/// An aligned load of a T at p: one native load on the device; memcpy on the host
/// (the host tests of these bodies use unaligned buffers).
template <class T>
QVG_HD T load_as(const void* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const T*>(p);
#else
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
  std::memcpy(p, &v, sizeof(T));
#endif
}
QVG_HD Word4 load_word4(const void* p) { return load_as<Word4>(p); }
QVG_HD void store_word4(void* p, const Word4& w) { store_as(p, w); }
QVG_HD uint32_t load_u32(const uint8_t* p) { return load_as<uint32_t>(p); }
QVG_HD uint32_t load_u16(const uint8_t* p) { return load_as<uint16_t>(p); }

/// Whether a task can use decode_vec8 (8 channels per thread) and aligned 16-byte stores.
QVG_HD bool task_vectorizable(const DecodeArgs& t) { return t.D % 8 == 0 && t.block % 8 == 0; }

/// The effective scale and zero (spec 1.4) of block `blk` of row `row` (= g * S + t)
/// of group g.
struct BlockScale {
  float s_eff = 0.0f, z_eff = 0.0f;
};
QVG_HD BlockScale block_scale(const DecodeArgs& T, int64_t g, int64_t row, int64_t blk) {
  namespace A = qvg::cuda_arith;
  const bool fp8 = T.fp8 != 0;
  const int64_t si = row * (T.D / T.block) + blk;
  BlockScale r;
  r.s_eff = A::effective(A::stored_value(T.scales, fp8, si), T.scale_factor ? T.scale_factor[g] : 1.0f);
  if (T.asymmetric) r.z_eff = A::effective(A::stored_value(T.zeros, fp8, si), T.zero_factor ? T.zero_factor[g] : 1.0f);
  return r;
}

/// Decodes channels [8c, 8c + 8) of token t (absolute) of group g = b * H + h and
/// writes them to the task's target (spec 1.3 arithmetic, order of
/// decode_rows_reference). REQUIRES task_vectorizable(T). `vstore`: the target
/// row is 16-byte aligned (one or two 128-bit stores), else element stores.
QVG_HD void decode_vec8(const DecodeArgs& T, int b, int h, int t, int c, bool vstore) {
  namespace A = qvg::cuda_arith;
  const int64_t g = int64_t(b) * T.H + h;
  const int D = T.D, bits = T.bits;
  const bool asym = T.asymmetric != 0;
  const int qmax = A::qmax_of(bits, asym);
  const int64_t row = g * T.S + t;
  const uint8_t* crow = T.codes + row * (int64_t(D) * bits / 8);
  const uint32_t word = bits == 4 ? load_u32(crow + c * 4) : load_u16(crow + c * 2);
  const BlockScale sc = block_scale(T, g, row, (c * 8) / T.block);
  float acc[8];
QVG_UNROLL
  for (int i = 0; i < 8; ++i) acc[i] = A::dequant(A::code_of_word(word, bits, i), qmax, asym, sc.s_eff, sc.z_eff);
  const int esz = T.centroid_dtype == A::kF32 ? 4 : 2;
  for (int s = 0; s < T.stages; ++s) {
    const int id = T.ids[s * T.ids_stage_stride + row];
    const uint8_t* cp = T.centroid + s * T.centroid_stage_stride + ((g * T.K + id) * D + c * 8) * esz;
    if (T.centroid_dtype == A::kF32) {
      const Word4 w0 = load_word4(cp), w1 = load_word4(cp + 16);
QVG_UNROLL
      for (int i = 0; i < 4; ++i) {
        acc[i] = A::add_rn(acc[i], A::from_bits(w0.v[i]));
        acc[4 + i] = A::add_rn(acc[4 + i], A::from_bits(w1.v[i]));
      }
    } else {
      const Word4 w = load_word4(cp);
QVG_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint16_t lo = uint16_t(w.v[i] & 0xFFFFu), hi = uint16_t(w.v[i] >> 16);
        const bool bf = T.centroid_dtype == A::kBF16;
        acc[2 * i] = A::add_rn(acc[2 * i], bf ? A::bf16_to_f32(lo) : A::f16_to_f32(lo));
        acc[2 * i + 1] = A::add_rn(acc[2 * i + 1], bf ? A::bf16_to_f32(hi) : A::f16_to_f32(hi));
      }
    }
  }
  const int64_t e = int64_t(b) * T.batch_stride + int64_t(t - T.t0) * T.token_stride + int64_t(h - T.h0) * D + c * 8;
  if (T.out_dtype == A::kF32) {
    float* p = static_cast<float*>(T.out) + e;
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
      for (int i = 0; i < 8; ++i) p[i] = acc[i];
    }
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(T.out) + e;
  uint32_t hv[8];
QVG_UNROLL
  for (int i = 0; i < 8; ++i) hv[i] = A::encode_elem(acc[i], T.out_dtype);
  if (vstore) {
    Word4 w;
QVG_UNROLL
    for (int i = 0; i < 4; ++i) w.v[i] = hv[2 * i] | (hv[2 * i + 1] << 16);
    store_word4(p, w);
  } else {
QVG_UNROLL
    for (int i = 0; i < 8; ++i) p[i] = uint16_t(hv[i]);
  }
}

/// Decodes channel d of token t of group (b, h) into the task's target (any D/block).
QVG_HD void decode_one(const DecodeArgs& T, int b, int h, int t, int d) {
  namespace A = qvg::cuda_arith;
  const int64_t g = int64_t(b) * T.H + h;
  const int D = T.D, bits = T.bits;
  const bool asym = T.asymmetric != 0;
  const int64_t row = g * T.S + t;
  const BlockScale sc = block_scale(T, g, row, d / T.block);
  float acc = A::dequant(A::code_of_row(T.codes + row * (int64_t(D) * bits / 8), bits, d), A::qmax_of(bits, asym),
                         asym, sc.s_eff, sc.z_eff);
  for (int s = 0; s < T.stages; ++s) {
    const int id = T.ids[s * T.ids_stage_stride + row];
    acc = A::add_rn(acc, A::load_elem(T.centroid + s * T.centroid_stage_stride, T.centroid_dtype,
                                      (g * T.K + id) * D + d));
  }
  const int64_t e = int64_t(b) * T.batch_stride + int64_t(t - T.t0) * T.token_stride + int64_t(h - T.h0) * D + d;
  if (T.out_dtype == A::kF32)
    static_cast<float*>(T.out)[e] = acc;
  else
    static_cast<uint16_t*>(T.out)[e] = uint16_t(A::encode_elem(acc, T.out_dtype));
}

/// Block statistics of one quantization block x[0..bs): the raw scale, and for
/// asymmetric blocks the raw zero (the block minimum), as quantize_residual_group.
QVG_HD void block_stats(const float* x, int bs, int qmax, bool asym, float& raw_s, float& raw_z) {
  namespace A = qvg::cuda_arith;
  if (!asym) {
    float a = 0.0f;
    for (int k = 0; k < bs; ++k) a = A::max_f(a, A::abs_f(x[k]));
    raw_s = A::raw_scale_sym(a, qmax);
    raw_z = 0.0f;
    return;
  }
  float lo = x[0], hi = x[0];
  for (int k = 1; k < bs; ++k) {
    lo = A::min_f(lo, x[k]);
    hi = A::max_f(hi, x[k]);
  }
  raw_s = A::raw_scale_asym(lo, hi, qmax);
  raw_z = lo;
}

/// Output byte e (flat index into codes) of the quantize-and-pack pass: quantizes
/// its 8/bits channels with the stored (effective) scale and zero, writes the byte,
/// the block's stored scale/zero (first byte of a block) and the group's factors
/// (first byte of a group). REQUIRES raw_s/raw_z/group_max filled (block_stats).
QVG_HD void pack_byte(const QuantizeArgs& a, int64_t e) {
  namespace A = qvg::cuda_arith;
  const int64_t D = a.D, S = a.S, nb = D / a.block, cbytes = D * a.bits / 8;
  const int per_byte = 8 / a.bits;
  const bool asym = a.asymmetric, fp8 = a.fp8, divide = a.two_level && a.fp8;
  const int qmax = A::qmax_of(a.bits, asym);
  const int64_t j = e % cbytes, gt = e / cbytes;
  const int64_t g = gt / S, t = gt % S;
  const int64_t d0 = j * per_byte, k = d0 / a.block;
  const int64_t si = gt * nb + k;
  const float gf = divide ? A::two_level_factor(a.group_max[g]) : 1.0f;
  const float gz = divide && asym ? A::two_level_factor(a.group_max[a.G + g]) : 1.0f;
  const uint32_t s_st = A::store_format(A::to_store(a.raw_s[si], divide, gf), fp8);
  const float s_eff = A::effective(A::format_value(s_st, fp8), gf);
  float z_eff = 0.0f;
  uint32_t z_st = 0;
  if (asym) {
    z_st = A::store_format(A::to_store(a.raw_z[si], divide, gz), fp8);
    z_eff = A::effective(A::format_value(z_st, fp8), gz);
  }
  const float* x = a.r + gt * D + d0;
  unsigned byte = 0;
  for (int u = 0; u < per_byte; ++u)
    byte = (byte << a.bits) | unsigned(A::quantize_code(x[u], qmax, asym, s_eff, z_eff));
  a.codes[e] = uint8_t(byte);
  if (d0 % a.block == 0) {
    A::put_stored(a.scales, fp8, si, s_st);
    if (asym) A::put_stored(a.zeros, fp8, si, z_st);
  }
  if (t == 0 && j == 0 && a.two_level) {
    a.scale_factor[g] = gf;
    if (asym) a.zero_factor[g] = gz;
  }
}

}  // namespace qvg::cuda::kernels
