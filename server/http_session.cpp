#include "server/http_session.hpp"

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <cctype>
#include <cstdio>
#include <sstream>

#include "server/cors.hpp"
#include "server/http_checks.hpp"
#include "server/logging.hpp"
#include "server/prompt_batch.hpp"
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

// While this much output waits for a client, its stream is not drained further (see the header).
constexpr size_t k_max_pending_bytes = 256 * 1024;
// After a response that ends the connection, what the client still sends is read and dropped for at
// most this long and this much (linger_close).
constexpr auto k_linger_time = std::chrono::seconds(2);
constexpr size_t k_linger_max_bytes = 1 << 20;

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

bool is_disconnect(beast::error_code ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::operation_aborted || ec == net::error::bad_descriptor;
}

}  // namespace

http_session::http_session(server_state& state, tcp::socket socket)
    : state_(state),
      gauge_(state.metrics, connection_kind::http),
      stream_(std::move(socket)),
      buffer_(read_buffer_limit(state.opt.max_header_bytes)),
      write_timer_(stream_.get_executor()) {
  beast::error_code ec;
  const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
  if (!ec) peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
}

void http_session::run() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->run_guarded([&] { self->do_read(); }); });
}

// Whatever a handler threw: this connection ends (its request aborted), the I/O thread goes on.
void http_session::fail(const char* what) noexcept {
  try {
    spdlog::error("connection {} ({} {}): internal error: {}; closing it", peer_, log_method_, log_path_, what);
    state_.metrics.record_exception();
    if (!closed_) state_.metrics.record_closed(close_reason::internal_error);
    do_close();
  } catch (...) {
    closed_ = true;
    beast::error_code ec;
    stream_.socket().close(ec);
  }
}

// ---- reading and routing ----------------------------------------------------------------------

void http_session::do_read() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(state_.opt.max_body_bytes);
  parser_->header_limit(state_.opt.max_header_bytes);
  // One deadline for the header and the body together (a slow loris is dropped).
  stream_.expires_after(num_requests_ == 0 ? state_.opt.read_timeout : state_.opt.idle_timeout);
  http::async_read_header(stream_, buffer_, *parser_, guarded(&http_session::on_header));
}

// Errors while reading a request: true when the connection is done with (closed or answered).
bool http_session::read_failed(beast::error_code ec) {
  if (!ec) return false;
  if (is_disconnect(ec)) {
    do_close();
    return true;
  }
  if (ec == beast::error::timeout) {
    // A request begun and not finished in time is a slow client; an idle keep-alive connection is not.
    if (parser_ && parser_->got_some()) state_.metrics.record_closed(close_reason::read_timeout);
    do_close();
    return true;
  }
  note_request();
  if (ec == http::error::body_limit) {
    send_error(api_error(413, "request body exceeds " + std::to_string(state_.opt.max_body_bytes) + " bytes", "",
                         "body_too_large"),
               false);
  } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    // buffer_overflow: a header section, chunk line or trailer section larger than the read buffer.
    send_error(api_error(431, "request header or trailer section too large", "", "header_too_large"), false);
  } else {
    send_error(api_error(400, "malformed HTTP request: " + ec.message(), "", "bad_http"), false);
  }
  return true;
}

void http_session::on_header(beast::error_code ec, size_t n) {
  if (read_failed(ec)) return;
  note_request();
  header_bytes_ = n;
  num_header_fields_ = count_fields(parser_->get());
  // Framing and expectations are decided on the header, before any body byte is trusted; a request
  // refused here is answered and the connection closed (its body, if any, is never read).
  bool send_continue = false;
  try {
    check_framing(parser_->get());
    send_continue = parse_expect(parser_->get()) == expectation::continue_100 && !parser_->is_done();
    // RFC 9110 §10.1.1: a request that will be refused anyway gets its final status instead of 100.
    if (send_continue) route_request(parser_->get(), state_);
  } catch (const api_error& e) { return send_error(e, false); }
  if (send_continue) queue_write("HTTP/1.1 100 Continue\r\n\r\n");
  if (parser_->is_done()) return on_read({}, 0);
  http::async_read(stream_, buffer_, *parser_, guarded(&http_session::on_read));
}

