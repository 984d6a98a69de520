// /v1/responses without a network: the body becomes the chat request it means (instructions first,
// input items as messages, max_output_tokens as max_tokens, truncation auto as -1), what the subset
// does not cover is a 400 naming the field, the chat parser's own errors name the Responses API's
// fields; and the stream's events come in OpenAI's order with sequence numbers counting from 0.
#include "server/responses_request.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "server/responses_format.hpp"
#include "server/sse_writer.hpp"

namespace tessera::server {
namespace {

constexpr int32_t vocab = 1000;

api_error parse_error(std::string_view body) {
  try {
    parse_responses_request(body, vocab);
  } catch (const api_error& e) { return e; }
  ADD_FAILURE() << "no error for " << body;
  return api_error(0, "");
}

TEST(responses_request, a_string_input_is_one_user_message_after_the_instructions) {
  const responses_request r = parse_responses_request(
      R"({"model":"m","input":"Hi there","instructions":"Be brief.","max_output_tokens":12,"temperature":0,
          "top_p":0.5,"stream":true,"store":true,"metadata":{"k":"v"},"user":"u","seed":3})",
      vocab);
  ASSERT_EQ(r.chat.kind, api_kind::chat);
  ASSERT_EQ(r.chat.prompt.type, actors::prompt_input::kind::chat);
  ASSERT_EQ(r.chat.prompt.messages.size(), 2u);
  EXPECT_EQ(r.chat.prompt.messages[0].role, "system");
  EXPECT_EQ(r.chat.prompt.messages[0].content, "Be brief.");
  EXPECT_EQ(r.chat.prompt.messages[1].role, "user");
  EXPECT_EQ(r.chat.prompt.messages[1].content, "Hi there");
  EXPECT_EQ(r.chat.model, "m");
  EXPECT_EQ(r.chat.params.max_tokens, 12);
  EXPECT_FALSE(r.chat.params.truncate_to_context);  // asked for: must fit, as chat's max_tokens
  EXPECT_EQ(r.chat.params.temperature, 0.0f);
  EXPECT_EQ(r.chat.params.top_p, 0.5f);
  EXPECT_EQ(r.chat.params.seed, 3u);
  EXPECT_TRUE(r.chat.stream);
  EXPECT_EQ(r.echo.instructions, "Be brief.");
  EXPECT_EQ(r.echo.max_output_tokens, 12);
  EXPECT_EQ(r.echo.metadata_json, R"({"k":"v"})");
  EXPECT_EQ(r.echo.user, "u");
}

TEST(responses_request, message_items_with_text_parts_become_the_conversation) {
  const responses_request r = parse_responses_request(
      R"({"input":[{"role":"developer","content":"Rules."},
                   {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},
                                                              {"type":"input_text","text":"b"}]},
                   {"type":"message","id":"msg_1","status":"completed","role":"assistant",
                    "content":[{"type":"output_text","text":"c","annotations":[]}]},
                   {"role":"user","content":"d"}],
          "truncation":"auto"})",
      vocab);
  const auto& m = r.chat.prompt.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].role, "developer");
  EXPECT_EQ(m[1].content, "ab");
  EXPECT_EQ(m[2].role, "assistant");
  EXPECT_EQ(m[2].content, "c");
  EXPECT_EQ(m[3].content, "d");
  EXPECT_EQ(r.chat.prompt.truncate_prompt_tokens, -1);
  EXPECT_EQ(r.echo.truncation, "auto");
  EXPECT_FALSE(r.echo.instructions.has_value());
  EXPECT_TRUE(r.chat.params.truncate_to_context);  // no max_output_tokens: the default ends at the context
  // Accepted and changing nothing: empty tools, tool_choice none/auto, text format text, store false.
  EXPECT_NO_THROW(parse_responses_request(
      R"({"input":"x","tools":[],"tool_choice":"auto","text":{"format":{"type":"text"}},"store":false,
          "include":[],"parallel_tool_calls":false,"previous_response_id":null,"background":false})",
      vocab));
}

