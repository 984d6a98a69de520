// The real server on a loopback port, in front of the actor runtime on the simulated executor (fast,
// deterministic tokens), driven by plain Beast clients: connections that go away or stop reading
// while tokens are being pushed to them must be torn down without touching freed state, free every
// request's KV blocks, and leave the server answering.
#include "tests/server/loopback_support.hpp"

#include <random>

namespace tessera::server {
namespace {

using namespace loopback;

// Issue #14: a /v1/ws reader that never reads fills the socket's send queue; reaching
// ws_max_queued_messages closed the socket from inside the loop that was writing the generations'
// deltas, which cleared the generations under that loop (heap corruption, once an I/O thread
// spinning forever). The server must close that socket, abort its generations, free their blocks
// and keep answering.
TEST(loopback, websocket_reader_that_never_reads_is_closed_and_its_generations_freed) {
  server_options so;
  so.ws_max_queued_messages = 16;
  loopback_server s(so);
  const double aborted_before = metrics(s)[aborted_key];
  const double submitted_before = metrics(s)[submitted_key];

  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.open(tcp::v4());
  // A small receive window, so the server's socket buffer fills after a few hundred deltas.
  sock.set_option(net::socket_base::receive_buffer_size(4096));
  sock.connect(s.endpoint());
  websocket::stream<tcp::socket> ws(std::move(sock));
  ws.handshake("127.0.0.1", "/v1/ws");
  constexpr int num_generations = 8;
  // Long enough that the generations cannot end on their own before the queue limit is reached:
  // 8 x 20000 deltas are megabytes, far beyond what the socket buffers hold.
  for (int i = 0; i < num_generations; ++i) ws.write(net::buffer(start_message("g" + std::to_string(i), 20000)));

  // Never reading: the server must give up on this socket by itself and abort all 8 generations. The
  // kernel's socket buffers absorb megabytes first (the send buffer autotunes up to 4 MiB on
  // loopback), thousands of steps that a loaded 2-core machine needs tens of seconds for: the wait
  // is generous and returns as soon as the server is idle.
  const auto m = wait_idle(s, submitted_before + num_generations, 300s);
  expect_idle(m, submitted_before + num_generations);
  EXPECT_EQ(m.at(aborted_key) - aborted_before, num_generations) << "the generations were aborted, not finished";
  EXPECT_EQ(get(s, "/health").status, 200);

  // What was already on its way arrives, then the server's close frame (policy violation).
  set_receive_timeout(ws.next_layer().native_handle(), 30s);
  int num_started = 0, num_deltas = 0;
  beast::error_code ec;
  for (;;) {
    beast::flat_buffer buffer;
    ws.read(buffer, ec);
    if (ec) break;
    const json::value msg = json::parse(beast::buffers_to_string(buffer.data()));
    const json::string& type = msg.at("type").as_string();
    num_started += type == "started";
    num_deltas += type == "delta";
    ASSERT_TRUE(type == "started" || type == "delta") << json::serialize(msg);
  }
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(ws.reason().code, websocket::close_code::policy_error);
  EXPECT_EQ(num_started, num_generations);
  EXPECT_GT(num_deltas, 0);
  EXPECT_LT(num_deltas, num_generations * 20000);

  // The server still serves generations.
  EXPECT_EQ(get(s, "/health").status, 200);
}

// SSE streams (and non-streaming requests) cut by the client at random points while their tokens are
// being pushed: a FIN or a TCP reset may meet a notification already posted to the session.
TEST(loopback, http_streams_cut_while_tokens_flow_free_everything) {
  loopback_server s;
  const double aborted_before = metrics(s)[aborted_key];
  const double submitted_before = metrics(s)[submitted_key];
  std::mt19937 rng(7);
  constexpr int num_requests = 40;
  for (int i = 0; i < num_requests; ++i) {
    const bool stream = i % 5 != 4;
    const std::string body = json::serialize(json::object{
        {"prompt", "story " + std::to_string(i)}, {"max_tokens", 20000}, {"ignore_eos", true}, {"stream", stream}});
    net::io_context ioc;
    tcp::socket sock(ioc);
    sock.connect(s.endpoint());
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(sock, req);
    if (stream) {
      // 0 bytes: cut while the prompt is queued or prefilled; else somewhere in the token stream.
      const size_t want = rng() % 3 == 0 ? 0 : 1 + rng() % 6000;
      std::string got(want, '\0');
      if (want > 0) net::read(sock, net::buffer(got));
      EXPECT_EQ(got.find("[DONE]"), std::string::npos) << "a stream ended before it was cut";
      if (want > 0 && rng() % 2) sock.set_option(net::socket_base::linger(true, 0));  // RST, not FIN
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 30));
    }
    sock.close();
  }
  const auto m = wait_idle(s, submitted_before + num_requests, 30s);
  expect_idle(m, submitted_before + num_requests);
  EXPECT_EQ(m.at(aborted_key) - aborted_before, num_requests);
  EXPECT_EQ(get(s, "/health").status, 200);
}