void http_session::on_read(beast::error_code ec, size_t) {
  if (read_failed(ec)) return;
  // The trailer section counts against the same limit as the header section, and is dropped.
  const size_t trailer_bytes = take_trailer_section(parser_->get(), num_header_fields_);
  if (header_bytes_ + trailer_bytes > state_.opt.max_header_bytes) {
    return send_error(
        api_error(
            431, "request header and trailer sections exceed " + std::to_string(state_.opt.max_header_bytes) + " bytes",
            "", "header_too_large"),
        false);
  }
  ++num_requests_;
  // The read timer also covers the time a handler takes; keep the connection open while we answer.
  stream_.expires_never();
  request_ = parser_->release();
  try {
    if (state_.opt.before_route)
      state_.opt.before_route(std::string_view(request_.target().data(), request_.target().size()));
    handle();
  } catch (const api_error& e) { send_error(e, request_.keep_alive()); } catch (const std::exception& e) {
    spdlog::error("{} {}: internal error: {}", log_method_, log_path_, e.what());
    send_error(api_error(500, std::string("internal error: ") + e.what()), false);
  }
}

void http_session::handle() {
  const bool keep_alive = request_.keep_alive();
  routing r = route_request(request_, state_);
  switch (r.to) {
    case route::ui_file:
    case route::preflight: return send_message(std::move(*r.ready), keep_alive);
    case route::completions:
    case route::chat_completions: {
      const api_kind kind = r.to == route::chat_completions ? api_kind::chat : api_kind::completion;
      return start_generation(
          parse_generation_request(request_.body(), kind, state_.engine.config().vocab_size, state_.opt.limits),
          std::nullopt, keep_alive);
    }
    case route::responses: {
      responses_request rr =
          parse_responses_request(request_.body(), state_.engine.config().vocab_size, state_.opt.limits);
      return start_generation(std::move(rr.chat), std::move(rr.echo), keep_alive);
    }
    case route::embeddings:
      // An embedding runs as a generation does (one engine request per input, the same stream
      // machinery), with no tokens and its vector in each final (llm_engine::add_embedding_request).
      return start_generation(parse_embedding_request(request_.body(), state_.engine.config().vocab_size,
                                                      state_.engine.config().hidden_size, state_.opt.limits),
                              std::nullopt, keep_alive);
    case route::tokenize: return start_tokenize(keep_alive);
    case route::ws_generate:
    case route::ws_events: {
      if (watch_pending_ || write_in_flight_) throw api_error(400, "upgrade not possible now");
      // Bytes after the upgrade request are the client's first frames: they go with the socket.
      std::string early = beast::buffers_to_string(buffer_.data());
      buffer_.consume(buffer_.size());
      closed_ = true;
      write_timer_.cancel();
      start_ws_session(state_, r.to == route::ws_generate ? ws_kind::generate : ws_kind::events,
                       stream_.release_socket(), std::move(request_), r.authed, std::move(early));
      return;
    }
    default: return send_message(answer(r.to, request_, state_), keep_alive);
  }
}

// ---- /tokenize ----------------------------------------------------------------------------------

// Encoding megabytes of text (or rendering a chat template) takes the tokenizer long enough to stall
// every stream of this I/O thread: it runs on a tokenizer actor (a thread of its own), the body is
// built where its answer arrives (a short-lived CAF actor), and the reply is posted back to this
// strand. Meanwhile the watch read notices a client that leaves.
void http_session::start_tokenize(bool keep_alive) {
  const tokenize_request t = parse_tokenize_request(request_.body());
  if (!state_.engine.tok()) throw api_error(400, "this model has no tokenizer");
  actors::prompt_input prompt =
      t.is_chat ? actors::prompt_input::from_chat(t.messages) : actors::prompt_input::from_text(t.prompt);
  prompt.add_special = t.add_special_tokens;
  prompt.parse_special = t.parse_special;
  tokenizing_ = true;
  tokenize_serial_ = num_requests_;
  tokenize_keep_alive_ = keep_alive;
  start_watch();
  std::weak_ptr<http_session> weak = shared_from_this();
  const bool chat = t.is_chat;
  const int32_t max_model_len = state_.engine.max_model_len();
  state_.engine.tokenize_async(std::move(prompt), [poster = state_.poster, weak, serial = tokenize_serial_, chat,
                                                   max_model_len](actors::tokenize_result r) {
    int status = 200;
    std::string body;
    if (r.error.empty()) {
      body = tokenize_body(r.ids, max_model_len);
    } else {
      status = r.refused ? 503 : 400;
      body = r.error;
      if (chat && !r.refused) body = "cannot render the conversation: " + body;
    }
    poster->post(weak, [serial, status, chat, body = std::move(body)](http_session& s) mutable {
      s.run_guarded([&] { s.on_tokenized(serial, status, chat ? "messages" : "prompt", std::move(body)); });
    });
  });
}

