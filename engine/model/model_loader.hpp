// One entry point that turns a model path into everything the engine needs: weights, tokenizer and
// chat template, from a GGUF file or a Hugging Face directory (config.json, *.safetensors,
// tokenizer.json, tokenizer_config.json; see engine/model/hf_model.hpp).
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/dummy_weights.hpp"

#include "engine/model/model_weights.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera {

struct loaded_model {
  std::filesystem::path path;
  std::shared_ptr<const model_weights> weights;
  std::shared_ptr<const tokenizer> tok;
  std::optional<std::string> chat_template;  // the model's Jinja source, if it has one
  std::vector<std::string> warnings;         // non-fatal problems worth logging
};

// Where the weights come from: `auto` reads them from the file/directory; `dummy` reads only a Hugging
// Face config.json (`path` is the directory or the file itself) and fills random weights of its shape
// (engine/model/dummy_weights.hpp), with the directory's tokenizer.json when there is one, else a byte-level
// placeholder vocabulary.
enum class load_format { automatic, dummy };

// Throws load_error naming the file and the problem. `dummy` says what load_format::dummy fills in.
loaded_model load_model(const std::filesystem::path& path, load_format format = load_format::automatic,
                        const dummy_weights_options& dummy = {});

// The default model fetched by scripts/setup, relative to the repository / working directory.
std::filesystem::path default_model_path();

}  // namespace tessera
