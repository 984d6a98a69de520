// What a generation's stream items become, without a network: the /v1/ws messages of docs/websocket.md
// and the OpenAI stream chunks, field by field, and the bookkeeping both transports share.
#include "server/stream_format.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "tests/support/char_tokenizer.hpp"

namespace tessera::server {
namespace {

namespace json = boost::json;

json::object parse(const std::string& text) { return json::parse(text).as_object(); }

actors::stream_delta make_delta(int32_t index, std::vector<token_id> ids, std::string text, double t) {
  actors::stream_delta d;
  d.output.id = request_id{12};
  d.output.index = index;
  d.output.token_ids = std::move(ids);
  d.output.text = std::move(text);
  d.seconds_since_submit = t;
  return d;
}

generation_request chat_request(bool logprobs) {
  generation_request r;
  r.kind = api_kind::chat;
  r.want_logprobs = logprobs;
  r.params.n = 2;
  return r;
}

TEST(stream_format, websocket_delta_message) {
  const auto tok = test_support::char_tokenizer();
  actors::stream_delta d = make_delta(1, {1, 2}, "ab", 0.25);
  d.output.logprobs = {{1, -0.5f, {}}, {2, -1.5f, {}}};
  const json::object first = parse(ws_delta_message("my-id", d, true, true, tok.get()));
  EXPECT_EQ(first.at("type"), "delta");
  EXPECT_EQ(first.at("id"), "my-id");
  EXPECT_EQ(first.at("index"), 1);
  EXPECT_EQ(first.at("token_ids"), (json::array{1, 2}));
  EXPECT_EQ(first.at("text"), "ab");
  EXPECT_EQ(first.at("t").as_double(), 0.25);
  EXPECT_EQ(first.at("engine_request_id"), 12);
  // The chat shape of logprobs, whatever the endpoint.
  const json::array& content = first.at("logprobs").at("content").as_array();
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0].at("token"), "a");
  EXPECT_EQ(content[1].at("logprob").as_double(), -1.5);
  EXPECT_EQ(first.size(), 8u);
  const json::object later = parse(ws_delta_message("my-id", d, false, false, tok.get()));
  EXPECT_FALSE(later.contains("engine_request_id"));
  EXPECT_FALSE(later.contains("logprobs"));
  EXPECT_EQ(later.size(), 6u);
}

TEST(stream_format, websocket_final_message) {
  actors::stream_final f;
  f.request = request_id{12};
  f.reason = finish_reason::error;
  f.error = "boom";
  f.num_prompt_tokens = 3;
  f.num_generated_tokens = 7;
  f.seconds_total = 0.5;
  f.choices.push_back({0, finish_reason::length, "", 4, {}});
  f.choices.push_back({1, finish_reason::error, "boom", 3, {}});
  const json::object m = parse(ws_final_message("g", f));
  EXPECT_EQ(m.at("type"), "final");
  EXPECT_EQ(m.at("id"), "g");
  EXPECT_EQ(m.at("finish_reason"), "error");
  EXPECT_EQ(m.at("engine_request_id"), 12);
  EXPECT_EQ(m.at("error"), "boom");
  EXPECT_EQ(m.at("choices"),
            (json::array{json::object{{"index", 0}, {"finish_reason", "length"}, {"num_generated_tokens", 4}},
                         json::object{{"index", 1}, {"finish_reason", "error"}, {"num_generated_tokens", 3}}}));
  EXPECT_EQ(m.at("usage"), usage_json(f));
  EXPECT_EQ(m.at("usage").at("total_tokens"), 10);
  EXPECT_EQ(m.at("timings"), timings_json(f));
  f.request = request_id{};  // never reached the engine
  f.reason = finish_reason::stop;
  const json::object plain = parse(ws_final_message("g", f));
  EXPECT_FALSE(plain.contains("engine_request_id"));
  EXPECT_FALSE(plain.contains("error"));
}

TEST(stream_format, websocket_started_and_error_messages) {
  EXPECT_EQ(parse(ws_started_message("a", "ws-1")),
            (json::object{{"type", "started"}, {"id", "a"}, {"request_id", "ws-1"}}));
  const json::object e = parse(ws_error_message(api_error(404, "no running generation", "id", "not_found"), "a"));
  EXPECT_EQ(e.at("type"), "error");
  EXPECT_EQ(e.at("status"), 404);
  EXPECT_EQ(e.at("id"), "a");
  EXPECT_EQ(e.at("error"), parse(error_body(api_error(404, "no running generation", "id", "not_found"))).at("error"));
  EXPECT_FALSE(parse(ws_error_message(api_error(400, "bad"), "")).contains("id"));
}

