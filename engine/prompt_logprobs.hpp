// Prompt-token logprobs (vLLM's prompt_logprobs; /v1/completions' echo with logprobs): how likely the
// model finds each prompt token after the tokens before it. Position i's logprob comes from the logits
// of row i - 1 (the row that predicts token i), so the prompt's first token has none (OpenAI and vLLM
// send null for it). The executor scores the rows it is asked for (score_prompt_row over the logits it
// computes for them, which it never returns whole: a 2,048-token chunk's logits are 400 MB); the engine
// collects the scored positions chunk by chunk (prompt_logprob_collector), skipping the positions a
// recomputed chunk scores again, and hands them out with the request's first output.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera {

struct prompt_logprob {
  token_id token = 0;  // the prompt token at this position
  // log p(token | the prompt before it) under the raw model distribution (log_softmax of the logits as
  // the model gives them, as vLLM reports by default); 0 where rank is 0.
  float logprob = 0.0f;
  // 1 + the number of tokens whose logit is strictly greater (vLLM's rank); 0: no logprob (position 0).
  int32_t rank = 0;
  std::vector<std::pair<token_id, float>> top;  // the top_k most likely tokens, most likely first (ties: lower id)

  bool has_logprob() const { return rank > 0; }
};

// Scores one logits row (vocab_size floats): `target`'s raw logprob and rank, and the top_k most likely
// tokens with their logprobs. NaN logits count as -inf and +inf as the largest float, as in the sampler.
// Thread-compatible (a vocabulary-sized thread_local scratch row): executors score rows in parallel.
prompt_logprob score_prompt_row(std::span<const float> logits, token_id target, int32_t top_k);

// One request's prompt logprobs as the executor's scored chunks come back.
class prompt_logprob_collector {
 public:
  prompt_logprob_collector(std::span<const token_id> prompt, int32_t top_k);
  int32_t top_k() const { return top_k_; }
  // The first prompt position whose logprob is not known yet (1 at the start; the prompt's length once
  // complete). The executor scores row next_position() - 1 and on.
  int32_t next_position() const { return next_; }
  bool complete() const { return next_ == static_cast<int32_t>(rows_.size()); }
  // The scored positions [first_position, first_position + rows.size()). Positions already known are
  // skipped (a chunk recomputed after a preemption scores them again: they are not taken twice). False,
  // taking nothing, when the rows do not reach next_position() (a gap), or name other tokens than the
  // prompt's (rows scored against the wrong targets).
  bool add(int32_t first_position, std::span<const prompt_logprob> rows);
  // Every position, the first (no logprob) included.
  const std::vector<prompt_logprob>& all() const { return rows_; }

 private:
  std::vector<prompt_logprob> rows_;
  int32_t top_k_ = 0;
  int32_t next_ = 1;
};

}  // namespace tessera
