#include "server/chat_output.hpp"

#include <simdjson.h>

#include <random>

namespace tessera::server {

namespace {

std::string random_call_id(std::mt19937_64& rng) {
  static constexpr std::string_view alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<size_t> pick(0, alnum.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += alnum[pick(rng)];
  return id;
}

}  // namespace

chat_output_stream::chat_output_stream(const output_parsers& parsers, const tool_request& tools)
    : reasoning_(parsers.reasoning),
      tools_(tools.calls_possible() && !tools.forced() ? parsers.tools : tool_parser_kind::none),
      id_seed_(std::random_device{}()) {
  if (tools.forced()) {
    forced_ = tools.choice;
    forced_name_ = tools.named_function;
  }
}

void chat_output_stream::take_answer(chat_piece& out, std::string_view answer, bool at_end) {
  if (forced_ == tool_choice_mode::required || forced_ == tool_choice_mode::named) {
    // The grammar constrained the answer to the call JSON: it is parsed whole, at the end.
    forced_text_.append(answer);
    if (!at_end) return;
    std::mt19937_64 rng(id_seed_);
    simdjson::dom::parser parser;
    simdjson::dom::element v;
    const bool parsed = !parser.parse(forced_text_).get(v);
    bool ok = false;
    if (parsed && forced_ == tool_choice_mode::named && v.is_object()) {
      out.calls.push_back({random_call_id(rng), forced_name_, simdjson::minify(v)});
      ok = true;
    } else if (parsed && forced_ == tool_choice_mode::required && v.is_array() && simdjson::dom::array(v).size() > 0) {
      std::vector<parsed_tool_call> calls;
      ok = true;
      for (simdjson::dom::element item : simdjson::dom::array(v)) {
        std::string name, arguments;
        if (!parse_call_object(simdjson::minify(item), &name, &arguments)) {
          ok = false;
          break;
        }
        calls.push_back({random_call_id(rng), std::move(name), std::move(arguments)});
      }
      if (ok) out.calls = std::move(calls);
    }
    // A constrained output that is not a complete call (cut by max_tokens): the text, as content.
    if (!ok) out.content += forced_text_;
    num_calls_ += static_cast<int32_t>(out.calls.size());
    return;
  }
  tool_parse_step step = tools_.feed(answer);
  if (at_end) {
    tool_parse_step last = tools_.finish();
    step.content += last.content;
    for (auto& c : last.calls) step.calls.push_back(std::move(c));
  }
  out.content += step.content;
  num_calls_ += static_cast<int32_t>(step.calls.size());
  for (auto& c : step.calls) out.calls.push_back(std::move(c));
}

chat_piece chat_output_stream::feed(std::string_view text) {
  chat_piece out;
  reasoning_step r = reasoning_.feed(text);
  out.reasoning = std::move(r.reasoning);
  take_answer(out, r.content, false);
  return out;
}

chat_piece chat_output_stream::finish() {
  chat_piece out;
  reasoning_step r = reasoning_.finish();
  out.reasoning = std::move(r.reasoning);
  take_answer(out, r.content, true);
  return out;
}

chat_piece parse_chat_output(const output_parsers& parsers, const tool_request& tools, std::string_view text) {
  chat_output_stream s(parsers, tools);
  chat_piece all = s.feed(text);
  chat_piece last = s.finish();
  all.reasoning += last.reasoning;
  all.content += last.content;
  for (auto& c : last.calls) all.calls.push_back(std::move(c));
  return all;
}

}  // namespace tessera::server
