// Host-side tests of the CUDA bodies' width-dependent parts, for every row
// of qvg/code_format.h (int2, int3, int4), no GPU needed. The reference is written
// here from the spec's text, independently of the table and of the bodies:
// - the spec 1.5 packing (int4: byte j = code[2j] << 4 | code[2j+1]; int2: four codes
//   per byte; int3: V = sum code[8g+i] << (21 - 3i), bytes V >> 16, V >> 8, V) and
//   the spec 1.2 qmax (2^(bits-1) - 1, or 2^bits - 1 asymmetric);
// - the code words of the vectorised bodies (load_code_word / code_of_word /
//   store_code_word, pack8) against it, at aligned and (int3) unaligned addresses,
//   and qvg::code_at / residual_impl::code_of_row beside them;
// - the quantizer's passes (statistics, stored scales, pack_word / pack_group_at) and
//   the scale search (search_block) against a spec 1.2/1.4 quantizer written here;
// - whole decode launches (plan_decode's launches, every block and thread, through
//   with_decode_mode: all 108 vectorised instantiations — each width, scale format,
//   centroid and output dtype, and a refinement layer of each width — and the generic
//   path) on random encodings against a spec 1.3 decode written here.
// Randomized, bit for bit. The CPU codec is not used here (an independent reference);
// tests/gpu/host_arith_test.cpp checks the same bodies against it, every width.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/harness.h"
#include "gpu/host_launch.h"
#include "kernels/cuda/arith.cuh"
#include "kernels/cuda/bodies.cuh"
#include "kernels/cuda/encode_bodies.cuh"
#include "kernels/cuda/span_bodies.cuh"
#include "qvg/code_format.h"
#include "qvg/error.h"

namespace A = qvg::cuda_arith;
namespace K = qvg::cuda::kernels;

namespace {

// ---- the reference: spec 1.2 / 1.5, written from the text ---------------------------

int spec_qmax(int bits, bool asym) {
  return asym ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
}

/// Bytes of one row of `code.size()` codes packed as spec 1.5 says.
std::vector<uint8_t> spec_pack(const std::vector<int>& code, int bits) {
  const size_t n = code.size();
  std::vector<uint8_t> out(n * size_t(bits) / 8);
  if (bits == 4) {
    for (size_t j = 0; j < n / 2; ++j) out[j] = uint8_t((code[2 * j] << 4) | code[2 * j + 1]);
  } else if (bits == 2) {
    for (size_t j = 0; j < n / 4; ++j)
      out[j] = uint8_t((code[4 * j] << 6) | (code[4 * j + 1] << 4) | (code[4 * j + 2] << 2) | code[4 * j + 3]);
  } else if (bits == 3) {
    for (size_t g = 0; g < n / 8; ++g) {
      uint32_t v = 0;
      for (int i = 0; i < 8; ++i) v |= uint32_t(code[8 * g + size_t(i)]) << (21 - 3 * i);
      out[3 * g] = uint8_t(v >> 16);
      out[3 * g + 1] = uint8_t((v >> 8) & 255);
      out[3 * g + 2] = uint8_t(v & 255);
    }
  } else {
    QVG_EXPECT(false) << "no spec packing for" << bits << "bits";
  }
  return out;
}
/// Code d of a row packed as spec 1.5 says.
int spec_unpack(const uint8_t* row, int bits, int64_t d) {
  if (bits == 4) return (d % 2) ? row[d / 2] & 15 : row[d / 2] >> 4;
  if (bits == 2) return (row[d / 4] >> (6 - 2 * (d % 4))) & 3;
  const int64_t g = d / 8;
  const uint32_t v = (uint32_t(row[3 * g]) << 16) | (uint32_t(row[3 * g + 1]) << 8) | row[3 * g + 2];
  return int((v >> (21 - 3 * (d % 8))) & 7);
}

/// The widths the table has, in order (this test covers exactly int2, int3, int4).
std::vector<int> table_widths() {
  std::vector<int> w;
  for (const qvg::CodeFormat& f : qvg::kCodeFormats) w.push_back(f.bits);
  return w;
}

/// Calls f(Width<bits>{}) for every row.
template <class F>
void for_each_width(F&& f) {
  for (int bits : table_widths()) qvg::dispatch_width(bits, f);
}

std::vector<int> random_codes(std::mt19937& rng, int64_t n, int max_code) {
  std::uniform_int_distribution<int> u(0, max_code);
  std::vector<int> c(size_t(n), 0);
  for (int& x : c) x = u(rng);
  return c;
}

/// A 16-byte aligned buffer of n bytes (+ an offset), filled with `fill`.
struct Buf {
  std::vector<uint8_t> raw;
  uint8_t* p = nullptr;
  Buf(size_t n, size_t offset = 0, uint8_t fill = 0) : raw(n + 32 + offset, fill) {
    p = raw.data() + ((16 - reinterpret_cast<uintptr_t>(raw.data()) % 16) % 16) + offset;
  }
};

/// dst[0..src.size()) = src (out of line: GCC 12 inlined, warned of a 2^64 - 32 byte
/// copy on a path that does not exist).
[[gnu::noinline]] void copy_bytes(const std::vector<uint8_t>& src, uint8_t* dst) {
  std::memcpy(dst, src.data(), src.size());
}

}  // namespace

