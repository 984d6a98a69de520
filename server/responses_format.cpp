#include "server/responses_format.hpp"

#include "engine/text/tokenizer.hpp"
#include "server/openai_format.hpp"

namespace tessera::server {

namespace json = boost::json;

namespace {

// A finished request's status: a length stop is "incomplete" (OpenAI's reason is max_output_tokens,
// also when the context ended the output), an engine failure "failed".
std::string_view status_of(const actors::stream_final& f) {
  switch (f.reason) {
    case finish_reason::error: return "failed";
    case finish_reason::length:
    case finish_reason::abort: return "incomplete";
    default: return "completed";
  }
}

json::object output_text_part(std::string_view text) {
  return json::object{
      {"type", "output_text"}, {"text", sanitize_utf8(std::string(text))}, {"annotations", json::array()}};
}

json::value usage_of(const actors::stream_final& f) {
  return json::object{{"input_tokens", f.num_prompt_tokens},
                      {"input_tokens_details", json::object{{"cached_tokens", f.num_cached_prompt_tokens}}},
                      {"output_tokens", f.num_generated_tokens},
                      {"output_tokens_details", json::object{{"reasoning_tokens", 0}}},
                      {"total_tokens", f.num_prompt_tokens + f.num_generated_tokens}};
}

}  // namespace

json::object message_item(const response_ids& ids, std::string_view text, std::string_view status, bool with_content) {
  json::array content;
  if (with_content) content.push_back(output_text_part(text));
  return json::object{{"type", "message"},
                      {"id", ids.message_id},
                      {"status", status},
                      {"role", "assistant"},
                      {"content", std::move(content)}};
}

json::object response_object(const responses_echo& echo, const generation_request& req, const response_ids& ids,
                             const json::array& output, const actors::stream_final* final) {
  const std::string_view status = final ? status_of(*final) : "in_progress";
  json::object r{{"id", ids.response_id}, {"object", "response"}, {"created_at", ids.created_at}, {"status", status}};
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  if (final && status == "incomplete") {
    r["incomplete_details"] = json::object{{"reason", "max_output_tokens"}};
  } else if (final && status == "failed") {
    r["error"] = json::object{{"code", "server_error"},
                              {"message", sanitize_utf8(final->error.empty() ? "request failed" : final->error)}};
  }
  r["instructions"] = echo.instructions ? json::value(sanitize_utf8(*echo.instructions)) : json::value(nullptr);
  r["max_output_tokens"] = echo.max_output_tokens ? json::value(*echo.max_output_tokens) : json::value(nullptr);
  r["metadata"] = json::parse(echo.metadata_json);
  r["model"] = ids.model;
  r["output"] = output;
  r["parallel_tool_calls"] = false;
  r["previous_response_id"] = nullptr;
  r["reasoning"] = nullptr;
  r["store"] = false;  // nothing is stored (server/responses_request.hpp)
  r["temperature"] = req.params.temperature;
  r["text"] = json::object{{"format", json::object{{"type", "text"}}}};
  r["tool_choice"] = "none";
  r["tools"] = json::array();
  r["top_p"] = req.params.top_p;
  r["truncation"] = echo.truncation;
  r["usage"] = final ? usage_of(*final) : json::value(nullptr);
  r["user"] = echo.user ? json::value(sanitize_utf8(*echo.user)) : json::value(nullptr);
  if (final) r["timings"] = timings_json(*final);  // Tessera's, as on the chat path
  return r;
}

std::string responses_body(const responses_echo& echo, const generation_request& req, const response_ids& ids,
                           std::string_view text, const actors::stream_final& final) {
  const std::string_view status = status_of(final);
  json::array output{message_item(ids, text, status == "completed" ? "completed" : "incomplete")};
  return json::serialize(response_object(echo, req, ids, output, &final));
}

void responses_stream::emit(std::string_view type, json::object event, sse_writer& sse, std::string& out) {
  event["type"] = type;
  event["sequence_number"] = sequence_++;
  sse.named_event(type, json::serialize(event), out);
}

void responses_stream::open(const generation_request& req, sse_writer& sse, std::string& out) {
  opened_ = true;
  const json::object created = response_object(echo_, req, ids_, json::array(), nullptr);
  emit("response.created", json::object{{"response", created}}, sse, out);
  emit("response.in_progress", json::object{{"response", created}}, sse, out);
  emit("response.output_item.added",
       json::object{{"output_index", 0}, {"item", message_item(ids_, "", "in_progress", /*with_content=*/false)}}, sse,
       out);
  emit("response.content_part.added",
       json::object{
           {"item_id", ids_.message_id}, {"output_index", 0}, {"content_index", 0}, {"part", output_text_part("")}},
       sse, out);
}

void responses_stream::text(const generation_request& req, std::string_view delta, sse_writer& sse, std::string& out) {
  if (delta.empty()) return;  // no event without text (a token the detokenizer holds back)
  if (!opened_) open(req, sse, out);
  text_ += delta;
  emit("response.output_text.delta",
       json::object{{"item_id", ids_.message_id},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"delta", sanitize_utf8(std::string(delta))},
                    {"logprobs", json::array()}},
       sse, out);
}

void responses_stream::finish(const generation_request& req, const actors::stream_final& f, sse_writer& sse,
                              std::string& out) {
  if (!opened_) open(req, sse, out);  // a response with no text at all still has its message
  const std::string_view status = status_of(f);
  const std::string_view item_status = status == "completed" ? "completed" : "incomplete";
  emit("response.output_text.done",
       json::object{{"item_id", ids_.message_id},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"text", sanitize_utf8(text_)},
                    {"logprobs", json::array()}},
       sse, out);
  emit("response.content_part.done",
       json::object{
           {"item_id", ids_.message_id}, {"output_index", 0}, {"content_index", 0}, {"part", output_text_part(text_)}},
       sse, out);
  json::object item = message_item(ids_, text_, item_status);
  emit("response.output_item.done", json::object{{"output_index", 0}, {"item", item}}, sse, out);
  const json::object done = response_object(echo_, req, ids_, json::array{item}, &f);
  emit(status == "completed"    ? "response.completed"
       : status == "incomplete" ? "response.incomplete"
                                : "response.failed",
       json::object{{"response", done}}, sse, out);
  sse.close(out);
}

}  // namespace tessera::server
