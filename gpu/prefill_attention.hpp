// Prefill attention over the paged KV cache: a tiled flash-attention kernel (FlashAttention, Dao et
// al. 2022, https://arxiv.org/abs/2205.14135: K/V walked in tiles held in shared memory, online
// softmax with a running max and sum per query row, fp32).
//
// One CTA takes a tile of consecutive query tokens of ONE sequence times the query heads of one KV
// head's GQA group (its "rows": token-major, head-minor), so each K/V tile it loads serves every row.
// It walks the sequence's positions [0, last query's position] through the block table of
// gpu/kernels.hpp's kv_layout, masking causally per row (a query at position p sees [0, p]); tiles
// past the tile's last query are never loaded. A chunk of a prompt that starts at num_computed > 0
// (chunked prefill, prefix-cache hit) is the same case: the earlier positions are already in the cache.
// On a sliding-window layer (paged_attention_common::window) a row at p sees (p - window, p], and the
// walk starts at the tile's first row's window: earlier tiles and blocks are never loaded. Scores may
// be soft-capped (paged_attention_common::softcap).
//
// The host describes the work as tiles (plan_prefill_tiles): each is 4 int32 (prefill_tile), packed by
// the executor into its per-step metadata buffer. When there are too few tiles to fill the GPU and the
// context is long (a short chunk after a long cached prefix), plan_prefill_split cuts the positions
// over several CTAs per tile and a second kernel merges their partial softmax states (split-KV).
// Decode tokens (fewer new tokens per sequence than kDefaultPrefillMinTokens, or the executor's
// setting) keep using paged_attention (gpu/attention.hpp).
// A token tree's rows (speculative decoding's drafts) may be a chunk too: each row then sees the
// context before the tree and, of the tree's slots, its ancestors only (prefill_attention_args::tree,
// the decode kernel's tree_attention_view), so a tree's K/V tile serves all its rows.
//
// Two kernels (prefill_kernel): a bf16 executor gets the tensor-core one (FlashAttention-2 structure on
// mma.sync, gpu/prefill_attention_mma.cuh), fp32 the SIMT fp32 one. Their CTAs hold the same rows but
// for head_dim 256 (64 against the SIMT kernel's 24), so tiles are cut for the kernel that runs them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "gpu/kernels.hpp"

