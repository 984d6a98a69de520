#include "server/ws_message.hpp"

namespace tessera::server {

bool ws_text_is_valid(std::string_view payload) { return simdjson::validate_utf8(payload.data(), payload.size()); }

void parse_ws_envelope(std::string_view text, ws_envelope& out) {
  const simdjson::padded_string padded(text);
  if (out.parser_.parse(padded).get(out.doc) || !out.doc.is_object()) {
    throw api_error(400, "messages must be JSON objects", "", "invalid_json");
  }
  std::string_view type;
  if (out.doc["type"].get(type)) throw api_error(400, "'type' (a string) is required", "type");
  out.type = std::string(type);
  if (std::string_view id; !out.doc["id"].get(id)) out.id = std::string(id);
  if (std::string_view key; !out.doc["api_key"].get(key)) out.api_key = std::string(key);
}

ws_start parse_ws_start(const ws_envelope& message) {
  if (message.id.empty() || message.id.size() > 128) {
    throw api_error(400, "'id' must be a string of 1..128 bytes", "id");
  }
  simdjson::dom::element body;
  if (message.doc["request"].get(body) || !body.is_object()) {
    throw api_error(400, "'request' (an object) is required", "request");
  }
  std::string_view endpoint = "auto";
  if (message.doc["endpoint"].get(endpoint)) endpoint = "auto";
  simdjson::dom::element probe;
  ws_start start;
  start.kind = endpoint == "completions"     ? api_kind::completion
               : endpoint == "chat"          ? api_kind::chat
               : body["messages"].get(probe) ? api_kind::completion
                                             : api_kind::chat;
  start.request_json = simdjson::minify(body);
  return start;
}

}  // namespace tessera::server