QVG_TEST(the_table_has_the_widths_this_test_covers) {
  QVG_EXPECT(table_widths() == std::vector<int>({2, 3, 4})) << "a new row needs its spec packing here";
  for_each_width([](auto w) {
    using W = decltype(w);
    QVG_EXPECT(W::kQmaxSym == spec_qmax(W::kBits, false) && W::kQmaxAsym == spec_qmax(W::kBits, true)) << W::kBits;
    QVG_EXPECT(K::kCodeWordBytes<W> == W::kBits) << "8 codes of" << W::kBits << "bits";
    QVG_EXPECT(K::kCodeWordFits<W>) << W::kBits;
    QVG_EXPECT(K::code_words_decodable(W::kBits)) << W::kBits;
  });
  for (int bits : {0, 1, 5, 8, -3}) {
    QVG_EXPECT(!K::code_words_decodable(bits)) << bits;
    bool threw = false;
    try {
      qvg::dispatch_width(bits, [](auto) {});
    } catch (const qvg::InvalidArgument&) {
      threw = true;
    }
    QVG_EXPECT(threw) << "dispatch_width accepted" << bits;
  }
}

// The code words of every width against the spec's packing: rows of random codes
// packed by spec_pack; every 8-channel word loaded (load_code_word) and unpacked
// (code_of_word), built from its codes at code_word_shift and stored back
// (store_code_word): the same codes and bytes. Rows of D * bits / 8 bytes at a
// 16-byte aligned base (int2/int4 words then aligned: no misaligned access) and, for
// every width, copies at bases 1..3 bytes off, which only int3 may read (byte loads).
QVG_TEST(code_words_match_the_spec_packing) {
  std::mt19937 rng(36);
  int checked = 0;
  for_each_width([&](auto w) {
    using W = decltype(w);
    constexpr int bits = W::kBits, WB = K::kCodeWordBytes<W>;
    for (int rep = 0; rep < 40; ++rep) {
      const int64_t D = 8 * std::uniform_int_distribution<int64_t>(1, 40)(rng), rows = 5;
      const int64_t cb = D * bits / 8;
      std::vector<int> code = random_codes(rng, rows * D, (1 << bits) - 1);
      std::vector<uint8_t> bytes;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<int> one(code.begin() + r * D, code.begin() + (r + 1) * D);
        const std::vector<uint8_t> b = spec_pack(one, bits);
        bytes.insert(bytes.end(), b.begin(), b.end());
      }
      for (size_t off : {size_t(0), size_t(1), size_t(2), size_t(3)}) {
        const bool unaligned = off != 0;
        if (unaligned && W::kGroupBytes == 1) continue;  // int2/int4 words are always aligned
        Buf in(bytes.size(), off);
        copy_bytes(bytes, in.p);
        Buf out(bytes.size(), off);
        const int mis0 = K::host_misaligned_accesses();
        bool codes_ok = true, layout_ok = true, scalar_ok = true;
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* row = in.p + r * cb;
          for (int64_t d = 0; d < D; ++d) {
            const int want = code[size_t(r * D + d)];
            scalar_ok = scalar_ok && spec_unpack(row, bits, d) == want && qvg::code_at<W>(row, d) == want &&
                        A::code_of_row(row, bits, d) == want && qvg::code_at(row, bits, d) == want;
          }
          for (int64_t c = 0; c < D / 8; ++c) {
            const uint32_t word = K::load_code_word<W>(row + c * WB);
            uint32_t built = 0;
            for (int i = 0; i < 8; ++i) {
              const int want = code[size_t(r * D + c * 8 + i)];
              codes_ok = codes_ok && K::code_of_word<W>(word, i) == uint32_t(want);
              built |= uint32_t(want) << K::code_word_shift<W>(i);
            }
            layout_ok = layout_ok && built == word;
            K::store_code_word<W>(out.p + r * cb + c * WB, built);
          }
        }
        QVG_EXPECT(scalar_ok) << bits << "bits: spec_unpack / code_at / code_of_row differ from the codes";
        QVG_EXPECT(codes_ok) << bits << "bits D" << D << "offset" << off << ": code_of_word";
        QVG_EXPECT(layout_ok) << bits << "bits D" << D << "offset" << off << ": the word's register layout";
        QVG_EXPECT(std::memcmp(out.p, bytes.data(), bytes.size()) == 0) << bits << "bits D" << D << ": store_code_word";
        QVG_EXPECT(out.raw[size_t(out.p - out.raw.data()) + bytes.size()] == 0) << "store_code_word wrote past the row";
        QVG_EXPECT(K::host_misaligned_accesses() == mis0) << bits << "bits offset" << off << ": misaligned word access";
        // qvg::pack_group, group by group, gives the same bytes.
        std::vector<uint8_t> pg(bytes.size(), 0);
        for (int64_t gi = 0; gi < rows * D / W::kGroupCodes; ++gi)
          qvg::pack_group<W>(code.data() + gi * W::kGroupCodes, pg.data() + gi * W::kGroupBytes);
        QVG_EXPECT(pg == bytes) << bits << "bits: qvg::pack_group";
        ++checked;
      }
    }
  });
  std::printf("  %d packed rows checked\n", checked);
}

