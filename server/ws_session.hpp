// One WebSocket connection after the upgrade, on the connection's strand: /v1/ws runs any number of
// generations (start, cancel, one delta per engine step and choice, one final each) and /v1/events
// streams the event hub's batches. Messages and limits: docs/websocket.md. Every message in either
// direction is one JSON text frame; writes are queued one after the other, and a reader that lets
// ws_max_queued_messages pile up is disconnected.
#pragma once
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <simdjson.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "server/api_error.hpp"
#include "server/event_hub.hpp"
#include "server/router.hpp"
#include "server/server_state.hpp"
#include "server/stream_format.hpp"

namespace tessera::server {

enum class ws_kind : uint8_t { generate, events };

// Takes over the upgraded connection (`req` is the upgrade request, already routed and checked).
void start_ws_session(server_state& state, ws_kind kind, boost::asio::ip::tcp::socket socket, http_request req,
                      bool authed);

class ws_session : public std::enable_shared_from_this<ws_session> {
 public:
  ws_session(server_state& state, ws_kind kind, boost::asio::ip::tcp::socket socket, bool authed);
  ~ws_session();
  void run(http_request req);

 private:
  struct ws_generation {
    generation_request req;
    actors::stream_handle stream;
    std::string request_id;
    stream_progress progress{0};  // its tokens so far count in the access line of an aborted one
    std::chrono::steady_clock::time_point started_at = std::chrono::steady_clock::now();
  };

  void on_accept(boost::beast::error_code ec);
  void on_authed();
  void do_read();
  void on_read(boost::beast::error_code ec, size_t);
  void handle(const std::string& text);
  void start(simdjson::dom::element doc, const std::string& id);
  void schedule_poll();
  void on_poll();
  void send_event(const event_hub::message& m);
  void send(std::string text);
  void send_error(const api_error& e, const std::string& id);
  void push(event_hub::message m);
  void do_write();
  void on_write(boost::beast::error_code ec, size_t);
  void update_busy();
  void close(boost::beast::websocket::close_code code);
  void on_closed();
  // One access-log line per generation on the socket ("WS /v1/ws").
  void log_generation(int status, const std::string& request_id, double seconds, std::string_view outcome,
                      int64_t prompt_tokens, int64_t completion_tokens);

  server_state& state_;
  ws_kind kind_;
  boost::beast::websocket::stream<boost::beast::tcp_stream> ws_;
  boost::beast::flat_buffer buffer_;
  http_request req_;
  boost::asio::steady_timer poll_timer_;
  std::map<std::string, ws_generation> gens_;
  std::optional<busy_token> busy_;
  std::deque<event_hub::message> queue_;
  uint64_t hub_id_ = 0;
  std::string peer_;
  bool authed_ = false;
  bool polling_ = false;
  bool closed_ = false;
};

}  // namespace tessera::server
