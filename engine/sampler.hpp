// Turns one row of logits into the next token for one sequence.
//
// One sampler per sequence (n > 1 requests make one per fork). It owns the sequence's random stream
// and its penalty state (token counts), so the engine calls it once per sequence per step:
//
//   sampler s(params, fork_index, prompt_tokens, eos_token_ids);
//   ...each step:  sample_result r = s.sample(out.row(row));   // records r.token itself
//
// Determinism: the random draw for output position t is a pure function of (sequence key, t), where
// the key is derived from (params.seed, fork_index). The same seed and the same logits therefore give
// the same tokens whatever else is in the batch, however steps are batched, and after preemption.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/device_sampling.hpp"
#include "engine/sampling_params.hpp"

namespace tessera {

struct sample_result {
  token_id token = -1;
  // log p(token) under the RAW model distribution (log_softmax of the logits as given, before bias,
  // penalties, temperature and truncation), as vLLM reports by default. Filled only when
  // params.logprobs >= 0; otherwise 0.
  float logprob = 0.0f;
  // The params.logprobs most likely tokens of the raw distribution, most likely first (ties: lower
  // id first), with their raw logprobs. Empty when params.logprobs <= 0.
  std::vector<std::pair<token_id, float>> top_logprobs;
};

// The raw distribution of one sanitized logits row (no NaN, no +inf: sampling_math::sanitize_logit):
// its log normalizer (log sum exp) and its top_k most likely entries as logprobs, most likely first
// (ties: lower id first). What sample() reports as logprobs, and what prompt logprobs are scored with
// (engine/prompt_logprobs.hpp).
struct raw_logprobs {
  double log_normalizer = 0.0;
  std::vector<std::pair<token_id, float>> top;
};
raw_logprobs compute_raw_logprobs(std::span<const float> row, size_t top_k);

// The distribution a request with `params` draws from `processed` (logits after its logit processors,
// temperature included): greedy, its argmax; otherwise top-k, then top-p, then min-p, normalised.
// Vocabulary-sized probabilities into `probs`; false (probs all 0) when every logit is -inf.
bool processed_distribution(std::span<const float> processed, const sampling_params& params, std::vector<float>& probs);

// Inverse-CDF draw over `probs` (non-negative weights, any total) in id order with `uniform` in [0, 1);
// -1 when no weight is positive.
token_id draw_from(std::span<const float> probs, double uniform);

class sampler {
 public:
  // fork_index: which of the request's n sequences this is (0..n-1); with a seed, fork i's stream is
  // derived deterministically from (seed, i). prompt: the request's prompt tokens (repetition
  // penalty). eos_token_ids: the model's end tokens, masked together with params.stop_token_ids while
  // fewer than params.min_tokens tokens have been generated (EOS is not masked when ignore_eos).
  // params must already be validate()d; ids outside the vocabulary are ignored.
  sampler(const sampling_params& params, uint64_t fork_index, std::span<const token_id> prompt,
          std::span<const token_id> eos_token_ids = {});

  // Chooses the next token from `logits` (one row, vocab_size floats; not modified) and records it
  // (penalty counts, output position). NaN logits count as -inf, +inf as the largest float.
  // `allowed` (constrained decoding): a packed bitmask (engine/structured_output.hpp); tokens outside
  // it are set to -inf first, before the raw logprobs and every other step, so all parameters compose
  // with the constraint. Empty: every token is allowed.
  // Thread-compatible: one thread per sampler at a time; different samplers may run concurrently
  // (the vocabulary-sized scratch buffers are thread_local). Cost: a few linear passes over the
  // vocabulary, no full sort, whatever top-k / top-p are.
  sample_result sample(std::span<const float> logits, std::span<const uint32_t> allowed = {});

  // The distribution sample() draws the next token from, every transform applied (the mask, logit_bias,
  // min_tokens, penalties, temperature, top-k, top-p, min-p): `probs` becomes vocabulary-sized
  // probabilities summing to 1 (greedy: 1 on the argmax; sample()'s fallback when everything is masked:
  // 1 on the raw argmax). Records nothing. Speculative rejection sampling compares it with a draft's
  // (engine/speculative/verifier.hpp).
  void distribution(std::span<const float> logits, std::span<const uint32_t> allowed, std::vector<float>& probs) const;

  // Records `token` as the next output token, chosen from `logits` by another rule than sample()'s draw
  // (speculative rejection sampling), and returns what sample() would have for it: the token with its
  // raw logprobs. Throws invalid_argument for a token outside the vocabulary.
  sample_result take(std::span<const float> logits, std::span<const uint32_t> allowed, token_id token);

  // Records a token that did NOT come from sample() (e.g. a forced continuation) so penalties and the
  // output position stay right. Never call it for tokens sample() returned: they are recorded already.
  void append_external_token(token_id token);

  // This sequence's next sample() as plain data for an executor that samples on its device
  // (executor::samples_on_device()); record the token it returns with append_external_token().
  // nullopt when the device sampler cannot reproduce sample(): logit_bias with a repeated id (the
  // host adds the biases one after the other, the device in parallel).
  // ahead > 0 (overlapped steps): the sample after `ahead` more tokens the device is sampling now, which
  // this sampler has not recorded yet. With a penalty, which counts them: for one, the request says
  // so (device_sampling::counts_last_token) and the executor counts it; for more, nullopt.
  std::optional<device_sampling> device_request(int32_t ahead = 0) const;

  // The logit processors sample() runs before truncation, in order: logit_bias, the min_tokens mask,
  // repetition penalty, presence/frequency penalties, temperature (skipped when greedy). In place;
  // exposed for tests and for callers that want processed logprobs.
  void process_logits(std::span<float> logits) const;

  int32_t num_generated() const { return num_generated_; }
  // The key of this sequence's random stream (already mixed with the fork index); for logs and tests.
  uint64_t stream_key() const { return stream_key_; }

  // The uniform draw in [0, 1) used at output position `position` of the stream `key`.
  static double uniform_draw(uint64_t key, uint64_t position);
  // The stream key of fork `fork_index` of a request seeded with `seed`.
  static uint64_t derive_stream_key(uint64_t seed, uint64_t fork_index);

 private:
  void record(token_id token);
  double report_top_logprobs(std::span<const float> masked, sample_result& result) const;

  sampling_params params_;
  uint64_t stream_key_ = 0;
  int32_t num_generated_ = 0;
  std::vector<token_id> prompt_unique_;  // sorted; only kept for repetition_penalty != 1
  std::unordered_map<token_id, int32_t> output_counts_;
  std::vector<token_id> min_tokens_mask_;  // ids masked while num_generated_ < min_tokens
};

}  // namespace tessera
