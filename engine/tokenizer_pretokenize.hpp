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

// UTF-8 -> code points exactly as llama.cpp's unicode_cpts_from_utf8: the length comes from the
// lead byte and only the continuation bytes' top bits are checked (overlong forms and surrogates
// are accepted); a byte that cannot start a complete sequence becomes one U+FFFD.
void decode_utf8_lenient(std::string_view text, std::vector<uint32_t>& out);

// Appends the UTF-8 form of cpt (any value up to U+10FFFF, surrogates included); larger values,
// which only the lenient decoder can produce, are written as U+FFFD.
void append_utf8(uint32_t cpt, std::string& out);

// Splits `cpts` into pieces; appends each piece's length in code points to `lengths` (their sum is
// cpts.size(), no length is 0).
void pretokenize(pretokenizer_kind kind, std::span<const uint32_t> cpts, std::vector<uint32_t>& lengths);

}  // namespace tessera::tokenizer_detail
