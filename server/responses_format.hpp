// /v1/responses' answers (server/responses_request.hpp): OpenAI's Response object, whole or as the
// Server-Sent Events of a stream. The stream's events, each with an `event:` line naming its type
// and a sequence_number counting from 0:
//   response.created, response.in_progress            (the Response, in_progress, no output yet)
//   response.output_item.added, response.content_part.added   (the message, its output_text part)
//   response.output_text.delta ...                    (one per text delta)
//   response.output_text.done, response.content_part.done, response.output_item.done
//   response.completed | response.incomplete (max_output_tokens reached) | response.failed (engine error)
// The opening events go with the first text (as the chat stream's first chunk does), so that a request
// the engine refuses before any output (a prompt too long) is still a plain 400.
#pragma once
#include <boost/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "actors/engine_facade.hpp"
#include "server/request_parser.hpp"
#include "server/responses_request.hpp"
#include "server/sse_writer.hpp"

namespace tessera::server {

struct response_ids {
  std::string response_id;  // "resp_..."
  std::string message_id;   // "msg_..."
  int64_t created_at = 0;
  std::string model;
};

// The Response object. `final` null: in progress (no usage); otherwise its status, incomplete_details,
// error and usage come from it. `output`: the output items so far.
boost::json::object response_object(const responses_echo& echo, const generation_request& req, const response_ids& ids,
                                    const boost::json::array& output, const actors::stream_final* final);

// The assistant message item holding `text`; status "in_progress", "completed" or "incomplete".
boost::json::object message_item(const response_ids& ids, std::string_view text, std::string_view status,
                                 bool with_content = true);

// A non-streamed /v1/responses body.
std::string responses_body(const responses_echo& echo, const generation_request& req, const response_ids& ids,
                           std::string_view text, const actors::stream_final& final);

// One streamed response's events, in order.
class responses_stream {
 public:
  responses_stream(responses_echo echo, response_ids ids) : echo_(std::move(echo)), ids_(std::move(ids)) {}

  // The events of a text delta (the opening ones first); nothing for empty text.
  void text(const generation_request& req, std::string_view delta, sse_writer& sse, std::string& out);
  // The closing events and the end of the stream.
  void finish(const generation_request& req, const actors::stream_final& f, sse_writer& sse, std::string& out);

 private:
  void open(const generation_request& req, sse_writer& sse, std::string& out);
  void emit(std::string_view type, boost::json::object event, sse_writer& sse, std::string& out);

  responses_echo echo_;
  response_ids ids_;
  std::string text_;
  int64_t sequence_ = 0;
  bool opened_ = false;
};

}  // namespace tessera::server
