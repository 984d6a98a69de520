// The OpenAI-compatible HTTP + WebSocket server (Boost.Beast) in front of the actor runtime's
// engine_facade: the public face of server/. Inside, in Beast's shape: a listener (acceptor and I/O
// threads) hands each connection to an http_session, which routes requests (router), streams
// generations (sse_writer) and may become a ws_session; what they share is a server_state. No I/O
// thread ever blocks on the engine: a request's stream notifies its session when tokens arrive
// (stream_handle::on_ready), and the session drains it on its own strand.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "engine/pooling.hpp"
#include "server/chat_output.hpp"
#include "server/request_parser.hpp"
#include "server/vendor_libraries.hpp"
#include "server/ws_message.hpp"

namespace tessera::server {

struct server_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see http_server::port())
  // A socket already bound and listening (server/listen_socket.hpp: `tessera serve` binds before the
  // model loads), which the listener adopts and closes; -1: the listener binds host:port itself.
  int listen_fd = -1;
  bool listen_fd_v6 = false;
  std::string api_key;                 // empty: no auth
  std::string model_name = "tessera";  // the id /v1/models lists and responses echo
  // More names a request's "model" may use (vLLM's --served-model-name a b, repeated --alias): listed
  // by /v1/models after model_name, accepted by every route; responses still say model_name, as vLLM's.
  std::vector<std::string> model_aliases;
  size_t max_body_bytes = 2 * 1024 * 1024;  // /v1/* bodies; larger: 413
  uint32_t max_header_bytes = 8 * 1024;     // larger: 431
  int num_threads = 2;
  std::vector<std::string> allowed_hosts;    // extra Host names accepted (DNS-rebinding guard)
  std::vector<std::string> allowed_origins;  // Origins accepted besides the same origin (CORS, WebSockets); "*": any
  std::chrono::seconds read_timeout{30};     // whole request (headers + body)
  std::chrono::seconds idle_timeout{15};     // keep-alive wait for the next request
  // A connection whose client takes no bytes for this long while a write is pending is closed and its
  // generations aborted (a client that never reads would otherwise hold its KV and output forever).
  std::chrono::seconds write_timeout{30};
  // SO_SNDBUF of accepted connections; 0: the kernel's (autotuned up to net.ipv4.tcp_wmem's maximum,
  // 4 MiB by default). What a client that stops reading can leave queued in the kernel before the
  // write deadline starts to count (the hardening tests make it small to reach that point quickly).
  int send_buffer_bytes = 0;
  std::chrono::seconds ws_idle_timeout{300};
  // An unauthenticated WebSocket (a key is required and the upgrade carried none) that sends no
  // valid "auth" message this soon is closed (1008).
  std::chrono::milliseconds ws_auth_timeout{5000};
  size_t ws_max_message_bytes = k_ws_default_max_message_bytes;
  size_t ws_max_queued_messages = 4096;  // per socket; a reader slower than this is disconnected
  request_limits limits;
  // /v1/embeddings: how a prompt's hidden states become its vector (--pooling mean | last).
  pooling_type pooling = pooling_type::mean;
  // The browser UI's directory (webui/), served without auth on GET paths the API does not claim;
  // empty: none (see find_webui_dir in server/static_files.hpp).
  std::string webui_dir;
  // The browser libraries served at /vendor/ with the UI (server/vendor_libraries.hpp), resolved at startup.
  vendor_files webui_vendor;
  // How chat outputs are split into reasoning_content / content / tool_calls (server/chat_output.hpp):
  // chosen by --tool-call-parser / --reasoning-parser or detected from the model's chat template.
  output_parsers parsers;
  // Tests only (fault injection): called on the I/O thread with every request's target before it is
  // routed; whatever it throws must close that one connection and nothing else.
  std::function<void(std::string_view target)> before_route;
};

// Whether `name` is one of the served model's names (model_name or an alias).
inline bool serves_model(const server_options& o, std::string_view name) {
  return name == o.model_name ||
         std::find(o.model_aliases.begin(), o.model_aliases.end(), name) != o.model_aliases.end();
}

// "'a'" or "'a', 'b'": the served names, for a 404's message.
inline std::string served_names(const server_options& o) {
  std::string out = "'" + o.model_name + "'";
  for (const auto& a : o.model_aliases) out += ", '" + a + "'";
  return out;
}

class http_server {
 public:
  // Binds and listens; throws std::system_error when the address cannot be bound.
  http_server(actors::engine_facade& engine, server_options options);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  uint16_t port() const;  // the bound port
  void start();           // starts the I/O threads; returns at once
  void stop_accepting();  // closes the listener; open connections keep being served (graceful shutdown)
  void stop();            // closes the listener and every connection, joins the threads
  // Blocks until every generation's final message has been written (or its client is gone), at most
  // `timeout`; false on timeout. With the engine shut down first, this is how long finals take to send.
  bool wait_for_responses(std::chrono::milliseconds timeout);
  void wait();  // blocks until stop() (e.g. from a signal handler thread)

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Constant-time comparison of a presented key with the configured one (no early exit on a mismatch).
bool keys_equal(std::string_view presented, std::string_view expected);

// Whether a Host header value names this server: the bound host, loopback names, or an allowed name;
// the port, when present, must be the bound port. A bind to 0.0.0.0 / :: with no allowed_hosts accepts any.
bool host_allowed(std::string_view host_header, const server_options& options, uint16_t bound_port);

}  // namespace tessera::server
