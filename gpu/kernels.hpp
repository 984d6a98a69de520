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
struct fp8_e4m3;  // gpu/fp8.hpp: the element of an fp8 KV cache

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count() noexcept;

// out[r, :] = table[ids[r], :] * scale   table [vocab, hidden], ids [rows], out [rows, hidden] f32.
// Ids outside [0, vocab) produce a zero row (ids are validated by the executor before this point).
// scale: Gemma's sqrt(hidden) embedding multiplier (1 for the others), applied in fp32 as the CPU
// executor does.
void embedding_gather(float* out, const float* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream, float scale = 1.0f);
void embedding_gather(float* out, const bf16* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream, float scale = 1.0f);

// Fused residual add + RMSNorm: residual[r] += x[r]; out[r] = residual[r] / rms(residual[r]) * weight.
// x may be null (plain RMSNorm of residual). Shapes [rows, hidden]; one block per row.
void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream);
void add_rms_norm(bf16* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream);

// A post-norm on a sub-layer's output y before the residual add (Gemma 2/3: post_attention_layernorm,
// post_feedforward_layernorm), fused with the next pre-norm:
//   residual[r] += rms_norm(y[r]) * post_weight;  out[r] = rms_norm(residual[r]) * weight.
// out may be null (only the residual update). One launch instead of two, and y is read once.
void post_norm_add_rms_norm(float* out, float* residual, const float* y, const float* post_weight, const float* weight,
                            int32_t rows, int32_t hidden, float eps, cudaStream_t stream);
void post_norm_add_rms_norm(bf16* out, float* residual, const float* y, const float* post_weight, const float* weight,
                            int32_t rows, int32_t hidden, float eps, cudaStream_t stream);

// out[r] = rms_norm(x[row_index[r]]) * weight for r < rows: the final norm of only the rows whose
// logits were asked for. With y and post_weight (post-norm models, after the last layer), the row is
// x[i] + rms_norm(y[i]) * post_weight, i = row_index[r] (x is not written: only these rows matter).
void rms_norm_rows(float* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream, const float* y = nullptr,
                   const float* post_weight = nullptr);
void rms_norm_rows(bf16* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream, const float* y = nullptr,
                   const float* post_weight = nullptr);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]   gate_up [rows, 2*inter] f32, out [rows, inter].
void silu_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);
void silu_and_mul(bf16* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);

// GeGLU: out[r, i] = gelu_tanh(gate_up[r, i]) * gate_up[r, inter + i], GELU's tanh approximation
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016; transformers'
// gelu_pytorch_tanh, Gemma's hidden_activation). Same shapes as silu_and_mul.
void gelu_tanh_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);
void gelu_tanh_and_mul(bf16* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);

// Logit soft-capping in place: x[i] = cap * tanh(x[i] / cap) for i < n (Gemma 2 report, sec. 2; the
// final logits, before sampling). cap > 0.
void soft_cap(float* x, int64_t n, float cap, cudaStream_t stream);

// ---- the paged KV cache ----------------------------------------------------------------------
// One block holds every layer's K and V for `block_size` consecutive positions, contiguous (as the
// CPU executor's, so a swap or a copy-on-write is one contiguous copy per block):
//   element (block, layer, kind 0=K/1=V, kv_head, slot, d) at
//   block * block_elems + ((layer * 2 + kind) * num_kv_heads + kv_head) * block_size * head_dim
//                       + slot * head_dim + d
struct kv_layout {
  int32_t num_layers = 0;  // layers per block: every layer, or one KV layer group's
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  TESSERA_HOST_DEVICE int64_t block_elems() const {
    return int64_t{num_layers} * 2 * num_kv_heads * block_size * head_dim;
  }
  TESSERA_HOST_DEVICE int64_t offset(int64_t block, int32_t layer, int32_t kind, int32_t kv_head, int32_t slot) const {
    return block * block_elems() + ((int64_t{layer} * 2 + kind) * num_kv_heads + kv_head) * block_size * head_dim +
           int64_t{slot} * head_dim;
  }
};

// Token trees (SpecInfer, sequence_slice::tree_parents). A tree's rows are consecutive query tokens,
// its root first; row r sits at position base + depth(r) (its RoPE angle and window) but its K/V is in
// the slot of position base + r, base being the root's position. So a tree token's context_lens is its
// slot + 1, and it sees the context before the tree (within its window) and, of the tree's slots, its
// ancestors and itself only: bit r of its mask, and (with a window) a key position inside the window.
struct tree_attention_view {
  const int32_t* root = nullptr;         // [num_tokens]: the query token of its tree's root; -1 outside a tree
  const int32_t* positions = nullptr;    // [num_tokens]: each token's position (a tree row's: base + depth)
  const int32_t* mask_offset = nullptr;  // [num_tokens]: where its ancestor bits start in `mask`
  const uint32_t* mask = nullptr;        // bit r of word r / 32 from mask_offset: tree row r is visible
};

