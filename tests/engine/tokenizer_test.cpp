// Tokenizer tests: pre-tokenizer splits, BPE / SentencePiece merging against naive reference
// implementations written here, special tokens, hostile vocabularies, complexity guards, and parity
// with llama.cpp on the SmolLM2 vocabulary (tests/data/tokenizer/smollm_parity.jsonl, made by
// scripts/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/text/tokenizer.hpp"
#include "engine/text/tokenizer_pretokenize.hpp"
#include "engine/text/unicode_tables.hpp"
#include "support/base64.hpp"

namespace tessera {
namespace {

using tokenizer_detail::pretokenizer_kind;

// Complexity guards allow for sanitizer builds, which run several times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double k_time_scale = 10.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr double k_time_scale = 10.0;
#else
constexpr double k_time_scale = 1.0;
#endif
#else
constexpr double k_time_scale = 1.0;
#endif

// ---- helpers -------------------------------------------------------------------------------------

std::string utf8(uint32_t cpt) {
  std::string s;
  append_utf8(cpt, s);
  return s;
}

// GPT-2's bytes_to_unicode(), written out independently of the library.
std::string gpt2_char(uint8_t b) {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256, 0);
    std::vector<bool> direct(256, false);
    for (int c = '!'; c <= '~'; ++c) direct[c] = true;
    for (int c = 0xA1; c <= 0xAC; ++c) direct[c] = true;
    for (int c = 0xAE; c <= 0xFF; ++c) direct[c] = true;
    uint32_t n = 0;
    for (int c = 0; c < 256; ++c) t[c] = direct[c] ? c : 256 + n++;
    return t;
  }();
  return utf8(table[b]);
}

std::string gpt2_text(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += gpt2_char(static_cast<uint8_t>(c));
  return out;
}

// A byte-level BPE vocabulary: all 256 byte characters, then `extra` (plain text), then `specials`.
struct bpe_builder {
  vocab_data data;
  std::vector<std::string> plain;  // plain text of each token (specials: their text)

  bpe_builder() {
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  }
  token_id add(const std::string& text, token_type type = token_type::normal) {
    data.tokens.push_back(type == token_type::normal ? gpt2_text(text) : text);
    data.types.push_back(type);
    plain.push_back(text);
    return static_cast<token_id>(data.tokens.size() - 1);
  }
  // Adds the merge left+right (both plain text) and its result token when missing.
  void merge(const std::string& left, const std::string& right) {
    if (std::find(plain.begin(), plain.end(), left + right) == plain.end()) add(left + right);
    data.merges.push_back(gpt2_text(left) + " " + gpt2_text(right));
  }
  token_id id(const std::string& text) const {
    return static_cast<token_id>(std::find(plain.begin(), plain.end(), text) - plain.begin());
  }
};

// Reference BPE: repeatedly merge the adjacent pair of lowest rank (leftmost first). Quadratic.
std::vector<std::string> naive_bpe(const std::string& word,
                                   const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> syms;
  for (char c : word) syms.emplace_back(1, c);
  for (;;) {
    size_t best_rank = SIZE_MAX, best_pos = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      for (size_t r = 0; r < merges.size() && r < best_rank; ++r) {
        if (merges[r].first == syms[i] && merges[r].second == syms[i + 1]) {
          best_rank = r;
          best_pos = i;
          break;
        }
      }
    }
    if (best_rank == SIZE_MAX) return syms;
    syms[best_pos] += syms[best_pos + 1];
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
}

std::vector<std::string> split(pretokenizer_kind kind, const std::string& text) {
  std::vector<uint32_t> cpts;
  decode_utf8_lenient(text, cpts);
  std::vector<uint32_t> lengths;
  tokenizer_detail::pretokenize(kind, cpts, lengths);
  std::vector<std::string> pieces;
  size_t pos = 0;
  for (uint32_t len : lengths) {
    EXPECT_GT(len, 0u);
    std::string piece;
    for (size_t i = pos; i < pos + len; ++i) append_utf8(cpts[i], piece);
    pieces.push_back(piece);
    pos += len;
  }
  EXPECT_EQ(pos, cpts.size());
  return pieces;
}

