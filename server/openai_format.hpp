// OpenAI response shapes (completions and chat completions, usage, timings, logprobs), written with
// Boost.JSON from the engine's stream items. The stream chunks are in server/stream_format.hpp.
#pragma once
#include <boost/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "engine/text/tokenizer.hpp"
#include "server/request_parser.hpp"
#include "server/tool_call_parser.hpp"

namespace tessera::server {

// Every string we serialize goes through tessera::sanitize_utf8 (engine/text/tokenizer.hpp) first, so
// it is valid JSON text: token pieces and text deltas may hold broken UTF-8.

// "stop", "length", "abort", "error"; null while running.
boost::json::value finish_reason_json(finish_reason reason);

// The phases of a request's lifecycle, read from its final message (choice 0's timeline): what the
// `timings` object and the /metrics phase histograms both report. -1: the phase did not happen.
struct request_phases {
  double queue_seconds = -1;    // queued -> scheduled
  double prefill_seconds = -1;  // scheduled -> first token
  double decode_seconds = -1;   // first token -> end
  int64_t num_preemptions = 0;  // all choices: recomputes and swap-outs
  int64_t num_swaps = 0;
};
request_phases phases_of(const actors::stream_final& final);

// The request's lifecycle from its final message: queue, prefill and first-token times, decode rate,
// preemptions and swaps.
boost::json::object timings_json(const actors::stream_final& final);

boost::json::object usage_json(const actors::stream_final& final);

// The error code of a request the engine refused because of its field `param` (stream_final::error_param):
// "context_length_exceeded" (OpenAI's) for a max_tokens that does not fit, "invalid_value" for a
// truncate_prompt_tokens beyond the context, "invalid_structured_output"
// for a response_format / guided_* the grammar engine refused.
std::string refusal_code(std::string_view param);

// What the response needs to identify itself.
struct response_meta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// One choice's generated text, tokens and logprobs, accumulated from deltas.
struct choice_accumulator {
  std::string text;
  std::vector<token_id> token_ids;
  std::vector<token_logprob> logprobs;
  std::vector<prompt_logprob> prompt_logprobs;  // params.prompt_logprobs >= 0: every prompt position
  size_t logprob_offset = 0;                    // a stream's next text_offset (completions' logprobs)
  // Chat with output parsers (server/chat_output.hpp): the text split into the message's parts.
  bool parsed = false;
  std::string reasoning;
  std::string content;
  std::vector<parsed_tool_call> calls;
};

// A choice's finish reason, "tool_calls" when it stopped after making calls (OpenAI's value).
boost::json::value choice_finish_json(finish_reason reason, bool made_calls);

// OpenAI's tool_calls array: [{"index"?, "id", "type": "function", "function": {"name", "arguments"}}]
// (`first_index` >= 0 adds the stream's "index" to each, counting from it).
boost::json::array tool_calls_json(const std::vector<parsed_tool_call>& calls, int32_t first_index = -1);

// The logprobs object of one delta or whole choice (completions: tokens/token_logprobs/top_logprobs/
// text_offset; chat: content[{token, logprob, bytes, top_logprobs}]).
boost::json::value logprobs_json(api_kind kind, const std::vector<token_logprob>& logprobs, const tokenizer* tok,
                                 size_t text_offset);
// Completions' (legacy) logprobs object over `prompt`'s positions (echo: the prompt's first token has
// null logprob and top_logprobs, the others their top_k alternatives) followed by `generated`. Each
// top_logprobs holds the token's alternatives plus the token itself when it is not among them (OpenAI:
// up to logprobs + 1 entries). text_offset counts from `text_offset`, which is left past the entries
// (a stream's next chunk continues from it).
boost::json::value completion_logprobs_json(std::span<const prompt_logprob> prompt,
                                            const std::vector<token_logprob>& generated, int32_t top_k,
                                            const tokenizer* tok, size_t& text_offset);
// vLLM's prompt_logprobs: one item per prompt position, null for the first, else an object keyed by
// token id ({"<id>": {"logprob", "rank", "decoded_token"}}): the prompt token, then its top_k most
// likely tokens (ranks 1..top_k).
boost::json::value prompt_logprobs_json(std::span<const prompt_logprob> prompt, int32_t top_k, const tokenizer* tok);

// {"id", "object", "created", "model"}: how every response and stream chunk begins. `chunk`: the
// object of a stream chunk ("chat.completion.chunk") rather than of a whole response.
boost::json::object response_envelope(const generation_request& req, const response_meta& meta, bool chunk);

// Non-streaming body.
std::string full_response(const generation_request& req, const response_meta& meta,
                          const std::vector<choice_accumulator>& choices, const actors::stream_final& final,
                          const tokenizer* tok);

// /v1/embeddings' body: {"id", "object": "list", "created", "model", "data": [{"object": "embedding",
// "index", "embedding"}], "usage": {"prompt_tokens", "total_tokens"}}, one item per input in order,
// each the vector of its final's choice (a JSON array of numbers, or with req.embedding_base64 the
// base64 of its little-endian float32 bytes).
std::string embeddings_response(const generation_request& req, const response_meta& meta,
                                const actors::stream_final& final);

}  // namespace tessera::server
