// /v1/responses (OpenAI's Responses API), the subset with plain text in and out: its body becomes the
// chat completion request it means -- `instructions` a system message before the `input` messages,
// `max_output_tokens` max_tokens -- and goes through the chat path's own parser
// (parse_generation_request), so that rendering, validation and the engine request are the chat
// path's. What the subset does not cover is a 400 naming the field: tools, non-text input (images,
// files), items other than messages, structured text formats, and what needs a response store
// (previous_response_id, conversation, background): nothing is stored, `store: true` is answered
// with "store": false as vLLM does without its store.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/request_parser.hpp"

namespace tessera::server {

// What the Response object repeats from its request.
struct responses_echo {
  std::optional<std::string> instructions;
  std::optional<int32_t> max_output_tokens;
  std::string metadata_json = "{}";  // a JSON object's text
  std::string truncation = "disabled";
  std::optional<std::string> user;
};

struct responses_request {
  generation_request chat;  // kind chat: what runs
  responses_echo echo;
};

// Parses a /v1/responses body; throws api_error (400) naming the field (the Responses API's name:
// max_output_tokens, input) for anything wrong or outside the subset.
responses_request parse_responses_request(std::string_view body, int32_t vocab_size, const request_limits& limits = {});

}  // namespace tessera::server
