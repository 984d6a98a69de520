// Attention kernels on Llama-3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128, bf16
// cache of 32 layers, 16-token blocks in shuffled order), prefill on Gemma-2-9B's too (head_dim 256).
// One JSON line per case.
//   decode:  gpu::paged_attention, K/V bytes read per second against the H200's 4.8 TB/s HBM3e peak,
//            over a bf16 cache and over an fp8 one (--kv-cache-dtype fp8: half the bytes), the v2
//            kernel (warp tiles, the default) and v1 (v1_*), and the tensor-core prefill kernel on
//            1-token tiles (tc_*) and the staged v3 (v3_*: cp.async pipeline); each kernel's resident
//            CTAs per SM (the occupancy its split plan fills a wave of), and v2 once more with the
//            split planned for 4 CTAs per SM (wave4_*: the fixed figure the plan used before);
//   prefill: gpu::prefill_attention (tiled: the tensor-core kernel, and its SIMT one as simt_*, with their
//            resident CTAs per SM) against
//            paged_attention on the same causal prompt chunk,
//            as achieved TFLOP/s (4 * head_dim * heads FLOPs per visible (query, position) pair: the
//            QK^T and PV multiply-adds) and their ratio.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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

// The device buffers of one bench case, freed together when it ends.
class device_buffers {
 public:
  device_buffers() = default;
  device_buffers(const device_buffers&) = delete;
  device_buffers& operator=(const device_buffers&) = delete;
  ~device_buffers() {
    for (void* d : owned_) cudaFree(d);
  }
  template <class T>
  T* zeros(size_t n) {
    T* d = alloc<T>(n);
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(T)));
    return d;
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* d = alloc<T>(v.size());
    CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }

 private:
  template <class T>
  T* alloc(size_t n) {
    void* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, n) * sizeof(T)));
    owned_.push_back(d);
    return static_cast<T*>(d);
  }
  std::vector<void*> owned_;
};

// p's split as the executor plans it for its tiles reading at most `context` positions (a wave of
// its kernel), with the workspace and the counters of the fused merge (zeroed once, left zero by the
// kernel).
template <class C>
split_plan plan_split(prefill_attention_args<bf16, C>& p, int32_t context, const cta_slots& slots,
                      device_buffers& mem) {
  const int32_t head_dim = p.layout.head_dim;
  const split_plan plan = plan_prefill_split(prefill_kernel_of(p), p.num_tiles, head_dim, p.num_heads,
                                             p.layout.num_kv_heads, context, slots);
  p.num_splits = plan.num_splits;
  p.partition_size = plan.partition_size;
  if (plan.num_splits > 1) {
    p.workspace = mem.zeros<float>(
        size_t(prefill_workspace_floats(p.num_tiles, p.tile_tokens, p.num_heads, head_dim, plan.num_splits)));
    p.split_counters = mem.zeros<int32_t>(size_t(p.num_tiles) * p.num_heads);
  }
  return plan;
}

