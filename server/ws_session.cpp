#include "server/ws_session.hpp"

#include <spdlog/spdlog.h>

#include "server/logging.hpp"

namespace tessera::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using actors::stream_delta;
using actors::stream_final;

void start_ws_session(server_state& state, ws_kind kind, tcp::socket socket, http_request req, bool authed,
                      std::string early) {
  std::make_shared<ws_session>(state, kind, std::move(socket), authed, std::move(early))->run(std::move(req));
}

ws_session::ws_session(server_state& state, ws_kind kind, tcp::socket socket, bool authed, std::string early)
    : state_(state),
      gauge_(state.metrics, connection_kind::websocket),
      kind_(kind),
      ws_(beast::tcp_stream(std::move(socket)), std::move(early)),
      write_timer_(ws_.get_executor()),
      auth_timer_(ws_.get_executor()),
      authed_(authed) {
  beast::error_code ec;
  const tcp::endpoint peer = beast::get_lowest_layer(ws_).socket().remote_endpoint(ec);
  if (!ec) peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
}

ws_session::~ws_session() {
  if (hub_id_) state_.hub->remove(hub_id_);
}

// Whatever a handler threw: this socket closes (its generations aborted), the I/O thread goes on.
void ws_session::fail(const char* what) noexcept {
  try {
    spdlog::error("websocket from {}: internal error: {}; closing it", peer_, what);
    state_.metrics.record_exception();
    if (!closing_) state_.metrics.record_closed(close_reason::internal_error);
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().close(ec);
    begin_close();
  } catch (...) {}
}

void ws_session::run(http_request req) {
  req_ = std::move(req);
  websocket::stream_base::timeout t{};
  t.handshake_timeout = std::chrono::seconds(30);
  t.idle_timeout = state_.opt.ws_idle_timeout;
  t.keep_alive_pings = true;
  ws_.set_option(t);
  ws_.read_message_max(state_.opt.ws_max_message_bytes);
  ws_.set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(http::field::server, "tessera"); }));
  ws_.async_accept(req_, guarded(&ws_session::on_accept));
}

void ws_session::log_generation(int status, const std::string& request_id, double seconds, std::string_view outcome,
                                int64_t prompt_tokens, int64_t completion_tokens) {
  access_entry e;
  e.method = "WS";
  e.path = kind_ == ws_kind::generate ? "/v1/ws" : "/v1/events";
  e.status = status;
  e.seconds = seconds;
  e.request_id = request_id;
  e.peer = peer_;
  e.outcome = outcome;
  e.prompt_tokens = prompt_tokens;
  e.completion_tokens = completion_tokens;
  log_access(e);
}

void ws_session::on_accept(beast::error_code ec) {
  if (ec) {
    spdlog::debug("websocket {} from {}: handshake failed: {}", std::string(req_.target()), peer_, ec.message());
    return;
  }
  spdlog::debug("websocket {} open from {}", std::string(req_.target()), peer_);
  if (authed_) {
    on_authed();
  } else {
    // A socket that never authenticates would otherwise hold its connection (and a hub slot for
    // /v1/events once it did) for as long as it keeps answering pings.
    auth_timer_.expires_after(state_.opt.ws_auth_timeout);
    auth_timer_.async_wait([self = shared_from_this()](beast::error_code wait_ec) {
      self->run_guarded([&] {
        if (wait_ec || self->authed_ || self->closing_) return;
        self->state_.metrics.record_closed(close_reason::ws_auth_timeout);
        self->send_error(api_error(401,
                                   "no valid {\"type\": \"auth\"} message within " +
                                       std::to_string(self->state_.opt.ws_auth_timeout.count()) + " ms",
                                   "", "invalid_api_key"),
                         "");
        self->close(websocket::close_code::policy_error);
      });
    });
  }
  do_read();
}

