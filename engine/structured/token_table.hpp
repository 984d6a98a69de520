// The vocabulary as the grammar engine needs it: every token's decoded bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera::structured {

struct token_table {
  // id -> the bytes the token adds to the output; empty for tokens a grammar can never produce
  // (control, unknown and unused tokens, and ids the model has beyond the tokenizer's vocabulary).
  std::vector<std::string> pieces;
  std::vector<int32_t> end_ids;  // end-of-generation tokens: allowed where the grammar may end
  // SentencePiece vocabularies that prefix the first word with a space (its decoder drops it).
  bool add_prefix_space = false;
};

// `vocab_size`: the model's (the logits' width), at least the tokenizer's.
token_table make_token_table(const tokenizer& tok, int32_t vocab_size);

}  // namespace tessera::structured
