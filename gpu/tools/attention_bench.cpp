// Attention kernels on Llama-3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128, bf16
// cache of 32 layers, 16-token blocks in shuffled order). One JSON line per case.
//   decode:  gpu::paged_attention, K/V bytes read per second against the H200's 4.8 TB/s HBM3e peak,
//            over a bf16 cache and over an fp8 one (--kv-cache-dtype fp8: half the bytes), the v2
//            kernel (warp tiles, the default) and v1 (v1_*);
//   prefill: gpu::prefill_attention (tiled: the tensor-core kernel, and its SIMT one as simt_*) against
//            paged_attention on the same causal prompt chunk,
//            as achieved TFLOP/s (4 * head_dim * heads FLOPs per visible (query, position) pair: the
//            QK^T and PV multiply-adds) and their ratio.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gpu/attention.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/fp8.hpp"
#include "gpu/kernels.hpp"
#include "gpu/prefill_attention.hpp"

using namespace tessera::gpu;

namespace {

// Mean seconds per call of f() over 20 calls after 3 warm-up calls.
template <class F>
double time_calls(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  const int iters = 20;
  CUDA_CHECK(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(t1));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  cudaEventDestroy(t0), cudaEventDestroy(t1);
  return ms / 1e3 / iters;
}

// C: the cache element, bf16 or fp8_e4m3. Times the v2 kernel (the default) and v1 on the same work.
template <class C>
void bench(int32_t batch, int32_t context, int num_sms) {
  const kv_layout layout{32, 8, 16, 128};
  const int32_t num_heads = 32, blocks_per_seq = (context + 15) / 16;
  const int64_t num_blocks = int64_t{batch} * blocks_per_seq;
  C* kv = nullptr;
  CUDA_CHECK(cudaMalloc(&kv, static_cast<size_t>(num_blocks * layout.block_elems()) * sizeof(C)));
  CUDA_CHECK(cudaMemset(kv, 0, static_cast<size_t>(num_blocks * layout.block_elems()) * sizeof(C)));
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
  paged_attention_args<bf16, C> a;
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
  int32_t* counters = nullptr;
  if (plan.num_splits > 1) {
    CUDA_CHECK(
        cudaMalloc(&ws, size_t(attention_workspace_floats(batch, num_heads, 128, plan.num_splits)) * sizeof(float)));
    a.workspace = ws;
    // The executor's fused merge (one launch): counters zeroed once, left zero by the kernel.
    CUDA_CHECK(cudaMalloc(&counters, size_t(batch) * num_heads * sizeof(int32_t)));
    CUDA_CHECK(cudaMemset(counters, 0, size_t(batch) * num_heads * sizeof(int32_t)));
    a.split_counters = counters;
  }
  const double secs = time_calls([&] { paged_attention(a, nullptr); });
  a.warp_tiles = false;
  const double v1_secs = time_calls([&] { paged_attention(a, nullptr); });
  const double bytes = double(batch) * context * 8 * 128 * 2 /*K,V*/ * sizeof(C);
  std::printf(
      "{\"bench\": \"paged_attention\", \"cache\": \"%s\", \"batch\": %d, \"context\": %d, \"splits\": %d, "
      "\"us\": %.1f, \"GBps\": %.0f, \"pct_of_4800GBps\": %.1f, \"v1_us\": %.1f, \"v1_pct_of_4800GBps\": %.1f}\n",
      sizeof(C) == 1 ? "fp8_e4m3" : "bf16", batch, context, plan.num_splits, secs * 1e6, bytes / secs / 1e9,
      bytes / secs / 4.8e12 * 100, v1_secs * 1e6, bytes / v1_secs / 4.8e12 * 100);
  cudaFree(kv), cudaFree(q), cudaFree(out), cudaFree(ws), cudaFree(counters);
  cudaFree(const_cast<int32_t*>(a.context_lens)), cudaFree(const_cast<int32_t*>(a.token_seq));
  cudaFree(const_cast<int32_t*>(a.block_tables));
}

// One sequence: `cached` positions already in the cache (a prefix hit; 0 for a fresh prompt), then a
// chunk of `chunk` new tokens attending causally. Both kernels compute the same output.
void bench_prefill(int32_t cached, int32_t chunk, int num_sms) {
  const kv_layout layout{32, 8, 16, 128};
  const int32_t num_heads = 32, head_dim = 128, context = cached + chunk, num_blocks = (context + 15) / 16;
  const size_t cache_elems = static_cast<size_t>(num_blocks * layout.block_elems());
  bf16* kv = nullptr;
  CUDA_CHECK(cudaMalloc(&kv, cache_elems * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(kv, 0, cache_elems * sizeof(bf16)));
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  std::vector<int32_t> ctx(static_cast<size_t>(chunk)), seq(static_cast<size_t>(chunk), 0);
  std::iota(ctx.begin(), ctx.end(), cached + 1);
  const int32_t tile_tokens = prefill_tile_tokens(head_dim, num_heads, 8);
  const std::vector<prefill_tile> tiles = plan_prefill_tiles({{0, chunk, cached, 0}}, tile_tokens);
  std::vector<void*> owned;
  auto upload = [&](const void* data, size_t bytes) {
    void* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, bytes));
    CUDA_CHECK(cudaMemcpy(d, data, bytes, cudaMemcpyHostToDevice));
    owned.push_back(d);
    return d;
  };
  const size_t q_elems = size_t(chunk) * num_heads * head_dim;
  float* q = nullptr;
  bf16* out = nullptr;
  CUDA_CHECK(cudaMalloc(&q, q_elems * sizeof(float)));
  CUDA_CHECK(cudaMemset(q, 0, q_elems * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&out, q_elems * sizeof(bf16)));
  const auto* tables_dev = static_cast<const int32_t*>(upload(table.data(), table.size() * sizeof(int32_t)));

