// What the engine's sampler hands an executor that samples on the device, and what comes back: plain
// data, so that the sampler needs nothing else of the executor interface.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera {

// Sampling done by the executor (optional: executor::samples_on_device()): everything the engine's
// sampler would do with this sequence's last logits row, as plain data, made by
// sampler::device_request() with the semantics of sampler::sample() (docs/sampling.md). Token ids
// outside the vocabulary are ignored.
struct device_sampling {
  bool greedy = false;  // argmax, lowest id on ties (temperature below 1e-5)
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = -1;  // <= 0: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t num_logprobs = -1;                           // -1: none; else the token's raw logprob plus that many top ones
  uint64_t stream_key = 0;                             // the draw is sampler::uniform_draw(stream_key, position)
  uint64_t position = 0;                               // output position of the token to choose
  std::vector<std::pair<token_id, float>> logit_bias;  // distinct ids, added first
  std::vector<token_id> masked;                        // set to -inf (min_tokens not reached yet)
  std::vector<token_id> penalized;                     // distinct ids: repetition penalty
  std::vector<std::pair<token_id, int32_t>> output_counts;  // distinct ids: presence / frequency
  // Overlapped steps: the penalties count one more generated token, which `penalized` and
  // `output_counts` leave out: the slice's last token, a placeholder for the one the executor sampled
  // in the previous step and kept (sequence_slice::last_token_from), which the host has not seen yet.
  bool counts_last_token = false;
  // Constrained decoding: the grammar's packed bitmask of allowed tokens (engine/structured_output.hpp),
  // applied before everything else (disallowed logits become -inf, raw logprobs included). Empty: no
  // constraint. The engine's grammar workers fill it while the forward pass runs, so its words may be
  // read only after step_batch::masks_ready is ready (an executor waits right before it samples).
  std::span<const uint32_t> allowed_tokens;
};

// A token the executor sampled, with the raw logprobs asked for (as sample_result).
struct sampled_token {
  token_id token = -1;  // -1: not sampled by the executor (its logits row is returned instead)
  float logprob = 0.0f;
  std::vector<std::pair<token_id, float>> top_logprobs;
};

}  // namespace tessera
