#include "app/model_lookup.hpp"

#include <cstdlib>
#include <system_error>

#include "app/model_catalogue.hpp"
#include "engine/base/error.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

const catalogue_entry& default_entry() {
  const catalogue_entry* e = find_catalogue_entry(k_default_model_name);
  if (!e) throw invalid_request("the model catalogue has no entry '" + std::string(k_default_model_name) + "'");
  return *e;
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

fs::path model_library_dir() {
  if (const std::string dir = env("TESSERA_MODELS"); !dir.empty()) return dir;
  if (const std::string data = env("XDG_DATA_HOME"); !data.empty()) return fs::path(data) / "tessera" / "models";
  if (const std::string home = env("HOME"); !home.empty())
    return fs::path(home) / ".local" / "share" / "tessera" / "models";
  throw invalid_request("no model library: set TESSERA_MODELS (or XDG_DATA_HOME or HOME)");
}

std::vector<fs::path> model_file_candidates(const std::string& file) {
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  out.push_back((ec ? fs::path(".") : cwd) / "models" / file);
  if (const std::string dir = env("TESSERA_MODELS"); !dir.empty()) out.push_back(fs::path(dir) / file);
  if (const std::string data = env("XDG_DATA_HOME"); !data.empty()) {
    out.push_back(fs::path(data) / "tessera" / "models" / file);
  } else if (const std::string home = env("HOME"); !home.empty()) {
    out.push_back(fs::path(home) / ".local" / "share" / "tessera" / "models" / file);
  }
#ifdef TESSERA_SOURCE_MODELS_DIR
  out.push_back(fs::path(TESSERA_SOURCE_MODELS_DIR) / file);
#endif
  return out;
}

std::vector<fs::path> default_model_candidates() { return model_file_candidates(default_entry().file); }

fs::path find_default_model() {
  if (const std::string given = env("TESSERA_MODEL"); !given.empty()) return given;
  std::string looked;
  for (const fs::path& p : default_model_candidates()) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    looked += "\n  " + p.string();
  }
  throw load_error("no model given (MODEL or --model PATH) and the default model " + default_entry().file +
                   " is in none of the places looked in:" + looked + "\n(`tessera pull " +
                   std::string(k_default_model_name) + "` fetches it into the model library)");
}

resolved_model resolve_model(const std::string& spec) {
  if (spec.empty()) return {find_default_model(), ""};
  if (spec.starts_with("hf:")) {
    throw invalid_request("'" + spec +
                          "': models cannot be pulled from the Hugging Face Hub here (this build has no Hub "
                          "client and the Hub is not reachable from where it was made): download the repository "
                          "elsewhere and pass its directory, or `tessera pull` one of: " +
                          known_model_names());
  }
  if (path_exists(spec)) return {spec, ""};
  if (const catalogue_entry* e = find_catalogue_entry(spec)) {
    std::string looked;
    for (const fs::path& p : model_file_candidates(e->file)) {
      std::error_code ec;
      if (fs::is_regular_file(p, ec)) return {p, spec};
      looked += "\n  " + p.string();
    }
    throw load_error("model '" + spec + "' (" + e->file + ") is not pulled: run `tessera pull " + e->name +
                     "` (looked in:" + looked + ")");
  }
  const fs::path library = env("TESSERA_MODELS").empty() && env("XDG_DATA_HOME").empty() && env("HOME").empty()
                               ? fs::path()
                               : model_library_dir();
  if (!library.empty() && spec.find('/') == std::string::npos && spec != "." && spec != ".." &&
      path_exists(library / spec))
    return {library / spec, ""};
  if (spec.find('/') != std::string::npos || spec.ends_with(".gguf")) return {spec, ""};
  throw invalid_request(
      "'" + spec + "' is neither a model file or directory nor a model name (known names: " + known_model_names() +
      "; `tessera list` shows the library" + (library.empty() ? std::string() : ", " + library.string()) + ")");
}

}  // namespace tessera::app
