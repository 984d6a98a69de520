#include "server/tool_call_parser.hpp"

#include <simdjson.h>

#include <algorithm>

namespace tessera::server {

namespace {

constexpr std::string_view hermes_open = "<tool_call>";
constexpr std::string_view hermes_close = "</tool_call>";
constexpr std::string_view python_tag = "<|python_tag|>";
constexpr std::string_view mistral_marker = "[TOOL_CALLS]";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`: the bytes that must wait
// for the next feed because the marker may be completing across the cut.
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.substr(0, n) == text.substr(text.size() - n)) return n;
  }
  return 0;
}

// The end (one past) of the JSON object or array that starts at `s[start]`, scanning strings and
// escapes; npos when it does not close. Only structure is checked here; validity is boost::json's.
size_t json_value_end(std::string_view s, size_t start) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[')
      ++depth;
    else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// One or more call objects separated by whitespace, ';' or ',' (Llama 3 emits "a; b"); all valid or none.
bool parse_call_sequence(std::string_view text, std::vector<std::pair<std::string, std::string>>* calls) {
  size_t i = 0;
  while (true) {
    while (i < text.size() && (is_space(text[i]) || text[i] == ';' || text[i] == ',')) ++i;
    if (i == text.size()) return !calls->empty();
    if (text[i] != '{') return false;
    const size_t end = json_value_end(text, i);
    if (end == std::string_view::npos) return false;
    std::string name, arguments;
    if (!parse_call_object(text.substr(i, end - i), &name, &arguments)) return false;
    calls->emplace_back(std::move(name), std::move(arguments));
    i = end;
  }
}

}  // namespace

std::string_view to_string(tool_parser_kind kind) {
  switch (kind) {
    case tool_parser_kind::none: return "none";
    case tool_parser_kind::hermes: return "hermes";
    case tool_parser_kind::llama3: return "llama3";
    case tool_parser_kind::mistral: return "mistral";
  }
  return "none";
}

std::optional<tool_parser_kind> tool_parser_from_name(std::string_view name) {
  if (name == "none") return tool_parser_kind::none;
  if (name == "hermes" || name == "qwen" || name == "qwen2_5" || name == "qwen3") return tool_parser_kind::hermes;
  if (name == "llama3" || name == "llama3_json" || name == "llama") return tool_parser_kind::llama3;
  if (name == "mistral") return tool_parser_kind::mistral;
  return std::nullopt;
}

tool_parser_kind detect_tool_parser(std::string_view source) {
  const auto has = [&](std::string_view m) { return source.find(m) != std::string_view::npos; };
  if (has("<tool_call>")) return tool_parser_kind::hermes;
  if (has("[TOOL_CALLS]")) return tool_parser_kind::mistral;
  if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("tool_calls"))) return tool_parser_kind::llama3;
  return tool_parser_kind::none;
}

bool parse_call_object(std::string_view json_text, std::string* name, std::string* arguments) {
  // simdjson rather than Boost.JSON: its minified output writes numbers the shortest way (2.5, not
  // Boost's 2.5E0), which is what clients expect to read back in arguments.
  simdjson::dom::parser parser;
  simdjson::dom::element v;
  if (parser.parse(json_text).get(v) || !v.is_object()) return false;
  simdjson::dom::element n, args;
  std::string_view n_text;
  if (v["name"].get(n) || n.get(n_text) || n_text.empty()) return false;
  if (v["arguments"].get(args) && v["parameters"].get(args)) {
    *arguments = "{}";
  } else if (args.is_object()) {
    *arguments = simdjson::minify(args);
  } else if (args.is_string()) {
    // Some models write the arguments as a JSON string holding the object.
    simdjson::dom::parser inner_parser;
    simdjson::dom::element inner;
    if (inner_parser.parse(std::string(std::string_view(args))).get(inner) || !inner.is_object()) return false;
    *arguments = simdjson::minify(inner);
  } else {
    return false;
  }
  *name = std::string(n_text);
  return true;
}

tool_call_stream::tool_call_stream(tool_parser_kind kind, uint64_t seed) : kind_(kind), rng_(seed) {
  if (kind_ == tool_parser_kind::llama3) state_ = state::deciding;
}

std::string tool_call_stream::new_id() {
  static constexpr std::string_view alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<size_t> pick(0, alnum.size() - 1);
  std::string id = kind_ == tool_parser_kind::mistral ? "" : "call_";
  const int n = kind_ == tool_parser_kind::mistral ? 9 : 24;
  for (int i = 0; i < n; ++i) id += alnum[pick(rng_)];
  return id;
}

void tool_call_stream::flush_pending_space(tool_parse_step& out) {
  out.content += pending_space_;
  pending_space_.clear();
}

void tool_call_stream::emit_content(tool_parse_step& out, std::string_view text) {
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last > 0) {
    flush_pending_space(out);
    out.content.append(text.substr(0, last));
  }
  pending_space_.append(text.substr(last));
}

void tool_call_stream::add_call(tool_parse_step& out, std::string name, std::string arguments) {
  pending_space_.clear();  // whitespace between content and a call (or between calls) is layout, not content
  out.calls.push_back({new_id(), std::move(name), std::move(arguments)});
  ++num_calls_;
}

tool_parse_step tool_call_stream::feed(std::string_view text) {
  tool_parse_step out;
  buffer_.append(text);
  switch (kind_) {
    case tool_parser_kind::none:
      emit_content(out, buffer_);
      buffer_.clear();
      break;
    case tool_parser_kind::hermes: feed_hermes(out, false); break;
    case tool_parser_kind::llama3: feed_llama3(out, false); break;
    case tool_parser_kind::mistral: feed_mistral(out, false); break;
  }
  return out;
}

tool_parse_step tool_call_stream::finish() {
  tool_parse_step out;
  switch (kind_) {
    case tool_parser_kind::none:
      emit_content(out, buffer_);
      buffer_.clear();
      break;
    case tool_parser_kind::hermes: feed_hermes(out, true); break;
    case tool_parser_kind::llama3: feed_llama3(out, true); break;
    case tool_parser_kind::mistral: feed_mistral(out, true); break;
  }
  // Trailing whitespace is content unless the output made calls.
  if (num_calls_ == 0) flush_pending_space(out);
  pending_space_.clear();
  return out;
}

void tool_call_stream::feed_hermes(tool_parse_step& out, bool at_end) {
  while (true) {
    if (state_ == state::text) {
      const size_t open = buffer_.find(hermes_open);
      if (open == std::string::npos) {
        const size_t hold = at_end ? 0 : partial_marker_suffix(buffer_, hermes_open);
        emit_content(out, std::string_view(buffer_).substr(0, buffer_.size() - hold));
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      emit_content(out, std::string_view(buffer_).substr(0, open));
      buffer_.erase(0, open + hermes_open.size());
      state_ = state::in_block;
      continue;
    }
    // In a block: the call is complete at the closing tag after its JSON object (so a tag inside a
    // string argument does not cut it), or, unterminated, at the end.
    size_t search_from = 0, start = 0;
    while (start < buffer_.size() && is_space(buffer_[start])) ++start;
    if (start < buffer_.size() && buffer_[start] == '{') {
      const size_t end = json_value_end(buffer_, start);
      if (end == std::string::npos && !at_end) return;
      if (end != std::string::npos) search_from = end;
    }
    const size_t close = buffer_.find(hermes_close, search_from);
    if (close == std::string::npos && !at_end) return;
    const std::string_view body =
        std::string_view(buffer_).substr(0, close == std::string::npos ? buffer_.size() : close);
    std::string name, arguments;
    if (parse_call_object(trim(body), &name, &arguments)) {
      add_call(out, std::move(name), std::move(arguments));
    } else {
      std::string raw = std::string(hermes_open) + std::string(body);
      if (close != std::string::npos) raw += hermes_close;
      emit_content(out, raw);
    }
    buffer_.erase(0, close == std::string::npos ? buffer_.size() : close + hermes_close.size());
    state_ = state::text;
    if (buffer_.empty()) return;
  }
}

void tool_call_stream::feed_llama3(tool_parse_step& out, bool at_end) {
  if (state_ == state::deciding) {
    const std::string_view rest = trim(buffer_);
    if (rest.empty() && !at_end) return;
    if (!rest.empty() && (rest.front() == '{' || rest.starts_with(python_tag))) {
      state_ = state::whole_output;
    } else if (!at_end && !rest.empty() && python_tag.starts_with(rest)) {
      return;  // maybe the start of <|python_tag|>
    } else {
      state_ = state::text;
    }
  }
  if (state_ == state::text) {
    emit_content(out, buffer_);
    buffer_.clear();
    return;
  }
  if (!at_end) return;  // the whole output is the call: parsed once it is complete
  std::string_view body = trim(buffer_);
  if (body.starts_with(python_tag)) body.remove_prefix(python_tag.size());
  std::vector<std::pair<std::string, std::string>> calls;
  if (parse_call_sequence(body, &calls)) {
    for (auto& [name, arguments] : calls) add_call(out, std::move(name), std::move(arguments));
  } else {
    emit_content(out, buffer_);
  }
  buffer_.clear();
}

void tool_call_stream::feed_mistral(tool_parse_step& out, bool at_end) {
  if (state_ == state::text) {
    const size_t marker = buffer_.find(mistral_marker);
    if (marker == std::string::npos) {
      const size_t hold = at_end ? 0 : partial_marker_suffix(buffer_, mistral_marker);
      emit_content(out, std::string_view(buffer_).substr(0, buffer_.size() - hold));
      buffer_.erase(0, buffer_.size() - hold);
      return;
    }
    emit_content(out, std::string_view(buffer_).substr(0, marker));
    buffer_.erase(0, marker + mistral_marker.size());
    state_ = state::after_marker;
  }
  if (!at_end) return;  // everything after [TOOL_CALLS] is the calls: parsed once complete
  const std::string_view body = trim(buffer_);
  std::vector<std::pair<std::string, std::string>> calls;
  bool ok = false;
  if (body.starts_with("[")) {
    const size_t end = json_value_end(body, 0);
    ok = end == body.size() && parse_call_sequence(body.substr(1, body.size() - 2), &calls);
  } else {
    ok = parse_call_sequence(body, &calls);
  }
  if (ok) {
    for (auto& [name, arguments] : calls) add_call(out, std::move(name), std::move(arguments));
  } else {
    emit_content(out, std::string(mistral_marker) + buffer_);
  }
  buffer_.clear();
}

tool_parse_step tool_call_stream::parse_all(tool_parser_kind kind, std::string_view text, uint64_t seed) {
  tool_call_stream stream(kind, seed);
  tool_parse_step all = stream.feed(text);
  tool_parse_step last = stream.finish();
  all.content += last.content;
  for (auto& c : last.calls) all.calls.push_back(std::move(c));
  return all;
}

}  // namespace tessera::server