void http_session::on_tokenized(uint64_t serial, int status, const char* param, std::string body) {
  if (closed_ || !tokenizing_ || serial != tokenize_serial_) return;
  tokenizing_ = false;
  if (status != 200) {
    return send_error(api_error(status, body, status == 400 ? param : "", status == 503 ? "unavailable" : ""),
                      tokenize_keep_alive_);
  }
  send_message(json_response(std::move(body)), tokenize_keep_alive_);
}

// ---- generations ------------------------------------------------------------------------------

void http_session::start_generation(generation_request req, std::optional<responses_echo> responses, bool keep_alive) {
  const api_kind kind = req.kind;
  if (!req.model.empty() && !serves_model(state_.opt, req.model)) {
    throw api_error(404,
                    "the model '" + sanitize_utf8(req.model) + "' does not exist (this server serves " +
                        served_names(state_.opt) + ")",
                    "model", "model_not_found");
  }
  // Submitted before anything is set up: a refusal (429, 503) throws, and the handles of the prompts
  // submitted before it abort theirs as they go.
  std::vector<actors::stream_handle> streams;
  streams.push_back(state_.submit(req));
  for (const actors::prompt_input& more : req.more_prompts) {
    generation_request one = req;
    one.prompt = more;
    one.more_prompts.clear();
    streams.push_back(state_.submit(one));
  }
  busy_.emplace(state_);
  gen_.emplace();
  gen_->serial = num_requests_;
  // As vLLM: responses name the first served model name whichever alias the request used.
  const char* id_prefix = kind == api_kind::chat ? "chatcmpl" : kind == api_kind::embedding ? "embd" : "cmpl";
  gen_->meta = {responses ? state_.new_id("resp", '_') : state_.new_id(id_prefix), unix_seconds(),
                state_.opt.model_name};
  const int32_t num_choices = num_prompts(req) * req.params.n;
  gen_->progress = stream_progress(num_choices);
  gen_->choices.resize(static_cast<size_t>(num_choices));
  if (responses) {
    gen_->responses_ids = {gen_->meta.id, state_.new_id("msg", '_'), gen_->meta.created, gen_->meta.model};
    if (req.stream) gen_->responses_events.emplace(*responses, gen_->responses_ids);
    gen_->responses = std::move(responses);
  } else if (kind == api_kind::chat && parses_output(state_.opt.parsers, req.tools)) {
    // (Not for /v1/responses: its plain-text subset passes the model's text as it is.)
    for (int32_t i = 0; i < req.params.n; ++i) gen_->outputs.emplace_back(state_.opt.parsers, req.tools);
    for (auto& c : gen_->choices) c.parsed = true;
  }
  if (req.echo) {
    // The whole response's text begins with the prompt; a stream sends it with each choice's first chunk.
    const tokenizer* tok = state_.engine.tok().get();
    if (req.stream) gen_->echo_pending.resize(gen_->choices.size());
    for (size_t p = 0; p < streams.size(); ++p) {
      const std::string text = echo_text(p == 0 ? req.prompt : req.more_prompts[p - 1], tok);
      for (int32_t i = 0; i < req.params.n; ++i) {
        const auto at = static_cast<size_t>(batch_choice_index(p, req.params.n, i));
        (req.stream ? gen_->echo_pending[at] : gen_->choices[at].text) = text;
      }
    }
  }
  // HTTP/1.0 clients get an unchunked stream ended by closing the connection.
  const bool chunked = request_.version() >= 11;
  gen_->keep_alive = keep_alive && chunked;
  if (req.stream) gen_->sse.emplace(gen_->meta.id, chunked, gen_->keep_alive, cors_origin_);
  gen_->req = std::move(req);
  gen_->streams = std::move(streams);
  gen_->finals.resize(gen_->streams.size());
  // Keep a read pending so a client that goes away is noticed while the engine works.
  start_watch();
  std::weak_ptr<http_session> weak = shared_from_this();
  for (actors::stream_handle& stream : gen_->streams) {
    // Each stream's hook drains them all: on_stream_ready reads every stream, so every hook is re-armed.
    stream.on_ready([poster = state_.poster, weak, serial = gen_->serial] {
      poster->post(weak, [serial](http_session& s) { s.run_guarded([&] { s.on_stream_ready(serial); }); });
    });
  }
}

