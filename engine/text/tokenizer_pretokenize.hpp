// Pre-tokenizers: split text into the pieces that byte-level BPE then merges independently.
// Each kind is a hand-written matcher equivalent to the split regex llama.cpp uses for that
// `tokenizer.ggml.pre` value (src/llama-vocab.cpp, src/unicode.cpp); std::regex is not used (no
// Unicode classes, backtracking, and far too slow on long runs). Every matcher is linear in the
// number of code points.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/utf8.hpp"

namespace tessera::tokenizer_detail {

enum class pretokenizer_kind {
  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  // SmolLM / StarCoder / Refact / Command-R ...: first \p{N} (every digit alone), then GPT-2 on
  // the text between digits.
  digits_then_gpt2,
  // LLaMA-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  llama3,
  // Qwen2: the LLaMA-3 expression with \p{N} (single digits) instead of \p{N}{1,3}.
  qwen2,
};

// Splits `cpts` into pieces; appends each piece's length in code points to `lengths` (their sum is
// cpts.size(), no length is 0).
void pretokenize(pretokenizer_kind kind, std::span<const uint32_t> cpts, std::vector<uint32_t>& lengths);

}  // namespace tessera::tokenizer_detail
