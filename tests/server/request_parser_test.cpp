// The server's request parser, error envelope and small security helpers, without a network.
//
// The parser's header comes first: it must compile on its own, and without the actor framework (its
// request types are plain structs).
#include "server/request_parser.hpp"
#ifdef CAF_VERSION
#error "server/request_parser.hpp includes CAF headers"
#endif

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "engine/base/error.hpp"
#include "server/http_server.hpp"
#include "server/openai_format.hpp"
#include "tests/support/char_tokenizer.hpp"

namespace tessera::server {
namespace {

constexpr int32_t vocab = 1000;

api_error parse_error(std::string_view body, api_kind kind = api_kind::completion) {
  try {
    parse_generation_request(body, kind, vocab);
  } catch (const api_error& e) { return e; }
  ADD_FAILURE() << "no error for " << body;
  return api_error(0, "");
}

TEST(request_parser, completion_fields) {
  const generation_request r = parse_generation_request(
      R"({"model":"m","prompt":"Hello","max_tokens":7,"temperature":0.5,"top_p":0.9,"n":3,"stop":["a","bc"],
          "seed":42,"presence_penalty":0.5,"frequency_penalty":-0.5,"logit_bias":{"5":2.5},"logprobs":2,
          "stream":true,"stream_options":{"include_usage":true},"user":"u","top_k":40,"min_p":0.1,
          "repetition_penalty":1.1,"ignore_eos":true,"priority":-3,"min_tokens":2,"speculative":false})",
      api_kind::completion, vocab);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt.type, actors::prompt_input::kind::text);
  EXPECT_EQ(r.prompt.text, "Hello");
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.n, 3);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "bc"}));
  ASSERT_TRUE(r.params.seed.has_value());
  EXPECT_EQ(*r.params.seed, 42u);
  ASSERT_EQ(r.params.logit_bias.size(), 1u);
  EXPECT_EQ(r.params.logit_bias[0].first, 5);
  EXPECT_FLOAT_EQ(r.params.logit_bias[0].second, 2.5f);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.params.top_k, 40);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.priority, -3);
  EXPECT_EQ(r.params.min_tokens, 2);
  EXPECT_FALSE(r.params.speculative);
}

TEST(request_parser, defaults_and_prompt_forms) {
  generation_request r = parse_generation_request(R"({"prompt":["one"]})", api_kind::completion, vocab);
  EXPECT_EQ(r.prompt.text, "one");
  EXPECT_EQ(r.params.max_tokens, request_limits{}.default_completion_max_tokens);
  EXPECT_EQ(r.params.logprobs, -1);
  EXPECT_TRUE(r.params.speculative);  // allowed unless the request says false (the server decides)
  r = parse_generation_request(R"({"prompt":[1,2,3]})", api_kind::completion, vocab);
  EXPECT_EQ(r.prompt.type, actors::prompt_input::kind::token_ids);
  EXPECT_EQ(r.prompt.ids, (std::vector<token_id>{1, 2, 3}));
  r = parse_generation_request(R"({"prompt":[[4,5]], "stop": null})", api_kind::completion, vocab);
  EXPECT_EQ(r.prompt.ids, (std::vector<token_id>{4, 5}));
}

// OpenAI's four prompt shapes; a batch is the first prompt plus more_prompts, all of one kind.
TEST(request_parser, prompt_batches) {
  generation_request r = parse_generation_request(R"({"prompt":["one","two","three"]})", api_kind::completion, vocab);
  EXPECT_EQ(r.prompt.text, "one");
  ASSERT_EQ(r.more_prompts.size(), 2u);
  EXPECT_EQ(r.more_prompts[1].text, "three");
  EXPECT_EQ(num_prompts(r), 3);
  r = parse_generation_request(R"({"prompt":[[4,5],[6]], "parse_special": false})", api_kind::completion, vocab);
  EXPECT_EQ(r.prompt.ids, (std::vector<token_id>{4, 5}));
  ASSERT_EQ(r.more_prompts.size(), 1u);
  EXPECT_EQ(r.more_prompts[0].ids, (std::vector<token_id>{6}));
  EXPECT_FALSE(r.more_prompts[0].parse_special);
  EXPECT_TRUE(parse_generation_request(R"({"prompt":[1,2]})", api_kind::completion, vocab).more_prompts.empty());

  for (const auto& [body, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":["a",[1]]})", "'prompt[1]' must be a string"},
           {R"({"prompt":[[1],"a"]})", "'prompt[1]' must be an array of token ids"},
           {R"({"prompt":["a",""]})", "'prompt[1]' must not be empty"},
           {R"({"prompt":[[1],[]]})", "'prompt[1]' must not be empty"},
           {R"({"prompt":[[1],[1000]]})", "outside the vocabulary"},
           {R"({"prompt":[true]})", "must be an integer"},
           {R"({"prompt":{}})", "must be a string, an array of strings"}}) {
    const api_error e = parse_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << body << ": " << e.what();
    EXPECT_TRUE(e.param.starts_with("prompt")) << body << ": " << e.param;
  }
  std::string many = R"({"prompt":[)";
  for (int i = 0; i < request_limits{}.max_prompts + 1; ++i) many += i ? ",\"x\"" : "\"x\"";
  EXPECT_NE(std::string(parse_error(many + "]}").what()).find("more than this server's limit"), std::string::npos);
  // The response-size bound counts every prompt's choices.
  request_limits limits;
  limits.max_response_bytes = 3 * 100 * k_response_bytes_per_token;
  EXPECT_NO_THROW(
      parse_generation_request(R"({"prompt":["a","b","c"],"max_tokens":100})", api_kind::completion, vocab, limits));
  EXPECT_THROW(
      parse_generation_request(R"({"prompt":["a","b","c","d"],"max_tokens":100})", api_kind::completion, vocab, limits),
      api_error);
}