TEST(responses_request, what_the_subset_does_not_cover_is_a_400_naming_the_field) {
  const struct {
    const char* body;
    const char* param;
    const char* says;
  } cases[] = {
      {R"({"model":"m"})", "input", "required"},
      {R"({"input":[]})", "input", "must not be empty"},
      {R"({"input":42})", "input", "string or an array"},
      {R"({"input":"x","previous_response_id":"resp_1"})", "previous_response_id", "stores no responses"},
      {R"({"input":"x","conversation":"c"})", "conversation", "stores no"},
      {R"({"input":"x","background":true})", "background", "response store"},
      {R"({"input":"x","tools":[{"type":"function","name":"f"}]})", "tools", "/v1/chat/completions"},
      {R"({"input":"x","tool_choice":"required"})", "tool_choice", "none"},
      {R"({"input":"x","text":{"format":{"type":"json_schema"}}})", "text.format", "response_format"},
      {R"({"input":"x","reasoning":{"effort":"low"}})", "reasoning", "not supported"},
      {R"({"input":"x","include":["message.output_text.logprobs"]})", "include", "not supported"},
      {R"({"input":[{"type":"function_call_output","call_id":"c","output":"o"}]})", "input[0].type",
       "function_call_output"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})", "input[0].content[0].type",
       "no images"},
      {R"({"input":[{"role":"tool","content":"x"}]})", "input[0].role", "must be user"},
      {R"({"input":[{"role":"user"}]})", "input[0].content", "required"},
      {R"({"input":"x","max_output_tokens":0})", "max_output_tokens", "between 1"},
      {R"({"input":"x","max_output_tokens":"5"})", "max_output_tokens", "integer"},
      {R"({"input":"x","metadata":{"k":1}})", "metadata", "strings"},
      {R"({"input":"x","store":"yes"})", "store", "boolean"},
      {R"({"input":"x","truncation":"middle"})", "truncation", "auto"},
      {R"({"input":"x","nonsense":1})", "nonsense", "not a recognized"},
      // The chat parser's checks, under the same names.
      {R"({"input":"x","temperature":3})", "temperature", "between"},
      {R"({"input":"x","top_p":0})", "top_p", "greater than 0"},
  };
  for (const auto& c : cases) {
    const api_error e = parse_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << " -> " << e.what();
  }
  const api_error e = parse_error("{not json");
  EXPECT_EQ(e.code, "invalid_json");
}