// Many /v1/ws sockets with several generations each, dropped at random points (a close handshake or
// just the TCP connection) while deltas are being pushed.
TEST(loopback, websockets_dropped_while_tokens_flow_free_everything) {
  loopback_server s;
  const double aborted_before = metrics(s)[aborted_key];
  const double submitted_before = metrics(s)[submitted_key];
  std::mt19937 rng(11);
  constexpr int num_sockets = 20, per_socket = 4;
  for (int i = 0; i < num_sockets; ++i) {
    net::io_context ioc;
    websocket::stream<tcp::socket> ws(ioc);
    ws.next_layer().connect(s.endpoint());
    ws.handshake("127.0.0.1", "/v1/ws");
    for (int g = 0; g < per_socket; ++g) ws.write(net::buffer(start_message("g" + std::to_string(g), 20000)));
    // At least the "started" answers: every generation reached the runtime before the drop.
    const int want = per_socket + static_cast<int>(rng() % 200);
    for (int k = 0; k < want; ++k) {
      beast::flat_buffer buffer;
      ws.read(buffer);
    }
    if (i % 2) {
      ws.close(websocket::close_code::normal);  // the server answers; later frames are dropped
    } else {
      ws.next_layer().set_option(net::socket_base::linger(true, 0));
      ws.next_layer().close();
    }
  }
  const auto m = wait_idle(s, submitted_before + num_sockets * per_socket, 30s);
  expect_idle(m, submitted_before + num_sockets * per_socket);
  EXPECT_EQ(m.at(aborted_key) - aborted_before, num_sockets * per_socket);
  EXPECT_EQ(get(s, "/health").status, 200);
}

// The server stopped and destroyed while its generations' tokens are still being pushed, the runtime
// running on: ready hooks that fire after that must find the server's poster closed (and their
// sessions gone), never post into the destroyed io_context; the dropped streams abort their requests.
TEST(loopback, server_destroyed_while_tokens_flow) {
  loopback_server s;
  net::io_context ioc;
  std::vector<tcp::socket> sse;
  for (int i = 0; i < 4; ++i) {
    sse.emplace_back(ioc);
    sse.back().connect(s.endpoint());
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    // Endless in practice; prompt + max_tokens must fit the simulated model's 2^20-token context (else 400).
    req.body() =
        json::serialize(json::object{{"prompt", "x"}, {"max_tokens", 1 << 19}, {"ignore_eos", true}, {"stream", true}});
    req.prepare_payload();
    http::write(sse.back(), req);
    std::string got(2000, '\0');
    net::read(sse.back(), net::buffer(got));  // tokens are flowing
  }
  websocket::stream<tcp::socket> ws(ioc);
  ws.next_layer().connect(s.endpoint());
  ws.handshake("127.0.0.1", "/v1/ws");
  for (int g = 0; g < 4; ++g) ws.write(net::buffer(start_message("g" + std::to_string(g), 1 << 19)));
  for (int k = 0; k < 50; ++k) {
    beast::flat_buffer buffer;
    ws.read(buffer);
  }
  s.server->stop();
  s.server.reset();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (s.engine->stats().num_open > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  const actors::facade_stats st = s.engine->stats();
  EXPECT_EQ(st.num_open, 0) << "the dropped streams were aborted";
  EXPECT_EQ(st.device.num_used, 0);
  EXPECT_TRUE(s.engine->health().healthy);
}

}  // namespace
}  // namespace tessera::server