TEST(request_parser, embedding_requests) {
  const int32_t hidden = 576;
  auto parse = [&](std::string_view body) { return parse_embedding_request(body, vocab, hidden); };
  generation_request r = parse(R"({"model":"m","input":"Hello","user":"u"})");
  EXPECT_EQ(r.kind, api_kind::embedding);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt.text, "Hello");
  EXPECT_TRUE(r.prompt.add_special);
  EXPECT_TRUE(r.more_prompts.empty());
  EXPECT_FALSE(r.embedding_base64);
  EXPECT_FALSE(r.stream);
  r = parse(R"({"add_special_tokens":false,"input":["a","b","c"],"encoding_format":"base64","dimensions":576})");
  EXPECT_TRUE(r.embedding_base64);
  ASSERT_EQ(r.more_prompts.size(), 2u);
  EXPECT_EQ(r.more_prompts[1].text, "c");
  EXPECT_FALSE(r.prompt.add_special);
  EXPECT_FALSE(r.more_prompts[1].add_special);
  r = parse(R"({"input":[1,2,3],"encoding_format":"float"})");
  EXPECT_EQ(r.prompt.ids, (std::vector<token_id>{1, 2, 3}));
  r = parse(R"({"input":[[1],[2,3]]})");
  ASSERT_EQ(r.more_prompts.size(), 1u);
  EXPECT_EQ(r.more_prompts[0].ids, (std::vector<token_id>{2, 3}));
  auto error = [&](std::string_view body) {
    try {
      parse(body);
    } catch (const api_error& e) { return e; }
    ADD_FAILURE() << "no error for " << body;
    return api_error(0, "");
  };
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "input"},
           {R"({"input":""})", "input"},
           {R"({"input":[]})", "input"},
           {R"({"input":[[1],[]]})", "input"},
           {R"({"input":{"a":1}})", "input"},
           {R"({"input":[5000]})", "input"},
           {R"({"input":"x","encoding_format":"hex"})", "encoding_format"},
           {R"({"input":"x","encoding_format":1})", "encoding_format"},
           {R"({"input":"x","dimensions":64})", "dimensions"},
           {R"({"input":"x","dimensions":"576"})", "dimensions"},
           {R"({"input":"x","stream":true})", "stream"},
           {R"({"input":"x","max_tokens":3})", "max_tokens"},
       }) {
    const api_error e = error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param.substr(0, param.size()), param) << body << ": " << e.what();
  }
  EXPECT_NE(std::string(error(R"({"input":"x","dimensions":64})").what()).find("576"), std::string::npos);
}

TEST(openai_format, embeddings_response_float_and_base64) {
  generation_request req;
  req.kind = api_kind::embedding;
  actors::stream_final f;
  f.num_prompt_tokens = 7;
  for (int i : {1, 0}) {  // out of order: the response sorts by index
    actors::choice_result c;
    c.index = i;
    c.embedding = i == 0 ? std::vector<float>{1.0f, -2.5f} : std::vector<float>{0.5f};
    f.choices.push_back(c);
  }
  const response_meta meta{"embd-1", 123, "m"};
  boost::json::value v = boost::json::parse(embeddings_response(req, meta, f));
  EXPECT_EQ(v.at("object"), "list");
  EXPECT_EQ(v.at("model"), "m");
  EXPECT_EQ(v.at("usage").at("prompt_tokens"), 7);
  EXPECT_EQ(v.at("usage").at("total_tokens"), 7);
  const auto& data = v.at("data").as_array();
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0].at("index"), 0);
  EXPECT_EQ(data[0].at("object"), "embedding");
  EXPECT_EQ(data[0].at("embedding").as_array().size(), 2u);
  EXPECT_DOUBLE_EQ(data[0].at("embedding").as_array()[1].as_double(), -2.5);
  req.embedding_base64 = true;
  v = boost::json::parse(embeddings_response(req, meta, f));
  // float32 LE: 1.0 = 00 00 80 3f, -2.5 = 00 00 20 c0 -> base64 of those 8 bytes; 0.5 = 00 00 00 3f.
  EXPECT_EQ(v.at("data").as_array()[0].at("embedding"), "AACAPwAAIMA=");
  EXPECT_EQ(v.at("data").as_array()[1].at("embedding"), "AAAAPw==");
}

