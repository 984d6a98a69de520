#include "server/responses_request.hpp"

#include <boost/json.hpp>

namespace tessera::server {

namespace json = boost::json;

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw api_error(400, "'" + field + "' " + what, field);
}

// Fields whose meaning is the chat request's, under the same name and checked by its parser.
bool is_passed_through(std::string_view key) {
  return key == "model" || key == "temperature" || key == "top_p" || key == "top_k" || key == "min_p" ||
         key == "seed" || key == "repetition_penalty" || key == "presence_penalty" || key == "frequency_penalty" ||
         key == "priority" || key == "stream";
}

// Fields that change nothing here (OpenAI's routing, caching and safety hints).
bool is_ignored(std::string_view key) {
  return key == "service_tier" || key == "safety_identifier" || key == "prompt_cache_key" ||
         key == "prompt_cache_retention" || key == "parallel_tool_calls" || key == "max_tool_calls";
}

std::string text_of_part(const json::value& part, const std::string& at, const std::string& role) {
  const json::object* o = part.if_object();
  const json::value* type = o ? o->if_contains("type") : nullptr;
  const json::value* text = o ? o->if_contains("text") : nullptr;
  if (!type || !type->is_string()) bad(at + ".type", "is required: {\"type\": \"input_text\", \"text\": string}");
  const std::string_view t = type->get_string();
  // output_text: an assistant turn of an earlier response, sent back as history.
  if (t != "input_text" && !(t == "output_text" && role == "assistant")) {
    bad(at + ".type", "'" + std::string(t) + "' is not supported: only text parts (input_text" +
                          (role == "assistant" ? ", output_text" : "") + ") are (no images, files or audio)");
  }
  if (!text || !text->is_string()) bad(at + ".text", "must be a string");
  return std::string(text->get_string());
}

json::object message_of_item(const json::value& item, const std::string& at) {
  const json::object* o = item.if_object();
  if (!o) bad(at, "must be a message {\"role\", \"content\"}");
  if (const json::value* type = o->if_contains("type"); type && !type->is_null()) {
    if (!type->is_string()) bad(at + ".type", "must be a string");
    if (type->get_string() != "message") {
      bad(at + ".type", "'" + std::string(type->get_string()) +
                            "' is not supported: only message items are (no tool calls, reasoning or stored items)");
    }
  }
  const json::value* role = o->if_contains("role");
  if (!role || !role->is_string()) bad(at + ".role", "is required (user, system, developer or assistant)");
  const std::string r(role->get_string());
  if (r != "user" && r != "system" && r != "developer" && r != "assistant")
    bad(at + ".role", "must be user, system, developer or assistant (got '" + r + "')");
  const json::value* content = o->if_contains("content");
  if (!content) bad(at + ".content", "is required");
  std::string text;
  if (content->is_string()) {
    text = content->get_string();
  } else if (content->is_array()) {
    const json::array& parts = content->get_array();
    for (size_t j = 0; j < parts.size(); ++j)
      text += text_of_part(parts[j], at + ".content[" + std::to_string(j) + "]", r);
  } else {
    bad(at + ".content", "must be a string or an array of {\"type\": \"input_text\", \"text\"} parts");
  }
  for (const auto& [k, v] : *o) {
    // id and status: on a message of an earlier response's output, sent back as history.
    if (k != "type" && k != "role" && k != "content" && k != "id" && k != "status")
      bad(at + "." + std::string(k), "is not a recognized message field");
  }
  return json::object{{"role", r}, {"content", std::move(text)}};
}

// The chat parser's names for a field -> the Responses API's, in an error it raised.
api_error renamed(const api_error& e) {
  std::string message = e.what();
  std::string param = e.param;
  auto rename = [&](std::string_view from, std::string_view to) {
    if (param.starts_with(from)) param = std::string(to) + param.substr(from.size());
    for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
      message.replace(at, from.size(), to);
  };
  rename("max_tokens", "max_output_tokens");
  rename("messages", "input");
  api_error out(e.status, message, param, e.code);
  return out;
}

}  // namespace

