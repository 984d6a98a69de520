// Offline throughput of the actor runtime (engine_facade: tokenizer actors, detached scheduler and
// executor actors, per-request streams, KV manager and event bus) against calling llm_engine
// directly, on the same workload and the same CPU executor settings. Runs alternate (direct, actors,
// direct, ...) so drift in machine load hits both; prints the median of each and the overhead.
//
//   bench_actor_overhead [--model PATH] [--requests N] [--tokens N] [--repeats N] [--threads N]
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
#include "engine/model_loader.hpp"

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
  int repeats = 3;
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
  for (const auto& p : prompts(m, a.requests)) streams.push_back(engine.submit(actors::prompt_input::from_ids(p), params(a)).stream);
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
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bench_args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model") a.model = argv[i + 1];
    else if (k == "--requests") a.requests = std::atoi(argv[i + 1]);
    else if (k == "--tokens") a.tokens = std::atoi(argv[i + 1]);
    else if (k == "--repeats") a.repeats = std::atoi(argv[i + 1]);
    else if (k == "--threads") a.threads = std::atoi(argv[i + 1]);
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
    run_direct(*direct_exec, m, eo, a);  // warm-up
    std::vector<double> direct, actor, direct_cpu, actor_cpu;
    for (int r = 0; r < a.repeats; ++r) {
      const run_result dr = run_direct(*direct_exec, m, eo, a);
      const run_result ar = run_actors(facade, m, a);
      direct.push_back(dr.tokens_per_second);
      actor.push_back(ar.tokens_per_second);
      direct_cpu.push_back(dr.tokens_per_cpu_second);
      actor_cpu.push_back(ar.tokens_per_cpu_second);
      std::fprintf(stderr, "repeat %d: direct %.1f tok/s (%.1f tok/cpu-s), actors %.1f tok/s (%.1f tok/cpu-s)\n", r,
                   dr.tokens_per_second, dr.tokens_per_cpu_second, ar.tokens_per_second, ar.tokens_per_cpu_second);
    }
    const double d = median(direct), x = median(actor), dc = median(direct_cpu), xc = median(actor_cpu);
    std::printf("workload: %d requests x %d tokens (greedy), %d repeats\n", a.requests, a.tokens, a.repeats);
    std::printf("direct llm_engine: %.1f tok/s, %.1f tok/cpu-s (medians)\n", d, dc);
    std::printf("actor runtime:     %.1f tok/s, %.1f tok/cpu-s (medians)\n", x, xc);
    std::printf("overhead: %.2f%% wall throughput, %.2f%% CPU per token\n", 100.0 * (d - x) / d, 100.0 * (dc - xc) / dc);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
