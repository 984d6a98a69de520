// Hugging Face model directories: config.json, model.safetensors (or shards listed in
// model.safetensors.index.json), tokenizer.json, tokenizer_config.json (+ chat_template.jinja); this file reads
// the model's part (config and weights), engine/text/hf_tokenizer.hpp the tokenizer's.
//
// Supported: the decoders as transformers names them (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM; docs/models.md)
// with F32/F16/BF16 weights, and BPE tokenizers (byte-level, or SentencePiece-style with byte_fallback)
// whose pre-tokenizer is one of those engine/text/tokenizer.hpp implements. Weights are used in place from the
// mapping (HF stores [out_features, in_features] row-major, which is weight_tensor's layout); RoPE
// is rope_style::half, because HF checkpoints keep Q/K rows in rotate_half order.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_weights.hpp"

namespace tessera {

// True when `dir` is a directory holding config.json.
bool is_hf_model_dir(const std::filesystem::path& dir);

// config.json -> model_config (validated). Non-fatal notes (e.g. a sliding window capping the
// context) are appended to `warnings`. Throws load_error.
model_config read_hf_config(const std::filesystem::path& dir, std::vector<std::string>* warnings = nullptr);

// Binds every tensor of the checkpoint in `dir` to `config`. Throws load_error.
std::shared_ptr<const model_weights> load_hf_weights(const std::filesystem::path& dir, const model_config& config,
                                                     std::vector<std::string>* warnings = nullptr);

}  // namespace tessera
