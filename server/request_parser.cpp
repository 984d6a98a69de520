#include "server/request_parser.hpp"

#include <simdjson.h>
#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "engine/base/error.hpp"
#include "server/structured_output_request.hpp"

namespace tessera::server {

std::string error_body(const api_error& e) {
  boost::json::object inner;
  inner["message"] = e.what();
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? boost::json::value(nullptr) : boost::json::value(e.param);
  inner["code"] = e.code.empty() ? boost::json::value(nullptr) : boost::json::value(e.code);
  boost::json::object outer;
  outer["error"] = std::move(inner);
  return boost::json::serialize(outer);
}

namespace {

namespace sj = simdjson;
using element = sj::dom::element;

[[noreturn]] void bad(std::string_view field, std::string_view what) {
  throw api_error(400, "'" + std::string(field) + "' " + std::string(what), std::string(field));
}

double get_number(element v, std::string_view field) {
  double d = 0;
  if (v.is_double())
    d = double(v);
  else if (v.is_int64())
    d = double(int64_t(v));
  else if (v.is_uint64())
    d = double(uint64_t(v));
  else
    bad(field, "must be a number");
  if (!std::isfinite(d)) bad(field, "must be finite");
  return d;
}

float get_float(element v, std::string_view field, double lo, double hi) {
  const double d = get_number(v, field);
  if (d < lo || d > hi) {
    char text[96];
    std::snprintf(text, sizeof text, "must be between %g and %g", lo, hi);
    bad(field, text);
  }
  return static_cast<float>(d);
}

int64_t get_integer(element v, std::string_view field) {
  if (v.is_int64()) return int64_t(v);
  if (v.is_uint64()) bad(field, "is out of range");
  if (v.is_double()) {
    const double d = double(v);
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  bad(field, "must be an integer");
}

int32_t get_int(element v, std::string_view field, int64_t lo, int64_t hi) {
  const int64_t x = get_integer(v, field);
  if (x < lo || x > hi) bad(field, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return static_cast<int32_t>(x);
}

std::string get_string(element v, std::string_view field) {
  if (!v.is_string()) bad(field, "must be a string");
  return std::string(std::string_view(v));
}

bool get_bool(element v, std::string_view field) {
  if (!v.is_bool()) bad(field, "must be a boolean");
  return bool(v);
}

token_id get_token(element v, std::string_view field, int32_t vocab_size) {
  const int64_t x = get_integer(v, field);
  if (x < 0 || x >= vocab_size) {
    bad(field,
        "holds token id " + std::to_string(x) + " outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  }
  return static_cast<token_id>(x);
}

std::vector<token_id> get_token_ids(element v, std::string_view field, int32_t vocab_size, int32_t max_count) {
  if (!v.is_array()) bad(field, "must be an array of token ids");
  std::vector<token_id> ids;
  for (element t : sj::dom::array(v)) {
    if (static_cast<int64_t>(ids.size()) >= max_count)
      bad(field, "holds more than " + std::to_string(max_count) + " token ids");
    ids.push_back(get_token(t, field, vocab_size));
  }
  return ids;
}

element parse_object(sj::dom::parser& parser, const sj::padded_string& padded) {
  element doc;
  if (auto err = parser.parse(padded).get(doc)) {
    throw api_error(400, std::string("malformed JSON body: ") + sj::error_message(err), "", "invalid_json");
  }
  if (!doc.is_object()) throw api_error(400, "the request body must be a JSON object", "", "invalid_json");
  return doc;
}

// A chat message's content: a string or OpenAI's array of {"type": "text", "text": ...} parts.
std::string get_content(element v) {
  if (v.is_string()) return std::string(std::string_view(v));
  if (v.is_null()) return {};
  if (!v.is_array()) bad("messages.content", "must be a string or an array of text parts");
  std::string out;
  for (element part : sj::dom::array(v)) {
    element type, text;
    if (!part.is_object() || part["type"].get(type) || !type.is_string() || std::string_view(type) != "text" ||
        part["text"].get(text) || !text.is_string()) {
      bad("messages.content",
          "parts must be {\"type\": \"text\", \"text\": string} (other content types are not supported)");
    }
    out += std::string_view(text);
  }
  return out;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
// arguments is JSON text (OpenAI clients send a string; an object is accepted and serialized).
std::vector<chat_tool_call> get_tool_calls(element v, size_t message_index) {
  const std::string at = "messages[" + std::to_string(message_index) + "].tool_calls";
  if (!v.is_array()) bad(at, "must be an array");
  std::vector<chat_tool_call> calls;
  sj::dom::parser arguments_parser;
  for (element c : sj::dom::array(v)) {
    if (static_cast<int32_t>(calls.size()) >= k_max_tools) bad(at, "holds too many calls");
    const std::string ci = at + "[" + std::to_string(calls.size()) + "]";
    element id, fn, name, arguments, type;
    if (!c.is_object() || c["function"].get(fn) || !fn.is_object())
      bad(at, "items must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    if (!c["type"].get(type) && !type.is_null() && (!type.is_string() || std::string_view(type) != "function")) {
      bad(ci + ".type", "must be \"function\"");
    }
    chat_tool_call call;
    if (!c["id"].get(id) && !id.is_null()) call.id = get_string(id, ci + ".id");
    if (fn["name"].get(name)) bad(ci + ".function.name", "is required");
    call.name = get_string(name, ci + ".function.name");
    if (!fn["arguments"].get(arguments) && !arguments.is_null()) {
      if (arguments.is_string()) {
        call.arguments = std::string(std::string_view(arguments));
        element parsed;
        if (arguments_parser.parse(call.arguments).get(parsed)) bad(ci + ".function.arguments", "is not valid JSON");
      } else if (arguments.is_object()) {
        call.arguments = sj::minify(arguments);
      } else {
        bad(ci + ".function.arguments", "must be a JSON string");
      }
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

std::vector<chat_message> get_messages(element v, const request_limits& limits) {
  if (!v.is_array()) bad("messages", "must be an array of {role, content}");
  std::vector<chat_message> messages;
  for (element m : sj::dom::array(v)) {
    if (static_cast<int64_t>(messages.size()) >= limits.max_messages) bad("messages", "holds too many messages");
    if (!m.is_object()) bad("messages", "must be an array of {role, content} objects");
    element role, content;
    if (m["role"].get(role)) bad("messages.role", "is required");
    chat_message msg;
    msg.role = get_string(role, "messages.role");
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "developer" &&
        msg.role != "tool") {
      bad("messages.role", "must be system, developer, user, assistant or tool (got '" + msg.role + "')");
    }
    // The deprecated function-calling API: its turns cannot be rendered faithfully, so refused.
    element ignored;
    if (!m["function_call"].get(ignored)) bad("messages.function_call", "is not supported: use 'tool_calls'");
    const size_t index = messages.size();
    element calls, field;
    if (!m["tool_calls"].get(calls) && !calls.is_null()) {
      if (msg.role != "assistant") bad("messages.tool_calls", "is only allowed on assistant messages");
      msg.tool_calls = get_tool_calls(calls, index);
    }
    if (!m["tool_call_id"].get(field) && !field.is_null())
      msg.tool_call_id = get_string(field, "messages.tool_call_id");
    if (!m["name"].get(field) && !field.is_null()) msg.name = get_string(field, "messages.name");
    if (msg.role == "tool" && msg.tool_call_id.empty()) bad("messages.tool_call_id", "is required on tool messages");
    if (m["content"].get(content) || content.is_null()) {
      // An assistant turn that only calls tools has "content": null (or none at all).
      if (msg.tool_calls.empty()) {
        if (m["content"].get(content)) bad("messages.content", "is required");
      } else {
        msg.content_is_null = true;
      }
    }
    if (!msg.content_is_null) msg.content = get_content(content);
    messages.push_back(std::move(msg));
  }
  if (messages.empty()) bad("messages", "must not be empty");
  return messages;
}

void get_stop(element v, sampling_params& p, const request_limits& limits) {
  p.stop.clear();
  auto add = [&](element s) {
    std::string text = get_string(s, "stop");
    if (text.empty()) bad("stop", "strings must not be empty");
    if (static_cast<int32_t>(text.size()) > limits.sampling.max_stop_string_bytes) {
      bad("stop", "strings must be at most " + std::to_string(limits.sampling.max_stop_string_bytes) + " bytes");
    }
    if (static_cast<int32_t>(p.stop.size()) >= limits.sampling.max_stop_strings) {
      bad("stop", "holds more than " + std::to_string(limits.sampling.max_stop_strings) + " strings");
    }
    p.stop.push_back(std::move(text));
  };
  if (v.is_string())
    add(v);
  else if (v.is_array())
    for (element s : sj::dom::array(v)) add(s);
  else
    bad("stop", "must be a string or an array of strings");
}

// Fields some clients send that change nothing here.
bool is_ignored_field(std::string_view key) {
  return key == "user" || key == "store" || key == "metadata" || key == "service_tier" ||
         key == "skip_special_tokens" || key == "spaces_between_special_tokens";
}

// /v1/completions' "prompt", in OpenAI's four shapes: a string, an array of strings, an array of token
// ids, or an array of arrays of token ids (a batch). A problem names the field and, in a batch, the
// prompt ("prompt[2]").
// /v1/embeddings' "input" has the same shapes (`field` names it).
std::vector<actors::prompt_input> get_prompts(element v, int32_t vocab_size, const request_limits& limits,
                                              const std::string& field = "prompt") {
  constexpr std::string_view shapes =
      "must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
  auto bad_prompt = [&field](const std::string& at, std::string_view what) {
    throw api_error(400, "'" + at + "' " + std::string(what), field);
  };
  auto text_prompt = [&](element s, const std::string& at) {
    std::string text{std::string_view(s)};
    if (text.empty()) bad_prompt(at, "must not be empty");
    return actors::prompt_input::from_text(std::move(text));
  };
  auto ids_prompt = [&](element a, const std::string& at) {
    std::vector<token_id> ids = get_token_ids(a, at, vocab_size, limits.max_prompt_token_ids);
    if (ids.empty()) bad_prompt(at, "must not be empty");
    return actors::prompt_input::from_ids(std::move(ids));
  };
  std::vector<actors::prompt_input> prompts;
  if (v.is_string()) {
    prompts.push_back(text_prompt(v, field));
    return prompts;
  }
  if (!v.is_array()) bad_prompt(field, shapes);
  sj::dom::array arr(v);
  if (arr.size() == 0) bad_prompt(field, "must not be empty");
  element first = arr.at(0);
  if (!first.is_string() && !first.is_array()) {
    prompts.push_back(ids_prompt(v, field));  // one prompt of token ids
    return prompts;
  }
  if (arr.size() > static_cast<size_t>(limits.max_prompts)) {
    bad_prompt(field, "holds " + std::to_string(arr.size()) + " prompts, more than this server's limit of " +
                          std::to_string(limits.max_prompts));
  }
  for (element item : arr) {
    const std::string at = field + "[" + std::to_string(prompts.size()) + "]";
    // A batch is all strings or all token-id lists, as OpenAI's schema has it.
    if (first.is_string() && item.is_string())
      prompts.push_back(text_prompt(item, at));
    else if (first.is_array() && item.is_array())
      prompts.push_back(ids_prompt(item, at));
    else
      bad_prompt(at, first.is_string() ? "must be a string, as the batch's first prompt is"
                                       : "must be an array of token ids, as the batch's first prompt is");
  }
  return prompts;
}

// Names the chat template is always given (chat_template::render): a kwarg may not replace them.
bool is_reserved_template_variable(std::string_view name) {
  return name == "messages" || name == "tools" || name == "documents" || name == "bos_token" || name == "eos_token" ||
         name == "add_generation_prompt";
}

// The server's default chat_template_kwargs with the request's over them, key by key, as one JSON
// object's text (empty when neither has any). Every key must be a name the template can read and
// none may replace a variable the server sets; the default was checked the same way at startup
// (check_chat_template_kwargs), so a problem here is the request's.
std::string merged_template_kwargs(const std::string& defaults, const std::string& request) {
  if (defaults.empty() && request.empty()) return {};
  boost::json::object merged;
  if (!defaults.empty()) merged = boost::json::parse(defaults).as_object();
  if (!request.empty()) {
    const boost::json::value parsed = boost::json::parse(request);
    for (const auto& [k, v] : parsed.as_object()) {
      const std::string_view name(k.data(), k.size());
      if (is_reserved_template_variable(name)) {
        bad("chat_template_kwargs", "may not set '" + std::string(name) + "' (the server sets that variable)");
      }
      if (name.empty()) bad("chat_template_kwargs", "keys must not be empty");
      merged[k] = v;
    }
  }
  return boost::json::serialize(merged);
}

}  // namespace

generation_request parse_generation_request(std::string_view body, api_kind kind, int32_t vocab_size,
                                            const request_limits& limits) {
  sj::dom::parser parser;
  const sj::padded_string padded(body);
  element doc = parse_object(parser, padded);

  generation_request req;
  req.kind = kind;
  sampling_params& p = req.params;
  p.max_tokens = kind == api_kind::chat ? limits.default_chat_max_tokens : limits.default_completion_max_tokens;
  bool have_prompt = false, have_messages = false;
  bool have_max_tokens = false;
  std::string_view max_tokens_key = "max_tokens";
  bool parse_special = true;
  bool have_tools = false;
  std::string request_kwargs;  // chat_template_kwargs as sent (a JSON object's text)
  int32_t truncate_prompt_tokens = limits.allow_truncation ? -1 : 0;
  int32_t completion_logprobs = -1;
  bool chat_logprobs = false;
  int32_t top_logprobs = -1;
  int32_t prompt_logprobs = -1;
  structured_output_fields structured;

  for (auto [key, value] : sj::dom::object(doc)) {
    if (value.is_null() && key != "prompt" && key != "messages") continue;  // null: the default
    if (key == "model") {
      req.model = get_string(value, key);
    } else if (key == "prompt") {
      if (kind == api_kind::chat) bad(key, "is not a chat completions field (use 'messages')");
      have_prompt = true;
      std::vector<actors::prompt_input> prompts = get_prompts(value, vocab_size, limits);
      req.prompt = std::move(prompts.front());
      req.more_prompts.assign(std::make_move_iterator(prompts.begin() + 1), std::make_move_iterator(prompts.end()));
    } else if (key == "messages") {
      if (kind == api_kind::completion) bad(key, "is not a completions field (use /v1/chat/completions)");
      have_messages = true;
      req.prompt = actors::prompt_input::from_chat(get_messages(value, limits));
    } else if (key == "truncate_prompt_tokens") {
      truncate_prompt_tokens = get_int(value, key, -1, limits.max_prompt_token_ids);
      if (truncate_prompt_tokens == 0) bad(key, "must be -1 (keep what fits the context) or at least 1");
    } else if (key == "parse_special") {
      if (kind == api_kind::chat)
        bad(key, "is a completions field (a chat template's special tokens are always parsed)");
      parse_special = get_bool(value, key);
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      // 0 is checked below: only with echo (the prompt alone, as OpenAI and vLLM answer it).
      p.max_tokens = get_int(value, key, 0, limits.max_tokens);
      have_max_tokens = true;
      max_tokens_key = key;  // an error names the field the client sent
    } else if (key == "min_tokens") {
      p.min_tokens = get_int(value, key, 0, limits.max_tokens);
    } else if (key == "n") {
      p.n = get_int(value, key, 1, limits.sampling.max_n);
    } else if (key == "best_of") {
      const int32_t best_of = get_int(value, key, 1, limits.sampling.max_n);
      if (best_of != 1) bad(key, "values other than 1 are not supported");
    } else if (key == "temperature") {
      p.temperature = get_float(value, key, 0.0, 2.0);
    } else if (key == "top_p") {
      p.top_p = get_float(value, key, 0.0, 1.0);
      if (p.top_p <= 0.0f) bad(key, "must be greater than 0");
    } else if (key == "top_k") {
      p.top_k = get_int(value, key, -1, vocab_size);
    } else if (key == "min_p") {
      p.min_p = get_float(value, key, 0.0, 1.0);
    } else if (key == "repetition_penalty") {
      p.repetition_penalty = get_float(value, key, 0.0, 100.0);
      if (p.repetition_penalty <= 0.0f) bad(key, "must be greater than 0");
    } else if (key == "presence_penalty") {
      p.presence_penalty = get_float(value, key, -2.0, 2.0);
    } else if (key == "frequency_penalty") {
      p.frequency_penalty = get_float(value, key, -2.0, 2.0);
    } else if (key == "seed") {
      const int64_t seed = get_integer(value, key);
      p.seed = static_cast<uint64_t>(seed);
    } else if (key == "stop") {
      get_stop(value, p, limits);
    } else if (key == "stop_token_ids") {
      p.stop_token_ids = get_token_ids(value, key, vocab_size, limits.sampling.max_stop_token_ids);
    } else if (key == "logit_bias") {
      if (!value.is_object()) bad(key, "must be an object mapping token ids to biases");
      p.logit_bias.clear();
      for (auto [tok, bias] : sj::dom::object(value)) {
        if (static_cast<int32_t>(p.logit_bias.size()) >= limits.sampling.max_logit_bias_entries) {
          bad(key, "holds more than " + std::to_string(limits.sampling.max_logit_bias_entries) + " entries");
        }
        // A key is a token id written canonically: "0" or digits without a leading zero; "01", "+1",
        // " 1" and "1.0" (which strtoll or JSON number rules would accept) are refused, so that two
        // different keys can never name the same token.
        const std::string_view text(tok);
        const bool canonical = !text.empty() && text.size() <= 10 && (text == "0" || text.front() != '0') &&
                               std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
        const long long id = canonical ? std::stoll(std::string(text)) : -1;
        if (!canonical || id >= vocab_size) {
          bad(key, "keys must be token ids in [0, " + std::to_string(vocab_size) +
                       ") written as plain integers (got '" + std::string(text) + "')");
        }
        const double lim = limits.sampling.max_abs_logit_bias;
        p.logit_bias.emplace_back(static_cast<token_id>(id), get_float(bias, key, -lim, lim));
      }
    } else if (key == "logprobs") {
      if (kind == api_kind::chat) {
        chat_logprobs = get_bool(value, key);
      } else {
        if (value.is_bool()) bad(key, "must be an integer (the number of top logprobs)");
        completion_logprobs = get_int(value, key, 0, limits.max_completion_logprobs);
      }
    } else if (key == "top_logprobs") {
      if (kind != api_kind::chat) bad(key, "is a chat completions field (use 'logprobs')");
      top_logprobs = get_int(value, key, 0, limits.sampling.max_logprobs);
    } else if (key == "prompt_logprobs") {
      // vLLM's: each prompt token's logprob with this many top tokens (the choices' or, for chat, the
      // response's "prompt_logprobs").
      if (value.is_bool()) bad(key, "must be an integer (the number of top logprobs per prompt token)");
      prompt_logprobs = get_int(value, key, 0, limits.sampling.max_logprobs);
    } else if (key == "stream") {
      req.stream = get_bool(value, key);
    } else if (key == "stream_options") {
      if (!value.is_object()) bad(key, "must be an object");
      for (auto [k, v] : sj::dom::object(value)) {
        if (k == "include_usage")
          req.include_usage = get_bool(v, "stream_options.include_usage");
        else if (k != "continuous_usage_stats")
          bad("stream_options." + std::string(k), "is not supported");
      }
    } else if (key == "ignore_eos") {
      p.ignore_eos = get_bool(value, key);
    } else if (key == "speculative") {
      // Tessera extension: false keeps this request off speculative decoding (docs/speculative.md).
      p.speculative = get_bool(value, key);
    } else if (key == "include_stop_str_in_output") {
      p.include_stop_str_in_output = get_bool(value, key);
    } else if (key == "priority") {
      req.priority = get_int(value, key, -limits.max_priority, limits.max_priority);
    } else if (key == "echo") {
      if (kind == api_kind::chat) bad(key, "is a completions field");
      req.echo = get_bool(value, key);
    } else if (key == "suffix") {
      bad(key, "is not supported");
    } else if (key == "chat_template") {
      throw api_error(400, "'chat_template': request-supplied chat templates are refused", "chat_template");
    } else if (key == "chat_template_kwargs") {
      if (kind != api_kind::chat) bad(key, "is a chat completions field");
      if (!value.is_object()) bad(key, "must be an object (its keys become variables of the chat template)");
      request_kwargs = sj::minify(value);
    } else if (is_structured_output_field(key)) {
      parse_structured_output_field(key, value, structured);
    } else if (key == "tools" || key == "tool_choice" || key == "parallel_tool_calls") {
      if (kind != api_kind::chat) bad(key, "is a chat completions field");
      if (key == "tools") {
        parse_tools(sj::minify(value), req.tools);
        have_tools = true;
      } else if (key == "tool_choice") {
        parse_tool_choice(sj::minify(value), req.tools);
      } else {
        req.tools.parallel_tool_calls = get_bool(value, key);
      }
    } else if (key == "functions" || key == "function_call") {
      bad(key, "(the deprecated function-calling API) is not supported: use 'tools' and 'tool_choice'");
    } else if (key == "user") {
      req.user = get_string(value, key);
    } else if (is_ignored_field(key)) {
      // accepted for compatibility; changes nothing
    } else {
      bad(key, "is not a recognized request field");
    }
  }

  if (kind == api_kind::completion && !have_prompt) throw api_error(400, "'prompt' is required", "prompt");
  if (kind == api_kind::chat && !have_messages) throw api_error(400, "'messages' is required", "messages");
  if (have_prompt && req.prompt.type == actors::prompt_input::kind::text && req.prompt.text.empty()) {
    bad("prompt", "must not be empty");
  }
  // vLLM: a max_tokens the client asked for must fit the context with the prompt (else 400, checked
  // by the engine once the prompt is tokenized); the default one ends at the context instead.
  p.truncate_to_context = !have_max_tokens;
  if (kind == api_kind::chat) {
    check_tool_request(req.tools, have_tools);
    if (req.tools.choice != tool_choice_mode::none) req.prompt.tools_json = req.tools.tools_json;
    if (req.tools.forced()) {
      // required / a named function: the grammar makes every output a valid call. Without a grammar
      // backend the engine refuses the request ("'tool_choice': structured output is not available").
      if (structured.spec) {
        bad("tool_choice", "cannot be combined with '" + structured.field + "' (both constrain the output)");
      }
      structured_output_spec spec;
      spec.type = structured_output_spec::kind::json_schema;
      spec.source = forced_call_schema(req.tools);
      spec.field = "tool_choice";
      structured.spec = std::move(spec);
      structured.field = "tool_choice";
    }
  }
  if (p.min_tokens > p.max_tokens) bad("min_tokens", "must not exceed max_tokens");
  req.prompt.parse_special = parse_special;  // text prompts only (prompt_input::parse_special)
  req.prompt.truncate_prompt_tokens = truncate_prompt_tokens;
  for (auto& more : req.more_prompts) {
    more.parse_special = parse_special;
    more.truncate_prompt_tokens = truncate_prompt_tokens;
  }
  if (kind == api_kind::chat) {
    req.prompt.template_kwargs_json = merged_template_kwargs(limits.default_chat_template_kwargs, request_kwargs);
  }

  if (kind == api_kind::chat) {
    if (top_logprobs >= 0 && !chat_logprobs) bad("top_logprobs", "needs 'logprobs': true");
    req.want_logprobs = chat_logprobs;
    req.top_logprobs = std::max(top_logprobs, 0);
  } else {
    req.want_logprobs = completion_logprobs >= 0;
    req.top_logprobs = std::max(completion_logprobs, 0);
  }
  p.logprobs = req.want_logprobs ? req.top_logprobs : -1;
  // Echo with logprobs covers the prompt's tokens too (their logprobs, computed by the engine: the first
  // token has none), as vLLM and OpenAI answer it; prompt_logprobs asks for them on its own.
  req.prompt_logprobs = prompt_logprobs;
  req.echo_logprobs = req.echo && req.want_logprobs;
  p.prompt_logprobs = std::max(prompt_logprobs, req.echo_logprobs ? req.top_logprobs : -1);
  if (p.max_tokens == 0 && !req.echo) {
    bad(max_tokens_key, "must be at least 1 (0 only with 'echo': the prompt alone, with its logprobs when asked for)");
  }
  if (req.include_usage && !req.stream) bad("stream_options", "is only allowed with 'stream': true");
  p.structured = std::move(structured.spec);

  try {
    p.validate(vocab_size, limits.sampling);
  } catch (const invalid_request& e) {
    // validate() names the parameter ("sampling parameter 'X' ..."): it becomes the error's param.
    const std::string_view what = e.what();
    constexpr std::string_view prefix = "sampling parameter '";
    std::string param;
    if (what.starts_with(prefix)) {
      const size_t end = what.find('\'', prefix.size());
      if (end != std::string_view::npos) param = std::string(what.substr(prefix.size(), end - prefix.size()));
    }
    throw api_error(400, e.what(), param);
  }
  const int64_t response_bytes = estimated_response_bytes(req, limits);
  if (response_bytes > limits.max_response_bytes) {
    throw api_error(400,
                    "the response could take " + std::to_string(response_bytes) +
                        " bytes (n x max_tokens x logprobs), "
                        "more than this server's limit of " +
                        std::to_string(limits.max_response_bytes) +
                        " (--max-response-bytes): lower n, max_tokens or the number of logprobs",
                    "max_tokens", "response_too_large");
  }
  return req;
}

void check_chat_template_kwargs(std::string_view json_text) {
  boost::json::error_code ec;
  const boost::json::value v = boost::json::parse(json_text, ec);
  if (ec || !v.is_object())
    throw invalid_request("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
  for (const auto& [k, value] : v.as_object()) {
    if (is_reserved_template_variable(std::string_view(k.data(), k.size())))
      throw invalid_request("--chat-template-kwargs may not set '" + std::string(k) +
                            "' (the server sets that variable)");
  }
}

namespace {

// The most tokens `prompt` can have: a token-id prompt's count; a text prompt's bytes plus a BOS
// (every token covers at least one byte of text) within max_model_len; a chat's max_model_len (its
// rendered text is not known here). 0 with neither bound known.
int64_t prompt_token_bound(const actors::prompt_input& prompt, const request_limits& limits) {
  const int64_t context = limits.max_model_len > 0 ? limits.max_model_len : 0;
  int64_t n = 0;
  if (prompt.type == actors::prompt_input::kind::token_ids) {
    n = static_cast<int64_t>(prompt.ids.size());
  } else if (prompt.type == actors::prompt_input::kind::text) {
    n = static_cast<int64_t>(prompt.text.size()) + 1;
  } else {
    n = context;
  }
  return context > 0 ? std::min(n, context) : n;
}

}  // namespace

int64_t estimated_response_bytes(const generation_request& req, const request_limits& limits) {
  int64_t tokens = req.params.max_tokens;
  if (limits.max_model_len > 0) tokens = std::min<int64_t>(tokens, limits.max_model_len);
  const int64_t per_token = k_response_bytes_per_token +
                            (req.want_logprobs ? (1 + int64_t{req.top_logprobs}) * k_response_bytes_per_logprob : 0);
  int64_t bytes = int64_t{num_prompts(req)} * req.params.n * tokens * per_token;
  // Prompt logprobs: per prompt token, per choice with echo and once more for a prompt_logprobs field.
  if (req.params.prompt_logprobs >= 0) {
    const int64_t per_prompt_token = (2 + int64_t{req.params.prompt_logprobs}) * k_response_bytes_per_logprob;
    const int64_t copies = (req.echo_logprobs ? req.params.n : 0) + (req.prompt_logprobs >= 0 ? req.params.n : 0);
    int64_t prompt_tokens = prompt_token_bound(req.prompt, limits);
    for (const auto& more : req.more_prompts) prompt_tokens += prompt_token_bound(more, limits);
    bytes += prompt_tokens * copies * per_prompt_token;
  }
  return bytes;
}

generation_request parse_embedding_request(std::string_view body, int32_t vocab_size, int32_t hidden_size,
                                           const request_limits& limits) {
  sj::dom::parser parser;
  const sj::padded_string padded(body);
  element doc = parse_object(parser, padded);
  generation_request req;
  req.kind = api_kind::embedding;
  bool have_input = false, add_special = true;
  for (auto [key, value] : sj::dom::object(doc)) {
    if (value.is_null() && key != "input") continue;  // null: the default
    if (key == "model") {
      req.model = get_string(value, key);
    } else if (key == "input") {
      have_input = true;
      std::vector<actors::prompt_input> inputs = get_prompts(value, vocab_size, limits, "input");
      req.prompt = std::move(inputs.front());
      req.more_prompts.assign(std::make_move_iterator(inputs.begin() + 1), std::make_move_iterator(inputs.end()));
    } else if (key == "encoding_format") {
      const std::string format = get_string(value, key);
      if (format != "float" && format != "base64") bad(key, "must be 'float' or 'base64'");
      req.embedding_base64 = format == "base64";
    } else if (key == "dimensions") {
      // OpenAI's matryoshka truncation: only models trained for it keep their meaning when cut, which a
      // generative model's hidden state is not; so only the full size is accepted (as vLLM does for
      // models without matryoshka support).
      const int64_t d = get_integer(value, key);
      if (d != hidden_size) {
        bad(key, "must be " + std::to_string(hidden_size) +
                     ", this model's embedding size (truncated embeddings are not supported)");
      }
    } else if (key == "user") {
      req.user = get_string(value, key);
    } else if (key == "add_special_tokens") {
      add_special = get_bool(value, key);
    } else {
      bad(key, "is not a recognized request field");
    }
  }
  if (!have_input) throw api_error(400, "'input' is required", "input");
  req.prompt.add_special = add_special;  // text inputs only (prompt_input::add_special)
  for (auto& more : req.more_prompts) more.add_special = add_special;
  req.params.max_tokens = 1;  // nothing is generated
  return req;
}

tokenize_request parse_tokenize_request(std::string_view body) {
  sj::dom::parser parser;
  const sj::padded_string padded(body);
  element doc = parse_object(parser, padded);
  tokenize_request req;
  bool have_prompt = false;
  for (auto [key, value] : sj::dom::object(doc)) {
    if (key == "prompt") {
      req.prompt = get_string(value, key);
      have_prompt = true;
    } else if (key == "messages") {
      req.messages = get_messages(value, request_limits{});
      req.is_chat = true;
    } else if (key == "add_special_tokens") {
      req.add_special_tokens = get_bool(value, key);
    } else if (key == "parse_special") {
      req.parse_special = get_bool(value, key);
    } else if (key == "model" || key == "add_generation_prompt") {
    } else {
      bad(key, "is not a recognized request field");
    }
  }
  if (have_prompt == req.is_chat) throw api_error(400, "give exactly one of 'prompt' or 'messages'", "prompt");
  return req;
}

std::vector<token_id> parse_detokenize_request(std::string_view body, int32_t vocab_size,
                                               const request_limits& limits) {
  sj::dom::parser parser;
  const sj::padded_string padded(body);
  element doc = parse_object(parser, padded);
  std::vector<token_id> ids;
  bool have_tokens = false;
  for (auto [key, value] : sj::dom::object(doc)) {
    if (key == "tokens") {
      ids = get_token_ids(value, key, vocab_size, limits.max_prompt_token_ids);
      have_tokens = true;
    } else if (key != "model") {
      bad(key, "is not a recognized request field");
    }
  }
  if (!have_tokens) throw api_error(400, "'tokens' is required", "tokens");
  return ids;
}

}  // namespace tessera::server
