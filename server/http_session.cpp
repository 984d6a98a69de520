#include "server/http_session.hpp"

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdio>
#include <sstream>

#include "server/logging.hpp"
#include "server/ws_session.hpp"

namespace tessera::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace json = boost::json;
using tcp = net::ip::tcp;
using actors::stream_delta;
using actors::stream_final;

namespace {

// "decode_tokens_per_second" -> "X-Tessera-Decode-Tokens-Per-Second".
std::string timing_header(std::string_view key) {
  std::string name = "X-Tessera-";
  bool upper = true;
  for (char c : key) {
    if (c == '_') {
      name += '-';
      upper = true;
    } else {
      name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
  }
  return name;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

http_session::http_session(server_state& state, tcp::socket socket)
    : state_(state), stream_(std::move(socket)), idle_timer_(stream_.get_executor()) {
  beast::error_code ec;
  const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
  if (!ec) peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
}

void http_session::run() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
}

// ---- reading and routing ----------------------------------------------------------------------

void http_session::do_read() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(state_.opt.max_body_bytes);
  parser_->header_limit(state_.opt.max_header_bytes);
  stream_.expires_after(num_requests_ == 0 ? state_.opt.read_timeout : state_.opt.idle_timeout);
  http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&http_session::on_read, shared_from_this()));
}

void http_session::on_read(beast::error_code ec, size_t) {
  if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted) {
    return do_close();
  }
  note_request();
  if (ec == http::error::body_limit) {
    return send_error(api_error(413, "request body exceeds " + std::to_string(state_.opt.max_body_bytes) + " bytes", "",
                                "body_too_large"),
                      false);
  }
  if (ec == http::error::header_limit) {
    return send_error(api_error(431, "request header block too large", "", "header_too_large"), false);
  }
  if (ec) return send_error(api_error(400, "malformed HTTP request: " + ec.message(), "", "bad_http"), false);
  ++num_requests_;
  // The read timer also covers the time a handler takes; keep the connection open while we answer.
  stream_.expires_never();
  request_ = parser_->release();
  try {
    handle();
  } catch (const api_error& e) {
    send_error(e, request_.keep_alive());
  } catch (const std::exception& e) {
    spdlog::error("{} {}: internal error: {}", log_method_, log_path_, e.what());
    send_error(api_error(500, std::string("internal error: ") + e.what()), false);
  }
}

void http_session::handle() {
  const bool keep_alive = request_.keep_alive();
  routing r = route_request(request_, state_);
  switch (r.to) {
    case route::ui_file: return send_message(std::move(*r.file), keep_alive);
    case route::completions: return start_generation(api_kind::completion, keep_alive);
    case route::chat_completions: return start_generation(api_kind::chat, keep_alive);
    case route::ws_generate:
    case route::ws_events:
      if (watch_pending_) throw api_error(400, "upgrade not possible now");
      start_ws_session(state_, r.to == route::ws_generate ? ws_kind::generate : ws_kind::events, stream_.release_socket(),
                       std::move(request_), r.authed);
      closed_ = true;
      return;
    default: return send_message(answer(r.to, request_, state_), keep_alive);
  }
}

// ---- generations ------------------------------------------------------------------------------