// C: the cache element, bf16 or fp8_e4m3. Times the v2 kernel (the default) and v1 on the same work.
template <class C>
void bench(int32_t batch, int32_t context, int num_sms) {
  const kv_layout layout{32, 8, 16, 128};
  const int32_t num_heads = 32, blocks_per_seq = (context + 15) / 16;
  const int64_t num_blocks = int64_t{batch} * blocks_per_seq;
  device_buffers mem;
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(1));
  std::vector<int32_t> ctx(static_cast<size_t>(batch), context), seq(static_cast<size_t>(batch));
  std::iota(seq.begin(), seq.end(), 0);
  paged_attention_args<bf16, C> a;
  a.out = mem.zeros<bf16>(size_t(batch) * num_heads * 128);
  a.out_stride = num_heads * 128;
  a.q = mem.zeros<float>(size_t(batch) * num_heads * 128);
  a.q_stride = num_heads * 128;
  a.kv_cache = mem.zeros<C>(static_cast<size_t>(num_blocks * layout.block_elems()));
  a.layout = layout;
  a.num_heads = num_heads;
  a.num_tokens = batch;
  a.context_lens = mem.upload(ctx);
  a.token_seq = mem.upload(seq);
  a.block_tables = mem.upload(tables);
  a.max_blocks_per_seq = blocks_per_seq;
  a.scale = 0.088f;
  // Each decode kernel with its split planned for a wave of it (as the executor plans it), and v2 once
  // more with the plan for 4 CTAs per SM (the fixed figure the plan used before it asked).
  auto ctas_of = [&](decode_kernel k) {
    a.kernel = k;
    return paged_attention_ctas_per_sm(a);
  };
  const int32_t v1_ctas = ctas_of(decode_kernel::thread_rows), v2_ctas = ctas_of(decode_kernel::warp_tiles),
                v3_ctas = ctas_of(decode_kernel::staged_warp_tiles);
  auto plan_for = [&](int32_t per_sm) { return plan_attention_split(batch, num_heads, 8, context, {num_sms, per_sm}); };
  // The executor's fused merge (one launch): counters zeroed once, left zero by the kernel; the
  // workspace sized for the most splits of the plans timed.
  int32_t most_splits = 1;
  for (const int32_t per_sm : {v1_ctas, v2_ctas, v3_ctas, 4})
    most_splits = std::max(most_splits, plan_for(per_sm).num_splits);
  if (most_splits > 1) {
    a.split_counters = mem.zeros<int32_t>(size_t(batch) * num_heads);
    a.workspace = mem.zeros<float>(size_t(attention_workspace_floats(batch, num_heads, 128, most_splits)));
  }
  struct decode_run {
    int32_t splits = 1;
    double us = 0;
  };
  auto run = [&](decode_kernel k, int32_t per_sm) {
    const split_plan plan = plan_for(per_sm);
    a.kernel = k;
    a.num_splits = plan.num_splits;
    a.partition_size = plan.partition_size;
    return decode_run{plan.num_splits, time_calls([&] { paged_attention(a, nullptr); }) * 1e6};
  };
  const decode_run wave4 = run(decode_kernel::warp_tiles, 4), v1 = run(decode_kernel::thread_rows, v1_ctas),
                   v3 = run(decode_kernel::staged_warp_tiles, v3_ctas), v2 = run(decode_kernel::warp_tiles, v2_ctas);

  // The same decode work on the tensor-core prefill kernel, one 1-token tile per sequence (its CTA's
  // 64 rows hold the token's 4 query heads): FlashInfer's choice for GQA decode, for the device to
  // weigh against the decode kernels (tc_*).
  std::vector<prefill_tile> one_token_tiles;
  for (int32_t s = 0; s < batch; ++s) one_token_tiles.push_back({s, 1, context - 1, s});
  prefill_attention_args<bf16, C> p;
  static_cast<paged_attention_common<bf16, C>&>(p) = a;
  p.tile_tokens = prefill_tile_tokens(prefill_kernel_of(p), 128, num_heads, 8);
  p.tiles = mem.upload(one_token_tiles);
  p.num_tiles = batch;
  const int32_t tc_ctas_per_sm = prefill_attention_ctas_per_sm(p, /*with_trees=*/false);
  const split_plan tc_plan = plan_split(p, context, {num_sms, tc_ctas_per_sm}, mem);
  const double tc_secs = time_calls([&] { prefill_attention(p, nullptr); });

  const double bytes = double(batch) * context * 8 * 128 * 2 /*K,V*/ * sizeof(C);
  auto pct = [&](double us) { return bytes / (us * 1e-6) / 4.8e12 * 100; };
  const double tc_us = tc_secs * 1e6;
  std::printf(
      "{\"bench\": \"paged_attention\", \"cache\": \"%s\", \"batch\": %d, \"context\": %d, \"ctas_per_sm\": %d, "
      "\"splits\": %d, \"us\": %.1f, \"GBps\": %.0f, \"pct_of_4800GBps\": %.1f, \"wave4_splits\": %d, "
      "\"wave4_us\": %.1f, \"v1_ctas_per_sm\": %d, \"v1_splits\": %d, \"v1_us\": %.1f, \"v1_pct_of_4800GBps\": %.1f, "
      "\"v3_ctas_per_sm\": %d, \"v3_splits\": %d, \"v3_us\": %.1f, \"v3_pct_of_4800GBps\": %.1f, "
      "\"tc_ctas_per_sm\": %d, \"tc_splits\": %d, \"tc_us\": %.1f, \"tc_pct_of_4800GBps\": %.1f}\n",
      sizeof(C) == 1 ? "fp8_e4m3" : "bf16", batch, context, v2_ctas, v2.splits, v2.us, bytes / v2.us / 1e3, pct(v2.us),
      wave4.splits, wave4.us, v1_ctas, v1.splits, v1.us, pct(v1.us), v3_ctas, v3.splits, v3.us, pct(v3.us),
      tc_ctas_per_sm, tc_plan.num_splits, tc_us, pct(tc_us));
}

// An attention shape: Llama-3-8B's (32 query heads over 8 KV heads, head_dim 128, 32 layers) or
// Gemma-2-9B's (16 over 8, head_dim 256, 42 layers; its soft-cap and windows left out).
struct attention_shape {
  const char* name;
  int32_t num_layers, num_heads, num_kv_heads, head_dim;
};
constexpr attention_shape llama3_8b{"llama3-8b", 32, 32, 8, 128};
constexpr attention_shape gemma2_9b{"gemma2-9b", 42, 16, 8, 256};

