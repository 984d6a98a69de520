// An error the server answers with, in OpenAI's envelope: {"error": {"message", "type", "param", "code"}}.
// Request parsing and routing throw it; the session turns it into a response (HTTP) or an error frame
// (WebSocket). Expected failures only: a bug is not an api_error.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera::server {

struct api_error : std::runtime_error {
  int status = 400;
  std::string type;   // OpenAI's error type, e.g. "invalid_request_error"
  std::string param;  // the offending request field; empty: none
  std::string code;   // a short machine-readable code; empty: none

  api_error(int status_code, std::string message, std::string param_name = {}, std::string error_code = {})
      : std::runtime_error(std::move(message)),
        status(status_code),
        type(type_for(status_code)),
        param(std::move(param_name)),
        code(std::move(error_code)) {}

  // The error type OpenAI's API uses for each status we send.
  static std::string type_for(int status_code) {
    switch (status_code) {
      case 400:
      case 413:
      case 417:
      case 431: return "invalid_request_error";
      case 401: return "authentication_error";
      case 403: return "permission_error";
      case 404: return "not_found_error";
      case 405: return "method_not_allowed";
      case 408: return "timeout_error";
      case 429: return "rate_limit_error";
      case 503: return "service_unavailable";
      default: return "server_error";
    }
  }
};

// The JSON body of an error response (serialized with Boost.JSON).
std::string error_body(const api_error& e);

}  // namespace tessera::server
