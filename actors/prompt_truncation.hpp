// vLLM's truncate_prompt_tokens (and `tessera serve --allow-truncation`, which makes -1 every request's
// default): a prompt too long to run keeps its last tokens instead of being refused. Applied by the
// engine actor once the prompt is tokenized, before llm_engine::add_request checks the lengths.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/executor.hpp"  // token_id
#include "engine/sampling_params.hpp"

namespace tessera::actors {

// `keep` > 0: the prompt's last `keep` tokens (a shorter prompt is untouched); more than max_model_len
// is refused (invalid_request naming truncate_prompt_tokens). -1: the last tokens that fit the context
// with the request's max_tokens (with the default max_tokens, which ends at the context: all but one
// position), nothing when not even one prompt token would fit (the engine then refuses as usual).
// 0: untouched. `max_model_len` 0: unknown, nothing is cut for -1.
inline void truncate_prompt(std::vector<token_id>& ids, int32_t keep, int32_t max_model_len,
                            const sampling_params& params) {
  if (keep == 0) return;
  if (keep > 0 && max_model_len > 0 && keep > max_model_len) {
    throw invalid_request("'truncate_prompt_tokens' (" + std::to_string(keep) + ") is more than max_model_len (" +
                              std::to_string(max_model_len) + ")",
                          "truncate_prompt_tokens");
  }
  if (keep < 0) {
    if (max_model_len <= 0) return;
    const int64_t room = params.truncate_to_context ? 1 : params.max_tokens;
    if (room >= max_model_len) return;
    keep = static_cast<int32_t>(max_model_len - room);
  }
  if (static_cast<int64_t>(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
}

}  // namespace tessera::actors
