// What a request's header section must satisfy before the server acts on it (RFC 9110, RFC 9112,
// RFC 6455), checked on the header alone, before any body byte is read: message framing (Host,
// Content-Length, Transfer-Encoding), expectations (Expect: 100-continue), the Bearer credentials
// and the WebSocket key. Also the bounds of the read path: how many unparsed bytes a connection may
// buffer (which bounds a chunked body's trailer section) and how the trailer section is measured and
// dropped. Pure functions over Beast's header types, without sockets: the session (http_session.cpp)
// and the replay harness (tests/server/http_replay_test.cpp) call the same code.
#pragma once
#include <boost/beast/http.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/api_error.hpp"

namespace tessera::server {

using http_request_header = boost::beast::http::request_header<>;

// Throws api_error(400) for a header section whose framing cannot be trusted; such a request is
// answered and the connection closed (RFC 9112 §6.3: the body length cannot be determined):
//  * Host (RFC 9112 §3.2): more than one, none in an HTTP/1.1 request, or a value that is not
//    uri-host [":" port];
//  * Authorization: more than one (which credentials would count?);
//  * Content-Length (RFC 9110 §8.6): more than one field line, or a list of values (even equal ones);
//  * Transfer-Encoding (RFC 9112 §6.1, §6.3): together with Content-Length (request smuggling), in
//    an HTTP/1.0 request, more than one field line, or anything but one final "chunked"; codings
//    before a final "chunked" (e.g. "gzip, chunked") are refused with 501, since none is supported.
void check_framing(const http_request_header& h);

enum class expectation : uint8_t {
  none,
  continue_100,  // "Expect: 100-continue" on HTTP/1.1: answer 100 before reading the body
};
// RFC 9110 §10.1.1. HTTP/1.0 requests' expectations are ignored, as the RFC requires; any
// expectation but 100-continue throws api_error(417).
expectation parse_expect(const http_request_header& h);

// The key of "Authorization: Bearer KEY" (RFC 6750 §2.1); the scheme is case-insensitive (RFC 9110
// §11.1) and may be followed by several spaces. Empty when the value is not Bearer credentials.
std::string_view bearer_token(std::string_view authorization);

// RFC 6455 §4.2.1 (5): a Sec-WebSocket-Key is the base64 encoding of 16 bytes: 22 characters of the
// base64 alphabet, the last one carrying only 2 bits, then "==".
bool valid_websocket_key(std::string_view key);

// How many unparsed bytes one HTTP connection may hold in its read buffer: a header section, a
// chunk-size line or a trailer section that does not fit is refused (431) before it is buffered
// whole, and pipelined bytes beyond it are not kept. Twice the header limit, and always below the
// 65534 bytes at which Beast's fields throw std::length_error for one field (a trailer field of that
// size once took the process down).
size_t read_buffer_limit(uint32_t max_header_bytes);

// Beast's parser appends a chunked body's trailer fields to the header's fields. A trailer field is
// never merged into the header section (RFC 9110 §6.5.1: none is understood here, and one must not
// smuggle in an Authorization or a Host after the checks): the fields after the first
// `num_header_fields` are measured (name, ": ", value, CRLF each, plus the final CRLF) and erased.
// Returns the trailer section's size; 0 when there was none.
size_t take_trailer_section(boost::beast::http::fields& fields, size_t num_header_fields);

size_t count_fields(const boost::beast::http::fields& fields);

}  // namespace tessera::server
