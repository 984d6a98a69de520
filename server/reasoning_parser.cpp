#include "server/reasoning_parser.hpp"

#include <algorithm>

namespace tessera::server {

namespace {

constexpr std::string_view think_open = "<think>";
constexpr std::string_view think_close = "</think>";

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.substr(0, n) == text.substr(text.size() - n)) return n;
  }
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

std::string_view to_string(reasoning_parser_kind kind) {
  switch (kind) {
    case reasoning_parser_kind::none: return "none";
    case reasoning_parser_kind::qwen3: return "qwen3";
    case reasoning_parser_kind::deepseek_r1: return "deepseek_r1";
  }
  return "none";
}

std::optional<reasoning_parser_kind> reasoning_parser_from_name(std::string_view name) {
  if (name == "none") return reasoning_parser_kind::none;
  if (name == "qwen3") return reasoning_parser_kind::qwen3;
  if (name == "deepseek_r1" || name == "deepseek-r1") return reasoning_parser_kind::deepseek_r1;
  return std::nullopt;
}

reasoning_stream::reasoning_stream(reasoning_parser_kind kind)
    : kind_(kind), state_(kind == reasoning_parser_kind::none ? state::content : state::start) {}

void reasoning_stream::run(reasoning_step& out, bool at_end) {
  if (state_ == state::start) {
    // Leading whitespace, then maybe <think>: undecided while the text could still become the tag.
    size_t i = 0;
    while (i < buffer_.size() && is_space(buffer_[i])) ++i;
    const std::string_view rest = std::string_view(buffer_).substr(i);
    if (rest.starts_with(think_open)) {
      buffer_.erase(0, i + think_open.size());
      state_ = state::reasoning;
    } else if (!at_end && think_open.starts_with(rest)) {
      return;
    } else {
      state_ = kind_ == reasoning_parser_kind::deepseek_r1 ? state::reasoning : state::content;
    }
  }
  if (state_ == state::reasoning) {
    const size_t close = buffer_.find(think_close);
    if (close == std::string::npos) {
      const size_t hold = at_end ? 0 : partial_marker_suffix(buffer_, think_close);
      out.reasoning.append(buffer_, 0, buffer_.size() - hold);
      buffer_.erase(0, buffer_.size() - hold);
      return;
    }
    out.reasoning.append(buffer_, 0, close);
    buffer_.erase(0, close + think_close.size());
    state_ = state::content;
  }
  out.content += buffer_;
  buffer_.clear();
}

reasoning_step reasoning_stream::feed(std::string_view text) {
  reasoning_step out;
  buffer_.append(text);
  run(out, false);
  return out;
}

reasoning_step reasoning_stream::finish() {
  reasoning_step out;
  run(out, true);
  return out;
}

reasoning_step reasoning_stream::parse_all(reasoning_parser_kind kind, std::string_view text) {
  reasoning_stream s(kind);
  reasoning_step all = s.feed(text);
  reasoning_step last = s.finish();
  all.reasoning += last.reasoning;
  all.content += last.content;
  return all;
}

}  // namespace tessera::server
