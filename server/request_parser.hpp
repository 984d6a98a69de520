// OpenAI-compatible request bodies -> engine requests, parsed with simdjson. Every field is checked
// for type and range before the engine sees it; any problem throws api_error (400) naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/prompt_input.hpp"
#include "engine/sampling_params.hpp"
#include "engine/text/chat_template.hpp"
#include "server/api_error.hpp"
#include "server/tool_request.hpp"

namespace tessera::server {

enum class api_kind : uint8_t { completion, chat, embedding };

// Bounds on what a request may ask for, on top of sampling_limits (reference-notes, default limits).
struct request_limits {
  sampling_limits sampling;
  int32_t max_tokens = 1 << 20;                // generated tokens per choice at most
  int32_t default_completion_max_tokens = 16;  // OpenAI's default for /v1/completions
  int32_t default_chat_max_tokens = 512;
  int32_t max_prompt_token_ids = 1 << 20;  // token-id prompts
  int32_t max_messages = 4096;
  int32_t max_completion_logprobs = 5;  // /v1/completions "logprobs" (OpenAI's bound)
  int32_t max_priority = 1 << 20;       // |priority|
  int32_t max_prompts = 256;            // /v1/completions: prompts in one batch ("prompt" as a list)
  // One response's estimated size at most (estimated_response_bytes); larger: 400. It bounds what
  // n x max_tokens x logprobs can make the server build and send for one request.
  int64_t max_response_bytes = int64_t{64} << 20;
  // The engine's max_model_len: no choice generates more tokens than this (0: unknown).
  int32_t max_model_len = 0;
  // The server's default chat_template_kwargs (--chat-template-kwargs, a JSON object's text; empty:
  // none). A request's own chat_template_kwargs override it key by key.
  std::string default_chat_template_kwargs;
  // --allow-truncation: a request without truncate_prompt_tokens gets -1 (a prompt too long keeps its
  // last tokens that fit, actors/prompt_truncation.hpp) instead of a 400.
  bool allow_truncation = false;
};

// Bytes one response may need at most, as the server bounds it: per choice, per token it could
// generate (max_tokens, capped by max_model_len), 32 bytes of text and JSON, plus 96 bytes for each
// logprob entry (the chosen token and its top_logprobs alternatives: token text, logprob, bytes).
constexpr int64_t k_response_bytes_per_token = 32;
constexpr int64_t k_response_bytes_per_logprob = 96;

struct generation_request {
  api_kind kind = api_kind::completion;
  std::string model;
  actors::prompt_input prompt;
  // /v1/completions with a batch of prompts ("prompt" as a list of strings or of token-id lists):
  // the second and later ones (`prompt` is the first). Each is its own engine request with n
  // choices; the response's choices go prompt-major (prompt p, choice i: index p * n + i), as OpenAI's.
  std::vector<actors::prompt_input> more_prompts;
  bool echo = false;  // /v1/completions: each choice's text begins with its prompt
  sampling_params params;
  int32_t priority = 0;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool want_logprobs = false;  // chat: logprobs true; completions: logprobs given
  int32_t top_logprobs = 0;
  // Prompt logprobs (engine params.prompt_logprobs is the larger of the two asks): vLLM's
  // prompt_logprobs field (-1: not asked; else the top tokens per position, answered as
  // "prompt_logprobs"), and completions' echo with logprobs (the logprobs object covers the prompt).
  int32_t prompt_logprobs = -1;
  bool echo_logprobs = false;
  std::string user;
  tool_request tools;  // chat: tools / tool_choice / parallel_tool_calls (server/tool_request.hpp)
  // /v1/embeddings: encoding_format "base64" (little-endian float32 bytes, base64) rather than "float".
  bool embedding_base64 = false;
};

// How many prompts the request holds (1 + more_prompts).
inline int32_t num_prompts(const generation_request& req) { return 1 + static_cast<int32_t>(req.more_prompts.size()); }

int64_t estimated_response_bytes(const generation_request& req, const request_limits& limits);

// --chat-template-kwargs: a JSON object none of whose keys is a variable the server sets (messages,
// tools, ...). Throws invalid_request saying what is wrong.
void check_chat_template_kwargs(std::string_view json_text);

// Parses a /v1/completions or /v1/chat/completions body. vocab_size bounds every token id.
generation_request parse_generation_request(std::string_view body, api_kind kind, int32_t vocab_size,
                                            const request_limits& limits = {});

// Parses a /v1/embeddings body: {"input": a string, strings, token ids or lists of token ids (one
// engine request each, in `prompt` and `more_prompts`), "model", "encoding_format": "float" |
// "base64", "dimensions" (only `hidden_size`), "user", "add_special_tokens"}. kind is embedding.
generation_request parse_embedding_request(std::string_view body, int32_t vocab_size, int32_t hidden_size,
                                           const request_limits& limits = {});

// /tokenize: {"prompt": string} (or {"messages": [...]} for chat) plus "add_special_tokens" and
// "parse_special" (a prompt's special-token text, e.g. "<|im_start|>", becomes the special token).
struct tokenize_request {
  std::string prompt;
  std::vector<chat_message> messages;
  bool is_chat = false;
  bool add_special_tokens = true;
  bool parse_special = true;
};
tokenize_request parse_tokenize_request(std::string_view body);

// /detokenize: {"tokens": [ids]}.
std::vector<token_id> parse_detokenize_request(std::string_view body, int32_t vocab_size,
                                               const request_limits& limits = {});

}  // namespace tessera::server
