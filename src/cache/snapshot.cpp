// The caches' snapshot entry points (docs/snapshot.md): save, snapshot_bytes, load
// and from_snapshot_bytes of both caches. A cache hands out its state
// (snapshot_state.h), the records turn it into sections (snapshot_records.h) and the
// container writes them (snapshot_io.h); loading reads and validates everything
// before the cache is built from it.
#include <utility>

#include "cache/snapshot_records.h"
#include "cache/snapshot_state.h"
#include "core/file_impl.h"
#include "qvg/cache.h"

namespace qvg {

using detail::SnapshotAccess;
namespace snap = detail::snap;

void DenseCausalCache::save(const std::filesystem::path& path) const {
  const snap::Written w = snap::write_dense(SnapshotAccess::state(*this));
  snap::write_snapshot(path, w.sections, w.minor);
}
std::vector<uint8_t> DenseCausalCache::snapshot_bytes() const {
  const snap::Written w = snap::write_dense(SnapshotAccess::state(*this));
  return snap::snapshot_file_bytes(w.sections, w.minor);
}
DenseCausalCache DenseCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect,
                                        GrowStorage storage) {
  return detail::with_path(path, [&] {
    const snap::FileSource src(path);
    return SnapshotAccess::make(snap::read_dense(src, expect), std::move(storage));
  });
}
DenseCausalCache DenseCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                       const SnapshotExpectation& expect, GrowStorage storage) {
  return SnapshotAccess::make(snap::read_dense(snap::MemorySource(bytes), expect), std::move(storage));
}

void PackedCausalCache::save(const std::filesystem::path& path) const {
  const snap::Written w = snap::write_packed(SnapshotAccess::state(*this));
  snap::write_snapshot(path, w.sections, w.minor);
}
std::vector<uint8_t> PackedCausalCache::snapshot_bytes() const {
  const snap::Written w = snap::write_packed(SnapshotAccess::state(*this));
  return snap::snapshot_file_bytes(w.sections, w.minor);
}
PackedCausalCache PackedCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect) {
  return detail::with_path(path, [&] {
    const snap::FileSource src(path);
    return SnapshotAccess::make(snap::read_packed(src, expect));
  });
}
PackedCausalCache PackedCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                         const SnapshotExpectation& expect) {
  return SnapshotAccess::make(snap::read_packed(snap::MemorySource(bytes), expect));
}

}  // namespace qvg
