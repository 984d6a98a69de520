#include "engine/model/model_loader.hpp"

#include <cstdlib>

#include "engine/base/error.hpp"
#include "engine/model/dummy_weights.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/hf_model.hpp"
#include "engine/text/byte_tokenizer.hpp"
#include "engine/text/hf_tokenizer.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

loaded_model load_gguf(const fs::path& path) {
  auto file = gguf_file::open(path);
  loaded_model model;
  model.path = path;
  model.weights = load_gguf_weights(file);
  model.tok = tokenizer::from_gguf(*file);
  model.chat_template = file->get_string("tokenizer.chat_template");
  for (const auto& w : model.tok->warnings()) model.warnings.push_back(w);
  if (static_cast<int64_t>(model.tok->vocab_size()) != model.weights->config.vocab_size) {
    throw load_error(path.string() + ": tokenizer has " + std::to_string(model.tok->vocab_size()) +
                     " tokens but the model's vocabulary is " + std::to_string(model.weights->config.vocab_size));
  }
  return model;
}

loaded_model load_hf(const fs::path& dir) {
  loaded_model model;
  model.path = dir;
  const model_config config = read_hf_config(dir, &model.warnings);
  model.weights = load_hf_weights(dir, config, &model.warnings);
  vocab_data vocab = read_hf_vocab(dir, config.vocab_size, &model.warnings);
  if (vocab.tokens.size() > static_cast<size_t>(config.vocab_size)) {
    throw load_error(dir.string() + ": tokenizer.json has " + std::to_string(vocab.tokens.size()) +
                     " tokens but the model's vocabulary (vocab_size) is " + std::to_string(config.vocab_size));
  }
  try {
    model.tok = std::make_shared<const tokenizer>(std::move(vocab));
  } catch (const load_error& e) { throw load_error((dir / "tokenizer.json").string() + ": " + e.what()); }
  for (const auto& w : model.tok->warnings()) model.warnings.push_back(w);
  model.chat_template = read_hf_chat_template(dir);
  return model;
}

loaded_model load_dummy(const fs::path& path, const dummy_weights_options& options) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? path : path.parent_path();
  if (!is_hf_model_dir(dir)) {
    throw load_error(path.string() +
                     ": --load-format dummy needs a Hugging Face config.json (a directory holding one, or the file)");
  }
  loaded_model model;
  model.path = dir;
  const model_config config = read_hf_config(dir, &model.warnings);
  model.weights = make_dummy_weights(config, options);
  if (fs::exists(dir / "tokenizer.json", ec)) {  // a tokenizer.json that is not a regular file is refused
    model.tok = std::make_shared<const tokenizer>(read_hf_vocab(dir, config.vocab_size, &model.warnings));
    model.chat_template = read_hf_chat_template(dir);
  } else {
    model.tok = make_byte_tokenizer(config.vocab_size);
    model.warnings.push_back(dir.string() +
                             ": no tokenizer.json; dummy model uses a byte-level placeholder vocabulary");
  }
  return model;
}

}  // namespace

loaded_model load_model(const fs::path& path, load_format format, const dummy_weights_options& dummy) {
  std::error_code ec;
  if (format == load_format::dummy) {
    if (!fs::exists(path, ec)) throw load_error(path.string() + ": no such file or directory");
    return load_dummy(path, dummy);
  }
  if (!fs::exists(path, ec)) {
    throw load_error(path.string() + ": no such file or directory (run scripts/setup to fetch the default model)");
  }
  if (fs::is_directory(path, ec)) {
    if (is_hf_model_dir(path)) return load_hf(path);
    throw load_error(path.string() +
                     ": a directory without config.json; pass a .gguf file or a Hugging Face model directory");
  }
  return load_gguf(path);
}

fs::path default_model_path() {
  if (const char* env = std::getenv("TESSERA_MODEL"); env && *env) return env;
  return fs::path("models") / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace tessera
