#include "engine/structured/token_table.hpp"

#include <algorithm>

namespace tessera::structured {

token_table make_token_table(const tokenizer& tok, int32_t vocab_size) {
  token_table t;
  const auto n = static_cast<int32_t>(tok.vocab_size());
  t.pieces.resize(static_cast<size_t>(std::max(vocab_size, n)));
  for (token_id id = 0; id < n; ++id) {
    const tessera::token_type type = tok.token_type(id);
    if (tok.is_special(id) || type == token_type::unused) continue;
    // Raw bytes (SentencePiece: U+2581 already a space, <0xXX> already the byte): the grammar matches
    // exactly the bytes the detokenizer will output.
    t.pieces[static_cast<size_t>(id)] = tok.token_to_piece(id);
  }
  for (token_id id : tok.eog_tokens()) t.end_ids.push_back(id);
  std::sort(t.end_ids.begin(), t.end_ids.end());
  t.end_ids.erase(std::unique(t.end_ids.begin(), t.end_ids.end()), t.end_ids.end());
  t.add_prefix_space = tok.kind() == vocab_kind::spm && tok.add_space_prefix();
  return t;
}

}  // namespace tessera::structured
