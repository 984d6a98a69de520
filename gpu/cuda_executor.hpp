// The CUDA executor: the LLaMA forward pass on one GPU behind engine/executor.hpp, so the scheduler,
// block manager, sampler and actors are the same as with the CPU executor. Weights live on the GPU
// in bf16 (or fp32 for exact comparisons) with Q|K|V and gate|up fused into one matrix each; GEMMs run
// through cuBLAS with fp32 accumulation; the KV cache is a paged pool in GPU memory (same block layout
// as the CPU executor's) with a pinned host swap pool. See docs/gpu_executor.md.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/executor.hpp"
#include "engine/model/model_weights.hpp"

namespace tessera {

enum class cuda_dtype {
  bf16,  // weights, KV cache and GEMM inputs in bf16 (what serving uses)
  f32,   // everything fp32 (pure fp32 GEMMs, no TF32): matches the CPU executor's exact path
};

// The KV cache's element type.
enum class cuda_kv_dtype {
  automatic,  // the compute dtype's (bf16 or fp32)
  // FP8 E4M3 (gpu/fp8.hpp) under bf16 compute: half the bytes per block, so twice the blocks in the
  // same memory and half the bytes attention reads. Quantised in the KV write (round to nearest even,
  // saturating), dequantised in both attention kernels; per-tensor scales (vLLM's --kv-cache-dtype fp8).
  fp8_e4m3,
};

// Another model on the same GPU whose KV pool is sized with this one's: the draft model of
// --speculative draft. Its pool gets as many blocks as this one (of its own size), as vLLM sizes a
// draft's cache with its target's, so the draft never runs out of room before the target does.
struct cuda_co_resident {
  int64_t bytes = 0;           // its weights and buffers (and a pool of fixed size): kept free
  int64_t kv_block_bytes = 0;  // its KV bytes per block of this pool
};

// Device copies of weight matrices that CUDA executors on one GPU share. A --draft-layers draft's
// tensors are its target's own (engine/speculative/layer_draft.hpp): with one cache in both executors'
// options each matrix is uploaded once and both read it. Keyed by the host tensors (data, rows, stride,
// type) and the compute dtype, so it serves executors whose weights are alive at the same time; a
// device copy lives as long as an executor that uses it.
class cuda_weight_cache;
std::shared_ptr<cuda_weight_cache> make_cuda_weight_cache();

struct cuda_executor_options {
  int device = 0;
  cuda_dtype dtype = cuda_dtype::bf16;
  // block_size and num_host_blocks are used as given; num_device_blocks as given when > 0, else as
  // many blocks as fit in gpu_memory_utilization * total GPU memory once weights and activation
  // buffers are allocated (as vLLM's --gpu-memory-utilization).
  kv_cache_spec kv;
  cuda_kv_dtype kv_dtype = cuda_kv_dtype::automatic;  // fp8_e4m3 needs dtype bf16 (invalid_request)
  double gpu_memory_utilization = 0.9;
  // Tokens per step the activation buffers are allocated for up front (they grow if a step has more).
  int32_t max_num_batched_tokens = 2048;
  // Replay decode steps (every sequence one new token, at most 256 sequences) from CUDA graphs
  // captured per (batch-size bucket, block-table width) on first use: one launch instead of ~9 per
  // layer. On by default since an H200 ran it token for token with eager steps, 1.10x faster at
  // batch 1 (docs/benchmarks.md, 2026-12-04); false is vLLM's --enforce-eager.
  bool cuda_graphs = true;
  // GEMMs of steps with at most this many rows (0 .. gpu::kMaxGemvRows) through the weight-streaming
  // kernel of gpu/gemv.hpp instead of cuBLAS. Unset: gpu::small_batch_gemm_rows_from_env(), 1 unless
  // TESSERA_GEMV says otherwise: on the H200 the kernel beat cuBLAS at 1 row (4.06 against 4.29 ms of
  // a Llama-3-8B decode step's GEMMs) and lost at 2, 4 and 8 (docs/gpu_executor.md).
  std::optional<int32_t> small_batch_gemm_rows;
  // With num_device_blocks == 0: the budget that sizes the pool leaves room for this other model
  // (cuda_co_resident_for), and each block of the pool counts its kv_block_bytes too.
  cuda_co_resident co_resident;
  // Cut the KV blocks by layer groups (engine/model/kv_layer_groups.hpp), as the CPU executor's
  // option of the same name: a block holds one group's layers, each slice one table per group.
  bool kv_layer_groups = false;
  // With bf16 compute, GGUF layer matrices of a type gpu/quantized_gemm.hpp reads (Q8_0, Q4_0, Q4_1,
  // Q4_K, Q6_K; every part of a fused Q|K|V or gate|up of one type) stay in their blocks on the GPU:
  // a quarter to a half of bf16's bytes, which a decode step streams once. false (tessera's
  // --dequantize-weights): every matrix dequantised to bf16 at load. The embedding and LM head are
  // bf16 either way.
  bool quantized_weights = true;
  // Steps of at most gpu::kMaxQuantizedGemvRows rows multiply those matrices through the int8 path of
  // gpu/quantized_gemm.hpp (the rows quantised to int8 as the CPU executor quantises them, dp4a dot
  // products: llama.cpp's mmvq) instead of dequantising each weight to float. Unset:
  // gpu::int8_quantized_gemv_from_env() (TESSERA_QGEMV=int8), off otherwise until a GPU has measured
  // both (docs/gpu_executor.md).
  std::optional<bool> int8_quantized_gemv;
  // Steps of more rows, up to this many, multiply those matrices with gpu::quantized_tiled_gemm (the
  // blocks dequantised tile by tile in shared memory, tensor cores) instead of dequantising the whole
  // matrix to bf16 for cuBLAS; 0: never. Unset: gpu::quantized_tiled_gemm_rows_from_env()
  // (TESSERA_QGEMM_ROWS, default 256; not yet measured on a GPU).
  std::optional<int32_t> quantized_tiled_gemm_rows;
  // Sequences bringing at least this many new tokens to an eager step take the tiled prefill
  // attention kernel, the others the decode kernel (graph steps: always the decode kernel). Unset:
  // gpu::prefill_min_tokens_from_env() (TESSERA_PREFILL_MIN_TOKENS, default 4; not yet tuned on a GPU).
  std::optional<int32_t> prefill_min_tokens;
  // Decode attention with gpu/attention.hpp's staged kernel (v3: each warp's next tile copied by
  // cp.async while it computes the current one) instead of v2; bf16 compute only. Unset:
  // gpu::decode_kernel_from_env() (TESSERA_DECODE_ATTENTION=v1|v2|v3, default v2 until a GPU has
  // timed v3).
  std::optional<bool> staged_decode_attention;
  // Null: this executor's weights are its own.
  std::shared_ptr<cuda_weight_cache> weight_cache;
};

// True when the binary has the CUDA executor and a CUDA device is visible (never throws).
bool cuda_executor_available() noexcept;

// Throws invalid_request when no device is present or the options are unusable, load_error when the
// weights do not fit their config or the model's shape is not supported (head_dim 64/128/256).
std::unique_ptr<executor> make_cuda_executor(std::shared_ptr<const model_weights> weights,
                                             const cuda_executor_options& options);

// Bytes of one KV block of `block_size` positions for `dtype` and `kv_dtype` (every layer's K and V,
// or `layers_per_block` layers' with KV layer groups).
int64_t cuda_kv_block_bytes(const model_config& config, int32_t block_size, cuda_dtype dtype, cuda_kv_dtype kv_dtype,
                            int32_t layers_per_block = 0);

// What a CUDA executor of `weights` with `options` will hold on the GPU besides a pool sized with its
// target's: its weights in the compute dtype, its activation and logit buffers, cuBLAS' workspace,
// and its pool when options.kv.num_device_blocks fixes it (then kv_block_bytes is 0). An estimate
// from the shapes (buffers that grow later, for longer steps, are not in it); the sizing's reserve
// covers those. With `shares_with` (its target, when both executors have one weight cache), the
// matrices that are shares_with's own tensors are not counted: they are on the GPU once.
cuda_co_resident cuda_co_resident_for(const model_weights& weights, const cuda_executor_options& options,
                                      const model_weights* shares_with = nullptr);

}  // namespace tessera
