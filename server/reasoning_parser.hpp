// Reasoning text (<think>...</think>, Qwen3 and DeepSeek-R1 style) -> reasoning_content, separated from
// the answer incrementally: the stream feeds the text as generated, cut anywhere (inside a tag too),
// and the streamed parts concatenate to exactly the non-streamed split (the same parser fed once).
//
//   qwen3        reasoning only when the output starts with <think> (whitespace before it allowed);
//                it runs to </think> or to the end of the output.
//   deepseek_r1  the template already opened <think> in the prompt: the output starts inside the
//                reasoning (a leading <think> is dropped) and it runs to </think>; with no </think>
//                the whole output is reasoning (as vLLM's deepseek_r1 parser splits it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::server {

enum class reasoning_parser_kind : uint8_t { none, qwen3, deepseek_r1 };

std::string_view to_string(reasoning_parser_kind kind);
// "qwen3", "deepseek_r1" (also "deepseek-r1"), "none"; nullopt for other names.
std::optional<reasoning_parser_kind> reasoning_parser_from_name(std::string_view name);

struct reasoning_step {
  std::string reasoning;
  std::string content;
};

class reasoning_stream {
 public:
  explicit reasoning_stream(reasoning_parser_kind kind);
  reasoning_step feed(std::string_view text);
  reasoning_step finish();
  static reasoning_step parse_all(reasoning_parser_kind kind, std::string_view text);

 private:
  enum class state : uint8_t { start, reasoning, content };
  void run(reasoning_step& out, bool at_end);

  reasoning_parser_kind kind_;
  state state_;
  std::string buffer_;
};

}  // namespace tessera::server