responses_request parse_responses_request(std::string_view body, int32_t vocab_size, const request_limits& limits) {
  json::error_code ec;
  const json::value doc = json::parse(body, ec);
  if (ec) throw api_error(400, "malformed JSON body: " + ec.message(), "", "invalid_json");
  if (!doc.is_object()) throw api_error(400, "the request body must be a JSON object", "", "invalid_json");

  responses_request out;
  json::object chat;
  json::array messages;
  const json::value* input = nullptr;
  for (const auto& [k, value] : doc.get_object()) {
    const std::string key(k);
    if (key == "input") {
      input = &value;
      continue;
    }
    if (value.is_null()) continue;  // null: the default
    if (is_passed_through(key)) {
      chat[key] = value;
    } else if (key == "instructions") {
      if (!value.is_string()) bad(key, "must be a string");
      out.echo.instructions = std::string(value.get_string());
    } else if (key == "max_output_tokens") {
      if (!value.is_int64() || value.get_int64() < 1 || value.get_int64() > limits.max_tokens)
        bad(key, "must be an integer between 1 and " + std::to_string(limits.max_tokens));
      out.echo.max_output_tokens = static_cast<int32_t>(value.get_int64());
      chat["max_tokens"] = value;
    } else if (key == "user") {
      if (!value.is_string()) bad(key, "must be a string");
      out.echo.user = std::string(value.get_string());
      chat["user"] = value;
    } else if (key == "store") {
      if (!value.is_bool()) bad(key, "must be a boolean");  // true: answered with "store": false (see header)
    } else if (key == "metadata") {
      // OpenAI's bounds: 16 pairs, keys of 64 characters, string values of 512.
      if (!value.is_object() || value.get_object().size() > 16) bad(key, "must be an object of at most 16 strings");
      for (const auto& [mk, mv] : value.get_object()) {
        if (mk.size() > 64 || !mv.is_string() || mv.get_string().size() > 512)
          bad(key, "keys must be at most 64 characters and values strings of at most 512");
      }
      out.echo.metadata_json = json::serialize(value);
    } else if (key == "previous_response_id" || key == "conversation") {
      bad(key,
          "is not supported: this server stores no responses or conversations (send the whole "
          "conversation in 'input')");
    } else if (key == "background") {
      if (!value.is_bool()) bad(key, "must be a boolean");
      if (value.get_bool())
        bad(key, "is not supported: a background response needs a response store, and this server has none");
    } else if (key == "prompt") {
      bad(key, "(a stored prompt template) is not supported: send the text in 'input'");
    } else if (key == "tools") {
      if (!value.is_array()) bad(key, "must be an array");
      if (!value.get_array().empty()) {
        bad(key,
            "are not supported on /v1/responses here (plain text input and output only): use "
            "/v1/chat/completions for tool calling");
      }
    } else if (key == "tool_choice") {
      if (!value.is_string() || (value.get_string() != "none" && value.get_string() != "auto"))
        bad(key, "must be \"none\" or \"auto\" (tools are not supported on /v1/responses here)");
    } else if (key == "text") {
      const json::object* t = value.if_object();
      if (!t) bad(key, "must be an object");
      for (const auto& [tk, tv] : *t) {
        if (tk == "format") {
          const json::object* f = tv.if_object();
          const json::value* type = f ? f->if_contains("type") : nullptr;
          if (!tv.is_null() && (!type || !type->is_string() || type->get_string() != "text"))
            bad("text.format",
                "must be {\"type\": \"text\"} here (structured output: /v1/chat/completions' "
                "response_format)");
        } else if (tk != "verbosity") {
          bad("text." + std::string(tk), "is not supported");
        }
      }
    } else if (key == "reasoning") {
      bad(key, "is not supported (no reasoning-effort control for these models)");
    } else if (key == "truncation") {
      if (!value.is_string() || (value.get_string() != "auto" && value.get_string() != "disabled"))
        bad(key, "must be \"auto\" or \"disabled\"");
      out.echo.truncation = std::string(value.get_string());
      // auto: a conversation too long keeps its end that fits the context (vLLM's truncate_prompt_tokens -1).
      if (value.get_string() == "auto") chat["truncate_prompt_tokens"] = -1;
    } else if (key == "include") {
      if (!value.is_array()) bad(key, "must be an array");
      if (!value.get_array().empty()) bad(key, "is not supported (no extra output data: logprobs, sources, ...)");
    } else if (key == "top_logprobs") {
      if (!value.is_int64() || value.get_int64() != 0) bad(key, "is not supported on /v1/responses here (only 0)");
    } else if (key == "stream_options") {
      const json::object* so = value.if_object();
      if (!so) bad(key, "must be an object");
      for (const auto& [sk, sv] : *so) {
        if (sk != "include_obfuscation") bad("stream_options." + std::string(sk), "is not supported");
      }
    } else if (is_ignored(key)) {
      // accepted for compatibility; changes nothing
    } else {
      bad(key, "is not a recognized request field");
    }
  }

  if (!input || input->is_null()) throw api_error(400, "'input' is required", "input");
  if (out.echo.instructions) messages.push_back(json::object{{"role", "system"}, {"content", *out.echo.instructions}});
  if (input->is_string()) {
    messages.push_back(json::object{{"role", "user"}, {"content", input->get_string()}});
  } else if (input->is_array()) {
    const json::array& items = input->get_array();
    if (items.empty()) bad("input", "must not be empty");
    if (static_cast<int64_t>(items.size()) > limits.max_messages) bad("input", "holds too many items");
    for (size_t i = 0; i < items.size(); ++i)
      messages.push_back(message_of_item(items[i], "input[" + std::to_string(i) + "]"));
  } else {
    bad("input", "must be a string or an array of message items");
  }
  chat["messages"] = std::move(messages);
  try {
    out.chat = parse_generation_request(json::serialize(chat), api_kind::chat, vocab_size, limits);
  } catch (const api_error& e) { throw renamed(e); }
  return out;
}

}  // namespace tessera::server
