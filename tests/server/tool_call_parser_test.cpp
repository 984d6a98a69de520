// Tool-call and reasoning parsers: each family's format against hand-written expectations, and the
// streaming contract: fed in two pieces cut at every byte (and one byte at a time), the pieces
// concatenate to exactly the one-shot parse.
#include "server/tool_call_parser.hpp"
#include "server/reasoning_parser.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::server {
namespace {

struct call {
  std::string name, arguments;
  friend bool operator==(const call&, const call&) = default;
};

std::ostream& operator<<(std::ostream& os, const call& c) { return os << c.name << "(" << c.arguments << ")"; }

struct parse_result {
  std::string content;
  std::vector<call> calls;
};

void append(parse_result& r, tool_parse_step step) {
  r.content += step.content;
  for (auto& c : step.calls) r.calls.push_back({c.name, c.arguments});
}

parse_result parse_pieces(tool_parser_kind kind, const std::vector<std::string_view>& pieces) {
  tool_call_stream s(kind, 7);
  parse_result r;
  for (auto p : pieces) append(r, s.feed(p));
  append(r, s.finish());
  return r;
}

// Every cut into two pieces, and byte by byte: all equal to the one-shot parse, which is returned.
parse_result parse_checked(tool_parser_kind kind, std::string_view text) {
  const parse_result whole = parse_pieces(kind, {text});
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const parse_result split = parse_pieces(kind, {text.substr(0, cut), text.substr(cut)});
    EXPECT_EQ(split.content, whole.content) << "cut at " << cut << " of: " << text;
    EXPECT_EQ(split.calls, whole.calls) << "cut at " << cut << " of: " << text;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  const parse_result one_by_one = parse_pieces(kind, bytes);
  EXPECT_EQ(one_by_one.content, whole.content) << text;
  EXPECT_EQ(one_by_one.calls, whole.calls) << text;
  return whole;
}

TEST(ToolCallParser, HermesCallsAfterContent) {
  const auto r = parse_checked(
      tool_parser_kind::hermes,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a </tool_call> "
      "b\"}}\n</tool_call>\n");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (call{"get_weather", R"({"city":"Paris","days":2})"}));
  // A close tag inside a string argument does not end the block: the block ends after the JSON.
  EXPECT_EQ(r.calls[1], (call{"search", R"({"q":"a </tool_call> b"})"}));
}

