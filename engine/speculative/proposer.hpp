// Speculative decoding's first half: a proposer guesses the next few tokens of a sequence cheaply, and
// the target model verifies all of them in one forward pass (docs/speculative.md). Proposals are
// chains, or (for an executor that verifies_token_trees) trees of candidates that the target verifies
// in one pass with a tree attention mask (SpecInfer). A proposer never changes the distribution of what
// is generated, only how many tokens one step can commit: verification (engine/speculative/verifier.hpp)
// keeps the output distribution the target's, so a bad guess costs compute, never correctness.
//
// The engine asks once per step for every speculating sequence at once (a draft model batches its
// forward passes across them), and tells the proposer what became of each sequence, so that a proposer
// with per-sequence state (the draft model's KV cache) can roll it back and free it:
//
//   drafts = proposer.propose(requests);      // before the step is planned
//   ... the target verifies ...
//   proposer.rollback(seq, tokens);           // after it, for every sequence proposed for
//   proposer.release(seq);                    // finished, aborted or preempted
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/ids.hpp"
#include "engine/sampling_params.hpp"

namespace tessera {

// One sequence to draft for: `tokens` are its prompt and output so far (the last one not yet computed
// by the target), and the draft may have at most `max_tokens` tokens. For a request that samples,
// `sampling` is its sampling parameters (null: greedy), `stream_key` its random stream
// (sampler::stream_key) and `position` the output position of the first draft token: a proposer with
// a distribution may draw its drafts from it (draft_proposal::probs).
struct draft_request {
  seq_id seq;
  std::span<const token_id> tokens;
  int32_t max_tokens = 0;
  const sampling_params* sampling = nullptr;
  uint64_t stream_key = 0;
  uint64_t position = 0;
};

// What a proposer's own KV pool holds (zero for a stateless proposer): for leak checks and /metrics.
struct draft_pool_usage {
  int32_t num_blocks = 0;       // blocks in the pool
  int32_t num_free_blocks = 0;  // of which free
  int32_t num_sequences = 0;    // sequences with draft state
};

// What a proposer offers for one sequence: candidate tokens as a chain, or as a tree (SpecInfer): node
// i is tokens[i], a child of node parents[i] (-1: of the sequence's last token), parents before
// children. Empty parents: a chain (parents[i] = i - 1). The proposers put their best guess first, as
// nodes 0, 1, 2, ... each the child of the one before: those are the nodes whose K/V lands where the
// sequence needs it when they are accepted.
struct draft_proposal {
  std::vector<token_id> tokens;
  std::vector<int32_t> parents;
  // Drafts drawn from distributions (draft_request::sampling): row j, vocabulary-sized, is q_j, what
  // tokens[j] was drawn from, and the verifier's rejection sampling needs (engine/speculative/verifier.hpp).
  // A sampled tree is a chain with leaves beside it: position j's leaves (children of node j - 1) were
  // drawn from q_j too, after tokens[j] and without replacement, in node order (verify_sampled_tree).
  // Empty: each token is a point mass (copied from the context, or the draft's argmax).
  std::vector<float> probs;
};

class draft_proposer {
 public:
  virtual ~draft_proposer() = default;
  // Proposals for `requests`, one each, in order: a chain of at most max_tokens tokens that may follow
  // tokens, or a tree whose every root-to-leaf branch is at most that long; empty when it has no guess
  // (or, for a draft model, no room in its pool this step). The engine cuts a tree to its first branch
  // when the executor does not verify trees. Runs on the engine thread before every speculative step:
  // it must cost little next to the target's pass.
  virtual std::vector<draft_proposal> propose(std::span<const draft_request> requests) = 0;
  // After a step that proposed for `seq`: the sequence now holds `tokens` (accepted drafts and the
  // target's own token appended). State for positions past their longest common prefix with what the
  // proposer drafted is dropped: the rejected draft positions are never attended to again.
  virtual void rollback(seq_id seq, std::span<const token_id> tokens) {
    (void)seq;
    (void)tokens;
  }
  // `seq` finished, was aborted or preempted: its state goes (a preempted sequence is rebuilt when it
  // speculates again). Unknown ids are ignored.
  virtual void release(seq_id seq) { (void)seq; }
  virtual draft_pool_usage pool_usage() const { return {}; }
};

}  // namespace tessera