// pack8: the 8 codes of a word are quantize_code's (spec 1.2) at the word's layout,
// for random values, scales (including 0: the smallest-magnitude code) and zeros.
QVG_TEST(pack8_codes_are_quantize_codes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  int checked = 0;
  for_each_width([&](auto w) {
    using W = decltype(w);
    for (bool asym : {false, true}) {
      const int qmax = spec_qmax(W::kBits, asym);
      for (int rep = 0; rep < 20000; ++rep) {
        const float s = rep % 97 == 0 ? 0.0f : std::ldexp(1.0f + std::abs(n01(rng)), int(n01(rng) * 4));
        const float z = asym ? n01(rng) * 3.0f : 0.0f;
        float v[8];
        for (float& x : v) x = rep % 5 == 0 ? z + s * float(int(n01(rng) * 4)) * 0.5f : n01(rng) * s * float(qmax);
        const uint32_t word = K::pack8<W>(v, qmax, asym, s, z);
        bool ok = true;
        for (int i = 0; i < 8; ++i)
          ok = ok && K::code_of_word<W>(word, i) == uint32_t(A::quantize_code(v[i], qmax, asym, s, z));
        QVG_EXPECT(ok) << W::kBits << "bits asym" << asym << "s" << s;
        if (!ok) return;
        ++checked;
      }
    }
  });
  std::printf("  %d words\n", checked);
}

namespace {

/// A residual to quantize: r [G, S, D] and, fused, the last stage's stored centroids
/// and ids (the final residual is then r - stored[ids]).
struct QuantCase {
  int64_t G = 0, S = 0, D = 0;
  int K = 0;
  std::vector<float> r, stored;
  std::vector<uint8_t> ids;
  float x(int64_t row, int64_t d) const {
    const float v = r[size_t(row * D + d)];
    if (stored.empty()) return v;
    const int64_t g = row / S;
    return A::sub_rn(v, stored[size_t((g * K + ids[size_t(row)]) * D + d)]);
  }
};

/// What the quantizer's passes store, by spec 1.2 and 1.4, computed here.
struct QuantRef {
  std::vector<uint8_t> codes, scales, zeros;
  std::vector<float> scale_factor, zero_factor;
};
QuantRef reference_quantize(const QuantCase& q, int bits, int block, bool asym, bool fp8, bool two_level) {
  const int64_t nb = q.D / block;
  const int qmax = spec_qmax(bits, asym);
  const bool divide = two_level && fp8;
  const size_t ssz = fp8 ? 1 : 2;
  QuantRef out;
  out.scales.assign(size_t(q.G * q.S * nb) * ssz, 0);
  if (asym) out.zeros.assign(out.scales.size(), 0);
  out.scale_factor.assign(size_t(q.G), 0.0f);
  out.zero_factor.assign(size_t(q.G), 0.0f);
  for (int64_t g = 0; g < q.G; ++g) {
    std::vector<float> raw_s(size_t(q.S * nb)), raw_z(size_t(q.S * nb));
    float ms = 0.0f, mz = 0.0f;
    for (int64_t t = 0; t < q.S; ++t)
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t row = g * q.S + t;
        float lo = q.x(row, k * block), hi = lo, amax = 0.0f;
        for (int64_t d = k * block; d < (k + 1) * block; ++d) {
          const float v = q.x(row, d);
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::abs(v));
        }
        const float s = asym ? std::max((hi - lo) / float(qmax), 1e-10f) : std::max(amax, 1e-10f) / float(qmax);
        raw_s[size_t(t * nb + k)] = s;
        raw_z[size_t(t * nb + k)] = lo;
        ms = std::max(ms, s);
        mz = std::max(mz, std::abs(lo));
      }
    const float gf = divide ? A::two_level_factor(ms) : 1.0f, gz = divide && asym ? A::two_level_factor(mz) : 1.0f;
    out.scale_factor[size_t(g)] = gf;
    out.zero_factor[size_t(g)] = gz;
    for (int64_t t = 0; t < q.S; ++t) {
      const int64_t row = g * q.S + t;
      std::vector<int> code(size_t(q.D));
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t si = row * nb + k;
        const uint32_t sb = A::store_format(divide ? raw_s[size_t(t * nb + k)] / gf : raw_s[size_t(t * nb + k)], fp8);
        A::put_stored(out.scales.data(), fp8, si, sb);
        const float s_eff = A::format_value(sb, fp8) * gf;
        float z_eff = 0.0f;
        if (asym) {
          const float z = raw_z[size_t(t * nb + k)];
          const uint32_t zb = A::store_format(divide ? z / gz : z, fp8);
          A::put_stored(out.zeros.data(), fp8, si, zb);
          z_eff = A::format_value(zb, fp8) * gz;
        }
        for (int64_t d = k * block; d < (k + 1) * block; ++d)
          code[size_t(d)] = A::quantize_code(q.x(row, d), qmax, asym, s_eff, z_eff);
      }
      const std::vector<uint8_t> b = spec_pack(code, bits);
      out.codes.insert(out.codes.end(), b.begin(), b.end());
    }
  }
  return out;
}