TEST(ToolCallParser, HermesPlainTextIsUntouched) {
  for (std::string_view text : {"Hello world.\n\n", "a < b and <tool", "<tool_cal", "  \n", "x <tool_callx> y", ""}) {
    const auto r = parse_checked(tool_parser_kind::hermes, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST(ToolCallParser, HermesInvalidBlocksAreContent) {
  const std::string text = "A <tool_call>{\"name\": 5}</tool_call> B <tool_call>not json</tool_call>";
  const auto r = parse_checked(tool_parser_kind::hermes, text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCallParser, HermesUnterminatedBlock) {
  auto r = parse_checked(tool_parser_kind::hermes, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls, (std::vector<call>{{"now", "{}"}}));
  r = parse_checked(tool_parser_kind::hermes, "<tool_call>\n{\"name\": \"now\", \"argu");
  EXPECT_EQ(r.content, "<tool_call>\n{\"name\": \"now\", \"argu");
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCallParser, ArgumentsAsAStringOrParameters) {
  auto r = parse_checked(tool_parser_kind::hermes,
                         "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2.5]}\"}</tool_call>");
  EXPECT_EQ(r.calls, (std::vector<call>{{"f", R"({"x":[1,2.5]})"}}));
  r = parse_checked(tool_parser_kind::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCallParser, Llama3Json) {
  auto r =
      parse_checked(tool_parser_kind::llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\"}}");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls, (std::vector<call>{{"get_weather", "{\"city\":\"Zürich\"}"}}));
  r = parse_checked(
      tool_parser_kind::llama3,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"x; y\"}}; {\"name\": \"b\", \"parameters\": {}}");
  EXPECT_EQ(r.calls, (std::vector<call>{{"a", R"({"s":"x; y"})"}, {"b", "{}"}}));
  for (std::string_view text :
       {"Hello {", "{not json}", "  <|python_ta", "The answer is {\"name\": \"a\"}", "{\"name\": \"a\"} trailing"}) {
    r = parse_checked(tool_parser_kind::llama3, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
}

TEST(ToolCallParser, Mistral) {
  auto r = parse_checked(tool_parser_kind::mistral,
                         "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", "
                         "\"arguments\": {\"b\": [true, null]}}]");
  EXPECT_EQ(r.content, "Sure.");
  EXPECT_EQ(r.calls, (std::vector<call>{{"f", R"({"a":1})"}, {"g", R"({"b":[true,null]})"}}));
  r = parse_checked(tool_parser_kind::mistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  EXPECT_EQ(r.content, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  EXPECT_TRUE(r.calls.empty());
  r = parse_checked(tool_parser_kind::mistral, "No calls [TOOL_CALL");
  EXPECT_EQ(r.content, "No calls [TOOL_CALL");
}

TEST(ToolCallParser, IdsAreOpenAIShapedAndMistralsNineCharacters) {
  auto steps = tool_call_stream::parse_all(
      tool_parser_kind::hermes, "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"f\"}</tool_call>", 1);
  ASSERT_EQ(steps.calls.size(), 2u);
  EXPECT_EQ(steps.calls[0].id.size(), 29u);
  EXPECT_EQ(steps.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(steps.calls[0].id, steps.calls[1].id);
  steps =
      tool_call_stream::parse_all(tool_parser_kind::mistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", 1);
  ASSERT_EQ(steps.calls.size(), 1u);
  EXPECT_EQ(steps.calls[0].id.size(), 9u);
}

TEST(ToolCallParser, NamesAndDetection) {
  EXPECT_EQ(tool_parser_from_name("qwen3"), tool_parser_kind::hermes);
  EXPECT_EQ(tool_parser_from_name("llama3_json"), tool_parser_kind::llama3);
  EXPECT_EQ(tool_parser_from_name("bogus"), std::nullopt);
  EXPECT_EQ(detect_tool_parser("{{ '<tool_call>' }}"), tool_parser_kind::hermes);
  EXPECT_EQ(detect_tool_parser("[TOOL_CALLS] [INST]"), tool_parser_kind::mistral);
  EXPECT_EQ(detect_tool_parser("<|python_tag|>"), tool_parser_kind::llama3);
  EXPECT_EQ(detect_tool_parser("<|im_start|>{{ message.content }}"), tool_parser_kind::none);
}

// ---- reasoning ----

reasoning_step reason_pieces(reasoning_parser_kind kind, const std::vector<std::string_view>& pieces) {
  reasoning_stream s(kind);
  reasoning_step all;
  auto add = [&](reasoning_step x) {
    all.reasoning += x.reasoning;
    all.content += x.content;
  };
  for (auto p : pieces) add(s.feed(p));
  add(s.finish());
  return all;
}

reasoning_step reason_checked(reasoning_parser_kind kind, std::string_view text) {
  const reasoning_step whole = reasoning_stream::parse_all(kind, text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const auto split = reason_pieces(kind, {text.substr(0, cut), text.substr(cut)});
    EXPECT_EQ(split.reasoning, whole.reasoning) << cut << ": " << text;
    EXPECT_EQ(split.content, whole.content) << cut << ": " << text;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  const auto one = reason_pieces(kind, bytes);
  EXPECT_EQ(one.reasoning, whole.reasoning);
  EXPECT_EQ(one.content, whole.content);
  return whole;
}

TEST(ReasoningParser, Qwen3) {
  auto r = reason_checked(reasoning_parser_kind::qwen3, "<think>\nLet me think: 2+2=4.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(r.reasoning, "\nLet me think: 2+2=4.\n");
  EXPECT_EQ(r.content, "\n\nThe answer is 4.");
  r = reason_checked(reasoning_parser_kind::qwen3, "No thinking here <think>x</think>");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "No thinking here <think>x</think>");
  r = reason_checked(reasoning_parser_kind::qwen3, "<think>still thinking </thi");
  EXPECT_EQ(r.reasoning, "still thinking </thi");
  EXPECT_EQ(r.content, "");
  r = reason_checked(reasoning_parser_kind::qwen3, "<thin");
  EXPECT_EQ(r.content, "<thin");
}

TEST(ReasoningParser, DeepSeekR1StartsInsideTheReasoning) {
  auto r = reason_checked(reasoning_parser_kind::deepseek_r1, "Hmm, 7*6 is 42.</think>42");
  EXPECT_EQ(r.reasoning, "Hmm, 7*6 is 42.");
  EXPECT_EQ(r.content, "42");
  r = reason_checked(reasoning_parser_kind::deepseek_r1, "<think>a</think>b");
  EXPECT_EQ(r.reasoning, "a");
  EXPECT_EQ(r.content, "b");
  r = reason_checked(reasoning_parser_kind::deepseek_r1, "never closed");
  EXPECT_EQ(r.reasoning, "never closed");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, NoneAndNames) {
  const auto r = reason_checked(reasoning_parser_kind::none, "<think>x</think>y");
  EXPECT_EQ(r.content, "<think>x</think>y");
  EXPECT_EQ(reasoning_parser_from_name("deepseek-r1"), reasoning_parser_kind::deepseek_r1);
  EXPECT_EQ(reasoning_parser_from_name("r2"), std::nullopt);
}

}  // namespace
}  // namespace tessera::server
