// Opening the files a model is made of (GGUF, safetensors shards, the JSON files and the chat template
// of a Hugging Face directory). Paths come from users and from model directories, so they may name
// something other than a file: a FIFO (whose open() blocks until a writer appears, i.e. forever), a
// character device such as /dev/zero (endless reads), a socket or a directory. Every loader opens
// through here, which refuses anything but a regular file before reading a byte, and never blocks.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace tessera {

// A read-only file descriptor of a regular file; closed on destruction.
class regular_file {
 public:
  // Opens `path` without blocking (O_NONBLOCK: a FIFO opens at once instead of waiting for a
  // writer), refuses it unless fstat says it is a regular file, then clears O_NONBLOCK. Throws
  // load_error "<path>: cannot open: <reason>" or "<path>: not a regular file (<kind>)".
  static regular_file open(const std::filesystem::path& path);

  regular_file(regular_file&& other) noexcept;
  regular_file& operator=(regular_file&& other) noexcept;
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;
  ~regular_file();

  int fd() const noexcept { return fd_; }
  uint64_t size() const noexcept { return size_; }  // at open time

 private:
  regular_file(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole content of a regular file of at most `max_bytes` (larger: load_error "<path>: larger than
// <max_bytes> bytes"). Reads until end of file, never more than max_bytes + 1, so a file that grows
// while it is read cannot make it allocate more. Throws load_error naming the path.
std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes);

}  // namespace tessera