/// The quantizer's passes on the host, as quantize_residual launches them: the
/// statistics (vectorised: stats_lane per 8 channels, each block's lanes merged in
/// channel order, stats_leader on every lane; else stats_scan per block), the group
/// maxima, scale_block per block, then the pack of the width's instantiation
/// (pack_word when vectorisable, else pack_group_at).
template <class W>
void run_quantizer(const K::QuantizeArgs& a) {
  std::fill(a.group_max, a.group_max + 2 * a.G, 0.0f);
  const int64_t nb = a.D / a.block;
  const bool vec = K::quantize_vectorizable(a.D, a.block) && a.r.vector_ok(8);
  for (int64_t g = 0; g < a.G; ++g) {
    float ms = 0.0f, mz = 0.0f;
    if (vec) {
      const int64_t width = a.block / 8, words = a.S * (a.D / 8);
      for (int64_t w0 = 0; w0 < words; w0 += width) {
        K::RunStats s = K::stats_lane(a, g, w0);
        for (int64_t l = 1; l < width; ++l) K::run_merge(s, K::stats_lane(a, g, w0 + l), a.asymmetric);
        for (int64_t l = 0; l < width; ++l) {
          float s1 = 0.0f, z1 = 0.0f;
          K::stats_leader(a, g, w0 + l, l == 0 ? s : K::stats_lane(a, g, w0 + l), s1, z1);
          ms = std::max(ms, s1);
          mz = std::max(mz, z1);
        }
      }
    } else {
      for (int64_t i = 0; i < a.S * nb + 3; ++i) {
        float s1 = 0.0f, z1 = 0.0f;
        K::stats_scan(a, g, i, s1, z1);
        ms = std::max(ms, s1);
        mz = std::max(mz, z1);
      }
    }
    a.group_max[g] = ms;
    a.group_max[a.G + g] = mz;
  }
  for (int64_t si = 0; si < a.G * a.S * nb; ++si) K::scale_block(a, si);
  if (K::kCodeWordFits<W> && vec)
    for (int64_t w = 0; w < a.G * a.S * (a.D / 8); ++w) K::pack_word<W>(a, w);
  else
    for (int64_t e = 0; e < K::code_groups<W>(a); ++e) K::pack_group_at<W>(a, e);
}

}  // namespace

// The quantizer's passes of every width (statistics, stored scales, the pack passes
// pack_word and pack_group_at) against the spec 1.2/1.4 quantizer above: codes, scales,
// zeros and factors, for symmetric/asymmetric, fp8/bf16, two_level/compat, the final
// residual given or fused, blocks on the vectorised path (8-channel lanes) and on the
// per-block one (int3: blocks of 24 and 40 channels, whose codes straddle no group).
// Then the scale search (search_block): every block's codes are quantize_code's with
// the stored scale it chose, and its error is not above the `off` choice's.
QVG_TEST(quantizer_passes_of_every_width) {
  std::mt19937 rng(3636);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  int checked = 0, searched = 0;
  for_each_width([&](auto w) {
    using W = decltype(w);
    constexpr int bits = W::kBits;
    for (const int64_t D : {int64_t(240), int64_t(64)})
      for (const int block : {8, 16, 24, 40, 64, 2 * W::kGroupCodes, 3 * W::kGroupCodes}) {
        if (block % W::kGroupCodes != 0 || D % block != 0) continue;
        for (int mode = 0; mode < 16; ++mode) {
          const bool asym = mode & 1, fp8 = mode & 2, two_level = mode & 4, fused = mode & 8;
          QuantCase q;
          q.G = 3;
          q.S = 7;
          q.D = D;
          q.K = 4;
          q.r.resize(size_t(q.G * q.S * q.D));
          for (int64_t i = 0; i < int64_t(q.r.size()); ++i) {
            const int64_t g = i / (q.S * q.D);
            const float scale = g == 1 ? 500.0f : (g == 2 ? 1e-3f : 1.0f);
            q.r[size_t(i)] = (i % 53 == 0 ? 0.5f * float(int(n01(rng) * 4)) : n01(rng)) * scale + (asym ? scale : 0.0f);
          }
          if (fused) {
            q.stored.resize(size_t(q.G * q.K * q.D));
            for (float& v : q.stored) v = 0.5f * n01(rng);
            q.ids.resize(size_t(q.G * q.S));
            for (uint8_t& id : q.ids) id = uint8_t(rng() % uint32_t(q.K));
          }
          const int64_t nb = D / block, nblk = q.G * q.S * nb;
          std::vector<uint8_t> codes(size_t(q.G * q.S * D * bits / 8), 0xA5), scales(size_t(nblk) * (fp8 ? 1 : 2)),
              zeros(asym ? scales.size() : 0);
          std::vector<float> sf(static_cast<size_t>(q.G)), zf(static_cast<size_t>(q.G)),
              raw_s(static_cast<size_t>(nblk)), raw_z(static_cast<size_t>(nblk)), gmax(size_t(2 * q.G));
          K::QuantizeArgs a;
          a.r = K::residual_points(q.r.data(), q.S, q.D);
          a.stored = fused ? q.stored.data() : nullptr;
          a.ids = fused ? q.ids.data() : nullptr;
          a.G = q.G;
          a.S = q.S;
          a.D = D;
          a.K = q.K;
          a.bits = bits;
          a.block = block;
          a.asymmetric = asym;
          a.fp8 = fp8;
          a.two_level = two_level;
          a.codes = codes.data();
          a.scales = scales.data();
          a.zeros = asym ? zeros.data() : nullptr;
          a.scale_factor = sf.data();
          a.zero_factor = zf.data();
          a.raw_s = raw_s.data();
          a.raw_z = raw_z.data();
          a.group_max = gmax.data();
          run_quantizer<W>(a);
          const QuantRef ref = reference_quantize(q, bits, block, asym, fp8, two_level);
          const std::string what = std::to_string(bits) + " bits D " + std::to_string(D) + " block " +
                                   std::to_string(block) + " mode " + std::to_string(mode) +
                                   (K::quantize_vectorizable(D, block) ? " (vectorised)" : " (per block)");
          QVG_EXPECT(codes == ref.codes) << what << "codes";
          QVG_EXPECT(scales == ref.scales) << what << "scales";
          QVG_EXPECT(zeros == ref.zeros) << what << "zeros";
          if (two_level) {
            QVG_EXPECT(sf == ref.scale_factor) << what << "scale factors";
            QVG_EXPECT(!asym || zf == ref.zero_factor) << what << "zero factors";
          }
          ++checked;
          // The scale search over what the passes left.
          const std::vector<float> off_s = raw_s, off_z = raw_z;  // the `off` choice's effective values
          for (int64_t si = 0; si < nblk; ++si) K::search_block<W>(a, si);
          const int qmax = spec_qmax(bits, asym);
          const bool divide = two_level && fp8;
          bool codes_ok = true, not_worse = true;
          for (int64_t si = 0; si < nblk; ++si) {
            const int64_t row = si / nb, k = si % nb, g = row / q.S;
            const float s_eff = A::effective(A::stored_value(scales.data(), fp8, si), divide ? sf[size_t(g)] : 1.0f);
            const float z_eff =
                asym ? A::effective(A::stored_value(zeros.data(), fp8, si), divide ? zf[size_t(g)] : 1.0f) : 0.0f;
            std::vector<float> x(static_cast<size_t>(block));
            for (int64_t d = 0; d < block; ++d) {
              x[size_t(d)] = q.x(row, k * block + d);
              codes_ok = codes_ok && spec_unpack(codes.data() + row * (D * bits / 8), bits, k * block + d) ==
                                         A::quantize_code(x[size_t(d)], qmax, asym, s_eff, z_eff);
            }
            not_worse = not_worse && A::block_sq_error(x.data(), block, qmax, asym, s_eff, z_eff) <=
                                         A::block_sq_error(x.data(), block, qmax, asym, off_s[size_t(si)],
                                                           asym ? off_z[size_t(si)] : 0.0f);
          }
          QVG_EXPECT(codes_ok) << what << "search_block's codes are not its scale's";
          QVG_EXPECT(not_worse) << what << "search_block chose a worse scale than off";
          ++searched;
        }
      }
  });
  std::printf("  %d quantizer cases, %d scale searches\n", checked, searched);
  QVG_EXPECT(checked >= 3 * 16 * 4) << checked;
}

