// Text <-> token ids for the vocabularies stored in GGUF files (tokenizer.ggml.*):
//   * "gpt2":  byte-level BPE (Radford et al. 2019, GPT-2; BPE: Sennrich et al. 2016). Text is cut by
//              a pre-tokenizer (tokenizer.ggml.pre selects the split expression), every byte of a
//              piece is mapped to a printable code point (the GPT-2 byte alphabet), and the ranked
//              merges (tokenizer.ggml.merges) are applied lowest rank first.
//   * "llama": SentencePiece BPE (Kudo & Richardson 2018): spaces become U+2581, characters are
//              merged by token score, characters missing from the vocabulary fall back to <0xXX>
//              byte tokens.
// Token ids match llama.cpp (src/llama-vocab.cpp), which is the reference the tests compare to.
// A tokenizer is immutable after construction and safe to use from many threads.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera {

class gguf_file;

// tokenizer.ggml.token_type values.
enum class token_type : uint8_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // <|im_start|>, <s>, ...: never produced from plain text, skipped by decode(skip_special)
  user_defined = 4,  // added tokens; always matched in text, like llama.cpp
  unused = 5,
  byte = 6,  // SentencePiece <0xXX>
};

enum class vocab_kind {
  bpe,  // GGUF "gpt2": byte-level BPE
  spm,  // GGUF "llama": SentencePiece BPE with byte fallback
};

// Everything a tokenizer is built from; what from_gguf reads, and what tests fill by hand.
struct vocab_data {
  vocab_kind kind = vocab_kind::bpe;
  std::string pre = "gpt2";         // tokenizer.ggml.pre (BPE only)
  std::vector<std::string> tokens;  // id -> text (BPE: in the GPT-2 byte alphabet)
  std::vector<token_type> types;    // empty: all normal
  std::vector<float> scores;        // empty: all 0 (SPM merges by score)
  std::vector<std::string> merges;  // BPE: "left right", rank = index
  std::optional<token_id> bos, eos, eot, unk, pad;
  std::optional<bool> add_bos, add_eos, add_space_prefix;  // unset: the defaults llama.cpp uses
};

// Reads tokenizer.ggml.* from a GGUF file without building a tokenizer (inspection, tests that
// vary one field). Throws load_error on missing or mistyped keys and special ids out of range.
vocab_data vocab_from_gguf(const gguf_file& file);

struct encode_options {
  bool add_special = false;    // prepend BOS / append EOS where the vocabulary asks for it
  bool parse_special = false;  // match control/unknown token texts (e.g. "<|im_start|>") in the text
};

class tokenizer {
 public:
  // Validates and indexes `data`; throws load_error on inconsistent input (array lengths differ,
  // a merge names an unknown token or produces one, special ids out of range, duplicate tokens...).
  explicit tokenizer(vocab_data data);
  // Not copyable: the text index holds views into the token strings. Share it via shared_ptr.
  tokenizer(const tokenizer&) = delete;
  tokenizer& operator=(const tokenizer&) = delete;
  // Reads tokenizer.ggml.* from a GGUF file. Throws load_error.
  static std::shared_ptr<const tokenizer> from_gguf(const gguf_file& file);

  // Text -> ids. Any byte string up to 512 MiB (larger: invalid_request) is accepted: invalid UTF-8 is handled like
  // llama.cpp (each bad byte stands for U+FFFD in BPE; SPM falls back to byte tokens).
  std::vector<token_id> encode(std::string_view text, encode_options options = {}) const;
  // Ids -> text: the concatenated pieces. skip_special drops control and unknown tokens.
  // The result can hold broken UTF-8 where the ids split a character. Throws invalid_request on an
  // id outside the vocabulary.
  std::string decode(std::span<const token_id> ids, bool skip_special = false) const;
  // The raw bytes one token stands for (control tokens: their text). Throws invalid_request.
  std::string token_to_piece(token_id id) const;
  // One step of decode(): appends the piece of `id` to `out`. `at_start` (true before the first id)
  // carries the SentencePiece rule that the first word's prefix space is dropped.
  void decode_append(token_id id, bool skip_special, bool& at_start, std::string& out) const;

