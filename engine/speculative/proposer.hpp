// Speculative decoding's first half: a proposer guesses the next few tokens of a sequence cheaply, and
// the target model verifies all of them in one forward pass (docs/speculative.md). Proposals are
// linear (one chain of tokens, no tree). A proposer never changes what is generated, only how many
// tokens one step can commit: verification (engine/speculative/verifier.hpp) keeps the output
// distribution the target's, so a bad guess costs compute, never correctness.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera {

class draft_proposer {
 public:
  virtual ~draft_proposer() = default;
  // At most `max_tokens` tokens that may follow `context` (the sequence's prompt and output so far),
  // in order; empty when it has no guess. Must be cheap next to a forward pass: it runs on the engine
  // thread for every decoding sequence of a speculative step.
  virtual std::vector<token_id> propose(std::span<const token_id> context, int32_t max_tokens) const = 0;
};

}  // namespace tessera
