// One chat choice's generated text split into what OpenAI's message holds: reasoning_content, content
// and tool_calls. Reasoning is separated first (server/reasoning_parser.hpp), then the answer is
// parsed for tool calls (server/tool_call_parser.hpp) -- or, when tool_choice forced a call, the whole
// answer is the grammar-constrained call JSON. Incremental: a streamed choice is fed delta by delta and
// the pieces concatenate to the non-streamed message (the same parser fed once).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning_parser.hpp"
#include "server/tool_call_parser.hpp"
#include "server/tool_request.hpp"

namespace tessera::server {

// The server's parser choices (--tool-call-parser / --reasoning-parser, or detected from the template).
struct output_parsers {
  tool_parser_kind tools = tool_parser_kind::none;
  reasoning_parser_kind reasoning = reasoning_parser_kind::none;
};

struct chat_piece {
  std::string reasoning;
  std::string content;
  std::vector<parsed_tool_call> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class chat_output_stream {
 public:
  chat_output_stream(const output_parsers& parsers, const tool_request& tools);

  chat_piece feed(std::string_view text);
  chat_piece finish();
  int32_t num_calls() const { return num_calls_; }

 private:
  void take_answer(chat_piece& out, std::string_view answer, bool at_end);

  reasoning_stream reasoning_;
  tool_call_stream tools_;
  tool_choice_mode forced_ = tool_choice_mode::auto_;  // required / named: the answer is the call JSON
  std::string forced_name_;
  std::string forced_text_;
  int32_t num_calls_ = 0;
  uint64_t id_seed_;
};

// Whether a chat request's output goes through the parsers at all (otherwise text passes as is).
inline bool parses_output(const output_parsers& parsers, const tool_request& tools) {
  return parsers.reasoning != reasoning_parser_kind::none || tools.forced() ||
         (tools.calls_possible() && parsers.tools != tool_parser_kind::none);
}

// The non-streamed split of a whole text.
chat_piece parse_chat_output(const output_parsers& parsers, const tool_request& tools, std::string_view text);

}  // namespace tessera::server
