// qvg/file.h — raw file access shared by every reader and writer of qvg files
// (tensor files, `.qvgt`, cache snapshots): whole-file reads that never block on
// a FIFO or a device, and atomic writes.
//
// Atomic write rule (the one place it is implemented): the bytes go to a temporary
// file in the destination's directory (`<name>.tmp.<pid>.<n>`, the name cut so that
// the whole fits in 255 bytes: a destination name of up to 255 bytes is written), which
// is flushed and fsynced, closed, renamed over `path`, and the directory is fsynced. A
// crash at any point leaves either the old file or the new one at `path` (a crash
// before the rename may leave the temporary behind); an error removes the temporary
// and leaves `path` untouched.
//
// Permissions: a file replaced keeps its permission bits (rwx for
// user, group, others; set-user-ID, set-group-ID and sticky bits are not carried
// over) and, where the process may set them (root), its owner and group; a new file
// gets 0666 less the process's umask, as a file the process creates otherwise would.
//
// Paths: a path holding a NUL byte is refused by every reader and
// writer (InvalidArgument "... the path holds a NUL byte at byte N"): the system
// would read it as the path before the NUL, another file.
//
// Destinations (spec 5.1, "Files"): `path` must not exist, or be a regular file,
// or be a symlink whose final target is a regular file — such a symlink is
// *followed*: the target is replaced atomically (the temporary goes next to the
// target) and the link stays a link. Anything else is refused with InvalidArgument
// naming the path, before anything is created: a FIFO, a device node (as root the
// old writer replaced /dev/null with a regular file), a socket, a directory, a
// symlink to any of these, a symlink whose target does not exist. The check is made
// just before the temporary is created; a destination swapped for a non-regular
// file between the check and the rename is not detected (no portable way to rename
// "only over a regular file").
//
// File-size limits (docs/reliability.md, finding 15): a write beyond RLIMIT_FSIZE
// fails with EFBIG only if SIGXFSZ is ignored — the library never changes signal
// dispositions; the `qvg` CLI ignores SIGXFSZ, and so does the Python interpreter —
// and is then reported as InvalidArgument "file too large: it exceeds the file-size
// limit ..." with the temporary removed. With the default disposition the kernel ends
// the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace qvg {

/// Whole file contents. The path must name a regular file: a FIFO, socket, device or
/// directory is refused before anything is read (the open never blocks). Throws
/// InvalidArgument naming the path if it cannot be read, or if its size does not fit
/// in memory. It reads whatever the file holds: the format readers of qvg/io.h check
/// a file's header against its size before they read the rest.
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);

/// Writes `bytes` atomically to `path` (see the rule above). Throws InvalidArgument
/// naming the path on any I/O error; the temporary is removed and `path` is untouched.
void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes);
/// The same for a file made of several pieces written one after the other (no
/// concatenated copy is made).
void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const uint8_t>> pieces);

}  // namespace qvg
