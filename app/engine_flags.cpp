#include "app/engine_flags.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string_view>
#include <utility>

#include "cpu/cpu_executor.hpp"
#if TESSERA_WITH_CUDA
#include "gpu/cuda_executor.hpp"
#endif
#include "engine/base/error.hpp"
#if TESSERA_WITH_XGRAMMAR
#include "engine/structured/grammar_backend.hpp"
#endif
#include "app/cli_conventions.hpp"
#include "app/model_lookup.hpp"
#include "engine/base/regular_file.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/hf_json.hpp"
#include "engine/model/kv_layer_groups.hpp"
#include "engine/speculative/draft_model_proposer.hpp"
#include "engine/speculative/layer_draft.hpp"
#include "engine/speculative/vocabulary_check.hpp"

namespace tessera::app {

namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

preemption_mode parse_preemption(const std::string& text) {
  if (text == "swap") return preemption_mode::swap;
  if (text == "recompute") return preemption_mode::recompute;
  if (text == "auto") return preemption_mode::automatic;
  throw invalid_request("--preemption-mode must be swap, recompute or auto (got '" + text + "')");
}

// Reads every page of the weights once so the first request does not pay for page faults, drawing a
// progress bar on a terminal: on a cold cache this is the part of loading that takes time.
void fault_in_weights(const model_weights& w, bool show) {
  std::vector<const weight_tensor*> all = {&w.token_embedding, &w.output_norm};
  if (!w.config.tied_embeddings) all.push_back(&w.output);
  for (const auto& l : w.layers) {
    for (const weight_tensor* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      all.push_back(t);
  }
  int64_t total = 0;
  for (const auto* t : all) total += t->rows * t->row_stride_bytes;
  int64_t done = 0;
  int last_percent = -1;
  volatile unsigned char sink = 0;
  for (const auto* t : all) {
    const int64_t bytes = t->rows * t->row_stride_bytes;
    const auto* p = reinterpret_cast<const unsigned char*>(t->data);
    for (int64_t off = 0; off < bytes; off += 4096) sink = sink + p[off];
    done += bytes;
    const int percent = total ? static_cast<int>(100 * done / total) : 100;
    if (show && percent != last_percent) {
      last_percent = percent;
      const int filled = percent * 40 / 100;
      std::fprintf(stderr, "\rloading weights [%.*s%*s] %3d%%", filled, "########################################",
                   40 - filled, "", percent);
    }
  }
  if (show) std::fprintf(stderr, "\n");
}

// --dummy-weight-type, for --load-format dummy (the flag's check has accepted the name).
dummy_weights_options dummy_options(const engine_flags& flags) {
  static constexpr std::pair<std::string_view, ggml_type> kTypes[] = {
      {"f32", ggml_type::f32},   {"f16", ggml_type::f16},   {"bf16", ggml_type::bf16},
      {"q8_0", ggml_type::q8_0}, {"q4_0", ggml_type::q4_0}, {"q4_k", ggml_type::q4_k}};
  dummy_weights_options o;
  for (const auto& [name, type] : kTypes) {
    if (flags.dummy_weight_type == name) o.type = type;
  }
  return o;
}

// --speculative draft: the draft model's weights: --draft-model's file, checked to have the target's
// vocabulary (what both tokenizers loaded: size, token texts, special ids), or --draft-layers' first
// layers of the target itself (engine/speculative/layer_draft.hpp). Every failure is an
// invalid_request naming the flag.
void load_draft_weights(const engine_flags& flags, bool dummy, engine_bundle& b) {
  if (flags.draft_layers > 0) {
    if (!flags.draft_model.empty())
      throw invalid_request("--draft-layers and --draft-model both name the draft model: give one of them");
    loaded_model draft;
    draft.path = b.model.path;
    draft.weights = first_layers_draft(b.model.weights, flags.draft_layers);
    draft.tok = b.model.tok;
    b.draft_model = std::move(draft);
    return;
  }
  const std::string flag = "--draft-model " + flags.draft_model;
  if (flags.draft_model.empty())
    throw invalid_request(
        "--speculative draft needs --draft-model PATH (the draft model) or --draft-layers N (the model's own first "
        "N layers)");
  try {
    b.draft_model = load_model(resolve_model(flags.draft_model).path,
                               dummy ? load_format::dummy : load_format::automatic, dummy_options(flags));
  } catch (const std::exception& e) { throw invalid_request(flag + ": cannot load it: " + e.what()); }
  const model_config& target = b.model.weights->config;
  const model_config& draft = b.draft_model->weights->config;
  if (draft.vocab_size != target.vocab_size)
    throw invalid_request(flag + ": its vocabulary differs from the target's (" + std::to_string(draft.vocab_size) +
                          " logits per token, the target " + std::to_string(target.vocab_size) + ")");
  if (b.model.tok && b.draft_model->tok) {
    const std::string mismatch = vocabulary_mismatch(*b.model.tok, *b.draft_model->tok);
    if (!mismatch.empty()) throw invalid_request(flag + ": its vocabulary differs from the target's: " + mismatch);
  } else if (b.model.tok || b.draft_model->tok) {
    throw invalid_request(flag +
                          ": one of the target and the draft has no tokenizer, so their vocabularies "
                          "cannot be compared");
  }
  if (!dummy) fault_in_weights(*b.draft_model->weights, false);
}

// "--draft-model FILE" or "--draft-layers N", for the errors about the draft's executor.
std::string draft_flag(const engine_flags& flags) {
  return flags.draft_layers > 0 ? "--draft-layers " + std::to_string(flags.draft_layers)
                                : "--draft-model " + flags.draft_model;
}

// Blocks of block_size positions the target's pool holds for every layer: its blocks over its KV layer
// groups (a grouped target spends one block per group on each block_size positions).
int32_t target_position_blocks(const executor& target) {
  return target.kv_spec().num_device_blocks / target.kv_groups().num_groups();
}

// The draft model's CPU executor, with a KV pool of its own: as many blocks as the target's KV budget
// buys for the draft model, never more than the target has for all its layers (the draft never holds
// more tokens than the target does), or --draft-num-kv-blocks.
void make_draft_cpu_executor(const engine_flags& flags, engine_bundle& b) {
  const model_config& draft = b.draft_model->weights->config;
  cpu_executor_options o;
  o.num_threads = flags.threads;
  o.dequantize_weights = flags.dequantize_weights;
  o.kv_dtype = resolve(cpu_kv_dtype::automatic, flags.dequantize_weights);
  o.kv.block_size = flags.block_size;
  o.kv.num_device_blocks =
      flags.draft_num_kv_blocks > 0
          ? flags.draft_num_kv_blocks
          : std::min(target_position_blocks(*b.exec),
                     kv_blocks_for_bytes(draft, flags.block_size, static_cast<int64_t>(flags.kv_cache_memory_gib * gib),
                                         o.kv_dtype));
  o.kv.num_host_blocks = 0;
  if (o.kv.num_device_blocks < 1)
    throw invalid_request("--speculative draft: the draft model's KV pool holds no block: raise --kv-cache-memory");
  try {
    b.draft_exec = make_cpu_executor(b.draft_model->weights, o);
  } catch (const std::exception& e) { throw invalid_request(draft_flag(flags) + ": " + e.what()); }
}

#if TESSERA_WITH_CUDA
// --kv-cache-dtype for the CUDA executor: its cache is the compute dtype's or fp8 (vLLM's names:
// auto, fp8, fp8_e4m3); the CPU executor's other types would be silently something else here.
cuda_kv_dtype parse_cuda_kv_dtype(const std::string& name, cuda_dtype dtype) {
  const char* compute = dtype == cuda_dtype::f32 ? "fp32" : "bf16";
  if (name == "auto" || name.empty() || name == compute) return cuda_kv_dtype::automatic;
  if (name == "fp8" || name == "fp8_e4m3") {
    if (dtype != cuda_dtype::bf16) throw invalid_request("--kv-cache-dtype fp8 needs --dtype bfloat16");
    return cuda_kv_dtype::fp8_e4m3;
  }
  throw invalid_request("--kv-cache-dtype " + name + ": the CUDA executor's KV cache is auto (" + compute +
                        ", the --dtype) or fp8");
}
#endif

}  // namespace

std::string resolve_device(const std::string& requested) {
#if TESSERA_WITH_CUDA
  const bool built = true;
  const bool present = cuda_executor_available();
#else
  const bool built = false;
  const bool present = false;
#endif
  if (requested == "cpu") return "cpu";
  if (requested == "cuda") {
    if (!built) {
      throw invalid_request(
          "--device cuda: this tessera was built without the CUDA executor (configure with "
          "-DTESSERA_CUDA=on where nvcc is installed)");
    }
    if (!present) throw invalid_request("--device cuda: no CUDA device is visible (no GPU, or no driver)");
    return "cuda";
  }
  if (requested == "auto" || requested.empty()) return built && present ? "cuda" : "cpu";
  throw invalid_request("--device must be auto, cpu or cuda (got '" + requested + "')");
}

void engine_flags::add_to(CLI::App& cmd) {
  cmd.add_option("-m,--model", model,
                 "Model: a library name (tessera list, tessera pull NAME), a .gguf file or a Hugging Face directory "
                 "(default: smollm2-135m, SmolLM2-135M-Instruct.Q4_1.gguf, found as app/model_lookup.hpp says)");
  cmd.add_option("-t,--threads", threads, "Compute threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd.add_option("--block-size", block_size, "Tokens per KV block")->check(CLI::Range(1, 1024));
  cmd.add_option("--kv-cache-memory", kv_cache_memory_gib, "KV cache size in GiB")->check(CLI::Range(0.0, 4096.0));
  cmd.add_option("--num-kv-blocks", num_kv_blocks, "KV blocks in the pool (overrides --kv-cache-memory)")
      ->check(CLI::Range(0, 1 << 24));
  cmd.add_option("--swap-space", swap_space_gib, "Host swap pool in GiB (0: preempt by recompute only)")
      ->check(CLI::Range(0.0, 4096.0));
  // llama-server's names as aliases (-np is rewritten to --max-num-seqs before parsing: app/cli_conventions.hpp).
  cmd.add_option("--max-num-seqs,--parallel", max_num_seqs,
                 "Sequences per step at most (llama-server: -np, --parallel)")
      ->check(CLI::Range(1, 65536));
  cmd.add_option("--max-num-batched-tokens", max_num_batched_tokens,
                 "Tokens per step at most (chunked prefill; 2k: 2000)")
      ->transform(human_token_count())
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--target-itl-ms", target_itl_ms,
                 "Stall-free batching: in a step with decoding streams, prefill only what keeps the step (the gap "
                 "between two tokens of a stream) near this many milliseconds, by a cost model fitted from the "
                 "measured steps; 0: off (prefill fills --max-num-batched-tokens)")
      ->check(CLI::Range(0.0, 3.6e6));
  cmd.add_option("--long-prefill-token-threshold", long_prefill_token_threshold,
                 "Tokens of one prompt prefilled per step at most, so that several prompts share a step (0: no cap)")
      ->transform(human_token_count())
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_option("--max-model-len,-c,--ctx-size", max_model_len,
                 "Longest sequence, prompt and output (0: the model's context length; 4k: 4000, 4K: 4096; "
                 "llama-server: -c, --ctx-size)")
      ->transform(human_token_count())
      ->check(CLI::Range(0, 1 << 24));
  cmd.add_option("--chat-template-file,--chat-template", chat_template_file,
                 "Chat template to use instead of the model's: a Jinja file, or the template text itself (vLLM)");
  cmd.add_option("--preemption-mode", preemption_mode, "swap | recompute | auto")
      ->check(CLI::IsMember({"swap", "recompute", "auto"}));
  cmd.add_flag("--no-prefix-caching", no_prefix_caching, "Disable automatic prefix caching");
  cmd.add_flag("--dequantize-weights", dequantize_weights,
               "Dequantize every weight matrix at load. CPU: to f32, exact fp32 math (matches transformers), "
               "about 4x the weight memory and slower decode; CUDA: to bf16 instead of reading Q8_0/Q4_0/Q4_1/"
               "Q4_K/Q6_K blocks in the GEMMs");
  cmd.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "KV cache element type. CPU: auto (fp16) | fp32 | fp16 | bf16 | int8 (a scale per token and head); "
                 "CUDA: auto (the --dtype) | fp8 (E4M3, per-tensor scale; with --dtype bfloat16)")
      ->check(CLI::IsMember({"auto", "fp32", "fp16", "bf16", "int8", "fp8", "fp8_e4m3"}));
  cmd.add_option("--device", device, "auto | cpu | cuda (auto: CUDA when built with it and a GPU is visible)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd.add_option("--load-format", load_format,
                 "auto | dummy (random weights of the shape in --model's config.json, for benchmarks)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  cmd.add_option("--dummy-weight-type", dummy_weight_type,
                 "--load-format dummy: element type of the random matrices: bf16 | f16 | f32 | q8_0 | q4_0 | q4_k "
                 "(q4_0: a 7-8B shape in about 4.5 GB, for CPU smoke runs; q4_k: what the CUDA executor's "
                 "quantized GEMMs read, dims multiples of 256)")
      ->check(CLI::IsMember({"bf16", "f16", "f32", "q8_0", "q4_0", "q4_k"}));
  cmd.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                 "CUDA: share of GPU memory used (weights, activations, then the KV pool fills the rest)")
      ->check(CLI::Range(0.01, 1.0));
  cmd.add_option("--dtype", dtype, "CUDA compute type: bfloat16 | float32")
      ->check(CLI::IsMember({"bfloat16", "float32"}));
  cmd.add_flag("--cuda-graphs,!--enforce-eager", cuda_graphs,
               "CUDA: replay decode steps from graphs captured per batch-size bucket (the default; "
               "--enforce-eager launches every kernel, as vLLM's flag)")
      ->default_str("true");
  cmd.add_flag("--async-scheduling,!--no-async-scheduling", async_scheduling,
               "Overlapped steps: plan and queue step n+1 while the GPU runs step n, the sampled tokens "
               "staying on the GPU (the default with CUDA, as vLLM's --async-scheduling; no effect on the CPU "
               "or with speculative decoding)")
      ->default_str("true");
  cmd.add_flag("-q,--quiet", quiet, "No progress or statistics on stderr");
  cmd.add_option("--speculative", speculative,
                 "Speculative decoding: off | ngram (n-gram prompt lookup drafts) | draft (a small draft model, "
                 "--draft-model), verified losslessly")
      ->check(CLI::IsMember({"off", "ngram", "draft"}));
  // llama-server's names as aliases (-md is rewritten to --draft-model before parsing).
  cmd.add_option("--num-speculative-tokens,--draft-max", num_speculative_tokens,
                 "Draft tokens verified per sequence and step (llama-server: --draft-max)")
      ->check(CLI::Range(1, 64));
  cmd.add_option("--draft-model,--model-draft", draft_model,
                 "--speculative draft: the draft model, a .gguf file or a Hugging Face directory with the target's "
                 "vocabulary (llama-server: -md, --model-draft)");
  cmd.add_option("--draft-layers", draft_layers,
                 "--speculative draft without --draft-model: draft with the model's own first N layers and its "
                 "head (early exit, self-speculative decoding), for models without a smaller sibling")
      ->check(CLI::Range(0, 1 << 16));
  cmd.add_option("--draft-num-kv-blocks", draft_num_kv_blocks,
                 "--speculative draft: KV blocks of the draft model's own pool (0: as --kv-cache-memory allows, "
                 "at most the target's)")
      ->check(CLI::Range(0, 1 << 24));
  cmd.add_option("--draft-sampling", draft_sampling,
                 "--speculative draft, requests that sample: sample (drafts drawn from the draft model's "
                 "distribution, verified with min(1, p/q)) | argmax (greedy drafts: fewer accepted, but seeded "
                 "output is plain decoding's token for token)")
      ->check(CLI::IsMember({"sample", "argmax"}));
  cmd.add_option("--draft-branches", draft_branches,
                 "--speculative draft: tokens offered per position, verified together as a token tree: the draft "
                 "row's most likely ones for argmax drafts, draws from its distribution without replacement for "
                 "sampled ones (1: a chain)")
      ->check(CLI::Range(1, 64));
  cmd.add_option("--ngram-min", ngram_min, "N-gram prompt lookup: shortest suffix matched")->check(CLI::Range(1, 64));
  cmd.add_option("--ngram-max", ngram_max, "N-gram prompt lookup: longest suffix matched (>= --ngram-min)")
      ->check(CLI::Range(1, 64));
  cmd.add_option("--ngram-branches", ngram_branches,
                 "N-gram prompt lookup: distinct continuations verified together as a token tree (1: a chain)")
      ->check(CLI::Range(1, 64));
  cmd.add_option("--speculative-max-batch", speculative_max_batch,
                 "Steps with more decoding sequences than this do not speculate (decode is no longer memory-bound)")
      ->check(CLI::Range(1, 65536));
}

