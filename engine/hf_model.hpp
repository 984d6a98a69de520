// Hugging Face model directories: config.json, model.safetensors (or shards listed in
// model.safetensors.index.json), tokenizer.json, tokenizer_config.json (+ chat_template.jinja).
//
// Supported: LLaMA-family decoders as transformers names them (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM without biases) with F32/F16/BF16 weights, and byte-level BPE tokenizers whose
// pre-tokenizer is one of those engine/tokenizer.hpp implements. Weights are used in place from the
// mapping (HF stores [out_features, in_features] row-major, which is weight_tensor's layout); RoPE
// is rope_style::half, because HF checkpoints keep Q/K rows in rotate_half order.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model_weights.hpp"
#include "engine/tokenizer.hpp"

namespace tessera {

// True when `dir` is a directory holding config.json.
bool is_hf_model_dir(const std::filesystem::path& dir);

// config.json -> model_config (validated). Non-fatal notes (e.g. a sliding window capping the
// context) are appended to `warnings`. Throws load_error.
model_config read_hf_config(const std::filesystem::path& dir, std::vector<std::string>* warnings = nullptr);

// Binds every tensor of the checkpoint in `dir` to `config`. Throws load_error.
std::shared_ptr<const model_weights> load_hf_weights(const std::filesystem::path& dir, const model_config& config,
                                                     std::vector<std::string>* warnings = nullptr);

// tokenizer.json (+ tokenizer_config.json, config.json for special ids) -> vocab_data. The vocabulary
// is padded with unused placeholder tokens up to `min_vocab_size` (checkpoints often round the
// embedding matrix up). Throws load_error.
vocab_data read_hf_vocab(const std::filesystem::path& dir, int32_t min_vocab_size = 0,
                         std::vector<std::string>* warnings = nullptr);

// tokenizer_config.json "chat_template" (a string, or the entry named "default" of a list), else
// chat_template.jinja; nullopt when neither exists.
std::optional<std::string> read_hf_chat_template(const std::filesystem::path& dir);

struct hf_model {
  std::shared_ptr<const model_weights> weights;
  std::shared_ptr<const tokenizer> tok;
  std::optional<std::string> chat_template;
  std::vector<std::string> warnings;
};

// All of the above. Throws load_error naming the file and the problem.
hf_model load_hf_model(const std::filesystem::path& dir);

}  // namespace tessera