namespace {

/// A random encoding (spec 1.5 arrays, stages contiguous) and, optionally, a
/// refinement layer (symmetric, one f32 centroid row per group).
struct Synth {
  int B = 2, S = 11, H = 3, D = 64, Kc = 5, bits = 4, block = 8, stages = 1;
  bool asym = false, fp8 = true, two_level = true;
  int cdt = A::kBF16;
  std::vector<uint8_t> codes, scales, zeros, ids, cent;
  std::vector<float> sf, zf;
  // the layer (rbits 0: none)
  int rbits = 0, rblock = 8;
  bool rfp8 = true, rfactor = true;
  std::vector<uint8_t> rcodes, rscales;
  std::vector<float> rsf, rcent;

  int64_t G() const { return int64_t(B) * H; }
  int64_t rows() const { return G() * S; }
  size_t esz() const { return cdt == A::kF32 ? 4 : 2; }
};

std::vector<uint8_t> random_scales(std::mt19937& rng, int64_t n, bool fp8) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<uint8_t> out(size_t(n) * (fp8 ? 1 : 2));
  for (int64_t i = 0; i < n; ++i) {
    // fp8: any byte but the NaNs; bf16: a value of a few binades either side of 1.
    uint32_t b = rng() % 256u;
    if (fp8 && (b & 0x7Fu) == 0x7Fu) b ^= 1u;
    if (!fp8) b = uint32_t(A::f32_to_bf16(n01(rng) * std::ldexp(1.0f, int(rng() % 9) - 4)));
    A::put_stored(out.data(), fp8, i, b);
  }
  return out;
}