void ws_session::on_authed() {
  if (kind_ != ws_kind::events || hub_id_) return;
  std::weak_ptr<ws_session> weak = shared_from_this();
  // One immutable buffer per batch, shared by every /v1/events socket.
  hub_id_ = state_.hub->add([poster = state_.poster, weak](event_hub::message m) {
    poster->post(weak, [m = std::move(m)](ws_session& s) { s.send_event(m); });
  });
  // The pools as they are now, even if the engine is idle (a local actor query, not engine work).
  if (auto hello = state_.hub->initial_message()) send(std::move(*hello));
}

void ws_session::do_read() { ws_.async_read(buffer_, guarded(&ws_session::on_read)); }

void ws_session::on_read(beast::error_code ec, size_t) {
  if (ec) return begin_close();
  const std::string text = beast::buffers_to_string(buffer_.data());
  buffer_.consume(buffer_.size());
  if (ws_.got_text() && !ws_text_is_valid(text)) return close(websocket::close_code::bad_payload);
  handle(text);
  if (!closing_) do_read();
}

void ws_session::send_error(const api_error& e, const std::string& id) { send(ws_error_message(e, id)); }

void ws_session::handle(const std::string& text) {
  std::string id;
  try {
    ws_envelope message;
    parse_ws_envelope(text, message);
    id = message.id;
    const std::string& type = message.type;
    if (type == "auth") {
      const auto& key = message.api_key;
      if (!key || state_.opt.api_key.empty() || !keys_equal(*key, state_.opt.api_key)) {
        if (state_.opt.api_key.empty()) {
          authed_ = true;
        } else {
          send_error(api_error(401, "invalid API key", "api_key", "invalid_api_key"), id);
          return close(websocket::close_code::policy_error);
        }
      }
      authed_ = true;
      auth_timer_.cancel();
      on_authed();
      return send(R"({"type":"auth_ok"})");
    }
    if (!authed_) {
      send_error(api_error(401, "authenticate first: {\"type\": \"auth\", \"api_key\": KEY}", "", "invalid_api_key"),
                 id);
      return close(websocket::close_code::policy_error);
    }
    if (type == "ping") return send(R"({"type":"pong"})");
    if (kind_ != ws_kind::generate) throw api_error(400, "this socket only streams events", "type");
    if (type == "start") return start(message);
    if (type == "cancel") {
      auto it = gens_.find(id);
      if (it == gens_.end()) throw api_error(404, "no running generation with id '" + id + "'", "id", "not_found");
      it->second.stream.abort();  // the final message (finish_reason "abort") follows
      return;
    }
    throw api_error(400, "unknown message type '" + type + "'", "type");
  } catch (const api_error& e) { send_error(e, id); } catch (const std::exception& e) {
    send_error(api_error(500, std::string("internal error: ") + e.what()), id);
  }
}

void ws_session::start(const ws_envelope& message) {
  if (closing_) return;
  const std::string& id = message.id;
  if (gens_.count(id)) throw api_error(400, "a generation with id '" + id + "' is already running", "id");
  if (gens_.size() >= 64) throw api_error(429, "too many generations on this socket (64)", "", "too_many");
  const ws_start start = parse_ws_start(message);
  const api_kind kind = start.kind;
  generation_request req;
  actors::stream_handle stream;
  try {
    req = parse_generation_request(start.request_json, kind, state_.engine.config().vocab_size, state_.opt.limits);
    // One generation of a socket is one engine request: batches and echo are /v1/completions' own.
    if (!req.more_prompts.empty())
      throw api_error(400, "'prompt': batches of prompts are not supported on /v1/ws (send one generation per prompt)",
                      "prompt");
    if (req.echo) throw api_error(400, "'echo' is not supported on /v1/ws", "echo");
    if (req.prompt_logprobs >= 0)
      throw api_error(400, "'prompt_logprobs' is not supported on /v1/ws", "prompt_logprobs");
    stream = state_.submit(req);
  } catch (const api_error& e) {
    log_generation(e.status, "", 0, "", -1, -1);
    throw;
  }
  ws_generation g;
  g.serial = ++num_started_;
  g.request_id = state_.new_id("ws");
  g.progress = stream_progress(req.params.n);
  if (kind == api_kind::chat && parses_output(state_.opt.parsers, req.tools)) {
    for (int32_t i = 0; i < req.params.n; ++i) g.outputs.emplace_back(state_.opt.parsers, req.tools);
    g.calls_per_choice.assign(static_cast<size_t>(req.params.n), 0);
  }
  g.req = std::move(req);
  g.stream = std::move(stream);
  const uint64_t serial = g.serial;
  actors::stream_handle& s = gens_.emplace(id, std::move(g)).first->second.stream;
  std::weak_ptr<ws_session> weak = shared_from_this();
  s.on_ready([poster = state_.poster, weak, id, serial] {
    poster->post(weak, [id, serial](ws_session& session) { session.on_stream_ready(id, serial); });
  });
  send(ws_started_message(id, gens_.at(id).request_id));
  update_busy();
}

