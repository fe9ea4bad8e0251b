// src/core/checksum_impl.h — private: XXH64 checksums (xxHash, seed 0) of files and
// sections (cache snapshots), one call or streamed over several pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace qvg::detail {

/// XXH64 (seed 0) of `bytes`.
uint64_t xxh64(std::span<const uint8_t> bytes);

/// XXH64 (seed 0) of the concatenation of everything update() was given.
class Xxh64Stream {
 public:
  Xxh64Stream();
  ~Xxh64Stream();
  Xxh64Stream(const Xxh64Stream&) = delete;
  Xxh64Stream& operator=(const Xxh64Stream&) = delete;
  void update(std::span<const uint8_t> bytes);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> st_;
};

}  // namespace qvg::detail
