// N-gram prompt lookup (Saxena 2023, "prompt lookup decoding"; vLLM's `ngram` speculative method):
// outputs that quote, summarise or edit their input repeat long runs of it, so the tokens that followed
// an earlier occurrence of the sequence's last n tokens are a good guess for what comes next.
//
//   ngram_proposer p({.min_n = 1, .max_n = 4});
//   std::vector<token_id> draft = p.propose(prompt_and_output, k);   // one sequence, a chain
//   proposals = p.propose(requests);                                  // the engine's batch call
//
// For n from max_n down to min_n, the most recent earlier occurrence of the last n tokens (anywhere in
// prompt + output, the suffix itself excluded) wins, and up to k tokens that followed it are proposed
// (read on into the draft itself, so a repeating cycle is proposed as it repeats). Longer matches are
// tried first because they predict better; the most recent occurrence because generated text tends to
// continue the passage it is currently copying. Cost: O(len * max_n) per call, no index kept.
//
// With branches > 1, propose(requests) also keeps looking after that first match: the continuations of up
// to `branches` distinct occurrences (same order: longer n first, then the more recent), merged into a
// tree (continuations that agree share their nodes). The first match's continuation is the tree's
// first branch, nodes 0 .. k-1, exactly the chain propose() gives.
#pragma once
#include <cstdint>

#include "engine/speculative/proposer.hpp"

namespace tessera {

struct ngram_options {
  int32_t min_n = 1;     // shortest suffix matched (>= 1)
  int32_t max_n = 4;     // longest suffix matched (>= min_n)
  int32_t branches = 1;  // continuations merged into a token tree; 1: a chain
};

class ngram_proposer final : public draft_proposer {
 public:
  // Throws invalid_request when min_n < 1 or max_n < min_n.
  explicit ngram_proposer(const ngram_options& options);
  // Each request's tree (a chain with branches = 1) from its own tokens: the lookup keeps no state
  // between steps. Copied tokens are point masses: it never fills draft_proposal::probs.
  std::vector<draft_proposal> propose(std::span<const draft_request> requests) override;
  std::vector<token_id> propose(std::span<const token_id> context, int32_t max_tokens) const;
  draft_proposal propose_tree(std::span<const token_id> context, int32_t max_tokens) const;
  const ngram_options& options() const { return options_; }

 private:
  template <class F>
  void for_each_match(std::span<const token_id> context, F&& found) const;

  ngram_options options_;
};

}  // namespace tessera
