// What the fuzz targets (tests/fuzz/*_fuzz.cpp) share: splitting one input into several files, a
// per-process scratch directory for the loaders that take a directory, and the failure report.
//
// Each target defines LLVMFuzzerTestOneInput (and, where it needs set-up, LLVMFuzzerInitialize). It
// catches the errors the API documents for bad input (load_error, invalid_request, api_error, ...)
// and nothing else: any other exception escapes and is a finding, as are crashes, sanitizer reports,
// a broken invariant (fuzz_check) and, under libFuzzer, hangs and out-of-memory.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace tessera::fuzz {

// A broken invariant: print it and abort, which libFuzzer (and the replay driver) report as a crash.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// Splits an input at its NUL bytes into at most `max_parts` parts (the last part keeps any further
// NULs). Several-file targets use this so that one mutation can touch any of the files; a part that
// is absent (fewer NULs) means "no such file", which is a case of its own.
inline std::vector<std::string_view> split_parts(std::string_view input, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = input.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(input.substr(0, nul));
    input.remove_prefix(nul + 1);
  }
  parts.push_back(input);
  return parts;
}

// A directory of this process's own, emptied and removed at exit; under /dev/shm when it exists, so
// that writing an input per execution costs no disk I/O.
class scratch_dir {
 public:
  scratch_dir() {
    std::error_code ec;
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm", ec)
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    path_ = base / ("tessera_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(path_);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // Writes `name` with `content`, or removes it when content is nullopt.
  void put(const std::string& name, std::optional<std::string_view> content) const {
    const auto p = path_ / name;
    std::error_code ec;
    std::filesystem::remove(p, ec);
    if (!content) return;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(content->data(), static_cast<std::streamsize>(content->size()));
    if (!out) fail("cannot write " + p.string());
  }

 private:
  std::filesystem::path path_;
};

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace tessera::fuzz
