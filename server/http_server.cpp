#include "server/http_server.hpp"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/json.hpp>

#include <simdjson.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "server/metrics.hpp"
#include "server/openai_format.hpp"
#include "server/event_hub.hpp"
#include "server/logging.hpp"
#include "server/static_files.hpp"

namespace tessera::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace json = boost::json;
using tcp = net::ip::tcp;
using actors::stream_delta;
using actors::stream_final;

bool keys_equal(std::string_view presented, std::string_view expected) {
  // Length is not secret enough to hide behind padding; compare every byte of the expected key anyway.
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

bool host_allowed(std::string_view header, const server_options& o, uint16_t bound_port) {
  const bool wildcard_bind = o.host == "0.0.0.0" || o.host == "::" || o.host.empty();
  if (wildcard_bind && o.allowed_hosts.empty()) return true;
  std::string_view name = header, port;
  if (!name.empty() && name.front() == '[') {  // [v6]:port
    const size_t close = name.find(']');
    if (close == std::string_view::npos) return false;
    port = close + 1 < name.size() && name[close + 1] == ':' ? name.substr(close + 2) : std::string_view();
    name = name.substr(0, close + 1);
  } else if (const size_t colon = name.rfind(':'); colon != std::string_view::npos) {
    port = name.substr(colon + 1);
    name = name.substr(0, colon);
  }
  if (!port.empty() && port != std::to_string(bound_port)) return false;
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == o.host || lower == "localhost" || lower == "127.0.0.1" || lower == "[::1]") return true;
  for (const auto& h : o.allowed_hosts) {
    if (lower == h) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
struct http_server::impl {
  actors::engine_facade& engine;
  server_options opt;
  server_metrics metrics;
  std::shared_ptr<event_hub> hub = std::make_shared<event_hub>();
  std::unique_ptr<static_files> ui;  // the browser UI; null: none
  std::string id_prefix;
  std::atomic<uint64_t> next_id{1};
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stopped = false;
  // Generations whose final message is not written yet (graceful shutdown waits for them).
  std::mutex busy_mutex;
  std::condition_variable busy_cv;
  int64_t num_busy = 0;
  uint16_t bound_port = 0;
  int32_t vocab_size = 0;
  net::io_context ioc;  // after everything the sessions use: destroyed (with its handlers) first
  tcp::acceptor acceptor{ioc};
  net::steady_timer accept_retry{ioc};
  std::vector<std::thread> threads;

  impl(actors::engine_facade& e, server_options o) : engine(e), opt(std::move(o)) {}

  std::string new_id(const char* prefix) {
    char text[64];
    std::snprintf(text, sizeof text, "%s-%s%llx", prefix, id_prefix.c_str(),
                  static_cast<unsigned long long>(next_id.fetch_add(1)));
    return text;
  }
  void do_accept();
};

namespace {

// Held by a session from the moment it has a generation until that generation's final message is on
// the wire (or the connection is gone): what http_server::wait_for_responses() counts.
class busy_token {
 public:
  explicit busy_token(http_server::impl& srv) : srv_(&srv) {
    std::lock_guard lock(srv.busy_mutex);
    ++srv.num_busy;
  }
  busy_token(const busy_token&) = delete;
  busy_token& operator=(const busy_token&) = delete;
  ~busy_token() {
    std::lock_guard lock(srv_->busy_mutex);
    if (--srv_->num_busy == 0) srv_->busy_cv.notify_all();
  }

 private:
  http_server::impl* srv_;
};

std::string_view header_value(const http::request<http::string_body>& req, http::field f) {
  auto it = req.find(f);
  return it == req.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
}

std::string chunk_of(std::string_view data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out(size);
  out.append(data);
  out.append("\r\n");
  return out;
}

std::string sse_event(std::string_view json_text) {
  std::string out = "data: ";
  out.append(json_text);
  out.append("\n\n");
  return out;
}

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

enum class ws_kind : uint8_t { generate, events };
void start_websocket(http_server::impl& srv, ws_kind kind, tcp::socket socket, http::request<http::string_body> req,
                     bool authed);

int submit_error_status(actors::submit_error e) {
  switch (e) {
    case actors::submit_error::overloaded: return 429;
    case actors::submit_error::invalid: return 400;
    default: return 503;
  }
}

class http_session : public std::enable_shared_from_this<http_session> {
 public:
  http_session(http_server::impl& srv, tcp::socket socket)
      : srv_(srv), stream_(std::move(socket)), poll_timer_(stream_.get_executor()) {
    beast::error_code ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    if (!ec) peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
  }

  void run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

 private:
  struct generation {
    generation_request req;
    actors::stream_handle stream;
    response_meta meta;
    std::vector<choice_accumulator> choices;
    std::vector<bool> started;
    std::vector<double> last_token_at;
    bool headers_sent = false;
    bool keep_alive = true;
    bool chunked = true;  // HTTP/1.0 clients get an unchunked stream ended by closing the connection
  };

  // ---- reading -------------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(srv_.opt.max_body_bytes);
    parser_->header_limit(srv_.opt.max_header_bytes);
    stream_.expires_after(num_requests_ == 0 ? srv_.opt.read_timeout : srv_.opt.idle_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&http_session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return do_close();
    }
    note_request();
    if (ec == http::error::body_limit) {
      return send_error(api_error(413, "request body exceeds " + std::to_string(srv_.opt.max_body_bytes) + " bytes",
                                  "", "body_too_large"), false);
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

  // ---- access log ----------------------------------------------------------------------------
  // What the access line of the current request says beyond method, path and status.
  struct access_note {
    std::string request_id;
    std::string outcome;
    int64_t prompt_tokens = -1;
    int64_t completion_tokens = -1;
  };

  void note_request() {
    started_at_ = std::chrono::steady_clock::now();
    const auto& m = parser_->get();
    log_method_ = m.method_string().empty() ? std::string("-") : std::string(m.method_string());
    const std::string_view target(m.target().data(), m.target().size());
    log_path_ = target.empty() ? std::string("-") : std::string(target.substr(0, target.find('?')));
    access_ = {};
  }

  void note_final(const stream_final& f) {
    access_.request_id = gen_->meta.id;
    access_.outcome = std::string(to_string(f.reason));
    access_.prompt_tokens = f.num_prompt_tokens;
    access_.completion_tokens = f.num_generated_tokens;
  }

  void log_response(int status) {
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

  // ---- routing -------------------------------------------------------------------------------
  void handle() {
    const server_options& o = srv_.opt;
    std::string_view target(request_.target().data(), request_.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    const http::verb method = request_.method();
    const bool keep_alive = request_.keep_alive();

    if (!host_allowed(header_value(request_, http::field::host), o, srv_.bound_port)) {
      throw api_error(403, "Host header not allowed", "", "host_not_allowed");
    }
    const std::string_view origin = header_value(request_, http::field::origin);
    if (!origin.empty() && !origin_allowed(origin)) throw api_error(403, "Origin not allowed", "", "origin_not_allowed");

    struct route {
      std::string_view path;
      http::verb method;
    };
    static constexpr route routes[] = {
        {"/health", http::verb::get},         {"/v1/models", http::verb::get},
        {"/metrics", http::verb::get},        {"/v1/completions", http::verb::post},
        {"/v1/chat/completions", http::verb::post}, {"/tokenize", http::verb::post},
        {"/detokenize", http::verb::post},    {"/v1/ws", http::verb::get},
        {"/v1/events", http::verb::get},
    };
    const route* found = nullptr;
    for (const auto& r : routes) {
      if (r.path == path) found = &r;
    }
    if (!found && srv_.ui && (method == http::verb::get || method == http::verb::head)) {
      // The UI's own files need no API key: the page asks for it and sends it on its API calls.
      if (auto res = srv_.ui->respond(request_, path)) return send_message(std::move(*res), keep_alive);
    }
    if (!found) throw api_error(404, "no route for " + std::string(path), "", "not_found");
    if (found->method != method && !(method == http::verb::head && found->method == http::verb::get)) {
      throw api_error(405, "method " + std::string(request_.method_string()) + " not allowed on " + std::string(path),
                      "", "method_not_allowed");
    }
    // Auth is decided on the same parsed path the router matched (deny by default).
    const bool ws = path == "/v1/ws" || path == "/v1/events";
    bool authed = o.api_key.empty() || path == "/health";
    if (!authed) {
      const std::string_view auth = header_value(request_, http::field::authorization);
      if (auth.size() > 7 && (auth.substr(0, 7) == "Bearer " || auth.substr(0, 7) == "bearer ")) {
        authed = keys_equal(auth.substr(7), o.api_key);
      }
    }
    if (!authed && !ws) throw api_error(401, "missing or invalid API key (send 'Authorization: Bearer KEY')", "", "invalid_api_key");

    if (path == "/health") {
      const actors::health_report h = srv_.engine.health();
      if (!h.healthy) throw api_error(503, "engine unhealthy: " + h.message, "", "unhealthy");
      return send(http::status::ok, "application/json", R"({"status":"ok"})", keep_alive);
    }
    if (path == "/v1/models") {
      json::object model{{"id", o.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "tessera"},
                         {"max_model_len", srv_.engine.config().context_length}};
      json::object body{{"object", "list"}, {"data", json::array{std::move(model)}}};
      return send(http::status::ok, "application/json", json::serialize(body), keep_alive);
    }
    if (path == "/metrics") {
      return send(http::status::ok, "text/plain; version=0.0.4", srv_.metrics.render(srv_.engine), keep_alive);
    }
    if (path == "/tokenize") return tokenize(keep_alive);
    if (path == "/detokenize") return detokenize(keep_alive);
    if (ws) {
      if (!beast::websocket::is_upgrade(request_)) {
        throw api_error(400, "this route needs a WebSocket upgrade", "", "upgrade_required");
      }
      if (watch_pending_) throw api_error(400, "upgrade not possible now");
      start_websocket(srv_, path == "/v1/ws" ? ws_kind::generate : ws_kind::events, stream_.release_socket(),
                      std::move(request_), authed);
      closed_ = true;
      return;
    }
    return start_generation(path == "/v1/chat/completions" ? api_kind::chat : api_kind::completion, keep_alive);
  }

  bool origin_allowed(std::string_view origin) const {
    for (const auto& a : srv_.opt.allowed_origins) {
      if (a == "*" || a == origin) return true;
    }
    const std::string_view host = header_value(request_, http::field::host);
    return origin == "http://" + std::string(host) || origin == "https://" + std::string(host);
  }

  void tokenize(bool keep_alive) {
    const tokenize_request t = parse_tokenize_request(request_.body());
    const auto& tok = srv_.engine.tok();
    if (!tok) throw api_error(400, "this model has no tokenizer");
    std::vector<token_id> ids;
    if (t.is_chat) {
      if (!srv_.opt.encode_chat) throw api_error(400, "'messages' is not supported by this server's /tokenize", "messages");
      try {
        ids = srv_.opt.encode_chat(t.messages);
      } catch (const std::exception& e) {
        throw api_error(400, std::string("cannot render the conversation: ") + e.what(), "messages");
      }
    } else {
      encode_options eo;
      eo.add_special = t.add_special_tokens && tok->add_bos();
      ids = tok->encode(t.prompt, eo);
    }
    json::array arr;
    for (token_id id : ids) arr.push_back(id);
    json::object body{{"count", ids.size()}, {"max_model_len", srv_.engine.config().context_length},
                      {"tokens", std::move(arr)}};
    send(http::status::ok, "application/json", json::serialize(body), keep_alive);
  }

  void detokenize(bool keep_alive) {
    const auto& tok = srv_.engine.tok();
    if (!tok) throw api_error(400, "this model has no tokenizer");
    const std::vector<token_id> ids =
        parse_detokenize_request(request_.body(), static_cast<int32_t>(tok->vocab_size()), srv_.opt.limits);
    json::object body{{"prompt", sanitize_utf8(tok->decode(ids))}};
    send(http::status::ok, "application/json", json::serialize(body), keep_alive);
  }

  // ---- generation ----------------------------------------------------------------------------
  void start_generation(api_kind kind, bool keep_alive) {
    const int32_t vocab = srv_.engine.config().vocab_size;
    generation_request req = parse_generation_request(request_.body(), kind, vocab, srv_.opt.limits);
    if (!req.model.empty() && req.model != srv_.opt.model_name) {
      throw api_error(404, "the model '" + req.model + "' does not exist (this server serves '" + srv_.opt.model_name + "')",
                      "model", "model_not_found");
    }
    actors::submit_result r = srv_.engine.submit(req.prompt, req.params, req.priority);
    if (!r) {
      const int status = submit_error_status(r.error);
      if (status != 400) srv_.metrics.record_rejected(status);
      throw api_error(status, r.message.empty() ? std::string(actors::to_string(r.error)) : r.message, "",
                      std::string(actors::to_string(r.error)));
    }
    busy_.emplace(srv_);
    gen_.emplace();
    gen_->meta = {srv_.new_id(kind == api_kind::chat ? "chatcmpl" : "cmpl"), unix_seconds(),
                  req.model.empty() ? srv_.opt.model_name : req.model};
    gen_->choices.resize(static_cast<size_t>(req.params.n));
    gen_->started.assign(static_cast<size_t>(req.params.n), false);
    gen_->last_token_at.assign(static_cast<size_t>(req.params.n), -1.0);
    gen_->req = std::move(req);
    gen_->stream = std::move(r.stream);
    gen_->chunked = request_.version() >= 11;
    gen_->keep_alive = keep_alive && gen_->chunked;
    // Keep a read pending so a client that goes away is noticed while the engine works.
    start_watch();
    schedule_poll();
  }

  void schedule_poll() {
    poll_timer_.expires_after(srv_.opt.poll_interval);
    poll_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->on_poll();
    });
  }

  void on_poll() {
    if (!gen_ || closed_) return;
    std::string out;
    for (int i = 0; i < 1024; ++i) {
      std::optional<actors::stream_item> item = gen_->stream.try_next();
      if (!item) break;
      if (auto* d = std::get_if<stream_delta>(&*item)) {
        on_delta(*d, out);
      } else {
        if (!out.empty()) queue_write(std::move(out));
        return on_final(std::get<stream_final>(*item));
      }
    }
    if (!out.empty()) queue_write(std::move(out));
    schedule_poll();
  }

  void on_delta(const stream_delta& d, std::string& out) {
    generation& g = *gen_;
    const request_output& o = d.output;
    if (o.index < 0 || static_cast<size_t>(o.index) >= g.choices.size()) return;
    const auto i = static_cast<size_t>(o.index);
    if (!o.token_ids.empty()) {
      if (g.last_token_at[i] >= 0) {
        srv_.metrics.observe_itl((d.seconds_since_submit - g.last_token_at[i]) / double(o.token_ids.size()));
      }
      g.last_token_at[i] = d.seconds_since_submit;
    }
    auto& c = g.choices[i];
    c.text += o.text;
    c.token_ids.insert(c.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    if (!g.req.stream) return;
    if (o.token_ids.empty() && o.text.empty()) return;  // first chunk only once a token exists
    if (!g.headers_sent) {
      out += sse_headers();
      g.headers_sent = true;
    }
    out += frame(sse_event(delta_chunk(g.req, g.meta, o, !g.started[i], srv_.engine.tok().get())));
    g.started[i] = true;
  }

  std::string frame(std::string_view data) const { return gen_->chunked ? chunk_of(data) : std::string(data); }

  std::string sse_headers() const {
    http::response<http::empty_body> res{http::status::ok, 11};
    res.set(http::field::server, "tessera");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.set("X-Request-Id", gen_->meta.id);
    res.chunked(gen_->chunked);
    res.keep_alive(gen_->keep_alive);
    std::ostringstream os;
    os << res.base();
    return os.str();
  }

  void on_final(const stream_final& f) {
    generation& g = *gen_;
    srv_.metrics.record_finish(f.reason);
    srv_.metrics.observe_e2e(f.seconds_total);
    if (f.seconds_to_first_token >= 0) srv_.metrics.observe_ttft(f.seconds_to_first_token);
    const tokenizer* tok = srv_.engine.tok().get();
    const bool keep_alive = g.keep_alive;
    note_final(f);
    if (f.reason == finish_reason::error) spdlog::error("request {} failed: {}", g.meta.id, f.error);

    if (f.reason == finish_reason::error && !g.headers_sent) {
      // Nothing was sent yet: a plain error response. A request the engine refused (prompt too
      // long, template error) never got an engine id: the client's fault.
      const int status = f.request == 0 ? 400 : 500;
      std::string msg = f.error.empty() ? "request failed" : f.error;
      gen_.reset();
      return send_error(api_error(status, msg, status == 400 ? "prompt" : "", status == 400 ? "invalid_prompt" : "engine_error"),
                        keep_alive);
    }
    if (!g.req.stream) {
      http::response<http::string_body> res{http::status::ok, 11};
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
    std::string out;
    if (!g.headers_sent) {
      out += sse_headers();
      g.headers_sent = true;
    }
    const json::object timings = timings_json(f);
    if (f.choices.empty()) {
      out += frame(sse_event(finish_chunk(g.req, g.meta, 0, f.reason, &timings)));
    }
    for (size_t k = 0; k < f.choices.size(); ++k) {
      const bool last = k + 1 == f.choices.size();
      out += frame(sse_event(finish_chunk(g.req, g.meta, f.choices[k].index, f.choices[k].reason, last ? &timings : nullptr)));
    }
    if (f.reason == finish_reason::error) {
      out += frame(sse_event(error_body(api_error(500, f.error.empty() ? "request failed" : f.error, "", "engine_error"))));
    }
    if (g.req.include_usage) out += frame(sse_event(usage_chunk(g.req, g.meta, f)));
    out += frame("data: [DONE]\n\n");
    if (g.chunked) out += "0\r\n\r\n";
    srv_.metrics.record_http(200);
    log_response(200);
    gen_.reset();
    response_done_ = true;
    close_after_write_ = !keep_alive;
    queue_write(std::move(out));
  }

  void abort_generation() {
    if (!gen_) return;
    // The client went away: 499 (nginx's "client closed request") when nothing was sent yet.
    access_.request_id = gen_->meta.id;
    access_.outcome = "abort";
    access_.completion_tokens = 0;
    for (const auto& c : gen_->choices) access_.completion_tokens += static_cast<int64_t>(c.token_ids.size());
    log_response(gen_->headers_sent ? 200 : 499);
    srv_.metrics.record_finish(finish_reason::abort);  // its final message is never read
    gen_->stream.abort();
    gen_.reset();  // dropping the last handle also aborts; the scheduler frees the KV blocks
  }

  // ---- watching for a disconnect while the engine works ------------------------------------------
  void start_watch() {
    if (watch_pending_ || closed_) return;
    watch_pending_ = true;
    stream_.async_read_some(buffer_.prepare(4096), beast::bind_front_handler(&http_session::on_watch, shared_from_this()));
  }


  void on_watch(beast::error_code ec, size_t n) {
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
      poll_timer_.cancel();
      if (ec) return do_close();
      do_read();
    }
  }

  // ---- writing -------------------------------------------------------------------------------
  void send_error(const api_error& e, bool keep_alive) {
    http::response<http::string_body> res{static_cast<http::status>(e.status), 11};
    res.set(http::field::content_type, "application/json");
    if (e.status == 405) res.set(http::field::allow, "GET, POST");
    if (e.status == 401) res.set(http::field::www_authenticate, "Bearer");
    res.body() = error_body(e);
    if (e.status == 413 || e.status == 431 || (e.status == 400 && e.code == "bad_http")) keep_alive = false;
    send_message(std::move(res), keep_alive);
  }

  void send(http::status status, std::string_view content_type, std::string body, bool keep_alive) {
    http::response<http::string_body> res{status, 11};
    res.set(http::field::content_type, content_type);
    res.body() = std::move(body);
    send_message(std::move(res), keep_alive);
  }

  void send_message(http::response<http::string_body> res, bool keep_alive) {
    res.set(http::field::server, "tessera");
    res.keep_alive(keep_alive);
    if (request_.method() == http::verb::head) {
      res.content_length(res.body().size());
    } else {
      res.prepare_payload();
    }
    srv_.metrics.record_http(static_cast<int>(res.result_int()));
    log_response(static_cast<int>(res.result_int()));
    std::ostringstream os;
    if (request_.method() == http::verb::head) os << res.base();
    else os << res;
    response_done_ = true;
    close_after_write_ = !keep_alive;
    queue_write(os.str());
  }

  void queue_write(std::string bytes) {
    if (closed_) return;
    pending_ += bytes;
    if (!write_in_flight_) start_write();
  }

  void start_write() {
    writing_.swap(pending_);
    pending_.clear();
    write_in_flight_ = true;
    net::async_write(stream_, net::buffer(writing_), beast::bind_front_handler(&http_session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, size_t) {
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
      poll_timer_.expires_after(srv_.opt.idle_timeout);
      poll_timer_.async_wait([self = shared_from_this()](beast::error_code wait_ec) {
        if (!wait_ec && self->want_read_) self->do_close();
      });
      return;
    }
    do_read();
  }

  void do_close() {
    if (closed_) return;
    closed_ = true;
    abort_generation();
    busy_.reset();
    poll_timer_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  http_server::impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  net::steady_timer poll_timer_;
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

// ---- WebSocket: /v1/ws (generations) and /v1/events (the event bus) ------------------------------
namespace websocket = beast::websocket;

class ws_session : public std::enable_shared_from_this<ws_session> {
 public:
  ws_session(http_server::impl& srv, ws_kind kind, tcp::socket socket, bool authed)
      : srv_(srv), kind_(kind), ws_(std::move(socket)), poll_timer_(ws_.get_executor()), authed_(authed) {
    beast::error_code ec;
    const tcp::endpoint peer = beast::get_lowest_layer(ws_).socket().remote_endpoint(ec);
    if (!ec) peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
  }

  ~ws_session() {
    if (hub_id_) srv_.hub->remove(hub_id_);
  }

  void run(http::request<http::string_body> req) {
    req_ = std::move(req);
    websocket::stream_base::timeout t{};
    t.handshake_timeout = std::chrono::seconds(30);
    t.idle_timeout = srv_.opt.ws_idle_timeout;
    t.keep_alive_pings = true;
    ws_.set_option(t);
    ws_.read_message_max(srv_.opt.ws_max_message_bytes);
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "tessera"); }));
    ws_.async_accept(req_, beast::bind_front_handler(&ws_session::on_accept, shared_from_this()));
  }

 private:
  struct ws_generation {
    generation_request req;
    actors::stream_handle stream;
    std::string request_id;
    int64_t num_tokens = 0;  // streamed so far (the access line of an aborted one)
    std::vector<double> last_token_at;  // per choice: `t` of its newest token, for the ITL histogram
    bool sent_engine_id = false;        // the engine's id rides on the first delta (it is assigned after tokenizing)
    std::chrono::steady_clock::time_point started_at = std::chrono::steady_clock::now();
  };

  // One access-log line per generation on the socket ("WS /v1/ws").
  void log_generation(int status, const std::string& request_id, double seconds, std::string_view outcome,
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

  void on_accept(beast::error_code ec) {
    if (ec) {
      spdlog::debug("websocket {} from {}: handshake failed: {}", std::string(req_.target()), peer_, ec.message());
      return;
    }
    spdlog::debug("websocket {} open from {}", std::string(req_.target()), peer_);
    if (authed_) on_authed();
    do_read();
  }

  void on_authed() {
    if (kind_ != ws_kind::events || hub_id_) return;
    std::weak_ptr<ws_session> weak = shared_from_this();
    auto executor = ws_.get_executor();
    hub_id_ = srv_.hub->add([weak, executor](event_hub::message m) {
      net::post(executor, [weak, m] {
        if (auto self = weak.lock()) self->send_event(m);
      });
    });
    // The pools as they are now, even if the engine is idle (a local actor query, not engine work).
    if (auto hello = srv_.hub->initial_message()) send(std::move(*hello));
  }

  void do_read() {
    ws_.async_read(buffer_, beast::bind_front_handler(&ws_session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec) return on_closed();
    const std::string text = beast::buffers_to_string(buffer_.data());
    buffer_.consume(buffer_.size());
    handle(text);
    if (!closed_) do_read();
  }

  void send_error(const api_error& e, const std::string& id) {
    json::value body = json::parse(error_body(e));
    json::object out{{"type", "error"}, {"status", e.status}, {"error", body.at("error")}};
    if (!id.empty()) out["id"] = id;
    send(json::serialize(out));
  }

  void handle(const std::string& text) {
    std::string id;
    try {
      simdjson::dom::parser parser;
      const simdjson::padded_string padded(text);
      simdjson::dom::element doc;
      if (parser.parse(padded).get(doc) || !doc.is_object()) {
        throw api_error(400, "messages must be JSON objects", "", "invalid_json");
      }
      std::string_view type;
      if (doc["type"].get(type)) throw api_error(400, "'type' (a string) is required", "type");
      if (std::string_view sid; !doc["id"].get(sid)) id = std::string(sid);
      if (type == "auth") {
        std::string_view key;
        if (doc["api_key"].get(key) || srv_.opt.api_key.empty() || !keys_equal(key, srv_.opt.api_key)) {
          if (srv_.opt.api_key.empty()) {
            authed_ = true;
          } else {
            send_error(api_error(401, "invalid API key", "api_key", "invalid_api_key"), id);
            return close(websocket::close_code::policy_error);
          }
        }
        authed_ = true;
        on_authed();
        return send(R"({"type":"auth_ok"})");
      }
      if (!authed_) {
        send_error(api_error(401, "authenticate first: {\"type\": \"auth\", \"api_key\": KEY}", "", "invalid_api_key"), id);
        return close(websocket::close_code::policy_error);
      }
      if (type == "ping") return send(R"({"type":"pong"})");
      if (kind_ != ws_kind::generate) throw api_error(400, "this socket only streams events", "type");
      if (type == "start") return start(doc, id);
      if (type == "cancel") {
        auto it = gens_.find(id);
        if (it == gens_.end()) throw api_error(404, "no running generation with id '" + id + "'", "id", "not_found");
        it->second.stream.abort();  // the final message (finish_reason "abort") follows
        return;
      }
      throw api_error(400, "unknown message type '" + std::string(type) + "'", "type");
    } catch (const api_error& e) {
      send_error(e, id);
    } catch (const std::exception& e) {
      send_error(api_error(500, std::string("internal error: ") + e.what()), id);
    }
  }

  void start(simdjson::dom::element doc, const std::string& id) {
    if (id.empty() || id.size() > 128) throw api_error(400, "'id' must be a string of 1..128 bytes", "id");
    if (gens_.count(id)) throw api_error(400, "a generation with id '" + id + "' is already running", "id");
    if (gens_.size() >= 64) throw api_error(429, "too many generations on this socket (64)", "", "too_many");
    simdjson::dom::element body;
    if (doc["request"].get(body) || !body.is_object()) throw api_error(400, "'request' (an object) is required", "request");
    std::string_view endpoint = "auto";
    if (doc["endpoint"].get(endpoint)) endpoint = "auto";
    simdjson::dom::element probe;
    const api_kind kind = endpoint == "completions" ? api_kind::completion
                          : endpoint == "chat"      ? api_kind::chat
                          : body["messages"].get(probe) ? api_kind::completion
                                                          : api_kind::chat;
    generation_request req;
    actors::submit_result r;
    try {
      req = parse_generation_request(simdjson::minify(body), kind, srv_.engine.config().vocab_size, srv_.opt.limits);
      r = srv_.engine.submit(req.prompt, req.params, req.priority);
      if (!r) {
        const int status = submit_error_status(r.error);
        if (status != 400) srv_.metrics.record_rejected(status);
        throw api_error(status, r.message.empty() ? std::string(actors::to_string(r.error)) : r.message, "",
                        std::string(actors::to_string(r.error)));
      }
    } catch (const api_error& e) {
      log_generation(e.status, "", 0, "", -1, -1);
      throw;
    }
    ws_generation g;
    g.request_id = srv_.new_id("ws");
    g.req = std::move(req);
    g.stream = std::move(r.stream);
    send(json::serialize(json::object{{"type", "started"}, {"id", id}, {"request_id", g.request_id}}));
    gens_.emplace(id, std::move(g));
    update_busy();
    if (!polling_) schedule_poll();
  }

  void schedule_poll() {
    polling_ = true;
    poll_timer_.expires_after(srv_.opt.poll_interval);
    poll_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      self->polling_ = false;
      if (!ec) self->on_poll();
    });
  }

  void on_poll() {
    if (closed_) return;
    const tokenizer* tok = srv_.engine.tok().get();
    for (auto it = gens_.begin(); it != gens_.end();) {
      bool done = false;
      for (int i = 0; i < 256 && !done; ++i) {
        std::optional<actors::stream_item> item = it->second.stream.try_next();
        if (!item) break;
        if (auto* d = std::get_if<stream_delta>(&*item)) {
          const request_output& o = d->output;
          if (o.token_ids.empty() && o.text.empty()) continue;
          it->second.num_tokens += static_cast<int64_t>(o.token_ids.size());
          auto& last_at = it->second.last_token_at;
          if (!o.token_ids.empty() && o.index >= 0 && o.index < 1024) {
            if (last_at.size() <= static_cast<size_t>(o.index)) last_at.resize(static_cast<size_t>(o.index) + 1, -1);
            double& prev = last_at[static_cast<size_t>(o.index)];
            if (prev >= 0) srv_.metrics.observe_itl((d->seconds_since_submit - prev) / double(o.token_ids.size()));
            prev = d->seconds_since_submit;
          }
          json::array ids;
          for (token_id t : o.token_ids) ids.push_back(t);
          json::object m{{"type", "delta"}, {"id", it->first}, {"index", o.index}, {"token_ids", std::move(ids)},
                         {"text", sanitize_utf8(o.text)}, {"t", d->seconds_since_submit}};
          if (it->second.req.want_logprobs) m["logprobs"] = logprobs_json(api_kind::chat, o.logprobs, tok, 0);
          if (!it->second.sent_engine_id) {
            m["engine_request_id"] = o.id;
            it->second.sent_engine_id = true;
          }
          send(json::serialize(m));
        } else {
          const stream_final& f = std::get<stream_final>(*item);
          srv_.metrics.record_finish(f.reason);
          srv_.metrics.observe_e2e(f.seconds_total);
          if (f.seconds_to_first_token >= 0) srv_.metrics.observe_ttft(f.seconds_to_first_token);
          json::array choices;
          for (const auto& c : f.choices) {
            choices.push_back(json::object{{"index", c.index}, {"finish_reason", finish_reason_json(c.reason)},
                                           {"num_generated_tokens", c.num_generated_tokens}});
          }
          json::object m{{"type", "final"}, {"id", it->first}, {"finish_reason", finish_reason_json(f.reason)},
                         {"choices", std::move(choices)}, {"usage", usage_json(f)}, {"timings", timings_json(f)}};
          if (f.request != 0) m["engine_request_id"] = f.request;
          if (f.reason == finish_reason::error) {
            m["error"] = f.error;
            spdlog::error("request {} failed: {}", it->second.request_id, f.error);
          }
          send(json::serialize(m));
          log_generation(200, it->second.request_id, f.seconds_total, to_string(f.reason), f.num_prompt_tokens,
                         f.num_generated_tokens);
          done = true;
        }
      }
      it = done ? gens_.erase(it) : std::next(it);
    }
    update_busy();
    if (!gens_.empty()) schedule_poll();
  }

  void send_event(const event_hub::message& m) {
    if (closed_ || queue_.size() > 64) return;  // a slow dashboard skips batches; the next one is complete
    push(m);
  }

  void send(std::string text) { push(std::make_shared<const std::string>(std::move(text))); }

  void push(event_hub::message m) {
    if (closed_) return;
    if (queue_.size() >= srv_.opt.ws_max_queued_messages) {
      spdlog::warn("websocket from {}: {} messages queued, closing a reader that does not keep up", peer_, queue_.size());
      return close(websocket::close_code::policy_error);
    }
    queue_.push_back(std::move(m));
    if (queue_.size() == 1) do_write();
  }

  void do_write() {
    ws_.text(true);
    ws_.async_write(net::buffer(*queue_.front()), beast::bind_front_handler(&ws_session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, size_t) {
    if (ec) return on_closed();
    queue_.pop_front();
    if (!queue_.empty() && !closed_) do_write();
    update_busy();
  }

  // Busy while a generation runs or its messages are still queued for the wire.
  void update_busy() {
    if (kind_ == ws_kind::generate && !closed_ && (!gens_.empty() || !queue_.empty())) {
      if (!busy_) busy_.emplace(srv_);
    } else {
      busy_.reset();
    }
  }

  void close(websocket::close_code code) {
    if (closed_) return;
    on_closed();
    ws_.async_close(code, [self = shared_from_this()](beast::error_code) {});
  }

  void on_closed() {
    if (closed_) return;
    closed_ = true;
    for (auto& [id, g] : gens_) {
      g.stream.abort();  // a socket that goes away frees its requests' KV
      srv_.metrics.record_finish(finish_reason::abort);
      log_generation(200, g.request_id,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - g.started_at).count(), "abort", -1,
                     g.num_tokens);
    }
    spdlog::debug("websocket {} from {} closed", kind_ == ws_kind::generate ? "/v1/ws" : "/v1/events", peer_);
    gens_.clear();
    busy_.reset();
    poll_timer_.cancel();
    if (hub_id_) {
      srv_.hub->remove(hub_id_);
      hub_id_ = 0;
    }
  }

  http_server::impl& srv_;
  ws_kind kind_;
  websocket::stream<beast::tcp_stream> ws_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  net::steady_timer poll_timer_;
  std::map<std::string, ws_generation> gens_;
  std::optional<busy_token> busy_;
  std::deque<event_hub::message> queue_;
  uint64_t hub_id_ = 0;
  std::string peer_;
  bool authed_ = false;
  bool polling_ = false;
  bool closed_ = false;
};

void start_websocket(http_server::impl& srv, ws_kind kind, tcp::socket socket, http::request<http::string_body> req,
                     bool authed) {
  std::make_shared<ws_session>(srv, kind, std::move(socket), authed)->run(std::move(req));
}

}  // namespace

void http_server::impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      std::make_shared<http_session>(*this, std::move(socket))->run();
      return do_accept();
    }
    // Out of file descriptors and the like: back off instead of spinning on the error.
    spdlog::warn("accept failed: {}; retrying in 100 ms", ec.message());
    accept_retry.expires_after(std::chrono::milliseconds(100));
    accept_retry.async_wait([this](beast::error_code wait_ec) {
      if (!wait_ec && acceptor.is_open()) do_accept();
    });
  });
}