TEST(request_parser, echo) {
  EXPECT_TRUE(parse_generation_request(R"({"prompt":"x","echo":true})", api_kind::completion, vocab).echo);
  EXPECT_FALSE(parse_generation_request(R"({"prompt":"x","echo":false})", api_kind::completion, vocab).echo);
  EXPECT_EQ(parse_error(R"({"prompt":"x","echo":1})").param, "echo");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"echo":true})", api_kind::chat).param, "echo");
}

// Echo with logprobs covers the prompt: the engine is asked for prompt logprobs with the same top-k
// (vLLM's rule), and vLLM's prompt_logprobs field asks for them on its own (the larger ask wins).
TEST(request_parser, echo_with_logprobs_and_prompt_logprobs) {
  generation_request r =
      parse_generation_request(R"({"prompt":"x","echo":true,"logprobs":2})", api_kind::completion, vocab);
  EXPECT_TRUE(r.echo_logprobs);
  EXPECT_EQ(r.params.prompt_logprobs, 2);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_EQ(r.prompt_logprobs, -1) << "no prompt_logprobs field in the answer unless asked";
  r = parse_generation_request(R"({"prompt":"x","echo":true})", api_kind::completion, vocab);
  EXPECT_FALSE(r.echo_logprobs);
  EXPECT_EQ(r.params.prompt_logprobs, -1) << "echo alone computes nothing more";
  r = parse_generation_request(R"({"prompt":"x","logprobs":1})", api_kind::completion, vocab);
  EXPECT_EQ(r.params.prompt_logprobs, -1) << "logprobs without echo: generated tokens only";
  r = parse_generation_request(R"({"prompt":"x","prompt_logprobs":3})", api_kind::completion, vocab);
  EXPECT_FALSE(r.echo_logprobs);
  EXPECT_EQ(r.prompt_logprobs, 3);
  EXPECT_EQ(r.params.prompt_logprobs, 3);
  r = parse_generation_request(R"({"prompt":"x","echo":true,"logprobs":1,"prompt_logprobs":4})", api_kind::completion,
                               vocab);
  EXPECT_EQ(r.params.prompt_logprobs, 4);
  r = parse_generation_request(R"({"prompt":"x","echo":true,"logprobs":5,"prompt_logprobs":0})", api_kind::completion,
                               vocab);
  EXPECT_EQ(r.params.prompt_logprobs, 5);
  r = parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],"prompt_logprobs":0})", api_kind::chat,
                               vocab);
  EXPECT_EQ(r.prompt_logprobs, 0);
  EXPECT_EQ(r.params.prompt_logprobs, 0);
  EXPECT_EQ(parse_error(R"({"prompt":"x","prompt_logprobs":21})").param, "prompt_logprobs");
  EXPECT_EQ(parse_error(R"({"prompt":"x","prompt_logprobs":-1})").param, "prompt_logprobs");
  EXPECT_EQ(parse_error(R"({"prompt":"x","prompt_logprobs":true})").param, "prompt_logprobs");
  EXPECT_EQ(parse_error(R"({"prompt":"x","prompt_logprobs":"2"})").param, "prompt_logprobs");
}

// max_tokens 0 is the prompt alone (OpenAI's and vLLM's echo answer), so only with echo.
TEST(request_parser, max_tokens_zero_only_with_echo) {
  const generation_request r = parse_generation_request(R"({"prompt":"x","echo":true,"logprobs":0,"max_tokens":0})",
                                                        api_kind::completion, vocab);
  EXPECT_EQ(r.params.max_tokens, 0);
  EXPECT_EQ(r.params.prompt_logprobs, 0);
  EXPECT_EQ(parse_generation_request(R"({"prompt":"x","echo":true,"max_tokens":0})", api_kind::completion, vocab)
                .params.max_tokens,
            0);
  EXPECT_EQ(parse_error(R"({"prompt":"x","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":"x","max_tokens":0,"prompt_logprobs":1})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", api_kind::chat).param,
            "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":"x","echo":true,"max_tokens":-1})").param, "max_tokens");
}

// vLLM's truncate_prompt_tokens, and --allow-truncation's default of -1 (a request's value wins).
TEST(request_parser, truncate_prompt_tokens) {
  generation_request r =
      parse_generation_request(R"({"prompt":["a","b"],"truncate_prompt_tokens":7})", api_kind::completion, vocab);
  EXPECT_EQ(r.prompt.truncate_prompt_tokens, 7);
  EXPECT_EQ(r.more_prompts.at(0).truncate_prompt_tokens, 7);
  EXPECT_EQ(parse_generation_request(R"({"prompt":"a"})", api_kind::completion, vocab).prompt.truncate_prompt_tokens,
            0);
  request_limits limits;
  limits.allow_truncation = true;
  EXPECT_EQ(
      parse_generation_request(R"({"prompt":"a"})", api_kind::completion, vocab, limits).prompt.truncate_prompt_tokens,
      -1);
  EXPECT_EQ(
      parse_generation_request(R"({"prompt":"a","truncate_prompt_tokens":3})", api_kind::completion, vocab, limits)
          .prompt.truncate_prompt_tokens,
      3);
  for (std::string_view bad :
       {R"({"prompt":"a","truncate_prompt_tokens":0})", R"({"prompt":"a","truncate_prompt_tokens":-2})",
        R"({"prompt":"a","truncate_prompt_tokens":"3"})"}) {
    EXPECT_EQ(parse_error(bad).param, "truncate_prompt_tokens") << bad;
  }
}

