#include "app/request_json.hpp"

#include <simdjson.h>
#include <boost/json.hpp>
#include <cmath>

#include "engine/base/error.hpp"

namespace tessera::app {

namespace {

namespace sj = simdjson;

[[noreturn]] void fail(int64_t line, std::string_view field, std::string_view what) {
  throw invalid_request("line " + std::to_string(line) + ": '" + std::string(field) + "' " + std::string(what));
}

double get_number(sj::dom::element v, int64_t line, std::string_view field) {
  if (v.is_double()) return double(v);
  if (v.is_int64()) return double(int64_t(v));
  if (v.is_uint64()) return double(uint64_t(v));
  fail(line, field, "must be a number");
}

int64_t get_integer(sj::dom::element v, int64_t line, std::string_view field) {
  if (v.is_int64()) return int64_t(v);
  if (v.is_double()) {
    double d = double(v);
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  fail(line, field, "must be an integer");
}

int32_t get_int32(sj::dom::element v, int64_t line, std::string_view field) {
  int64_t x = get_integer(v, line, field);
  if (x < INT32_MIN || x > INT32_MAX) fail(line, field, "is out of range");
  return static_cast<int32_t>(x);
}

std::string get_string(sj::dom::element v, int64_t line, std::string_view field) {
  if (!v.is_string()) fail(line, field, "must be a string");
  return std::string(std::string_view(v));
}

bool get_bool(sj::dom::element v, int64_t line, std::string_view field) {
  if (!v.is_bool()) fail(line, field, "must be true or false");
  return bool(v);
}

}  // namespace

offline_request parse_offline_request(std::string_view text, int64_t line, const sampling_params& defaults) {
  sj::dom::parser parser;
  sj::padded_string padded(text);
  sj::dom::element doc;
  if (auto err = parser.parse(padded).get(doc)) {
    throw invalid_request("line " + std::to_string(line) + ": malformed JSON (" + sj::error_message(err) + ")");
  }
  if (!doc.is_object()) throw invalid_request("line " + std::to_string(line) + ": expected a JSON object");

  offline_request req;
  req.id = std::to_string(line);
  req.params = defaults;
  sampling_params& p = req.params;
  for (auto [key, value] : sj::dom::object(doc)) {
    if (key == "id") {
      req.id = value.is_string() ? std::string(std::string_view(value)) : sj::minify(value);
    } else if (key == "prompt") {
      req.prompt = get_string(value, line, key);
    } else if (key == "messages") {
      if (!value.is_array()) fail(line, key, "must be an array of {role, content}");
      std::vector<chat_message> messages;
      for (sj::dom::element m : sj::dom::array(value)) {
        if (!m.is_object()) fail(line, key, "must be an array of {role, content}");
        chat_message msg;
        sj::dom::element role, content;
        if (m["role"].get(role) || m["content"].get(content)) fail(line, key, "entries need 'role' and 'content'");
        msg.role = get_string(role, line, "messages.role");
        msg.content = get_string(content, line, "messages.content");
        messages.push_back(std::move(msg));
      }
      req.messages = std::move(messages);
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      p.max_tokens = get_int32(value, line, key);
    } else if (key == "min_tokens") {
      p.min_tokens = get_int32(value, line, key);
    } else if (key == "n") {
      p.n = get_int32(value, line, key);
    } else if (key == "temperature") {
      p.temperature = static_cast<float>(get_number(value, line, key));
    } else if (key == "top_p") {
      p.top_p = static_cast<float>(get_number(value, line, key));
    } else if (key == "top_k") {
      p.top_k = get_int32(value, line, key);
    } else if (key == "min_p") {
      p.min_p = static_cast<float>(get_number(value, line, key));
    } else if (key == "repetition_penalty") {
      p.repetition_penalty = static_cast<float>(get_number(value, line, key));
    } else if (key == "presence_penalty") {
      p.presence_penalty = static_cast<float>(get_number(value, line, key));
    } else if (key == "frequency_penalty") {
      p.frequency_penalty = static_cast<float>(get_number(value, line, key));
    } else if (key == "seed") {
      if (!value.is_null()) p.seed = static_cast<uint64_t>(get_integer(value, line, key));
    } else if (key == "ignore_eos") {
      p.ignore_eos = get_bool(value, line, key);
    } else if (key == "logprobs") {
      p.logprobs = value.is_bool() ? (bool(value) ? 0 : -1) : get_int32(value, line, key);
    } else if (key == "stop") {
      p.stop.clear();
      if (value.is_string()) {
        p.stop.push_back(get_string(value, line, key));
      } else if (value.is_array()) {
        for (sj::dom::element s : sj::dom::array(value)) p.stop.push_back(get_string(s, line, key));
      } else if (!value.is_null()) {
        fail(line, key, "must be a string or an array of strings");
      }
    } else if (key == "stop_token_ids") {
      if (!value.is_array()) fail(line, key, "must be an array of token ids");
      p.stop_token_ids.clear();
      for (sj::dom::element s : sj::dom::array(value)) p.stop_token_ids.push_back(get_int32(s, line, key));
    } else if (key == "logit_bias") {
      if (!value.is_object()) fail(line, key, "must be an object {token id: bias}");
      p.logit_bias.clear();
      for (auto [tok, bias] : sj::dom::object(value)) {
        char* end = nullptr;
        std::string tok_text(tok);
        long id = std::strtol(tok_text.c_str(), &end, 10);
        if (tok_text.empty() || *end != '\0' || id < 0 || id > INT32_MAX) fail(line, key, "keys must be token ids");
        p.logit_bias.emplace_back(static_cast<token_id>(id), static_cast<float>(get_number(bias, line, key)));
      }
    } else if (key == "priority") {
      req.priority = get_int32(value, line, key);
    } else if (key == "include_stop_str_in_output") {
      p.include_stop_str_in_output = get_bool(value, line, key);
    } else if (key == "skip_special_tokens") {
      p.skip_special_tokens = get_bool(value, line, key);
    } else if (key == "model" || key == "user" || key == "stream") {
      // accepted for compatibility with API request bodies; meaningless offline
    } else {
      fail(line, key, "is not a known request field");
    }
  }
  if (req.prompt.has_value() == req.messages.has_value()) {
    throw invalid_request("line " + std::to_string(line) + ": give exactly one of 'prompt' or 'messages'");
  }
  return req;
}

std::string format_offline_result(const offline_result& r) {
  boost::json::object out;
  out["id"] = r.id;
  if (!r.error.empty()) {
    out["error"] = r.error;
    return boost::json::serialize(out);
  }
  out["text"] = r.texts.empty() ? std::string() : r.texts.front();
  out["finish_reason"] = r.finish_reasons.empty() ? std::string() : r.finish_reasons.front();
  if (r.texts.size() > 1) {
    boost::json::array choices;
    for (size_t i = 0; i < r.texts.size(); ++i) {
      choices.push_back(
          boost::json::object{{"index", i}, {"text", r.texts[i]}, {"finish_reason", r.finish_reasons[i]}});
    }
    out["choices"] = std::move(choices);
  }
  out["usage"] = boost::json::object{{"prompt_tokens", r.prompt_tokens},
                                     {"completion_tokens", r.completion_tokens},
                                     {"total_tokens", r.prompt_tokens + r.completion_tokens}};
  return boost::json::serialize(out);
}

}  // namespace tessera::app
