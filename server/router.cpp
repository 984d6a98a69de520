#include "server/router.hpp"

#include <boost/beast/websocket/rfc6455.hpp>
#include <boost/json.hpp>

#include <cctype>
#include <charconv>
#include <string>

#include "server/api_error.hpp"
#include "server/cors.hpp"
#include "server/http_checks.hpp"
#include "server/openapi_json.hpp"  // generated from server/openapi.json
#include "server/request_parser.hpp"
#include "server/static_files.hpp"

namespace tessera::server {

namespace http = boost::beast::http;
namespace json = boost::json;

bool keys_equal(std::string_view presented, std::string_view expected) {
  // Length is not secret enough to hide behind padding; compare every byte of the expected key anyway.
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

namespace {

struct host_and_port {
  std::string_view name, port;  // name keeps an IPv6 literal's brackets
  bool valid = true;
};

host_and_port split_host(std::string_view header) {
  host_and_port h{header, {}};
  if (!header.empty() && header.front() == '[') {  // [v6]:port
    const size_t close = header.find(']');
    if (close == std::string_view::npos) return {header, {}, false};
    h.port = close + 1 < header.size() && header[close + 1] == ':' ? header.substr(close + 2) : std::string_view();
    h.name = header.substr(0, close + 1);
  } else if (const size_t colon = header.rfind(':'); colon != std::string_view::npos) {
    h.port = header.substr(colon + 1);
    h.name = header.substr(0, colon);
  }
  return h;
}

}  // namespace

bool host_allowed(std::string_view header, const server_options& o, uint16_t bound_port) {
  const bool wildcard_bind = o.host == "0.0.0.0" || o.host == "::" || o.host.empty();
  if (wildcard_bind && o.allowed_hosts.empty()) return true;
  const auto [name, port, valid] = split_host(header);
  if (!valid) return false;
  if (!port.empty() && port != std::to_string(bound_port)) return false;
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == o.host || lower == "localhost" || lower == "127.0.0.1" || lower == "[::1]") return true;
  for (const auto& h : o.allowed_hosts) {
    if (lower == h) return true;
  }
  return false;
}

http_response json_response(std::string body) {
  http_response res{http::status::ok, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(body);
  return res;
}

std::string tokenize_body(const std::vector<token_id>& ids, int32_t max_model_len) {
  // By hand rather than through json::array: this runs for up to millions of ids (on a tokenizer
  // actor's thread, see http_session::start_tokenize), and the text is plain integers.
  std::string out = "{\"count\":" + std::to_string(ids.size()) + ",\"max_model_len\":" + std::to_string(max_model_len) +
                    ",\"tokens\":[";
  out.reserve(out.size() + ids.size() * 7 + 2);
  char digits[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, ids[i]);
    out.append(digits, end);
  }
  out += "]}";
  return out;
}

namespace {

std::string_view header_value(const http_request& req, http::field f) {
  auto it = req.find(f);
  return it == req.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
}

struct route_entry {
  std::string_view path;
  http::verb method;
  route to;
};

constexpr route_entry routes[] = {
    {"/health", http::verb::get, route::health},
    {"/v1/models", http::verb::get, route::models},
    {"/metrics", http::verb::get, route::metrics},
    {"/openapi.json", http::verb::get, route::openapi},
    {"/v1/completions", http::verb::post, route::completions},
    {"/v1/chat/completions", http::verb::post, route::chat_completions},
    {"/v1/responses", http::verb::post, route::responses},
    {"/v1/embeddings", http::verb::post, route::embeddings},
    {"/tokenize", http::verb::post, route::tokenize},
    {"/detokenize", http::verb::post, route::detokenize},
    {"/v1/ws", http::verb::get, route::ws_generate},
    {"/v1/events", http::verb::get, route::ws_events},
};

// GET /v1/models/{id}: the id is the rest of the path (ids may hold '/'), percent-decoded.
constexpr std::string_view k_model_prefix = "/v1/models/";

std::string percent_decoded(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int value = 0;
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      std::from_chars(s.data() + i + 1, s.data() + i + 3, value, 16);
      out += static_cast<char>(value);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The served model under one of its names as OpenAI's model object, with the max_model_len the engine enforces.
json::object model_object(const server_state& s, const std::string& id) {
  json::object model{{"id", id},
                     {"object", "model"},
                     {"created", 0},
                     {"owned_by", "tessera"},
                     {"max_model_len", s.engine.max_model_len()}};
  if (!s.engine.kv_cache_dtype().empty()) model["kv_cache_dtype"] = s.engine.kv_cache_dtype();
  return model;
}

http_response detokenize(const http_request& req, server_state& s) {
  const auto& tok = s.engine.tok();
  if (!tok) throw api_error(400, "this model has no tokenizer");
  const std::vector<token_id> ids =
      parse_detokenize_request(req.body(), static_cast<int32_t>(tok->vocab_size()), s.opt.limits);
  json::object body{{"prompt", sanitize_utf8(tok->decode(ids))}};
  return json_response(json::serialize(body));
}

}  // namespace

routing route_request(const http_request& req, const server_state& s) {
  const server_options& o = s.opt;
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  const http::verb method = req.method();

  const std::string_view host = header_value(req, http::field::host);
  if (!host_allowed(host, o, s.bound_port)) {
    // Through a reverse proxy or by a LAN name the Host is not one this server knows by itself.
    throw api_error(403,
                    "Host '" + std::string(host) +
                        "' is not allowed (DNS-rebinding guard): start the server with "
                        "--allowed-host " +
                        std::string(split_host(host).name) + " to accept it",
                    "", "host_not_allowed");
  }
  const std::string_view origin = header_value(req, http::field::origin);
  if (!origin.empty() && !origin_allowed(origin, host, o.allowed_origins)) {
    throw api_error(403,
                    "Origin '" + std::string(origin) + "' is not allowed: start the server with --allowed-origins " +
                        std::string(origin) + " (a comma list, or '*' for any origin) to let it call the API",
                    "", "origin_not_allowed");
  }
  // A browser's preflight before a cross-origin request: answered without the key, which it never carries.
  if (!origin.empty() && is_preflight(req)) return {route::preflight, true, preflight_response(req, origin)};

  const route_entry* found = nullptr;
  for (const auto& r : routes) {
    if (r.path == path) found = &r;
  }
  static constexpr route_entry model_route{k_model_prefix, http::verb::get, route::model};
  if (!found && path.starts_with(k_model_prefix) && path.size() > k_model_prefix.size()) found = &model_route;
  if (!found && s.ui && (method == http::verb::get || method == http::verb::head)) {
    if (auto res = s.ui->respond(req, path)) return {route::ui_file, true, std::move(res)};
  }
  if (!found) throw api_error(404, "no route for " + std::string(path), "", "not_found");
  if (found->method != method && !(method == http::verb::head && found->method == http::verb::get)) {
    throw api_error(405, "method " + std::string(req.method_string()) + " not allowed on " + std::string(path), "",
                    "method_not_allowed");
  }
  const bool upgrade = found->to == route::ws_generate || found->to == route::ws_events;
  bool authed = o.api_key.empty() || found->to == route::health;
  if (!authed) {
    // RFC 9110 §11.1: the scheme is case-insensitive ("bearer", "BEARER").
    const std::string_view key = bearer_token(header_value(req, http::field::authorization));
    authed = !key.empty() && keys_equal(key, o.api_key);
  }
  if (!authed && !upgrade) {
    throw api_error(401, "missing or invalid API key (send 'Authorization: Bearer KEY')", "", "invalid_api_key");
  }
  if (upgrade && !boost::beast::websocket::is_upgrade(req)) {
    throw api_error(400, "this route needs a WebSocket upgrade", "", "upgrade_required");
  }
  if (upgrade) {
    // RFC 6455 §4.2.1: exactly one Sec-WebSocket-Key, the base64 of 16 bytes (Beast checks only its length).
    const auto keys = req.equal_range(http::field::sec_websocket_key);
    if (std::distance(keys.first, keys.second) != 1 ||
        !valid_websocket_key(std::string_view(keys.first->value().data(), keys.first->value().size()))) {
      throw api_error(400, "Sec-WebSocket-Key must be the base64 encoding of 16 bytes (RFC 6455 §4.2.1)", "",
                      "bad_websocket_key");
    }
  }
  return {found->to, authed, std::nullopt};
}

http_response answer(route to, const http_request& req, server_state& s) {
  switch (to) {
    case route::health: {
      const actors::health_report h = s.engine.health();
      if (!h.healthy) throw api_error(503, "engine unhealthy: " + h.message, "", "unhealthy");
      return json_response(R"({"status":"ok"})");
    }
    case route::models: {
      json::array data{model_object(s, s.opt.model_name)};
      for (const auto& alias : s.opt.model_aliases) data.push_back(model_object(s, alias));
      json::object body{{"object", "list"}, {"data", std::move(data)}};
      return json_response(json::serialize(body));
    }
    case route::model: {
      const std::string_view target(req.target().data(), req.target().size());
      const std::string id =
          percent_decoded(target.substr(k_model_prefix.size(), target.find('?') - k_model_prefix.size()));
      if (!serves_model(s.opt, id)) {
        throw api_error(
            404,
            "The model '" + sanitize_utf8(id) + "' does not exist (this server serves " + served_names(s.opt) + ")",
            "model", "model_not_found");
      }
      return json_response(json::serialize(model_object(s, id)));
    }
    case route::metrics: {
      http_response res{http::status::ok, 11};
      res.set(http::field::content_type, "text/plain; version=0.0.4");
      res.body() = s.metrics.render(s.engine, s.opt.model_name);
      return res;
    }
    case route::openapi: return json_response(std::string(k_openapi_json));
    case route::detokenize: return detokenize(req, s);
    default: break;
  }
  throw api_error(500, "no plain answer for this route");
}

}  // namespace tessera::server
