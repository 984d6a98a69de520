// The two small-batch paths over GGUF-quantised weights (gpu/quantized_gemm.hpp) on the GEMMs of a
// Llama-3-8B decode step: the float path (each weight dequantised in registers, an FMA per weight and
// row) against the int8 path (the rows quantised to int8 first, dp4a dot products: llama.cpp's mmvq),
// for Q4_K, Q6_K and Q8_0 at 1, 2, 4 and 8 rows. Time per call from CUDA events (the int8 path's
// includes its quantisation launch, as the executor runs it) and the share of the H200's 4.8 TB/s that
// the weight bytes represent; then the GEMM time of a whole decode step with each. Prints markdown
// (scripts/gpu-check.sh appends it to its results). The executor takes the int8 path with
// TESSERA_QGEMV=int8; this is what decides whether it should by default.
//
// Each shape's weights are several copies, cycled through, totalling >= 256 MiB, so that the 50 MiB L2
// does not hold them between calls (gpu_gemv_bench does the same). The two paths' outputs are compared
// (max |diff| relative to the largest output): the int8 path quantises its input, so they differ by
// that rounding, not by more (fails above 5e-2 of the largest output).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/quantized_gemm.hpp"
#include "gpu/tools/bench_timing.hpp"
#include "tests/support/ggml_encode.hpp"

using namespace tessera;
using namespace tessera::gpu;

namespace {

constexpr double kPeakBytesPerSecond = 4.8e12;  // H200 HBM3e
constexpr size_t kMinWeightBytes = size_t{256} << 20;
constexpr double kMaxPathDiff = 5e-2;

struct shape {
  const char* name;
  int64_t n;
  int64_t k;
  int32_t per_step;  // 32 layers
};

// n rows of k weights of `type`: normal values of trained-weight size (sd 0.02) quantised by the tests'
// encoder (tests/support/ggml_encode.hpp), kPatternRows of them repeated.
std::vector<uint8_t> quantized_matrix(ggml_type type, int64_t n, int64_t k, uint32_t seed) {
  constexpr int64_t kPatternRows = 256;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<uint8_t> pattern;
  for (int64_t r = 0; r < std::min(n, kPatternRows); ++r) {
    for (float& v : row) v = dist(rng);
    const std::vector<std::byte> blocks = test_support::encode_row(type, row.data(), k);
    const auto* bytes = reinterpret_cast<const uint8_t*>(blocks.data());
    pattern.insert(pattern.end(), bytes, bytes + blocks.size());
  }
  std::vector<uint8_t> m(static_cast<size_t>(n * row_bytes(type, k)));
  for (size_t at = 0; at < m.size(); at += pattern.size())
    std::copy_n(pattern.begin(), std::min(pattern.size(), m.size() - at), m.begin() + static_cast<std::ptrdiff_t>(at));
  return m;
}

}  // namespace

