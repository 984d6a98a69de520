// Paged attention over the KV cache of gpu/kernels.hpp's kv_layout, for decode and prefill alike:
// every query token attends causally to positions [0, context_lens[t]) of its sequence (the last
// `window` of them on a sliding-window layer), read through the sequence's block table, so chunked
// prefill and prefix-cache hits (K/V of earlier positions already in the blocks) need nothing special.
// Scores may be soft-capped (paged_attention_common::softcap). Rows of a token tree attend to their
// ancestors only (tree_attention_view).
//
// GQA: one CTA serves all query heads of a KV head (up to 8 at a time), so each K/V row is read once
// per group, not once per query head. Online softmax (flash-attention's running max / sum), fp32.
// Split-KV (flash-decoding): when there are too few (token, KV head) pairs to fill a wave of the GPU
// (the kernel's resident CTAs per SM, from the occupancy query, times the SMs) and the context is
// long, each pair's context is cut into partitions processed by separate CTAs, whose partial results
// (max, sum, unnormalised output) the last of them (or a second kernel) combines.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace tessera::gpu {

// The decode attention kernels (tests and gpu_attention_bench run each; the executor takes
// warp_tiles unless told otherwise, decode_kernel_from_env):
//   thread_rows (v1): a thread per K row, block-wide reductions per tile;
//   warp_tiles (v2, the default): lanes split each K/V row and each warp walks its own tiles with
//     no block barrier in the loop, a tile's K/V rows loaded into registers before any is used;
//   staged_warp_tiles (v3): v2 with each warp's next tile copied into shared memory by cp.async while
//     it computes the current one (FlashInfer's decode pipeline), so its loads stay in flight across
//     the computation and the rows take no registers until used; bf16 and fp8 caches only.
enum class decode_kernel : uint8_t { thread_rows, warp_tiles, staged_warp_tiles };

// TESSERA_DECODE_ATTENTION=v1|v2|v3 (read once; anything else: v2), for A/B runs on a device.
decode_kernel decode_kernel_from_env() noexcept;

// The common part (gpu/kernels.hpp) for num_tokens decode queries; a split's workspace holds
// attention_workspace_floats(...) floats.
template <class T, class C = T>
struct paged_attention_args : paged_attention_common<T, C> {
  int32_t num_tokens = 0;
  const int32_t* context_lens = nullptr;  // [num_tokens]: position + 1 (causal); a tree row's: slot + 1
  const int32_t* token_seq = nullptr;     // [num_tokens]: row of block_tables
  tree_attention_view tree;               // all null: no token tree in the launch
  // With a split: num_tokens * num_heads counters, zero before the launch and left zero after it. The
  // last CTA of each (token, head group) to finish merges the partials itself (flash-decoding's
  // second kernel folded into the first: one launch less per layer). Null: a second kernel merges.
  int32_t* split_counters = nullptr;
  decode_kernel kernel = decode_kernel::warp_tiles;
};

// Head sizes the kernel is compiled for (32, 64, 128, 256; the prefill kernel's too).
bool attention_supports_head_dim(int32_t head_dim);

// Floats of workspace a split launch needs.
int64_t attention_workspace_floats(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t num_splits);

// CTAs of the kernel a launch of `a` runs (by its head_dim, GQA group, types and kernel) one
// multiprocessor holds: cta_slots::per_sm for plan_attention_split. Throws as paged_attention for an
// unsupported head_dim or head counts.
int32_t paged_attention_ctas_per_sm(const paged_attention_args<float>& a);
int32_t paged_attention_ctas_per_sm(const paged_attention_args<bf16>& a);
int32_t paged_attention_ctas_per_sm(const paged_attention_args<bf16, fp8_e4m3>& a);

// How to split: (num_splits, partition_size) for `num_tokens` queries that each walk at most
// `max_context` positions (the context, or the window on a sliding-window layer), with the kernel's
// `slots` (plan_wave_split): num_splits == 1 when the (token, head group) CTAs already fill a wave or
// the walk is short (at most two 128-position tiles; partitions of whole tiles).
split_plan plan_attention_split(int32_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t max_context,
                                cta_slots slots);

// Throws std::invalid_argument for an unsupported head_dim, a bad split, or staged_warp_tiles over an
// f32 cache.
void paged_attention(const paged_attention_args<float>& a, cudaStream_t stream);
void paged_attention(const paged_attention_args<bf16>& a, cudaStream_t stream);
void paged_attention(const paged_attention_args<bf16, fp8_e4m3>& a, cudaStream_t stream);  // fp8 cache

}  // namespace tessera::gpu
