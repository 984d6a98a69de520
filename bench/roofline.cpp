// roofline: how close Tessera runs to this machine's limits.
//
//   roofline [--model M.gguf] [--threads N] [--tessera PATH] [--prompt-tokens 512] [--gen-tokens 128]
//            [--repeats 3] [--kv-cache-dtype fp16] [--decode-tps X --prefill-tps Y] [--json FILE]
//            [--skip-tessera]
//
// 1. Measures memory bandwidth, multi-threaded: STREAM's triad (a = b + s*c; 3 words per element
//    counted, as STREAM does) and a read-only sum, each at two working-set sizes: about the model's
//    size (what a decode step actually streams; on a CPU with a large L3 this is cache bandwidth)
//    and well beyond the last-level cache (DRAM).
// 2. Measures peak compute, multi-threaded: an fp32 FMA loop with independent accumulators, and
//    the int8 dot-product instruction Tessera's quantized matmuls use (AVX-512 VNNI vpdpbusd: 64
//    u8 x s8 products and sums per instruction) when the CPU has it.
// 3. Reads the model file's tensors: bytes read per decoded token = every weight tensor (the token
//    embedding table only when it doubles as the output projection, else one row) + the KV cache
//    of the context in the dtype Tessera runs with (--kv-cache-dtype, passed on to it; fp16 is its
//    default on the CPU: 2 * layers * kv_heads * head_dim * 2 bytes per position, int8 adds a 4-byte
//    scale per head vector), at the mean context of the run; prefill FLOPs = 2 * matmul parameters *
//    prompt tokens.
// 4. Runs `tessera bench latency` (the binary next to this one) for decode and prefill tokens/s,
//    or takes them from --decode-tps / --prefill-tps, and reports each as a fraction of its limit:
//    decode tok/s / (bandwidth / bytes per token), prefill FLOP/s / peak FLOP/s.
// Prints a human table, then one JSON line (also written to --json FILE).
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/gguf.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Runs fn(thread_index) on `n` threads at once (after a common start) and returns the wall time.
template <class Fn>
double timed_parallel(int n, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {}
      fn(t);
    });
  }
  while (ready.load() < n) {}
  const auto t0 = clock_type::now();
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  return seconds_since(t0);
}

struct range {
  size_t begin, end;
};
range slice(size_t n, int parts, int i) {
  // 64-float (256 B) aligned slices so that threads never share a cache line.
  const size_t per = (n / static_cast<size_t>(parts) + 63) / 64 * 64;
  const size_t b = std::min(n, per * static_cast<size_t>(i));
  return {b, std::min(n, b + per)};
}

// 32-byte loads/stores (two loads per cycle cover any cache's bandwidth); the CPU must have AVX2.
__attribute__((target("avx2,fma"))) void triad_kernel(float* a, const float* b, const float* c, float s, range r) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = r.begin;
  for (; i + 8 <= r.end; i += 8)
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
  for (; i < r.end; ++i) a[i] = b[i] + s * c[i];
}

