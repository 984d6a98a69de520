// What a generation's stream becomes on the wire, for both transports: the bookkeeping every stream
// does per delta and per final (which choices have started, inter-token latency, tokens so far, the
// final's metrics), and the JSON of the messages, OpenAI stream chunks for SSE and the /v1/ws messages
// of docs/websocket.md, built from the same pieces (text as valid UTF-8, logprobs, finish reasons,
// usage, timings) so that the two streams cannot drift apart.
#pragma once
#include <boost/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/engine_facade.hpp"
#include "server/api_error.hpp"
#include "server/chat_output.hpp"
#include "server/metrics.hpp"
#include "server/openai_format.hpp"
#include "server/request_parser.hpp"

namespace tessera::server {

// One generation's progress through its stream.
class stream_progress {
 public:
  explicit stream_progress(int32_t num_choices)
      : last_token_at_(static_cast<size_t>(num_choices), -1.0), started_(static_cast<size_t>(num_choices), false) {}

  // Accounts for a delta: its tokens counted, the stream's first token into the time-to-first-token
  // histogram (when it happens, so a long stream is seen while it runs), the gap since its choice's
  // previous token into the inter-token latency histogram. False for a delta that names no choice of this request.
  bool take_delta(const actors::stream_delta& d, server_metrics& metrics);
  // True the first time a message is sent for choice `index` (a chat chunk then carries the role).
  bool first_of_choice(int32_t index);
  // True for the stream's first message (a /v1/ws delta then carries engine_request_id).
  bool first_of_stream();
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::vector<double> last_token_at_;  // per choice: its newest token's seconds_since_submit; -1: none yet
  std::vector<bool> started_;
  bool any_started_ = false;
  bool any_token_ = false;
  int64_t num_tokens_ = 0;
};

// Whether a delta is worth a message: new tokens or new text (the detokenizer may hold text back). The
// first message of a stream therefore comes only once its first token exists.
inline bool has_output(const request_output& o) { return !o.token_ids.empty() || !o.text.empty(); }

// The final's outcome counter and per-request histograms (end to end, queue / prefill / decode
// time, prompt and generated tokens), once per generation, whichever transport carried it.
void record_final(const actors::stream_final& final, server_metrics& metrics);

// ---- OpenAI stream chunks (the JSON of one SSE event; sse_writer frames them) ----------------------

// A delta of choice o.index. Completions' logprobs start at *text_offset (the choice's text so far, in
// its tokens' bytes) and leave it past this delta's; null: at 0. With echo and logprobs, a delta that
// carries o.prompt_logprobs (the choice's first) lists the prompt's tokens first.
std::string delta_chunk(const generation_request& req, const response_meta& meta, const request_output& o,
                        bool first_of_choice, const tokenizer* tok, size_t* text_offset = nullptr);
// A chat delta of choice `index` after the output parsers: one chunk with reasoning_content and/or
// content (with the delta's logprobs when asked for), then per tool call OpenAI's two chunks: the
// header {index, id, type, function: {name, arguments: ""}} and the arguments. `first_call_index`: the
// choice's calls before these. Nothing when the piece is empty and there are no logprobs.
std::vector<std::string> parsed_delta_chunks(const generation_request& req, const response_meta& meta, int32_t index,
                                             const chat_piece& piece, bool first_of_choice, int32_t first_call_index,
                                             const std::vector<token_logprob>* logprobs, const tokenizer* tok);
// The chunk that closes choice `index` with its finish reason (timings attached when given);
// made_calls: "tool_calls" instead of "stop".
std::string finish_chunk(const generation_request& req, const response_meta& meta, int32_t index, finish_reason reason,
                         const boost::json::object* timings, bool made_calls = false);
// stream_options.include_usage: the last chunk, no choices, with usage.
std::string usage_chunk(const generation_request& req, const response_meta& meta, const actors::stream_final& final);

// ---- /v1/ws messages (docs/websocket.md) ---------------------------------------------------------

// {"type": "started", "id", "request_id"}
std::string ws_started_message(std::string_view id, std::string_view request_id);
// {"type": "delta", "id", "index", "token_ids", "text", "t", ["engine_request_id"], ["logprobs" (chat shape)]}
// With output parsers (`piece` non-null), "text" is the piece's content, and "reasoning_content" and
// "tool_calls" (OpenAI's stream shape, indexes from first_call_index) are added when non-empty.
std::string ws_delta_message(std::string_view id, const actors::stream_delta& d, bool with_logprobs,
                             bool with_engine_id, const tokenizer* tok, const chat_piece* piece = nullptr,
                             int32_t first_call_index = 0);
// {"type": "final", "id", "finish_reason", "choices", "usage", "timings", ["engine_request_id"], ["error"]}
// calls_per_choice (when given, by choice index): a choice that made calls finishes with "tool_calls".
std::string ws_final_message(std::string_view id, const actors::stream_final& final,
                             const std::vector<int32_t>* calls_per_choice = nullptr);
// {"type": "error", ["id"], "status", "error": {OpenAI's error object}}
std::string ws_error_message(const api_error& e, std::string_view id);

}  // namespace tessera::server
