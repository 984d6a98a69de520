// One HTTP/1.1 connection, on its own strand: reads requests (keep-alive, pipelining, read deadlines),
// checks their framing on the header alone (server/http_checks.hpp) and answers Expect: 100-continue
// before the body, routes them (server/router.hpp), answers the plain routes, tokenizes /tokenize
// prompts on the tokenizer actors, runs generations (an SSE stream through an sse_writer, or one JSON
// body), keeps a read pending while the engine works so that a client that goes away aborts its
// request, writes one response after the other under a write-progress deadline, and hands WebSocket
// upgrades over to a ws_session. One access-log line per request.
//
// A generation's stream is pushed, not polled: its ready hook (called on the runtime's thread) posts
// on_stream_ready() to this strand through the server's session_poster, holding the session only
// weakly; the posted handler holds it strongly until it has run, and finds the generation gone (or
// replaced, by serial) if the connection ended or moved on meanwhile. A client that reads slower than
// the engine writes is not drained further while 256 KiB wait for it: the stream buffer then merges
// deltas (bounded), and the drain resumes when the socket takes bytes again.
//
// Every completion handler runs through guarded(): an exception closes this connection (logged and
// counted), never the I/O thread.
#pragma once
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "server/api_error.hpp"
#include "server/chat_output.hpp"
#include "server/guarded_handlers.hpp"
#include "server/metrics.hpp"
#include "server/openai_format.hpp"
#include "server/responses_format.hpp"
#include "server/router.hpp"
#include "server/server_state.hpp"
#include "server/sse_writer.hpp"
#include "server/stream_format.hpp"

namespace tessera::server {

class http_session : public std::enable_shared_from_this<http_session>, guarded_handlers<http_session> {
 public:
  http_session(server_state& state, boost::asio::ip::tcp::socket socket);
  void run();
  boost::asio::any_io_executor get_executor() { return stream_.get_executor(); }

 private:
  struct generation {
    uint64_t serial = 0;  // which request of the connection: a late notification names its own
    generation_request req;
    // One engine request per prompt (a /v1/completions batch has several: server/prompt_batch.hpp);
    // finals[p] holds prompt p's final message once it came, and the response ends when all did.
    std::vector<actors::stream_handle> streams;
    std::vector<std::optional<actors::stream_final>> finals;
    // echo: per choice, the prompt text its first streamed chunk still has to carry.
    std::vector<std::string> echo_pending;
    response_meta meta;
    stream_progress progress{0};
    std::vector<choice_accumulator> choices;  // what a non-streaming response returns
    // Chat with output parsers: one per choice, splitting reasoning / content / tool calls as the
    // text arrives; empty: the text passes as is.
    std::vector<chat_output_stream> outputs;
    std::optional<sse_writer> sse;  // req.stream only
    // /v1/responses (server/responses_format.hpp): what its Response repeats, its ids, and when
    // streamed its events' state. The chat request runs as any other; only its answer differs.
    std::optional<responses_echo> responses;
    response_ids responses_ids;
    std::optional<responses_stream> responses_events;
    bool keep_alive = true;
  };

  // What the access line of the current request says beyond method, path and status.
  struct access_note {
    std::string request_id;
    std::string outcome;
    int64_t prompt_tokens = -1;
    int64_t completion_tokens = -1;
  };

  friend class guarded_handlers<http_session>;
  void fail(const char* what) noexcept;  // a handler threw (guarded_handlers): log, count, close

  // reading and routing
  void do_read();
  void on_header(boost::beast::error_code ec, size_t n);
  void on_read(boost::beast::error_code ec, size_t);
  bool read_failed(boost::beast::error_code ec);
  void handle();
  // /tokenize, off the I/O thread
  void start_tokenize(bool keep_alive);
  void on_tokenized(uint64_t serial, int status, const char* param, std::string body);
  // generations
  void start_generation(generation_request req, std::optional<responses_echo> responses, bool keep_alive);
  void on_stream_ready(uint64_t serial);
  void on_delta(actors::stream_delta& d, std::string& out);  // d's choice index is the response's
  void on_prompt_final(size_t prompt_index, actors::stream_final f);
  void on_final(const actors::stream_final& f);
  static void take_piece(choice_accumulator& c, chat_piece piece);
  void finish_outputs(std::string& out);
  void abort_generation();
  // watching for a client that goes away while the engine works
  void start_watch();
  void on_watch(boost::beast::error_code ec, size_t n);
  bool request_running() const { return gen_.has_value() || tokenizing_; }
  // writing
  void send_error(const api_error& e, bool keep_alive);
  void send_message(http_response res, bool keep_alive);
  void queue_write(std::string bytes);
  void start_write();
  void write_some();
  void on_write_some(boost::beast::error_code ec, size_t n);
  void on_write_done();
  void arm_write_timer();
  void do_close();
  void linger_close();
  void linger_read();
  void on_linger_read(boost::beast::error_code ec, size_t n);
  void end_linger();
  // access log
  void note_request();
  void note_final(const actors::stream_final& f);
  void log_response(int status);

  server_state& state_;
  connection_gauge gauge_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;  // bounded: read_buffer_limit() (http_checks.hpp)
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  size_t header_bytes_ = 0;       // the current request's header section, as the parser consumed it
  size_t num_header_fields_ = 0;  // fields beyond these, after the body, are its trailer section
  http_request request_;
  std::optional<generation> gen_;
  std::optional<busy_token> busy_;
  // writing: `writing_` is on the wire from write_offset_ on; what comes meanwhile waits in `pending_`
  std::string writing_, pending_;
  size_t write_offset_ = 0;
  bool write_in_flight_ = false;
  boost::asio::steady_timer write_timer_;
  uint64_t write_timer_serial_ = 0;  // a wait that completes after it was re-armed is stale
  bool drain_deferred_ = false;      // a drain was skipped while the client lagged; resume after a write
  // /tokenize: the request whose answer is being computed on a tokenizer actor
  bool tokenizing_ = false;
  uint64_t tokenize_serial_ = 0;
  bool tokenize_keep_alive_ = true;
  bool response_done_ = false;
  bool close_after_write_ = false;
  bool watch_pending_ = false;
  bool watch_discards_ = false;  // the pending watch reads into discard_, not into buffer_
  bool flooded_ = false;         // pipelined bytes beyond the buffer arrived: no more requests here
  std::unique_ptr<std::array<char, 4096>> discard_;
  bool want_read_ = false;  // the response is out: the pending watch read is being cancelled for do_read
  bool closed_ = false;
  bool lingering_ = false;  // half-closed after the last response, dropping what the client still sends
  size_t linger_bytes_ = 0;
  uint64_t num_requests_ = 0;
  std::string peer_;  // "address:port" of the client
  std::string log_method_ = "-", log_path_ = "-";
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  access_note access_;
  std::string cors_origin_;  // this request's Origin when it is allowed (server/cors.hpp); "" none
};

}  // namespace tessera::server