// One sequence: `cached` positions already in the cache (a prefix hit; 0 for a fresh prompt), then a
// chunk of `chunk` new tokens attending causally. Both kernels compute the same output, each over the
// tiles cut for it (head_dim 256: 64 rows a CTA on tensor cores, 24 in SIMT).
void bench_prefill(const attention_shape& shape, int32_t cached, int32_t chunk, int num_sms) {
  const kv_layout layout{shape.num_layers, shape.num_kv_heads, 16, shape.head_dim};
  const int32_t num_heads = shape.num_heads, num_kv_heads = shape.num_kv_heads, head_dim = shape.head_dim;
  const int32_t context = cached + chunk, num_blocks = (context + 15) / 16;
  device_buffers mem;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  std::vector<int32_t> ctx(static_cast<size_t>(chunk)), seq(static_cast<size_t>(chunk), 0);
  std::iota(ctx.begin(), ctx.end(), cached + 1);
  const size_t q_elems = size_t(chunk) * num_heads * head_dim;
  paged_attention_common<bf16> common;  // what every kernel here reads and writes
  common.out = mem.zeros<bf16>(q_elems);
  common.out_stride = num_heads * head_dim;
  common.q = mem.zeros<float>(q_elems);
  common.q_stride = num_heads * head_dim;
  common.kv_cache = mem.zeros<bf16>(static_cast<size_t>(num_blocks * layout.block_elems()));
  common.layout = layout;
  common.num_heads = num_heads;
  common.block_tables = mem.upload(table);
  common.max_blocks_per_seq = num_blocks;
  common.scale = 1.0f / std::sqrt(float(head_dim));

  // The tensor-core kernel (the executor's for bf16) and the SIMT one on the same work, each with the
  // executor's tiles and split plan (a split's counters zeroed once, left zero by the kernel).
  struct tiled_run {
    double us = 0;
    int32_t tile_tokens = 0, splits = 1, ctas_per_sm = 0;
  };
  auto run_tiled = [&](bool tensor_cores) {
    prefill_attention_args<bf16> p;
    static_cast<paged_attention_common<bf16>&>(p) = common;
    p.tensor_cores = tensor_cores;
    p.tile_tokens = prefill_tile_tokens(prefill_kernel_of(p), head_dim, num_heads, num_kv_heads);
    const std::vector<prefill_tile> tiles = plan_prefill_tiles({{0, chunk, cached, 0}}, p.tile_tokens);
    p.tiles = mem.upload(tiles);
    p.num_tiles = static_cast<int32_t>(tiles.size());
    const int32_t ctas_per_sm = prefill_attention_ctas_per_sm(p, /*with_trees=*/false);
    const split_plan plan = plan_split(p, context, {num_sms, ctas_per_sm}, mem);
    return tiled_run{time_calls([&] { prefill_attention(p, nullptr); }) * 1e6, p.tile_tokens, plan.num_splits,
                     ctas_per_sm};
  };
  const tiled_run tiled = run_tiled(true), simt = run_tiled(false);

  paged_attention_args<bf16> a;
  static_cast<paged_attention_common<bf16>&>(a) = common;
  a.num_tokens = chunk;
  a.context_lens = mem.upload(ctx);
  a.token_seq = mem.upload(seq);
  const split_plan plan =  // as the executor would
      plan_attention_split(chunk, num_heads, num_kv_heads, context, {num_sms, paged_attention_ctas_per_sm(a)});
  a.num_splits = plan.num_splits;
  a.partition_size = plan.partition_size;
  if (plan.num_splits > 1) {
    a.workspace = mem.zeros<float>(size_t(attention_workspace_floats(chunk, num_heads, head_dim, plan.num_splits)));
  }
  const double per_token_us = time_calls([&] { paged_attention(a, nullptr); }) * 1e6;

  // Visible (query, position) pairs: query i of the chunk sees cached + i + 1 positions.
  const double pairs = double(chunk) * cached + double(chunk) * (chunk + 1) / 2;
  const double mflop = 4.0 * head_dim * num_heads * pairs / 1e6;  // MFLOP per µs = TFLOP/s
  std::printf(
      "{\"bench\": \"prefill_attention\", \"shape\": \"%s\", \"cached\": %d, \"chunk\": %d, "
      "\"tile_tokens\": %d, \"tiled_ctas_per_sm\": %d, \"tiled_splits\": %d, \"tiled_us\": %.1f, "
      "\"tiled_TFLOPs\": %.2f, \"simt_tile_tokens\": %d, \"simt_ctas_per_sm\": %d, \"simt_splits\": %d, "
      "\"simt_us\": %.1f, \"simt_TFLOPs\": %.2f, \"paged_splits\": %d, \"paged_us\": %.1f, "
      "\"paged_TFLOPs\": %.2f, \"speedup\": %.2f, \"speedup_over_simt\": %.2f}\n",
      shape.name, cached, chunk, tiled.tile_tokens, tiled.ctas_per_sm, tiled.splits, tiled.us, mflop / tiled.us,
      simt.tile_tokens, simt.ctas_per_sm, simt.splits, simt.us, mflop / simt.us, plan.num_splits, per_token_us,
      mflop / per_token_us, per_token_us / tiled.us, simt.us / tiled.us);
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
  for (const attention_shape& shape : {llama3_8b, gemma2_9b}) {
    bench_prefill(shape, 0, 4096, num_sms);    // a 4k-token prompt
    bench_prefill(shape, 3584, 512, num_sms);  // a 512-token chunk after 3.5k cached (chunked prefill / prefix hit)
    bench_prefill(shape, 16384, 64, num_sms);  // 64 new tokens after a 16k cached prefix (multi-turn chat): split
  }
  return 0;
}
