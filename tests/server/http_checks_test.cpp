// The header-section checks of server/http_checks.hpp on parsed headers, without a network: framing
// (RFC 9112 §3.2, §6.1, §6.3; RFC 9110 §8.6), expectations (RFC 9110 §10.1.1), Bearer credentials
// (RFC 9110 §11.1), WebSocket keys (RFC 6455 §4.2.1) and the trailer section.
#include "server/http_checks.hpp"

#include <gtest/gtest.h>

#include <string>

namespace tessera::server {
namespace {

namespace http = boost::beast::http;

// The header of `text` as Beast's request parser leaves it (the framing Beast itself refuses fails
// here already: those cases are covered by the loopback tests).
http::request<http::string_body> parse_head(const std::string& text) {
  http::request_parser<http::string_body> p;
  p.eager(false);
  boost::beast::error_code ec;
  p.put(boost::asio::buffer(text), ec);
  EXPECT_TRUE(!ec || ec == http::error::need_more) << ec.message() << " for " << text;
  EXPECT_TRUE(p.is_header_done()) << text;
  return p.release();
}

int framing_status(const std::string& head) {
  try {
    check_framing(parse_head(head));
  } catch (const api_error& e) { return e.status; }
  return 0;
}

TEST(http_checks, framing) {
  const std::string h = "Host: 127.0.0.1:8000\r\n";
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\n" + h + "\r\n"), 0);
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\n\r\n"), 400);  // no Host
  EXPECT_EQ(framing_status("GET / HTTP/1.0\r\n\r\n"), 0);    // HTTP/1.0 needs none
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\n" + h + h + "\r\n"), 400);
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\nHost:\r\n\r\n"), 0);  // empty is allowed (RFC 9112 §3.2)
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\nHost: a%41b.example\r\n\r\n"), 0);
  for (const char* bad : {"a b", "a/b", "a@b", "[::1", "[::1]x", "host:80x", "host:123456", "a%4", "[zz]"}) {
    EXPECT_EQ(framing_status("GET / HTTP/1.1\r\nHost: " + std::string(bad) + "\r\n\r\n"), 400) << bad;
  }
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\n" + h + "Authorization: Bearer a\r\nAuthorization: Bearer a\r\n\r\n"),
            400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Content-Length: 5, 5\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: CHUNKED\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, gzip\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: ,\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, chunked\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400);
  EXPECT_EQ(framing_status("POST / HTTP/1.0\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n"), 400);
}

TEST(http_checks, expectations) {
  auto expect_of = [](const std::string& head) { return parse_expect(parse_head(head)); };
  EXPECT_EQ(expect_of("POST / HTTP/1.1\r\nHost: a\r\n\r\n"), expectation::none);
  EXPECT_EQ(expect_of("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n"), expectation::continue_100);
  EXPECT_EQ(expect_of("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n"), expectation::continue_100);
  EXPECT_EQ(expect_of("POST / HTTP/1.0\r\nHost: a\r\nExpect: 100-continue\r\n\r\n"), expectation::none);  // ignored
  EXPECT_EQ(expect_of("POST / HTTP/1.0\r\nHost: a\r\nExpect: nonsense\r\n\r\n"), expectation::none);
  try {
    expect_of("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue, x=1\r\n\r\n");
    ADD_FAILURE() << "an unknown expectation was accepted";
  } catch (const api_error& e) { EXPECT_EQ(e.status, 417); }
}

TEST(http_checks, bearer_token_scheme_is_case_insensitive) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer abc"), "abc");
  EXPECT_EQ(bearer_token("BEARER abc"), "abc");
  EXPECT_EQ(bearer_token("BeArEr    abc  "), "abc");
  EXPECT_EQ(bearer_token("Bearerabc"), "");
  EXPECT_EQ(bearer_token("Basic YTpi"), "");
  EXPECT_EQ(bearer_token("Bearer"), "");
  EXPECT_EQ(bearer_token("Bearer "), "");
  EXPECT_EQ(bearer_token(""), "");
}

TEST(http_checks, websocket_key) {
  EXPECT_TRUE(valid_websocket_key("dGhlIHNhbXBsZSBub25jZQ=="));  // RFC 6455's example
  EXPECT_TRUE(valid_websocket_key("AAAAAAAAAAAAAAAAAAAAAA=="));
  EXPECT_TRUE(valid_websocket_key("/////////////////////w=="));
  EXPECT_FALSE(valid_websocket_key("/////////////////////x=="));  // 17th byte's bits
  EXPECT_FALSE(valid_websocket_key("dGhlIHNhbXBsZSBub25jZQ="));
  EXPECT_FALSE(valid_websocket_key("dGhlIHNhbXBsZSBub25jZQ=x"));
  EXPECT_FALSE(valid_websocket_key("dGhlIHNhbXBsZSBub25j-Q=="));
  EXPECT_FALSE(valid_websocket_key("dGhlIHNhbXBsZSBub25jZQ==="));
  EXPECT_FALSE(valid_websocket_key(""));
}

TEST(http_checks, trailer_section_is_measured_and_dropped) {
  http::request_parser<http::string_body> p;
  boost::beast::error_code ec;
  const std::string text =
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nAuthorization: Bearer k\r\nX: "
      "yz\r\n\r\n";
  // put() stops after each part (the header, each chunk): feed it until the message is done.
  for (size_t used = 0; used < text.size() && !p.is_done();) {
    const size_t n = p.put(boost::asio::buffer(text.data() + used, text.size() - used), ec);
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_GT(n, 0u);
    used += n;
  }
  ASSERT_TRUE(p.is_done());
  auto req = p.release();
  EXPECT_EQ(req.body(), "abc");
  const size_t header_fields = 2;
  ASSERT_EQ(count_fields(req), 4u);  // Beast merged the trailer
  EXPECT_EQ(take_trailer_section(req, header_fields), std::string("Authorization: Bearer k\r\nX: yz\r\n\r\n").size());
  EXPECT_EQ(count_fields(req), header_fields);
  EXPECT_EQ(req.count(http::field::authorization), 0u);
  EXPECT_EQ(take_trailer_section(req, header_fields), 0u);
}

TEST(http_checks, read_buffer_limit_stays_below_beasts_field_size) {
  EXPECT_EQ(read_buffer_limit(8 * 1024), 16u * 1024);
  EXPECT_LT(read_buffer_limit(1 << 20), 65534u);
  EXPECT_GE(read_buffer_limit(100), 8u * 1024);
}

}  // namespace
}  // namespace tessera::server