void http_session::start_generation(api_kind kind, bool keep_alive) {
  const int32_t vocab = state_.engine.config().vocab_size;
  generation_request req = parse_generation_request(request_.body(), kind, vocab, state_.opt.limits);
  if (!req.model.empty() && req.model != state_.opt.model_name) {
    throw api_error(404, "the model '" + req.model + "' does not exist (this server serves '" + state_.opt.model_name + "')",
                    "model", "model_not_found");
  }
  actors::stream_handle stream = state_.submit(req);
  busy_.emplace(state_);
  gen_.emplace();
  gen_->serial = num_requests_;
  gen_->meta = {state_.new_id(kind == api_kind::chat ? "chatcmpl" : "cmpl"), unix_seconds(),
                req.model.empty() ? state_.opt.model_name : req.model};
  gen_->progress = stream_progress(req.params.n);
  gen_->choices.resize(static_cast<size_t>(req.params.n));
  if (kind == api_kind::chat && parses_output(state_.opt.parsers, req.tools)) {
    for (int32_t i = 0; i < req.params.n; ++i) gen_->outputs.emplace_back(state_.opt.parsers, req.tools);
    for (auto& c : gen_->choices) c.parsed = true;
  }
  // HTTP/1.0 clients get an unchunked stream ended by closing the connection.
  const bool chunked = request_.version() >= 11;
  gen_->keep_alive = keep_alive && chunked;
  if (req.stream) gen_->sse.emplace(gen_->meta.id, chunked, gen_->keep_alive);
  gen_->req = std::move(req);
  gen_->stream = std::move(stream);
  // Keep a read pending so a client that goes away is noticed while the engine works.
  start_watch();
  std::weak_ptr<http_session> weak = shared_from_this();
  gen_->stream.on_ready([poster = state_.poster, weak, serial = gen_->serial] {
    poster->post(weak, [serial](http_session& s) { s.on_stream_ready(serial); });
  });
}

// Everything the stream holds now, at once (the hook is re-armed by the drain). Nothing here can tear
// the session down: writing only queues bytes, and errors come back as completions of their own.
void http_session::on_stream_ready(uint64_t serial) {
  if (!gen_ || closed_ || gen_->serial != serial) return;
  std::string out;
  for (actors::stream_item& item : gen_->stream.take_all()) {
    if (auto* d = std::get_if<stream_delta>(&item)) {
      on_delta(*d, out);
      continue;
    }
    if (!out.empty()) queue_write(std::move(out));
    return on_final(std::get<stream_final>(item));  // always the last item
  }
  if (!out.empty()) queue_write(std::move(out));
}

void http_session::on_delta(const stream_delta& d, std::string& out) {
  generation& g = *gen_;
  const request_output& o = d.output;
  if (!g.progress.take_delta(d, state_.metrics)) return;
  auto& c = g.choices[static_cast<size_t>(o.index)];
  c.text += o.text;
  c.token_ids.insert(c.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
  c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
  if (!g.outputs.empty()) {
    chat_output_stream& parser = g.outputs[static_cast<size_t>(o.index)];
    const int32_t calls_before = parser.num_calls();
    chat_piece piece = parser.feed(o.text);
    if (g.sse && (has_output(o) || !piece.empty())) {
      const bool first = !piece.empty() || (g.req.want_logprobs && !o.logprobs.empty()) ? g.progress.first_of_choice(o.index) : false;
      for (std::string& chunk : parsed_delta_chunks(g.req, g.meta, o.index, piece, first, calls_before, &o.logprobs,
                                                    state_.engine.tok().get())) {
        g.sse->event(chunk, out);
      }
    }
    take_piece(c, std::move(piece));
    return;
  }
  if (!g.sse || !has_output(o)) return;
  g.sse->event(delta_chunk(g.req, g.meta, o, g.progress.first_of_choice(o.index), state_.engine.tok().get()), out);
}

void http_session::take_piece(choice_accumulator& c, chat_piece piece) {
  c.reasoning += piece.reasoning;
  c.content += piece.content;
  for (auto& call : piece.calls) c.calls.push_back(std::move(call));
}

// The parsers' held-back text (a partial tag, a call still open) once the choices are done: sent
// before the finish chunks, and part of the non-streamed message.
void http_session::finish_outputs(std::string& out) {
  generation& g = *gen_;
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    const int32_t calls_before = g.outputs[i].num_calls();
    chat_piece piece = g.outputs[i].finish();
    if (g.sse && !piece.empty()) {
      const int32_t index = static_cast<int32_t>(i);
      for (std::string& chunk : parsed_delta_chunks(g.req, g.meta, index, piece, g.progress.first_of_choice(index),
                                                    calls_before, nullptr, state_.engine.tok().get())) {
        g.sse->event(chunk, out);
      }
    }
    take_piece(g.choices[i], std::move(piece));
  }
}

