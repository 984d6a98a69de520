// Detokenizer tests: decode(), token_to_piece(), UTF-8 sanitising and the incremental detokenizer
// that must never emit a broken character while tokens stream in.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/text/tokenizer.hpp"
#include "engine/text/tokenizer_pretokenize.hpp"

namespace tessera {
namespace {

std::string utf8(uint32_t cpt) {
  std::string s;
  append_utf8(cpt, s);
  return s;
}

// A byte-level vocabulary with only the 256 byte tokens: every byte of the text is one token, the
// worst case for characters split across tokens. Byte b's token is id b.
std::shared_ptr<const tokenizer> byte_vocab() {
  vocab_data d;
  std::vector<bool> direct(256, false);
  for (int c = '!'; c <= '~'; ++c) direct[c] = true;
  for (int c = 0xA1; c <= 0xAC; ++c) direct[c] = true;
  for (int c = 0xAE; c <= 0xFF; ++c) direct[c] = true;
  uint32_t extra = 0;
  for (int b = 0; b < 256; ++b) d.tokens.push_back(utf8(direct[b] ? b : 256 + extra++));
  d.tokens.push_back("<|end|>");
  d.types.assign(256, token_type::normal);
  d.types.push_back(token_type::control);
  return std::make_shared<const tokenizer>(d);
}

std::vector<token_id> byte_ids(std::string_view s) {
  std::vector<token_id> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

// Strict validity, written independently of the library (RFC 3629 section 4 syntax).
bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n;
    uint32_t cpt;
    if (b < 0x80) {
      n = 1;
      cpt = b;
    } else if ((b & 0xE0) == 0xC0) {
      n = 2;
      cpt = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 3;
      cpt = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 4;
      cpt = b & 0x07;
    } else
      return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cpt = cpt << 6 | (c & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cpt < min[n] || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

const std::string k_fffd = "\xEF\xBF\xBD";

TEST(Utf8Sanitize, ReplacesMaximalSubparts) {
  EXPECT_EQ(sanitize_utf8("plain \xE4\xB8\xAD"), "plain \xE4\xB8\xAD");
  EXPECT_EQ(sanitize_utf8("a\xFF"
                          "b"),
            "a" + k_fffd + "b");
  // A truncated 3-byte sequence followed by ASCII is one maximal subpart.
  EXPECT_EQ(sanitize_utf8("\xE4\xB8"
                          "x"),
            k_fffd + "x");
  // Overlong, surrogate and too-large forms: every byte is its own subpart.
  EXPECT_EQ(sanitize_utf8("\xC0\x80"), k_fffd + k_fffd);
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), k_fffd + k_fffd + k_fffd);
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), k_fffd + k_fffd + k_fffd + k_fffd);
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98"), k_fffd);  // incomplete at the end
  const utf8_split split = split_valid_utf8("ok\xF0\x9F\x98");
  EXPECT_EQ(split.complete, "ok");
  EXPECT_EQ(split.tail, "\xF0\x9F\x98");
}

TEST(Utf8Sanitize, OutputIsAlwaysValid) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string junk;
    const int len = static_cast<int>(rng() % 16);
    for (int i = 0; i < len; ++i) {
      // Bias towards bytes that form or almost form sequences.
      const uint8_t pool[] = {0x41, 0x80, 0xBF, 0xC2, 0xC0, 0xE0, 0xED, 0xA0, 0xF0, 0xF4, 0x90, 0x8F, 0xFF};
      junk.push_back(static_cast<char>(rng() % 3 ? pool[rng() % sizeof(pool)] : rng() & 0xFF));
    }
    const std::string clean = sanitize_utf8(junk);
    ASSERT_TRUE(is_valid_utf8(clean)) << ::testing::PrintToString(junk);
    if (is_valid_utf8(junk)) { ASSERT_EQ(clean, junk); }
  }
}

TEST(Decode, PiecesAndSpecialTokens) {
  const auto tok = byte_vocab();
  EXPECT_EQ(tok->token_to_piece(' '), " ");
  EXPECT_EQ(tok->token_to_piece(0), std::string(1, '\0'));
  EXPECT_EQ(tok->token_to_piece(256), "<|end|>");
  const std::vector<token_id> ids = {'h', 'i', 256};
  EXPECT_EQ(tok->decode(ids), "hi<|end|>");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "hi");
  EXPECT_THROW(tok->token_to_piece(257), invalid_request);
  EXPECT_THROW(tok->decode(std::vector<token_id>{-1}), invalid_request);
}

TEST(IncrementalDetokenizer, HoldsBackSplitCharacters) {
  const auto tok = byte_vocab();
  incremental_detokenizer detok(tok);
  const std::string emoji = "\xF0\x9F\x98\x80";  // 😀: four byte tokens
  const auto ids = byte_ids(emoji);
  EXPECT_EQ(detok.push(ids[0]), "");
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.push(ids[3]), emoji);
  EXPECT_EQ(detok.push('a'), "a");
  const std::string cjk = "\xE4\xB8\xAD";  // 中
  EXPECT_EQ(detok.push(static_cast<uint8_t>(cjk[0])), "");
  EXPECT_EQ(detok.push(static_cast<uint8_t>(cjk[1])), "");
  EXPECT_EQ(detok.flush(), k_fffd);  // the character never completed
  EXPECT_EQ(detok.flush(), "");
}

