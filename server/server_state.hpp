// What the sessions of one server share: the engine, the options, the metrics, the /v1/events hub,
// the browser UI's files, request ids, the count of generations still being answered (graceful
// shutdown waits for it), and the poster through which other threads reach a session. Owned by
// http_server; sessions hold a reference, which stays valid because the listener's io_context (and
// with it every session) is destroyed before this state.
#pragma once
#include <boost/asio/post.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "actors/engine_facade.hpp"
#include "server/event_hub.hpp"
#include "server/http_server.hpp"
#include "server/metrics.hpp"
#include "server/request_parser.hpp"

namespace tessera::server {

class static_files;

// How threads outside the server (a stream's sink actor calling its ready hook, the event hub's
// publisher) hand work to a session: `fn(session)` runs on the session's strand. The session is
// reached through a weak_ptr, so a notification never keeps a finished session alive nor touches a
// destroyed one, and the posted handler holds the session until it has run. Nothing is posted after
// close(), which http_server::stop() calls before the io_context stops: a hook that fires late (the
// runtime outlives the server) finds the poster closed instead of an io_context that is going away.
// A hook therefore captures the poster (a shared_ptr) and a weak_ptr, never the session's executor:
// an Asio strand must not outlive its io_context.
class session_poster {
 public:
  template <class Session, class Fn>
  void post(const std::weak_ptr<Session>& weak, Fn fn) {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    std::shared_ptr<Session> session = weak.lock();
    if (!session) return;
    const auto executor = session->get_executor();
    boost::asio::post(executor, [session = std::move(session), fn = std::move(fn)]() mutable { fn(*session); });
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }

 private:
  std::mutex mutex_;  // held while posting: once close() returns, no post is under way
  bool closed_ = false;
};

struct server_state {
  server_state(actors::engine_facade& engine, server_options options);
  ~server_state();
  server_state(const server_state&) = delete;
  server_state& operator=(const server_state&) = delete;

  // "chatcmpl-<6 random hex digits of this process><counter>", unique per server; `separator` '_'
  // for the Responses API's ids ("resp_...", "msg_...").
  std::string new_id(const char* prefix, char separator = '-');

  // Submits a parsed generation. Throws api_error when the runtime refuses it at once (429 overloaded,
  // 503 unhealthy or shutting down, 400 invalid), counting 429/503 in the metrics.
  actors::stream_handle submit(const generation_request& req);

  // Blocks until no generation is being answered, at most `timeout`; false on timeout.
  bool wait_until_not_busy(std::chrono::milliseconds timeout);

  actors::engine_facade& engine;
  const server_options opt;
  server_metrics metrics;
  std::shared_ptr<event_hub> hub = std::make_shared<event_hub>();
  std::unique_ptr<static_files> ui;  // the browser UI; null: none
  std::shared_ptr<session_poster> poster = std::make_shared<session_poster>();
  uint16_t bound_port = 0;  // set by the listener once bound

 private:
  friend class busy_token;
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex busy_mutex_;
  std::condition_variable busy_cv_;
  int64_t num_busy_ = 0;
};

// Held by a session from the moment it has a generation until that generation's final message is on
// the wire (or the connection is gone): what http_server::wait_for_responses() counts.
class busy_token {
 public:
  explicit busy_token(server_state& state);
  ~busy_token();
  busy_token(const busy_token&) = delete;
  busy_token& operator=(const busy_token&) = delete;

 private:
  server_state* state_;
};

}  // namespace tessera::server