void http_session::on_final(const stream_final& f) {
  generation& g = *gen_;
  record_final(f, state_.metrics);
  const tokenizer* tok = state_.engine.tok().get();
  const bool keep_alive = g.keep_alive;
  note_final(f);
  if (f.reason == finish_reason::error) spdlog::error("request {} failed: {}", g.meta.id, f.error);

  if (f.reason == finish_reason::error && !(g.sse && g.sse->headers_sent())) {
    // Nothing was sent yet: a plain error response. A request the engine refused (prompt too
    // long, template error) never got an engine id: the client's fault.
    const int status = !f.request ? 400 : 500;
    std::string msg = f.error.empty() ? "request failed" : f.error;
    gen_.reset();
    // A refused structured output (a schema that does not compile, ...) names its own field.
    const bool field_error = status == 400 && !f.error_param.empty();
    return send_error(api_error(status, msg,
                                field_error     ? f.error_param
                                : status == 400 ? "prompt"
                                                : "",
                                field_error     ? "invalid_structured_output"
                                : status == 400 ? "invalid_prompt"
                                                : "engine_error"),
                      keep_alive);
  }
  std::string out;
  if (f.reason != finish_reason::error) finish_outputs(out);
  std::vector<int32_t> calls_per_choice;
  for (const auto& c : g.choices) calls_per_choice.push_back(static_cast<int32_t>(c.calls.size()));
  if (!g.sse) {
    http_response res{http::status::ok, 11};
    res.set(http::field::content_type, "application/json");
    res.set("X-Request-Id", g.meta.id);
    // Every member of `timings` as a header too: queue_seconds -> X-Tessera-Queue-Seconds, ...
    for (const auto& [key, value] : timings_json(f)) {
      char text[48];
      if (value.is_double()) std::snprintf(text, sizeof text, "%.6f", value.get_double());
      res.set(timing_header(key), value.is_double() ? std::string(text) : json::serialize(value));
    }
    res.body() = full_response(g.req, g.meta, g.choices, f, tok);
    gen_.reset();
    return send_message(std::move(res), keep_alive);
  }
  g.sse->finish(g.req, g.meta, f, out, &calls_per_choice);
  state_.metrics.record_http(200);
  log_response(200);
  gen_.reset();
  response_done_ = true;
  close_after_write_ = !keep_alive;
  queue_write(std::move(out));
}

void http_session::abort_generation() {
  if (!gen_) return;
  // The client went away: 499 (nginx's "client closed request") when nothing was sent yet.
  access_.request_id = gen_->meta.id;
  access_.outcome = "abort";
  access_.completion_tokens = gen_->progress.num_tokens();
  log_response(gen_->sse && gen_->sse->headers_sent() ? 200 : 499);
  state_.metrics.record_finish(finish_reason::abort);  // its final message is never read
  gen_->stream.on_ready({});
  gen_->stream.abort();
  gen_.reset();  // dropping the last handle also aborts; the engine actor frees the KV blocks
}

// ---- watching for a disconnect while the engine works ------------------------------------------

void http_session::start_watch() {
  if (watch_pending_ || closed_) return;
  watch_pending_ = true;
  stream_.async_read_some(buffer_.prepare(4096), beast::bind_front_handler(&http_session::on_watch, shared_from_this()));
}

void http_session::on_watch(beast::error_code ec, size_t n) {
  watch_pending_ = false;
  if (!ec) buffer_.commit(n);
  if (closed_) return;
  if (ec && (gen_ || want_read_)) {
    // The client went away (or reset): abort the request, free its KV blocks, drop the connection.
    abort_generation();
    return do_close();
  }
  if (gen_) {
    if (buffer_.size() < 64 * 1024) start_watch();  // pipelined bytes: keep them for the next read
    return;
  }
  if (want_read_) {
    want_read_ = false;
    idle_timer_.cancel();
    if (ec) return do_close();
    do_read();
  }
}