// Everything the streams hold now, at once (the hooks are re-armed by the drain). Nothing here can tear
// the session down: writing only queues bytes, and errors come back as completions of their own.
void http_session::on_stream_ready(uint64_t serial) {
  if (!gen_ || closed_ || gen_->serial != serial) return;
  if (write_in_flight_ && pending_.size() >= k_max_pending_bytes) {
    // The client lags: leave the items in the streams' buffers (which merge deltas) until it reads.
    drain_deferred_ = true;
    return;
  }
  drain_deferred_ = false;
  std::string out;
  const int32_t n = gen_->req.params.n;
  for (size_t p = 0; gen_ && p < gen_->streams.size(); ++p) {
    if (gen_->finals[p]) continue;
    for (actors::stream_item& item : gen_->streams[p].take_all()) {
      if (auto* d = std::get_if<stream_delta>(&item)) {
        d->output.index = batch_choice_index(p, n, d->output.index);
        on_delta(*d, out);
        continue;
      }
      if (!out.empty()) queue_write(std::move(out));
      out.clear();
      on_prompt_final(p, std::move(std::get<stream_final>(item)));  // always a stream's last item
      break;
    }
  }
  if (!out.empty()) queue_write(std::move(out));
}

// Prompt p's request ended. A failed one ends the others too (the response fails as a whole); the
// response's final comes once every prompt's did.
void http_session::on_prompt_final(size_t prompt_index, stream_final f) {
  generation& g = *gen_;
  const bool failed = f.reason == finish_reason::error;
  g.finals[prompt_index] = std::move(f);
  if (failed) {
    for (size_t p = 0; p < g.streams.size(); ++p) {
      if (!g.finals[p]) g.streams[p].abort();
    }
  }
  if (std::any_of(g.finals.begin(), g.finals.end(), [](const auto& x) { return !x.has_value(); })) return;
  // Out of the generation first: on_final resets gen_ while it still reads the final.
  std::vector<stream_final> finals;
  for (auto& x : g.finals) finals.push_back(std::move(*x));
  const stream_final whole = finals.size() == 1 ? std::move(finals.front()) : merged_final(finals, g.req.params.n);
  on_final(whole);
}

