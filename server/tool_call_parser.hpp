// Tool calls in generated text -> OpenAI tool_calls, per model family, incrementally: the stream
// feeds the text as the engine produces it (cut anywhere, even inside a UTF-8 character or a tag) and
// gets back the content to show and the calls found so far, so that the streamed deltas concatenate to
// exactly the non-streamed answer (the non-streamed path is the same parser fed once).
//
//   hermes   (Hermes, Qwen 2.5/3): <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number,
//            with content around them.
//   llama3   (Llama 3.1/3.2 JSON tool calling): the whole output is {"name": ..., "parameters": {...}}
//            (or "arguments"), optionally after <|python_tag|>, several separated by ';'.
//   mistral  (Mistral v0.3 / Nemo): [TOOL_CALLS] then a JSON array of {"name", "arguments"}; content
//            may come before the marker.
//
// A block that does not hold a valid call (bad JSON, no name, arguments not an object) is not a call:
// its text is content, in both modes. A call is emitted once its JSON is complete, so its arguments
// arrive as one fragment (OpenAI's format allows any split).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::server {

enum class tool_parser_kind : uint8_t { none, hermes, llama3, mistral };

std::string_view to_string(tool_parser_kind kind);
// "hermes" (also "qwen", "qwen2_5", "qwen3"), "llama3" ("llama3_json", "llama"), "mistral", "none";
// nullopt for other names.
std::optional<tool_parser_kind> tool_parser_from_name(std::string_view name);
// The family a chat template formats tool calls in, from its markers; none when it has none.
tool_parser_kind detect_tool_parser(std::string_view template_source);

struct parsed_tool_call {
  std::string id;  // "call_" + 24 alphanumerics; Mistral: 9 alphanumerics (its templates require it)
  std::string name;
  std::string arguments;  // a JSON object, serialized compactly

  friend bool operator==(const parsed_tool_call&, const parsed_tool_call&) = default;
};

// What one feed produced: content text to show, and the calls completed by this text.
struct tool_parse_step {
  std::string content;
  std::vector<parsed_tool_call> calls;
};

class tool_call_stream {
 public:
  // `seed` makes the call ids reproducible (tests); the server seeds from a random device.
  explicit tool_call_stream(tool_parser_kind kind, uint64_t seed = std::random_device{}());

  tool_parse_step feed(std::string_view text);
  // The output ended: what was held back (a partial tag, an unterminated block) is resolved.
  tool_parse_step finish();

  int32_t num_calls() const { return num_calls_; }
  tool_parser_kind kind() const { return kind_; }

  // Whole-text parse: feed + finish, concatenated.
  static tool_parse_step parse_all(tool_parser_kind kind, std::string_view text, uint64_t seed = 0);

 private:
  enum class state : uint8_t { text, in_block, deciding, whole_output, after_marker };

  void feed_hermes(tool_parse_step& out, bool at_end);
  void feed_llama3(tool_parse_step& out, bool at_end);
  void feed_mistral(tool_parse_step& out, bool at_end);
  // Content text, except a whitespace run right before a call or at the end after a call.
  void emit_content(tool_parse_step& out, std::string_view text);
  void flush_pending_space(tool_parse_step& out);
  void add_call(tool_parse_step& out, std::string name, std::string arguments);
  std::string new_id();

  tool_parser_kind kind_;
  std::mt19937_64 rng_;
  state state_ = state::text;
  std::string buffer_;         // unparsed text
  std::string pending_space_;  // whitespace held until we know whether a call follows it
  int32_t num_calls_ = 0;
};

// Parses one JSON value holding a call: {"name": str, "arguments"|"parameters": object or a string
// holding one}. True and sets *name / *arguments (compact JSON) when valid.
bool parse_call_object(std::string_view json_text, std::string* name, std::string* arguments);

}  // namespace tessera::server
