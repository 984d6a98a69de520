// Cross-origin requests (the Fetch standard's CORS protocol), so that a browser app served from
// another origin can call the API (issue #19). An Origin is allowed when it is the server's own
// (same origin: the Host the request names) or one of --allowed-origins ("*": any); a request from
// any other Origin is refused with 403 before it is routed (router.cpp), which the browser reports as
// a CORS failure. For an allowed cross-origin request every response carries
// Access-Control-Allow-Origin (errors and SSE streams included), and the preflight a browser sends
// before a request with an Authorization header or a JSON body (OPTIONS with
// Access-Control-Request-Method) is answered 204 without needing the API key: browsers never send
// credentials on a preflight.
#pragma once
#include <boost/beast/http.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace tessera::server {

// Whether a request from `origin` may use the API: the same origin as the Host it names, or one of
// `allowed` ("*": any).
bool origin_allowed(std::string_view origin, std::string_view host_header, const std::vector<std::string>& allowed);

// --allowed-origins values: comma lists ("http://a:1,http://b"), repeated flags, or vLLM's JSON list
// ('["*"]'); trailing slashes dropped (an Origin never has one), empty members ignored.
std::vector<std::string> parse_origin_list(const std::vector<std::string>& values);

// The Access-Control headers of a response to a request from `origin` (already allowed): the origin
// echoed, Vary: Origin, and the response headers a page may read (X-Request-Id, the timings).
void add_cors_headers(boost::beast::http::fields& fields, std::string_view origin);

// A preflight: OPTIONS naming the method it asks for (Fetch standard §4.8).
bool is_preflight(const boost::beast::http::request_header<>& req);

// 204 for a preflight from an allowed origin: the methods (GET, POST, OPTIONS) and the request headers
// the API takes (Authorization, Content-Type, and whatever else the browser asks to send).
boost::beast::http::response<boost::beast::http::string_body> preflight_response(
    const boost::beast::http::request_header<>& req, std::string_view origin);

}  // namespace tessera::server