// Drains one generation. Its messages are built first; a finished generation is erased before any of
// them is sent, and sending comes last, holding no reference into gens_: a send that reaches the
// queue limit only marks the session closing (the rest is then dropped).
void ws_session::on_stream_ready(const std::string& id, uint64_t serial) {
  if (closing_) return;
  auto it = gens_.find(id);
  if (it == gens_.end() || it->second.serial != serial) return;
  ws_generation& g = it->second;
  const tokenizer* tok = state_.engine.tok().get();
  std::vector<std::string> messages;
  bool finished = false;
  for (actors::stream_item& item : g.stream.take_all()) {
    if (auto* d = std::get_if<stream_delta>(&item)) {
      if (!has_output(d->output) || !g.progress.take_delta(*d, state_.metrics)) continue;
      if (!g.outputs.empty()) {
        const size_t i = static_cast<size_t>(d->output.index);
        const int32_t calls_before = g.outputs[i].num_calls();
        const chat_piece piece = g.outputs[i].feed(d->output.text);
        g.calls_per_choice[i] = g.outputs[i].num_calls();
        messages.push_back(
            ws_delta_message(id, *d, g.req.want_logprobs, g.progress.first_of_stream(), tok, &piece, calls_before));
        continue;
      }
      messages.push_back(ws_delta_message(id, *d, g.req.want_logprobs, g.progress.first_of_stream(), tok));
      continue;
    }
    const stream_final& f = std::get<stream_final>(item);
    for (size_t i = 0; i < g.outputs.size() && f.reason != finish_reason::error; ++i) {
      // What the parser held back (a partial tag, an unterminated call) comes as one last delta.
      const int32_t calls_before = g.outputs[i].num_calls();
      const chat_piece piece = g.outputs[i].finish();
      g.calls_per_choice[i] = g.outputs[i].num_calls();
      if (piece.empty()) continue;
      stream_delta rest;
      rest.output.index = static_cast<int32_t>(i);
      rest.seconds_since_submit = f.seconds_total;
      messages.push_back(ws_delta_message(id, rest, false, g.progress.first_of_stream(), tok, &piece, calls_before));
    }
    record_final(f, state_.metrics);
    if (f.reason == finish_reason::error) {  // the client's mistake at info, a runtime fault at error
      spdlog::log(f.runtime_fault ? spdlog::level::err : spdlog::level::info, "request {} failed: {}", g.request_id,
                  f.error);
    }
    if (f.reason == finish_reason::error && !f.error_param.empty()) {
      // Refused for one of its fields (a grammar that does not compile, a max_tokens beyond the
      // context): the same 400 as over HTTP.
      messages.push_back(ws_error_message(api_error(400, f.error, f.error_param, refusal_code(f.error_param)), id));
      log_generation(400, g.request_id, f.seconds_total, to_string(f.reason), f.num_prompt_tokens,
                     f.num_generated_tokens);
      finished = true;
      continue;
    }
    messages.push_back(ws_final_message(id, f, g.outputs.empty() ? nullptr : &g.calls_per_choice));
    log_generation(200, g.request_id, f.seconds_total, to_string(f.reason), f.num_prompt_tokens,
                   f.num_generated_tokens);
    finished = true;
  }
  if (finished) gens_.erase(it);
  for (std::string& m : messages) send(std::move(m));
  update_busy();
}