using pieces = std::vector<std::string>;

// ---- Unicode classes and UTF-8 -----------------------------------------------------------------

TEST(UnicodeTables, CategoriesFromTheStandard) {
  namespace uf = unicode_flag;
  EXPECT_EQ(unicode_flags_lookup('a'), uf::letter);
  EXPECT_EQ(unicode_flags_lookup('7'), uf::number);
  EXPECT_EQ(unicode_flags_lookup('!'), uf::punctuation);
  EXPECT_EQ(unicode_flags_lookup('+'), uf::symbol);
  EXPECT_EQ(unicode_flags_lookup(' '), uf::separator | uf::whitespace);
  EXPECT_EQ(unicode_flags_lookup('\n'), uf::control | uf::whitespace);
  EXPECT_EQ(unicode_flags_lookup(0x1F), uf::control);   // not White_Space, unlike str.isspace()
  EXPECT_EQ(unicode_flags_lookup(0x4E2D), uf::letter);  // 中 (Lo, inside a First/Last range)
  EXPECT_EQ(unicode_flags_lookup(0x0663), uf::number);  // ARABIC-INDIC DIGIT THREE
  EXPECT_EQ(unicode_flags_lookup(0x2167), uf::number);  // ROMAN NUMERAL EIGHT (Nl)
  EXPECT_EQ(unicode_flags_lookup(0x0301), uf::mark);    // COMBINING ACUTE ACCENT
  EXPECT_EQ(unicode_flags_lookup(0x3000), uf::separator | uf::whitespace);
  EXPECT_EQ(unicode_flags_lookup(0x0085), uf::control | uf::whitespace);
  EXPECT_EQ(unicode_flags_lookup(0x200B), uf::control);    // ZERO WIDTH SPACE is Cf
  EXPECT_EQ(unicode_flags_lookup(0xD800), uf::control);    // surrogate
  EXPECT_EQ(unicode_flags_lookup(0xE000), uf::control);    // private use
  EXPECT_EQ(unicode_flags_lookup(0x1F600), uf::symbol);    // 😀
  EXPECT_EQ(unicode_flags_lookup(0x0378), uf::undefined);  // unassigned
  EXPECT_EQ(unicode_flags_lookup(0x10FFFF), uf::undefined);
  EXPECT_EQ(unicode_flags_lookup(0x110000), uf::undefined);
}

TEST(Utf8Lenient, MatchesLlamaCppDecoding) {
  std::vector<uint32_t> cpts;
  decode_utf8_lenient("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80", cpts);
  EXPECT_EQ(cpts, (std::vector<uint32_t>{'a', 0xE9, 0x4E2D, 0x1F600}));
  cpts.clear();
  // Stray continuation, truncated 3-byte sequence followed by ASCII, 0xFF: one U+FFFD per byte.
  decode_utf8_lenient(
      "\x80"
      "\xE4\xB8"
      "x\xFF",
      cpts);
  EXPECT_EQ(cpts, (std::vector<uint32_t>{0xFFFD, 0xFFFD, 0xFFFD, 'x', 0xFFFD}));
  cpts.clear();
  // Overlong and surrogate forms are accepted as their (invalid) code points.
  decode_utf8_lenient("\xC0\x80\xED\xA0\x80", cpts);
  EXPECT_EQ(cpts, (std::vector<uint32_t>{0, 0xD800}));
  cpts.clear();
  decode_utf8_lenient("\xE4", cpts);  // truncated at the end
  EXPECT_EQ(cpts, (std::vector<uint32_t>{0xFFFD}));
}

// ---- pre-tokenizers: expected pieces follow from the split expressions in the header ----------