TEST(responses_request, the_chat_parsers_errors_name_the_responses_fields) {
  request_limits limits;
  limits.max_response_bytes = 1000;  // max_tokens x 32 bytes: 100 tokens are too many
  try {
    parse_responses_request(R"({"input":"x","max_output_tokens":100})", vocab, limits);
    FAIL() << "no error";
  } catch (const api_error& e) {
    EXPECT_EQ(e.param, "max_output_tokens") << e.what();
    EXPECT_NE(std::string(e.what()).find("max_output_tokens"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("max_tokens"), std::string::npos) << e.what();
  }
}

// The events of an unchunked stream: (type, data) in order.
std::vector<std::pair<std::string, boost::json::object>> events_of(const std::string& wire) {
  std::vector<std::pair<std::string, boost::json::object>> out;
  const size_t body = wire.find("\r\n\r\n");
  std::string rest = wire.substr(body == std::string::npos ? 0 : body + 4);
  for (size_t at = 0; (at = rest.find("event: ", at)) != std::string::npos;) {
    const size_t eol = rest.find('\n', at);
    const std::string type = rest.substr(at + 7, eol - at - 7);
    const size_t data = eol + 1 + 6;  // "data: "
    const size_t end = rest.find("\n\n", data);
    out.emplace_back(type, boost::json::parse(rest.substr(data, end - data)).as_object());
    at = end;
  }
  return out;
}

TEST(responses_stream, events_come_in_order_and_the_deltas_join_to_the_text) {
  const generation_request req = parse_responses_request(R"({"input":"x","max_output_tokens":3})", vocab).chat;
  responses_echo echo;
  echo.max_output_tokens = 3;
  const response_ids ids{"resp_1", "msg_1", 1700000000, "m"};
  responses_stream stream(echo, ids);
  sse_writer sse("resp_1", /*chunked=*/false, /*keep_alive=*/false);
  std::string wire;
  stream.text(req, "Hel", sse, wire);
  stream.text(req, "", sse, wire);  // held-back text: no event
  stream.text(req, "lo", sse, wire);
  actors::stream_final f;
  f.reason = finish_reason::length;
  f.num_prompt_tokens = 5;
  f.num_generated_tokens = 3;
  stream.finish(req, f, sse, wire);
  const auto events = events_of(wire);
  const std::vector<std::string> want = {"response.created",           "response.in_progress",
                                         "response.output_item.added", "response.content_part.added",
                                         "response.output_text.delta", "response.output_text.delta",
                                         "response.output_text.done",  "response.content_part.done",
                                         "response.output_item.done",  "response.incomplete"};
  ASSERT_EQ(events.size(), want.size()) << wire;
  std::string joined;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].first, want[i]);
    EXPECT_EQ(events[i].second.at("type").as_string(), want[i]);
    EXPECT_EQ(events[i].second.at("sequence_number").as_int64(), static_cast<int64_t>(i));
    if (want[i] == "response.output_text.delta") joined += events[i].second.at("delta").as_string();
  }
  EXPECT_EQ(joined, "Hello");
  EXPECT_EQ(events[6].second.at("text").as_string(), "Hello");
  EXPECT_EQ(events[0].second.at("response").at("status").as_string(), "in_progress");
  const auto& done = events.back().second.at("response").as_object();
  EXPECT_EQ(done.at("status").as_string(), "incomplete");
  EXPECT_EQ(done.at("incomplete_details").at("reason").as_string(), "max_output_tokens");
  EXPECT_EQ(done.at("usage").at("input_tokens").as_int64(), 5);
  EXPECT_EQ(done.at("usage").at("total_tokens").as_int64(), 8);
  EXPECT_EQ(done.at("output").at(0).at("content").at(0).at("text").as_string(), "Hello");
  EXPECT_EQ(done.at("max_output_tokens").as_int64(), 3);
  EXPECT_EQ(wire.find("[DONE]"), std::string::npos);  // the Responses stream has none
}

TEST(responses_format, a_whole_response_is_completed_with_its_message_and_usage) {
  const generation_request req = parse_responses_request(R"({"input":"x"})", vocab).chat;
  actors::stream_final f;
  f.reason = finish_reason::stop;
  f.num_prompt_tokens = 4;
  f.num_generated_tokens = 2;
  const auto body = boost::json::parse(responses_body({}, req, {"resp_2", "msg_2", 1, "m"}, "Hi", f)).as_object();
  EXPECT_EQ(body.at("object").as_string(), "response");
  EXPECT_EQ(body.at("status").as_string(), "completed");
  EXPECT_TRUE(body.at("incomplete_details").is_null());
  EXPECT_FALSE(body.at("store").as_bool());
  const auto& msg = body.at("output").at(0).as_object();
  EXPECT_EQ(msg.at("type").as_string(), "message");
  EXPECT_EQ(msg.at("id").as_string(), "msg_2");
  EXPECT_EQ(msg.at("status").as_string(), "completed");
  EXPECT_EQ(msg.at("role").as_string(), "assistant");
  EXPECT_EQ(msg.at("content").at(0).at("type").as_string(), "output_text");
  EXPECT_EQ(msg.at("content").at(0).at("text").as_string(), "Hi");
  EXPECT_TRUE(msg.at("content").at(0).at("annotations").as_array().empty());
  EXPECT_EQ(body.at("usage").at("output_tokens").as_int64(), 2);
}

}  // namespace
}  // namespace tessera::server