// chat_template_kwargs: an object whose keys become template variables, over the server's default.
TEST(request_parser, chat_template_kwargs) {
  constexpr std::string_view msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto chat = [&](std::string_view extra, const request_limits& limits = {}) {
    return parse_generation_request("{" + std::string(msgs) + std::string(extra) + "}", api_kind::chat, vocab, limits);
  };
  EXPECT_EQ(chat("").prompt.template_kwargs_json, "");
  EXPECT_EQ(
      boost::json::parse(chat(R"(,"chat_template_kwargs":{"enable_thinking":false})").prompt.template_kwargs_json),
      boost::json::parse(R"({"enable_thinking":false})"));
  request_limits limits;
  limits.default_chat_template_kwargs = R"({"enable_thinking":true,"lang":"fr"})";
  EXPECT_EQ(boost::json::parse(chat("", limits).prompt.template_kwargs_json),
            boost::json::parse(limits.default_chat_template_kwargs));
  EXPECT_EQ(boost::json::parse(
                chat(R"(,"chat_template_kwargs":{"enable_thinking":false})", limits).prompt.template_kwargs_json),
            boost::json::parse(R"({"enable_thinking":false,"lang":"fr"})"));
  for (std::string_view bad :
       {R"(,"chat_template_kwargs":[1])", R"(,"chat_template_kwargs":"x")",
        R"(,"chat_template_kwargs":{"messages":[]})", R"(,"chat_template_kwargs":{"tools":1})"}) {
    try {
      chat(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const api_error& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "chat_template_kwargs") << e.what();
    }
  }
  EXPECT_EQ(parse_error(R"({"prompt":"x","chat_template_kwargs":{}})").param, "chat_template_kwargs");
  EXPECT_NO_THROW(check_chat_template_kwargs(R"({"enable_thinking":false})"));
  EXPECT_THROW(check_chat_template_kwargs("[1]"), invalid_request);
  EXPECT_THROW(check_chat_template_kwargs("{"), invalid_request);
  EXPECT_THROW(check_chat_template_kwargs(R"({"add_generation_prompt":false})"), invalid_request);
}

// vLLM: a max_tokens the client gave must fit the context (the engine checks, once the prompt is
// tokenized); the default one ends where the context does.
TEST(request_parser, a_requested_max_tokens_must_fit_the_context) {
  EXPECT_TRUE(parse_generation_request(R"({"prompt":"x"})", api_kind::completion, vocab).params.truncate_to_context);
  EXPECT_TRUE(parse_generation_request(R"({"prompt":"x","max_tokens":null})", api_kind::completion, vocab)
                  .params.truncate_to_context);
  EXPECT_FALSE(parse_generation_request(R"({"prompt":"x","max_tokens":5})", api_kind::completion, vocab)
                   .params.truncate_to_context);
  EXPECT_FALSE(parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":5})",
                                        api_kind::chat, vocab)
                   .params.truncate_to_context);
}

TEST(request_parser, chat_fields) {
  const generation_request r = parse_generation_request(
      R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
          "max_completion_tokens":5,"logprobs":true,"top_logprobs":3})",
      api_kind::chat, vocab);
  ASSERT_EQ(r.prompt.type, actors::prompt_input::kind::chat);
  ASSERT_EQ(r.prompt.messages.size(), 2u);
  EXPECT_EQ(r.prompt.messages[1].role, "user");
  EXPECT_EQ(r.prompt.messages[1].content, "hi");
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_EQ(r.params.logprobs, 3);
}

struct bad_case {
  const char* body;
  api_kind kind;
  int status;
  const char* message_part;
};