TEST(Pretokenize, Gpt2) {
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "Hello world"), (pieces{"Hello", " world"}));
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "it's 2024!!  ok"), (pieces{"it", "'s", " 2024", "!!", " ", " ok"}));
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "a   b"), (pieces{"a", "  ", " b"}));
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "end   "), (pieces{"end", "   "}));          // trailing run stays whole
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "x\n\ny"), (pieces{"x", "\n", "\n", "y"}));  // only ' ' prefixes a word
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "I'M"), (pieces{"I", "'", "M"}));            // case-sensitive contractions
  EXPECT_EQ(split(pretokenizer_kind::gpt2, "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"),
            (pieces{"caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_EQ(split(pretokenizer_kind::gpt2, " \xF0\x9F\x98\x80\xF0\x9F\x98\x80x"),
            (pieces{" \xF0\x9F\x98\x80\xF0\x9F\x98\x80", "x"}));
  EXPECT_EQ(split(pretokenizer_kind::gpt2,
                  "\xE3\x80\x80\xE3\x80\x80"
                  "a"),
            (pieces{"\xE3\x80\x80", "\xE3\x80\x80", "a"}));
  EXPECT_TRUE(split(pretokenizer_kind::gpt2, "").empty());
}

TEST(Pretokenize, DigitsThenGpt2) {
  // Every digit alone; the GPT-2 split sees the runs between digits as separate texts.
  EXPECT_EQ(split(pretokenizer_kind::digits_then_gpt2, "abc 12345 x"),
            (pieces{"abc", " ", "1", "2", "3", "4", "5", " x"}));
  EXPECT_EQ(split(pretokenizer_kind::digits_then_gpt2, "a  1"), (pieces{"a", "  ", "1"}));
  EXPECT_EQ(split(pretokenizer_kind::digits_then_gpt2, "\xD9\xA3\xD9\xA4"), (pieces{"\xD9\xA3", "\xD9\xA4"}));
}

TEST(Pretokenize, Llama3AndQwen2) {
  EXPECT_EQ(split(pretokenizer_kind::llama3, "1234567"), (pieces{"123", "456", "7"}));
  EXPECT_EQ(split(pretokenizer_kind::qwen2, "1234"), (pieces{"1", "2", "3", "4"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, "I'M here"), (pieces{"I", "'M", " here"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, "(hello)"), (pieces{"(hello", ")"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, "x;\n\ny"), (pieces{"x", ";\n\n", "y"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, "a \n \n b"), (pieces{"a", " \n \n", " b"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, "a   b"), (pieces{"a", "  ", " b"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, "\tfoo"), (pieces{"\tfoo"}));
  EXPECT_EQ(split(pretokenizer_kind::llama3, " 42"), (pieces{" ", "42"}));
}

TEST(Pretokenize, LinearOnLongRuns) {
  for (const char* unit : {"a", " ", "1", "!", "\n", "\xE4\xB8\xAD"}) {
    std::string text;
    for (int i = 0; i < 200000; ++i) text += unit;
    for (auto kind : {pretokenizer_kind::gpt2, pretokenizer_kind::digits_then_gpt2, pretokenizer_kind::llama3,
                      pretokenizer_kind::qwen2}) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<uint32_t> cpts, lengths;
      decode_utf8_lenient(text, cpts);
      tokenizer_detail::pretokenize(kind, cpts, lengths);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 1.0 * k_time_scale) << "unit '" << unit << "'";
    }
  }
}

// ---- byte-level BPE ----------------------------------------------------------------------------

TEST(BpeTokenizer, MergesByRankNotPosition) {
  bpe_builder b;
  b.merge("b", "c");   // rank 0
  b.merge("a", "b");   // rank 1
  b.merge("a", "bc");  // rank 2
  const tokenizer tok(b.data);
  // "abc": (b,c) outranks (a,b), then (a,bc) applies.
  EXPECT_EQ(tok.encode("abc"), (std::vector<token_id>{b.id("abc")}));
  EXPECT_EQ(tok.encode("ab"), (std::vector<token_id>{b.id("ab")}));
  EXPECT_EQ(tok.encode("abcb"), (std::vector<token_id>{b.id("abc"), b.id("b")}));
  EXPECT_EQ(tok.decode(tok.encode("abcb")), "abcb");
}

TEST(BpeTokenizer, MatchesNaiveReferenceOnRandomWords) {
  std::mt19937 rng(7);
  const std::string alphabet = "abcd";
  bpe_builder b;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> known = {"a", "b", "c", "d"};
  for (int i = 0; i < 40; ++i) {
    const std::string l = known[rng() % known.size()], r = known[rng() % known.size()];
    if (std::find(merges.begin(), merges.end(), std::make_pair(l, r)) != merges.end()) continue;
    merges.emplace_back(l, r);
    b.merge(l, r);
    if (std::find(known.begin(), known.end(), l + r) == known.end()) known.push_back(l + r);
  }
  const tokenizer tok(b.data);
  for (int trial = 0; trial < 300; ++trial) {
    std::string word;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) word += alphabet[rng() % alphabet.size()];
    std::vector<token_id> expected;
    for (const std::string& s : naive_bpe(word, merges)) expected.push_back(b.id(s));
    ASSERT_EQ(tok.encode(word), expected) << word;
    ASSERT_EQ(tok.decode(expected), word);
  }
}

TEST(BpeTokenizer, EveryByteStringRoundTripsAndInvalidBytesBecomeReplacement) {
  bpe_builder b;
  b.merge(" ", "t");
  b.merge("h", "e");
  const tokenizer tok(b.data);
  const std::string valid = "the \xE4\xB8\xAD\xF0\x9F\x98\x80 \t\n";
  EXPECT_EQ(tok.decode(tok.encode(valid)), valid);
  // llama.cpp turns each invalid byte into U+FFFD before byte encoding.
  EXPECT_EQ(tok.decode(tok.encode("a\xFF"
                                  "b")),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tok.decode(tok.encode("\xE4\xB8")), "\xEF\xBF\xBD\xEF\xBF\xBD");
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string junk;
    for (int i = 0; i < 12; ++i) junk.push_back(static_cast<char>(rng() & 0xFF));
    (void)tok.encode(junk, {.add_special = true, .parse_special = true});  // must not crash
  }
}

TEST(BpeTokenizer, SpecialTokensOnlyWhenAsked) {
  bpe_builder b;
  const token_id im_start = b.add("<|im_start|>", token_type::control);
  const token_id im_end = b.add("<|im_end|>", token_type::control);
  const token_id user = b.add("<tool>", token_type::user_defined);
  b.data.bos = im_start;
  b.data.eos = im_end;
  const tokenizer tok(b.data);
  const std::string text = "<|im_start|>hi<tool>";
  const auto plain = tok.encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), user), 1);  // user-defined: always, as llama.cpp
  EXPECT_EQ(tok.decode(plain), text);
  const auto parsed = tok.encode(text, {.parse_special = true});
  EXPECT_EQ(parsed, (std::vector<token_id>{im_start, b.id("h"), b.id("i"), user}));
  EXPECT_EQ(tok.decode(parsed), text);
  EXPECT_EQ(tok.decode(parsed, /*skip_special=*/true), "hi<tool>");
  EXPECT_TRUE(tok.is_eog(im_end));
  EXPECT_FALSE(tok.is_eog(im_start));
  EXPECT_EQ(tok.eot(), im_end);  // detected by its text, like llama.cpp
}

