#include "app/check_stamp.hpp"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <system_error>

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

// The file's identity and state as the stamp records them.
struct file_identity {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;

  bool operator==(const file_identity&) const = default;
};

std::optional<file_identity> identity_of(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return file_identity{static_cast<uint64_t>(st.st_size),
                       static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                       static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
}

bool is_sha256_hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

fs::path check_stamp_path(const fs::path& file) {
  return file.parent_path() / ("." + file.filename().string() + ".checked");
}

std::optional<std::string> stamped_sha256(const fs::path& file) {
  const std::optional<file_identity> now = identity_of(file);
  if (!now) return std::nullopt;
  std::ifstream in(check_stamp_path(file));
  std::string sha;
  file_identity then;
  if (!(in >> sha >> then.size >> then.mtime_ns >> then.inode >> then.device) || !is_sha256_hex(sha))
    return std::nullopt;
  if (!(then == *now)) return std::nullopt;
  return sha;
}

void write_check_stamp(const fs::path& file, const std::string& sha256) {
  const std::optional<file_identity> id = identity_of(file);
  if (!id || !is_sha256_hex(sha256)) return;
  const fs::path stamp = check_stamp_path(file);
  const fs::path tmp = stamp.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << sha256 << ' ' << id->size << ' ' << id->mtime_ns << ' ' << id->inode << ' ' << id->device << '\n';
    if (!out) return;
  }
  std::error_code ec;
  fs::rename(tmp, stamp, ec);  // whole or not at all
  if (ec) fs::remove(tmp, ec);
}

void remove_check_stamp(const fs::path& file) {
  std::error_code ec;
  fs::remove(check_stamp_path(file), ec);
}

}  // namespace tessera::app