chat_template load_chat_template(const std::string& file_or_text) {
  std::string source = file_or_text;
  std::error_code ec;
  if (std::filesystem::is_regular_file(file_or_text, ec)) {
    // Through the loaders' reader (bounded, refuses what is not a regular file), as a model
    // directory's own chat_template.jinja is read.
    try {
      source = read_regular_file(file_or_text, hf_json::k_max_json_bytes);
    } catch (const load_error& e) {
      throw invalid_request("--chat-template-file " + file_or_text + ": cannot read it (" + e.what() + ")");
    }
  } else if (file_or_text.find("{%") == std::string::npos && file_or_text.find("{{") == std::string::npos) {
    throw invalid_request("--chat-template-file " + file_or_text + ": no such file (nor a Jinja template text)");
  }
  try {
    return chat_template::parse(std::move(source));
  } catch (const std::exception& e) { throw invalid_request("--chat-template-file " + file_or_text + ": " + e.what()); }
}

engine_options to_engine_options(const engine_flags& flags, std::shared_ptr<executor> draft_exec) {
  engine_options options;
  options.block_size = flags.block_size;
  options.max_num_seqs = flags.max_num_seqs;
  options.max_num_batched_tokens = flags.max_num_batched_tokens;
  options.target_step_seconds = flags.target_itl_ms / 1000.0;
  options.long_prefill_token_threshold = flags.long_prefill_token_threshold;
  options.max_model_len = flags.max_model_len;
  options.preemption = parse_preemption(flags.preemption_mode);
  options.enable_prefix_caching = !flags.no_prefix_caching;
  options.overlap_steps = flags.async_scheduling;
  const std::optional<speculative_mode> mode = parse_speculative_mode(flags.speculative);
  if (!mode) throw invalid_request("--speculative must be off, ngram or draft (got '" + flags.speculative + "')");
  options.speculative.mode = *mode;
  options.speculative.num_tokens = flags.num_speculative_tokens;
  options.speculative.ngram = {.min_n = flags.ngram_min, .max_n = flags.ngram_max, .branches = flags.ngram_branches};
  options.speculative.max_batch = flags.speculative_max_batch;
  options.speculative.draft_executor = std::move(draft_exec);
  options.speculative.draft.sample = flags.draft_sampling != "argmax";
  options.speculative.draft.branches = flags.draft_branches;
  try {
    options.speculative.validate();
  } catch (const invalid_request& e) { throw invalid_request(std::string("--speculative: ") + e.what()); }
  return options;
}