TEST(BpeTokenizer, LongestSpecialTokenWins) {
  bpe_builder b;
  const token_id shorter = b.add("<|a", token_type::control);
  const token_id longer = b.add("<|a|>", token_type::control);
  const tokenizer tok(b.data);
  EXPECT_EQ(tok.encode("<|a|><|a", {.parse_special = true}), (std::vector<token_id>{longer, shorter}));
}

TEST(BpeTokenizer, AddSpecialFollowsVocabularyFlags) {
  bpe_builder b;
  const token_id bos = b.add("<s>", token_type::control);
  const token_id eos = b.add("</s>", token_type::control);
  b.data.bos = bos;
  b.data.eos = eos;
  {
    const tokenizer tok(b.data);  // gpt2 default: no BOS
    EXPECT_FALSE(tok.add_bos());
    EXPECT_EQ(tok.encode("x", {.add_special = true}), (std::vector<token_id>{b.id("x")}));
  }
  b.data.add_bos = true;
  b.data.add_eos = true;
  const tokenizer tok(b.data);
  EXPECT_EQ(tok.encode("x", {.add_special = true}), (std::vector<token_id>{bos, b.id("x"), eos}));
  EXPECT_EQ(tok.encode("", {.add_special = true}), (std::vector<token_id>{bos, eos}));
  EXPECT_EQ(tok.encode("x"), (std::vector<token_id>{b.id("x")}));
}