http_server::http_server(actors::engine_facade& engine, server_options options)
    : impl_(std::make_shared<impl>(engine, std::move(options))) {
  impl& s = *impl_;
  std::random_device rd;
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "%06x", rd() & 0xFFFFFF);
  s.id_prefix = prefix;
  s.vocab_size = engine.config().vocab_size;
  const auto address = net::ip::make_address(s.opt.host);
  const tcp::endpoint endpoint(address, s.opt.port);
  s.acceptor.open(endpoint.protocol());
  s.acceptor.set_option(net::socket_base::reuse_address(true));
  s.acceptor.bind(endpoint);
  s.acceptor.listen(net::socket_base::max_listen_connections);
  s.bound_port = s.acceptor.local_endpoint().port();
  if (!s.opt.webui_dir.empty()) s.ui = std::make_unique<static_files>(s.opt.webui_dir);
  // The facade's event thread publishes into the hub; the hub outlives this server if it must.
  s.hub->set_block_source([&engine] { return engine.kv_occupancy_snapshot(); });  // the dashboard's mosaic
  std::weak_ptr<event_hub> hub = s.hub;
  engine.subscribe_events([hub](const actors::event_batch& batch) {
    if (auto h = hub.lock()) h->publish(batch);
  });
}

http_server::~http_server() { stop(); }

uint16_t http_server::port() const { return impl_->bound_port; }

void http_server::start() {
  impl& s = *impl_;
  s.do_accept();
  const int n = std::max(1, s.opt.num_threads);
  for (int i = 0; i < n; ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
}

void http_server::stop_accepting() {
  impl& s = *impl_;
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
}

void http_server::stop() {
  impl& s = *impl_;
  {
    std::lock_guard lock(s.stop_mutex);
    if (s.stopped) return;
    s.stopped = true;
  }
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
  s.ioc.stop();
  for (auto& t : s.threads) {
    if (t.joinable()) t.join();
  }
  s.stop_cv.notify_all();
}

bool http_server::wait_for_responses(std::chrono::milliseconds timeout) {
  impl& s = *impl_;
  std::unique_lock lock(s.busy_mutex);
  return s.busy_cv.wait_for(lock, timeout, [&] { return s.num_busy == 0; });
}

void http_server::wait() {
  impl& s = *impl_;
  std::unique_lock lock(s.stop_mutex);
  s.stop_cv.wait(lock, [&] { return s.stopped; });
}

}  // namespace tessera::server
