// `tessera serve`: the OpenAI-compatible HTTP + WebSocket server over the actor runtime.
#include <csignal>
#include <cstdio>
#include <thread>

#include "actors/engine_facade.hpp"
#include "app/commands.hpp"
#include "engine/error.hpp"
#include "server/http_server.hpp"

namespace tessera::app {

void serve_command::add_to(CLI::App& app) {
  cmd_ = app.add_subcommand("serve", "Serve the OpenAI-compatible API (HTTP, SSE, WebSocket)");
  cmd_->add_option("model", positional_model_, "Model: a .gguf file (same as --model)");
  engine_.add_to(*cmd_);
  cmd_->add_option("--host", host_, "Address to bind (default 127.0.0.1: loopback only)");
  cmd_->add_option("--port", port_, "TCP port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd_->add_option("--api-key", api_key_, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd_->add_option("--served-model-name", model_name_, "Model id for /v1/models and responses");
  cmd_->add_option("--max-body-bytes", max_body_bytes_, "Largest request body (larger: 413)")->check(CLI::Range(1024, 1 << 30));
  cmd_->add_option("--max-waiting", max_waiting_, "Queued requests beyond which new ones get 429")->check(CLI::Range(1, 1 << 20));
  cmd_->add_option("--server-threads", server_threads_, "I/O threads")->check(CLI::Range(1, 64));
  cmd_->add_option("--allowed-origin", allowed_origins_, "Extra allowed Origin for browsers/WebSockets ('*': any)");
  cmd_->add_option("--allowed-host", allowed_hosts_, "Extra accepted Host header name");
}

int serve_command::run() {
  if (!positional_model_.empty()) engine_.model = positional_model_;
  engine_bundle b = make_engine(engine_, /*direct_engine=*/false);
  std::unique_ptr<actors::engine_facade> runtime = make_facade(b, engine_, max_waiting_);
  actors::engine_facade& facade = *runtime;

  server::server_options so;
  so.host = host_;
  so.port = static_cast<uint16_t>(port_);
  so.api_key = api_key_;
  so.model_name = model_name_.empty() ? b.model.path.filename().string() : model_name_;
  so.max_body_bytes = max_body_bytes_;
  so.num_threads = server_threads_;
  so.allowed_origins = allowed_origins_;
  so.allowed_hosts = allowed_hosts_;
  so.limits.sampling = to_engine_options(engine_).limits;
  so.encode_chat = [&b](const std::vector<chat_message>& messages) {
    return encode_messages(b, messages);
  };

  // SIGINT/SIGTERM end the server: block them here, wait for one on a helper thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  server::http_server server(facade, so);
  server.start();
  std::fprintf(stderr, "tessera: serving %s on http://%s:%u\n", so.model_name.c_str(), so.host.c_str(),
               static_cast<unsigned>(server.port()));
  std::fflush(stderr);
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "tessera: signal %d, shutting down\n", sig);
  server.stop();
  facade.shutdown(std::chrono::milliseconds(2000));
  return 0;
}

}  // namespace tessera::app
