// `tessera serve`: the OpenAI-compatible HTTP + WebSocket server over the actor runtime.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/engine_facade.hpp"
#include "app/commands.hpp"
#include "app/config.hpp"
#include "app/exit_codes.hpp"
#include "engine/base/error.hpp"
#include "server/cors.hpp"
#include "server/http_server.hpp"
#include "server/listen_socket.hpp"
#include "server/logging.hpp"
#include "server/static_files.hpp"

namespace tessera::app {

namespace {
// After the runtime has shut down, how long connections get to write the final messages it produced.
// How long shutdown waits for the final messages of open streams to reach the wire: a client that
// stopped reading must not hold the process.
constexpr auto k_final_write_timeout = std::chrono::seconds(2);
}  // namespace

void serve_command::add_to(CLI::App& app) {
  cmd_ = app.add_subcommand("serve", "Serve the OpenAI-compatible API (HTTP, SSE, WebSocket)");
  // Defaults show in --help; tests/app/config_test.cpp checks config/tessera.toml lists the same ones.
  cmd_->option_defaults()->always_capture_default();
  cmd_->add_option("model", positional_model_,
                   "Model: a library name (tessera list, tessera pull NAME), a .gguf file or a Hugging Face "
                   "model directory (same as --model)");
  cmd_->add_option("--config", config_path_,
                   "TOML file of option values, e.g. config/tessera.toml (flags given here override it)")
      ->check(CLI::ExistingFile);
  // Help groups double as the config file's tables: [engine], [server], [logging].
  const size_t num_before_engine = cmd_->get_options().size();
  engine_.add_to(*cmd_);
  const std::vector<CLI::Option*> options = cmd_->get_options({});
  for (size_t i = num_before_engine; i < options.size(); ++i) options[i]->group("Engine");
  cmd_->option_defaults()->group("Server");
  cmd_->add_option("--log-level", log_level_, "trace | debug | info | warn | error | critical | off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "warning", "error", "critical", "off"}))
      ->group("Logging");
  cmd_->add_option("--log-format", log_format_, "text (for people) | json (one object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->group("Logging");
  cmd_->add_flag("--no-access-log", no_access_log_, "No per-request log lines")->group("Logging");
  cmd_->add_option("--host", host_, "Address to bind (default 127.0.0.1: loopback only)");
  cmd_->add_option("--port", port_, "TCP port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd_->add_option("--api-key", api_key_, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd_->add_option("--served-model-name,--alias", model_names_,
                   "Model ids requests may use, all listed by /v1/models; responses report the first "
                   "(vLLM: --served-model-name a b; llama-server: --alias, repeatable)");
  cmd_->add_flag("--allow-truncation", allow_truncation_,
                 "A prompt too long for the context keeps its last tokens that fit (with max_tokens) instead of "
                 "a 400; a request's truncate_prompt_tokens (vLLM's) overrides it");
  cmd_->add_option("--pooling", pooling_,
                   "How /v1/embeddings pools a prompt's final hidden states: mean (every token; llama-server's "
                   "default for generative models) or last (the last token's)")
      ->check(CLI::IsMember({"mean", "last"}));
  cmd_->add_option("--chat-template-kwargs", chat_template_kwargs_,
                   "JSON object of extra chat-template variables, e.g. '{\"enable_thinking\": false}' "
                   "(a request's chat_template_kwargs override it key by key)");
  cmd_->add_option("--max-body-bytes", max_body_bytes_, "Largest request body (larger: 413)")
      ->check(CLI::Range(1024, 1 << 30));
  cmd_->add_option("--max-waiting", max_waiting_, "Queued requests beyond which new ones get 429")
      ->check(CLI::Range(1, 1 << 20));
  cmd_->add_option("--server-threads", server_threads_, "I/O threads")->check(CLI::Range(1, 64));
  cmd_->add_option("--request-timeout", request_timeout_s_,
                   "Seconds a client has to send a whole request (else closed)")
      ->check(CLI::Range(1, 3600));
  cmd_->add_option("--keep-alive-timeout", keep_alive_timeout_s_, "Seconds an idle keep-alive connection stays open")
      ->check(CLI::Range(1, 3600));
  cmd_->add_option("--ws-idle-timeout", ws_idle_timeout_s_,
                   "Seconds a silent WebSocket is kept (pinged at half of it; no pong: closed)")
      ->check(CLI::Range(1, 86400));
  cmd_->add_option("--ws-max-message-bytes", ws_max_message_bytes_, "Largest WebSocket message a client may send")
      ->check(CLI::Range(1024, 16 << 20));
  cmd_->add_option("--write-timeout", write_timeout_s_,
                   "Seconds a client may take no bytes of a pending response or message before it is disconnected "
                   "(its generations aborted)")
      ->check(CLI::Range(1, 3600));
  cmd_->add_option("--ws-auth-timeout", ws_auth_timeout_s_,
                   "Seconds a WebSocket has to send its auth message when the upgrade carried no key")
      ->check(CLI::Range(1, 3600));
  cmd_->add_option("--max-response-bytes", max_response_bytes_,
                   "Largest response a request may ask for, estimated from n x max_tokens x logprobs (larger: 400)")
      ->check(CLI::Range(int64_t{1} << 16, int64_t{1} << 40));
  cmd_->add_option("--shutdown-timeout", shutdown_timeout_s_,
                   "Seconds open requests may still finish after SIGINT/SIGTERM before they are aborted")
      ->check(CLI::Range(0, 3600));
  cmd_->add_option("--allowed-origins,--allowed-origin", allowed_origins_,
                   "Origins besides the server's own whose browser pages may call the API (CORS) and open WebSockets: "
                   "a comma list, repeatable, or vLLM's JSON list; '*': any");
  cmd_->add_option("--allowed-host", allowed_hosts_,
                   "Extra accepted Host header name (behind a reverse proxy, or a LAN name), repeatable");
  cmd_->add_option("--webui-dir", webui_dir_,
                   "Browser UI directory served at / (default: the built-in webui/; 'none': no UI)");
  cmd_->add_option(
          "--tool-call-parser", tool_call_parser_,
          "How tool calls are read from chat outputs: auto (from the chat template) | none | hermes | llama3 | mistral")
      ->check(CLI::IsMember(
          {"auto", "none", "hermes", "qwen", "qwen2_5", "qwen3", "llama3", "llama3_json", "llama", "mistral"}));
  cmd_->add_option("--reasoning-parser", reasoning_parser_,
                   "How <think> reasoning is split into reasoning_content: auto (from the chat template) | none | "
                   "qwen3 | deepseek_r1")
      ->check(CLI::IsMember({"auto", "none", "qwen3", "deepseek_r1", "deepseek-r1"}));
}

namespace {

// --reasoning-parser auto: a template that opens <think> in the generation prompt (DeepSeek-R1) starts
// the output inside the reasoning; one that mentions <think> otherwise (Qwen3) lets the model open it.
server::reasoning_parser_kind detect_reasoning_parser(const std::string& source) {
  const size_t generation = source.rfind("add_generation_prompt");
  if (generation != std::string::npos && source.find("<think>", generation) != std::string::npos &&
      source.find("</think>", generation) == std::string::npos) {
    return server::reasoning_parser_kind::deepseek_r1;
  }
  if (source.find("<think>") != std::string::npos) return server::reasoning_parser_kind::qwen3;
  return server::reasoning_parser_kind::none;
}

}  // namespace

int serve_command::run() {
  if (!config_path_.empty()) {
    try {
      apply_config_file(*cmd_, config_path_);  // fills only what the command line left unset
    } catch (const config_error& e) {
      // Before the logger exists (the file may set its format): the command line's format decides.
      if (log_format_ == "json") {
        std::fprintf(stderr, "%s\n", server::early_json_line("critical", std::string("config: ") + e.what()).c_str());
      } else {
        std::fprintf(stderr, "tessera: config: %s\n", e.what());
      }
      return exit_usage;
    }
  }
  server::log_options log_options;
  log_options.level = log_level_;
  log_options.format = server::parse_log_format(log_format_);
  log_options.access_log = !no_access_log_;
  server::setup_logging(log_options);
  // Every way out writes the queued log lines first; when stderr takes none (a pipe nobody reads), the
  // process leaves without the normal exit's flush of stderr, which would wait for it forever.
  auto finish = [](int code) {
    if (!server::shutdown_logging()) std::_Exit(code);
    return code;
  };
  struct finish_on_exception {
    ~finish_on_exception() {
      if (std::uncaught_exceptions() > 0 && !server::shutdown_logging()) std::_Exit(1);
    }
  } finish_if_thrown;
  if (!config_path_.empty()) spdlog::info("config: {}", config_path_);

  if (!chat_template_kwargs_.empty()) {
    try {
      server::check_chat_template_kwargs(chat_template_kwargs_);  // a usage error, before the model loads
    } catch (const invalid_request& e) {
      spdlog::critical("{}", e.what());
      return finish(exit_usage);
    }
  }
  // The port first: one in use is reported at once, not after the model has loaded.
  server::listen_socket listening;
  try {
    listening = server::listen_socket::open(host_, static_cast<uint16_t>(port_));
  } catch (const std::invalid_argument& e) {
    spdlog::critical("{}", e.what());
    return finish(exit_usage);
  } catch (const std::system_error& e) {
    const int error = e.code().value();
    const char* hint = error == EADDRINUSE ? " (another process has this port: stop it, or pick another with --port)"
                       : error == EADDRNOTAVAIL ? " (not an address of this host: see --host)"
                       : error == EACCES        ? " (a privileged port: use one above 1023)"
                                                : "";
    spdlog::critical("cannot listen on {}: {}{}", server::host_port(host_, static_cast<uint16_t>(port_)),
                     e.code().message(), hint);
    return finish(exit_cannot_listen);
  }
  if (!positional_model_.empty()) engine_.model = positional_model_;
  engine_bundle b;
  try {
    engine_messages messages;  // through the logger: --log-format json holds for these lines too
    messages.info = [](const std::string& text) { spdlog::info("{}", text); };
    messages.warn = [](const std::string& text) { spdlog::warn("{}", text); };
    messages.progress = log_options.format == server::log_format::text;
    b = make_engine(engine_, /*direct_engine=*/false, messages);
  } catch (const load_error& e) {
    spdlog::critical("cannot load model: {}", e.what());
    return finish(exit_model_load);
  } catch (const invalid_request& e) {
    spdlog::critical("{}", e.what());
    return finish(exit_usage);
  }
  const model_config& mc = b.model.weights->config;
  const kv_cache_spec kv = b.exec->kv_spec();
  const std::string executor_name = b.exec->name();
  server::output_parsers parsers;
  parsers.tools = tool_call_parser_ == "auto" ? server::detect_tool_parser(b.chat.source())
                                              : *server::tool_parser_from_name(tool_call_parser_);
  parsers.reasoning = reasoning_parser_ == "auto" ? detect_reasoning_parser(b.chat.source())
                                                  : *server::reasoning_parser_from_name(reasoning_parser_);
  const std::string kv_dtype = *b.exec->kv_cache_dtype() ? b.exec->kv_cache_dtype() : "default";
  std::unique_ptr<actors::engine_facade> runtime = make_facade(b, engine_, max_waiting_);
  actors::engine_facade& facade = *runtime;

  server::server_options so;
  so.host = host_;
  so.port = listening.port();
  so.listen_fd_v6 = listening.is_v6();
  so.listen_fd = listening.release();  // the listener owns it from here
  so.api_key = api_key_;
  // By default the model is named as it was given: its library name (what a client of `tessera serve
  // gemma3-270m` will send), else its file or directory name.
  so.model_name = !model_names_.empty()   ? model_names_.front()
                  : !b.model_name.empty() ? b.model_name
                                          : b.model.path.filename().string();
  if (model_names_.size() > 1) so.model_aliases.assign(model_names_.begin() + 1, model_names_.end());
  so.max_body_bytes = max_body_bytes_;
  so.num_threads = server_threads_;
  so.read_timeout = std::chrono::seconds(request_timeout_s_);
  so.idle_timeout = std::chrono::seconds(keep_alive_timeout_s_);
  so.ws_idle_timeout = std::chrono::seconds(ws_idle_timeout_s_);
  so.write_timeout = std::chrono::seconds(write_timeout_s_);
  so.ws_auth_timeout = std::chrono::seconds(ws_auth_timeout_s_);
  so.ws_max_message_bytes = ws_max_message_bytes_;
  so.allowed_origins = server::parse_origin_list(allowed_origins_);
  so.allowed_hosts = allowed_hosts_;
  so.webui_dir = server::find_webui_dir(webui_dir_).string();
  if (so.webui_dir.empty() && !webui_dir_.empty() && webui_dir_ != "none") {
    spdlog::error("--webui-dir {} has no index.html", webui_dir_);
    return finish(exit_usage);
  }
  if (!so.webui_dir.empty()) so.webui_vendor = server::resolve_vendor_files();
  so.limits.sampling = to_engine_options(engine_).limits;
  so.parsers = parsers;
  so.limits.max_response_bytes = max_response_bytes_;
  so.limits.max_model_len = facade.max_model_len();
  so.limits.default_chat_template_kwargs = chat_template_kwargs_;
  so.limits.allow_truncation = allow_truncation_;
  so.pooling = parse_pooling_type(pooling_).value_or(pooling_type::mean);  // --pooling checked it

  // SIGINT/SIGTERM end the server: block them here, wait for one on a helper thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const engine_options eo = to_engine_options(engine_);
  spdlog::info("model {} ({}): {} layers, hidden {}, vocab {}, context {}", so.model_name, b.model.path.string(),
               mc.num_layers, mc.hidden_size, mc.vocab_size, mc.context_length);
  spdlog::info("executor {}: {} compute threads{}; KV pool {} blocks x {} tokens ({}), swap pool {} blocks",
               executor_name,
               engine_.threads > 0 ? engine_.threads : static_cast<int>(std::thread::hardware_concurrency()),
               engine_.dequantize_weights ? ", fp32 weights" : "", kv.num_device_blocks, kv.block_size, kv_dtype,
               kv.num_host_blocks);
  std::ostringstream itl;
  if (eo.target_step_seconds > 0)
    itl << engine_.target_itl_ms << " ms";
  else
    itl << "off";
  spdlog::info(
      "scheduler: max {} sequences, {} tokens per step, max model length {}, preemption {}, prefix caching {}, "
      "target ITL {}",
      eo.max_num_seqs, eo.max_num_batched_tokens, eo.max_model_len > 0 ? eo.max_model_len : mc.context_length,
      engine_.preemption_mode, eo.enable_prefix_caching ? "on" : "off", itl.str());

  std::optional<server::http_server> server;
  try {
    server.emplace(facade, so);
  } catch (const std::exception& e) {
    spdlog::critical("cannot start the server on {}: {}", server::host_port(so.host, so.port), e.what());
    facade.shutdown(std::chrono::seconds(shutdown_timeout_s_));
    return finish(exit_failure);
  }
  server->start();
  spdlog::info("serving {} on http://{}:{} ({} I/O threads, API key {}, max body {} bytes, max waiting {})",
               so.model_name, so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, server->port(),
               so.num_threads, so.api_key.empty() ? "not required" : "required", so.max_body_bytes, max_waiting_);
  if (so.host != "127.0.0.1" && so.host != "::1" && so.host != "localhost" && so.api_key.empty()) {
    spdlog::warn("bound to {} without --api-key: anyone who can reach this address can use the server", so.host);
  }
  if (!so.webui_dir.empty()) {
    spdlog::info("web UI (chat, dashboard) at / from {}", so.webui_dir);
    for (const std::string& m : so.webui_vendor.missing) spdlog::warn("{}", m);
  }
  spdlog::info("chat outputs: tool-call parser {}, reasoning parser {}", server::to_string(parsers.tools),
               server::to_string(parsers.reasoning));
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}, shutting down", sig);
  // Graceful order: stop taking connections, let the runtime finish (or abort, after the timeout) the
  // open requests so every stream gets its final message, wait until the connections have written
  // those finals (bounded: a client may have stopped reading), then close everything.
  server->stop_accepting();
  facade.shutdown(std::chrono::seconds(shutdown_timeout_s_));
  if (!server->wait_for_responses(k_final_write_timeout)) {
    spdlog::warn("some clients did not take their final message within {} s; closing them",
                 k_final_write_timeout.count());
  }
  server->stop();
  spdlog::info("stopped");
  return finish(exit_ok);
}

}  // namespace tessera::app