TEST(request_parser, bad_inputs_are_400_naming_the_field) {
  const bad_case cases[] = {
      {"{", api_kind::completion, 400, "malformed JSON"},
      {"[1]", api_kind::completion, 400, "JSON object"},
      {R"({"max_tokens":5})", api_kind::completion, 400, "'prompt' is required"},
      {R"({"prompt":"x","max_tokens":0})", api_kind::completion, 400, "max_tokens"},
      {R"({"prompt":"x","max_tokens":"5"})", api_kind::completion, 400, "must be an integer"},
      {R"({"prompt":"x","max_tokens":1.5})", api_kind::completion, 400, "must be an integer"},
      {R"({"prompt":"x","temperature":-1})", api_kind::completion, 400, "temperature"},
      {R"({"prompt":"x","temperature":"hot"})", api_kind::completion, 400, "must be a number"},
      {R"({"prompt":"x","top_p":0})", api_kind::completion, 400, "top_p"},
      {R"({"prompt":"x","n":0})", api_kind::completion, 400, "'n'"},
      {R"({"prompt":"x","n":17})", api_kind::completion, 400, "'n'"},
      {R"({"prompt":"x","logprobs":6})", api_kind::completion, 400, "logprobs"},
      {R"({"prompt":"x","logit_bias":{"1000":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1":101}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":[1,2,1000]})", api_kind::completion, 400, "outside the vocabulary"},
      {R"({"prompt":[-1]})", api_kind::completion, 400, "outside the vocabulary"},
      {R"({"prompt":["a",["b"]]})", api_kind::completion, 400, "'prompt[1]' must be a string"},
      {R"({"prompt":""})", api_kind::completion, 400, "must not be empty"},
      {R"({"prompt":"x","stop":[1]})", api_kind::completion, 400, "stop"},
      {R"({"prompt":"x","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       api_kind::completion, 400, "stop"},
      {R"({"prompt":"x","frobnicate":1})", api_kind::completion, 400, "frobnicate"},
      {R"({"prompt":"x","chat_template":"{{x}}"})", api_kind::completion, 400, "chat templates are refused"},
      {R"({"prompt":"x","stream":"yes"})", api_kind::completion, 400, "must be a boolean"},
      {R"({"prompt":"x","speculative":"yes"})", api_kind::completion, 400, "'speculative' must be a boolean"},
      {R"({"prompt":"x","speculative":1})", api_kind::completion, 400, "'speculative' must be a boolean"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", api_kind::completion, 400, "stream_options"},
      {R"({"prompt":"x","min_tokens":9,"max_tokens":3})", api_kind::completion, 400, "min_tokens"},
      {R"({"prompt":"x","stop_token_ids":[5000]})", api_kind::completion, 400, "stop_token_ids"},
      {R"({"messages":[]})", api_kind::chat, 400, "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", api_kind::chat, 400, "messages.role"},
      {R"({"messages":[{"role":"user"}]})", api_kind::chat, 400, "messages.content"},
      {R"({"messages":"hi"})", api_kind::chat, 400, "messages"},
      {R"({"prompt":"x"})", api_kind::chat, 400, "prompt"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", api_kind::chat, 400, "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", api_kind::chat, 400,
       "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", api_kind::chat, 400, "'tools' must be an array"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", api_kind::chat, 400,
       "'tools[0].function' is required"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       api_kind::chat, 400, "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":3}}]})",
       api_kind::chat, 400, "tools[0].function.parameters"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})",
       api_kind::chat, 400, "repeats the function name 'f'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       api_kind::chat, 400, "names the function 'g', which is not in 'tools'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       api_kind::chat, 400, "has no 'tools'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", api_kind::chat, 400,
       "has no 'tools'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", api_kind::chat, 400,
       "'tool_choice' must be"},
      {R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"yes"})", api_kind::chat, 400,
       "must be a boolean"},
      {R"({"messages":[{"role":"user","content":"x"}],"functions":[]})", api_kind::chat, 400, "use 'tools'"},
      {R"({"prompt":"x","tools":[]})", api_kind::completion, 400, "chat completions field"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{bad"}}]}]})",
       api_kind::chat, 400, "messages[0].tool_calls[0].function.arguments' is not valid JSON"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", api_kind::chat, 400,
       "only allowed on assistant"},
      {R"({"messages":[{"role":"tool","content":"x"}]})", api_kind::chat, 400, "tool_call_id"},
      // logit_bias keys are canonical integers (issue #14): no sign, space, leading zero or fraction.
      {R"({"prompt":"x","logit_bias":{"01":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"+1":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{" 1":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1 ":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1.0":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1e2":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"":1}})", api_kind::completion, 400, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"99999999999999999999":1}})", api_kind::completion, 400, "logit_bias"},
      // A tool call without its function, and the deprecated function_call turn.
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function"}]}]})",
       api_kind::chat, 400, "messages[0].tool_calls"},
      {R"({"messages":[{"role":"assistant","content":"x","function_call":{"name":"f"}}]})", api_kind::chat, 400,
       "messages.function_call"},
  };
  for (const auto& c : cases) {
    const api_error e = parse_error(c.body, c.kind);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << c.body << " -> " << e.what();
  }
}

