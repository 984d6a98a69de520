// Where a request goes. Every request passes the same checks in the same order, all decided on the
// one parsed path: the Host header names this server (DNS rebinding), an Origin is same-origin or
// allowed, the path is a route (or a UI file) and the method fits it, and the API key is right (deny
// by default; WebSocket upgrades may authenticate with their first message instead). The routes that
// need no session state are answered here; generations and upgrades go back to the session.
#pragma once
#include <boost/beast/http.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/server_state.hpp"

namespace tessera::server {

using http_request = boost::beast::http::request<boost::beast::http::string_body>;
using http_response = boost::beast::http::response<boost::beast::http::string_body>;

enum class route : uint8_t {
  health,
  models,
  model,  // GET /v1/models/{id}
  metrics,
  openapi,  // GET /openapi.json (server/openapi.json)
  completions,
  chat_completions,
  responses,   // POST /v1/responses (server/responses_request.hpp)
  embeddings,  // POST /v1/embeddings
  tokenize,
  detokenize,
  ws_generate,  // GET /v1/ws (upgrade)
  ws_events,    // GET /v1/events (upgrade)
  ui_file,      // a file of the browser UI (no key needed: the page asks for it and sends it itself)
  preflight,    // a CORS preflight (OPTIONS) from an allowed origin, answered 204 (server/cors.hpp)
};

struct routing {
  route to = route::health;
  bool authed = false;                 // the key was checked (or none is needed)
  std::optional<http_response> ready;  // ui_file, preflight: the answer, decided while routing
};

// Throws api_error: 403 (Host, Origin; the message names the flag that allows it), 404 (no such route), 405 (method),
// 401 (key; not for upgrades, which authenticate later when the upgrade carried no key).
routing route_request(const http_request& req, const server_state& state);

// The answer of health, models, model (/v1/models/{id}), metrics, openapi or detokenize (status, content type, body;
// the session adds the rest). Throws api_error for what the client asked wrongly (or 503 unhealthy).
http_response answer(route to, const http_request& req, server_state& state);

// A 200 application/json response with `body`.
http_response json_response(std::string body);

// POST /tokenize's body: {"count", "max_model_len", "tokens"}.
std::string tokenize_body(const std::vector<token_id>& ids, int32_t max_model_len);

}  // namespace tessera::server
