// One HTTP/1.1 connection, on its own strand: reads requests (keep-alive, with read deadlines), routes
// them (server/router.hpp), answers the plain routes, runs generations (an SSE stream through an
// sse_writer, or one JSON body), keeps a read pending while the engine works so that a client that
// goes away aborts its request, writes one response after the other, and hands WebSocket upgrades
// over to a ws_session. One access-log line per request.
//
// A generation's stream is pushed, not polled: its ready hook (called on the runtime's thread) posts
// on_stream_ready() to this strand through the server's session_poster, holding the session only
// weakly; the posted handler holds it strongly until it has run, and finds the generation gone (or
// replaced, by serial) if the connection ended or moved on meanwhile.
#pragma once
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "server/api_error.hpp"
#include "server/chat_output.hpp"
#include "server/openai_format.hpp"
#include "server/router.hpp"
#include "server/server_state.hpp"
#include "server/sse_writer.hpp"
#include "server/stream_format.hpp"

namespace tessera::server {

class http_session : public std::enable_shared_from_this<http_session> {
 public:
  http_session(server_state& state, boost::asio::ip::tcp::socket socket);
  void run();
  boost::asio::any_io_executor get_executor() { return stream_.get_executor(); }

 private:
  struct generation {
    uint64_t serial = 0;  // which request of the connection: a late notification names its own
    generation_request req;
    actors::stream_handle stream;
    response_meta meta;
    stream_progress progress{0};
    std::vector<choice_accumulator> choices;  // what a non-streaming response returns
    // Chat with output parsers: one per choice, splitting reasoning / content / tool calls as the
    // text arrives; empty: the text passes as is.
    std::vector<chat_output_stream> outputs;
    std::optional<sse_writer> sse;            // req.stream only
    bool keep_alive = true;
  };

  // What the access line of the current request says beyond method, path and status.
  struct access_note {
    std::string request_id;
    std::string outcome;
    int64_t prompt_tokens = -1;
    int64_t completion_tokens = -1;
  };

  // reading and routing
  void do_read();
  void on_read(boost::beast::error_code ec, size_t);
  void handle();
  // generations
  void start_generation(api_kind kind, bool keep_alive);
  void on_stream_ready(uint64_t serial);
  void on_delta(const actors::stream_delta& d, std::string& out);
  void on_final(const actors::stream_final& f);
  static void take_piece(choice_accumulator& c, chat_piece piece);
  void finish_outputs(std::string& out);
  void abort_generation();
  // watching for a client that goes away while the engine works
  void start_watch();
  void on_watch(boost::beast::error_code ec, size_t n);
  // writing
  void send_error(const api_error& e, bool keep_alive);
  void send_message(http_response res, bool keep_alive);
  void queue_write(std::string bytes);
  void start_write();
  void on_write(boost::beast::error_code ec, size_t);
  void do_close();
  // access log
  void note_request();
  void note_final(const actors::stream_final& f);
  void log_response(int status);

  server_state& state_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  http_request request_;
  boost::asio::steady_timer idle_timer_;  // keep-alive wait while the watch read stands in for the next read
  std::optional<generation> gen_;
  std::optional<busy_token> busy_;
  std::string writing_, pending_;
  bool write_in_flight_ = false;
  bool response_done_ = false;
  bool close_after_write_ = false;
  bool watch_pending_ = false;
  bool want_read_ = false;
  bool closed_ = false;
  uint64_t num_requests_ = 0;
  std::string peer_;  // "address:port" of the client
  std::string log_method_ = "-", log_path_ = "-";
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  access_note access_;
};

}  // namespace tessera::server
