// Command-line flags shared by every subcommand that runs the engine (generate, bench, later serve),
// and the code that turns them into a ready engine: model, executor, KV pools.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "actors/engine_facade.hpp"
#include "engine/executor.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/text/chat_template.hpp"

namespace tessera::app {

struct engine_flags {
  std::string model;  // a path or a library name (app/model_lookup.hpp); empty: the default model
  int threads = 0;    // 0: all cores
  int block_size = 16;
  double kv_cache_memory_gib = 1.0;  // device KV pool size
  int num_kv_blocks = 0;             // overrides kv_cache_memory_gib when > 0
  double swap_space_gib = 1.0;       // host swap pool
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  // Stall-free batching (docs/engine.md#the-prefill-share): prompt chunks next to decodes are sized so
  // that a step takes about this long (by the step cost model); 0: off (chunks of what
  // max_num_batched_tokens leaves). 100 ms: docs/engine.md says why.
  double target_itl_ms = 100;
  int long_prefill_token_threshold = 0;  // one prompt's chunk per step at most (vLLM's name); 0: no cap
  int max_model_len = 0;                 // 0: the model's context length
  std::string preemption_mode = "auto";
  bool no_prefix_caching = false;
  bool dequantize_weights = false;         // fp32 weights: exact math (as transformers), slower decode
  std::string kv_cache_dtype = "auto";     // CPU: auto (fp16) | fp32 | fp16 | bf16 | int8; CUDA: auto | fp8
  std::string device = "auto";             // auto (CUDA when built and a GPU is visible) | cpu | cuda
  std::string load_format = "auto";        // auto (read the weights) | dummy (random weights from config.json)
  std::string dummy_weight_type = "bf16";  // --load-format dummy: f32 | f16 | bf16 | q8_0 | q4_0
  double gpu_memory_utilization = 0.9;     // CUDA: share of GPU memory for weights + activations + KV pool
  std::string dtype = "bfloat16";          // CUDA compute type: bfloat16 | float32 (exact, for comparisons)
  bool cuda_graphs = true;                 // CUDA: replay decode steps from captured graphs (--enforce-eager: off)
  bool async_scheduling = true;            // plan step n+1 while the device runs step n (CUDA; docs/engine.md)
  bool quiet = false;                      // no progress/stats on stderr
  // Speculative decoding (docs/speculative.md).
  std::string speculative = "off";        // off | ngram | draft
  int num_speculative_tokens = 4;         // draft tokens per sequence and step
  std::string draft_model;                // --speculative draft: the draft model (.gguf or HF directory)
  int draft_layers = 0;                   // --speculative draft: the model's own first N layers as draft (0: off)
  int draft_num_kv_blocks = 0;            // the draft model's own KV pool; 0: as --kv-cache-memory allows
  std::string draft_sampling = "sample";  // sample | argmax: how the draft model drafts for requests that sample
  int draft_branches = 1;                 // argmax drafts: tokens offered per position (1: a chain; more: a token tree)
  int ngram_min = 1;                      // n-gram prompt lookup: shortest and longest suffix matched
  int ngram_max = 4;
  int ngram_branches = 1;          // n-gram continuations merged into a token tree (1: a chain)
  int speculative_max_batch = 8;   // decoding sequences above which a step does not speculate
  std::string chat_template_file;  // --chat-template-file: a Jinja file (or the template text); "": the model's

  void add_to(CLI::App& cmd);
};

// Everything a subcommand needs to run requests.
struct engine_bundle {
  loaded_model model;
  std::string model_name;  // the library name MODEL was given by (app/model_lookup.hpp); "" for a path
  std::unique_ptr<executor> exec;
  // --speculative draft: the draft model and its executor (on the target's device, with its own KV
  // pool), which the engine's draft-model proposer uses alone.
  std::optional<loaded_model> draft_model;
  std::shared_ptr<executor> draft_exec;
  std::unique_ptr<llm_engine> engine;  // null when built for the actor runtime
  // Constrained decoding (xgrammar, engine/structured/); null when the build has no xgrammar or the
  // model no tokenizer: requests that ask for structured output are then refused.
  std::shared_ptr<constraint_backend> constraints;
  chat_template chat = chat_template::fallback_chatml();
};

// --device: "cpu" or "cuda" for "auto" | "cpu" | "cuda". auto is CUDA when this binary has the CUDA
// executor and a device is visible; "cuda" without either is an invalid_request saying which.
std::string resolve_device(const std::string& requested);

// --chat-template-file: a file's template, or (when no such file exists and it looks like Jinja) the
// text itself. Throws invalid_request naming the flag when it cannot be read or parsed.
chat_template load_chat_template(const std::string& file_or_text);

// The engine (scheduler, KV pools, batching) options the flags ask for; `draft_exec`: the draft
// model's executor of --speculative draft (make_engine builds it).
engine_options to_engine_options(const engine_flags& flags, std::shared_ptr<executor> draft_exec = nullptr);

// Where make_engine's messages go (unless --quiet): the loader's warnings and the "loaded ..." summary.
// Empty functions: plain lines on stderr ("warning: ..."), as `generate` prints them; `serve` routes
// them through its logger so that --log-format json holds for every line. `progress`: the weights'
// progress bar on a TTY.
struct engine_messages {
  std::function<void(const std::string&)> info, warn;
  bool progress = true;
};

// Loads the model (progress on a TTY), builds the executor --device picks and, with `direct_engine`, an
// llm_engine driven by the caller. Throws load_error / invalid_request with a message for the user.
engine_bundle make_engine(const engine_flags& flags, bool direct_engine = true, const engine_messages& messages = {});

// The actor runtime around a bundle made without a direct engine (the executor moves into it): what
// `serve` and `generate` run on. `max_waiting`: queued requests beyond which submits are refused.
std::unique_ptr<actors::engine_facade> make_facade(engine_bundle& bundle, const engine_flags& flags,
                                                   int32_t max_waiting);

// Renders one user turn (and an optional system prompt) with the model's chat template.
std::string render_chat(const engine_bundle& bundle, const std::string& user, const std::string& system);
// Prompt text -> ids. Chat-rendered text holds the template's special tokens, so those are parsed;
// BOS is added when the vocabulary asks for it and the template did not already write it. A raw
// prompt's special-token text ("<|im_start|>") is parsed too unless parse_special is false (as the
// server's "parse_special": false), like vLLM and llama-server.
std::vector<token_id> encode_prompt(const tokenizer& tok, const std::string& text, bool from_chat_template,
                                    bool parse_special = true);
// A conversation rendered with the chat template and tokenized (what a chat request's prompt is).
std::vector<token_id> encode_messages(const engine_bundle& bundle, const std::vector<chat_message>& messages);
// Renders a conversation with the model's chat template (BOS/EOS texts from the vocabulary).
std::string render_messages(const engine_bundle& bundle, const std::vector<chat_message>& messages);

}  // namespace tessera::app
