#include "engine/base/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/base/error.hpp"

namespace tessera {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace

regular_file regular_file::open(const std::filesystem::path& path) {
  const std::string where = path.string();
  // O_NONBLOCK only matters for what we refuse below: without it, opening a FIFO waits for a writer.
  // O_NOCTTY: a terminal device named as a model must not become our controlling terminal.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw load_error(where + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw load_error(where + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw load_error(where + ": not a regular file (" + file_kind(st.st_mode) + ")");
  }
  // Back to blocking reads (a no-op for regular files today; keeps read() semantics plain).
  if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return regular_file(fd, static_cast<uint64_t>(st.st_size));
}

regular_file::regular_file(regular_file&& other) noexcept : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

regular_file& regular_file::operator=(regular_file&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

regular_file::~regular_file() {
  if (fd_ >= 0) ::close(fd_);
}

std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes) {
  const regular_file file = regular_file::open(path);
  const std::string where = path.string();
  auto too_large = [&] {
    throw load_error(where + ": larger than " + std::to_string(max_bytes) + " bytes; refusing to read it");
  };
  if (file.size() > max_bytes) too_large();
  std::string out;
  out.resize(static_cast<size_t>(file.size()));
  size_t used = 0;
  for (;;) {
    // Room for one byte beyond the expected size, so that growth since fstat is noticed.
    if (used == out.size()) {
      if (used > max_bytes) too_large();
      out.resize(static_cast<size_t>(std::min<uint64_t>(max_bytes + 1, std::max<uint64_t>(used * 2, used + 4096))));
    }
    const ssize_t n = ::read(file.fd(), out.data() + used, out.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw load_error(where + ": cannot read: " + std::strerror(errno));
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  if (used > max_bytes) too_large();
  out.resize(used);
  return out;
}

}  // namespace tessera
