// One WebSocket connection after the upgrade, on the connection's strand: /v1/ws runs any number of
// generations (start, cancel, one delta per engine step and choice, one final each) and /v1/events
// streams the event hub's batches. Messages and limits: docs/websocket.md. Every message in either
// direction is one JSON text frame; writes are queued one after the other, and a reader that lets
// ws_max_queued_messages pile up is disconnected.
//
// Streams are pushed: each generation's ready hook posts on_stream_ready(id, serial) to this strand
// (through the server's session_poster, holding the session weakly), which drains that generation.
//
// Deadlines: a message (or the close frame) that makes no progress for --write-timeout closes the
// socket (a peer that never reads would otherwise keep its generations and queue forever), and with
// an API key required, a socket that has not authenticated within ws_auth_timeout is closed (1008).
// Frames that arrived in the same read as the upgrade request are read first (prefixed_stream).
//
// Teardown cannot meet a loop over the generations (issue #14: closing from inside the loop that sent
// the deltas cleared the map under it). Closing, whatever starts it (a send over the queue limit, a
// failed read or write, a bad auth), only marks the session closing and posts teardown(); teardown()
// is the one place besides a drain's own final that removes generations, and a drain builds its
// messages first, erases a finished generation, and only then sends, holding nothing across a send.
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
#include "server/chat_output.hpp"
#include "server/event_hub.hpp"
#include "server/guarded_handlers.hpp"
#include "server/metrics.hpp"
#include "server/prefixed_stream.hpp"
#include "server/router.hpp"
#include "server/server_state.hpp"
#include "server/stream_format.hpp"
#include "server/ws_message.hpp"

namespace tessera::server {

enum class ws_kind : uint8_t { generate, events };

// Takes over the upgraded connection (`req` is the upgrade request, already routed and checked;
// `early` the bytes read after it, the client's first frames).
void start_ws_session(server_state& state, ws_kind kind, boost::asio::ip::tcp::socket socket, http_request req,
                      bool authed, std::string early = {});

class ws_session : public std::enable_shared_from_this<ws_session>, guarded_handlers<ws_session> {
 public:
  ws_session(server_state& state, ws_kind kind, boost::asio::ip::tcp::socket socket, bool authed, std::string early);
  ~ws_session();
  void run(http_request req);
  boost::asio::any_io_executor get_executor() { return ws_.get_executor(); }

 private:
  struct ws_generation {
    uint64_t serial = 0;  // unique on this socket: a late notification for an ended generation whose id
                          // was reused finds a different serial
    generation_request req;
    actors::stream_handle stream;
    std::string request_id;
    stream_progress progress{0};              // its tokens so far count in the access line of an aborted one
    std::vector<chat_output_stream> outputs;  // chat with output parsers: one per choice
    std::vector<int32_t> calls_per_choice;
    std::chrono::steady_clock::time_point started_at = std::chrono::steady_clock::now();
  };

  friend class guarded_handlers<ws_session>;
  void fail(const char* what) noexcept;  // a handler threw (guarded_handlers): log, count, close
  void arm_write_timer();
  void on_accept(boost::beast::error_code ec);
  void on_authed();
  void do_read();
  void on_read(boost::beast::error_code ec, size_t);
  void handle(const std::string& text);
  void start(const ws_envelope& message);
  void on_stream_ready(const std::string& id, uint64_t serial);
  void send_event(const event_hub::message& m);
  void send(std::string text);
  void send_error(const api_error& e, const std::string& id);
  void push(event_hub::message m);
  void do_write();
  void on_write(boost::beast::error_code ec, size_t);
  void update_busy();
  void close(boost::beast::websocket::close_code code);  // a close frame after the message being written
  void begin_close();                                    // marks closing, posts teardown()
  void teardown();
  // One access-log line per generation on the socket ("WS /v1/ws").
  void log_generation(int status, const std::string& request_id, double seconds, std::string_view outcome,
                      int64_t prompt_tokens, int64_t completion_tokens);

  server_state& state_;
  connection_gauge gauge_;
  ws_kind kind_;
  boost::beast::websocket::stream<prefixed_stream<boost::beast::tcp_stream>> ws_;
  boost::asio::steady_timer write_timer_;  // armed while a message or the close frame is being written
  uint64_t write_timer_serial_ = 0;
  bool closing_write_ = false;  // the close frame is being written
  boost::asio::steady_timer auth_timer_;
  boost::beast::flat_buffer buffer_;
  http_request req_;
  std::map<std::string, ws_generation> gens_;
  std::optional<busy_token> busy_;
  std::deque<event_hub::message> queue_;
  uint64_t hub_id_ = 0;
  uint64_t num_started_ = 0;
  std::string peer_;
  bool authed_ = false;
  bool closing_ = false;  // no more reads, messages or generations; teardown() is posted
};

}  // namespace tessera::server
