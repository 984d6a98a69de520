// OpenAI response shapes (completions, chat completions, their stream chunks, usage, timings), written
// with Boost.JSON from the engine's stream items.
#pragma once
#include <boost/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "engine/text/tokenizer.hpp"
#include "server/request_parser.hpp"

namespace tessera::server {

// Every string we serialize goes through tessera::sanitize_utf8 (engine/text/tokenizer.hpp) first, so
// it is valid JSON text: token pieces and text deltas may hold broken UTF-8.

// "stop", "length", "abort", "error"; null while running.
boost::json::value finish_reason_json(finish_reason reason);

// The request's lifecycle from its final message: queue, prefill and first-token times, decode rate,
// preemptions and swaps.
boost::json::object timings_json(const actors::stream_final& final);

boost::json::object usage_json(const actors::stream_final& final);

// What the response needs to identify itself.
struct response_meta {
  std::string id;      // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// One choice's generated text, tokens and logprobs, accumulated from deltas.
struct choice_accumulator {
  std::string text;
  std::vector<token_id> token_ids;
  std::vector<token_logprob> logprobs;
};

// The logprobs object of one delta or whole choice (completions: tokens/token_logprobs/top_logprobs/
// text_offset; chat: content[{token, logprob, bytes, top_logprobs}]).
boost::json::value logprobs_json(api_kind kind, const std::vector<token_logprob>& logprobs, const tokenizer* tok,
                                 size_t text_offset);

// Non-streaming body.
std::string full_response(const generation_request& req, const response_meta& meta,
                          const std::vector<choice_accumulator>& choices, const actors::stream_final& final,
                          const tokenizer* tok);

// One SSE chunk for a delta of choice `index` (data only, without "data: ").
std::string delta_chunk(const generation_request& req, const response_meta& meta, const request_output& out,
                        bool first_of_choice, const tokenizer* tok);
// The chunk that closes choice `index` with its finish reason (timings attached when given).
std::string finish_chunk(const generation_request& req, const response_meta& meta, int32_t index,
                         finish_reason reason, const boost::json::object* timings);
// stream_options.include_usage: the last chunk, no choices, with usage.
std::string usage_chunk(const generation_request& req, const response_meta& meta, const actors::stream_final& final);

}  // namespace tessera::server
