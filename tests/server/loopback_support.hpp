// The real server on a loopback port, in front of the actor runtime on the simulated executor (fast,
// deterministic tokens), and the small blocking clients the loopback tests drive it with: plain Beast
// requests, raw bytes, /metrics as a map, and waiting until the runtime is idle again.
#pragma once
#include "server/http_server.hpp"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/json.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <cctype>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "engine/sim_executor.hpp"
#include "tests/support/char_tokenizer.hpp"

namespace tessera::server::loopback {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace json = boost::json;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

constexpr int32_t num_blocks = 16384;

struct loopback_server {
  explicit loopback_server(server_options so = {}, actors::facade_options fo = default_facade_options()) {
    actors::facade_components c;
    c.exec = std::make_unique<testing::sim_executor>(16, num_blocks, 0, test_support::char_vocab);
    c.tok = test_support::char_tokenizer();
    engine = std::make_unique<actors::engine_facade>(std::move(c), fo);
    so.port = 0;
    server = std::make_unique<http_server>(*engine, std::move(so));
    server->start();
  }
  ~loopback_server() {
    if (!server) return;
    server->stop_accepting();
    engine->shutdown(2s);
    server->stop();
  }
  static actors::facade_options default_facade_options() {
    actors::facade_options fo;
    fo.engine.block_size = 16;
    fo.num_caf_threads = 2;
    fo.max_waiting = 1000;
    fo.shutdown_timeout = 2s;
    return fo;
  }
  tcp::endpoint endpoint() const { return {net::ip::make_address("127.0.0.1"), server->port()}; }

  std::unique_ptr<actors::engine_facade> engine;
  std::unique_ptr<http_server> server;
};

struct reply {
  int status = 0;
  std::string body;
};

inline reply get(const loopback_server& s, const std::string& target, const std::string& auth = {}) {
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(s.endpoint());
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!auth.empty()) req.set(http::field::authorization, auth);
  req.keep_alive(false);
  http::write(sock, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(sock, buffer, res);
  return {static_cast<int>(res.result_int()), res.body()};
}

inline reply post(const loopback_server& s, const std::string& target, const std::string& body,
                  const std::string& auth = {}) {
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(s.endpoint());
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  if (!auth.empty()) req.set(http::field::authorization, auth);
  req.keep_alive(false);
  req.body() = body;
  req.prepare_payload();
  http::write(sock, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  http::read(sock, buffer, parser);
  return {static_cast<int>(parser.get().result_int()), parser.get().body()};
}

inline std::map<std::string, double> metrics(const loopback_server& s, const std::string& auth = {}) {
  const reply r = get(s, "/metrics", auth);
  EXPECT_EQ(r.status, 200);
  std::map<std::string, double> out;
  std::istringstream lines(r.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

inline const std::string aborted_key = "tessera_request_success_total{finished_reason=\"abort\"}";
inline const std::string submitted_key = "tessera_requests_submitted_total";
inline std::string closed_key(const char* reason) {
  return std::string("tessera_connections_closed_total{reason=\"") + reason + "\"}";
}

// Waits until the runtime has accepted `num_submitted` requests in all, then until it has no open
// stream and both pools have no used block; returns the last metrics seen (the caller's assertions
// name what did not come back).
inline std::map<std::string, double> wait_idle(const loopback_server& s, double num_submitted,
                                               std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::map<std::string, double> m;
  while (std::chrono::steady_clock::now() < deadline) {
    m = metrics(s);
    if (m[submitted_key] >= num_submitted && m["tessera_num_streams_open"] == 0 &&
        m["tessera_kv_blocks_used{pool=\"device\"}"] == 0 && m["tessera_kv_blocks_used{pool=\"host\"}"] == 0 &&
        m["tessera_num_requests_running"] == 0) {
      return m;
    }
    std::this_thread::sleep_for(20ms);
  }
  return m;
}

inline void expect_idle(const std::map<std::string, double>& m, double num_submitted) {
  EXPECT_EQ(m.at(submitted_key), num_submitted);
  EXPECT_EQ(m.at("tessera_num_streams_open"), 0);
  EXPECT_EQ(m.at("tessera_num_requests_running"), 0);
  EXPECT_EQ(m.at("tessera_kv_blocks_used{pool=\"device\"}"), 0);
  EXPECT_EQ(m.at("tessera_kv_blocks_used{pool=\"host\"}"), 0);
}

inline std::string start_message(const std::string& id, int max_tokens) {
  return json::serialize(
      json::object{{"type", "start"},
                   {"id", id},
                   {"endpoint", "completions"},
                   {"request", json::object{{"prompt", "abc"}, {"max_tokens", max_tokens}, {"ignore_eos", true}}}});
}

inline void set_receive_timeout(int fd, std::chrono::seconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count());
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// A raw connection: send bytes, read what comes back until the server closes, a timeout, or `until`
// says enough.
struct raw_connection {
  explicit raw_connection(const loopback_server& s, std::chrono::seconds receive_timeout = 30s) : sock(ioc) {
    sock.connect(s.endpoint());
    set_receive_timeout(sock.native_handle(), receive_timeout);
  }
  // false when the server closed (or reset) the connection before everything was sent
  bool send(std::string_view bytes) {
    beast::error_code ec;
    net::write(sock, net::buffer(bytes.data(), bytes.size()), ec);
    return !ec;
  }
  template <class Until>
  std::string read_until(Until until) {
    std::string out;
    char chunk[65536];
    for (;;) {
      beast::error_code ec;
      const size_t n = sock.read_some(net::buffer(chunk), ec);
      out.append(chunk, n);
      if (ec || until(out)) return out;
    }
  }
  std::string read_all() {
    return read_until([](const std::string&) { return false; });
  }
  net::io_context ioc;
  tcp::socket sock;
};

// How many complete HTTP responses `bytes` holds (status lines of final responses, 1xx excluded).
inline int count_final_responses(const std::string& bytes) {
  int n = 0;
  for (size_t at = bytes.find("HTTP/1.1 "); at != std::string::npos; at = bytes.find("HTTP/1.1 ", at + 1)) {
    // A status line is "HTTP/1.1 DDD " ("an HTTP/1.1 request needs..." in an error body is not one;
    // a response may follow a body without a CRLF between), and 1xx are interim.
    const bool status_line = at + 13 <= bytes.size() && std::isdigit(static_cast<unsigned char>(bytes[at + 9])) &&
                             std::isdigit(static_cast<unsigned char>(bytes[at + 10])) &&
                             std::isdigit(static_cast<unsigned char>(bytes[at + 11])) && bytes[at + 12] == ' ';
    if (status_line && bytes[at + 9] != '1') ++n;
  }
  return n;
}

}  // namespace tessera::server::loopback