TEST(request_parser, tools_and_tool_messages) {
  const auto req = parse_generation_request(
      R"({"messages":[{"role":"user","content":"Weather?"},
                      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
                        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
                      {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
          "tools":[{"type":"function","function":{"name":"get_weather","description":"d",
                    "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
          "tool_choice":"auto","parallel_tool_calls":false})",
      api_kind::chat, vocab);
  ASSERT_EQ(req.prompt.messages.size(), 3u);
  EXPECT_TRUE(req.prompt.messages[1].content_is_null);
  ASSERT_EQ(req.prompt.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(req.prompt.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(req.prompt.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");  // as sent
  EXPECT_EQ(req.prompt.messages[2].tool_call_id, "call_1");
  ASSERT_EQ(req.tools.functions.size(), 1u);
  EXPECT_EQ(req.tools.functions[0].parameters, R"({"type":"object","properties":{"city":{"type":"string"}}})");
  EXPECT_FALSE(req.tools.parallel_tool_calls);
  EXPECT_TRUE(req.tools.calls_possible());
  EXPECT_FALSE(req.params.structured.has_value());  // auto: free text, parsed for calls
  EXPECT_EQ(req.prompt.tools_json.rfind("[{\"type\":\"function\"", 0), 0u);

  // tool_choice none: the template does not see the tools, and nothing is parsed.
  const auto none = parse_generation_request(
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"})",
      api_kind::chat, vocab);
  EXPECT_TRUE(none.prompt.tools_json.empty());
  EXPECT_FALSE(none.tools.calls_possible());
  // tools: [] is the no-op it is for OpenAI.
  EXPECT_FALSE(
      parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],"tools":[]})", api_kind::chat, vocab)
          .tools.calls_possible());
}

TEST(request_parser, forced_tool_choice_becomes_a_json_schema_constraint) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}},
                                        {"type":"function","function":{"name":"g"}}])";
  const auto named = parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                                  R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})",
                                              api_kind::chat, vocab);
  ASSERT_TRUE(named.params.structured.has_value());
  EXPECT_EQ(named.params.structured->type, structured_output_spec::kind::json_schema);
  EXPECT_EQ(named.params.structured->field, "tool_choice");
  EXPECT_EQ(named.params.structured->source,
            R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");

  const auto required = parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                                     R"(,"tool_choice":"required","parallel_tool_calls":false})",
                                                 api_kind::chat, vocab);
  ASSERT_TRUE(required.params.structured.has_value());
  const boost::json::value schema = boost::json::parse(required.params.structured->source);
  EXPECT_EQ(schema.at("type").as_string(), "array");
  EXPECT_EQ(schema.at("minItems").as_int64(), 1);
  EXPECT_EQ(schema.at("maxItems").as_int64(), 1);
  const auto& any_of = schema.at("items").at("anyOf").as_array();
  ASSERT_EQ(any_of.size(), 2u);
  EXPECT_EQ(any_of[1].at("properties").at("name").at("enum").as_array()[0].as_string(), "g");
  EXPECT_EQ(any_of[1].at("properties").at("parameters").at("type").as_string(), "object");
}

TEST(request_parser, logit_bias_keys_in_canonical_form_are_accepted) {
  const generation_request r =
      parse_generation_request(R"({"prompt":"x","logit_bias":{"0":1,"7":-2,"999":3}})", api_kind::completion, vocab);
  ASSERT_EQ(r.params.logit_bias.size(), 3u);
  EXPECT_EQ(r.params.logit_bias[0].first, 0);
  EXPECT_EQ(r.params.logit_bias[1].first, 7);
  EXPECT_EQ(r.params.logit_bias[2].first, 999);
}

// n x max_tokens x logprobs bounds one response's size (issue #14).
TEST(request_parser, response_size_is_bounded) {
  request_limits limits;
  limits.max_response_bytes = 1 << 20;
  // 16 x 2048 x 32 = 1 MiB: at the limit.
  EXPECT_NO_THROW(
      parse_generation_request(R"({"prompt":"x","n":16,"max_tokens":2048})", api_kind::completion, vocab, limits));
  try {
    parse_generation_request(R"({"prompt":"x","n":16,"max_tokens":2049})", api_kind::completion, vocab, limits);
    ADD_FAILURE() << "a response over the bound was accepted";
  } catch (const api_error& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "response_too_large");
    EXPECT_NE(std::string(e.what()).find("--max-response-bytes"), std::string::npos) << e.what();
  }
  // Logprobs weigh: 1 x 1000 x (32 + 6 x 96) = 608,000 bytes.
  const generation_request lp =
      parse_generation_request(R"({"prompt":"x","max_tokens":1000,"logprobs":5})", api_kind::completion, vocab, limits);
  EXPECT_EQ(estimated_response_bytes(lp, limits), 1000 * (32 + 6 * 96));
  EXPECT_THROW(parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],"n":4,"max_tokens":1000,)"
                                        R"("logprobs":true,"top_logprobs":5})",
                                        api_kind::chat, vocab, limits),
               api_error);
  // Prompt logprobs weigh per prompt token: 10 ids, echo with 5 top logprobs, nothing generated, n 2:
  // 10 x 2 x (2 + 5) x 96; the prompt_logprobs field doubles it.
  const std::string ids = "[1,2,3,4,5,6,7,8,9,10]";
  const generation_request echo =
      parse_generation_request(R"({"prompt":)" + ids + R"(,"echo":true,"logprobs":5,"max_tokens":0,"n":2})",
                               api_kind::completion, vocab, limits);
  EXPECT_EQ(estimated_response_bytes(echo, limits), 10 * 2 * 7 * 96);
  const generation_request both = parse_generation_request(
      R"({"prompt":)" + ids + R"(,"echo":true,"logprobs":5,"prompt_logprobs":5,"max_tokens":0,"n":2})",
      api_kind::completion, vocab, limits);
  EXPECT_EQ(estimated_response_bytes(both, limits), 2 * 10 * 2 * 7 * 96);
  // max_tokens beyond max_model_len cannot all be generated: the estimate uses the smaller.
  limits.max_model_len = 1024;
  const generation_request capped =
      parse_generation_request(R"({"prompt":"x","n":16,"max_tokens":100000})", api_kind::completion, vocab, limits);
  EXPECT_EQ(estimated_response_bytes(capped, limits), 16 * 1024 * 32);
}

