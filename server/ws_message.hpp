// What a client's text frame on /v1/ws or /v1/events says, decoded apart from the session that acts on
// it (docs/websocket.md, "Messages"), so that the frame path can be fuzzed without sockets or actors
// (tests/fuzz/ws_frames_fuzz.cpp). Decoding is pure: it reads JSON and throws api_error for what a
// client got wrong; whether the message is allowed now (authenticated? a generation socket? a free id?)
// is the session's call.
#pragma once
#include <simdjson.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_error.hpp"
#include "server/request_parser.hpp"

namespace tessera::server {

// The largest message a client may send (server_options::ws_max_message_bytes' default).
inline constexpr size_t k_ws_default_max_message_bytes = 64 * 1024;

// RFC 6455 §8.1: a text message that is not UTF-8 fails the connection (close code 1007, invalid
// payload data). Beast checks text frames as they arrive, but Boost 1.81 only checks non-empty
// payloads: a fragmented message whose final frame is empty ("\xE2" then an empty continuation) is
// delivered as text with its last character cut, and the checker's half-read character carries into
// the next message. So the session checks each whole text message again.
bool ws_text_is_valid(std::string_view payload);

// Every message's envelope: {"type": ..., "id": ...}. It holds its parsed document, so the fields the
// session reads later (the start's request) are views into it.
struct ws_envelope {
  std::string type;
  std::string id;                      // empty when absent (errors are then sent without one)
  std::optional<std::string> api_key;  // an auth message's key, when it is a string
  simdjson::dom::element doc;

  ws_envelope() = default;
  ws_envelope(ws_envelope&&) = delete;  // doc points into parser_
  ws_envelope& operator=(ws_envelope&&) = delete;

 private:
  friend void parse_ws_envelope(std::string_view text, ws_envelope& out);
  simdjson::dom::parser parser_;
};

// Fills `out` from one text message; throws api_error (400 invalid_json, or 'type' missing). `out.id`
// is set as soon as it is read, so an error after it can be answered with the id.
void parse_ws_envelope(std::string_view text, ws_envelope& out);

// A start message: {"type": "start", "id": ID, "endpoint": "completions"|"chat"|absent, "request": {...}}.
struct ws_start {
  api_kind kind = api_kind::completion;
  std::string request_json;  // the request object, minified: what parse_generation_request reads
};

// Throws api_error for an id outside 1..128 bytes or a missing request object. Without an endpoint
// the request's shape decides: "messages" makes it a chat request.
ws_start parse_ws_start(const ws_envelope& message);

}  // namespace tessera::server