// Four independent add chains so that the loop is bound by loads, not by the add latency.
__attribute__((target("avx2"))) double read_kernel(const float* a, range r) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  size_t i = r.begin;
  for (; i + 32 <= r.end; i += 32) {
    acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(a + i));
    acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(a + i + 8));
    acc2 = _mm256_add_ps(acc2, _mm256_loadu_ps(a + i + 16));
    acc3 = _mm256_add_ps(acc3, _mm256_loadu_ps(a + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  double total = 0;
  for (float v : out) total += v;
  for (; i < r.end; ++i) total += a[i];
  return total;
}

struct bandwidth {
  double triad_gbs = 0;  // STREAM convention: 3 * 4 bytes per element
  double read_gbs = 0;
};

// Best of `repeats` passes over arrays of `n` floats each.
bandwidth measure_bandwidth(size_t n, int threads, int repeats) {
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  timed_parallel(threads, [&](int t) {  // first touch by the thread that will use the pages
    const range r = slice(n, threads, t);
    for (size_t i = r.begin; i < r.end; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
  });
  bandwidth best;
  std::vector<double> sums(static_cast<size_t>(threads) * 16);
  for (int rep = 0; rep < repeats; ++rep) {
    const float s = 3.0f + static_cast<float>(rep);
    const double triad =
        timed_parallel(threads, [&](int t) { triad_kernel(a.get(), b.get(), c.get(), s, slice(n, threads, t)); });
    best.triad_gbs = std::max(best.triad_gbs, 3.0 * 4.0 * static_cast<double>(n) / triad / 1e9);
    const double read = timed_parallel(threads, [&](int t) {
      sums[static_cast<size_t>(t) * 16] = read_kernel(a.get(), slice(n, threads, t));  // keeps the loads alive
    });
    best.read_gbs = std::max(best.read_gbs, 4.0 * static_cast<double>(n) / read / 1e9);
  }
  double keep = 0;
  for (double v : sums) keep += v;
  if (keep == -1.0) std::printf(" ");
  return best;
}

// ---- peak compute -----------------------------------------------------------------------------

constexpr int64_t compute_iterations = 20'000'000;

// 12 independent FMA chains of 16 floats: enough to cover the FMA latency on two ports.
__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iterations) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(0.001f * static_cast<float>(k));
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], x, y);
  float out[16];
  __m512 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_ps(sum, acc[k]);
  _mm512_storeu_ps(out, sum);
  return 2.0 * 16 * 12 * static_cast<double>(iterations) + (out[0] == 12345.f ? 1 : 0);
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iterations) {
  __m256 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm256_set1_ps(0.001f * static_cast<float>(k));
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm256_fmadd_ps(acc[k], x, y);
  float out[8];
  __m256 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm256_add_ps(sum, acc[k]);
  _mm256_storeu_ps(out, sum);
  return 2.0 * 8 * 12 * static_cast<double>(iterations) + (out[0] == 12345.f ? 1 : 0);
}

// vpdpbusd: per 32-bit lane, 4 u8 x s8 products added to the accumulator = 8 integer ops.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double vnni_loop(int64_t iterations) {
  __m512i acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_epi32(k);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iterations; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
  __m512i sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_epi32(sum, acc[k]);
  int32_t out[16];
  _mm512_storeu_si512(out, sum);
  return 2.0 * 64 * 12 * static_cast<double>(iterations) + (out[0] == 12345 ? 1 : 0);
}

// Ops per second over `threads` threads, best of `repeats`.
template <class Loop>
double measure_peak(Loop loop, int threads, int repeats) {
  double best = 0;
  std::vector<double> ops(static_cast<size_t>(threads));
  for (int rep = 0; rep < repeats; ++rep) {
    const double secs = timed_parallel(threads, [&](int t) { ops[static_cast<size_t>(t)] = loop(compute_iterations); });
    double total = 0;
    for (double v : ops) total += v;
    best = std::max(best, total / secs);
  }
  return best;
}

// ---- model ------------------------------------------------------------------------------------

struct model_costs {
  double weight_bytes_per_token = 0;  // bytes of weights a decode step reads
  double matmul_params = 0;           // parameters multiplied per token (prefill FLOPs = 2 * this * tokens)
  double kv_bytes_per_position = 0;   // K and V of one context position, all layers, in the cache's dtype
  double file_bytes = 0;
};

// Bytes of one stored K or V head vector of `head_dim` elements (cpu/kernels.hpp: int8 tiles keep an f32
// scale per slot); 0 for a name Tessera does not take.
double kv_head_vector_bytes(const std::string& dtype, int64_t head_dim) {
  const auto d = static_cast<double>(head_dim);
  if (dtype == "fp32") return 4 * d;
  if (dtype == "fp16" || dtype == "bf16") return 2 * d;
  if (dtype == "int8") return d + 4;
  return 0;
}

