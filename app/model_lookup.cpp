#include "app/model_lookup.hpp"

#include <cstdlib>
#include <system_error>

#include "engine/base/error.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

constexpr const char* k_default_file = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

}  // namespace

std::vector<fs::path> default_model_candidates() {
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  out.push_back((ec ? fs::path(".") : cwd) / "models" / k_default_file);
  if (const std::string dir = env("TESSERA_MODELS"); !dir.empty()) out.push_back(fs::path(dir) / k_default_file);
  if (const std::string data = env("XDG_DATA_HOME"); !data.empty()) {
    out.push_back(fs::path(data) / "tessera" / "models" / k_default_file);
  } else if (const std::string home = env("HOME"); !home.empty()) {
    out.push_back(fs::path(home) / ".local" / "share" / "tessera" / "models" / k_default_file);
  }
#ifdef TESSERA_SOURCE_MODELS_DIR
  out.push_back(fs::path(TESSERA_SOURCE_MODELS_DIR) / k_default_file);
#endif
  return out;
}

fs::path find_default_model() {
  if (const std::string given = env("TESSERA_MODEL"); !given.empty()) return given;
  std::string looked;
  for (const fs::path& p : default_model_candidates()) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    looked += "\n  " + p.string();
  }
  throw load_error("no model given (MODEL or --model PATH) and the default model " + std::string(k_default_file) +
                   " is in none of the places looked in:" + looked);
}

}  // namespace tessera::app
