// The GPU sampler's time per step (gpu::sample_rows, one launch for every row) against the pinned
// device->host copy of the same logits rows that it replaces, for 1 / 32 / 256 rows of vocabularies
// 49152 and 128256 and a few parameter sets. Random normal logits (sd 2.5); CUDA events, 3 warm-up
// launches then the mean of 20. The numbers in docs/gpu_executor.md come from this.
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <vector>

#include "engine/sampler.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/sampling.hpp"
#include "gpu/sampling_batch.hpp"

namespace tessera {
namespace {

struct named_params {
  const char* name;
  sampling_params params;
};

std::vector<named_params> parameter_sets() {
  std::vector<named_params> sets(5);
  sets[0].name = "greedy", sets[0].params.temperature = 0.0f;
  sets[1].name = "T 0.8", sets[1].params.temperature = 0.8f;
  sets[2].name = "top_k 50 + top_p 0.9", sets[2].params.top_k = 50, sets[2].params.top_p = 0.9f;
  sets[3].name = "top_p 0.9", sets[3].params.top_p = 0.9f;
  sets[4].name = "top_p 0.9 + logprobs 5", sets[4].params.top_p = 0.9f, sets[4].params.logprobs = 5;
  for (named_params& s : sets) s.params.seed = 7;
  return sets;
}

float elapsed_us(cudaEvent_t start, cudaEvent_t stop, int iterations) {
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms * 1000.0f / static_cast<float>(iterations);
}

void run() {
  constexpr int max_rows = 256;
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (const int32_t vocab : {49152, 128256}) {
    const size_t floats = size_t{max_rows} * static_cast<size_t>(vocab);
    std::vector<float> host(floats);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.5f);
    for (float& x : host) x = normal(rng);
    float *logits = nullptr, *work = nullptr;
    void *inputs = nullptr, *outputs = nullptr, *pinned = nullptr;
    CUDA_CHECK(cudaMalloc(&logits, floats * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&work, floats * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&inputs, size_t{1} << 20));
    CUDA_CHECK(cudaMalloc(&outputs, size_t{1} << 20));
    CUDA_CHECK(cudaHostAlloc(&pinned, floats * sizeof(float), cudaHostAllocDefault));
    CUDA_CHECK(cudaMemcpy(logits, host.data(), floats * sizeof(float), cudaMemcpyHostToDevice));
    for (const int rows : {1, 32, max_rows}) {
      const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(vocab) * sizeof(float);
      CUDA_CHECK(cudaEventRecord(start));
      for (int i = 0; i < 10; ++i) CUDA_CHECK(cudaMemcpyAsync(pinned, logits, bytes, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaEventRecord(stop));
      std::printf("vocab %6d rows %3d  copy of the logits rows        %8.1f us\n", vocab, rows,
                  static_cast<double>(elapsed_us(start, stop, 10)));
      for (const named_params& set : parameter_sets()) {
        gpu::sampling_batch batch;
        for (int r = 0; r < rows; ++r) {
          sampler s(set.params, static_cast<uint64_t>(r), {});
          batch.add(*s.device_request(), r);
        }
        std::vector<char> packed(batch.input_bytes());
        batch.pack_inputs(packed.data());
        CUDA_CHECK(cudaMemcpy(inputs, packed.data(), packed.size(), cudaMemcpyHostToDevice));
        const gpu::sampling_kernel_args args = batch.kernel_args(inputs, outputs, logits, vocab, work);
        for (int i = 0; i < 3; ++i) gpu::sample_rows(args, nullptr);
        CUDA_CHECK(cudaEventRecord(start));
        for (int i = 0; i < 20; ++i) gpu::sample_rows(args, nullptr);
        CUDA_CHECK(cudaEventRecord(stop));
        std::printf("vocab %6d rows %3d  sample_rows %-22s %8.1f us\n", vocab, rows, set.name,
                    static_cast<double>(elapsed_us(start, stop, 20)));
      }
    }
    CUDA_CHECK(cudaFree(logits));
    CUDA_CHECK(cudaFree(work));
    CUDA_CHECK(cudaFree(inputs));
    CUDA_CHECK(cudaFree(outputs));
    CUDA_CHECK(cudaFreeHost(pinned));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
}

}  // namespace
}  // namespace tessera

int main() {
  if (tessera::gpu::device_count() == 0) {
    std::fprintf(stderr, "gpu_sampling_bench: no CUDA device\n");
    return 1;
  }
  tessera::run();
  return 0;
}