model_costs read_model(const std::string& path, const std::string& kv_dtype) {
  auto file = tessera::gguf_file::open(path);
  const std::string arch = file->get_string("general.architecture").value_or("llama");
  auto get = [&](const std::string& key) { return file->get_int(arch + "." + key).value_or(0); };
  const int64_t layers = get("block_count"), hidden = get("embedding_length"), heads = get("attention.head_count");
  const int64_t kv_heads = file->get_int(arch + ".attention.head_count_kv").value_or(heads);
  const bool tied = file->tensor("output.weight") == nullptr;  // the embedding table is the output projection
  model_costs c;
  for (const auto& t : file->tensors()) {
    c.file_bytes += static_cast<double>(t.num_bytes);
    if (t.name == "token_embd.weight" && !tied) {
      c.weight_bytes_per_token += static_cast<double>(t.num_bytes) / static_cast<double>(t.dims.back());  // one row
      continue;
    }
    c.weight_bytes_per_token += static_cast<double>(t.num_bytes);
    if (t.dims.size() == 2 && t.name != "token_embd.weight") c.matmul_params += static_cast<double>(t.num_elements);
  }
  const int64_t head_dim = heads ? hidden / heads : 0;
  c.kv_bytes_per_position = 2.0 * static_cast<double>(layers * kv_heads) * kv_head_vector_bytes(kv_dtype, head_dim);
  return c;
}

// ---- Tessera ----------------------------------------------------------------------------------