// What the decode (gpu/attention.hpp) and prefill (gpu/prefill_attention.hpp) attention kernels
// share: the query and output matrices, one layer of the paged cache read through block tables, and
// the split over positions (flash-decoding's split-KV: 1 = none; with more, split s covers positions
// [s * partition_size, (s + 1) * partition_size) and writes its partial (max, sum, unnormalised
// output) to `workspace`, which a second kernel merges).
// The cache's element type C is the output's (T: float or bf16) or, under bf16, fp8_e4m3
// (gpu/fp8.hpp): then the cache holds K / k_scale and V / v_scale, and the kernels multiply back.
template <class T, class C = T>
struct paged_attention_common {
  T* out = nullptr;  // [tokens, out_stride], head h at columns h*head_dim
  int64_t out_stride = 0;
  const float* q = nullptr;  // [tokens, q_stride], head h at columns h*head_dim (RoPE applied)
  int64_t q_stride = 0;
  const C* kv_cache = nullptr;
  float k_scale = 1.0f;  // per-tensor scales of a quantised cache (1 for float and bf16)
  float v_scale = 1.0f;
  kv_layout layout;
  int32_t layer = 0;  // the layer's index in a block (its slot in its KV layer group; kv_layout)
  int32_t num_heads = 0;
  const int32_t* block_tables = nullptr;  // [rows, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  float scale = 1.0f;  // 1/sqrt(head_dim), or the model's (Gemma: query_pre_attn_scalar^-1/2)
  // Scores soft-capping: s = softcap * tanh(s / softcap) after the scale (Gemma 2's
  // attn_logit_softcapping); 0 is off.
  float softcap = 0.0f;
  // Sliding window: a query at position p sees keys (p - window, p] (0: all of [0, p]). Keys before
  // the window are never read: the walk starts at p - window + 1, skipping whole blocks, and a split
  // cuts the window's positions, not the context's.
  int32_t window = 0;
  int32_t num_splits = 1;
  int32_t partition_size = 0;
  float* workspace = nullptr;
};

// How an attention launch splits over positions: num_splits == 1 is no split. With a window, split s
// covers [first + s * partition_size, first + (s + 1) * partition_size) of a query's window, first
// being where its window begins.
struct split_plan {
  int32_t num_splits = 1;
  int32_t partition_size = 0;
};

// The CTAs of one kernel a GPU runs at once (a "wave"): its multiprocessors times the CTAs of that
// kernel one of them holds (per_sm: cudaOccupancyMaxActiveBlocksPerMultiprocessor, which counts the
// kernel's registers, shared memory and threads). The split plans fill one wave, as FlashInfer's
// decode planner does (max_grid_size = blocks per SM x SMs): fewer CTAs leave multiprocessors idle,
// more add a second, partly empty wave and more partials to merge.
struct cta_slots {
  int32_t num_sms = 0;
  int32_t per_sm = 0;
  int64_t total() const { return static_cast<int64_t>(num_sms) * per_sm; }
};

// The split of `ctas` unsplit CTAs walking at most `max_context` positions: none when they fill a wave
// of `slots` already or the walk is at most `min_partition`; else as many partitions as fill the wave
// without starting a second, at most ceil(max_context / min_partition) and 256, each a multiple of
// `granule` positions (none left empty).
split_plan plan_wave_split(int64_t ctas, int32_t max_context, int32_t min_partition, int32_t granule, cta_slots slots);

// RoPE fused with the KV write, for one layer. qkv [tokens, qkv_stride] f32 holds each token's
// Q (num_heads * head_dim) | K | V (num_kv_heads * head_dim each). In this order, in place:
//   1. + bias (Q|K|V biases side by side, as qkv's columns: Qwen2), when bias is given;
//   2. per-head RMSNorm of every Q and K head, x / rms(x) * q_norm (k_norm) (Qwen3, Gemma 3), when
//      q_norm and k_norm are given;
//   3. RoPE on Q and K: angle = position * inv_freq[i], cos/sin evaluated in double as the CPU
//      executor does, times attention_factor (YaRN's / LongRoPE's cos/sin multiplier);
// then K and V are stored at slot_mapping[t] = block * block_size + offset of the cache. So a bias
// and a q/k norm cost no launch of their own. The rows are left holding the processed Q|K|V.
// interleaved_pairs: pairs (2i, 2i+1) (GGUF llama) instead of (i, i + rope_dims/2) (HF rotate_half).
// Without q/k norms, one thread per independent piece of the row; with them, one warp per head
// (the norm is a reduction over the head): head_dim 32, 64, 128 or 256 then.
struct rope_kv_args {
  float* qkv = nullptr;
  int64_t qkv_stride = 0;
  const int32_t* positions = nullptr;
  const int32_t* slot_mapping = nullptr;
  const float* inv_freq = nullptr;  // [rope_dims / 2]
  float attention_factor = 1.0f;
  const float* bias = nullptr;    // [(num_heads + 2 num_kv_heads) * head_dim] or null
  const float* q_norm = nullptr;  // [head_dim] multipliers, or null (then k_norm is null too)
  const float* k_norm = nullptr;
  float eps = 1e-6f;  // of the q/k norms
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t rope_dims = 0;
  bool interleaved_pairs = true;
  int32_t layer = 0;  // the layer's index in a block (its slot in its KV layer group; kv_layout)
  kv_layout layout;
  // An fp8 cache stores K / k_scale and V / v_scale (paged_attention_common); 1 for float and bf16.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};
void rope_kv_write(const rope_kv_args& a, float* kv_cache, cudaStream_t stream);
void rope_kv_write(const rope_kv_args& a, bf16* kv_cache, cudaStream_t stream);
void rope_kv_write(const rope_kv_args& a, fp8_e4m3* kv_cache, cudaStream_t stream);

// Copies whole blocks within the cache (copy-on-write): pairs [num_copies][2] = (src, dst) block ids.
// One launch for every copy of the step. block_bytes % 16 == 0 (checked: invalid_argument).
void block_copy(void* kv_cache, int64_t block_bytes, const int32_t* pairs, int32_t num_copies, cudaStream_t stream);

// Overlapped steps: ids[pairs[2i]] = sampled[pairs[2i + 1]] for i < n, the tokens the previous step
// sampled on the device put into this step's token ids before the embedding gather reads them.
void take_sampled_tokens(int32_t* ids, const int32_t* pairs, int32_t n, const int32_t* sampled, cudaStream_t stream);

}  // namespace tessera::gpu
