// A character-level test tokenizer for the engine and actor tests that run on the simulated executor:
// token 0 is the end-of-sequence control token, tokens 1..63 single printable characters (which the
// GPT-2 byte alphabet maps to themselves), so outputs read as text.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "engine/text/tokenizer.hpp"

namespace tessera::test_support {

constexpr int32_t char_vocab = 64;

inline std::shared_ptr<const tokenizer> char_tokenizer() {
  vocab_data v;
  v.kind = vocab_kind::bpe;
  v.tokens.push_back("<|end|>");
  v.types.push_back(token_type::control);
  const std::string chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?:;=+-*/()";
  for (int32_t i = 1; i < char_vocab; ++i) {
    v.tokens.push_back(std::string(1, chars[static_cast<size_t>(i - 1)]));
    v.types.push_back(token_type::normal);
  }
  v.eos = 0;
  return std::make_shared<const tokenizer>(std::move(v));
}

}  // namespace tessera::test_support