TEST(request_parser, error_body_is_openai_shaped) {
  const api_error e(400, "'n' must be \"between\" 1 and 16", "n");
  const boost::json::value v = boost::json::parse(error_body(e));
  const auto& err = v.at("error").as_object();
  EXPECT_EQ(err.at("message").as_string(), "'n' must be \"between\" 1 and 16");
  EXPECT_EQ(err.at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(err.at("param").as_string(), "n");
  EXPECT_TRUE(err.at("code").is_null());
}

TEST(request_parser, tokenize_and_detokenize) {
  EXPECT_EQ(parse_tokenize_request(R"({"prompt":"abc","add_special_tokens":false})").prompt, "abc");
  EXPECT_THROW(parse_tokenize_request(R"({"prompt":1})"), api_error);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[1,2]})", vocab), (std::vector<token_id>{1, 2}));
  EXPECT_THROW(parse_detokenize_request(R"({"tokens":[1,99999]})", vocab), api_error);
  EXPECT_THROW(parse_detokenize_request(R"({})", vocab), api_error);
}

TEST(request_parser, raw_prompts_parse_special_tokens_unless_told_not_to) {
  EXPECT_TRUE(
      parse_generation_request(R"({"prompt":"<|im_start|>"})", api_kind::completion, vocab).prompt.parse_special);
  EXPECT_FALSE(
      parse_generation_request(R"({"parse_special":false,"prompt":"<|im_start|>"})", api_kind::completion, vocab)
          .prompt.parse_special)
      << "the field may come before the prompt";
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"parse_special":false})", api_kind::chat).param,
            "parse_special");
  EXPECT_EQ(parse_error(R"({"prompt":"x","parse_special":1})").param, "parse_special");
  EXPECT_TRUE(parse_tokenize_request(R"({"prompt":"abc"})").parse_special);
  EXPECT_FALSE(parse_tokenize_request(R"({"prompt":"abc","parse_special":false})").parse_special);
}

TEST(security, keys_equal_and_host_check) {
  EXPECT_TRUE(keys_equal("secret", "secret"));
  EXPECT_FALSE(keys_equal("secreT", "secret"));
  EXPECT_FALSE(keys_equal("secret2", "secret"));
  EXPECT_FALSE(keys_equal("", "secret"));
  server_options o;
  o.host = "127.0.0.1";
  EXPECT_TRUE(host_allowed("127.0.0.1:8000", o, 8000));
  EXPECT_TRUE(host_allowed("localhost:8000", o, 8000));
  EXPECT_TRUE(host_allowed("localhost", o, 8000));
  EXPECT_FALSE(host_allowed("evil.example:8000", o, 8000));
  EXPECT_FALSE(host_allowed("127.0.0.1:9999", o, 8000));
  EXPECT_FALSE(host_allowed("", o, 8000));
  o.allowed_hosts = {"api.internal"};
  EXPECT_TRUE(host_allowed("api.internal:8000", o, 8000));
}

