// The tool-calling fields of a chat request (OpenAI's tools, tool_choice, parallel_tool_calls), checked
// and turned into what the rest of the server needs: the definitions as JSON text for the chat template,
// and, for tool_choice "required" or a named function, the JSON schema that constrained decoding
// enforces so the output is always a valid call (sampling_params::structured, field "tool_choice").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::server {

struct tool_function {
  std::string name;
  std::string parameters;  // its JSON Schema as JSON text; "" when the tool declares none
};

enum class tool_choice_mode : uint8_t { none, auto_, required, named };

struct tool_request {
  std::vector<tool_function> functions;
  std::string tools_json;  // the request's "tools" array, compact JSON, for the chat template
  tool_choice_mode choice = tool_choice_mode::auto_;
  std::string named_function;  // choice == named
  bool parallel_tool_calls = true;

  // The output is parsed for calls: tools given and tool_choice not "none".
  bool calls_possible() const { return !functions.empty() && choice != tool_choice_mode::none; }
  // The output is forced (by the grammar) to be calls: required, or a named function.
  bool forced() const {
    return !functions.empty() && (choice == tool_choice_mode::required || choice == tool_choice_mode::named);
  }
};

inline constexpr int32_t k_max_tools = 128;  // OpenAI's bound

// "tools": an array of {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}. Throws api_error (400) naming the field.
void parse_tools(std::string_view tools_json, tool_request& out);
// "tool_choice": "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
void parse_tool_choice(std::string_view choice_json, tool_request& out);
// After every field is read: tool_choice naming a function that "tools" lacks, or required without
// tools, is a 400.
void check_tool_request(const tool_request& t, bool tools_given);

// What the constrained output must be. named: the function's arguments object (its parameters
// schema); required: [{"name": one of the functions, "parameters": its arguments}, ...], one item
// at most unless parallel_tool_calls.
std::string forced_call_schema(const tool_request& t);

}  // namespace tessera::server
