// The placeholder tokenizer of dummy models (`--load-format dummy` without a tokenizer.json).
#pragma once
#include <cstdint>
#include <memory>

#include "engine/text/tokenizer.hpp"

namespace tessera {

// A byte-level vocabulary of `vocab_size` tokens: ids 0..255 are the 256 bytes (GPT-2 byte alphabet,
// so any text encodes to one token per byte), the rest are unused placeholders. For dummy models
// without a tokenizer.json: enough to tokenize benchmark prompts. vocab_size >= 256.
std::shared_ptr<const tokenizer> make_byte_tokenizer(int32_t vocab_size);

}  // namespace tessera
