// Offline throughput of the actor runtime (engine_facade: tokenizer actors, detached scheduler and
// executor actors, per-request streams, KV manager and event bus) against calling llm_engine
// directly, on the same workload (same prompts, greedy, same CPU executor settings).
//
// The figure is WALL-clock throughput (generated tokens / elapsed seconds from the first submit to
// the last token). Runs are interleaved A B B A A B ... (each pair alternates which path goes first),
// so slow drift in machine load hits both paths equally; the overhead reported is the median over
// pairs of (direct - actors) / direct, next to the medians of each path and the best run of each (the
// least disturbed by other processes). Tokens per process-CPU-second are printed too: on a shared
// machine that figure moves far less than wall time.
//
//   bench_actor_overhead [--model PATH] [--requests N] [--tokens N] [--pairs N] [--threads N]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"
#include "cpu/cpu_executor.hpp"
#include "engine/model/model_loader.hpp"

namespace {

using namespace tessera;
using clock_type = std::chrono::steady_clock;

// Process CPU seconds (all threads): unlike wall time, barely affected by other processes on a busy
// machine, and it charges the runtime's extra threads to the actor runs.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct run_result {
  double tokens_per_second = 0;      // wall clock
  double tokens_per_cpu_second = 0;  // process CPU time
};

struct bench_args {
  std::string model;
  int requests = 32;
  int tokens = 32;
  int pairs = 6;
  int threads = 0;
};

std::unique_ptr<executor> make_exec(const loaded_model& m, const bench_args& a) {
  cpu_executor_options o;
  o.num_threads = a.threads;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = std::max(64, a.requests * ((a.tokens + 32) / 16 + 2));
  return make_cpu_executor(m.weights, o);
}

std::vector<std::vector<token_id>> prompts(const loaded_model& m, int n) {
  const char* texts[] = {"The capital of France is", "def fibonacci(n):", "Once upon a time", "Water boils at"};
  std::vector<std::vector<token_id>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<token_id> ids = m.tok->encode(texts[i % 4]);
    ids.push_back(static_cast<token_id>(100 + i));  // distinct prompts: no prefix-cache shortcut across runs
    out.push_back(std::move(ids));
  }
  return out;
}

sampling_params params(const bench_args& a) {
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = a.tokens;
  p.ignore_eos = true;
  return p;
}

run_result run_direct(executor& exec, const loaded_model& m, const engine_options& eo, const bench_args& a) {
  llm_engine engine(exec, m.tok, eo);
  const double c0 = cpu_seconds();
  const auto t0 = clock_type::now();
  for (const auto& p : prompts(m, a.requests)) engine.add_request(p, params(a));
  int64_t tokens = 0;
  while (engine.has_unfinished())
    for (const auto& o : engine.step()) tokens += static_cast<int64_t>(o.token_ids.size());
  return {static_cast<double>(tokens) / std::chrono::duration<double>(clock_type::now() - t0).count(),
          static_cast<double>(tokens) / (cpu_seconds() - c0)};
}

run_result run_actors(actors::engine_facade& engine, const loaded_model& m, const bench_args& a) {
  const double c0 = cpu_seconds();
  const auto t0 = clock_type::now();
  std::vector<actors::stream_handle> streams;
  for (const auto& p : prompts(m, a.requests))
    streams.push_back(engine.submit(actors::prompt_input::from_ids(p), params(a)).stream);
  int64_t tokens = 0;
  for (auto& s : streams) {
    std::vector<actors::stream_delta> deltas;
    s.wait(&deltas);
    for (const auto& d : deltas) tokens += static_cast<int64_t>(d.output.token_ids.size());
  }
  return {static_cast<double>(tokens) / std::chrono::duration<double>(clock_type::now() - t0).count(),
          static_cast<double>(tokens) / (cpu_seconds() - c0)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

int main(int argc, char** argv) {
  bench_args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model")
      a.model = argv[i + 1];
    else if (k == "--requests")
      a.requests = std::atoi(argv[i + 1]);
    else if (k == "--tokens")
      a.tokens = std::atoi(argv[i + 1]);
    else if (k == "--pairs" || k == "--repeats")
      a.pairs = std::max(1, std::atoi(argv[i + 1]));
    else if (k == "--threads")
      a.threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    const loaded_model m = load_model(a.model.empty() ? default_model_path() : std::filesystem::path(a.model));
    engine_options eo;
    eo.block_size = 16;
    eo.max_num_seqs = std::max(1, a.requests);
    eo.enable_prefix_caching = false;
    auto direct_exec = make_exec(m, a);
    actors::facade_options fo;
    fo.engine = eo;
    fo.warm_up = true;
    actors::facade_components c;
    c.exec = make_exec(m, a);
    c.tok = m.tok;
    actors::engine_facade facade(std::move(c), fo);
    run_direct(*direct_exec, m, eo, a);  // warm-up (the facade warmed up in its constructor)
    run_actors(facade, m, a);
    std::vector<double> direct, actor, direct_cpu, actor_cpu, overhead;
    for (int r = 0; r < a.pairs; ++r) {
      run_result dr, ar;
      if (r % 2 == 0) {
        dr = run_direct(*direct_exec, m, eo, a);
        ar = run_actors(facade, m, a);
      } else {
        ar = run_actors(facade, m, a);
        dr = run_direct(*direct_exec, m, eo, a);
      }
      direct.push_back(dr.tokens_per_second);
      actor.push_back(ar.tokens_per_second);
      direct_cpu.push_back(dr.tokens_per_cpu_second);
      actor_cpu.push_back(ar.tokens_per_cpu_second);
      overhead.push_back(100.0 * (dr.tokens_per_second - ar.tokens_per_second) / dr.tokens_per_second);
      std::fprintf(stderr,
                   "pair %d (%s first): direct %.1f tok/s (%.1f tok/cpu-s), actors %.1f tok/s (%.1f tok/cpu-s), "
                   "overhead %+.2f%%\n",
                   r, r % 2 == 0 ? "direct" : "actors", dr.tokens_per_second, dr.tokens_per_cpu_second,
                   ar.tokens_per_second, ar.tokens_per_cpu_second, overhead.back());
    }
    const double d = median(direct), x = median(actor), dc = median(direct_cpu), xc = median(actor_cpu);
    std::vector<double> sorted = overhead;
    std::sort(sorted.begin(), sorted.end());
    std::printf("workload: %d requests x %d tokens (greedy), %d interleaved pairs, %d executor threads (0: default)\n",
                a.requests, a.tokens, a.pairs, a.threads);
    std::printf("direct llm_engine: %.1f tok/s wall, %.1f tok/cpu-s (medians)\n", d, dc);
    std::printf("actor runtime:     %.1f tok/s wall, %.1f tok/cpu-s (medians)\n", x, xc);
    std::printf("overhead (wall throughput, median of pairs): %.2f%% (pairs range %.2f%% .. %.2f%%)\n",
                median(overhead), sorted.front(), sorted.back());
    // The fastest run of each path is the one other processes disturbed least.
    const double db = *std::max_element(direct.begin(), direct.end()),
                 xb = *std::max_element(actor.begin(), actor.end());
    std::printf("overhead (wall throughput, best run of each path: %.1f vs %.1f tok/s): %.2f%%\n", db, xb,
                100.0 * (db - xb) / db);
    std::printf("overhead (CPU per token, medians): %.2f%%\n", 100.0 * (dc - xc) / dc);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
