// Host-callable launchers for the CUDA kernels of the LLaMA layer. Pointers are device pointers;
// every launcher is asynchronous on `stream` and throws (CUDA_CHECK) when the launch fails.
// Activations that feed a GEMM are in the weights' element type `T` (float or bf16); the residual
// stream, GEMM outputs, Q and the attention statistics are fp32.
// Every kernel has a CPU reference in tests/gpu/reference.hpp that tests/gpu/kernels_test.cpp
// compares it with.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Callable from host and device code (this header is also compiled by the host C++ compiler).
#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif

namespace tessera::gpu {

using bf16 = __nv_bfloat16;

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count() noexcept;

// out[r, :] = table[ids[r], :]   table [vocab, hidden], ids [rows], out [rows, hidden] f32.
// Ids outside [0, vocab) produce a zero row (ids are validated by the executor before this point).
void embedding_gather(float* out, const float* table, const int32_t* ids, int32_t rows, int32_t hidden,
                      int32_t vocab, cudaStream_t stream);
void embedding_gather(float* out, const bf16* table, const int32_t* ids, int32_t rows, int32_t hidden,
                      int32_t vocab, cudaStream_t stream);

// Fused residual add + RMSNorm: residual[r] += x[r]; out[r] = residual[r] / rms(residual[r]) * weight.
// x may be null (plain RMSNorm of residual). Shapes [rows, hidden]; one block per row.
void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream);
void add_rms_norm(bf16* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream);

// out[r] = rms_norm(x[row_index[r]]) * weight for r < rows: the final norm of only the rows whose
// logits were asked for.
void rms_norm_rows(float* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream);
void rms_norm_rows(bf16* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]   gate_up [rows, 2*inter] f32, out [rows, inter].
void silu_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);
void silu_and_mul(bf16* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);

// ---- the paged KV cache ----------------------------------------------------------------------
// One block holds every layer's K and V for `block_size` consecutive positions, contiguous (as the
// CPU executor's, so a swap or a copy-on-write is one contiguous copy per block):
//   element (block, layer, kind 0=K/1=V, kv_head, slot, d) at
//   block * block_elems + ((layer * 2 + kind) * num_kv_heads + kv_head) * block_size * head_dim
//                       + slot * head_dim + d
struct kv_layout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  TESSERA_HOST_DEVICE int64_t block_elems() const { return int64_t{num_layers} * 2 * num_kv_heads * block_size * head_dim; }
  TESSERA_HOST_DEVICE int64_t offset(int64_t block, int32_t layer, int32_t kind, int32_t kv_head, int32_t slot) const {
    return block * block_elems() +
           ((int64_t{layer} * 2 + kind) * num_kv_heads + kv_head) * block_size * head_dim + int64_t{slot} * head_dim;
  }
};

// What the decode (gpu/attention.hpp) and prefill (gpu/prefill_attention.hpp) attention kernels
// share: the query and output matrices, one layer of the paged cache read through block tables, and
// the split over positions (flash-decoding's split-KV: 1 = none; with more, split s covers positions
// [s * partition_size, (s + 1) * partition_size) and writes its partial (max, sum, unnormalised
// output) to `workspace`, which a second kernel merges).
template <class T>
struct paged_attention_common {
  T* out = nullptr;            // [tokens, out_stride], head h at columns h*head_dim
  int64_t out_stride = 0;
  const float* q = nullptr;    // [tokens, q_stride], head h at columns h*head_dim (RoPE applied)
  int64_t q_stride = 0;
  const T* kv_cache = nullptr;
  kv_layout layout;
  int32_t layer = 0;
  int32_t num_heads = 0;
  const int32_t* block_tables = nullptr;  // [rows, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  float scale = 1.0f;                     // 1/sqrt(head_dim)
  int32_t num_splits = 1;
  int32_t partition_size = 0;
  float* workspace = nullptr;
};

// How an attention launch splits over positions: num_splits == 1 is no split.
struct split_plan {
  int32_t num_splits = 1;
  int32_t partition_size = 0;
};

// RoPE fused with the KV write, for one layer. qkv [tokens, qkv_stride] f32 holds each token's
// Q (num_heads * head_dim) | K | V (num_kv_heads * head_dim each). Q and K are rotated in place
// (angle = position * inv_freq[i], cos/sin evaluated in double as the CPU executor does), then K and
// V are stored at slot_mapping[t] = block * block_size + offset of the cache.
// interleaved_pairs: pairs (2i, 2i+1) (GGUF llama) instead of (i, i + rope_dims/2) (HF rotate_half).
struct rope_kv_args {
  float* qkv = nullptr;
  int64_t qkv_stride = 0;
  const int32_t* positions = nullptr;
  const int32_t* slot_mapping = nullptr;
  const float* inv_freq = nullptr;  // [rope_dims / 2]
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t rope_dims = 0;
  bool interleaved_pairs = true;
  int32_t layer = 0;
  kv_layout layout;
};
void rope_kv_write(const rope_kv_args& a, float* kv_cache, cudaStream_t stream);
void rope_kv_write(const rope_kv_args& a, bf16* kv_cache, cudaStream_t stream);

// Copies whole blocks within the cache (copy-on-write): pairs [num_copies][2] = (src, dst) block ids.
// One launch for every copy of the step. block_bytes % 16 == 0 (checked: invalid_argument).
void block_copy(void* kv_cache, int64_t block_bytes, const int32_t* pairs, int32_t num_copies, cudaStream_t stream);

}  // namespace tessera::gpu