// The SSE chunk and the WebSocket message of one delta carry the same text and the same logprobs.
TEST(stream_format, sse_and_websocket_deltas_carry_the_same_content) {
  const auto tok = test_support::char_tokenizer();
  actors::stream_delta d = make_delta(0, {3}, std::string("c\xff", 2), 0.1);  // broken UTF-8 is repaired
  d.output.logprobs = {{3, -0.25f, {{3, -0.25f}, {4, -2.0f}}}};
  const generation_request req = chat_request(true);
  const response_meta meta{"chatcmpl-1", 1700000000, "m"};
  const json::object chunk = parse(delta_chunk(req, meta, d.output, true, tok.get()));
  const json::object ws = parse(ws_delta_message("x", d, true, false, tok.get()));
  const json::object& choice = chunk.at("choices").as_array().at(0).as_object();
  EXPECT_EQ(chunk.at("object"), "chat.completion.chunk");
  EXPECT_EQ(choice.at("delta").at("role"), "assistant");
  EXPECT_EQ(choice.at("delta").at("content"), ws.at("text"));
  EXPECT_EQ(ws.at("text"), json::string(sanitize_utf8(d.output.text)));
  EXPECT_EQ(choice.at("logprobs"), ws.at("logprobs"));
  EXPECT_TRUE(choice.at("finish_reason").is_null());
  const json::object later = parse(delta_chunk(req, meta, d.output, false, tok.get()));
  EXPECT_FALSE(later.at("choices").at(0).at("delta").as_object().contains("role"));
}

// A completions stream with echo and logprobs: the choice's first chunk lists the prompt's tokens first
// (the first one null), and text_offset runs on across the chunks of the choice.
TEST(stream_format, echoed_prompt_logprobs_lead_the_first_completion_chunk) {
  const auto tok = test_support::char_tokenizer();
  generation_request req;
  req.kind = api_kind::completion;
  req.want_logprobs = true;
  req.top_logprobs = 0;
  req.echo = req.echo_logprobs = true;
  const response_meta meta{"cmpl-1", 1700000000, "m"};
  actors::stream_delta d = make_delta(0, {3}, "abc", 0.1);  // the prompt "ab" prepended by the session
  d.output.prompt_logprobs = {{1, 0.0f, 0, {}}, {2, -1.5f, 3, {{5, -0.1f}}}};
  d.output.logprobs = {{3, -0.25f, {}}};
  size_t offset = 0;
  json::object chunk = parse(delta_chunk(req, meta, d.output, true, tok.get(), &offset));
  const json::object& lp = chunk.at("choices").at(0).at("logprobs").as_object();
  EXPECT_EQ(chunk.at("choices").at(0).at("text"), "abc");
  EXPECT_EQ(lp.at("tokens"), (json::array{"a", "b", "c"}));
  EXPECT_TRUE(lp.at("token_logprobs").at(0).is_null());
  EXPECT_EQ(lp.at("top_logprobs").at(1).as_object().size(), 1u) << "top 0: the prompt token alone";
  EXPECT_EQ(lp.at("text_offset"), (json::array{0, 1, 2}));
  EXPECT_EQ(offset, 3u);
  actors::stream_delta next = make_delta(0, {4}, "d", 0.2);
  next.output.logprobs = {{4, -0.5f, {}}};
  chunk = parse(delta_chunk(req, meta, next.output, false, tok.get(), &offset));
  EXPECT_EQ(chunk.at("choices").at(0).at("logprobs").at("text_offset"), (json::array{3}));
  EXPECT_EQ(chunk.at("choices").at(0).at("logprobs").at("tokens"), (json::array{"d"}));
}

TEST(stream_format, progress_counts_tokens_and_first_messages) {
  stream_progress p(2);
  server_metrics metrics;
  EXPECT_TRUE(p.take_delta(make_delta(0, {}, "", 0.05), metrics));
  EXPECT_EQ(metrics.num_ttft_observed(), 0u) << "no token yet";
  EXPECT_TRUE(p.take_delta(make_delta(0, {1}, "a", 0.1), metrics));
  EXPECT_EQ(metrics.num_ttft_observed(), 1u) << "observed at the first token, not at the final";
  EXPECT_TRUE(p.take_delta(make_delta(1, {2, 3}, "bc", 0.2), metrics));
  EXPECT_EQ(metrics.num_ttft_observed(), 1u) << "once per request, not per choice";
  EXPECT_TRUE(p.take_delta(make_delta(0, {}, "", 0.3), metrics)) << "an empty delta of a real choice";
  EXPECT_FALSE(has_output(make_delta(0, {}, "", 0.3).output));
  EXPECT_FALSE(p.take_delta(make_delta(2, {9}, "z", 0.4), metrics)) << "no choice 2 in this request";
  EXPECT_FALSE(p.take_delta(make_delta(-1, {9}, "z", 0.4), metrics));
  EXPECT_EQ(p.num_tokens(), 3);
  EXPECT_TRUE(p.first_of_choice(1));
  EXPECT_FALSE(p.first_of_choice(1));
  EXPECT_TRUE(p.first_of_choice(0));
  EXPECT_TRUE(p.first_of_stream());
  EXPECT_FALSE(p.first_of_stream());
}

}  // namespace
}  // namespace tessera::server
