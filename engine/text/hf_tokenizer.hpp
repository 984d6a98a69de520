// The tokenizer's part of a Hugging Face model directory (engine/model/hf_model.hpp reads the model's).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/text/tokenizer.hpp"

namespace tessera {

// tokenizer.json (+ tokenizer_config.json, config.json for special ids) -> vocab_data. The vocabulary
// is padded with unused placeholder tokens up to `min_vocab_size` (checkpoints often round the
// embedding matrix up): pass the model's declared vocab_size. Token ids at or beyond the larger of
// min_vocab_size and the number of tokens the file defines are refused before anything is allocated
// for them, as is a min_vocab_size above 2^24. Throws load_error.
vocab_data read_hf_vocab(const std::filesystem::path& dir, int32_t min_vocab_size = 0,
                         std::vector<std::string>* warnings = nullptr);

// tokenizer_config.json "chat_template" (a string, or the entry named "default" of a list), else
// chat_template.jinja; nullopt when neither exists.
std::optional<std::string> read_hf_chat_template(const std::filesystem::path& dir);

}  // namespace tessera