TEST(BpeTokenizer, UnknownPreTokenizerWarnsAndUsesGpt2) {
  bpe_builder b;
  b.data.pre = "no-such-splitter";
  const tokenizer tok(b.data);
  ASSERT_EQ(tok.warnings().size(), 1u);
  EXPECT_NE(tok.warnings()[0].find("no-such-splitter"), std::string::npos);
  EXPECT_EQ(tok.encode("a b").size(), 3u);
  b.data.pre = "smollm";
  EXPECT_TRUE(tokenizer(b.data).warnings().empty());
}

TEST(BpeTokenizer, LinearInLongRuns) {
  // A million identical characters form a single piece (letters) or whitespace run; the merge loop
  // must stay O(n log n).
  bpe_builder b;
  b.merge("a", "a");
  b.merge("aa", "aa");
  b.merge("aaaa", "aaaa");
  b.merge(" ", " ");
  b.merge("  ", "  ");
  const tokenizer tok(b.data);
  for (const char c : {'a', ' '}) {
    const std::string text(1'000'000, c);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0 * k_time_scale) << "char '" << c << "'";
    EXPECT_EQ(ids.size(), c == 'a' ? 125'000u : 250'000u);
    EXPECT_EQ(tok.decode(ids), text);
  }
}

// ---- hostile vocabularies ----------------------------------------------------------------------

TEST(TokenizerLoad, RejectsInconsistentVocabularies) {
  auto expect_load_error = [](vocab_data d, const char* what) {
    EXPECT_THROW({ tokenizer t(std::move(d)); }, load_error) << what;
  };
  bpe_builder good;
  good.merge("a", "b");
  EXPECT_NO_THROW({ tokenizer t(good.data); });

  vocab_data d = good.data;
  d.merges.push_back("a zz");
  expect_load_error(d, "merge with an unknown right side");
  d = good.data;
  d.merges.push_back("b a");  // "ba" is not a token
  expect_load_error(d, "merge producing an unknown token");
  d = good.data;
  d.merges.push_back("ab");
  expect_load_error(d, "merge without a separator");
  d = good.data;
  d.types.pop_back();
  expect_load_error(d, "types shorter than tokens");
  d = good.data;
  d.scores = {1.0f, 2.0f};
  expect_load_error(d, "scores of the wrong length");
  d = good.data;
  d.eos = static_cast<token_id>(d.tokens.size());
  expect_load_error(d, "EOS out of range");
  d = good.data;
  d.bos = -3;
  expect_load_error(d, "negative BOS");
  d = good.data;
  d.tokens.push_back(d.tokens[5]);
  d.types.push_back(token_type::normal);
  expect_load_error(d, "duplicate token");
  expect_load_error(vocab_data{}, "empty vocabulary");
}

// ---- SentencePiece BPE -------------------------------------------------------------------------

const std::string k_ws = "\xE2\x96\x81";  // ▁

struct spm_builder {
  vocab_data data;
  spm_builder() {
    data.kind = vocab_kind::spm;
    add("<unk>", 0, token_type::unknown);
    add("<s>", 0, token_type::control);
    add("</s>", 0, token_type::control);
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) add(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0, token_type::byte);
    data.unk = 0;
    data.bos = 1;
    data.eos = 2;
  }
  token_id add(const std::string& text, float score, token_type type = token_type::normal) {
    data.tokens.push_back(text);
    data.scores.push_back(score);
    data.types.push_back(type);
    return static_cast<token_id>(data.tokens.size() - 1);
  }
  token_id id(const std::string& text) const {
    return static_cast<token_id>(std::find(data.tokens.begin(), data.tokens.end(), text) - data.tokens.begin());
  }
};