int main() {
  if (device_count() == 0) {
    std::printf("quantized_gemv_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::vector<shape> shapes = {
      {"qkv", 6144, 4096, 32}, {"o", 4096, 4096, 32}, {"gate_up", 28672, 4096, 32}, {"down", 4096, 14336, 32}};
  const std::vector<int32_t> row_counts = {1, 2, 4, 8};
  const ggml_type types[] = {ggml_type::q4_k, ggml_type::q6_k, ggml_type::q8_0};
  std::printf("### Quantised small-batch GEMM: float path vs int8 (dp4a) path (Llama-3-8B decode GEMMs) on %s\n\n",
              prop.name);
  std::printf(
      "µs per call (int8: quantisation + GEMV); %% of %.1f TB/s for the weight bytes.\n\n"
      "| type | GEMM | n x k | rows | float µs (%%) | int8 µs (%%) | float / int8 | max rel diff |\n"
      "|---|---|---|---|---|---|---|---|\n",
      kPeakBytesPerSecond / 1e12);
  bool ok = true;
  std::string summary;
  for (const ggml_type type : types) {
    const std::string type_name(type_info(type).name);
    std::vector<double> step_float(row_counts.size(), 0.0), step_int8(row_counts.size(), 0.0);
    for (const shape& s : shapes) {
      const int64_t rb = row_bytes(type, s.k);
      const size_t w_bytes = static_cast<size_t>(s.n * rb);
      const int copies = static_cast<int>(std::max<size_t>(1, (kMinWeightBytes + w_bytes - 1) / w_bytes));
      std::vector<void*> w(static_cast<size_t>(copies));
      for (int c = 0; c < copies; ++c) {
        const std::vector<uint8_t> host = quantized_matrix(type, s.n, s.k, 1 + static_cast<uint32_t>(c));
        CUDA_CHECK(cudaMalloc(&w[static_cast<size_t>(c)], w_bytes));
        CUDA_CHECK(cudaMemcpy(w[static_cast<size_t>(c)], host.data(), w_bytes, cudaMemcpyHostToDevice));
      }
      std::vector<uint16_t> in_host(static_cast<size_t>(kMaxQuantizedGemvRows * s.k));
      std::mt19937 rng(99);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (uint16_t& v : in_host) v = fp32_to_bf16(dist(rng));
      bf16* in = nullptr;
      void* act = nullptr;
      float *out_float = nullptr, *out_int8 = nullptr;
      CUDA_CHECK(cudaMalloc(&in, in_host.size() * sizeof(uint16_t)));
      CUDA_CHECK(cudaMemcpy(in, in_host.data(), in_host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMalloc(&act, static_cast<size_t>(int8_activation_bytes(type, kMaxQuantizedGemvRows, s.k))));
      CUDA_CHECK(cudaMalloc(&out_float, static_cast<size_t>(kMaxQuantizedGemvRows * s.n) * sizeof(float)));
      CUDA_CHECK(cudaMalloc(&out_int8, static_cast<size_t>(kMaxQuantizedGemvRows * s.n) * sizeof(float)));
      for (size_t ri = 0; ri < row_counts.size(); ++ri) {
        const int32_t rows = row_counts[ri];
        auto float_path = [&](int c) {
          quantized_small_batch_gemm(type, w[static_cast<size_t>(c)], rb, s.n, s.k, in, rows, out_float, s.n, false,
                                     nullptr);
        };
        auto int8_path = [&](int c) {
          quantize_activations_int8(type, in, rows, s.k, act, nullptr);
          quantized_small_batch_gemm_int8(type, w[static_cast<size_t>(c)], rb, s.n, s.k, act, rows, out_int8, s.n,
                                          false, nullptr);
        };
        const double tf = tools::time_us(float_path, copies), ti = tools::time_us(int8_path, copies);
        float_path(0);
        int8_path(0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const double diff = tools::max_rel_diff(out_int8, out_float, static_cast<size_t>(rows * s.n));
        if (!(diff < kMaxPathDiff)) ok = false;
        const auto pct = [&](double us) { return 100.0 * double(w_bytes) / (us * 1e-6) / kPeakBytesPerSecond; };
        std::printf("| %s | %s | %lld x %lld | %d | %.1f (%.0f%%) | %.1f (%.0f%%) | %.2f | %.1e |\n", type_name.c_str(),
                    s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), rows, tf, pct(tf), ti, pct(ti),
                    tf / ti, diff);
        std::fflush(stdout);
        step_float[ri] += tf * s.per_step;
        step_int8[ri] += ti * s.per_step;
      }
      for (void* p : w) CUDA_CHECK(cudaFree(p));
      CUDA_CHECK(cudaFree(in));
      CUDA_CHECK(cudaFree(act));
      CUDA_CHECK(cudaFree(out_float));
      CUDA_CHECK(cudaFree(out_int8));
    }
    for (size_t ri = 0; ri < row_counts.size(); ++ri) {
      char line[128];
      std::snprintf(line, sizeof line, "| %s | %d | %.2f | %.2f |\n", type_name.c_str(), row_counts[ri],
                    step_float[ri] / 1e3, step_int8[ri] / 1e3);
      summary += line;
    }
  }
  std::printf("\nGEMM time of one decode step's layers (32 x qkv, o, gate_up, down; the LM head is bf16):\n\n");
  std::printf("| type | rows | float ms | int8 ms |\n|---|---|---|---|\n%s", summary.c_str());
  if (!ok) {
    std::printf("\nquantized_gemv_bench: the paths DISAGREE (max rel diff >= %.0e)\n", kMaxPathDiff);
    return 1;
  }
  return 0;
}
