// How the interpreter's parts fail: every error is a chat_template_error, and its text says which
// kind it is, so that a log line is enough to tell a broken template from a rejected conversation.
#pragma once
#include <optional>
#include <string>

#include "engine/text/jinja/jinja_template.hpp"

namespace tessera::jinja::detail {

[[noreturn]] inline void fail(chat_template_error_kind kind, const std::string& message) {
  throw chat_template_error(kind, message);
}

[[noreturn]] inline void fail_render(const std::string& message) {
  fail(chat_template_error_kind::render, "chat template render error: " + message);
}

[[noreturn]] inline void syntax_error(int line, const std::string& message) {
  fail(chat_template_error_kind::syntax, "chat template syntax error (line " + std::to_string(line) + "): " + message);
}

// Valid Jinja that is refused on purpose: "chat template uses <what> (line N), which is not
// supported". The parser knows the line; a name that is only looked up while rendering does not.
[[noreturn]] inline void fail_unsupported(const std::string& what, std::optional<int> line = std::nullopt) {
  const std::string where = line ? " (line " + std::to_string(*line) + ")" : std::string();
  fail(chat_template_error_kind::unsupported, "chat template uses " + what + where + ", which is not supported");
}

}  // namespace tessera::jinja::detail