// Reference SentencePiece BPE: merge the adjacent pair whose concatenation is the best-scoring token
// (leftmost on ties) until none is left; unknown symbols become byte tokens.
std::vector<token_id> naive_spm(const spm_builder& b, const std::string& text) {
  std::vector<std::string> syms;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<uint8_t>(text[i]);
    const size_t len = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    syms.push_back(text.substr(i, len));
    i += len;
  }
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const token_id id = b.id(syms[i] + syms[i + 1]);
      if (static_cast<size_t>(id) == b.data.tokens.size()) continue;
      if (best < 0 || b.data.scores[id] > best_score) {
        best = static_cast<int>(i);
        best_score = b.data.scores[id];
      }
    }
    if (best < 0) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  std::vector<token_id> ids;
  for (const std::string& s : syms) {
    const token_id id = b.id(s);
    if (static_cast<size_t>(id) != b.data.tokens.size()) {
      ids.push_back(id);
    } else {
      for (char c : s) ids.push_back(3 + static_cast<uint8_t>(c));
    }
  }
  return ids;
}

TEST(SpmTokenizer, SpacePrefixScoresAndByteFallback) {
  spm_builder b;
  for (const char* t : {"h", "e", "l", "o", "w", "r", "d"}) b.add(t, -10);
  b.add(k_ws, -5);
  b.add("he", -3);
  b.add("ll", -2);
  b.add("hell", -1.5f);
  b.add("hello", -1);
  b.add(k_ws + "hello", -0.5f);
  b.add("or", -4);
  b.add(k_ws + "w", -4.5f);
  const tokenizer tok(b.data);
  EXPECT_TRUE(tok.add_space_prefix());
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.encode("hello"), (std::vector<token_id>{b.id(k_ws + "hello")}));
  EXPECT_EQ(tok.encode("hello", {.add_special = true}), (std::vector<token_id>{1, b.id(k_ws + "hello")}));
  // "é" is no token: its two bytes come out as <0xC3><0xA9>.
  const auto ids = tok.encode("hello world \xC3\xA9");
  EXPECT_EQ(ids, naive_spm(b, k_ws + "hello" + k_ws + "world" + k_ws + "\xC3\xA9"));
  EXPECT_EQ(ids.back(), b.id("<0xA9>"));
  EXPECT_EQ(tok.decode(ids), "hello world \xC3\xA9");
  EXPECT_EQ(tok.decode(tok.encode("  two  spaces ")), "  two  spaces ");

  vocab_data no_prefix = b.data;
  no_prefix.add_space_prefix = false;
  const tokenizer tok2(no_prefix);
  EXPECT_EQ(tok2.encode("hello"), (std::vector<token_id>{b.id("hello")}));
  EXPECT_EQ(tok2.decode(tok2.encode(" hello")), " hello");
}

TEST(SpmTokenizer, MatchesNaiveReference) {
  spm_builder b;
  std::mt19937 rng(11);
  const std::vector<std::string> chars = {"a", "b", "c", k_ws, "\xC3\xA9"};
  for (size_t i = 0; i + 1 < chars.size(); ++i) b.add(chars[i], -100.0f - static_cast<float>(i));
  for (int i = 0; i < 60; ++i) {
    std::string t;
    const int len = 2 + static_cast<int>(rng() % 4);
    for (int k = 0; k < len; ++k) t += chars[rng() % 4];
    if (static_cast<size_t>(b.id(t)) == b.data.tokens.size()) b.add(t, -static_cast<float>(rng() % 50));
  }
  vocab_data d = b.data;
  d.add_space_prefix = false;
  const tokenizer tok(d);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 30);
    for (int k = 0; k < len; ++k) text += chars[rng() % chars.size()];
    std::string plain = text;
    for (size_t p = plain.find(k_ws); p != std::string::npos; p = plain.find(k_ws)) plain.replace(p, 3, " ");
    ASSERT_EQ(tok.encode(plain), naive_spm(b, text)) << text;
    ASSERT_EQ(tok.decode(tok.encode(plain)), plain);
  }
}