TEST(format, sanitize_utf8_replaces_broken_sequences) {
  EXPECT_EQ(sanitize_utf8("plain"), "plain");
  EXPECT_EQ(sanitize_utf8("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(sanitize_utf8("a\xC3"), "a\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
}

TEST(format, timings_from_the_lifecycle) {
  actors::stream_final f;
  f.seconds_to_first_token = 0.5;
  f.seconds_total = 1.5;
  f.num_generated_tokens = 11;
  actors::choice_result c;
  c.num_generated_tokens = 11;
  const auto t0 = engine_clock::now();
  c.timeline = {{lifecycle_stage::queued, t0, 0},
                {lifecycle_stage::scheduled, t0 + std::chrono::milliseconds(100), 1},
                {lifecycle_stage::swapped_out, t0 + std::chrono::milliseconds(200), 2},
                {lifecycle_stage::first_token, t0 + std::chrono::milliseconds(400), 3}};
  f.choices.push_back(c);
  const boost::json::object t = timings_json(f);
  EXPECT_NEAR(t.at("queue_seconds").as_double(), 0.1, 1e-9);
  EXPECT_NEAR(t.at("prefill_seconds").as_double(), 0.3, 1e-9);
  EXPECT_NEAR(t.at("decode_tokens_per_second").as_double(), 10.0, 1e-9);  // 10 tokens after the first in 1 s
  EXPECT_EQ(t.at("num_preemptions").as_int64(), 1);
  EXPECT_EQ(t.at("num_swaps").as_int64(), 1);
  EXPECT_EQ(t.at("num_draft_tokens").as_int64(), 0);
}

// Echo with logprobs: the prompt's entries lead the completions logprobs (the first token's null),
// text_offset runs over prompt and completion, each top_logprobs holds the top-k plus the token itself;
// prompt_logprobs (vLLM's field) per choice in completions and once in chat.
TEST(format, echoed_prompt_logprobs_and_the_prompt_logprobs_field) {
  const auto tok = test_support::char_tokenizer();  // token i is one character: 1 'a', 2 'b', ...
  generation_request req;
  req.kind = api_kind::completion;
  req.want_logprobs = true;
  req.top_logprobs = 1;
  req.echo = req.echo_logprobs = true;
  req.prompt_logprobs = 2;
  req.params.n = 1;
  choice_accumulator c;
  c.text = "abc";
  c.prompt_logprobs = {{1, 0.0f, 0, {}}, {2, -1.5f, 3, {{5, -0.1f}, {4, -0.9f}}}};
  c.logprobs = {{3, -0.25f, {{3, -0.25f}}}};
  actors::stream_final f;
  f.num_prompt_tokens = 2;
  f.num_generated_tokens = 1;
  actors::choice_result done;
  done.reason = finish_reason::length;
  f.choices.push_back(done);
  const response_meta meta{"cmpl-1", 1700000000, "m"};
  boost::json::object v = boost::json::parse(full_response(req, meta, {c}, f, tok.get())).as_object();
  const boost::json::object& choice = v.at("choices").at(0).as_object();
  const boost::json::object& lp = choice.at("logprobs").as_object();
  EXPECT_EQ(lp.at("tokens"), (boost::json::array{"a", "b", "c"}));
  EXPECT_TRUE(lp.at("token_logprobs").at(0).is_null());
  EXPECT_DOUBLE_EQ(lp.at("token_logprobs").at(1).as_double(), -1.5);
  EXPECT_TRUE(lp.at("top_logprobs").at(0).is_null());
  // top 1 of the prompt position ("e") plus the prompt token itself ("b"); the generated "c" is its own top.
  EXPECT_EQ(lp.at("top_logprobs").at(1).as_object().size(), 2u);
  EXPECT_FLOAT_EQ(float(lp.at("top_logprobs").at(1).at("e").as_double()), -0.1f);
  EXPECT_DOUBLE_EQ(lp.at("top_logprobs").at(1).at("b").as_double(), -1.5);
  EXPECT_EQ(lp.at("top_logprobs").at(2).as_object().size(), 1u);
  EXPECT_EQ(lp.at("text_offset"), (boost::json::array{0, 1, 2}));
  // vLLM's prompt_logprobs: null, then the prompt token (its rank) and the top 2 (ranks 1, 2).
  const boost::json::array& pl = choice.at("prompt_logprobs").as_array();
  ASSERT_EQ(pl.size(), 2u);
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_EQ(pl[1].as_object().size(), 3u);
  EXPECT_EQ(pl[1].at("2").at("rank"), 3);
  EXPECT_EQ(pl[1].at("2").at("decoded_token"), "b");
  EXPECT_EQ(pl[1].at("5").at("rank"), 1);
  EXPECT_EQ(pl[1].at("4").at("rank"), 2);
  EXPECT_FLOAT_EQ(float(pl[1].at("4").at("logprob").as_double()), -0.9f);
  // Without echo the logprobs object covers the generated tokens only.
  req.echo_logprobs = false;
  v = boost::json::parse(full_response(req, meta, {c}, f, tok.get())).as_object();
  EXPECT_EQ(v.at("choices").at(0).at("logprobs").at("tokens"), (boost::json::array{"c"}));
  // Chat: prompt_logprobs once, on the response.
  req.kind = api_kind::chat;
  req.echo = req.echo_logprobs = false;
  v = boost::json::parse(full_response(req, meta, {c}, f, tok.get())).as_object();
  EXPECT_EQ(v.at("prompt_logprobs").as_array().size(), 2u);
  EXPECT_FALSE(v.at("choices").at(0).as_object().contains("prompt_logprobs"));
  // Not asked for: no field at all.
  req.prompt_logprobs = -1;
  v = boost::json::parse(full_response(req, meta, {c}, f, tok.get())).as_object();
  EXPECT_FALSE(v.contains("prompt_logprobs"));
}

TEST(format, usage_carries_speculative_counts_only_when_drafts_were_verified) {
  actors::stream_final f;
  f.num_prompt_tokens = 5;
  f.num_generated_tokens = 9;
  EXPECT_FALSE(usage_json(f).contains("speculative"));
  f.num_draft_tokens = 12;
  f.num_accepted_draft_tokens = 7;
  const boost::json::object u = usage_json(f);
  ASSERT_TRUE(u.contains("speculative"));
  EXPECT_EQ(u.at("speculative").at("proposed").as_int64(), 12);
  EXPECT_EQ(u.at("speculative").at("accepted").as_int64(), 7);
  EXPECT_EQ(u.at("completion_tokens").as_int64(), 9);
  EXPECT_EQ(timings_json(f).at("num_accepted_draft_tokens").as_int64(), 7);
}

}  // namespace
}  // namespace tessera::server
