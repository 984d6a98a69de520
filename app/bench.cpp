// `tessera bench latency|throughput`: measurements printed as one JSON line, so that
// bench/compare_*.py can run them side by side with peers (see docs/benchmarks.md).
// `tessera bench serve`: the serving benchmark client bench/serve_client.py (Python, so that it
// can be run against any OpenAI-compatible server without building Tessera), exec'd with the
// arguments that follow `serve`.
#include <unistd.h>

#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "app/commands.hpp"
#include "app/request_json.hpp"
#include "engine/base/error.hpp"

namespace tessera::app {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A prompt of exactly `n` tokens: ordinary English text, tokenized and repeated as needed, with a
// per-repeat marker so repeats do not share a prefix.
std::vector<token_id> synthetic_prompt(const tokenizer& tok, int32_t n, int repeat) {
  const std::string text =
      "Repeat " + std::to_string(repeat) +
      ". The history of paged memory begins with virtual memory systems in the 1960s, where programs saw a "
      "contiguous address space while the operating system placed fixed-size pages wherever physical memory "
      "was free. Serving engines for language models apply the same idea to the attention key-value cache. ";
  std::vector<token_id> unit = tok.encode(text);
  std::vector<token_id> out;
  while (static_cast<int32_t>(out.size()) < n) out.insert(out.end(), unit.begin(), unit.end());
  out.resize(n);
  return out;
}

void print_json(const boost::json::object& o) { std::cout << boost::json::serialize(o) << std::endl; }

}  // namespace