double json_number(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\":");
  if (at == std::string::npos) return 0;
  return std::strtod(text.c_str() + at + key.size() + 3, nullptr);
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string run_capture(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

std::filesystem::path self_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : p.parent_path();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, tessera, json_path, kv_dtype = "fp16";
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int prompt_tokens = 512, gen_tokens = 128, repeats = 3;
  double decode_tps = 0, prefill_tps = 0;
  bool skip_tessera = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "roofline: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      model = value();
    else if (a == "--threads")
      threads = std::atoi(value().c_str());
    else if (a == "--tessera")
      tessera = value();
    else if (a == "--prompt-tokens")
      prompt_tokens = std::atoi(value().c_str());
    else if (a == "--gen-tokens")
      gen_tokens = std::atoi(value().c_str());
    else if (a == "--repeats")
      repeats = std::atoi(value().c_str());
    else if (a == "--kv-cache-dtype")
      kv_dtype = value();
    else if (a == "--decode-tps")
      decode_tps = std::atof(value().c_str());
    else if (a == "--prefill-tps")
      prefill_tps = std::atof(value().c_str());
    else if (a == "--json")
      json_path = value();
    else if (a == "--skip-tessera")
      skip_tessera = true;
    else {
      std::fprintf(stderr,
                   "usage: roofline [--model M] [--threads N] [--tessera PATH] [--prompt-tokens N] "
                   "[--gen-tokens N] [--repeats N] [--kv-cache-dtype fp32|fp16|bf16|int8] [--decode-tps X] "
                   "[--prefill-tps Y] [--json FILE] "
                   "[--skip-tessera]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  threads = std::max(1, threads);
  if (kv_head_vector_bytes(kv_dtype, 1) == 0) {
    std::fprintf(stderr, "roofline: --kv-cache-dtype must be fp32, fp16, bf16 or int8 (got '%s')\n", kv_dtype.c_str());
    return 2;
  }
  repeats = std::max(1, repeats);
  const std::filesystem::path bin = self_dir();
  if (model.empty()) {
    for (auto dir = bin; !dir.empty() && dir != dir.parent_path(); dir = dir.parent_path()) {
      const auto candidate = dir / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
      if (std::filesystem::exists(candidate)) {
        model = candidate.string();
        break;
      }
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "roofline: no --model and no models/SmolLM2-135M-Instruct.Q4_1.gguf above %s\n", bin.c_str());
    return 2;
  }
  if (tessera.empty()) tessera = (bin / "tessera").string();

  model_costs costs;
  try {
    costs = read_model(model, kv_dtype);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "roofline: cannot read %s: %s\n", model.c_str(), e.what());
    return 1;
  }

  // Model-sized working set: three arrays whose sum is about the weights' size.
  const size_t model_floats = static_cast<size_t>(costs.weight_bytes_per_token / 3 / sizeof(float));
  const size_t dram_floats = size_t{1} << 28;  // 3 x 1 GiB: beyond any last-level cache
  std::fprintf(stderr, "roofline: measuring bandwidth and compute on %d threads...\n", threads);
  // Passes over the model-sized set take milliseconds: many of them, best kept (a shared machine steals
  // time slices; the best pass is the one nobody interrupted).
  bandwidth bw_model = measure_bandwidth(model_floats, threads, std::max(20, 5 * repeats));
  const bandwidth bw_dram = measure_bandwidth(dram_floats, threads, repeats);
  const bool has_avx512 = __builtin_cpu_supports("avx512f");
  const bool has_vnni = __builtin_cpu_supports("avx512vnni");
  const double fp32_peak = has_avx512 ? measure_peak(fma_loop_avx512, threads, 3 * repeats)
                                      : measure_peak(fma_loop_avx2, threads, 3 * repeats);
  const double int8_peak = has_vnni ? measure_peak(vnni_loop, threads, 3 * repeats) : 0.0;

  std::string tessera_json;
  if (!skip_tessera && (decode_tps <= 0 || prefill_tps <= 0)) {
    const std::string command = shell_quote(tessera) + " bench latency --model " + shell_quote(model) +
                                " --prompt-tokens " + std::to_string(prompt_tokens) + " --gen-tokens " +
                                std::to_string(gen_tokens) + " --threads " + std::to_string(threads) + " --repeats " +
                                std::to_string(repeats) + " --kv-cache-dtype " + kv_dtype + " --quiet 2>/dev/null";
    std::fprintf(stderr, "roofline: %s\n", command.c_str());
    tessera_json = run_capture(command);
    if (decode_tps <= 0) decode_tps = json_number(tessera_json, "decode_tps");
    if (prefill_tps <= 0) prefill_tps = json_number(tessera_json, "prompt_tps");
    if (decode_tps <= 0)
      std::fprintf(stderr, "roofline: no decode_tps from Tessera (output: %s)\n", tessera_json.c_str());
  }

  // The model-sized set once more, after Tessera's run, keeping the better of the two: on a VM whose
  // neighbours share the memory controller the bandwidth moves by a third from one minute to the next,
  // and the higher figure is the limit that applied (the fraction below errs low, never high).
  if (!tessera_json.empty()) {
    const bandwidth again = measure_bandwidth(model_floats, threads, std::max(20, 5 * repeats));
    bw_model.triad_gbs = std::max(bw_model.triad_gbs, again.triad_gbs);
    bw_model.read_gbs = std::max(bw_model.read_gbs, again.read_gbs);
  }

  // Decode: every step reads all weights and the KV cache of its context (mean over the run).
  const double mean_context = prompt_tokens + gen_tokens / 2.0;
  const double bytes_per_token = costs.weight_bytes_per_token + costs.kv_bytes_per_position * mean_context;
  const double bw_limit_model = std::max(bw_model.read_gbs, bw_model.triad_gbs) * 1e9 / bytes_per_token;
  const double bw_limit_dram = std::max(bw_dram.read_gbs, bw_dram.triad_gbs) * 1e9 / bytes_per_token;
  // Prefill: 2 FLOPs per parameter per token (the attention's own FLOPs are left out: ~8% at 512 tokens).
  const double prefill_flops = 2.0 * costs.matmul_params * prefill_tps;
  const double int8_or_fp32_peak = int8_peak > 0 ? int8_peak : fp32_peak;

  std::printf("roofline (%d threads, model %s)\n", threads, std::filesystem::path(model).filename().c_str());
  std::printf("  bandwidth, model-sized set (3 x %.0f MB): triad %.1f GB/s, read %.1f GB/s\n", model_floats * 4 / 1e6,
              bw_model.triad_gbs, bw_model.read_gbs);
  std::printf("  bandwidth, DRAM-sized set  (3 x %.0f MB): triad %.1f GB/s, read %.1f GB/s\n", dram_floats * 4 / 1e6,
              bw_dram.triad_gbs, bw_dram.read_gbs);
  std::printf("  peak fp32 FMA: %.1f GFLOP/s%s\n", fp32_peak / 1e9, has_avx512 ? " (AVX-512)" : " (AVX2)");
  if (int8_peak > 0) std::printf("  peak int8 dot product (VNNI vpdpbusd): %.1f GOP/s\n", int8_peak / 1e9);
  std::printf("  per decoded token: %.1f MB weights + %.1f MB %s KV (mean context %.0f) = %.1f MB\n",
              costs.weight_bytes_per_token / 1e6, costs.kv_bytes_per_position * mean_context / 1e6, kv_dtype.c_str(),
              mean_context, bytes_per_token / 1e6);
  std::printf("  decode limit: %.1f tok/s (model-sized bandwidth), %.1f tok/s (DRAM bandwidth)\n", bw_limit_model,
              bw_limit_dram);
  if (decode_tps > 0)
    std::printf("  Tessera decode: %.1f tok/s = %.1f%% of the model-sized limit, %.1f%% of the DRAM limit\n",
                decode_tps, 100 * decode_tps / bw_limit_model, 100 * decode_tps / bw_limit_dram);
  if (prefill_tps > 0)
    std::printf("  Tessera prefill: %.1f tok/s = %.1f GOP/s = %.1f%% of int8 peak, %.1f%% of fp32 peak\n", prefill_tps,
                prefill_flops / 1e9, 100 * prefill_flops / int8_or_fp32_peak, 100 * prefill_flops / fp32_peak);

  char json[2048];
  std::snprintf(
      json, sizeof json,
      "{\"threads\":%d,\"model\":\"%s\",\"bandwidth_model_set\":{\"triad_gbs\":%.3f,\"read_gbs\":%.3f,\"bytes\":%.0f},"
      "\"bandwidth_dram_set\":{\"triad_gbs\":%.3f,\"read_gbs\":%.3f,\"bytes\":%.0f},\"peak_fp32_gflops\":%.3f,"
      "\"peak_int8_gops\":%.3f,\"weight_bytes_per_token\":%.0f,\"kv_cache_dtype\":\"%s\",\"kv_bytes_per_position\":%."
      "0f,"
      "\"mean_context\":%.1f,\"bytes_per_token\":%.0f,\"matmul_params\":%.0f,\"decode_limit_tps_model_set\":%.3f,"
      "\"decode_limit_tps_dram\":%.3f,\"decode_tps\":%.3f,\"decode_fraction_model_set\":%.4f,"
      "\"decode_fraction_dram\":%.4f,\"prefill_tps\":%.3f,\"prefill_gops\":%.3f,\"prefill_fraction_int8\":%.4f,"
      "\"prefill_fraction_fp32\":%.4f,\"prompt_tokens\":%d,\"gen_tokens\":%d}",
      threads, std::filesystem::path(model).filename().c_str(), bw_model.triad_gbs, bw_model.read_gbs,
      model_floats * 12.0, bw_dram.triad_gbs, bw_dram.read_gbs, dram_floats * 12.0, fp32_peak / 1e9, int8_peak / 1e9,
      costs.weight_bytes_per_token, kv_dtype.c_str(), costs.kv_bytes_per_position, mean_context, bytes_per_token,
      costs.matmul_params, bw_limit_model, bw_limit_dram, decode_tps, decode_tps / bw_limit_model,
      decode_tps / bw_limit_dram, prefill_tps, prefill_flops / 1e9, prefill_flops / int8_or_fp32_peak,
      prefill_flops / fp32_peak, prompt_tokens, gen_tokens);
  std::printf("%s\n", json);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "roofline: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(f, "%s\n", json);
    std::fclose(f);
  }
  return 0;
}
