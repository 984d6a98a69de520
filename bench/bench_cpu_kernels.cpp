// CPU executor timings on a GGUF model: prefill of one prompt, single-sequence decode, and batched
// decode. Usage:
//   bench_cpu_kernels [model.gguf] [--threads N] [--prompt N] [--decode N] [--batch N] [--kernels NAME]
//   bench_cpu_kernels --matmul-only    (GMAC/s of each kernel table on a 1536x576 Q4_1 matmul)
// Token ids are synthetic (the timing of a LLaMA forward does not depend on which ids they are).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <cstdint>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "cpu/kernels.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/model_weights.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds used by the whole process (all threads): on a shared machine, wall time measures
// the neighbours as much as us; with one thread, CPU time is the compute cost.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One weight matrix the size of this model's FFN (random Q4_1 blocks) against 1, 8 and 64 tokens.
void bench_matmul() {
  using namespace tessera;
  using namespace tessera::cpu;
  const int64_t rows = 1536, cols = 576;
  const int64_t stride = row_bytes(ggml_type::q4_1, cols);
  std::vector<std::byte> w(static_cast<size_t>(rows * stride));
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  for (auto& b : w) b = static_cast<std::byte>(next() >> 24);
  for (int64_t i = 0; i < rows * cols / 32; ++i) {  // sane scales: d = m = 2^-7
    const uint16_t h = 0x2000;
    std::memcpy(&w[static_cast<size_t>(i * 20)], &h, 2);
    std::memcpy(&w[static_cast<size_t>(i * 20 + 2)], &h, 2);
  }
  for (int32_t tokens : {1, 8, 64}) {
    std::vector<float> x(static_cast<size_t>(tokens * cols));
    for (auto& v : x) v = static_cast<float>(next() >> 8) / 8388608.0f - 1.0f;
    std::vector<act_block> act(static_cast<size_t>(tokens * cols / 32));
    std::vector<float> out(static_cast<size_t>(tokens * rows));
    for (const kernel_table* k : available_kernels()) {
      k->quantize_act(x.data(), act.data(), tokens * cols);
      qmatmul_args a;
      a.type = ggml_type::q4_1;
      a.weights = w.data();
      a.weight_stride = stride;
      a.num_blocks = cols / 32;
      a.act = act.data();
      a.act_stride = cols / 32;
      a.num_tokens = tokens;
      a.row_end = rows;
      a.out = out.data();
      a.out_stride = rows;
      const int reps = tokens == 1 ? 400 : tokens == 8 ? 100 : 20;
      const double c0 = thread_cpu_seconds();
      for (int i = 0; i < reps; ++i) k->matmul_q(a);
      const double c = thread_cpu_seconds() - c0;
      std::printf("%-11s %2d tokens: %6.1f GMAC/s (thread cpu time)\n", k->name, tokens,
                  reps * static_cast<double>(rows * cols) * tokens / c / 1e9);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  std::string path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2, prompt = 512, decode = 64, batch = 8;
  const char* kernels = "";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--prompt") prompt = std::atoi(next());
    else if (a == "--decode") decode = std::atoi(next());
    else if (a == "--batch") batch = std::atoi(next());
    else if (a == "--kernels") kernels = next();
    else if (a == "--matmul-only") {
      bench_matmul();
      return 0;
    }
    else path = a;
  }
  try {
    const auto weights = load_gguf_weights(gguf_file::open(path));
    const model_config& c = weights->config;
    cpu_executor_options o;
    o.num_threads = threads;
    o.kernels = kernels;
    o.kv.block_size = 16;
    const int32_t per_seq_blocks = (prompt + decode + 15) / 16 + 1;
    o.kv.num_device_blocks = per_seq_blocks * (batch + 1);
    auto ex = make_cpu_executor(weights, o);
    std::printf("model %s: %d layers, hidden %d, vocab %d; threads %d, kernels %s\n", c.name.c_str(), c.num_layers,
                c.hidden_size, c.vocab_size, threads, *kernels ? kernels : cpu::best_kernels().name);

    auto table_for = [&](int s) {
      std::vector<block_id> t(static_cast<size_t>(per_seq_blocks));
      for (int32_t i = 0; i < per_seq_blocks; ++i) t[static_cast<size_t>(i)] = s * per_seq_blocks + i;
      return t;
    };
    std::vector<token_id> tokens(static_cast<size_t>(prompt));
    for (int i = 0; i < prompt; ++i) tokens[static_cast<size_t>(i)] = (i * 7919 + 13) % c.vocab_size;

    // Prefill.
    step_batch b;
    b.seqs.push_back({});
    b.seqs[0].tokens = tokens;
    b.seqs[0].block_table = table_for(0);
    step_output out;
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_seconds();
    ex->execute(b, out);
    const double pre = seconds_since(t0);
    std::printf("prefill %d tokens: %.3f s = %.1f tok/s (cpu %.3f s)\n", prompt, pre, prompt / pre, cpu_seconds() - c0);

    // Single-sequence decode (greedy on the real logits).
    t0 = std::chrono::steady_clock::now();
    c0 = cpu_seconds();
    for (int i = 0; i < decode; ++i) {
      const auto row = out.row(0);
      token_id best = 0;
      for (int32_t v = 1; v < c.vocab_size; ++v) best = row[static_cast<size_t>(v)] > row[static_cast<size_t>(best)] ? v : best;
      b.seqs[0].tokens = {best};
      b.seqs[0].num_computed = prompt + i;
      ex->execute(b, out);
    }
    const double dec = seconds_since(t0);
    std::printf("decode %d tokens (context %d..%d): %.2f ms/token = %.1f tok/s (cpu %.2f ms/token)\n", decode, prompt,
                prompt + decode, 1e3 * dec / decode, decode / dec, 1e3 * (cpu_seconds() - c0) / decode);

    // Batched decode: `batch` sequences with short prompts, one token each per step.
    if (batch > 1) {
      step_batch bb;
      for (int s = 0; s < batch; ++s) {
        sequence_slice sl;
        sl.seq_id = static_cast<uint64_t>(s + 1);
        sl.tokens.assign(tokens.begin(), tokens.begin() + 32);
        sl.block_table = table_for(s + 1);
        bb.seqs.push_back(sl);
      }
      ex->execute(bb, out);
      const int steps = decode;
      t0 = std::chrono::steady_clock::now();
      c0 = cpu_seconds();
      for (int i = 0; i < steps; ++i) {
        for (int s = 0; s < batch; ++s) {
          bb.seqs[static_cast<size_t>(s)].tokens = {(i * 31 + s) % c.vocab_size};
          bb.seqs[static_cast<size_t>(s)].num_computed = 32 + i;
        }
        ex->execute(bb, out);
      }
      const double t = seconds_since(t0);
      std::printf("batched decode %d seqs x %d steps: %.2f ms/step = %.1f tok/s (cpu %.2f ms/step)\n", batch, steps,
                  1e3 * t / steps, batch * steps / t, 1e3 * (cpu_seconds() - c0) / steps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