void bench_command::add_to(CLI::App& app) {
  cmd_ = app.add_subcommand("bench", "Measure the engine (JSON on stdout)");
  cmd_->require_subcommand(1);
  latency_ = cmd_->add_subcommand("latency", "Prompt tokens/s and decode tokens/s of one stream, or of --batch-size");
  engine_.add_to(*latency_);
  latency_->add_option("--prompt-tokens", prompt_tokens_, "Prompt length")->check(CLI::Range(1, 1 << 20));
  latency_->add_option("--gen-tokens", gen_tokens_, "Tokens to generate")->check(CLI::Range(2, 1 << 20));
  latency_->add_option("--repeats", repeats_, "Runs (the best is reported, all are listed)")
      ->check(CLI::Range(1, 1000));
  latency_
      ->add_option("--batch-size", batch_sizes_,
                   "Sequences prefilled and decoded together (decode steps of this many rows; decode_tps is "
                   "theirs together, step_ms one step's time); several sizes: one JSON line each, one model load")
      ->check(CLI::Range(1, 4096));

  throughput_ = cmd_->add_subcommand("throughput", "Offline workload: all requests submitted at once");
  engine_.add_to(*throughput_);
  auto* workload =
      throughput_->add_option("--workload", workload_, "JSONL requests {\"id\",\"prompt\",\"max_tokens\"}");
  throughput_->add_option("--num-requests", num_requests_, "Use the first K requests (0: all)")
      ->check(CLI::Range(0, 1 << 24));
  // Fixed lengths instead of a workload: the runs published engines report (vLLM's benchmark_throughput,
  // TensorRT-LLM's tables: 128/128, 1000/1000, 128/2048 ...).
  auto* input_len = throughput_->add_option("--input-len", input_len_, "Without --workload: tokens per prompt")
                        ->check(CLI::Range(1, 1 << 20))
                        ->excludes(workload);
  throughput_->add_option("--output-len", output_len_, "Without --workload: tokens generated per prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(input_len);
  input_len->needs(throughput_->get_option("--output-len"));
  throughput_->add_option("--num-prompts", num_prompts_, "Without --workload: prompts (default 1000)")
      ->check(CLI::Range(1, 1 << 24))
      ->needs(input_len);

  serve_ = cmd_->add_subcommand(
      "serve", "Serving benchmark against an OpenAI-compatible server (bench/serve_client.py; --help for its flags)");
  serve_->prefix_command();  // every argument goes to the client, --help included
  serve_->set_help_flag();
}

int bench_command::run() {
  if (serve_->parsed()) return run_serve();
  return latency_->parsed() ? run_latency() : run_throughput();
}

// Paths compiled in by app/CMakeLists.txt; the fallbacks serve builds configured without them.
#ifndef TESSERA_PYTHON3
#define TESSERA_PYTHON3 ""
#endif
#ifndef TESSERA_BENCH_DIR
#define TESSERA_BENCH_DIR "bench"
#endif

int bench_command::run_serve() {
  const std::string python = std::strlen(TESSERA_PYTHON3) ? TESSERA_PYTHON3 : "python3";
  const std::string script = std::string(TESSERA_BENCH_DIR) + "/serve_client.py";
  if (!std::filesystem::exists(script)) throw invalid_request("the serving client is not at " + script);
  std::vector<std::string> args{python, script};
  for (const std::string& a : serve_->remaining()) args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  ::execvp(argv[0], argv.data());
  // execvp returns only on failure (e.g. no such interpreter).
  throw std::runtime_error("cannot run " + python + ": " + std::strerror(errno));
}

int bench_command::run_latency() {
  engine_.no_prefix_caching = true;  // every repeat must really prefill
  engine_bundle b = make_engine(engine_);
  for (const int batch_size : batch_sizes_) run_latency_batch(b, batch_size);
  return 0;
}

void bench_command::run_latency_batch(engine_bundle& b, int batch_size) {
  sampling_params params;
  params.temperature = 0;
  params.ignore_eos = true;
  params.max_tokens = gen_tokens_;
  boost::json::array runs;
  double best_prompt = 0, best_decode = 0, best_step_ms = 0;
  for (int r = 0; r < repeats_; ++r) {
    // The batch's prompts all start at once; the decode phase is timed from the step that gives the
    // last of them its first token, so that every step timed decodes batch_size rows.
    const auto start = clock_type::now();
    for (int i = 0; i < batch_size; ++i) {
      b.engine->add_request(synthetic_prompt(*b.model.tok, prompt_tokens_, r * batch_size + i), params);
    }
    std::map<request_id, int32_t> generated;
    clock_type::time_point all_started{}, last{};
    int64_t decoded = 0;  // tokens after every sequence had its first
    int64_t decode_steps = 0;
    while (b.engine->has_unfinished()) {
      const bool decoding = static_cast<int>(generated.size()) == batch_size;
      int64_t step_tokens = 0;
      for (const request_output& o : b.engine->step()) {
        if (!o.error.empty()) throw std::runtime_error(o.error);
        if (o.token_ids.empty()) continue;
        int32_t& n = generated[o.id];
        step_tokens += o.num_generated_tokens - n;
        n = o.num_generated_tokens;
      }
      if (step_tokens == 0) continue;
      last = clock_type::now();
      if (decoding) {
        decoded += step_tokens;
        ++decode_steps;
      } else if (static_cast<int>(generated.size()) == batch_size) {
        all_started = last;
      }
    }
    const double prompt_tps = double(prompt_tokens_) * batch_size / seconds_between(start, all_started);
    const double decode_s = seconds_between(all_started, last);
    const double decode_tps = decoded / decode_s;
    const double step_ms = decode_steps > 0 ? 1e3 * decode_s / decode_steps : 0.0;
    if (decode_tps > best_decode) best_step_ms = step_ms;
    best_prompt = std::max(best_prompt, prompt_tps);
    best_decode = std::max(best_decode, decode_tps);
    runs.push_back(boost::json::object{{"prompt_tps", prompt_tps}, {"decode_tps", decode_tps}, {"step_ms", step_ms}});
  }
  print_json({{"engine", "tessera"},
              {"prompt_tokens", prompt_tokens_},
              {"gen_tokens", gen_tokens_},
              {"batch_size", batch_size},
              {"threads", engine_.threads},
              {"kv_cache_dtype", b.exec->kv_cache_dtype()},
              {"prompt_tps", best_prompt},
              {"decode_tps", best_decode},
              {"step_ms", best_step_ms},
              {"runs", runs}});
}

int bench_command::run_throughput() {
  // Offline, no stream waits between two tokens: stall-free batching (which trades throughput for
  // inter-token latency) is off unless --target-itl-ms (or its variable) asks for it.
  if (throughput_->count("--target-itl-ms") == 0) engine_.target_itl_ms = 0;
  engine_bundle b = make_engine(engine_);
  sampling_params defaults;
  defaults.temperature = 0;
  defaults.ignore_eos = true;

  // Tokenize before the clock starts: the measurement is the engine's, as in vLLM's offline benchmark.
  struct prepared {
    std::vector<token_id> prompt;
    sampling_params params;
  };
  std::vector<prepared> requests;
  if (workload_.empty()) {
    if (input_len_ == 0) throw invalid_request("bench throughput needs --workload or --input-len/--output-len");
    sampling_params fixed = defaults;
    fixed.max_tokens = output_len_;
    for (int i = 0; i < num_prompts_; ++i) requests.push_back({synthetic_prompt(*b.model.tok, input_len_, i), fixed});
  } else {
    std::ifstream in(workload_);
    if (!in) throw invalid_request("cannot open --workload " + workload_);
    std::string line;
    int64_t line_number = 0;
    while (std::getline(in, line) && (num_requests_ == 0 || static_cast<int>(requests.size()) < num_requests_)) {
      ++line_number;
      if (is_blank_line(line)) continue;
      offline_request req = parse_offline_request(line, line_number, defaults);
      std::vector<token_id> prompt =
          req.messages ? encode_messages(b, *req.messages) : encode_prompt(*b.model.tok, *req.prompt, false);
      requests.push_back({std::move(prompt), req.params});
    }
    if (requests.empty()) throw invalid_request("the workload has no requests");
  }

  int64_t prompt_tokens = 0, output_tokens = 0;
  double waste_sum = 0;
  int64_t waste_samples = 0;
  const auto start = clock_type::now();
  for (auto& r : requests) {
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    b.engine->add_request(std::move(r.prompt), r.params);
  }
  while (b.engine->has_unfinished()) {
    for (const request_output& o : b.engine->step()) {
      if (!o.error.empty()) throw std::runtime_error(o.error);
      if (o.finished) output_tokens += o.num_generated_tokens;
    }
    waste_sum += b.engine->stats().kv_waste;
    ++waste_samples;
  }
  const double secs = seconds_between(start, clock_type::now());
  const engine_stats s = b.engine->stats();
  print_json({{"engine", "tessera"},
              {"requests", requests.size()},
              {"input_len", input_len_},
              {"output_len", output_len_},
              {"kv_cache_dtype", b.exec->kv_cache_dtype()},
              {"threads", engine_.threads},
              {"elapsed_s", secs},
              {"requests_per_s", requests.size() / secs},
              {"output_tps", output_tokens / secs},
              {"total_tps", (prompt_tokens + output_tokens) / secs},
              {"prompt_tokens", prompt_tokens},
              {"output_tokens", output_tokens},
              {"kv_waste", waste_samples ? waste_sum / waste_samples : 0.0},
              {"preemptions_swap", s.num_preemptions_swap},
              {"preemptions_recompute", s.num_preemptions_recompute},
              {"preemptions", s.num_preemptions_swap + s.num_preemptions_recompute},
              {"prefix_cached_tokens", s.num_cached_prompt_tokens},
              {"speculative", engine_.speculative},
              {"spec_verifications", s.num_spec_verifications},
              {"spec_draft_tokens", s.num_draft_tokens},
              {"spec_accepted_tokens", s.num_accepted_draft_tokens},
              {"spec_tree_branch_tokens", s.num_tree_branch_tokens},
              {"steps", s.num_steps},
              // Steps planned and queued while the previous one ran (docs/engine.md#overlapped-steps).
              {"overlapped_steps", s.num_overlapped_steps},
              // A device executor's steps from first to last queued work, against the wall clock: the
              // share left is host time between steps (planning, bookkeeping) with the device idle.
              {"device_step_s", b.exec->device_step_seconds()},
              {"device_step_share", b.exec->device_step_seconds() / secs}});
  return 0;
}

}  // namespace tessera::app
