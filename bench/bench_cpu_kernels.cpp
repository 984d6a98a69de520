// CPU executor timings on a GGUF model: prefill of one prompt, single-sequence decode, and batched
// decode. Usage:
//   bench_cpu_kernels [model.gguf] [--threads N] [--prompt N] [--decode N] [--batch N] [--kernels NAME]
//   bench_cpu_kernels --matmul-only    (GMAC/s of each kernel table on a 1536x576 Q4_1 matmul)
//   bench_cpu_kernels --types [--rows R] [--cols C] [--threads N] [--working-set MB] [--roofline-gbs X]
//                     [--only Q4_K,Q6_K,...] [--kernels NAME] [--seconds S] [--shape decode|prefill]
//                     [--layout stored|packed|both] [--count]
//       every weight type x every kernel table on an R x C matmul (default 4096 x 4096), decode-shaped
//       (1 token) and prefill-shaped (64 tokens): GB/s of weight bytes streamed and GMAC/s, against the
//       read bandwidth of the same working set on the same threads (measured here as roofline does, or
//       --roofline-gbs: e.g. roofline's DRAM read figure for that thread count). The quantized types run
//       twice: as stored (matmul_q) and packed at load ("+pk", matmul_packed), unless --layout picks one.
//       --count: one call per measurement and no warm-up (instruction counts under callgrind:
//       bench/count_instructions.sh).
// Token ids are synthetic (the timing of a LLaMA forward does not depend on which ids they are).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <sstream>

#include "cpu/cpu_executor.hpp"
#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
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

// ---- --types: every weight type x every kernel table ------------------------------------------------

struct types_options {
  int64_t rows = 4096;
  int64_t cols = 4096;
  int threads = 1;
  double working_set_mb = 1024;  // > the last-level cache, so that decode streams from DRAM
  double roofline_gbs = 0;       // 0: measure
  double seconds = 0.3;          // per measurement (at least one call)
  std::vector<tessera::ggml_type> only;
  std::string kernels;
  int shapes = 3;      // bit 0: decode, bit 1: prefill
  int layouts = 3;     // quantized types: bit 0 as stored (matmul_q), bit 1 packed at load (matmul_packed)
  bool count = false;  // exactly one call per measurement, no warm-up: for valgrind --tool=callgrind
};

uint32_t lcg(uint32_t& state) { return state = state * 1664525u + 1013904223u; }

// Offsets of a block's f16 scale fields (ggml-common.h), set to sane values over random bits (random
// bits there could be inf/NaN, which would make some kernels take slow paths).
std::vector<int> half_fields(tessera::ggml_type t) {
  using tessera::ggml_type;
  switch (t) {
    case ggml_type::q4_0:
    case ggml_type::q5_0:
    case ggml_type::q8_0: return {0};
    case ggml_type::q4_1:
    case ggml_type::q5_1:
    case ggml_type::q4_k:
    case ggml_type::q5_k: return {0, 2};
    case ggml_type::q2_k: return {80, 82};
    case ggml_type::q3_k: return {108};
    case ggml_type::q6_k: return {208};
    default: return {};
  }
}

// One random matrix of `type`, replicated over `copies` consecutive slots of `stride` bytes.
std::vector<std::byte> random_matrix(tessera::ggml_type type, int64_t rows, int64_t cols, int64_t copies) {
  using namespace tessera;
  const int64_t rb = row_bytes(type, cols), bytes = rows * rb;
  std::vector<std::byte> w(static_cast<size_t>(bytes * copies));
  uint32_t state = 12345;
  const ggml_type_info& info = type_info(type);
  for (int64_t r = 0; r < rows; ++r) {
    std::byte* row = w.data() + r * rb;
    if (type == ggml_type::f32 || type == ggml_type::f16 || type == ggml_type::bf16) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = static_cast<float>(lcg(state) >> 8) / 8388608.0f - 1.0f;
        if (type == ggml_type::f32) std::memcpy(row + 4 * c, &v, 4);
        const uint16_t h = type == ggml_type::f16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
        if (type != ggml_type::f32) std::memcpy(row + 2 * c, &h, 2);
      }
      continue;
    }
    for (int64_t i = 0; i < rb; ++i) row[i] = static_cast<std::byte>(lcg(state) >> 24);
    for (int64_t b = 0; b < cols / info.block_elems; ++b) {
      for (int off : half_fields(type)) {
        const uint16_t h = fp32_to_fp16(0.001f + 0.01f * static_cast<float>(lcg(state) >> 24) / 256.0f);
        std::memcpy(row + b * info.block_bytes + off, &h, 2);
      }
    }
  }
  for (int64_t c = 1; c < copies; ++c) std::memcpy(w.data() + c * bytes, w.data(), static_cast<size_t>(bytes));
  return w;
}