void fill_synth(Synth& e, std::mt19937& rng) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int64_t rows = e.rows(), nb = e.D / e.block;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int> c = random_codes(rng, e.D, e.asym ? spec_qmax(e.bits, true) : 2 * spec_qmax(e.bits, false));
    const std::vector<uint8_t> b = spec_pack(c, e.bits);
    e.codes.insert(e.codes.end(), b.begin(), b.end());
  }
  e.scales = random_scales(rng, rows * nb, e.fp8);
  if (e.asym) e.zeros = random_scales(rng, rows * nb, e.fp8);
  for (int64_t g = 0; g < e.G(); ++g) {
    e.sf.push_back(std::ldexp(1.0f + std::abs(n01(rng)), int(rng() % 7) - 3));
    e.zf.push_back(std::ldexp(1.0f + std::abs(n01(rng)), int(rng() % 7) - 3));
  }
  for (int64_t i = 0; i < int64_t(e.stages) * rows; ++i) e.ids.push_back(uint8_t(rng() % uint32_t(e.Kc)));
  const int64_t nc = int64_t(e.stages) * e.G() * e.Kc * e.D;
  e.cent.resize(size_t(nc) * e.esz());
  for (int64_t i = 0; i < nc; ++i) {
    const uint32_t v = A::encode_elem(n01(rng) * 4.0f, e.cdt);
    if (e.cdt == A::kF32)
      std::memcpy(e.cent.data() + 4 * i, &v, 4);
    else
      A::put_stored(e.cent.data(), false, i, v);  // 2 bytes, little-endian
  }
  if (e.rbits == 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int> c = random_codes(rng, e.D, 2 * spec_qmax(e.rbits, false));
    const std::vector<uint8_t> b = spec_pack(c, e.rbits);
    e.rcodes.insert(e.rcodes.end(), b.begin(), b.end());
  }
  e.rscales = random_scales(rng, rows * (e.D / e.rblock), e.rfp8);
  for (int64_t g = 0; g < e.G(); ++g) e.rsf.push_back(std::ldexp(1.0f + std::abs(n01(rng)), -int(rng() % 5)));
  for (int64_t i = 0; i < e.G() * e.D; ++i) e.rcent.push_back(n01(rng) * 0.1f);
}

/// The decode task of tokens [t0, t1), heads [h0, h1) into `out` (output dtype odt,
/// token stride `ts` elements, batch stride (t1 - t0) * ts).
K::DecodeArgs synth_task(const Synth& e, int odt, int t0, int t1, int h0, int h1, int64_t ts, void* out) {
  K::DecodeArgs T;
  T.codes = e.codes.data();
  T.scales = e.scales.data();
  T.zeros = e.asym ? e.zeros.data() : nullptr;
  T.scale_factor = e.two_level ? e.sf.data() : nullptr;
  T.zero_factor = e.two_level && e.asym ? e.zf.data() : nullptr;
  T.ids = e.ids.data();
  T.centroid = e.cent.data();
  T.ids_stage_stride = e.rows();
  T.centroid_stage_stride = e.G() * e.Kc * e.D * int64_t(e.esz());
  T.B = e.B;
  T.S = e.S;
  T.H = e.H;
  T.D = e.D;
  T.K = e.Kc;
  T.bits = e.bits;
  T.block = e.block;
  T.stages = e.stages;
  T.t0 = t0;
  T.t1 = t1;
  T.h0 = h0;
  T.h1 = h1;
  T.asymmetric = int8_t(e.asym);
  T.fp8 = int8_t(e.fp8);
  T.centroid_dtype = int8_t(e.cdt);
  T.out_dtype = int8_t(odt);
  T.out = out;
  T.token_stride = ts;
  T.batch_stride = int64_t(t1 - t0) * ts;
  if (e.rbits != 0) {
    T.ref_codes = e.rcodes.data();
    T.ref_scales = e.rscales.data();
    T.ref_scale_factor = e.rfactor ? e.rsf.data() : nullptr;
    T.ref_centroid = e.rcent.data();
    T.ref_bits = e.rbits;
    T.ref_block = e.rblock;
    T.ref_fp8 = int8_t(e.rfp8);
  }
  return T;
}

/// Spec 1.3 (and the refinement layer's round(round_trip(value) + layer)) for one
/// element, as the storage bits of the output dtype.
uint32_t reference_element(const Synth& e, int odt, int64_t b, int64_t h, int64_t t, int64_t d) {
  const int64_t g = b * e.H + h, row = g * e.S + t;
  const int64_t si = row * (e.D / e.block) + d / e.block;
  const float s_eff = A::effective(A::stored_value(e.scales.data(), e.fp8, si), e.two_level ? e.sf[size_t(g)] : 1.0f);
  const float z_eff =
      e.asym ? A::effective(A::stored_value(e.zeros.data(), e.fp8, si), e.two_level ? e.zf[size_t(g)] : 1.0f) : 0.0f;
  const int code = spec_unpack(e.codes.data() + row * (e.D * e.bits / 8), e.bits, d);
  const int qmax = spec_qmax(e.bits, e.asym);
  float acc = e.asym ? A::add_rn(A::mul_rn(float(code), s_eff), z_eff) : A::mul_rn(float(code - qmax), s_eff);
  for (int st = 0; st < e.stages; ++st) {
    const int id = e.ids[size_t(st * e.rows() + row)];
    acc = A::add_rn(acc, A::load_elem(e.cent.data(), e.cdt, ((st * e.G() + g) * e.Kc + id) * e.D + d));
  }
  if (e.rbits != 0) {
    const int64_t rsi = row * (e.D / e.rblock) + d / e.rblock;
    const float rs = A::effective(A::stored_value(e.rscales.data(), e.rfp8, rsi), e.rfactor ? e.rsf[size_t(g)] : 1.0f);
    const int rcode = spec_unpack(e.rcodes.data() + row * (e.D * e.rbits / 8), e.rbits, d);
    const float layer =
        A::add_rn(A::mul_rn(float(rcode - spec_qmax(e.rbits, false)), rs), e.rcent[size_t(g * e.D + d)]);
    acc = A::add_rn(A::round_trip(acc, odt), layer);
  }
  return A::encode_elem(acc, odt);
}

