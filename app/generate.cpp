// `tessera generate`: one prompt streamed to stdout, or a JSONL file of requests run concurrently
// through the same engine (continuous batching) with one JSON result line per request.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "actors/engine_facade.hpp"
#include "app/commands.hpp"
#include "app/exit_codes.hpp"
#include "app/request_json.hpp"
#include "engine/base/error.hpp"

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
  cmd_->add_flag("--no-parse-special", no_parse_special_,
                 "Encode special-token text in the prompt (\"<|im_start|>\") as plain text, not as the special token");
  auto* input =
      cmd_->add_option("-i,--input", input_, "JSONL requests: {\"id\", \"prompt\" or \"messages\", params...}");
  cmd_->add_option("-o,--output", output_, "JSONL results (default: stdout)")->needs(input);
  prompt->excludes(input);
}

int generate_command::run() {
  if (!input_.empty()) return run_batch();
  if (prompt_.empty()) throw invalid_request("give --prompt TEXT or --input FILE");
  return run_single();
}

int generate_command::run_single() {
  // The same path as serving: the actor runtime's facade, one request, its stream printed as it comes.
  engine_bundle b = make_engine(engine_, /*direct_engine=*/false);
  const tokenizer& tok = *b.model.tok;
  const std::string text = chat_ ? render_chat(b, prompt_, system_) : prompt_;
  std::vector<token_id> prompt = encode_prompt(tok, text, chat_, !no_parse_special_);
  const int32_t num_prompt = static_cast<int32_t>(prompt.size());
  std::unique_ptr<actors::engine_facade> runtime = make_facade(b, engine_, /*max_waiting=*/1);

  actors::submit_result submitted =
      runtime->submit(actors::prompt_input::from_ids(std::move(prompt)), sampling_.to_params());
  if (!submitted) throw invalid_request(submitted.message);
  actors::stream_final final;
  while (auto item = submitted.stream.next()) {
    if (const auto* delta = std::get_if<actors::stream_delta>(&*item)) {
      std::fwrite(delta->output.text.data(), 1, delta->output.text.size(), stdout);
      std::fflush(stdout);
    } else {
      final = std::get<actors::stream_final>(*item);
    }
  }
  std::fputc('\n', stdout);
  // The text's last line is out before the statistics: with stdout and stderr on one pipe or file
  // (2>&1), a buffered newline would otherwise come after them ("...everything.prompt: 38 tokens").
  std::fflush(stdout);
  if (final.reason == finish_reason::error) throw std::runtime_error(final.error);
  if (!engine_.quiet) {
    const int32_t generated = final.num_generated_tokens;
    const double first_s = final.seconds_to_first_token;
    const double decode_s = final.seconds_total - first_s;
    std::fprintf(stderr, "prompt: %d tokens, %.1f tokens/s | decode: %d tokens, %.1f tokens/s | finish: %s\n",
                 num_prompt, first_s > 0 ? num_prompt / first_s : 0.0, generated,
                 generated > 1 && decode_s > 0 ? (generated - 1) / decode_s : 0.0,
                 std::string(to_string(final.reason)).c_str());
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

  engine_bundle b = make_engine(engine_, /*direct_engine=*/false);
  const tokenizer& tok = *b.model.tok;
  const sampling_params defaults = sampling_.to_params();

  // Parse and tokenize every line first, then submit them all: the scheduler decides what runs together.
  struct job {
    offline_result result;
    std::vector<token_id> prompt;
    sampling_params params;
    int32_t priority = 0;
    actors::stream_handle stream;
  };
  std::vector<job> jobs;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (is_blank_line(line)) continue;
    job j;
    j.result.id = std::to_string(line_number);
    try {
      offline_request req = parse_offline_request(line, line_number, defaults);
      j.result.id = req.id;
      j.prompt = req.messages ? encode_messages(b, *req.messages) : encode_prompt(tok, *req.prompt, false);
      j.result.prompt_tokens = static_cast<int64_t>(j.prompt.size());
      j.params = req.params;
      j.priority = req.priority;
    } catch (const std::exception& e) { j.result.error = e.what(); }
    jobs.push_back(std::move(j));
  }

  std::unique_ptr<actors::engine_facade> runtime =
      make_facade(b, engine_, static_cast<int32_t>(std::min<size_t>(jobs.size() + 1, INT32_MAX)));
  const auto start = clock_type::now();
  for (job& j : jobs) {
    if (!j.result.error.empty()) continue;
    actors::submit_result submitted =
        runtime->submit(actors::prompt_input::from_ids(std::move(j.prompt)), j.params, j.priority);
    if (!submitted) {
      j.result.error = submitted.message;
      continue;
    }
    j.stream = std::move(submitted.stream);
  }

  int64_t total_generated = 0;
  size_t num_rejected = 0;
  for (job& j : jobs) {
    if (j.stream.valid()) {
      std::vector<actors::stream_delta> deltas;
      const actors::stream_final final = j.stream.wait(&deltas);
      j.result.texts.resize(std::max<size_t>(1, static_cast<size_t>(j.params.n)));
      j.result.finish_reasons.resize(j.result.texts.size());
      for (const actors::stream_delta& d : deltas)
        j.result.texts.at(static_cast<size_t>(d.output.index)) += d.output.text;
      for (const actors::choice_result& c : final.choices) {
        j.result.finish_reasons.at(static_cast<size_t>(c.index)) = std::string(to_string(c.reason));
      }
      j.result.completion_tokens = final.num_generated_tokens;
      total_generated += final.num_generated_tokens;
      if (final.reason == finish_reason::error) j.result.error = final.error;
    }
    if (!j.result.error.empty()) ++num_rejected;
    out << format_offline_result(j.result) << '\n';
  }
  out.flush();
  if (!engine_.quiet) {
    const double secs = seconds_since(start);
    const actors::facade_stats s = runtime->stats();
    std::fprintf(
        stderr,
        "%zu requests (%zu failed) in %.2f s: %.1f generated tokens/s; preemptions: %llu swap, %llu recompute\n",
        jobs.size(), num_rejected, secs, secs > 0 ? total_generated / secs : 0.0,
        static_cast<unsigned long long>(s.engine.num_preemptions_swap),
        static_cast<unsigned long long>(s.engine.num_preemptions_recompute));
  }
  return num_rejected == 0 ? exit_ok : exit_rejected;
}

}  // namespace tessera::app
