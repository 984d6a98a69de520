#include "server/http_checks.hpp"

#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace tessera::server {

namespace http = boost::beast::http;

namespace {

[[noreturn]] void bad_framing(const std::string& what) { throw api_error(400, what, "", "bad_http"); }

size_t count_of(const http_request_header& h, http::field f) {
  const auto range = h.equal_range(f);
  return static_cast<size_t>(std::distance(range.first, range.second));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The members of a comma-separated field value (RFC 9110 §5.6.1), empty elements dropped.
std::vector<std::string_view> list_members(std::string_view value) {
  std::vector<std::string_view> out;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view member = trim(value.substr(0, comma));
    if (!member.empty()) out.push_back(member);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return out;
}

bool is_reg_name_char(unsigned char c) {
  // RFC 3986 §3.2.2: unreserved / pct-encoded / sub-delims ('%' checked by the caller).
  return std::isalnum(c) || std::string_view("-._~!$&'()*+,;=").find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_port(std::string_view s) {
  return s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Host = uri-host [ ":" port ] (RFC 9112 §3.2, RFC 3986 §3.2.2); an empty value is allowed.
bool valid_host_value(std::string_view v) {
  if (v.empty()) return true;
  if (v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string_view::npos || close < 2) return false;
    for (char c : v.substr(1, close - 1)) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.' && c != 'v' && c != 'V') return false;
    }
    const std::string_view rest = v.substr(close + 1);
    return rest.empty() || (rest.front() == ':' && is_port(rest.substr(1)));
  }
  const size_t colon = v.find(':');
  const std::string_view name = v.substr(0, colon);
  if (colon != std::string_view::npos && !is_port(v.substr(colon + 1))) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c == '%') {
      if (i + 2 >= name.size() || !std::isxdigit(static_cast<unsigned char>(name[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(name[i + 2]))) {
        return false;
      }
      i += 2;
    } else if (!is_reg_name_char(c)) {
      return false;
    }
  }
  return true;
}

}  // namespace

void check_framing(const http_request_header& h) {
  const size_t num_host = count_of(h, http::field::host);
  if (num_host > 1) bad_framing("more than one Host header (RFC 9112 §3.2)");
  if (num_host == 0 && h.version() >= 11) bad_framing("an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)");
  if (num_host == 1) {
    const auto host = h[http::field::host];
    if (!valid_host_value(std::string_view(host.data(), host.size()))) {
      bad_framing("the Host header is not a valid host[:port] (RFC 9112 §3.2)");
    }
  }
  if (count_of(h, http::field::authorization) > 1) bad_framing("more than one Authorization header");

  const size_t num_length = count_of(h, http::field::content_length);
  if (num_length > 1) bad_framing("more than one Content-Length header (RFC 9110 §8.6)");
  if (num_length == 1 && h[http::field::content_length].find(',') != boost::beast::string_view::npos) {
    bad_framing("Content-Length must be one number (RFC 9110 §8.6)");
  }

  const size_t num_te = count_of(h, http::field::transfer_encoding);
  if (num_te == 0) return;
  // Either framing could be the one an intermediary used: refuse rather than pick (RFC 9112 §6.1,
  // §11.2 request smuggling). Never fall back to Content-Length.
  if (num_length > 0) bad_framing("Transfer-Encoding and Content-Length together (RFC 9112 §6.1)");
  if (h.version() < 11) bad_framing("Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)");
  if (num_te > 1) bad_framing("more than one Transfer-Encoding header");
  const auto value = h[http::field::transfer_encoding];
  const std::vector<std::string_view> codings = list_members(std::string_view(value.data(), value.size()));
  // RFC 9112 §6.3 (4): without chunked as the final coding the body length cannot be determined.
  if (codings.empty() || !boost::beast::iequals(codings.back(), "chunked")) {
    bad_framing("Transfer-Encoding must end with chunked (RFC 9112 §6.3)");
  }
  for (size_t i = 0; i + 1 < codings.size(); ++i) {
    if (boost::beast::iequals(codings[i], "chunked")) bad_framing("chunked applied more than once (RFC 9112 §7)");
  }
  if (codings.size() > 1) {
    // RFC 9112 §6.1: a transfer coding the server does not understand gets 501.
    throw api_error(501, "transfer codings other than chunked are not supported", "", "unsupported_transfer_coding");
  }
}

expectation parse_expect(const http_request_header& h) {
  const auto range = h.equal_range(http::field::expect);
  if (range.first == range.second || h.version() < 11) return expectation::none;  // RFC 9110 §10.1.1
  bool want_continue = false;
  for (auto it = range.first; it != range.second; ++it) {
    for (std::string_view member : list_members(std::string_view(it->value().data(), it->value().size()))) {
      if (!boost::beast::iequals(member, "100-continue")) {
        throw api_error(417, "only the expectation 100-continue is supported", "", "expectation_failed");
      }
      want_continue = true;
    }
  }
  return want_continue ? expectation::continue_100 : expectation::none;
}

std::string_view bearer_token(std::string_view authorization) {
  constexpr std::string_view scheme = "bearer";
  if (authorization.size() <= scheme.size() || !boost::beast::iequals(authorization.substr(0, scheme.size()), scheme) ||
      authorization[scheme.size()] != ' ') {
    return {};
  }
  return trim(authorization.substr(scheme.size()));
}

bool valid_websocket_key(std::string_view key) {
  constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (key.size() != 24 || key.substr(22) != "==") return false;
  for (size_t i = 0; i < 22; ++i) {
    if (alphabet.find(key[i]) == std::string_view::npos) return false;
  }
  // 16 bytes are 128 bits: the 22nd character carries 2 of them, its 4 low bits are zero.
  return std::string_view("AQgw").find(key[21]) != std::string_view::npos;
}

size_t read_buffer_limit(uint32_t max_header_bytes) {
  return std::clamp<size_t>(size_t{2} * max_header_bytes, 8 * 1024, 60000);
}

size_t count_fields(const http::fields& fields) {
  return static_cast<size_t>(std::distance(fields.begin(), fields.end()));
}

size_t take_trailer_section(http::fields& fields, size_t num_header_fields) {
  size_t bytes = 0, index = 0;
  for (auto it = fields.begin(); it != fields.end();) {
    if (index++ < num_header_fields) {
      ++it;
      continue;
    }
    bytes += it->name_string().size() + 2 + it->value().size() + 2;
    it = fields.erase(it);
  }
  return bytes == 0 ? 0 : bytes + 2;
}

}  // namespace tessera::server