__attribute__((target("avx2"))) double read_slice(const std::byte* p, int64_t bytes) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const auto* f = reinterpret_cast<const float*>(p);
  const int64_t n = bytes / 4;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(f + i));
    acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(f + i + 8));
    acc2 = _mm256_add_ps(acc2, _mm256_loadu_ps(f + i + 16));
    acc3 = _mm256_add_ps(acc3, _mm256_loadu_ps(f + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  double total = 0;
  for (float v : out) total += v;
  return total;
}

// Read bandwidth over `bytes` on the pool's threads (roofline's read kernel), best of a few passes.
double measure_read_gbs(tessera::cpu::thread_pool& pool, const std::vector<std::byte>& buf) {
  const int n = pool.size();
  const auto total = static_cast<int64_t>(buf.size());
  const int64_t per = (total / n) / 64 * 64;
  std::vector<double> sink(static_cast<size_t>(n) * 8);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int i) { sink[static_cast<size_t>(i) * 8] += read_slice(buf.data() + i * per, per); });
    best = std::max(best, static_cast<double>(per * n) / seconds_since(t0) / 1e9);
  }
  if (sink[0] == 12345.0) std::printf(" ");
  return best;
}

void bench_types(const types_options& o) {
  using namespace tessera;
  using namespace tessera::cpu;
  const std::vector<ggml_type> all = {ggml_type::f32,  ggml_type::f16,  ggml_type::bf16, ggml_type::q8_0,
                                      ggml_type::q4_0, ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1,
                                      ggml_type::q2_k, ggml_type::q3_k, ggml_type::q4_k, ggml_type::q5_k,
                                      ggml_type::q6_k};
  const std::vector<ggml_type>& types = o.only.empty() ? all : o.only;
  std::vector<const kernel_table*> tables;
  for (const kernel_table* k : available_kernels()) {
    if (o.kernels.empty() || o.kernels == k->name) tables.push_back(k);
  }
  thread_pool pool(o.threads);
  const auto ws_bytes = static_cast<int64_t>(o.working_set_mb * 1e6);
  double bw = o.roofline_gbs;
  if (bw <= 0) {
    std::vector<std::byte> buf(static_cast<size_t>(ws_bytes), std::byte{1});
    bw = measure_read_gbs(pool, buf);
  }
  std::printf(
      "matmul %lld x %lld, %d thread(s), working set %.0f MB per type (weights rotate through copies, so\n"
      "decode streams them from memory); read bandwidth %.1f GB/s (%s)\n",
      static_cast<long long>(o.rows), static_cast<long long>(o.cols), o.threads, o.working_set_mb, bw,
      o.roofline_gbs > 0 ? "--roofline-gbs" : "measured here, roofline's read kernel");
  std::printf("%-5s %-14s %6s | %-32s | %-32s\n", "type", "table (+pk: packed)", "B/w", "decode (1 token)",
              "prefill (64 tokens)");
  std::printf("%-5s %-14s %6s | %8s %6s %8s %8s | %8s %6s %8s %8s\n", "", "", "", "GB/s", "%bw", "GMAC/s", "ms", "GB/s",
              "%bw", "GMAC/s", "ms");
  const int64_t rows = o.rows, cols = o.cols;
  for (ggml_type type : types) {
    const ggml_type_info& info = type_info(type);
    if (cols % info.block_elems != 0) {
      std::printf("%-5s skipped: %lld columns are not whole %lld-value blocks\n", std::string(info.name).c_str(),
                  static_cast<long long>(cols), static_cast<long long>(info.block_elems));
      continue;
    }
    const int64_t rb = row_bytes(type, cols), mat_bytes = rows * rb;
    const int64_t copies = std::max<int64_t>(1, ws_bytes / mat_bytes);
    const std::vector<std::byte> w = random_matrix(type, rows, cols, copies);
    const act_format fmt = act_format_of(type);
    const bool quantized = fmt == act_format::q8 || fmt == act_format::q8_k;
    std::vector<std::byte> packed;
    if (quantized && (o.layouts & 2) != 0) {
      packed.resize(static_cast<size_t>(packed_matrix_bytes(type, rows, cols) * copies));
      for (int64_t c = 0; c < copies; ++c) {
        pack_weights(type, w.data() + c * mat_bytes, rb, rows, cols,
                     packed.data() + c * packed_matrix_bytes(type, rows, cols));
      }
    }
    for (int run = 0; run < 2 * static_cast<int>(tables.size()); ++run) {
      const kernel_table* k = tables[static_cast<size_t>(run / 2)];
      const int layout = run % 2;
      if (quantized ? (o.layouts >> layout & 1) == 0 : layout == 1) continue;
      const bool use_packed = layout == 1;
      double gbs[2], gmacs[2], ms[2];
      for (int shape = 0; shape < 2; ++shape) {
        gbs[shape] = gmacs[shape] = ms[shape] = 0.0;
        if ((o.shapes >> shape & 1) == 0) continue;
        const int32_t tokens = shape == 0 ? 1 : 64;
        uint32_t state = 777;
        std::vector<float> x(static_cast<size_t>(tokens * cols));
        for (auto& v : x) v = static_cast<float>(lcg(state) >> 8) / 8388608.0f - 1.0f;
        // The activation formats, made once (the executor does it once per layer input).
        std::vector<act_block> q8;
        std::vector<act_block_k> q8k;
        std::vector<float> xbf(x.size());
        std::vector<uint16_t> xb(x.size());
        if (fmt == act_format::q8) {
          q8.resize(static_cast<size_t>(tokens * cols / 32));
          k->quantize_act(x.data(), q8.data(), tokens * cols);
        } else if (fmt == act_format::q8_k) {
          q8k.resize(static_cast<size_t>(tokens * cols / 256));
          k->quantize_act_k(x.data(), q8k.data(), tokens * cols);
        } else if (fmt == act_format::bf16) {
          round_act_bf16(x.data(), xbf.data(), xb.data(), tokens * cols);
        }
        std::vector<float> out(static_cast<size_t>(tokens * rows));
        // Rows split into one contiguous range per thread, as the executor's chunks do.
        auto call = [&](int64_t copy) {
          const std::byte* wc =
              use_packed ? packed.data() + copy * packed_matrix_bytes(type, rows, cols) : w.data() + copy * mat_bytes;
          pool.run([&](int i) {
            const int64_t per = (rows + pool.size() - 1) / pool.size();
            const int64_t r0 = std::min(rows, i * per), r1 = std::min(rows, r0 + per);
            if (r0 >= r1) return;
            if (fmt == act_format::q8 || fmt == act_format::q8_k) {
              qmatmul_args a;
              a.type = type;
              a.weights = wc;
              a.weight_stride = rb;
              a.num_blocks = cols / info.block_elems;
              a.act = q8.data();
              a.act_k = q8k.data();
              a.act_stride = cols / info.block_elems;
              a.num_tokens = tokens;
              a.row_begin = r0;
              a.row_end = r1;
              a.out = out.data();
              a.out_stride = rows;
              if (use_packed) {
                k->matmul_packed(a);
              } else {
                k->matmul_q(a);
              }
            } else {
              fmatmul_args a;
              a.type = type;
              a.weights = wc;
              a.cols = cols;
              a.x = fmt == act_format::bf16 ? xbf.data() : x.data();
              a.x_bf16 = xb.data();
              a.x_stride = cols;
              a.num_tokens = tokens;
              a.row_begin = r0;
              a.row_end = r1;
              a.out = out.data();
              a.out_stride = rows;
              k->matmul_f32(a);
            }
          });
        };
        if (shape == 0 && !o.count) call(0);  // warm-up (page faults of the output, code); prefill calls are long
        int64_t calls = 0;
        const auto t0 = std::chrono::steady_clock::now();
        while (calls < 1 || (!o.count && seconds_since(t0) < o.seconds)) call(calls++ % copies);
        const double t = seconds_since(t0) / static_cast<double>(calls);
        gbs[shape] = static_cast<double>(mat_bytes) / t / 1e9;
        gmacs[shape] = static_cast<double>(rows * cols) * tokens / t / 1e9;
        ms[shape] = 1e3 * t;
      }
      const std::string table = std::string(k->name) + (use_packed ? "+pk" : "");
      std::printf("%-5s %-14s %6.3f | %8.2f %5.0f%% %8.2f %8.3f | %8.2f %5.0f%% %8.2f %8.3f\n",
                  std::string(info.name).c_str(), table.c_str(),
                  static_cast<double>(info.block_bytes) / info.block_elems, gbs[0], 100 * gbs[0] / bw, gmacs[0], ms[0],
                  gbs[1], 100 * gbs[1] / bw, gmacs[1], ms[1]);
      std::fflush(stdout);
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
    if (a == "--threads")
      threads = std::atoi(next());
    else if (a == "--prompt")
      prompt = std::atoi(next());
    else if (a == "--decode")
      decode = std::atoi(next());
    else if (a == "--batch")
      batch = std::atoi(next());
    else if (a == "--kernels")
      kernels = next();
    else if (a == "--matmul-only") {
      bench_matmul();
      return 0;
    } else if (a == "--types") {
      types_options o;
      for (++i; i < argc; ++i) {
        const std::string b = argv[i];
        if (b == "--rows")
          o.rows = std::atoll(next());
        else if (b == "--cols")
          o.cols = std::atoll(next());
        else if (b == "--threads")
          o.threads = std::atoi(next());
        else if (b == "--working-set")
          o.working_set_mb = std::atof(next());
        else if (b == "--roofline-gbs")
          o.roofline_gbs = std::atof(next());
        else if (b == "--seconds")
          o.seconds = std::atof(next());
        else if (b == "--kernels")
          o.kernels = next();
        else if (b == "--shape") {
          const std::string v = next();
          o.shapes = v == "decode" ? 1 : v == "prefill" ? 2 : 3;
        } else if (b == "--layout") {
          const std::string v = next();
          o.layouts = v == "stored" ? 1 : v == "packed" ? 2 : 3;
        } else if (b == "--count") {
          o.count = true;
        } else if (b == "--only") {
          std::stringstream list(next());
          for (std::string name; std::getline(list, name, ',');) {
            bool found = false;
            for (uint32_t raw = 0; raw < 64 && !found; ++raw) {
              const ggml_type_info* info = find_type_info(raw);
              if (info != nullptr && info->name == name) {
                o.only.push_back(info->type);
                found = true;
              }
            }
            if (!found) {
              std::fprintf(stderr, "unknown type %s\n", name.c_str());
              return 2;
            }
          }
        } else {
          std::fprintf(stderr, "unknown --types option %s\n", b.c_str());
          return 2;
        }
      }
      bench_types(o);
      return 0;
    } else
      path = a;
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
      for (int32_t v = 1; v < c.vocab_size; ++v)
        best = row[static_cast<size_t>(v)] > row[static_cast<size_t>(best)] ? v : best;
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
        sl.seq = seq_id{static_cast<uint64_t>(s + 1)};
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
