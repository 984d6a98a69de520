// `tessera generate`: one prompt streamed to stdout, or a JSONL file of requests run concurrently
// through the same engine (continuous batching) with one JSON result line per request.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <unordered_map>

#include "app/commands.hpp"
#include "app/request_json.hpp"
#include "engine/error.hpp"

namespace tessera::app {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

}  // namespace

void sampling_flags::add_to(CLI::App& cmd) {
  cmd.add_option("-n,--max-tokens", max_tokens, "Tokens to generate at most")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--temperature", temperature, "Sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
  cmd.add_option("--top-p", top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--top-k", top_k, "Sample among the k most likely tokens (-1: all)");
  cmd.add_option("--min-p", min_p, "Drop tokens below min-p times the top probability")->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--repetition-penalty", repetition_penalty, "CTRL-style repetition penalty (1: off)");
  cmd.add_option("--seed", seed, "Random seed (same seed, same output)");
  cmd.add_flag("--ignore-eos", ignore_eos, "Keep generating past the end-of-sequence token");
}

sampling_params sampling_flags::to_params() const {
  sampling_params p;
  p.max_tokens = max_tokens;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.min_p = min_p;
  p.repetition_penalty = repetition_penalty;
  p.seed = seed;
  p.ignore_eos = ignore_eos;
  return p;
}

void generate_command::add_to(CLI::App& app) {
  cmd_ = app.add_subcommand("generate", "Generate text for a prompt, or for every request of a JSONL file");
  engine_.add_to(*cmd_);
  sampling_.add_to(*cmd_);
  auto* prompt = cmd_->add_option("-p,--prompt", prompt_, "Prompt text");
  cmd_->add_flag("--chat", chat_, "Wrap the prompt as a user message with the model's chat template");
  cmd_->add_option("--system", system_, "System message (with --chat)");
  auto* input = cmd_->add_option("-i,--input", input_, "JSONL requests: {\"id\", \"prompt\" or \"messages\", params...}");
  cmd_->add_option("-o,--output", output_, "JSONL results (default: stdout)")->needs(input);
  prompt->excludes(input);
}

int generate_command::run() {
  if (!input_.empty()) return run_batch();
  if (prompt_.empty()) throw invalid_request("give --prompt TEXT or --input FILE");
  return run_single();
}

int generate_command::run_single() {
  engine_bundle b = make_engine(engine_);
  const tokenizer& tok = *b.model.tok;
  const std::string text = chat_ ? render_chat(b, prompt_, system_) : prompt_;
  std::vector<token_id> prompt = encode_prompt(tok, text, chat_);
  const int32_t num_prompt = static_cast<int32_t>(prompt.size());

  const auto start = clock_type::now();
  b.engine->add_request(std::move(prompt), sampling_.to_params());
  double first_token_s = 0;
  int32_t generated = 0;
  finish_reason reason = finish_reason::none;
  std::string error;
  while (b.engine->has_unfinished()) {
    for (const request_output& out : b.engine->step()) {
      if (generated == 0 && !out.token_ids.empty()) first_token_s = seconds_since(start);
      generated = out.num_generated_tokens;
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
      if (out.finished) {
        reason = out.reason;
        error = out.error;
      }
    }
  }
  std::fputc('\n', stdout);
  const double total_s = seconds_since(start);
  if (!error.empty()) throw std::runtime_error(error);
  if (!engine_.quiet) {
    const double decode_s = total_s - first_token_s;
    std::fprintf(stderr, "prompt: %d tokens, %.1f tokens/s | decode: %d tokens, %.1f tokens/s | finish: %s\n",
                 num_prompt, first_token_s > 0 ? num_prompt / first_token_s : 0.0, generated,
                 generated > 1 && decode_s > 0 ? (generated - 1) / decode_s : 0.0, std::string(to_string(reason)).c_str());
  }
  return 0;
}

int generate_command::run_batch() {
  std::ifstream in(input_);
  if (!in) throw invalid_request("cannot open --input " + input_);
  std::ofstream out_file;
  if (!output_.empty()) {
    out_file.open(output_);
    if (!out_file) throw invalid_request("cannot write --output " + output_);
  }
  std::ostream& out = output_.empty() ? std::cout : out_file;

  engine_bundle b = make_engine(engine_);
  const tokenizer& tok = *b.model.tok;
  sampling_params defaults = sampling_.to_params();

  // Parse and submit everything first: the scheduler decides what runs together.
  std::unordered_map<request_id, offline_result> results;
  std::vector<offline_result> rejected;
  std::vector<request_id> order;  // output order = input order
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    offline_result result;
    result.id = std::to_string(line_number);
    try {
      offline_request req = parse_offline_request(line, line_number, defaults);
      result.id = req.id;
      std::vector<token_id> prompt;
      if (req.messages) {
        prompt = encode_prompt(tok, render_messages(b, *req.messages), true);
      } else {
        prompt = encode_prompt(tok, *req.prompt, false);
      }
      result.prompt_tokens = static_cast<int64_t>(prompt.size());
      result.texts.resize(req.params.n);
      result.finish_reasons.resize(req.params.n);
      const request_id id = b.engine->add_request(std::move(prompt), req.params, req.priority);
      order.push_back(id);
      results.emplace(id, std::move(result));
    } catch (const std::exception& e) {
      result.error = e.what();
      order.push_back(0);
      rejected.push_back(std::move(result));
    }
  }

  const auto start = clock_type::now();
  int64_t total_generated = 0;
  while (b.engine->has_unfinished()) {
    for (const request_output& o : b.engine->step()) {
      offline_result& r = results.at(o.id);
      r.texts[o.index] += o.text;
      if (o.finished) {
        r.finish_reasons[o.index] = std::string(to_string(o.reason));
        r.completion_tokens += o.num_generated_tokens;
        total_generated += o.num_generated_tokens;
        if (!o.error.empty()) r.error = o.error;
      }
    }
  }
  size_t next_rejected = 0;
  for (request_id id : order) {
    out << format_offline_result(id == 0 ? rejected[next_rejected++] : results.at(id)) << '\n';
  }
  out.flush();
  if (!engine_.quiet) {
    const double secs = seconds_since(start);
    const engine_stats s = b.engine->stats();
    std::fprintf(stderr, "%zu requests (%zu rejected) in %.2f s: %.1f generated tokens/s; preemptions: %llu swap, %llu recompute\n",
                 order.size(), rejected.size(), secs, secs > 0 ? total_generated / secs : 0.0,
                 static_cast<unsigned long long>(s.num_preemptions_swap),
                 static_cast<unsigned long long>(s.num_preemptions_recompute));
  }
  return rejected.empty() ? 0 : 3;
}

}  // namespace tessera::app
