// The draft-model proposer (vLLM's `--speculative-config '{"model": ...}'`, llama-server's
// `--model-draft`): a second, smaller model with the target's vocabulary drafts k tokens, greedily for
// greedy requests and sampled from its own distribution for requests that sample.
//
//   auto draft_exec = make_cpu_executor(draft_weights, options);     // in app/, the composition root
//   draft_model_proposer p(std::move(draft_exec), target_vocab);     // throws on a vocabulary mismatch
//   drafts = p.propose(requests);  ...  p.rollback(seq, tokens);  ...  p.release(seq);
//
// The draft model runs on its own executor with its OWN paged KV cache, whose blocks this proposer
// accounts for in a block_manager of its own: the target's pool and scheduler never see them, and a
// full draft pool only means that a sequence does not speculate this step (the target is never
// preempted for the draft). Per sequence it keeps the K/V of the tokens it has seen. propose():
//   1. catch-up: the tokens it has not seen yet (the prompt, chunked; then the tokens the last step
//      committed) are prefilled, all sequences in one forward pass per chunk; the row of each
//      sequence's last token gives its first draft token;
//   2. k - 1 decode steps, one forward pass per draft position for the whole batch.
// A draft token is the row's argmax for a greedy request (a point mass, which verify_draft checks) and,
// for a request that samples (draft_request::sampling, unless options.sample is off), a draw from q,
// the row under the request's temperature and top-k/top-p/min-p (draft_distribution), returned with
// the proposal for verify_sampled_draft's min(1, p/q) rule: either way the output is the target's in
// distribution (engine/speculative/verifier.hpp). With options.branches > 1 the proposal is a tree:
// the chain (nodes 0 .. k-1), then per position more candidates as leaves under the chain node before
// it: the row's runners-up for argmax drafts, further draws from q without replacement for sampled
// ones (verify_sampled_tree). rollback() then truncates each sequence's draft K/V to the longest
// common prefix of what it drafted and what the target committed: rejected positions are never attended to again (their
// blocks past it go back to the pool; their stale slots in a kept block are overwritten).
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.hpp"
#include "engine/executor.hpp"
#include "engine/speculative/proposer.hpp"

namespace tessera {

struct draft_model_options {
  int32_t num_kv_blocks = 0;       // blocks of the draft executor's pool to use; 0: all of them
  int32_t max_batch_tokens = 512;  // tokens per catch-up forward pass (prompts are chunked to fit)
  // Requests that sample get drafts drawn from the draft model's distribution (accepted with
  // probability sum_x min(p(x), q(x)) per token); off: argmax drafts for every request (accepted with
  // p(argmax q), fewer at high temperatures, but a seeded request's tokens are then plain decoding's).
  bool sample = true;
  // Each draft position also offers branches - 1 more tokens as leaves beside the chain's token there
  // (a token tree): the draft row's next most likely tokens for argmax drafts (SpecInfer's top-k
  // expansion), further draws from q without replacement for sampled ones (recursive rejection
  // sampling). When the target rejects the chain's token it may take one of them instead. They cost
  // no draft pass (they come from the rows the chain already computes), only target rows. 1: a chain.
  int32_t branches = 1;
};

// Counters of the draft model's work, since construction.
struct draft_model_stats {
  uint64_t num_rounds = 0;           // propose() calls that ran the draft model
  uint64_t num_forwards = 0;         // draft forward passes (catch-up chunks and decode steps)
  uint64_t num_tokens_computed = 0;  // positions the draft model computed
  uint64_t num_no_room = 0;          // requests not drafted for because the draft pool was full
  uint64_t num_failures = 0;         // forward passes that threw (their sequences' state was dropped)
  uint64_t num_resyncs = 0;          // states found not rolled back to a prefix of the tokens, rebuilt (a bug)
};

class draft_model_proposer final : public draft_proposer {
 public:
  // `exec` runs the draft model; this proposer alone uses its KV pool. Throws invalid_request when the
  // draft's vocabulary size differs from `target_vocab` or the options do not fit the executor.
  draft_model_proposer(std::shared_ptr<executor> exec, int32_t target_vocab, const draft_model_options& options = {});

  std::vector<draft_proposal> propose(std::span<const draft_request> requests) override;
  void rollback(seq_id seq, std::span<const token_id> tokens) override;
  void release(seq_id seq) override;
  draft_pool_usage pool_usage() const override;

  const draft_model_stats& stats() const { return stats_; }
  const block_manager& blocks() const { return blocks_; }
  // Tokens whose draft K/V `seq` holds (0 for an unknown sequence).
  int32_t num_computed(seq_id seq) const;

 private:
  struct seq_state {
    std::vector<token_id> computed;  // the tokens whose K/V is in the draft cache, positions 0..
  };
  struct active;  // one request of a propose() round

  void forward(step_batch& step);  // runs it on the draft executor into out_; throws when it fails
  // Appends the next draft token of `a` from the logits row `row` (and its q row when it samples), and
  // when it branches the position's other candidates to a.leaves.
  void draw(active& a, std::span<const float> row, draft_proposal& into);
  // Turns `a`'s chain into a tree with a.leaves beside it (options.branches > 1).
  static void add_leaves(const active& a, draft_proposal& into);

  std::shared_ptr<executor> exec_;
  draft_model_options options_;
  block_manager blocks_;
  std::unordered_map<seq_id, seq_state> seqs_;
  std::vector<token_id> scratch_;  // token span for allocate_slots (it needs one that long)
  step_output out_;
  std::vector<float> q_;  // one q row, reused
  draft_model_stats stats_;
};

}  // namespace tessera
