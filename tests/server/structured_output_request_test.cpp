// The structured-output request fields (server/structured_output_request.cpp) through the request
// parser: every dialect maps to the one structured_output_spec, no-op values stay no-ops, and each bad
// shape is a 400 whose param names the field.
#include <gtest/gtest.h>

#include <string>

#include "server/request_parser.hpp"

namespace tessera::server {
namespace {

constexpr int32_t vocab = 1000;
using kind = structured_output_spec::kind;

generation_request chat(const std::string& fields) {
  return parse_generation_request(R"({"messages":[{"role":"user","content":"x"}],)" + fields + "}", api_kind::chat,
                                  vocab);
}

api_error chat_error(const std::string& fields) {
  try {
    chat(fields);
  } catch (const api_error& e) { return e; }
  ADD_FAILURE() << "no error for " << fields;
  return api_error(0, "");
}

TEST(structured_output_request, every_dialect_maps_to_one_spec) {
  struct case_ {
    std::string fields;
    kind type;
    std::string source;  // expected text ("" where not checked)
    std::string field;
  };
  const case_ cases[] = {
      {R"("response_format":{"type":"json_object"})", kind::json_object, "", "response_format"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"b":{},"a":{}}}}})",
       kind::json_schema, R"({"type":"object","properties":{"b":{},"a":{}}})", "response_format"},
      {R"("guided_json":{"type":"integer"})", kind::json_schema, R"({"type":"integer"})", "guided_json"},
      {R"("guided_json":"{\"type\": \"integer\"}")", kind::json_schema, R"({"type": "integer"})", "guided_json"},
      {R"("json_schema":{"type":"boolean"})", kind::json_schema, R"({"type":"boolean"})", "json_schema"},
      {R"("guided_regex":"a+b")", kind::regex, "a+b", "guided_regex"},
      {R"("guided_grammar":"root ::= \"x\"")", kind::grammar, "root ::= \"x\"", "guided_grammar"},
      {R"("grammar":"root ::= \"x\"")", kind::grammar, "root ::= \"x\"", "grammar"},
      {R"("guided_choice":["a","b"],"guided_decoding_backend":"outlines")", kind::choice, "", "guided_choice"},
      {R"("structured_outputs":{"regex":"[0-9]+","backend":"auto"})", kind::regex, "[0-9]+", "structured_outputs"},
      {R"("structured_outputs":{"json":{"type":"null"}})", kind::json_schema, R"({"type":"null"})",
       "structured_outputs"},
      {R"("structured_outputs":{"choice":["y"]})", kind::choice, "", "structured_outputs"},
      {R"("structured_outputs":{"grammar":"root ::= \"z\"","json":null})", kind::grammar, "root ::= \"z\"",
       "structured_outputs"},
      {R"("structured_outputs":{"json_object":true})", kind::json_object, "", "structured_outputs"},
      {R"("response_format":{"type":"structural_tag","format":{"type":"any_text"}})", kind::structural_tag,
       R"({"type":"structural_tag","format":{"type":"any_text"}})", "response_format"},
  };
  for (const case_& c : cases) {
    const generation_request r = chat(c.fields);
    ASSERT_TRUE(r.params.structured.has_value()) << c.fields;
    EXPECT_EQ(r.params.structured->type, c.type) << c.fields;
    if (!c.source.empty()) { EXPECT_EQ(r.params.structured->source, c.source) << c.fields; }
    EXPECT_EQ(r.params.structured->field, c.field) << c.fields;
  }
  EXPECT_TRUE(chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{}}})")
                  .params.structured->strict);
  EXPECT_EQ(chat(R"("guided_choice":["a","b"])").params.structured->choices, (std::vector<std::string>{"a", "b"}));
}

TEST(structured_output_request, no_op_values_ask_for_nothing) {
  for (const std::string fields :
       {R"("response_format":{"type":"text"})", R"("response_format":null)", R"("structured_outputs":null)",
        R"("guided_json":null,"response_format":{"type":"text"})"}) {
    EXPECT_FALSE(chat(fields).params.structured.has_value()) << fields;
  }
  // /v1/completions takes the same fields.
  const generation_request r =
      parse_generation_request(R"({"prompt":"x","guided_regex":"[a-z]"})", api_kind::completion, vocab);
  ASSERT_TRUE(r.params.structured.has_value());
  EXPECT_EQ(r.params.structured->type, kind::regex);
}

TEST(structured_output_request, bad_shapes_are_400s_naming_the_field) {
  struct case_ {
    std::string fields;
    std::string param;
    std::string message_part;
  };
  const case_ cases[] = {
      {R"("response_format":"json")", "response_format", "must be an object"},
      {R"("response_format":{"type":"yaml"})", "response_format.type", "must be text, json_object"},
      {R"("response_format":{"type":"json_schema"})", "response_format.json_schema.schema", "is required"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":3}})",
       "response_format.json_schema.schema", "must be a JSON schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"strict":"yes"}})",
       "response_format.json_schema.strict", "boolean"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"extra":1}})",
       "response_format.json_schema.extra", "is not a field"},
      {R"("response_format":{"type":"text","json_schema":{}})", "response_format.json_schema", "not a field"},
      {R"("guided_regex":"")", "guided_regex", "must not be empty"},
      {R"("guided_regex":3)", "guided_regex", "must be a string"},
      {R"("guided_choice":"a")", "guided_choice", "array of strings"},
      {R"("guided_choice":[1])", "guided_choice", "array of strings"},
      {R"("guided_choice":[])", "guided_choice", "must not be empty"},
      {R"("guided_regex":"a","guided_json":{})", "guided_json", "cannot be combined with 'guided_regex'"},
      {R"("response_format":{"type":"json_object"},"grammar":"root ::= \"a\"")", "grammar", "cannot be combined"},
      {R"("structured_outputs":{"regex":"a","choice":["b"]})", "structured_outputs", "exactly one"},
      {R"("structured_outputs":{})", "structured_outputs", "must hold one of"},
      {R"("structured_outputs":{"whitespace_pattern":" "})", "structured_outputs.whitespace_pattern", "not supported"},
      {R"("structured_outputs":{"frob":1})", "structured_outputs.frob", "is not a field"},
      {R"("guided_whitespace_pattern":"x")", "guided_whitespace_pattern", "not supported"},
      {R"("functions":[])", "functions", "not supported"},
  };
  for (const case_& c : cases) {
    const api_error e = chat_error(c.fields);
    EXPECT_EQ(e.status, 400) << c.fields;
    EXPECT_EQ(e.param, c.param) << c.fields << " -> " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << c.fields << " -> " << e.what();
  }
  // The size bound (sampling_limits), at the limit and past it.
  const std::string at_limit = "\"guided_regex\":\"" + std::string(64 * 1024, 'a') + "\"";
  EXPECT_NO_THROW(chat(at_limit));
  const api_error big = chat_error("\"guided_regex\":\"" + std::string(64 * 1024 + 1, 'a') + "\"");
  EXPECT_NE(std::string(big.what()).find("at most 65536"), std::string::npos) << big.what();
}

}  // namespace
}  // namespace tessera::server