using K::host_test::modes_run;
int& generic_launches() {
  static int n = 0;
  return n;
}

/// What decode_tasks launches, on the host: plan_decode's launches, every block and
/// every thread, through with_decode_mode and the bodies. Also checks that each
/// vectorised launch holds tasks of one mode (its widths included).
void run_decode(const std::vector<K::DecodeArgs>& tasks, int32_t min_blocks = 0) {
  for (const K::DecodeLaunch& L : K::plan_decode(tasks.data(), int(tasks.size()), min_blocks)) {
    for (int k = 0; k < L.n && L.vec; ++k)
      QVG_EXPECT(L.t[k].bits == L.bits && L.t[k].fp8 == L.fp8 && L.t[k].centroid_dtype == L.centroid_dtype &&
                 L.t[k].out_dtype == L.out_dtype &&
                 (L.t[k].ref_codes ? L.t[k].ref_bits == L.ref_bits : L.ref_bits == 0))
          << "a vectorised launch mixes modes";
    generic_launches() += L.vec ? 0 : 1;
    K::host_test::run_launch(L);
  }
}

/// One decode case: the synth's tokens [t0, t1) and heads [h0, h1) into a strided
/// target (token stride padded by `pad` elements) against reference_element; the
/// padding must stay untouched. Returns whether it matched.
bool check_decode(const Synth& e, int odt, int t0, int t1, int h0, int h1, int64_t pad, int32_t min_blocks,
                  const std::string& what) {
  const size_t osz = odt == A::kF32 ? 4 : 2;
  const int64_t ts = int64_t(h1 - h0) * e.D + pad, n = int64_t(e.B) * (t1 - t0) * ts;
  Buf out(size_t(n) * osz, 0, 0xA5);
  run_decode({synth_task(e, odt, t0, t1, h0, h1, ts, out.p)}, min_blocks);
  int bad = 0;
  for (int64_t b = 0; b < e.B; ++b)
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* p = out.p + size_t((b * (t1 - t0) + (t - t0)) * ts) * osz;
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t d = 0; d < e.D; ++d) {
          uint32_t got = 0;
          std::memcpy(&got, p + size_t((h - h0) * e.D + d) * osz, osz);
          const uint32_t want = reference_element(e, odt, b, h, t, d);
          if (got != want && ++bad <= 3) {
            QVG_EXPECT(false) << what << "b" << b << "t" << t << "h" << h << "d" << d << "got" << got << "want" << want;
          }
        }
      for (int64_t i = int64_t(h1 - h0) * e.D * int64_t(osz); i < ts * int64_t(osz); ++i)
        if (p[i] != 0xA5 && ++bad <= 3) {
          QVG_EXPECT(false) << what << "padding written";
        }
    }
  return bad == 0;
}

std::string describe(const Synth& e, int odt) {
  return "bits " + std::to_string(e.bits) + " block " + std::to_string(e.block) + " D " + std::to_string(e.D) +
         (e.asym ? " asym" : " sym") + (e.fp8 ? " fp8" : " bf16") + (e.two_level ? " two_level" : " compat") +
         " stages " + std::to_string(e.stages) + " cdt " + std::to_string(e.cdt) + " odt " + std::to_string(odt) +
         " ref_bits " + std::to_string(e.rbits) + " ref_block " + std::to_string(e.rblock);
}

}  // namespace

