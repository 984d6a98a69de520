// Per-request generation controls, with vLLM's SamplingParams semantics (which follow the OpenAI
// completions API for the penalties), plus the reasons a sequence can finish.
// See docs/sampling.md for the order in which the sampler applies them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/structured_output.hpp"

namespace tessera {

// Server-side bounds that validate() enforces on top of the per-field rules.
struct sampling_limits {
  int32_t max_n = 16;         // parallel samples per request
  int32_t max_logprobs = 20;  // top-N logprobs per token (OpenAI's limit)
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 256;
  int32_t max_stop_token_ids = 64;
  int32_t max_logit_bias_entries = 1024;
  float max_abs_logit_bias = 100.0f;  // OpenAI's bound
  // Constrained decoding: the schema / regex / grammar text, and guided_choice's list. The grammar
  // engine bounds nesting depth and compile time itself (engine/structured/grammar_backend.hpp).
  int32_t max_structured_output_bytes = 64 * 1024;
  int32_t max_choices = 1024;
};

struct sampling_params {
  int32_t n = 1;                                       // independent samples (sequences) for this prompt
  float temperature = 1.0f;                            // 0 (below 1e-5): greedy argmax
  float top_p = 1.0f;                                  // nucleus: keep the smallest top set with mass >= top_p
  int32_t top_k = -1;                                  // -1 or 0: disabled
  float min_p = 0.0f;                                  // drop tokens with p < min_p * p_max; 0: disabled
  float repetition_penalty = 1.0f;                     // CTRL: for tokens seen in prompt or output, l>0: l/r, else l*r
  float presence_penalty = 0.0f;                       // OpenAI: l -= presence * [count > 0], over generated tokens
  float frequency_penalty = 0.0f;                      // OpenAI: l -= frequency * count, over generated tokens
  std::vector<std::pair<token_id, float>> logit_bias;  // added to the raw logits
  std::optional<uint64_t> seed;                        // absent: a fresh random seed per sequence
  int32_t max_tokens = 16;                             // generated tokens at most (finish_reason::length); 0: none
  // false: the prompt plus max_tokens must fit max_model_len, else the request is refused (vLLM's
  // rule for a max_tokens the client asked for); true: the output also ends (length) at max_model_len.
  bool truncate_to_context = true;
  int32_t min_tokens = 0;         // EOS / stop tokens / stop strings cannot end the output earlier
  std::vector<std::string> stop;  // stop strings (not included in the output by default)
  std::vector<token_id> stop_token_ids;
  bool ignore_eos = false;  // keep generating past EOS (until max_tokens / a stop)
  bool include_stop_str_in_output = false;
  int32_t logprobs = -1;  // -1: none; 0..20: the sampled token's logprob plus top-N
  // -1: none; 0..20: every prompt token's logprob (after the tokens before it) plus the top-N at each
  // position (vLLM's prompt_logprobs; engine/prompt_logprobs.hpp).
  int32_t prompt_logprobs = -1;
  bool skip_special_tokens = true;  // detokenizer: drop special tokens' text
  // Constrained decoding (docs/structured_output.md): every token is sampled from the tokens the
  // grammar allows, and the sequence finishes (reason stop) when the grammar is complete.
  std::optional<structured_output_spec> structured;
  // Speculative decoding (docs/speculative.md) may verify proposed tokens for this request when the
  // engine has it on; false keeps the request on plain decoding. Either way the output distribution
  // is the same: this only trades compute for latency.
  bool speculative = true;

  // Throws invalid_request, naming the offending field, for any value the engine cannot honour.
  // vocab_size bounds the token ids in logit_bias and stop_token_ids.
  void validate(int32_t vocab_size, const sampling_limits& limits = {}) const;

  // temperature below this is treated as greedy (vLLM's _SAMPLING_EPS).
  static constexpr float greedy_temperature = 1e-5f;
  bool greedy() const { return temperature < greedy_temperature; }
};

// Why a sequence stopped generating. `stop` covers EOS, a stop token id and a stop string.
enum class finish_reason : uint8_t { none, stop, length, abort, error };

// "stop", "length", "abort", "error"; "none" for a sequence still running (APIs send null).
std::string_view to_string(finish_reason reason);

}  // namespace tessera
