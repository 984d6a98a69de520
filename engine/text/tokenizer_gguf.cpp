// tokenizer::from_gguf: reads the tokenizer.ggml.* metadata (GGUF spec, "Tokenizer" section:
// https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). Kept apart from tokenizer.cpp so that
// code building vocabularies by hand does not depend on the GGUF reader.
#include <limits>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera {

vocab_data vocab_from_gguf(const gguf_file& file) {
  vocab_data data;
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) throw load_error("tokenizer: tokenizer.ggml.model is missing");
  if (*model == "gpt2") {
    data.kind = vocab_kind::bpe;
  } else if (*model == "llama") {
    data.kind = vocab_kind::spm;
  } else {
    throw load_error("tokenizer: unsupported tokenizer.ggml.model '" + *model + "' (supported: gpt2, llama)");
  }
  data.pre = file.get_string("tokenizer.ggml.pre").value_or("default");

  const std::vector<std::string>* tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) throw load_error("tokenizer: tokenizer.ggml.tokens is missing");
  data.tokens = *tokens;
  const size_t num_tokens = data.tokens.size();

  if (const std::vector<int64_t>* types = file.get_int_array("tokenizer.ggml.token_type")) {
    if (types->size() != num_tokens) {
      throw load_error("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
                       std::to_string(num_tokens) + " tokens");
    }
    data.types.reserve(num_tokens);
    for (int64_t t : *types) {
      // Values outside the GGUF enumeration read as undefined, as in llama.cpp.
      data.types.push_back(t >= 1 && t <= 6 ? static_cast<tessera::token_type>(t) : tessera::token_type::undefined);
    }
  }
  if (const std::vector<double>* scores = file.get_float_array("tokenizer.ggml.scores")) {
    if (scores->size() != num_tokens) {
      throw load_error("tokenizer: tokenizer.ggml.scores has " + std::to_string(scores->size()) + " entries for " +
                       std::to_string(num_tokens) + " tokens");
    }
    data.scores.assign(scores->begin(), scores->end());
  }
  if (data.kind == vocab_kind::bpe) {
    const std::vector<std::string>* merges = file.get_string_array("tokenizer.ggml.merges");
    if (!merges) throw load_error("tokenizer: tokenizer.ggml.merges is missing for a gpt2 tokenizer");
    data.merges = *merges;
  }

  auto read_id = [&](const char* key) -> std::optional<token_id> {
    const std::optional<int64_t> v = file.get_int(key);
    if (!v) return std::nullopt;
    if (*v < 0 || static_cast<uint64_t>(*v) >= num_tokens) {
      throw load_error(std::string("tokenizer: ") + key + " = " + std::to_string(*v) +
                       " is outside the vocabulary of " + std::to_string(num_tokens));
    }
    return static_cast<token_id>(*v);
  };
  data.bos = read_id("tokenizer.ggml.bos_token_id");
  data.eos = read_id("tokenizer.ggml.eos_token_id");
  data.eot = read_id("tokenizer.ggml.eot_token_id");
  data.unk = read_id("tokenizer.ggml.unknown_token_id");
  data.pad = read_id("tokenizer.ggml.padding_token_id");
  if (data.kind == vocab_kind::spm) {
    // llama.cpp's defaults for SentencePiece vocabularies: <unk>=0, <s>=1, </s>=2.
    auto fallback = [&](std::optional<token_id>& id, token_id value) {
      if (!id && static_cast<size_t>(value) < num_tokens) id = value;
    };
    fallback(data.unk, 0);
    fallback(data.bos, 1);
    fallback(data.eos, 2);
  }
  data.add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
  data.add_eos = file.get_bool("tokenizer.ggml.add_eos_token");
  data.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
  return data;
}

std::shared_ptr<const tokenizer> tokenizer::from_gguf(const gguf_file& file) {
  return std::make_shared<const tokenizer>(vocab_from_gguf(file));
}

}  // namespace tessera
