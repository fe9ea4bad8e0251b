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

namespace {

// The two caches' snapshots differ in their records only (snapshot_dense.cpp,
// snapshot_packed.cpp); writing the file or its bytes is the same for both.
snap::Written records(const DenseCausalCache& c) {
  return snap::write_dense(SnapshotAccess::state(c));
}
snap::Written records(const PackedCausalCache& c) {
  return snap::write_packed(SnapshotAccess::state(c));
}
template <class Cache>
void save_file(const Cache& c, const std::filesystem::path& path) {
  const snap::Written w = records(c);
  snap::write_snapshot(path, w.sections, w.minor);
}
template <class Cache>
std::vector<uint8_t> file_bytes(const Cache& c) {
  const snap::Written w = records(c);
  return snap::snapshot_file_bytes(w.sections, w.minor);
}

}  // namespace

void DenseCausalCache::save(const std::filesystem::path& path) const {
  save_file(*this, path);
}
std::vector<uint8_t> DenseCausalCache::snapshot_bytes() const {
  return file_bytes(*this);
}
DenseCausalCache DenseCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect,
                                        GrowStorage storage) {
  return detail::with_path(
      path, [&] { return SnapshotAccess::make(snap::read_dense(snap::FileSource(path), expect), std::move(storage)); });
}
DenseCausalCache DenseCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                       const SnapshotExpectation& expect, GrowStorage storage) {
  return SnapshotAccess::make(snap::read_dense(snap::MemorySource(bytes), expect), std::move(storage));
}

void PackedCausalCache::save(const std::filesystem::path& path) const {
  save_file(*this, path);
}
std::vector<uint8_t> PackedCausalCache::snapshot_bytes() const {
  return file_bytes(*this);
}
PackedCausalCache PackedCausalCache::load(const std::filesystem::path& path, const SnapshotExpectation& expect) {
  return detail::with_path(path,
                           [&] { return SnapshotAccess::make(snap::read_packed(snap::FileSource(path), expect)); });
}
PackedCausalCache PackedCausalCache::from_snapshot_bytes(std::span<const uint8_t> bytes,
                                                         const SnapshotExpectation& expect) {
  return SnapshotAccess::make(snap::read_packed(snap::MemorySource(bytes), expect));
}

}  // namespace qvg
