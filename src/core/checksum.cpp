// XXH64 checksums (src/core/checksum_impl.h), xxHash compiled in (XXH_INLINE_ALL):
// libqvg needs the Debian header only, no extra library at link time.
#include "core/checksum_impl.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace qvg::detail {

uint64_t xxh64(std::span<const uint8_t> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

struct Xxh64Stream::State {
  XXH64_state_t s;
};

Xxh64Stream::Xxh64Stream() : st_(std::make_unique<State>()) { XXH64_reset(&st_->s, 0); }
Xxh64Stream::~Xxh64Stream() = default;
void Xxh64Stream::update(std::span<const uint8_t> bytes) { XXH64_update(&st_->s, bytes.data(), bytes.size()); }
uint64_t Xxh64Stream::digest() const { return XXH64_digest(&st_->s); }

}  // namespace qvg::detail
