// The tokenizer (engine/text/tokenizer.hpp) with the real default model's vocabulary (SmolLM2's
// 49152-token byte-level BPE, read from models/ or $TESSERA_FUZZ_MODEL; the target exits 77, "skip",
// without it). The first input byte selects the mode, the rest is the text:
//
//   bit 0: parse_special   bit 1: add_special   bit 2: skip_special when decoding
//   bit 3: also decode the text's bytes read as little-endian u16 token ids (some beyond the vocabulary)
//
// Oracles besides the sanitizers: every id is inside the vocabulary; without add_special,
// decode(encode(s)) == s for valid UTF-8 whose bytes all have byte tokens (docs/tokenizer.md); the
// incremental detokenizer returns valid UTF-8 only and, for ids whose decode() is valid UTF-8,
// exactly decode(ids); decoding ids outside the vocabulary throws invalid_request and nothing else.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/text/tokenizer.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace tessera;

std::shared_ptr<const tokenizer> g_tok;
std::array<bool, 256> g_byte_has_token{};  // the byte's GPT-2 alphabet character is a token

// GPT-2's bytes_to_unicode (Radford et al. 2019), written out here independently of the engine: the
// printable Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards in byte order.
std::array<std::string, 256> gpt2_byte_alphabet() {
  std::array<std::string, 256> out;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cpt = printable ? b : next++;
    std::string s;
    if (cpt < 0x80) {
      s += static_cast<char>(cpt);
    } else {
      s += static_cast<char>(0xC0 | (cpt >> 6));
      s += static_cast<char>(0x80 | (cpt & 0x3F));
    }
    out[static_cast<size_t>(b)] = s;
  }
  return out;
}

bool valid_utf8(std::string_view s) { return sanitize_utf8(s) == s; }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("TESSERA_FUZZ_MODEL");
  const std::filesystem::path path =
      env && *env ? std::filesystem::path(env) : std::filesystem::path(TESSERA_FUZZ_MODEL);
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "tokenizer_fuzz: %s is missing (run scripts/setup, or set TESSERA_FUZZ_MODEL): skipped\n",
                 path.c_str());
    std::exit(77);
  }
  g_tok = tokenizer::from_gguf(*gguf_file::open(path));
  const auto alphabet = gpt2_byte_alphabet();
  for (size_t b = 0; b < 256; ++b) g_byte_has_token[b] = g_tok->find_token(alphabet[b]).has_value();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const tokenizer& tok = *g_tok;
  const uint8_t mode = data[0];
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  const encode_options options{.add_special = (mode & 2) != 0, .parse_special = (mode & 1) != 0};
  const bool skip_special = (mode & 4) != 0;

  const std::vector<token_id> ids = tok.encode(text, options);
  for (token_id id : ids) {
    fuzz::check(id >= 0 && static_cast<size_t>(id) < tok.vocab_size(), "encode produced an id outside the vocabulary");
  }
  const std::string decoded = tok.decode(ids);
  if (!options.add_special && valid_utf8(text)) {
    bool all_bytes_have_tokens = true;
    for (char c : text) all_bytes_have_tokens &= g_byte_has_token[static_cast<uint8_t>(c)];
    if (all_bytes_have_tokens) fuzz::check(decoded == text, "decode(encode(text)) != text");
  }

  // The streaming detokenizer over the same ids.
  const std::string expected = tok.decode(ids, skip_special);
  incremental_detokenizer detok(g_tok, skip_special);
  std::string streamed;
  for (token_id id : ids) {
    const std::string piece = detok.push(id);
    fuzz::check(valid_utf8(piece), "incremental_detokenizer::push returned invalid UTF-8");
    streamed += piece;
  }
  const std::string tail = detok.flush();
  fuzz::check(valid_utf8(tail), "incremental_detokenizer::flush returned invalid UTF-8");
  streamed += tail;
  if (valid_utf8(expected)) fuzz::check(streamed == expected, "streamed text != decode(ids)");

  if (mode & 8) {
    // Arbitrary ids, about 1 in 4 beyond the vocabulary.
    std::vector<token_id> raw;
    bool out_of_range = false;
    for (size_t i = 0; i + 1 < text.size(); i += 2) {
      const auto v = static_cast<uint16_t>(static_cast<uint8_t>(text[i]) | (static_cast<uint8_t>(text[i + 1]) << 8));
      const auto id = static_cast<token_id>(v % (tok.vocab_size() * 4 / 3));
      out_of_range |= static_cast<size_t>(id) >= tok.vocab_size();
      raw.push_back(id);
    }
    try {
      (void)tok.decode(raw, skip_special);
      fuzz::check(!out_of_range, "decode accepted an id outside the vocabulary");
    } catch (const invalid_request&) { fuzz::check(out_of_range, "decode refused ids inside the vocabulary"); }
  }
  return 0;
}