void ws_session::send_event(const event_hub::message& m) {
  if (closing_ || queue_.size() > 64) return;  // a slow dashboard skips batches; the next one is complete
  push(m);
}

void ws_session::send(std::string text) { push(std::make_shared<const std::string>(std::move(text))); }

void ws_session::push(event_hub::message m) {
  if (closing_) return;
  if (queue_.size() >= state_.opt.ws_max_queued_messages) {
    spdlog::warn("websocket from {}: {} messages queued, closing a reader that does not keep up", peer_, queue_.size());
    state_.metrics.record_closed(close_reason::ws_slow_reader);
    return close(websocket::close_code::policy_error);
  }
  queue_.push_back(std::move(m));
  if (queue_.size() == 1) do_write();
}

void ws_session::do_write() {
  ws_.text(true);
  arm_write_timer();
  ws_.async_write(net::buffer(*queue_.front()), guarded(&ws_session::on_write));
}

void ws_session::on_write(beast::error_code ec, size_t) {
  queue_.pop_front();
  if (ec || closing_) {
    queue_.clear();  // nothing more goes out (the close frame, if any, follows on its own)
    if (ec) begin_close();
  } else if (!queue_.empty()) {
    do_write();
  }
  if (queue_.empty() && !closing_write_) {
    ++write_timer_serial_;
    write_timer_.cancel();
  }
  update_busy();
}

// Deadline for the message (or close frame) being written: a peer that takes none of it for
// --write-timeout is disconnected outright (a close handshake would wait behind the stuck write).
void ws_session::arm_write_timer() {
  const uint64_t serial = ++write_timer_serial_;
  write_timer_.expires_after(state_.opt.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), serial](beast::error_code ec) {
    self->run_guarded([&] {
      if (ec || serial != self->write_timer_serial_ || (self->queue_.empty() && !self->closing_write_)) return;
      spdlog::warn("websocket from {}: no write progress for {} s; closing it", self->peer_,
                   self->state_.opt.write_timeout.count());
      self->state_.metrics.record_closed(close_reason::write_timeout);
      self->closing_write_ = false;
      beast::error_code ignored;
      beast::get_lowest_layer(self->ws_).socket().close(ignored);  // fails the stuck write and the read
      self->begin_close();
    });
  });
}

// Busy while a generation runs or its messages are still queued for the wire.
void ws_session::update_busy() {
  if (kind_ == ws_kind::generate && !closing_ && (!gens_.empty() || !queue_.empty())) {
    if (!busy_) busy_.emplace(state_);
  } else {
    busy_.reset();
  }
}

void ws_session::close(websocket::close_code code) {
  if (closing_) return;
  begin_close();
  closing_write_ = true;
  arm_write_timer();
  ws_.async_close(code, [self = shared_from_this()](beast::error_code) {
    self->closing_write_ = false;
    ++self->write_timer_serial_;
    self->write_timer_.cancel();
  });
}

void ws_session::begin_close() {
  if (closing_) return;
  closing_ = true;
  busy_.reset();
  net::post(ws_.get_executor(), [self = shared_from_this()] { self->teardown(); });
}

// Runs as a handler of its own, never inside a drain, a read or a send.
void ws_session::teardown() {
  auth_timer_.cancel();
  for (auto& [id, g] : gens_) {
    g.stream.on_ready({});
    g.stream.abort();  // a socket that goes away frees its requests' KV
    state_.metrics.record_finish(finish_reason::abort);
    log_generation(200, g.request_id,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - g.started_at).count(), "abort", -1,
                   g.progress.num_tokens());
  }
  gens_.clear();
  if (hub_id_) {
    state_.hub->remove(hub_id_);
    hub_id_ = 0;
  }
  spdlog::debug("websocket {} from {} closed", kind_ == ws_kind::generate ? "/v1/ws" : "/v1/events", peer_);
}

}  // namespace tessera::server
