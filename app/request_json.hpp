// JSON <-> requests for the offline API (`tessera generate --input requests.jsonl`): one request per
// line with the same fields as the OpenAI-compatible API, parsed with simdjson; results written with
// Boost.JSON (never by concatenating user text).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.hpp"
#include "engine/text/chat_template.hpp"

namespace tessera::app {

struct offline_request {
  std::string id;                                     // echoed back; defaults to the line number
  std::optional<std::string> prompt;                  // completion-style text
  std::optional<std::vector<chat_message>> messages;  // chat-style conversation
  sampling_params params;
  int32_t priority = 0;
};

// Lines with nothing but whitespace are skipped in JSONL inputs.
inline bool is_blank_line(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Parses one JSONL line. `defaults` supplies fields the line omits. Throws invalid_request naming
// the field (e.g. "line 3: 'temperature' must be a number").
offline_request parse_offline_request(std::string_view line, int64_t line_number, const sampling_params& defaults);

struct offline_result {
  std::string id;
  std::vector<std::string> texts;  // one per choice (n)
  std::vector<std::string> finish_reasons;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::string error;  // non-empty: the request failed
};

// One JSON object: {"id","text","finish_reason","usage":{...}} (plus "choices" when n > 1, "error").
std::string format_offline_result(const offline_result& result);

}  // namespace tessera::app
