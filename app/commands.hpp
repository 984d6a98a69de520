// The subcommands of `tessera`, each a small type that registers its flags and runs.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "app/engine_flags.hpp"
#include "engine/sampling_params.hpp"

namespace tessera::app {

// Sampling flags shared by generate and bench.
struct sampling_flags {
  int max_tokens = 256;
  float temperature = 0.8f;
  float top_p = 1.0f;
  int top_k = -1;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;

  void add_to(CLI::App& cmd);
  sampling_params to_params() const;
};

class generate_command {
 public:
  void add_to(CLI::App& app);
  bool selected() const { return cmd_ && cmd_->parsed(); }
  int run();

 private:
  int run_single();
  int run_batch();

  CLI::App* cmd_ = nullptr;
  engine_flags engine_;
  sampling_flags sampling_;
  std::string prompt_;
  std::string system_;
  bool chat_ = false;
  bool no_parse_special_ = false;  // --no-parse-special
  std::string input_;
  std::string output_;
};

class bench_command {
 public:
  void add_to(CLI::App& app);
  bool selected() const { return cmd_ && cmd_->parsed(); }
  int run();

 private:
  int run_latency();
  void run_latency_batch(engine_bundle& b, int batch_size);
  int run_throughput();
  int run_serve();  // execs bench/serve_client.py with the remaining arguments

  CLI::App* cmd_ = nullptr;
  CLI::App* latency_ = nullptr;
  CLI::App* throughput_ = nullptr;
  CLI::App* serve_ = nullptr;
  engine_flags engine_;
  int prompt_tokens_ = 512;
  int gen_tokens_ = 128;
  int repeats_ = 1;
  std::vector<int> batch_sizes_{1};  // latency: sequences decoded together (one JSON line per size)
  std::string workload_;
  int num_requests_ = 0;  // 0: all
  // throughput without --workload: num_prompts_ synthetic prompts of input_len_ tokens, each
  // generating exactly output_len_ (vLLM's benchmark_throughput --input-len/--output-len/--num-prompts).
  int input_len_ = 0;
  int output_len_ = 0;
  int num_prompts_ = 1000;
};

class inspect_command {
 public:
  void add_to(CLI::App& app);
  bool selected() const { return cmd_ && cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_ = nullptr;
  std::string model_;
  bool tensors_ = false;
};

// `tessera pull NAME...`, `tessera list`, `tessera rm NAME...`: the model library (app/model_lookup.hpp,
// app/model_pull.hpp; app/library_commands.cpp).
class library_commands {
 public:
  void add_to(CLI::App& app);
  bool selected() const;
  int run();

 private:
  int run_pull();
  int run_list();
  int run_rm();

  CLI::App* pull_ = nullptr;
  CLI::App* list_ = nullptr;
  CLI::App* rm_ = nullptr;
  std::vector<std::string> pull_names_;
  std::vector<std::string> rm_names_;
  bool list_verify_ = false;
};

// `tessera serve`: the OpenAI-compatible server (app/serve.cpp).
class serve_command {
 public:
  void add_to(CLI::App& app);
  bool selected() const { return cmd_ && cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_ = nullptr;
  engine_flags engine_;
  std::string positional_model_;
  std::string host_ = "127.0.0.1";
  int port_ = 8000;
  std::string api_key_;
  std::vector<std::string> model_names_;  // --served-model-name a b / repeated --alias: the first is reported
  std::string chat_template_kwargs_;      // --chat-template-kwargs: a JSON object, every chat request's default
  std::string pooling_ = "mean";          // --pooling: /v1/embeddings' pooling (mean | last)
  bool allow_truncation_ = false;         // --allow-truncation: too-long prompts keep their last tokens
  size_t max_body_bytes_ = 2 * 1024 * 1024;
  int max_waiting_ = 256;
  int server_threads_ = 2;
  std::vector<std::string> allowed_origins_;
  std::vector<std::string> allowed_hosts_;
  std::string webui_dir_;
  std::string tool_call_parser_ = "auto";  // server/tool_call_parser.hpp; auto: from the chat template
  std::string reasoning_parser_ = "auto";  // server/reasoning_parser.hpp; auto: from the chat template
  int request_timeout_s_ = 30;
  int keep_alive_timeout_s_ = 15;
  int ws_idle_timeout_s_ = 300;
  int write_timeout_s_ = 30;   // no write progress this long: the connection is closed
  int ws_auth_timeout_s_ = 5;  // an unauthenticated WebSocket must send "auth" this soon
  int64_t max_response_bytes_ = int64_t{64} << 20;
  int shutdown_timeout_s_ = 2;  // SIGINT/SIGTERM: open requests may finish this long, then are aborted
  size_t ws_max_message_bytes_ = 64 * 1024;
  std::string config_path_;  // --config: a TOML file (app/config.hpp); the command line wins
  std::string log_level_ = "info";
  std::string log_format_ = "text";
  bool no_access_log_ = false;
};

}  // namespace tessera::app
