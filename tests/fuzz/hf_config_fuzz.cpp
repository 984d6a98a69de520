// Hugging Face config.json reader (read_hf_config, engine/model/hf_model.hpp), which takes a model
// directory: each input is written as config.json into a scratch directory of this process. What it
// accepts must pass model_config::validate (the bounds everything downstream relies on).
#include <optional>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/hf_model.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static const fuzz::scratch_dir dir;
  dir.put("config.json", fuzz::as_text(data, size));
  fuzz::check(is_hf_model_dir(dir.path()), "a directory with config.json is not a model directory");
  std::vector<std::string> warnings;
  std::optional<model_config> c;
  try {
    c = read_hf_config(dir.path(), &warnings);
  } catch (const load_error& e) {
    // Refusals name the file.
    fuzz::check(std::string(e.what()).find("config.json") != std::string::npos,
                std::string("error does not name config.json: ") + e.what());
    return 0;
  }
  try {
    c->validate();
  } catch (const load_error& e) {
    fuzz::fail(std::string("read_hf_config returned a config that validate() refuses: ") + e.what());
  }
  return 0;
}