TEST(SpmTokenizer, LinearInLongRuns) {
  spm_builder b;
  b.add("a", -1);
  b.add("aa", -1);
  b.add("aaaa", -1);
  b.add(k_ws, -1);
  b.add(k_ws + k_ws, -1);
  const tokenizer tok(b.data);
  for (const char c : {'a', ' '}) {
    const std::string text(1'000'000, c);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0 * k_time_scale) << "char '" << c << "'";
    EXPECT_EQ(tok.decode(ids), text);
  }
}

// ---- the real SmolLM2 vocabulary ---------------------------------------------------------------

const std::filesystem::path k_model = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";

std::shared_ptr<const tokenizer> load_smollm() {
  static std::shared_ptr<const tokenizer> tok = [] {
    return std::filesystem::exists(k_model) ? tokenizer::from_gguf(*gguf_file::open(k_model)) : nullptr;
  }();
  return tok;
}

TEST(SmolLmTokenizer, VocabularyMetadata) {
  const auto tok = load_smollm();
  if (!tok) GTEST_SKIP() << "model not found: " << k_model;
  EXPECT_EQ(tok->vocab_size(), 49152u);
  EXPECT_EQ(tok->pre_tokenizer(), "smollm");
  EXPECT_TRUE(tok->warnings().empty());
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->bos(), tok->find_token("<|im_start|>"));
  EXPECT_EQ(tok->eos(), tok->find_token("<|im_end|>"));
  EXPECT_EQ(tok->token_type(*tok->find_token("<|im_start|>")), token_type::control);
  EXPECT_TRUE(tok->is_eog(*tok->find_token("<|im_end|>")));
  EXPECT_TRUE(tok->is_eog(*tok->find_token("<|endoftext|>")));
  EXPECT_FALSE(tok->is_eog(*tok->find_token("<|im_start|>")));
  EXPECT_FALSE(tok->is_eog(*tok->find_token("Hello")));
}

TEST(SmolLmTokenizer, KnownStrings) {
  const auto tok = load_smollm();
  if (!tok) GTEST_SKIP() << "model not found: " << k_model;
  auto id = [&](const std::string& plain) { return tok->find_token(gpt2_text(plain)).value_or(-1); };
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<token_id>{id("Hello"), id(" world")}));
  EXPECT_EQ(tok->encode("2024"), (std::vector<token_id>{id("2"), id("0"), id("2"), id("4")}));
  const auto chat = tok->encode("<|im_start|>user\nHi<|im_end|>\n", {.parse_special = true});
  ASSERT_GE(chat.size(), 4u);
  EXPECT_EQ(chat.front(), *tok->find_token("<|im_start|>"));
  EXPECT_EQ(tok->decode(chat), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(tok->decode(chat, true), "user\nHi\n");
  for (const std::string s :
       {"", " ", "Hello, world!", "  leading and trailing  ", "tabs\tand\nnewlines\r\n",
        "caf\xC3\xA9 na\xC3\xAFve \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
        "x = [1, 2, 3]; y = f(x) ** 2", "it's I'm we're they've"}) {
    EXPECT_EQ(tok->decode(tok->encode(s)), s);
  }
}

TEST(SmolLmTokenizer, LinearInLongRuns) {
  const auto tok = load_smollm();
  if (!tok) GTEST_SKIP() << "model not found: " << k_model;
  for (const char c : {'a', ' '}) {
    const std::string text(1'000'000, c);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok->encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0 * k_time_scale) << "char '" << int(c) << "'";
    EXPECT_EQ(tok->decode(ids), text);
  }
}

// Parity with llama.cpp: every line of the fixture is {"text_b64": ..., "special": bool, "ids": [...]}.
// An optional "pre" names another pre-tokenizer to apply to the same vocabulary (llama.cpp loads the
// GGUF with tokenizer.ggml.pre replaced), which checks the LLaMA-3 / Qwen2 / GPT-2 splitters too.
struct parity_case {
  std::string text;
  std::string pre;
  bool special = false;
  std::vector<token_id> ids;
};

using test::base64_decode;

