// src/codec/rng.h — the codec's PRNG: SplitMix64 streams keyed by (seed, stage, b, h).
// Written by hand because the codec's bytes must not depend on a standard
// library's distribution implementations (std::uniform_int_distribution differs
// between libstdc++ and libc++), and the stream must be reproducible on a GPU.
#pragma once

#include <cstdint>

namespace qvg::detail {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__extension__ typedef unsigned __int128 u128;

class Rng {
 public:
  /// One independent stream per (seed, stage, b, h) of spec 1.1.
  Rng(uint64_t seed, uint64_t stage, uint64_t b, uint64_t h) {
    uint64_t s = seed;
    state_ = splitmix64(s);
    state_ ^= stage * 0xD6E8FEB86659FD93ull;
    splitmix64(state_);
    state_ ^= b * 0xA0761D6478BD642Full;
    splitmix64(state_);
    state_ ^= h * 0xE7037ED1A0B428DBull;
  }
  uint64_t next() { return splitmix64(state_); }
  /// Uniform integer in [0, m), m >= 1 (Lemire's method with rejection: unbiased).
  uint64_t below(uint64_t m) {
    u128 p = (u128)next() * m;
    uint64_t lo = uint64_t(p);
    if (lo < m) {
      uint64_t t = (0 - m) % m;
      while (lo < t) {
        p = (u128)next() * m;
        lo = uint64_t(p);
      }
    }
    return uint64_t(p >> 64);
  }
  /// Uniform double in [0, 1).
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace qvg::detail