std::unique_ptr<actors::engine_facade> make_facade(engine_bundle& b, const engine_flags& flags, int32_t max_waiting) {
  actors::facade_components components;
  components.exec = std::move(b.exec);
  components.tok = b.model.tok;
  components.chat = b.chat;
  actors::facade_options options;
  options.engine = to_engine_options(flags, b.draft_exec);
  options.engine.constraints = b.constraints;
  options.max_waiting = max_waiting;
  return std::make_unique<actors::engine_facade>(std::move(components), options);
}

engine_bundle make_engine(const engine_flags& flags, bool direct_engine, const engine_messages& messages) {
  auto warn = [&](const std::string& text) {
    if (flags.quiet) return;
    if (messages.warn)
      messages.warn(text);
    else
      std::fprintf(stderr, "warning: %s\n", text.c_str());
  };
  const auto t0 = std::chrono::steady_clock::now();
  engine_bundle b;
  const std::string device = resolve_device(flags.device);  // before loading: fail fast
  const bool dummy = flags.load_format == "dummy";
  // MODEL: a path, a library name or nothing (the default model): app/model_lookup.hpp.
  const resolved_model model = resolve_model(flags.model);
  b.model_name = model.name;
  b.model = load_model(model.path, dummy ? load_format::dummy : load_format::automatic, dummy_options(flags));
  const bool tty = !flags.quiet && messages.progress && isatty(STDERR_FILENO);
  if (!dummy) fault_in_weights(*b.model.weights, tty);  // dummy weights are in memory already
  for (const auto& w : b.model.warnings) warn(w);

  const model_config& config = b.model.weights->config;
  cpu_executor_options exec_options;
  exec_options.num_threads = flags.threads;
  // On the GPU the CPU options only size nothing that is used: the flag is the CUDA executor's there.
  const std::optional<cpu_kv_dtype> kv_dtype =
      device == "cuda" ? std::optional{cpu_kv_dtype::automatic} : parse_cpu_kv_dtype(flags.kv_cache_dtype);
  if (!kv_dtype) {
    throw invalid_request("--kv-cache-dtype " + flags.kv_cache_dtype +
                          ": the CPU executor's KV cache is auto, fp32, fp16, bf16 or int8 (fp8 is the CUDA "
                          "executor's, --device cuda)");
  }
  // Resolved here (not in the executor) so that the pools below are sized for the dtype it will use.
  exec_options.kv_dtype = resolve(*kv_dtype, flags.dequantize_weights);
  exec_options.dequantize_weights = flags.dequantize_weights;
  // Blocks of one layer group each when the layers' windows differ (Gemma 2/3), so that the engine
  // frees the sliding layers' old blocks: engine/model/kv_layer_groups.hpp.
  exec_options.kv_layer_groups = true;
  const kv_layer_groups target_groups = group_kv_layers(config);
  const int32_t layers_per_block = target_groups.layers_per_block;
  exec_options.kv.block_size = flags.block_size;
  exec_options.kv.num_device_blocks =
      flags.num_kv_blocks > 0
          ? flags.num_kv_blocks
          : kv_blocks_for_bytes(config, flags.block_size, static_cast<int64_t>(flags.kv_cache_memory_gib * gib),
                                exec_options.kv_dtype, layers_per_block);
  exec_options.kv.num_host_blocks =
      kv_blocks_for_bytes(config, flags.block_size, static_cast<int64_t>(flags.swap_space_gib * gib),
                          exec_options.kv_dtype, layers_per_block);
  // Before the target's executor: on the GPU the target's pool is sized to leave room for the draft.
  if (flags.speculative == "draft") load_draft_weights(flags, dummy, b);
  if (device == "cuda") {
#if TESSERA_WITH_CUDA
    cuda_executor_options cuda;
    cuda.dtype = flags.dtype == "float32" ? cuda_dtype::f32 : cuda_dtype::bf16;
    cuda.kv_dtype = parse_cuda_kv_dtype(flags.kv_cache_dtype, cuda.dtype);
    cuda.quantized_weights = !flags.dequantize_weights;
    cuda.gpu_memory_utilization = flags.gpu_memory_utilization;
    cuda.max_num_batched_tokens = flags.max_num_batched_tokens;
    cuda.cuda_graphs = flags.cuda_graphs;
    cuda.kv_layer_groups = true;
    cuda.kv.block_size = flags.block_size;
    cuda.kv.num_device_blocks = flags.num_kv_blocks;  // 0: sized by --gpu-memory-utilization
    cuda.kv.num_host_blocks = static_cast<int32_t>(std::min<int64_t>(
        static_cast<int64_t>(flags.swap_space_gib * gib) /
            cuda_kv_block_bytes(config, flags.block_size, cuda.dtype, cuda.kv_dtype, layers_per_block),
        std::numeric_limits<int32_t>::max()));
    // A draft model runs on the GPU too, its pool sized with the target's: as many blocks (or
    // --draft-num-kv-blocks), the target's budget leaving room for its weights and blocks.
    cuda_executor_options draft_cuda = cuda;
    draft_cuda.kv_layer_groups = false;  // the draft's tables (draft_model_proposer) are one group's
    if (b.draft_model) {
      draft_cuda.kv.num_host_blocks = 0;  // a preempted sequence's draft state is dropped, not swapped
      draft_cuda.kv.num_device_blocks = flags.draft_num_kv_blocks;
      draft_cuda.max_num_batched_tokens = draft_model_options{}.max_batch_tokens;
      // One copy on the GPU of the matrices both read: all of a --draft-layers draft's, none of a
      // draft model file's (its tensors are its own).
      cuda.weight_cache = draft_cuda.weight_cache = make_cuda_weight_cache();
      cuda.co_resident = cuda_co_resident_for(*b.draft_model->weights, draft_cuda, b.model.weights.get());
      // The target's blocks hold one layer group each: the draft needs one block of its own per
      // block_size positions, i.e. per num_groups of the target's blocks.
      const int64_t groups = target_groups.num_groups();
      cuda.co_resident.kv_block_bytes = (cuda.co_resident.kv_block_bytes + groups - 1) / groups;
    }
    b.exec = make_cuda_executor(b.model.weights, cuda);
    if (b.draft_model) {
      if (draft_cuda.kv.num_device_blocks == 0) draft_cuda.kv.num_device_blocks = target_position_blocks(*b.exec);
      try {
        b.draft_exec = make_cuda_executor(b.draft_model->weights, draft_cuda);
      } catch (const std::exception& e) { throw invalid_request(draft_flag(flags) + ": " + e.what()); }
    }
#endif
  } else {
    if (exec_options.kv.num_device_blocks < 1)
      throw invalid_request("the KV cache holds no block: raise --kv-cache-memory");
    b.exec = make_cpu_executor(b.model.weights, exec_options);
    if (b.draft_model) make_draft_cpu_executor(flags, b);
  }
  if (b.draft_model && !flags.quiet) {
    const model_config& draft = b.draft_model->weights->config;
    const kv_cache_spec& kv = b.draft_exec->kv_spec();
    std::fprintf(stderr, "draft model %s%s: %d layers, hidden %d; %s executor; draft KV pool %d blocks x %d tokens\n",
                 b.draft_model->path.filename().c_str(), flags.draft_layers > 0 ? " (its first layers)" : "",
                 draft.num_layers, draft.hidden_size, b.draft_exec->name(), kv.num_device_blocks, kv.block_size);
  }

#if TESSERA_WITH_XGRAMMAR
  if (b.model.tok) b.constraints = structured::make_grammar_backend(*b.model.tok, config.vocab_size);
#endif
  if (direct_engine) {
    engine_options options = to_engine_options(flags, b.draft_exec);
    options.constraints = b.constraints;
    b.engine = std::make_unique<llm_engine>(*b.exec, b.model.tok, options);
  }

  std::string warning;
  if (flags.chat_template_file.empty()) {
    b.chat = chat_template::from_model_or_fallback(b.model.chat_template, &warning);
  } else {
    b.chat = load_chat_template(flags.chat_template_file);
  }
  if (!warning.empty()) warn(warning);

  if (!flags.quiet) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const kv_cache_spec& kv = b.exec->kv_spec();
    char line[512];
    std::snprintf(line, sizeof line,
                  "loaded %s%s: %d layers, hidden %d, vocab %d; %s executor; KV pool %d blocks x %d tokens (%s, %.0f "
                  "MiB), swap %d blocks; %.2f s",
                  b.model.path.filename().c_str(), dummy ? " (dummy weights)" : "", config.num_layers,
                  config.hidden_size, config.vocab_size, b.exec->name(), kv.num_device_blocks, kv.block_size,
                  *b.exec->kv_cache_dtype() ? b.exec->kv_cache_dtype() : "default",
                  double(b.exec->kv_block_bytes()) * kv.num_device_blocks / (1024.0 * 1024.0), kv.num_host_blocks,
                  secs);
    if (messages.info)
      messages.info(line);
    else
      std::fprintf(stderr, "%s\n", line);
  }
  return b;
}

std::string render_chat(const engine_bundle& b, const std::string& user, const std::string& system) {
  std::vector<chat_message> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", user});
  return render_messages(b, messages);
}

std::string render_messages(const engine_bundle& b, const std::vector<chat_message>& messages) {
  render_options options;
  const tokenizer& tok = *b.model.tok;
  if (auto bos = tok.bos()) options.bos_token = tok.token_text(*bos);
  if (auto eos = tok.eos()) options.eos_token = tok.token_text(*eos);
  return b.chat.render(messages, options);
}

std::vector<token_id> encode_messages(const engine_bundle& b, const std::vector<chat_message>& messages) {
  return encode_prompt(*b.model.tok, render_messages(b, messages), true);
}

std::vector<token_id> encode_prompt(const tokenizer& tok, const std::string& text, bool from_chat_template,
                                    bool parse_special) {
  encode_options options;
  options.parse_special = from_chat_template || parse_special;
  options.add_special = tok.add_bos();
  if (from_chat_template && tok.bos() && text.starts_with(tok.token_text(*tok.bos()))) options.add_special = false;
  return tok.encode(text, options);
}

}  // namespace tessera::app
