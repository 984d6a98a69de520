// cuBLAS against gpu::small_batch_gemm (gpu/gemv.hpp) on the GEMMs of a Llama-3-8B decode step in
// bf16 (fp32 out), 1, 2, 4 and 8 rows: time per call from CUDA events and the share of the H200's
// 4.8 TB/s HBM peak that the bytes moved (weights + inputs + outputs) represent. Prints a markdown
// table (scripts/gpu-check.sh appends it to its results) and an estimate of the GEMM time of a whole
// decode step (32 layers + the LM head) with each.
//
// The cuBLAS call is the executor's (gemm() in gpu/cuda_executor.cpp). Each shape's weights are
// allocated as several copies, cycled through, totalling >= 256 MiB: one matrix of 32 MiB would
// otherwise stay in the 50 MiB L2 between calls and measure L2, not HBM, which a real step (7
// matrices per layer, 32 layers) never does. Both kernels' outputs are compared (max |diff| relative
// to the largest output) so a wrong kernel cannot look fast.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/gemv.hpp"
#include "gpu/kernels.hpp"
#include "gpu/tools/bench_timing.hpp"

using namespace tessera::gpu;

namespace {

constexpr double kPeakBytesPerSecond = 4.8e12;  // H200 HBM3e
constexpr size_t kMinWeightBytes = size_t{256} << 20;
constexpr small_batch_gemm_tuning kTunings[] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}};

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gemv_bench: cuBLAS error %s in %s\n", cublasGetStatusName(s), what);
    std::exit(1);
  }
}

struct shape {
  const char* name;
  int64_t n;
  int64_t k;
  int32_t per_step;  // how many times a decode step runs it (32 layers; the LM head once)
};

struct timing {
  double us = 0;
  double pct = 0;
};

template <class F>
timing time_calls(F&& call, int copies, double bytes) {
  timing t;
  t.us = tools::time_us(call, copies);
  t.pct = 100.0 * bytes / (t.us * 1e-6) / kPeakBytesPerSecond;
  return t;
}