// Minimal reader for the fixture's flat objects (string, bool and integer-array values only).
bool parse_case(const std::string& line, parity_case& out) {
  auto value_of = [&](const std::string& key) -> std::string_view {
    const size_t k = line.find("\"" + key + "\"");
    if (k == std::string::npos) return {};
    size_t p = line.find(':', k);
    if (p == std::string::npos) return {};
    ++p;
    while (p < line.size() && line[p] == ' ') ++p;
    size_t e = p;
    if (line[p] == '"') {
      e = line.find('"', p + 1);
      return std::string_view(line).substr(p + 1, e - p - 1);
    }
    if (line[p] == '[') {
      e = line.find(']', p);
      return std::string_view(line).substr(p + 1, e - p - 1);
    }
    while (e < line.size() && line[e] != ',' && line[e] != '}') ++e;
    return std::string_view(line).substr(p, e - p);
  };
  const std::string_view b64 = value_of("text_b64");
  if (line.find("\"text_b64\"") == std::string::npos || line.find("\"ids\"") == std::string::npos) return false;
  out.text = base64_decode(b64);
  out.special = value_of("special").starts_with("true");
  out.pre = std::string(value_of("pre"));
  out.ids.clear();
  const std::string ids(value_of("ids"));
  for (size_t p = 0; p < ids.size();) {
    while (p < ids.size() && (ids[p] == ' ' || ids[p] == ',')) ++p;
    if (p >= ids.size()) break;
    size_t used = 0;
    out.ids.push_back(static_cast<token_id>(std::stol(ids.substr(p), &used)));
    p += used;
  }
  return true;
}

bool valid_utf8(const std::string& s) { return sanitize_utf8(s) == s; }

TEST(SmolLmTokenizer, ParityWithLlamaCpp) {
  const std::filesystem::path dir = std::filesystem::path(TESSERA_TEST_DATA_DIR) / "tokenizer";
  std::vector<std::filesystem::path> files;
  if (std::filesystem::exists(dir)) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("smollm_parity") && name.ends_with(".jsonl")) files.push_back(e.path());
    }
  }
  if (files.empty())
    GTEST_SKIP() << "no fixture " << dir / "smollm_parity*.jsonl"
                 << " (scripts/make_tokenizer_fixtures.py)";
  const auto tok = load_smollm();
  if (!tok) GTEST_SKIP() << "model not found: " << k_model;
  std::map<std::string, std::shared_ptr<const tokenizer>> variants;
  auto tokenizer_for = [&](const std::string& pre) {
    if (pre.empty() || pre == tok->pre_tokenizer()) return tok;
    auto& t = variants[pre];
    if (!t) {
      vocab_data data = vocab_from_gguf(*gguf_file::open(k_model));
      data.pre = pre;
      t = std::make_shared<const tokenizer>(std::move(data));
      EXPECT_TRUE(t->warnings().empty()) << pre;
    }
    return t;
  };
  size_t num_cases = 0, num_mismatches = 0;
  for (const auto& file : files) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      parity_case c;
      ASSERT_TRUE(parse_case(line, c)) << file << ": " << line;
      ++num_cases;
      const auto ids = tokenizer_for(c.pre)->encode(c.text, {.add_special = false, .parse_special = c.special});
      if (ids != c.ids && ++num_mismatches <= 20) {
        ADD_FAILURE() << file.filename() << " pre=" << c.pre << " special=" << c.special << " text (escaped) '"
                      << ::testing::PrintToString(c.text) << "': " << ::testing::PrintToString(ids) << " vs llama.cpp "
                      << ::testing::PrintToString(c.ids);
      }
      if (valid_utf8(c.text)) {
        // Round trip, except for bytes the vocabulary has no token for (SmolLM2 lacks some ASCII
        // control characters): llama.cpp drops those, and so do we.
        std::string representable;
        for (char ch : c.text) {
          if (tok->find_token(gpt2_char(static_cast<uint8_t>(ch)))) representable.push_back(ch);
        }
        EXPECT_EQ(tok->decode(ids), representable) << ::testing::PrintToString(c.text);
      }
    }
  }
  EXPECT_EQ(num_mismatches, 0u) << "of " << num_cases;
  EXPECT_GE(num_cases, 300u);
}

}  // namespace
}  // namespace tessera