TEST(IncrementalDetokenizer, InvalidBytesDoNotBlockTheStream) {
  const auto tok = byte_vocab();
  incremental_detokenizer detok(tok);
  EXPECT_EQ(detok.push(0xFF), k_fffd);
  EXPECT_EQ(detok.push(0xE4), "");
  EXPECT_EQ(detok.push('x'), k_fffd + "x");  // 0xE4 can no longer complete
  EXPECT_EQ(detok.push(256), "<|end|>");
  incremental_detokenizer skipping(tok, /*skip_special=*/true);
  EXPECT_EQ(skipping.push(256), "");
  EXPECT_EQ(skipping.push('y'), "y");
}

TEST(IncrementalDetokenizer, ConcatenationEqualsDecode) {
  // Random mixes of 1- to 4-byte characters through a vocabulary with random merges, so tokens
  // both split and join characters.
  vocab_data d;
  std::vector<std::string> plain;
  std::vector<bool> direct(256, false);
  for (int c = '!'; c <= '~'; ++c) direct[c] = true;
  for (int c = 0xA1; c <= 0xAC; ++c) direct[c] = true;
  for (int c = 0xAE; c <= 0xFF; ++c) direct[c] = true;
  std::vector<std::string> alphabet(256);
  uint32_t extra = 0;
  for (int b = 0; b < 256; ++b) {
    alphabet[b] = utf8(direct[b] ? b : 256 + extra++);
    d.tokens.push_back(alphabet[b]);
    plain.emplace_back(1, static_cast<char>(b));
  }
  auto mapped = [&](const std::string& s) {
    std::string m;
    for (char c : s) m += alphabet[static_cast<uint8_t>(c)];
    return m;
  };
  const std::vector<std::string> chars = {"a",
                                          " ",
                                          "\n",
                                          "\xC3\xA9",
                                          "\xE4\xB8\xAD",
                                          "\xE6\x96\x87",
                                          "\xF0\x9F\x98\x80",
                                          "\xF0\x9F\x91\x8D",
                                          "\xF0\x9F\x8F\xBD"};
  std::mt19937 rng(9);
  for (int i = 0; i < 60; ++i) {
    // Merge random adjacent byte strings taken from real characters (including partial ones).
    const std::string& c1 = chars[rng() % chars.size()];
    const std::string& c2 = chars[rng() % chars.size()];
    const std::string joined = c1 + c2;
    const size_t a = rng() % joined.size();
    const size_t len = 2 + rng() % 3;
    if (a + len > joined.size()) continue;
    const std::string piece = joined.substr(a, len);
    const std::string left = piece.substr(0, 1), right = piece.substr(1);
    if (std::find(plain.begin(), plain.end(), right) == plain.end()) continue;
    if (std::find(plain.begin(), plain.end(), piece) != plain.end()) continue;
    d.tokens.push_back(mapped(piece));
    plain.push_back(piece);
    d.merges.push_back(mapped(left) + " " + mapped(right));
  }
  const auto tok = std::make_shared<const tokenizer>(d);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < len; ++i) text += chars[rng() % chars.size()];
    const auto ids = tok->encode(text);
    ASSERT_EQ(tok->decode(ids), text);
    incremental_detokenizer detok(tok);
    std::string streamed;
    for (token_id id : ids) {
      const std::string part = detok.push(id);
      ASSERT_TRUE(is_valid_utf8(part)) << ::testing::PrintToString(text);
      streamed += part;
    }
    streamed += detok.flush();
    ASSERT_EQ(streamed, text);
  }
}

TEST(IncrementalDetokenizer, SentencePieceLeadingSpaceLikeDecode) {
  vocab_data d;
  d.kind = vocab_kind::spm;
  d.tokens = {"<unk>", "<s>", "</s>", "!"};
  d.types = {token_type::unknown, token_type::control, token_type::control, token_type::normal};
  // Every prefix of the words, so that character-by-character merging can reach them.
  for (const std::string word : {"\xE2\x96\x81hi", "\xE2\x96\x81there"}) {
    for (size_t len = 3; len <= word.size(); ++len) {
      if (std::find(d.tokens.begin(), d.tokens.end(), word.substr(0, len)) != d.tokens.end()) continue;
      d.tokens.push_back(word.substr(0, len));
      d.types.push_back(token_type::normal);
      d.scores.resize(d.tokens.size() - 1, 0.0f);
      d.scores.push_back(static_cast<float>(len));
    }
  }
  d.scores.resize(d.tokens.size(), 0.0f);
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  const auto tok = std::make_shared<const tokenizer>(d);
  const auto ids = tok->encode("hi there!", {.add_special = true});
  ASSERT_EQ(ids, (std::vector<token_id>{1, *tok->find_token("\xE2\x96\x81hi"), *tok->find_token("\xE2\x96\x81there"),
                                        *tok->find_token("!")}));
  EXPECT_EQ(tok->decode(ids), "<s>hi there!");
  EXPECT_EQ(tok->decode(ids, true), "hi there!");
  incremental_detokenizer detok(tok, true);
  std::string streamed;
  for (token_id id : ids) streamed += detok.push(id);
  streamed += detok.flush();
  EXPECT_EQ(streamed, "hi there!");
}

TEST(IncrementalDetokenizer, SmolLmStream) {
  const std::filesystem::path model = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "model not found: " << model;
  const auto tok = tokenizer::from_gguf(*gguf_file::open(model));
  const std::string text =
      "Hi \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE4\xB8\x96\xE7\x95\x8C, caf\xC3\xA9!\n";
  const auto ids = tok->encode(text);
  incremental_detokenizer detok(tok);
  std::string streamed;
  for (token_id id : ids) {
    const std::string part = detok.push(id);
    EXPECT_TRUE(is_valid_utf8(part));
    streamed += part;
  }
  streamed += detok.flush();
  EXPECT_EQ(streamed, text);
}

}  // namespace
}  // namespace tessera
