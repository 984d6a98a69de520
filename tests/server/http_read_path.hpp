// The server's HTTP read path without sockets, for the replay test (tests/server/http_replay_test.cpp)
// and the libFuzzer target (tests/fuzz/http_request_fuzz.cpp): Beast's request_parser with the
// server's header and body limits, a read buffer bounded as the session bounds it (read_buffer_limit),
// the bytes handed out in pieces of `read_size` (beast::test::stream), then the session's header
// checks (check_framing, parse_expect) and trailer rule (take_trailer_section), request after request
// as a keep-alive connection reads them.
//
// Oracles, reported through `check(ok, what)`: only api_error escapes the checks (any other exception
// propagates to the caller: Beast's std::length_error was one), the buffer never exceeds its bound,
// what check_framing accepted has one framing, an accepted header section fits the read buffer, an
// accepted request has no trailer field left, its header and trailer sections together fit the
// header limit, and its body fits the body limit.
#pragma once
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

#include "server/http_checks.hpp"

namespace tessera::server::read_path {

struct limits {
  uint32_t header_bytes = 8 * 1024;  // server_options::max_header_bytes
  size_t body_bytes = 64 * 1024;
};

struct outcome {
  int num_requests = 0;  // accepted, checked requests
  int status = 0;        // the refusal the server would answer with (0: none; the stream just ended)
};

template <class Check>
outcome replay(std::string_view input, size_t read_size, const limits& lim, Check&& check) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  outcome out;
  boost::asio::io_context ioc;
  beast::test::stream ts(ioc, std::string(input));
  ts.read_size(std::max<size_t>(1, read_size));
  ts.close_remote();
  beast::flat_buffer buffer(read_buffer_limit(lim.header_bytes));
  auto refused = [&](int status) {
    out.status = status;
    return out;
  };
  // What the session answers for a read error (http_session::read_failed); nullopt-like 0: the end.
  auto status_for = [](beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) return 0;
    if (ec == http::error::body_limit) return 413;
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) return 431;
    return 400;
  };
  for (int request = 0; request < 64; ++request) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(lim.header_bytes);
    parser.body_limit(lim.body_bytes);
    beast::error_code ec;
    const size_t header_bytes = http::read_header(ts, buffer, parser, ec);
    check(buffer.size() <= buffer.max_size(), "the read buffer outgrew its bound");
    if (ec) return refused(status_for(ec));
    // Beast's header_limit bounds the field lines after the request line (basic_parser::put parses
    // them from there); the request line and the whole section are bounded by the read buffer.
    check(header_bytes <= buffer.max_size(), "a header section larger than the read buffer was accepted");
    const size_t num_header_fields = count_fields(parser.get());
    try {
      check_framing(parser.get());
      parse_expect(parser.get());
    } catch (const api_error& e) {
      check(e.status == 400 || e.status == 417 || e.status == 501, "a header check refused with an unexpected status");
      return refused(e.status);
    }
    const auto& h = parser.get();
    const auto hosts = h.equal_range(http::field::host);
    check(std::distance(hosts.first, hosts.second) <= 1, "two Host fields passed check_framing");
    check(!(h.count(http::field::transfer_encoding) && h.count(http::field::content_length)),
          "Transfer-Encoding with Content-Length passed check_framing");
    if (!parser.is_done()) http::read(ts, buffer, parser, ec);
    check(buffer.size() <= buffer.max_size(), "the read buffer outgrew its bound");
    if (ec) return refused(status_for(ec));
    const size_t trailer_bytes = take_trailer_section(parser.get(), num_header_fields);
    check(count_fields(parser.get()) == num_header_fields, "a trailer field was left in the header");
    if (header_bytes + trailer_bytes > lim.header_bytes) return refused(431);
    check(parser.get().body().size() <= lim.body_bytes, "a body over the limit was accepted");
    ++out.num_requests;
    if (!parser.keep_alive()) return out;
  }
  return out;
}

}  // namespace tessera::server::read_path