namespace tessera::gpu {

// A run of consecutive query tokens of one sequence: batch rows [token_begin, token_begin + num_tokens)
// of q/out are positions [first_position, first_position + num_tokens) of the sequence whose block
// table is row `table_row`. Used both for a sequence's whole chunk and for one CTA's tile of it.
struct prefill_tile {
  int32_t token_begin = 0;
  int32_t num_tokens = 0;
  int32_t first_position = 0;
  int32_t table_row = 0;
};
static_assert(sizeof(prefill_tile) == 4 * sizeof(int32_t), "packed as 4 int32 in the step metadata");

// The common part (gpu/kernels.hpp) for the query tokens of the tiles; a split (for few tiles over
// long contexts) has a workspace of prefill_workspace_floats(...) floats.
template <class T, class C = T>
struct prefill_attention_args : paged_attention_common<T, C> {
  const prefill_tile* tiles = nullptr;  // [num_tiles], from plan_prefill_tiles with prefill_tile_tokens
  int32_t num_tiles = 0;
  int32_t tile_tokens = 0;  // prefill_tile_tokens(...) the tiles were cut with
  // With a split: min(num_tiles, 65535) * num_heads counters, zero before the launch and left zero
  // after it; the last CTA of each (tile, head group) merges the partials (gpu/attention.hpp's
  // split_counters). Null: a second kernel merges.
  int32_t* split_counters = nullptr;
  // Token trees (gpu/kernels.hpp), indexed by batch row; all null: none. A tree is one chunk whose
  // first_position is its root's slot, so a row's slot is its tile's first_position plus its index, as
  // any chunk's: the causal walk reaches every ancestor, and the mask keeps only those.
  tree_attention_view tree;
  // bf16: the tensor-core kernel (FlashAttention-2 on mma.sync, bf16 Q and P, fp32 accumulation) when
  // true, the SIMT fp32 kernel when false (tests and gpu_attention_bench run both). fp32 always takes
  // the SIMT kernel.
  bool tensor_cores = true;
};

enum class prefill_kernel : uint8_t { simt, tensor_cores };

// The kernel a launch with these arguments runs (its tiles must be cut for it).
template <class T, class C>
prefill_kernel prefill_kernel_of(const prefill_attention_args<T, C>& a) {
  return std::is_same_v<T, bf16> && a.tensor_cores ? prefill_kernel::tensor_cores : prefill_kernel::simt;
}

// Query tokens per tile for this shape and kernel: the CTA's rows (64; the SIMT kernel's head_dim 256:
// 24) divided by the query heads it serves (the GQA group, at most the row count). 0 for an
// unsupported head_dim.
int32_t prefill_tile_tokens(prefill_kernel kernel, int32_t head_dim, int32_t num_heads, int32_t num_kv_heads);

// An executor gives a sequence's new tokens to this kernel when there are at least this many (prompt
// chunks, drafts, token trees), fewer to paged_attention (decode). TESSERA_PREFILL_MIN_TOKENS (1 or
// more) sets another threshold (prefill_min_tokens_from_env; 1: every eager decode token too, as
// FlashInfer runs GQA decode on its prefill kernel), for the device to tune.
constexpr int32_t kDefaultPrefillMinTokens = 4;
int32_t prefill_min_tokens_from_env() noexcept;

// Cuts each chunk into tiles of at most `tile_tokens` tokens, ordered by decreasing number of
// positions to read (the causal work of a tile grows with its last position), so the longest CTAs are
// scheduled first and the short ones fill the tail. Chunks with no tokens are skipped.
std::vector<prefill_tile> plan_prefill_tiles(const std::vector<prefill_tile>& chunks, int32_t tile_tokens);

// CTAs of the kernel a launch of `a` runs one multiprocessor holds, in its variant for token trees
// (a launch with tree.root set) or without: cta_slots::per_sm for plan_prefill_split. Throws as
// prefill_attention for an unsupported head_dim or head counts.
int32_t prefill_attention_ctas_per_sm(const prefill_attention_args<float>& a, bool with_trees);
int32_t prefill_attention_ctas_per_sm(const prefill_attention_args<bf16>& a, bool with_trees);
int32_t prefill_attention_ctas_per_sm(const prefill_attention_args<bf16, fp8_e4m3>& a, bool with_trees);

// How to split: (num_splits, partition_size) for `num_tiles` tiles reading at most `max_context`
// positions each (on a sliding-window layer: from the first row's window start to the last row), with
// the kernel's `slots` (plan_wave_split, walks over 1024 positions, partitions of over 512). num_splits == 1 when
// the tiles' CTAs already fill a wave or the context is short (a whole prompt: many tiles; a short
// chunk after a long cached prefix: few tiles, long walks, so split).
split_plan plan_prefill_split(prefill_kernel kernel, int32_t num_tiles, int32_t head_dim, int32_t num_heads,
                              int32_t num_kv_heads, int32_t max_context, cta_slots slots);

// Floats of workspace a split launch needs.
int64_t prefill_workspace_floats(int32_t num_tiles, int32_t tile_tokens, int32_t num_heads, int32_t head_dim,
                                 int32_t num_splits);

// Throws std::invalid_argument for an unsupported head_dim, a head count that is not a multiple of the
// KV heads, tiles not cut with prefill_tile_tokens for this shape and kernel, or a bad split. Nothing to do for
// num_tiles 0.
void prefill_attention(const prefill_attention_args<float>& a, cudaStream_t stream);
void prefill_attention(const prefill_attention_args<bf16>& a, cudaStream_t stream);
void prefill_attention(const prefill_attention_args<bf16, fp8_e4m3>& a, cudaStream_t stream);  // fp8 cache

}  // namespace tessera::gpu
