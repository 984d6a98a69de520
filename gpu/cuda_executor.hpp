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
  double gpu_memory_utilization = 0.9;
  // Tokens per step the activation buffers are allocated for up front (they grow if a step has more).
  int32_t max_num_batched_tokens = 2048;
  // Replay decode steps (every sequence one new token, at most 256 sequences) from CUDA graphs
  // captured per (batch-size bucket, block-table width) on first use: one launch instead of ~9 per
  // layer. Off by default until verified on a GPU (docs/gpu_executor.md).
  bool cuda_graphs = false;
  // GEMMs of steps with at most 8 rows (gpu::kMaxGemvRows: small-batch decode) through the
  // weight-streaming kernel of gpu/gemv.hpp instead of cuBLAS. Unset: the environment variable
  // TESSERA_GEMV ("1" on, else off). Off by default until measured on a GPU (docs/gpu_executor.md).
  std::optional<bool> small_batch_gemm;
  // With num_device_blocks == 0: the budget that sizes the pool leaves room for this other model
  // (cuda_co_resident_for), and each block of the pool counts its kv_block_bytes too.
  cuda_co_resident co_resident;
  // Cut the KV blocks by layer groups (engine/model/kv_layer_groups.hpp), as the CPU executor's
  // option of the same name: a block holds one group's layers, each slice one table per group.
  bool kv_layer_groups = false;
  // Null: this executor's weights are its own.
  std::shared_ptr<cuda_weight_cache> weight_cache;
};

// True when the binary has the CUDA executor and a CUDA device is visible (never throws).
bool cuda_executor_available() noexcept;

// Throws invalid_request when no device is present or the options are unusable, load_error when the
// weights do not fit their config or the model's shape is not supported (head_dim 64/128/256).
std::unique_ptr<executor> make_cuda_executor(std::shared_ptr<const model_weights> weights,
                                             const cuda_executor_options& options);

// Bytes of one KV block of `block_size` positions for `dtype` (every layer's K and V, or
// `layers_per_block` layers' with KV layer groups).
int64_t cuda_kv_block_bytes(const model_config& config, int32_t block_size, cuda_dtype dtype,
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
