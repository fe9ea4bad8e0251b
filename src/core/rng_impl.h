// src/core/rng_impl.h — the project's one PRNG: SplitMix64, and the codec's streams
// keyed by (seed, stage, b, h) (spec 1.1), written once for the host compiler and
// nvcc (host and device).
//
// Written by hand because the codec's bytes must not depend on a standard library's
// distributions (std::uniform_int_distribution differs between libstdc++ and
// libc++) and the same stream must be drawn on a GPU. The workload generator and the
// simulation's step noise use splitmix64 / mix64 as their counter-based hash.
#pragma once

#include <cstdint>

#include "core/numeric_impl.h"  // QVG_HD

namespace qvg::rng_impl {

/// One SplitMix64 step: advances `state` by the golden-ratio increment and returns
/// the mixed output.
QVG_HD uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// The SplitMix64 output for state x (a stateless 64-bit hash of x).
QVG_HD uint64_t mix64(uint64_t x) { return splitmix64(x); }

/// High and low 64 bits of a * b.
QVG_HD void mul64wide(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
  lo = a * b;
#if defined(__CUDA_ARCH__)
  hi = __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 u128;
  hi = uint64_t((u128(a) * b) >> 64);
#endif
}

/// The codec's random stream of one (seed, stage, b, h) (spec 1.1).
class Rng {
 public:
  QVG_HD Rng(uint64_t seed, uint64_t stage, uint64_t b, uint64_t h) {
    uint64_t s = seed;
    state_ = splitmix64(s);
    state_ ^= stage * 0xD6E8FEB86659FD93ull;
    splitmix64(state_);
    state_ ^= b * 0xA0761D6478BD642Full;
    splitmix64(state_);
    state_ ^= h * 0xE7037ED1A0B428DBull;
  }
  QVG_HD uint64_t next() { return splitmix64(state_); }
  /// Uniform integer in [0, m), m >= 1 (Lemire's method with rejection: unbiased).
  QVG_HD uint64_t below(uint64_t m) {
    uint64_t hi, lo;
    mul64wide(next(), m, hi, lo);
    if (lo < m) {
      const uint64_t t = (0 - m) % m;
      while (lo < t) mul64wide(next(), m, hi, lo);
    }
    return hi;
  }
  /// Uniform double in [0, 1) (53 random bits).
  QVG_HD double uniform() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace qvg::rng_impl
