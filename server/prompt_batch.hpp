// A /v1/completions request with a batch of prompts ("prompt" as a list) runs as one engine request
// per prompt, each with the request's n choices. What the client sees is one response whose choices
// go prompt-major, as OpenAI's do: prompt p's choice i is choice p * n + i. These are the pieces that
// turn the engine requests' streams back into that one response.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/prompt_input.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera::server {

// The choice index prompt `prompt_index`'s choice `choice` has in the response.
inline int32_t batch_choice_index(size_t prompt_index, int32_t n, int32_t choice) {
  return static_cast<int32_t>(prompt_index) * n + choice;
}

// The final messages of every prompt's request (in prompt order) as the one final of the response:
// choices renumbered prompt-major, usage and speculative counts summed, the first token as early as
// the earliest prompt's, the end as late as the latest's. Its reason is the worst (error > abort),
// else the first prompt's; an error keeps the first failed request's message, field and fault kind.
actors::stream_final merged_final(const std::vector<actors::stream_final>& finals, int32_t n);

// What `echo` puts before a choice's text: the prompt as the client sent it (text), or its token ids
// decoded (token-id prompts; empty without a tokenizer).
std::string echo_text(const actors::prompt_input& prompt, const tokenizer* tok);

}  // namespace tessera::server
