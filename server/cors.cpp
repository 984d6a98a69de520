#include "server/cors.hpp"

#include <algorithm>

namespace tessera::server {

namespace http = boost::beast::http;

bool origin_allowed(std::string_view origin, std::string_view host_header, const std::vector<std::string>& allowed) {
  if (std::any_of(allowed.begin(), allowed.end(), [&](const std::string& a) { return a == "*" || a == origin; })) {
    return true;
  }
  const std::string host(host_header);
  return !host.empty() && (origin == "http://" + host || origin == "https://" + host);
}

std::vector<std::string> parse_origin_list(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& value : values) {
    std::string_view rest = value;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view member = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      // vLLM's JSON form: ["http://a", "*"]; the brackets, quotes and spaces around a member go.
      auto strip = [](char c) { return c == ' ' || c == '\t' || c == '"' || c == '\'' || c == '[' || c == ']'; };
      while (!member.empty() && strip(member.front())) member.remove_prefix(1);
      while (!member.empty() && strip(member.back())) member.remove_suffix(1);
      while (member.size() > 1 && member.back() == '/') member.remove_suffix(1);
      if (!member.empty()) out.emplace_back(member);
    }
  }
  return out;
}

void add_cors_headers(http::fields& fields, std::string_view origin) {
  fields.set(http::field::access_control_allow_origin, origin);
  fields.set(http::field::vary, "Origin");
  // Without this a page's fetch() sees only the CORS-safelisted response headers.
  fields.set(http::field::access_control_expose_headers,
             "X-Request-Id, X-Tessera-Queue-Seconds, "
             "X-Tessera-Prefill-Seconds, X-Tessera-First-Token-Seconds, "
             "X-Tessera-Total-Seconds, X-Tessera-Decode-Tokens-Per-Second");
}

bool is_preflight(const http::request_header<>& req) {
  return req.method() == http::verb::options && req.find(http::field::access_control_request_method) != req.end() &&
         req.find(http::field::origin) != req.end();
}

http::response<http::string_body> preflight_response(const http::request_header<>& req, std::string_view origin) {
  http::response<http::string_body> res{http::status::no_content, 11};
  add_cors_headers(res, origin);
  res.set(http::field::access_control_allow_methods, "GET, POST, OPTIONS");
  std::string headers = "Authorization, Content-Type";
  if (auto asked = req.find(http::field::access_control_request_headers); asked != req.end()) {
    headers += ", ";
    headers.append(asked->value().data(), asked->value().size());
  }
  res.set(http::field::access_control_allow_headers, headers);
  res.set(http::field::access_control_max_age, "600");
  return res;
}

}  // namespace tessera::server