void http_session::on_delta(stream_delta& d, std::string& out) {
  generation& g = *gen_;
  request_output& o = d.output;
  if (!g.progress.take_delta(d, state_.metrics)) return;
  // The prompt goes with the choice's first output, or its final one when it generated nothing
  // (max_tokens 0: the prompt alone; not a failure, which stays a plain error before any chunk).
  const bool ended_well = o.finished && (o.reason == finish_reason::stop || o.reason == finish_reason::length);
  if (!g.echo_pending.empty() && (has_output(o) || ended_well || !o.prompt_logprobs.empty())) {
    std::string& echo = g.echo_pending[static_cast<size_t>(o.index)];
    o.text.insert(0, echo);
    echo.clear();
  }
  auto& c = g.choices[static_cast<size_t>(o.index)];
  c.text += o.text;
  c.token_ids.insert(c.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
  c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
  if (!o.prompt_logprobs.empty()) c.prompt_logprobs = o.prompt_logprobs;
  if (g.responses_events) {
    g.responses_events->text(g.req, o.text, *g.sse, out);
    return;
  }
  if (!g.outputs.empty()) {
    chat_output_stream& parser = g.outputs[static_cast<size_t>(o.index)];
    const int32_t calls_before = parser.num_calls();
    chat_piece piece = parser.feed(o.text);
    if (g.sse && (has_output(o) || !piece.empty())) {
      const bool first =
          !piece.empty() || (g.req.want_logprobs && !o.logprobs.empty()) ? g.progress.first_of_choice(o.index) : false;
      for (std::string& chunk : parsed_delta_chunks(g.req, g.meta, o.index, piece, first, calls_before, &o.logprobs,
                                                    state_.engine.tok().get())) {
        g.sse->event(chunk, out);
      }
    }
    take_piece(c, std::move(piece));
    return;
  }
  // No chunk without text: a token whose text the detokenizer holds back (part of a UTF-8 character,
  // a special token it skips) goes with the next chunk; only its logprobs, when asked for, are worth
  // a chunk of their own.
  const bool echoed_logprobs = g.req.echo_logprobs && !o.prompt_logprobs.empty();
  if (!g.sse || (o.text.empty() && !(g.req.want_logprobs && (!o.logprobs.empty() || echoed_logprobs)))) return;
  g.sse->event(
      delta_chunk(g.req, g.meta, o, g.progress.first_of_choice(o.index), state_.engine.tok().get(), &c.logprob_offset),
      out);
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
  // A request refused for what it asked (prompt too long, a schema that does not compile) is the
  // client's 400: info. A runtime fault is the server's: error.
  if (f.reason == finish_reason::error) {
    spdlog::log(f.runtime_fault ? spdlog::level::err : spdlog::level::info, "request {} failed: {}", g.meta.id,
                f.error);
  }

  if (f.reason == finish_reason::error && !(g.sse && g.sse->headers_sent())) {
    // Nothing was sent yet: a plain error response. A request the engine refused (prompt too
    // long, template error) is the client's fault; a failure of the runtime (the executor, a
    // tokenizer actor that died) is the server's, whether or not the request reached the engine.
    const int status = f.runtime_fault ? 500 : 400;
    std::string msg = f.error.empty() ? "request failed" : f.error;
    const char* prompt_field = g.req.kind == api_kind::embedding ? "input" : "prompt";
    gen_.reset();
    // A request refused for one of its fields (a schema that does not compile, a max_tokens beyond
    // the context) names that field.
    const bool field_error = status == 400 && !f.error_param.empty();
    return send_error(api_error(status, msg,
                                field_error     ? f.error_param
                                : status == 400 ? prompt_field
                                                : "",
                                field_error     ? refusal_code(f.error_param)
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
    res.body() = g.responses ? responses_body(*g.responses, g.req, g.responses_ids, g.choices.front().text, f)
                 : g.req.kind == api_kind::embedding ? embeddings_response(g.req, g.meta, f)
                                                     : full_response(g.req, g.meta, g.choices, f, tok);
    gen_.reset();
    return send_message(std::move(res), keep_alive);
  }
  if (g.responses_events)
    g.responses_events->finish(g.req, f, *g.sse, out);
  else
    g.sse->finish(g.req, g.meta, f, out, &calls_per_choice);
  state_.metrics.record_http(200);
  log_response(200);
  gen_.reset();
  response_done_ = true;
  close_after_write_ = !keep_alive;
  queue_write(std::move(out));
}

void http_session::abort_generation() {
  tokenizing_ = false;  // its answer, when it comes, finds no request waiting for it
  if (!gen_) return;
  // The client went away: 499 (nginx's "client closed request") when nothing was sent yet.
  access_.request_id = gen_->meta.id;
  access_.outcome = "abort";
  access_.completion_tokens = gen_->progress.num_tokens();
  log_response(gen_->sse && gen_->sse->headers_sent() ? 200 : 499);
  state_.metrics.record_finish(finish_reason::abort);  // its final message is never read
  for (actors::stream_handle& stream : gen_->streams) {
    stream.on_ready({});
    stream.abort();
  }
  gen_.reset();  // dropping the last handles also aborts; the engine actor frees the KV blocks
}

// ---- watching for a disconnect while the engine works ------------------------------------------

// Bytes that arrive meanwhile are pipelined requests: kept for the next read while they fit the read
// buffer. Beyond that the client floods: the watch goes on (a disconnect must still abort the
// request) but discards what it reads, and the connection closes after the current response.
void http_session::start_watch() {
  if (watch_pending_ || closed_) return;
  watch_pending_ = true;
  const size_t room = buffer_.max_size() - buffer_.size();
  if (room == 0 && !flooded_) {
    flooded_ = true;
    state_.metrics.record_closed(close_reason::pipeline_flood);
    spdlog::warn("connection {}: more than {} bytes pipelined behind a running request; closing after its response",
                 peer_, buffer_.max_size());
  }
  watch_discards_ = flooded_;
  if (watch_discards_) {
    if (!discard_) discard_ = std::make_unique<std::array<char, 4096>>();
    stream_.async_read_some(net::buffer(*discard_), guarded(&http_session::on_watch));
    return;
  }
  stream_.async_read_some(buffer_.prepare(std::min<size_t>(4096, room)), guarded(&http_session::on_watch));
}

void http_session::on_watch(beast::error_code ec, size_t n) {
  watch_pending_ = false;
  if (lingering_) return on_linger_read(ec, n);
  if (!ec && !watch_discards_) buffer_.commit(n);
  if (closed_) return;
  if (want_read_) {
    // The response is out and the watch was cancelled (or completed just before): read the next
    // request, starting with whatever was pipelined (issue #14: it used to wait on the socket).
    want_read_ = false;
    if (ec && ec != net::error::operation_aborted) return do_close();
    if (flooded_) return do_close();
    return do_read();
  }
  if (ec == net::error::operation_aborted) return;
  if (!request_running()) return;  // the response is being written; on_write_done() goes on
  if (ec) {
    // The client went away (or reset): abort the request, free its KV blocks, drop the connection.
    abort_generation();
    return do_close();
  }
  start_watch();
}

// ---- writing ----------------------------------------------------------------------------------

void http_session::send_error(const api_error& e, bool keep_alive) {
  http_response res{static_cast<http::status>(e.status), 11};
  res.set(http::field::content_type, "application/json");
  if (e.status == 405) res.set(http::field::allow, "GET, POST");
  if (e.status == 401) res.set(http::field::www_authenticate, "Bearer");
  res.body() = error_body(e);
  if (e.status == 413 || e.status == 431 ||
      (e.status == 400 && (e.code == "bad_http" || e.code == "bad_websocket_key"))) {
    keep_alive = false;
  }
  send_message(std::move(res), keep_alive);
}

void http_session::send_message(http_response res, bool keep_alive) {
  keep_alive = keep_alive && !flooded_;
  res.set(http::field::server, "tessera");
  if (!cors_origin_.empty()) add_cors_headers(res, cors_origin_);
  res.keep_alive(keep_alive);
  if (request_.method() == http::verb::head) {
    res.content_length(res.body().size());
  } else {
    res.prepare_payload();
  }
  state_.metrics.record_http(static_cast<int>(res.result_int()));
  log_response(static_cast<int>(res.result_int()));
  std::ostringstream os;
  if (request_.method() == http::verb::head)
    os << res.base();
  else
    os << res;
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
  write_offset_ = 0;
  write_in_flight_ = true;
  arm_write_timer();
  write_some();
}

// Written piece by piece, so that every piece the client takes counts as progress for the deadline.
void http_session::write_some() {
  stream_.async_write_some(net::buffer(writing_.data() + write_offset_, writing_.size() - write_offset_),
                           guarded(&http_session::on_write_some));
}

void http_session::on_write_some(beast::error_code ec, size_t n) {
  if (closed_) {
    write_in_flight_ = false;
    return;
  }
  if (ec) {
    write_in_flight_ = false;
    abort_generation();
    return do_close();
  }
  write_offset_ += n;
  if (write_offset_ < writing_.size()) {
    arm_write_timer();
    return write_some();
  }
  write_in_flight_ = false;
  writing_.clear();
  ++write_timer_serial_;
  write_timer_.cancel();
  on_write_done();
}

// Deadline for the next write progress: a client that takes no byte for --write-timeout is closed and
// its generation aborted (its KV freed), instead of holding both for as long as it likes.
void http_session::arm_write_timer() {
  const uint64_t serial = ++write_timer_serial_;
  write_timer_.expires_after(state_.opt.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), serial](beast::error_code ec) {
    self->run_guarded([&] {
      if (ec || self->closed_ || serial != self->write_timer_serial_ || !self->write_in_flight_) return;
      spdlog::warn("connection {}: no write progress for {} s; closing it", self->peer_,
                   self->state_.opt.write_timeout.count());
      self->state_.metrics.record_closed(close_reason::write_timeout);
      self->abort_generation();
      self->do_close();
    });
  });
}

void http_session::on_write_done() {
  if (!pending_.empty()) return start_write();
  if (drain_deferred_ && gen_) {
    on_stream_ready(gen_->serial);
    if (write_in_flight_ || !pending_.empty()) return;
  }
  if (!response_done_ || request_running()) return;
  response_done_ = false;
  busy_.reset();
  if (close_after_write_ || flooded_) return linger_close();
  if (watch_pending_) {
    // The watch read would wait on the socket while the next request may already sit in the buffer:
    // cancel it (no write is in flight now) and read from the buffer first (RFC 9112 §9.3.2).
    want_read_ = true;
    beast::error_code ec;
    stream_.socket().cancel(ec);
    return;
  }
  do_read();
}

void http_session::do_close() {
  if (closed_) {
    if (lingering_) end_linger();
    return;
  }
  closed_ = true;
  abort_generation();
  busy_.reset();
  ++write_timer_serial_;
  write_timer_.cancel();
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.socket().close(ec);
}

// The connection ends after this response: half-close and drop what the client still sends (a body
// that was refused, pipelined requests) before closing. Closing with unread bytes would reset the
// connection, and a reset can destroy the response before the client has read it (RFC 9112 §9.6).
void http_session::linger_close() {
  if (closed_) return;
  closed_ = true;
  abort_generation();
  busy_.reset();
  ++write_timer_serial_;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    stream_.socket().close(ec);
    return;
  }
  lingering_ = true;
  write_timer_.expires_after(k_linger_time);
  write_timer_.async_wait([self = shared_from_this()](beast::error_code wait_ec) {
    if (!wait_ec) self->run_guarded([&] { self->end_linger(); });
  });
  if (!watch_pending_) linger_read();  // else the pending watch read goes on as the first linger read
}

void http_session::linger_read() {
  if (!discard_) discard_ = std::make_unique<std::array<char, 4096>>();
  watch_pending_ = true;
  stream_.async_read_some(net::buffer(*discard_), guarded(&http_session::on_linger_read));
}

void http_session::on_linger_read(beast::error_code ec, size_t n) {
  watch_pending_ = false;
  if (!lingering_) return;
  linger_bytes_ += n;
  if (ec || linger_bytes_ > k_linger_max_bytes) return end_linger();
  linger_read();
}

void http_session::end_linger() {
  if (!lingering_) return;
  lingering_ = false;
  write_timer_.cancel();
  beast::error_code ec;
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
  // Every response to an allowed cross-origin request carries the CORS headers (a refused Origin
  // gets its 403 without them, and the browser hides it from the page).
  cors_origin_.clear();
  const auto origin = m.find(http::field::origin), host = m.find(http::field::host);
  if (origin != m.end()) {
    const std::string_view o(origin->value().data(), origin->value().size());
    const std::string_view h =
        host == m.end() ? std::string_view() : std::string_view(host->value().data(), host->value().size());
    if (origin_allowed(o, h, state_.opt.allowed_origins)) cors_origin_ = o;
  }
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