// Random bf16 values (sd ~0.02, as trained weights) repeated from a 4 MiB pattern.
void fill(bf16* dev, size_t elems, uint32_t seed, float sd) {
  std::vector<uint16_t> pattern(std::min<size_t>(elems, size_t{2} << 20));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  for (auto& v : pattern) v = tessera::fp32_to_bf16(dist(rng));
  for (size_t at = 0; at < elems; at += pattern.size()) {
    const size_t n = std::min(pattern.size(), elems - at);
    CUDA_CHECK(cudaMemcpy(dev + at, pattern.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
}

}  // namespace

int main() {
  if (device_count() == 0) {
    std::printf("gemv_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  void* workspace = nullptr;
  const size_t workspace_bytes = size_t{32} << 20;  // as the executor
  CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  cublas_check(cublasSetWorkspace(h, workspace, workspace_bytes), "cublasSetWorkspace");

  const std::vector<shape> shapes = {
      {"qkv", 6144, 4096, 32},   {"o", 4096, 4096, 32},        {"gate_up", 28672, 4096, 32},
      {"down", 4096, 14336, 32}, {"lm_head", 128256, 4096, 1},
  };
  const std::vector<int32_t> row_counts = {1, 2, 4, 8};
  std::printf("### Small-batch GEMM vs cuBLAS (Llama-3-8B decode GEMMs, bf16 in, fp32 out) on %s\n\n", prop.name);
  std::printf(
      "µs per call; %% of %.1f TB/s for weights + inputs + outputs. gemv = small_batch_gemm with its\n"
      "automatic tuning (in brackets: w = warps per column, c = columns per warp); wXcY = that tuning\n"
      "forced.\n\n",
      kPeakBytesPerSecond / 1e12);
  std::printf("| GEMM | n x k | rows | cuBLAS µs (%%) | gemv µs (%%) |");
  for (const small_batch_gemm_tuning t : kTunings) std::printf(" w%dc%d µs |", t.warps_per_column, t.columns_per_warp);
  std::printf(" cuBLAS / gemv | max rel diff |\n|---|---|---|---|---|");
  for (size_t i = 0; i < std::size(kTunings); ++i) std::printf("---|");
  std::printf("---|---|\n");
  std::vector<double> step_cublas(row_counts.size(), 0.0), step_gemv(row_counts.size(), 0.0);
  bool ok = true;
  for (const shape& s : shapes) {
    const size_t w_elems = static_cast<size_t>(s.n * s.k);
    const size_t w_bytes = w_elems * sizeof(bf16);
    const int copies = static_cast<int>(std::max<size_t>(1, (kMinWeightBytes + w_bytes - 1) / w_bytes));
    std::vector<bf16*> w(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      CUDA_CHECK(cudaMalloc(&w[static_cast<size_t>(c)], w_bytes));
      fill(w[static_cast<size_t>(c)], w_elems, 1 + static_cast<uint32_t>(c), 0.02f);
    }
    bf16* in = nullptr;
    float *out_cublas = nullptr, *out_gemv = nullptr;
    CUDA_CHECK(cudaMalloc(&in, static_cast<size_t>(kMaxGemvRows * s.k) * sizeof(bf16)));
    fill(in, static_cast<size_t>(kMaxGemvRows * s.k), 99, 1.0f);
    CUDA_CHECK(cudaMalloc(&out_cublas, static_cast<size_t>(kMaxGemvRows * s.n) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&out_gemv, static_cast<size_t>(kMaxGemvRows * s.n) * sizeof(float)));

    for (size_t ri = 0; ri < row_counts.size(); ++ri) {
      const int32_t rows = row_counts[ri];
      const double bytes = double(w_bytes) + double(rows) * double(s.k) * 2 + double(rows) * double(s.n) * 4;
      const float alpha = 1.0f, beta = 0.0f;
      auto cublas = [&](int c) {
        cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), rows, static_cast<int>(s.k),
                                  &alpha, w[static_cast<size_t>(c)], CUDA_R_16BF, static_cast<int>(s.k), in,
                                  CUDA_R_16BF, static_cast<int>(s.k), &beta, out_cublas, CUDA_R_32F,
                                  static_cast<int>(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
      };
      const timing tc = time_calls(cublas, copies, bytes);
      // Every tuning, so the device run shows whether the automatic choice is the right one.
      std::string variants;
      for (const small_batch_gemm_tuning t : kTunings) {
        const timing tv = time_calls(
            [&](int c) {
              small_batch_gemm_with(w[static_cast<size_t>(c)], s.n, s.k, in, rows, out_gemv, s.n, false, t, nullptr);
            },
            copies, bytes);
        char cell[32];
        std::snprintf(cell, sizeof cell, " %.1f |", tv.us);
        variants += cell;
      }
      const timing tg = time_calls(
          [&](int c) {
            small_batch_gemm(w[static_cast<size_t>(c)], s.n, s.k, in, rows, out_gemv, s.n, false, nullptr);
          },
          copies, bytes);
      const small_batch_gemm_tuning chosen = small_batch_gemm_default_tuning(s.n, s.k, rows, sizeof(bf16));
      // Same weights for both, then compare.
      cublas(0);
      small_batch_gemm(w[0], s.n, s.k, in, rows, out_gemv, s.n, false, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const double diff = tools::max_rel_diff(out_gemv, out_cublas, static_cast<size_t>(rows * s.n));
      if (!(diff < 1e-3)) ok = false;
      std::printf("| %s | %lld x %lld | %d | %.1f (%.0f%%) | %.1f (%.0f%%) [w%d c%d] |%s %.2f | %.1e |\n", s.name,
                  static_cast<long long>(s.n), static_cast<long long>(s.k), rows, tc.us, tc.pct, tg.us, tg.pct,
                  chosen.warps_per_column, chosen.columns_per_warp, variants.c_str(), tc.us / tg.us, diff);
      std::fflush(stdout);
      step_cublas[ri] += tc.us * s.per_step;
      step_gemv[ri] += tg.us * s.per_step;
    }
    for (bf16* p : w) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaFree(in));
    CUDA_CHECK(cudaFree(out_cublas));
    CUDA_CHECK(cudaFree(out_gemv));
  }
  std::printf("\nGEMM time of one decode step (32 layers x qkv, o, gate_up, down + lm_head):\n\n");
  std::printf("| rows | cuBLAS ms | gemv ms |\n|---|---|---|\n");
  for (size_t ri = 0; ri < row_counts.size(); ++ri) {
    std::printf("| %d | %.2f | %.2f |\n", row_counts[ri], step_cublas[ri] / 1e3, step_gemv[ri] / 1e3);
  }
  cublasDestroy(h);
  cudaFree(workspace);
  if (!ok) {
    std::printf("\ngemv_bench: small_batch_gemm and cuBLAS DISAGREE (max rel diff >= 1e-3)\n");
    return 1;
  }
  return 0;
}