// Whole decode launches of every width against the spec 1.3 decode above, on random
// encodings: every vectorised instantiation (each width x scale format x centroid
// dtype x output dtype, and with a refinement layer of each width into the centroids'
// dtype: 54 + 54 = 108), D = 64 and 24 (int3 rows of 9 bytes: words at every byte
// offset), whole ranges and strided sub-ranges with the smallest tiles; then the
// generic path with int3 codes (D past the vectorised limit, a layer of another
// output dtype, a layer whose blocks are not whole words). No misaligned access.
QVG_TEST(decode_launches_of_every_width) {
  std::mt19937 rng(2036);
  modes_run().clear();
  generic_launches() = 0;
  const int mis0 = K::host_misaligned_accesses();
  int checked = 0, failed = 0, vec_cases = 0;
  const std::vector<int> widths = table_widths();
  for (int bits : widths)
    for (bool fp8 : {true, false})
      for (int cdt : {A::kBF16, A::kF16, A::kF32})
        for (int odt : {A::kBF16, A::kF16, A::kF32})
          for (int rbits : {0, 2, 3, 4}) {
            if (rbits != 0 && odt != cdt) continue;
            Synth e;
            e.bits = bits;
            e.fp8 = fp8;
            e.cdt = cdt;
            e.D = (vec_cases % 2) ? 24 : 64;
            e.block = e.D == 24 ? (vec_cases % 4 == 1 ? 8 : 24) : (vec_cases % 3 == 0 ? 8 : 32);
            e.asym = (vec_cases / 2) % 2;
            e.two_level = vec_cases % 5 != 4;
            e.stages = 1 + vec_cases % 2;
            e.rbits = rbits;
            e.rblock = e.D == 24 ? 8 : 16;
            e.rfp8 = vec_cases % 3 != 1;
            e.rfactor = vec_cases % 4 != 3;
            fill_synth(e, rng);
            QVG_EXPECT(K::task_vectorizable(synth_task(e, odt, 0, e.S, 0, e.H, e.H * e.D, nullptr)))
                << describe(e, odt) << "not vectorised";
            const std::string what = describe(e, odt);
            failed += check_decode(e, odt, 0, e.S, 0, e.H, 0, 0, what) ? 0 : 1;
            failed += check_decode(e, odt, 2, e.S - 1, 1, e.H, 8, 1 << 30, what + " sub-range") ? 0 : 1;
            checked += 2;
            ++vec_cases;
          }
  QVG_EXPECT(modes_run().size() == 108) << "vectorised instantiations run:" << modes_run().size();
  QVG_EXPECT(generic_launches() == 0) << generic_launches() << "generic launches among the vectorised cases";
  // The generic path (decode_one: code_of_row of any width) with int3 codes.
  struct GenericCase {
    int D, block, rbits, rblock, odt_other;
  };
  for (const GenericCase gc :
       {GenericCase{2056, 8, 0, 0, 0}, GenericCase{64, 16, 3, 8, 1}, GenericCase{24, 8, 2, 12, 0},
        GenericCase{48, 24, 4, 6, 0}, GenericCase{64, 32, 3, 16, 1}})
    for (int bits : widths) {
      if (gc.block % qvg::find_code_format(bits)->group_codes != 0) continue;
      Synth e;
      e.bits = bits;
      e.D = gc.D;
      e.block = gc.block;
      e.S = gc.D > 1000 ? 5 : 9;
      e.asym = bits == 3;
      e.stages = 2;
      e.cdt = A::kF16;
      e.rbits = gc.rbits;
      e.rblock = gc.rblock;
      fill_synth(e, rng);
      const int odt = gc.odt_other ? A::kF32 : e.cdt;
      QVG_EXPECT(!K::task_vectorizable(synth_task(e, odt, 0, e.S, 0, e.H, e.H * e.D, nullptr)) || gc.D > 2048)
          << describe(e, odt) << "vectorised";
      const int before = generic_launches();
      failed += check_decode(e, odt, 1, e.S, 0, e.H, 4, 0, describe(e, odt) + " generic") ? 0 : 1;
      QVG_EXPECT(generic_launches() > before) << describe(e, odt) << "took no generic launch";
      ++checked;
    }
  QVG_EXPECT(failed == 0) << failed << "of" << checked << "decode cases differ";
  QVG_EXPECT(K::host_misaligned_accesses() == mis0) << K::host_misaligned_accesses() - mis0 << "misaligned accesses";
  std::printf("  %d decode cases (%zu vectorised instantiations, %d generic launches)\n", checked, modes_run().size(),
              generic_launches());
}

// Tasks of every width and layer width in one decode call: the plan keeps the widths
// apart (one mode per vectorised launch, checked in run_decode) and every task lands
// in its own target.
QVG_TEST(one_decode_call_mixes_widths) {
  std::mt19937 rng(99);
  std::vector<Synth> es;
  const std::vector<int> widths = table_widths();
  for (int i = 0; i < 24; ++i) {
    Synth e;
    e.bits = widths[size_t(i) % widths.size()];
    e.rbits = i % 4 == 0 ? 0 : widths[size_t(i / 4) % widths.size()];
    e.D = 32;
    e.block = 8;
    e.asym = i % 2;
    e.cdt = A::kBF16;
    fill_synth(e, rng);
    es.push_back(std::move(e));
  }
  const int64_t per = int64_t(es[0].B) * es[0].S * es[0].H * es[0].D;
  Buf out(size_t(per * 2 * int64_t(es.size())) + 64, 0, 0xA5);
  std::vector<K::DecodeArgs> tasks;
  for (size_t i = 0; i < es.size(); ++i)
    tasks.push_back(
        synth_task(es[i], A::kBF16, 0, es[i].S, 0, es[i].H, es[i].H * es[i].D, out.p + 2 * per * int64_t(i)));
  const std::vector<K::DecodeLaunch> plan = K::plan_decode(tasks.data(), int(tasks.size()));
  std::set<int> modes;
  for (const K::DecodeArgs& t : tasks) modes.insert(t.bits * 10 + (t.ref_codes ? t.ref_bits : 0));
  QVG_EXPECT(plan.size() == modes.size()) << plan.size() << "launches for" << modes.size() << "modes";
  run_decode(tasks);
  for (size_t i = 0; i < es.size(); ++i) {
    const Synth& e = es[i];
    bool same = true;
    for (int64_t b = 0; b < e.B; ++b)
      for (int64_t t = 0; t < e.S; ++t)
        for (int64_t h = 0; h < e.H; ++h)
          for (int64_t d = 0; d < e.D; ++d) {
            uint16_t got = 0;
            std::memcpy(&got, out.p + 2 * (per * int64_t(i) + ((b * e.S + t) * e.H + h) * e.D + d), 2);
            same = same && got == reference_element(e, A::kBF16, b, h, t, d);
          }
    QVG_EXPECT(same) << "task" << i << describe(e, A::kBF16);
  }
  QVG_EXPECT(out.p[2 * per * int64_t(es.size())] == 0xA5) << "written past the last target";
}

int main(int argc, char** argv) {
  return qvg::testing::run_all(argc, argv);
}