  prefill_attention_args<bf16> p;
  p.out = out;
  p.out_stride = num_heads * head_dim;
  p.q = q;
  p.q_stride = num_heads * head_dim;
  p.kv_cache = kv;
  p.layout = layout;
  p.num_heads = num_heads;
  p.tiles = static_cast<const prefill_tile*>(upload(tiles.data(), tiles.size() * sizeof(prefill_tile)));
  p.num_tiles = static_cast<int32_t>(tiles.size());
  p.tile_tokens = tile_tokens;
  p.block_tables = tables_dev;
  p.max_blocks_per_seq = num_blocks;
  p.scale = 0.088f;
  const split_plan tiled_plan = plan_prefill_split(p.num_tiles, head_dim, num_heads, 8, context, num_sms);
  p.num_splits = tiled_plan.num_splits;
  p.partition_size = tiled_plan.partition_size;
  float* tiled_ws = nullptr;
  if (tiled_plan.num_splits > 1) {
    CUDA_CHECK(cudaMalloc(&tiled_ws, size_t(prefill_workspace_floats(p.num_tiles, tile_tokens, num_heads, head_dim,
                                                                     tiled_plan.num_splits)) *
                                         sizeof(float)));
    p.workspace = tiled_ws;
    // The executor's fused merge: counters zeroed once, left zero by the kernel.
    int32_t* counters = nullptr;
    CUDA_CHECK(cudaMalloc(&counters, size_t(p.num_tiles) * num_heads * sizeof(int32_t)));
    CUDA_CHECK(cudaMemset(counters, 0, size_t(p.num_tiles) * num_heads * sizeof(int32_t)));
    owned.push_back(counters);
    p.split_counters = counters;
  }
  // The tensor-core kernel (the executor's for bf16) and the SIMT one on the same work.
  const double tiled = time_calls([&] { prefill_attention(p, nullptr); });
  p.tensor_cores = false;
  const double simt = time_calls([&] { prefill_attention(p, nullptr); });

  paged_attention_args<bf16> a;
  a.out = out;
  a.out_stride = num_heads * head_dim;
  a.q = q;
  a.q_stride = num_heads * head_dim;
  a.kv_cache = kv;
  a.layout = layout;
  a.num_heads = num_heads;
  a.num_tokens = chunk;
  a.context_lens = static_cast<const int32_t*>(upload(ctx.data(), ctx.size() * sizeof(int32_t)));
  a.token_seq = static_cast<const int32_t*>(upload(seq.data(), seq.size() * sizeof(int32_t)));
  a.block_tables = tables_dev;
  a.max_blocks_per_seq = num_blocks;
  a.scale = 0.088f;
  const split_plan plan = plan_attention_split(chunk, 8, context, num_sms);  // as the executor would
  a.num_splits = plan.num_splits;
  a.partition_size = plan.partition_size;
  float* ws = nullptr;
  if (plan.num_splits > 1) {
    CUDA_CHECK(cudaMalloc(
        &ws, size_t(attention_workspace_floats(chunk, num_heads, head_dim, plan.num_splits)) * sizeof(float)));
    a.workspace = ws;
  }
  const double per_token = time_calls([&] { paged_attention(a, nullptr); });

  // Visible (query, position) pairs: query i of the chunk sees cached + i + 1 positions.
  const double pairs = double(chunk) * cached + double(chunk) * (chunk + 1) / 2;
  const double flops = 4.0 * head_dim * num_heads * pairs;
  std::printf(
      "{\"bench\": \"prefill_attention\", \"cached\": %d, \"chunk\": %d, \"tile_tokens\": %d, "
      "\"tiled_splits\": %d, \"tiled_us\": %.1f, \"tiled_TFLOPs\": %.2f, \"simt_us\": %.1f, "
      "\"simt_TFLOPs\": %.2f, \"paged_splits\": %d, \"paged_us\": %.1f, \"paged_TFLOPs\": %.2f, "
      "\"speedup\": %.2f, \"speedup_over_simt\": %.2f}\n",
      cached, chunk, tile_tokens, tiled_plan.num_splits, tiled * 1e6, flops / tiled / 1e12, simt * 1e6,
      flops / simt / 1e12, plan.num_splits, per_token * 1e6, flops / per_token / 1e12, per_token / tiled, simt / tiled);
  cudaFree(kv), cudaFree(q), cudaFree(out), cudaFree(ws), cudaFree(tiled_ws);
  for (void* d : owned) cudaFree(d);
}

}  // namespace

int main() {
  if (device_count() == 0) {
    std::fprintf(stderr, "gpu_attention_bench: no CUDA device\n");
    return 1;
  }
  int num_sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  for (const auto& [batch, context] : {std::pair{1, 32768}, {8, 32768}, {64, 4096}, {256, 1024}}) {
    bench<bf16>(batch, context, num_sms);
    bench<fp8_e4m3>(batch, context, num_sms);
  }
  bench_prefill(0, 4096, num_sms);    // a 4k-token prompt
  bench_prefill(3584, 512, num_sms);  // a 512-token chunk after 3.5k cached positions (chunked prefill / prefix hit)
  bench_prefill(16384, 64, num_sms);  // 64 new tokens after a 16k cached prefix (multi-turn chat): split
  return 0;
}
