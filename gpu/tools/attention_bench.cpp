// Decode attention bandwidth: times gpu::paged_attention on Llama-3-8B's attention shape (32 query
// heads, 8 KV heads, head_dim 128, bf16 cache of 32 layers, 16-token blocks in shuffled order) and
// reports the K/V bytes read per second against the H200's 4.8 TB/s HBM3e peak. One JSON line per case.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/attention.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

using namespace tessera::gpu;

namespace {

void bench(int32_t batch, int32_t context, int num_sms) {
  const kv_layout layout{32, 8, 16, 128};
  const int32_t num_heads = 32, blocks_per_seq = (context + 15) / 16;
  const int64_t num_blocks = int64_t{batch} * blocks_per_seq;
  bf16* kv = nullptr;
  CUDA_CHECK(cudaMalloc(&kv, static_cast<size_t>(num_blocks * layout.block_elems()) * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(kv, 0, static_cast<size_t>(num_blocks * layout.block_elems()) * sizeof(bf16)));
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(1));
  std::vector<int32_t> ctx(static_cast<size_t>(batch), context), seq(static_cast<size_t>(batch));
  std::iota(seq.begin(), seq.end(), 0);
  auto upload = [](const std::vector<int32_t>& v) {
    int32_t* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
  };
  float* q = nullptr;
  bf16* out = nullptr;
  CUDA_CHECK(cudaMalloc(&q, size_t(batch) * num_heads * 128 * sizeof(float)));
  CUDA_CHECK(cudaMemset(q, 0, size_t(batch) * num_heads * 128 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&out, size_t(batch) * num_heads * 128 * sizeof(bf16)));
  paged_attention_args<bf16> a;
  a.out = out;
  a.out_stride = num_heads * 128;
  a.q = q;
  a.q_stride = num_heads * 128;
  a.kv_cache = kv;
  a.layout = layout;
  a.num_heads = num_heads;
  a.num_tokens = batch;
  a.context_lens = upload(ctx);
  a.token_seq = upload(seq);
  a.block_tables = upload(tables);
  a.max_blocks_per_seq = blocks_per_seq;
  a.scale = 0.088f;
  const split_plan plan = plan_attention_split(batch, 8, context, num_sms);
  a.num_splits = plan.num_splits;
  a.partition_size = plan.partition_size;
  float* ws = nullptr;
  if (plan.num_splits > 1) {
    CUDA_CHECK(cudaMalloc(&ws, size_t(attention_workspace_floats(batch, num_heads, 128, plan.num_splits)) * sizeof(float)));
    a.workspace = ws;
  }
  for (int i = 0; i < 3; ++i) paged_attention(a, nullptr);
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  const int iters = 20;
  CUDA_CHECK(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) paged_attention(a, nullptr);
  CUDA_CHECK(cudaEventRecord(t1));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  const double secs = ms / 1e3 / iters;
  const double bytes = double(batch) * context * 8 * 128 * 2 /*K,V*/ * 2 /*bf16*/;
  std::printf("{\"bench\": \"paged_attention\", \"batch\": %d, \"context\": %d, \"splits\": %d, \"us\": %.1f, "
              "\"GBps\": %.0f, \"pct_of_4800GBps\": %.1f}\n",
              batch, context, plan.num_splits, secs * 1e6, bytes / secs / 1e9, bytes / secs / 4.8e12 * 100);
  cudaFree(kv), cudaFree(q), cudaFree(out), cudaFree(ws);
  cudaFree(const_cast<int32_t*>(a.context_lens)), cudaFree(const_cast<int32_t*>(a.token_seq));
  cudaFree(const_cast<int32_t*>(a.block_tables));
  cudaEventDestroy(t0), cudaEventDestroy(t1);
}

}  // namespace

int main() {
  if (device_count() == 0) {
    std::fprintf(stderr, "gpu_attention_bench: no CUDA device\n");
    return 1;
  }
  int num_sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  bench(1, 32768, num_sms);
  bench(8, 32768, num_sms);
  bench(64, 4096, num_sms);
  bench(256, 1024, num_sms);
  return 0;
}
