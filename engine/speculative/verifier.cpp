#include "engine/speculative/verifier.hpp"

namespace tessera {

int32_t verify_draft(sampler& samp, std::span<const token_id> draft, const std::function<verify_row(int32_t row)>& row,
                     const std::function<bool(const sample_result&, bool accepted)>& commit) {
  int32_t accepted = 0;
  for (size_t j = 0;; ++j) {
    const verify_row rj = row(static_cast<int32_t>(j));
    const sample_result r = samp.sample(rj.logits, rj.allowed);
    const bool is_draft = j < draft.size() && r.token == draft[j];
    if (!commit(r, is_draft) || !is_draft) return accepted;
    ++accepted;
  }
}

std::vector<int32_t> verify_tree(sampler& samp, std::span<const token_id> tokens, std::span<const int32_t> parents,
                                 const std::function<verify_row(int32_t row)>& row,
                                 const std::function<bool(const sample_result&, bool accepted)>& commit) {
  std::vector<int32_t> path;
  int32_t at = -1;  // the current node: -1 is the sequence's last token (row 0)
  for (;;) {
    const verify_row r = row(at + 1);
    const sample_result drawn = samp.sample(r.logits, r.allowed);
    int32_t child = -1;
    for (size_t i = static_cast<size_t>(at + 1); i < tokens.size() && child < 0; ++i) {
      if (parents[i] == at && tokens[i] == drawn.token) child = static_cast<int32_t>(i);  // children follow parents
    }
    if (!commit(drawn, child >= 0) || child < 0) return path;
    path.push_back(child);
    at = child;
  }
}

}  // namespace tessera
