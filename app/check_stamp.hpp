// What `tessera list` knows of a library file without reading it again: the sha256 a pull (or an
// earlier list) computed, stamped with the file's identity at that time. A catalogue model of 16 GB
// takes about a minute to hash; a stamp answers in a stat(). The stamp is `.FILE.checked` beside the
// file: "sha256 size mtime_ns inode device". It holds only while the file is that same file, unchanged
// as far as the filesystem can tell: same inode and device, size and modification time (in
// nanoseconds). Anything else (a rewrite, a copy over it, a write through a writable mapping, which
// also updates the mtime) makes it stale, and the file is hashed again. `tessera list --verify` ignores
// stamps. What a stamp cannot see is a change that restores the mtime on purpose (touch -d): for that,
// --verify.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

namespace tessera::app {

// The stamp's path for `file`.
std::filesystem::path check_stamp_path(const std::filesystem::path& file);

// The sha256 the stamp records when it is still valid for `file`; nullopt when there is none, it does
// not parse, or the file is not the one it was written for.
std::optional<std::string> stamped_sha256(const std::filesystem::path& file);

// Records that `file`, as it is now, has `sha256`. Best effort: a library that cannot be written (a
// read-only share) only means the next list hashes again.
void write_check_stamp(const std::filesystem::path& file, const std::string& sha256);

// Removes the stamp (rm, or a file found not to match).
void remove_check_stamp(const std::filesystem::path& file);

}  // namespace tessera::app
