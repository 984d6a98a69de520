// Tokenizer: vocabulary validation, special-token partitioning, byte-level BPE and SentencePiece
// BPE encoding, decoding, and the incremental detokenizer. Behaviour follows llama.cpp's
// src/llama-vocab.cpp so that our ids equal its ids; the GGUF key reading is in tokenizer_gguf.cpp.
#include "engine/text/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <queue>
#include <string>

#include "engine/base/error.hpp"
#include "engine/text/tokenizer_pretokenize.hpp"

namespace tessera {
namespace {

using tokenizer_detail::pretokenizer_kind;

// ---- GPT-2 byte alphabet -----------------------------------------------------------------------
// Byte-level BPE works on printable characters only: bytes that are printable Latin-1 characters
// ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves, the other 68 bytes are mapped in
// order to U+0100, U+0101, ... (GPT-2's bytes_to_unicode(), Radford et al. 2019).
struct byte_alphabet {
  std::array<uint32_t, 256> byte_to_cpt{};
  std::array<std::string, 256> byte_to_utf8{};
  std::array<int16_t, 324> cpt_to_byte{};  // every mapped code point is < 256 + 68

  byte_alphabet() {
    cpt_to_byte.fill(-1);
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cpt[b] = printable ? b : next_extra++;
      cpt_to_byte[byte_to_cpt[b]] = static_cast<int16_t>(b);
      append_utf8(byte_to_cpt[b], byte_to_utf8[b]);
    }
  }
};

const byte_alphabet& gpt2_bytes() {
  static const byte_alphabet alphabet;
  return alphabet;
}

constexpr std::string_view k_spm_space = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

bool is_special_type(token_type t) { return t == token_type::control || t == token_type::unknown; }

// ---- pre-tokenizer names (tokenizer.ggml.pre) as llama.cpp maps them ---------------------------
struct pre_info {
  pretokenizer_kind kind;
  bool ignore_merges;  // a piece that is itself a token is emitted whole (LLaMA-3 family)
  bool add_bos;        // default for tokenizer.ggml.add_bos_token
  bool known;
};

pre_info classify_pre(std::string_view pre) {
  auto in = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), pre) != names.end();
  };
  if (in({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})) {
    return {pretokenizer_kind::llama3, true, true, true};
  }
  if (in({"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) return {pretokenizer_kind::llama3, false, false, true};
  if (in({"qwen2", "deepseek-r1-qwen", "kormo", "stablelm2", "megrez", "hunyuan", "grok-2"})) {
    return {pretokenizer_kind::qwen2, false, false, true};
  }
  if (in({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    return {pretokenizer_kind::digits_then_gpt2, false, false, true};
  }
  if (in({"gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
          "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4", "trillion",
          "granite-docling"})) {
    return {pretokenizer_kind::gpt2, false, false, true};
  }
  return {pretokenizer_kind::gpt2, false, false, false};
}

constexpr uint64_t k_empty_key = ~uint64_t{0};          // no token pair has both ids = -1
constexpr uint64_t k_hash_mul = 0x9E3779B97F4A7C15ull;  // Fibonacci hashing (Knuth, TAOCP 6.4)

uint64_t pair_key(token_id left, token_id right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

// Special-token partition: the text cut into raw spans and matched special tokens.
struct fragment {
  token_id token;  // -1: raw text [offset, offset + length)
  size_t offset;
  size_t length;
};

// A 4-ary min-heap of 64-bit keys: half the depth of a binary heap and all children of a node in one
// cache line, which matters when a single piece holds a million candidate pairs.
class quaternary_heap {
 public:
  explicit quaternary_heap(std::vector<uint64_t> keys) : v_(std::move(keys)) {
    for (size_t i = v_.size() / 4 + 1; i-- > 0;) sift_down(i);
  }
  bool empty() const { return v_.empty(); }
  void push(uint64_t key) {
    size_t i = v_.size();
    v_.push_back(key);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (v_[parent] <= key) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = key;
  }
  uint64_t pop() {
    const uint64_t top = v_[0];
    v_[0] = v_.back();
    v_.pop_back();
    if (!v_.empty()) sift_down(0);
    return top;
  }

 private:
  void sift_down(size_t i) {
    const size_t n = v_.size();
    if (i >= n) return;
    const uint64_t key = v_[i];
    for (;;) {
      const size_t first = 4 * i + 1;
      if (first >= n) break;
      size_t best = first;
      const size_t last = std::min(first + 4, n);
      for (size_t c = first + 1; c < last; ++c) {
        if (v_[c] < v_[best]) best = c;
      }
      if (v_[best] >= key) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = key;
  }
  std::vector<uint64_t> v_;
};

// ---- UTF-8 validation (strict, for output) -----------------------------------------------------
// Length of the valid sequence starting at `i`: > 0 valid, 0 incomplete at the end of `s`, < 0 the
// maximal invalid subpart has -n bytes (Unicode 15, section 3.9, "U+FFFD substitution of maximal
// subparts").
int utf8_sequence(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -k;
  }
  return need + 1;
}

constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

// ---- construction --------------------------------------------------------------------------------

tokenizer::tokenizer(vocab_data data) : kind_(data.kind), pre_(std::move(data.pre)) {
  const size_t n = data.tokens.size();
  if (n == 0) throw load_error("tokenizer: the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) throw load_error("tokenizer: the vocabulary is too large");
  if (!data.types.empty() && data.types.size() != n) {
    throw load_error("tokenizer: " + std::to_string(data.types.size()) + " token types for " + std::to_string(n) +
                     " tokens");
  }
  if (!data.scores.empty() && data.scores.size() != n) {
    throw load_error("tokenizer: " + std::to_string(data.scores.size()) + " token scores for " + std::to_string(n) +
                     " tokens");
  }
  tokens_ = std::move(data.tokens);
  types_ = data.types.empty() ? std::vector<tessera::token_type>(n, token_type::normal) : std::move(data.types);
  scores_ = data.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(data.scores);

  text_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens_[i].empty()) {
      // llama.cpp renames empty tokens so that they stay unique and never match text.
      warnings_.push_back("empty token at index " + std::to_string(i));
      tokens_[i] = "[EMPTY_" + std::to_string(i) + "]";
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!text_to_id_.emplace(tokens_[i], static_cast<token_id>(i)).second) {
      throw load_error("tokenizer: token " + std::to_string(i) + " duplicates token " +
                       std::to_string(text_to_id_.at(tokens_[i])));
    }
  }

  auto check_special = [&](const std::optional<token_id>& id, const char* what) {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      throw load_error(std::string("tokenizer: ") + what + " token id " + std::to_string(*id) +
                       " is outside the vocabulary of " + std::to_string(n));
    }
    return id;
  };
  bos_ = check_special(data.bos, "BOS");
  eos_ = check_special(data.eos, "EOS");
  eot_ = check_special(data.eot, "EOT");
  unk_ = check_special(data.unk, "unknown");
  pad_ = check_special(data.pad, "padding");

  if (kind_ == vocab_kind::bpe) {
    const pre_info pre = classify_pre(pre_);
    if (!pre.known) { warnings_.push_back("unknown pre-tokenizer '" + pre_ + "', using the GPT-2 split"); }
    pre_kind_ = static_cast<int>(pre.kind);
    ignore_merges_ = pre.ignore_merges;
    add_bos_ = data.add_bos.value_or(pre.add_bos);
    add_space_prefix_ = data.add_space_prefix.value_or(false);

    merge_rules_.reserve(data.merges.size());
    int bits = 4;
    while ((size_t{1} << bits) < 2 * data.merges.size() + 1) ++bits;
    merge_shift_ = 64 - bits;
    merge_keys_.assign(size_t{1} << bits, k_empty_key);
    merge_ranks_.assign(size_t{1} << bits, -1);
    for (size_t rank = 0; rank < data.merges.size(); ++rank) {
      const std::string& merge = data.merges[rank];
      // The separator is the first space after the first character, as in llama.cpp.
      const size_t sep = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
      if (sep == std::string::npos) {
        throw load_error("tokenizer: merge " + std::to_string(rank) + " ('" + merge + "') is not 'left right'");
      }
      const std::string left = merge.substr(0, sep);
      const std::string right = merge.substr(sep + 1);
      const auto l = text_to_id_.find(left);
      const auto r = text_to_id_.find(right);
      const auto m = text_to_id_.find(left + right);
      if (l == text_to_id_.end() || r == text_to_id_.end() || m == text_to_id_.end()) {
        throw load_error("tokenizer: merge " + std::to_string(rank) + " ('" + merge +
                         "') names or produces a token that is not in the vocabulary");
      }
      merge_rules_.push_back({l->second, r->second, m->second});
      const uint64_t key = pair_key(l->second, r->second);
      for (size_t slot = (key * k_hash_mul) >> merge_shift_;; slot = (slot + 1) & (merge_keys_.size() - 1)) {
        if (merge_keys_[slot] == key) break;  // a repeated pair keeps its first (best) rank
        if (merge_keys_[slot] == k_empty_key) {
          merge_keys_[slot] = key;
          merge_ranks_[slot] = static_cast<int32_t>(rank);
          break;
        }
      }
    }
    byte_to_token_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      if (auto it = text_to_id_.find(gpt2_bytes().byte_to_utf8[b]); it != text_to_id_.end()) {
        byte_to_token_[b] = it->second;
      }
    }
  } else {
    if (!data.merges.empty()) warnings_.push_back("SentencePiece vocabulary: merges ignored");
    add_bos_ = data.add_bos.value_or(true);
    add_space_prefix_ = data.add_space_prefix.value_or(true);
    byte_to_token_.assign(256, -1);
    static constexpr char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      if (auto it = text_to_id_.find(name); it != text_to_id_.end()) {
        byte_to_token_[b] = it->second;
      } else if (auto it1 = text_to_id_.find(std::string(1, static_cast<char>(b))); it1 != text_to_id_.end()) {
        byte_to_token_[b] = it1->second;
      }
    }
  }
  add_eos_ = data.add_eos.value_or(false);

  // End-of-generation and FIM tokens recognised by text, as llama.cpp does (GGUF files rarely list
  // them); llama.cpp also forces such tokens to the control type. The lists are the pinned llama.cpp's
  // (0.3.36, llama_vocab::impl::load): e.g. Gemma 3's vocabulary has "</s>" as a user-defined token,
  // which llama.cpp makes a control (so not matched in plain text) end-of-generation token.
  auto find_first = [&](std::initializer_list<std::string_view> names) -> std::optional<token_id> {
    for (std::string_view name : names) {
      if (auto it = text_to_id_.find(name); it != text_to_id_.end()) return it->second;
    }
    return std::nullopt;
  };
  auto make_control = [&](token_id id) {
    if (types_[id] != token_type::control) types_[id] = token_type::control;
  };
  if (!eot_) {
    eot_ = find_first({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                       "<EOT>", "_<EOT>", "[EOT]",
                       "<\xEF\xBD\x9C"
                       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                       "<end_of_utterance>"});
    if (eot_) make_control(*eot_);
  }
  const std::optional<token_id> eom = find_first({"<|eom_id|>"});
  std::vector<std::optional<token_id>> fim = {
      find_first({"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                  "<\xEF\xBD\x9C"
                  "fim\xE2\x96\x81"
                  "begin\xEF\xBD\x9C>",
                  "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"}),
      find_first({"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                  "<\xEF\xBD\x9C"
                  "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
                  "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"}),
      find_first({"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                  "<\xEF\xBD\x9C"
                  "fim\xE2\x96\x81"
                  "end\xEF\xBD\x9C>",
                  "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"}),
  };
  const std::optional<token_id> fim_pad = find_first({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  const std::optional<token_id> fim_rep =
      find_first({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  const std::optional<token_id> fim_sep = find_first({"<|file_sep|>"});
  for (const auto& id : {eom, fim[0], fim[1], fim[2], fim_pad, fim_rep, fim_sep}) {
    if (id) make_control(*id);
  }
  auto add_eog = [&](std::optional<token_id> id) {
    if (id && std::find(eog_.begin(), eog_.end(), *id) == eog_.end()) eog_.push_back(*id);
  };
  add_eog(fim_pad);
  add_eog(fim_rep);
  add_eog(fim_sep);
  for (std::string_view name : {"<|eot_id|>",
                                "<|im_end|>",
                                "<|end|>",
                                "<|return|>",
                                "<|call|>",
                                "<|flush|>",
                                "<|calls|>",
                                "<end_of_turn>",
                                "<|endoftext|>",
                                "</s>",
                                "<|eom_id|>",
                                "<EOT>",
                                "_<EOT>",
                                "[EOT]",
                                "[EOS]",
                                "<|end_of_text|>",
                                "<end_of_utterance>",
                                "<eos>",
                                "<turn|>",
                                "<|tool_response>",
                                "<\xEF\xBD\x9C"
                                "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                "[e~["}) {
    if (auto it = text_to_id_.find(name); it != text_to_id_.end()) {
      add_eog(it->second);
      make_control(it->second);
    }
  }
  add_eog(eos_);
  add_eog(eot_);
  add_eog(eom);
  // gpt-oss ("o200k_harmony") and solar-open: <|end|> ends a message, not the generation.
  if ((find_first({"<|return|>"}) || find_first({"<|flush|>"})) && find_first({"<|call|>", "<|calls|>"})) {
    if (auto end = find_first({"<|end|>"})) {
      eog_.erase(std::remove(eog_.begin(), eog_.end(), *end), eog_.end());
      types_[*end] = token_type::user_defined;
    }
  }
  // Gemma 4 and PLaMo: "</s>" is a normal token there (llama.cpp: unlike PaddleOCR's).
  auto is_eog_text = [&](std::string_view name) {
    auto it = text_to_id_.find(name);
    return it != text_to_id_.end() && std::find(eog_.begin(), eog_.end(), it->second) != eog_.end();
  };
  if ((is_eog_text("<|tool_response>") || is_eog_text("<|plamo:eos|>")) && is_eog_text("</s>")) {
    const token_id s_id = text_to_id_.find("</s>")->second;
    eog_.erase(std::remove(eog_.begin(), eog_.end(), s_id), eog_.end());
    types_[s_id] = token_type::normal;
  }
  for (std::string_view name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (auto it = text_to_id_.find(name); it != text_to_id_.end()) types_[it->second] = token_type::user_defined;
  }
  std::sort(eog_.begin(), eog_.end());

  for (size_t i = 0; i < n; ++i) {
    const tessera::token_type t = types_[i];
    if (t == token_type::control || t == token_type::user_defined || t == token_type::unknown) {
      special_by_length_.push_back(static_cast<token_id>(i));
    }
  }
  std::stable_sort(special_by_length_.begin(), special_by_length_.end(),
                   [&](token_id a, token_id b) { return tokens_[a].size() > tokens_[b].size(); });

  // Decoded bytes of every token.
  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = tokens_[i];
    const tessera::token_type t = types_[i];
    std::string& piece = pieces_[i];
    if (t == token_type::control || t == token_type::unknown || t == token_type::user_defined) {
      piece = text;
    } else if (kind_ == vocab_kind::bpe) {
      std::vector<uint32_t> cpts;
      decode_utf8_lenient(text, cpts);
      for (uint32_t c : cpts) {
        const int byte = c < gpt2_bytes().cpt_to_byte.size() ? gpt2_bytes().cpt_to_byte[c] : -1;
        if (byte >= 0) {
          piece.push_back(static_cast<char>(byte));
        } else {
          append_utf8(c, piece);  // not in the byte alphabet: keep the character
        }
      }
    } else if (t == token_type::byte && text.size() == 6 && text.starts_with("<0x") && text.back() == '>' &&
               std::isxdigit(static_cast<unsigned char>(text[3])) &&
               std::isxdigit(static_cast<unsigned char>(text[4]))) {
      piece.push_back(static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
    } else {
      for (size_t p = 0; p < text.size();) {
        if (text.compare(p, k_spm_space.size(), k_spm_space) == 0) {
          piece.push_back(' ');
          p += k_spm_space.size();
        } else {
          piece.push_back(text[p++]);
        }
      }
    }
  }
}

// ---- accessors -----------------------------------------------------------------------------------

bool tokenizer::is_eog(token_id id) const noexcept { return std::binary_search(eog_.begin(), eog_.end(), id); }

tessera::token_type tokenizer::token_type(token_id id) const noexcept {
  if (id < 0 || static_cast<size_t>(id) >= types_.size()) return token_type::undefined;
  return types_[id];
}

bool tokenizer::is_special(token_id id) const noexcept { return is_special_type(token_type(id)); }

int32_t tokenizer::find_merge(token_id left, token_id right) const noexcept {
  if (merge_keys_.empty()) return -1;
  const uint64_t key = pair_key(left, right);
  for (size_t slot = (key * k_hash_mul) >> merge_shift_;; slot = (slot + 1) & (merge_keys_.size() - 1)) {
    if (merge_keys_[slot] == key) return merge_ranks_[slot];
    if (merge_keys_[slot] == k_empty_key) return -1;
  }
}

void tokenizer::check_id(token_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) {
    throw invalid_request("token id " + std::to_string(id) + " is outside the vocabulary of " +
                          std::to_string(tokens_.size()));
  }
}

const std::string& tokenizer::token_text(token_id id) const {
  check_id(id);
  return tokens_[id];
}

std::optional<token_id> tokenizer::find_token(std::string_view text) const {
  if (auto it = text_to_id_.find(text); it != text_to_id_.end()) return it->second;
  return std::nullopt;
}

// ---- encoding --------------------------------------------------------------------------------------

std::vector<token_id> tokenizer::encode(std::string_view text, encode_options options) const {
  // Symbol positions are 32-bit.
  if (text.size() > static_cast<size_t>(INT32_MAX) / 4) throw invalid_request("text to encode is too long");
  // Special tokens are cut out first, longest text first (llama.cpp tokenizer_st_partition).
  // User-defined tokens are always cut out; control and unknown ones only when parse_special.
  std::vector<fragment> fragments;
  if (!text.empty()) fragments.push_back({-1, 0, text.size()});
  std::vector<fragment> next;
  for (token_id special : special_by_length_) {
    if (!options.parse_special && is_special_type(types_[special])) continue;
    const std::string& needle = tokens_[special];
    bool found = false;
    next.clear();
    for (const fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view span = text.substr(f.offset, f.length);
      size_t start = 0;
      for (size_t at = span.find(needle); at != std::string_view::npos; at = span.find(needle, start)) {
        found = true;
        if (at > start) next.push_back({-1, f.offset + start, at - start});
        next.push_back({special, 0, 0});
        start = at + needle.size();
      }
      if (start < span.size()) next.push_back({-1, f.offset + start, span.size() - start});
    }
    if (found) fragments.swap(next);
  }

  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_special && add_bos_ && bos_) out.push_back(*bos_);
  bool prev_special = true;  // SPM: a space prefix goes before text that starts the input or follows a special token
  for (const fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view span = text.substr(f.offset, f.length);
    if (kind_ == vocab_kind::bpe) {
      encode_bpe_fragment(span, out);
    } else {
      std::string escaped;
      escaped.reserve(span.size() * 3 + 3);
      if (add_space_prefix_ && prev_special) escaped += k_spm_space;
      for (char c : span) {
        if (c == ' ') {
          escaped += k_spm_space;
        } else {
          escaped.push_back(c);
        }
      }
      encode_spm_fragment(escaped, out);
    }
    prev_special = false;
  }
  if (options.add_special && add_eos_ && eos_) out.push_back(*eos_);
  return out;
}

void tokenizer::encode_bpe_fragment(std::string_view text, std::vector<token_id>& out) const {
  std::vector<uint32_t> cpts;
  decode_utf8_lenient(text, cpts);
  std::vector<uint32_t> lengths;
  tokenizer_detail::pretokenize(static_cast<pretokenizer_kind>(pre_kind_), cpts, lengths);
  std::string word;
  size_t pos = 0;
  for (uint32_t len : lengths) {
    // The piece's bytes: each code point re-encoded, so an invalid input byte counts as U+FFFD.
    word.clear();
    for (size_t i = pos; i < pos + len; ++i) append_utf8(cpts[i], word);
    pos += len;
    bpe_merge_word(word, out);
  }
}

// Byte-level BPE on one piece: start from one symbol per byte and repeatedly merge the adjacent
// pair with the lowest merge rank (leftmost on ties) -- Sennrich et al. 2016, with GPT-2's byte
// alphabet. A min-heap of candidate pairs with lazy invalidation makes this O(n log n) in the piece
// length, so a single piece of a million identical characters stays fast.
void tokenizer::bpe_merge_word(std::string_view word, std::vector<token_id>& out) const {
  const auto& alphabet = gpt2_bytes();
  if (ignore_merges_ || word.size() == 1) {
    std::string mapped;
    for (char c : word) mapped += alphabet.byte_to_utf8[static_cast<uint8_t>(c)];
    if (auto it = text_to_id_.find(mapped); it != text_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }

  struct symbol {
    token_id id;  // -1: a byte whose alphabet character is not a token; -2: merged away
    int32_t prev;
    int32_t next;
    uint8_t byte;
  };
  const auto count = static_cast<int32_t>(word.size());
  std::vector<symbol> symbols(count);
  for (int32_t i = 0; i < count; ++i) {
    const auto byte = static_cast<uint8_t>(word[i]);
    symbols[i] = {byte_to_token_[byte], i - 1, i + 1 < count ? i + 1 : -1, byte};
  }
  // A candidate is (rank << 32 | left position): the smallest value is the lowest rank, leftmost.
  // The pair itself is not stored: the candidate is still current exactly when the symbols at
  // `left` and after it still carry the ids of merge `rank` (ids only ever change by growing).
  auto candidate = [&](int32_t left) -> uint64_t {
    const int32_t right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return k_empty_key;
    const int32_t rank = find_merge(symbols[left].id, symbols[right].id);
    return rank < 0 ? k_empty_key : static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(left);
  };
  std::vector<uint64_t> initial;
  initial.reserve(count);
  for (int32_t i = 0; i + 1 < count; ++i) {
    if (const uint64_t c = candidate(i); c != k_empty_key) initial.push_back(c);
  }
  quaternary_heap heap(std::move(initial));
  auto push = [&](int32_t left) {
    if (left < 0) return;
    if (const uint64_t c = candidate(left); c != k_empty_key) heap.push(c);
  };
  while (!heap.empty()) {
    const uint64_t top = heap.pop();
    const auto left_pos = static_cast<int32_t>(top & 0xFFFFFFFF);
    const merge_rule& rule = merge_rules_[top >> 32];
    symbol& left = symbols[left_pos];
    if (left.id != rule.left || left.next < 0) continue;
    symbol& right = symbols[left.next];
    if (right.id != rule.right) continue;  // stale: one side changed since it was queued
    left.id = rule.result;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = left_pos;
    right.id = -2;
    right.next = -1;
    push(left.prev);
    push(left_pos);
  }

  for (int32_t i = 0; i >= 0 && i < count; i = symbols[i].next) {
    const symbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // A byte whose alphabet character is missing: llama.cpp tries each UTF-8 byte of that character
    // as a one-byte token and drops the bytes that are not tokens.
    for (char c : alphabet.byte_to_utf8[s.byte]) {
      if (auto it = text_to_id_.find(std::string_view(&c, 1)); it != text_to_id_.end()) out.push_back(it->second);
    }
  }
}

// SentencePiece BPE (as llama.cpp's llm_tokenizer_spm): symbols are UTF-8 characters, and the
// adjacent pair whose concatenation is the highest-scoring token is merged first (leftmost on ties).
// Symbols left that are not tokens are emitted as byte tokens (<0xXX>).
void tokenizer::encode_spm_fragment(std::string_view text, std::vector<token_id>& out) const {
  struct symbol {
    uint32_t start;
    uint32_t size;  // 0: merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size;
    bool operator<(const candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  std::vector<symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    // Character length from the lead byte only (llama.cpp unicode_len_utf8); a bad byte is 1 byte.
    static constexpr uint8_t k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    const size_t len = std::min<size_t>(k_len[static_cast<uint8_t>(text[offset]) >> 4], text.size() - offset);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(len), index - 1,
                       offset + len < text.size() ? index + 1 : -1});
    offset += len;
  }
  std::priority_queue<candidate> queue;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].size + symbols[right].size;
    const auto it = text_to_id_.find(text.substr(symbols[left].start, size));
    if (it == text_to_id_.end()) return;
    queue.push({scores_[it->second], left, right, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);
  while (!queue.empty()) {
    const candidate c = queue.top();
    queue.pop();
    symbol& left = symbols[c.left];
    symbol& right = symbols[c.right];
    if (left.size == 0 || right.size == 0 || left.size + right.size != c.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    try_pair(left.prev, c.left);
    try_pair(c.left, left.next);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const symbol& s = symbols[i];
    const std::string_view piece = text.substr(s.start, s.size);
    if (auto it = text_to_id_.find(piece); it != text_to_id_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char c : piece) {
      const token_id byte_token = byte_to_token_[static_cast<uint8_t>(c)];
      if (byte_token >= 0) {
        out.push_back(byte_token);
      } else if (unk_) {
        out.push_back(*unk_);
      }
    }
  }
}

// ---- decoding --------------------------------------------------------------------------------------

std::string tokenizer::token_to_piece(token_id id) const {
  check_id(id);
  return pieces_[id];
}

void tokenizer::decode_append(token_id id, bool skip_special, bool& at_start, std::string& out) const {
  check_id(id);
  const tessera::token_type t = types_[id];
  if (skip_special && is_special_type(t)) return;
  const std::string& piece = pieces_[id];
  const bool is_text = !is_special_type(t) && t != token_type::user_defined;
  // SentencePiece: the space the encoder put before the first word is not part of the text.
  if (at_start && is_text && kind_ == vocab_kind::spm && add_space_prefix_ && piece.starts_with(' ')) {
    out.append(piece, 1);
  } else {
    out += piece;
  }
  if (is_text) at_start = false;
}

std::string tokenizer::decode(std::span<const token_id> ids, bool skip_special) const {
  std::string out;
  bool at_start = true;
  for (token_id id : ids) decode_append(id, skip_special, at_start, out);
  return out;
}

// ---- UTF-8 helpers and the incremental detokenizer -----------------------------------------------

utf8_split split_valid_utf8(std::string_view bytes) {
  utf8_split result;
  result.complete.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = utf8_sequence(bytes, i);
    if (n > 0) {
      result.complete.append(bytes.substr(i, n));
      i += n;
    } else if (n == 0) {
      result.tail = std::string(bytes.substr(i));
      break;
    } else {
      result.complete += k_replacement;
      i += -n;
    }
  }
  return result;
}

std::string sanitize_utf8(std::string_view bytes) {
  utf8_split split = split_valid_utf8(bytes);
  if (!split.tail.empty()) split.complete += k_replacement;  // an incomplete sequence is one maximal subpart
  return std::move(split.complete);
}

incremental_detokenizer::incremental_detokenizer(std::shared_ptr<const tokenizer> tok, bool skip_special)
    : tok_(std::move(tok)), skip_special_(skip_special) {
  if (!tok_) throw invalid_request("incremental_detokenizer: no tokenizer");
}

std::string incremental_detokenizer::push(token_id id) {
  tok_->decode_append(id, skip_special_, at_start_, pending_);
  utf8_split split = split_valid_utf8(pending_);
  pending_ = std::move(split.tail);
  return std::move(split.complete);
}

std::string incremental_detokenizer::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  at_start_ = true;
  return out;
}

}  // namespace tessera
