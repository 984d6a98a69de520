#include "engine/text/byte_tokenizer.hpp"

#include <string>

#include "engine/base/error.hpp"
#include "engine/base/utf8.hpp"

namespace tessera {

std::shared_ptr<const tokenizer> make_byte_tokenizer(int32_t vocab_size) {
  if (vocab_size < 256)
    throw load_error("byte tokenizer: a vocabulary of " + std::to_string(vocab_size) + " < 256 tokens");
  vocab_data v;
  v.kind = vocab_kind::bpe;
  v.pre = "gpt2";
  v.tokens.reserve(static_cast<size_t>(vocab_size));
  v.types.reserve(static_cast<size_t>(vocab_size));
  // GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others for U+0100 + n.
  int32_t shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(shifted++);
    std::string utf8;
    append_utf8(cp, utf8);
    v.tokens.push_back(std::move(utf8));
    v.types.push_back(token_type::normal);
  }
  for (int32_t i = 256; i < vocab_size; ++i) {
    v.tokens.push_back("<unused_" + std::to_string(i) + ">");
    v.types.push_back(token_type::unused);
  }
  v.add_bos = false;
  return std::make_shared<const tokenizer>(std::move(v));
}

}  // namespace tessera