  size_t vocab_size() const noexcept { return tokens_.size(); }
  vocab_kind kind() const noexcept { return kind_; }
  const std::string& pre_tokenizer() const noexcept { return pre_; }
  std::optional<token_id> bos() const noexcept { return bos_; }
  std::optional<token_id> eos() const noexcept { return eos_; }
  std::optional<token_id> eot() const noexcept { return eot_; }
  std::optional<token_id> unk() const noexcept { return unk_; }
  std::optional<token_id> pad() const noexcept { return pad_; }
  bool add_bos() const noexcept { return add_bos_; }
  bool add_eos() const noexcept { return add_eos_; }
  bool add_space_prefix() const noexcept { return add_space_prefix_; }
  // End of generation: eos, eot, and the end-of-turn / FIM texts llama.cpp recognises
  // (<|im_end|>, <|eot_id|>, <|endoftext|>, <end_of_turn>, ...).
  bool is_eog(token_id id) const noexcept;
  std::span<const token_id> eog_tokens() const noexcept { return eog_; }
  // token_type::undefined for an id outside the vocabulary.
  tessera::token_type token_type(token_id id) const noexcept;
  bool is_special(token_id id) const noexcept;  // control or unknown
  // The stored text of a token (BPE: GPT-2 alphabet, SPM: with U+2581). Throws invalid_request.
  const std::string& token_text(token_id id) const;
  std::optional<token_id> find_token(std::string_view text) const;
  // Non-fatal load problems (unknown pre-tokenizer, ...), for logging by the caller.
  std::span<const std::string> warnings() const noexcept { return warnings_; }

 private:
  struct merge_rule {
    token_id left;
    token_id right;
    token_id result;
  };
  int32_t find_merge(token_id left, token_id right) const noexcept;  // rank, or -1

  void encode_bpe_fragment(std::string_view text, std::vector<token_id>& out) const;
  void encode_spm_fragment(std::string_view text, std::vector<token_id>& out) const;
  void bpe_merge_word(std::string_view word, std::vector<token_id>& out) const;
  void check_id(token_id id) const;

  vocab_kind kind_ = vocab_kind::bpe;
  std::string pre_;
  int pre_kind_ = 0;  // tokenizer_detail::pretokenizer_kind
  bool ignore_merges_ = false;
  std::vector<std::string> tokens_;
  std::vector<tessera::token_type> types_;
  std::vector<float> scores_;
  std::unordered_map<std::string_view, token_id> text_to_id_;  // views into tokens_
  std::vector<merge_rule> merge_rules_;                        // by rank
  // Open-addressing hash table (linear probing) from (left << 32 | right) to rank: the merge loop's
  // hottest lookup.
  std::vector<uint64_t> merge_keys_;
  std::vector<int32_t> merge_ranks_;
  int merge_shift_ = 64;
  std::vector<token_id> special_by_length_;  // matchable in text, longest first
  std::vector<token_id> byte_to_token_;      // 256 entries, -1 where missing
  std::vector<std::string> pieces_;          // decoded bytes per token
  std::vector<token_id> eog_;
  std::optional<token_id> bos_, eos_, eot_, unk_, pad_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  std::vector<std::string> warnings_;
};

// Streams text while tokens are generated: push() returns only complete UTF-8 characters and holds
// back a character whose bytes are split across tokens until its last byte arrives. Bytes that can
// never form a character are replaced by U+FFFD (one per maximal invalid subpart, as Unicode
// recommends), so every string returned is valid UTF-8. For ids whose decode() is valid UTF-8, the
// concatenation of all push() results and flush() equals decode(ids).
class incremental_detokenizer {
 public:
  explicit incremental_detokenizer(std::shared_ptr<const tokenizer> tok, bool skip_special = false);
  std::string push(token_id id);  // throws invalid_request for an id outside the vocabulary
  // Emits what is held back (an incomplete character becomes U+FFFD) and resets.
  std::string flush();

 private:
  std::shared_ptr<const tokenizer> tok_;
  bool skip_special_;
  bool at_start_ = true;
  std::string pending_;
};

// Splits `bytes` into its longest prefix that is valid UTF-8 up to a possibly incomplete final
// character (`complete`, with invalid subparts replaced by U+FFFD) and the incomplete tail.
// Exposed for tests and for callers that stream raw bytes.
struct utf8_split {
  std::string complete;
  std::string tail;
};
utf8_split split_valid_utf8(std::string_view bytes);
// Replaces every maximal invalid subpart with U+FFFD.
std::string sanitize_utf8(std::string_view bytes);

}  // namespace tessera