// ---- writing ----------------------------------------------------------------------------------

void http_session::send_error(const api_error& e, bool keep_alive) {
  http_response res{static_cast<http::status>(e.status), 11};
  res.set(http::field::content_type, "application/json");
  if (e.status == 405) res.set(http::field::allow, "GET, POST");
  if (e.status == 401) res.set(http::field::www_authenticate, "Bearer");
  res.body() = error_body(e);
  if (e.status == 413 || e.status == 431 || (e.status == 400 && e.code == "bad_http")) keep_alive = false;
  send_message(std::move(res), keep_alive);
}

void http_session::send_message(http_response res, bool keep_alive) {
  res.set(http::field::server, "tessera");
  res.keep_alive(keep_alive);
  if (request_.method() == http::verb::head) {
    res.content_length(res.body().size());
  } else {
    res.prepare_payload();
  }
  state_.metrics.record_http(static_cast<int>(res.result_int()));
  log_response(static_cast<int>(res.result_int()));
  std::ostringstream os;
  if (request_.method() == http::verb::head) os << res.base();
  else os << res;
  response_done_ = true;
  close_after_write_ = !keep_alive;
  queue_write(os.str());
}

void http_session::queue_write(std::string bytes) {
  if (closed_) return;
  pending_ += bytes;
  if (!write_in_flight_) start_write();
}

void http_session::start_write() {
  writing_.swap(pending_);
  pending_.clear();
  write_in_flight_ = true;
  net::async_write(stream_, net::buffer(writing_), beast::bind_front_handler(&http_session::on_write, shared_from_this()));
}

void http_session::on_write(beast::error_code ec, size_t) {
  write_in_flight_ = false;
  writing_.clear();
  if (ec) {
    abort_generation();
    return do_close();
  }
  if (!pending_.empty()) return start_write();
  if (!response_done_ || gen_) return;
  response_done_ = false;
  busy_.reset();
  if (close_after_write_) return do_close();
  if (watch_pending_) {
    // The watch read is still pending (cancelling it would also cancel writes): it becomes the first
    // read of the next request, under our own keep-alive timer.
    want_read_ = true;
    idle_timer_.expires_after(state_.opt.idle_timeout);
    idle_timer_.async_wait([self = shared_from_this()](beast::error_code wait_ec) {
      if (!wait_ec && self->want_read_) self->do_close();
    });
    return;
  }
  do_read();
}

void http_session::do_close() {
  if (closed_) return;
  closed_ = true;
  abort_generation();
  busy_.reset();
  idle_timer_.cancel();
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.socket().close(ec);
}

// ---- access log -------------------------------------------------------------------------------

void http_session::note_request() {
  started_at_ = std::chrono::steady_clock::now();
  const auto& m = parser_->get();
  log_method_ = m.method_string().empty() ? std::string("-") : std::string(m.method_string());
  const std::string_view target(m.target().data(), m.target().size());
  log_path_ = target.empty() ? std::string("-") : std::string(target.substr(0, target.find('?')));
  access_ = {};
}

void http_session::note_final(const stream_final& f) {
  access_.request_id = gen_->meta.id;
  access_.outcome = std::string(to_string(f.reason));
  access_.prompt_tokens = f.num_prompt_tokens;
  access_.completion_tokens = f.num_generated_tokens;
}

void http_session::log_response(int status) {
  access_entry e;
  e.method = log_method_;
  e.path = log_path_;
  e.status = status;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count();
  e.request_id = access_.request_id;
  e.peer = peer_;
  e.outcome = access_.outcome;
  e.prompt_tokens = access_.prompt_tokens;
  e.completion_tokens = access_.completion_tokens;
  log_access(e);
  access_ = {};
}

}  // namespace tessera::server
