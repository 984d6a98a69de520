// The tensor-core prefill attention kernel (FlashAttention-2, Dao 2023, https://arxiv.org/abs/2307.08691:
// each warp owns 16 query rows for the whole walk, S = Q K^T and O += P V on mma.sync with bf16
// operands and fp32 accumulators, P kept in registers between the two products, online softmax per
// row). Same contract, CTA rows, tiles, splits and workspace layout as the SIMT kernel of
// gpu/prefill_attention.cu, which includes this file and dispatches to it for a bf16 executor
// (prefill_attention_args::tensor_cores), every head_dim compiled (32, 64, 128, 256).
//
// Per CTA: 4 warps x 16 rows = the 64 rows of tile_rows(). Q is read once from global memory into
// A fragments (scaled by scale * k_scale, rounded to bf16); K and V tiles of `keys` positions go
// through a two-stage cp.async pipeline into shared memory (a bf16 cache: 16-byte copies straight from
// the paged blocks; an fp8 cache: converted to bf16 on the way, exactly, its scales folded into Q and
// into the output), and ldmatrix (.trans for V) turns them into B fragments. Fragment layouts: the top
// of gpu/mma.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/device_math.cuh"
#include "gpu/launch.cuh"
#include "gpu/mma.cuh"
#include "gpu/prefill_attention.hpp"

namespace tessera::gpu::detail {

// keys: positions per K/V tile; pitch: bf16 elements per shared-memory row (head_dim + 8: 16 bytes of
// padding put the 8 rows an ldmatrix reads in 8 different 16-byte bank groups). Two stages of K and V
// stay within the 48 KiB of static shared memory: 34 KiB for head_dim 128, 36 KiB for 64, 33 KiB for
// 256 (16 keys a tile). Registers bound head_dim 256 rather than shared memory: a lane holds Q's A
// fragments (64 registers) and O's accumulators (128) for the whole walk, so 16 keys keep S's
// fragments to 8; ptxas (sm_90) gives 255 registers without spills, 2 CTAs per SM (FlashAttention-2's
// head_dim 256 kernels also run at the register limit).
constexpr int mma_tile_keys(int head_dim) {
  if (head_dim <= 64) return 64;
  return head_dim <= 128 ? 32 : 16;
}

template <int D>
struct mma_tile_shape {
  static constexpr int rows = 64, warps = 4, threads = 32 * warps, keys = mma_tile_keys(D), pitch = D + 8;
  static_assert(D % 16 == 0 && keys % 16 == 0, "k-steps of 16 dims and of 16 keys");
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(lo))} |
         (uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(hi))} << 16);
}

// Index of the partial state of (tile token i, head) for split 0 in a split launch's workspace.
__device__ __forceinline__ int64_t prefill_part_index(int64_t tile_index, int32_t tile_tokens, int32_t i,
                                                      int32_t num_heads, int32_t head, int32_t num_splits) {
  return ((tile_index * tile_tokens + i) * num_heads + head) * num_splits;
}

// The fused split merge shared by both prefill kernels: the last CTA of this (tile, head group) merges
// every row's splits (as prefill_combine_kernel would) and resets the counter. Every thread calls it.
template <class T, class C>
__device__ void merge_prefill_splits_in_last_cta(const prefill_attention_args<T, C>& a, const prefill_tile& tile,
                                                 int32_t head0, int32_t num_heads_here) {
  if (a.num_splits == 1 || a.split_counters == nullptr) return;
  const int32_t D = a.layout.head_dim;
  int32_t* counter = a.split_counters + static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  if (!last_of_splits(counter, a.num_splits)) return;
  const int64_t num_parts = static_cast<int64_t>(gridDim.y) * a.tile_tokens * a.num_heads * a.num_splits;
  const volatile float* part_o = a.workspace;
  const volatile float* part_ml = a.workspace + num_parts * D;
  for (int idx = static_cast<int>(threadIdx.x); idx < tile.num_tokens * num_heads_here * D;
       idx += static_cast<int>(blockDim.x)) {
    const int i = idx / (num_heads_here * D), g = idx / D % num_heads_here, d = idx % D;
    const int64_t first = prefill_part_index(blockIdx.y, a.tile_tokens, i, a.num_heads, head0 + g, a.num_splits);
    a.out[static_cast<int64_t>(tile.token_begin + i) * a.out_stride + static_cast<int64_t>(head0 + g) * D + d] =
        from_float<T>(merge_splits(part_o, part_ml, first, a.num_splits, D, d));
  }
  if (threadIdx.x == 0) *counter = 0;
}

// The query heads of one CTA of a prefill kernel, grid.x = num_kv_heads * group_chunks: KV head
// blockIdx.x / group_chunks, and of its GQA group the heads_per_cta heads (fewer in the last chunk)
// from `first`.
struct prefill_heads {
  int32_t kv_head = 0, first = 0, count = 0;
};

template <class T, class C>
__device__ __forceinline__ prefill_heads prefill_heads_of(const prefill_attention_args<T, C>& a, int32_t heads_per_cta,
                                                          int32_t group_chunks) {
  const int32_t group = a.num_heads / a.layout.num_kv_heads;
  const int32_t chunk = static_cast<int32_t>(blockIdx.x) % group_chunks;
  prefill_heads h;
  h.kv_head = static_cast<int32_t>(blockIdx.x) / group_chunks;
  h.first = h.kv_head * group + chunk * heads_per_cta;
  h.count = min(heads_per_cta, group - chunk * heads_per_cta);
  return h;
}

// The positions [start, end) one CTA of a prefill kernel reads, and where they are: causal (the tile's
// last query sees [0, its position]; tiles beyond are never loaded), from the first row's window start
// on a sliding-window layer (nothing before it is loaded either), cut to the CTA's partition with a
// split (empty for partitions past the end).
struct prefill_walk {
  int32_t start = 0, end = 0;
  const int32_t* table = nullptr;  // the sequence's block table
  int32_t block_size = 0;
  int64_t block_elems = 0;
  int64_t k_off = 0, v_off = 0;  // this layer's and KV head's K and V within a block
};

template <bool Trees, class T, class C>
__device__ __forceinline__ prefill_walk prefill_walk_of(const prefill_attention_args<T, C>& a, const prefill_tile& tile,
                                                        int32_t kvh) {
  prefill_walk w;
  const int32_t kv_end = tile.first_position + tile.num_tokens;
  // The window of the tile's lowest position: its first row's, or, in a token tree, possibly a later
  // row's (a row's position is its depth, at or below its slot).
  int32_t lowest = tile.first_position;
  if (Trees && a.window > 0) {
    for (int32_t i = 0; i < tile.num_tokens; ++i) {
      const int32_t row = tile.token_begin + i;
      if (a.tree.root[row] >= 0) lowest = min(lowest, a.tree.positions[row]);
    }
  }
  const int32_t kv_begin = a.window > 0 ? max(0, lowest - a.window + 1) : 0;
  w.start = kv_begin + (a.num_splits == 1 ? 0 : static_cast<int32_t>(blockIdx.z) * a.partition_size);
  w.end = a.num_splits == 1 ? kv_end : min(kv_end, w.start + a.partition_size);
  w.table = a.block_tables + static_cast<int64_t>(tile.table_row) * a.max_blocks_per_seq;
  w.block_size = a.layout.block_size;
  w.block_elems = a.layout.block_elems();
  const int64_t nkv = a.layout.num_kv_heads, D = a.layout.head_dim;
  w.k_off = ((static_cast<int64_t>(a.layer) * 2 + 0) * nkv + kvh) * w.block_size * D;
  w.v_off = ((static_cast<int64_t>(a.layer) * 2 + 1) * nkv + kvh) * w.block_size * D;
  return w;
}

// One query row of a prefill CTA and the keys it sees. Its slot (tile.first_position plus its token
// index) bounds it causally; outside a token tree that is its position too, and with a window it sees
// keys from `first` (its window's start) on. Unused rows (past the tile's tokens or the CTA's heads)
// have slot -1 and see nothing. A launch with token trees (prefill_attention_args::tree; the kernels'
// Trees variant, so that other launches keep their registers) also knows, for a tree's row, its
// tree's root row and root slot (tree_base) and its ancestor bits: such a row sits at its depth's
// position, at or below its slot, and of the slots from tree_base on sees its ancestors' only, those
// whose position (tree.positions) is at or after `first`.
template <bool Trees>
struct prefill_row {
  int32_t slot = -1, first = 0;
};
template <>
struct prefill_row<true> {
  int32_t slot = -1, first = 0;
  int32_t root = -1, tree_base = 0x7fffffff, mask_offset = 0;
};

template <bool Trees, class T, class C>
__device__ __forceinline__ prefill_row<Trees> prefill_row_of(const prefill_attention_args<T, C>& a,
                                                             const prefill_tile& tile, int32_t token, bool used) {
  prefill_row<Trees> r;
  if (!used) return r;
  r.slot = tile.first_position + token;
  int32_t pos = r.slot;
  if constexpr (Trees) {
    const int32_t row = tile.token_begin + token;
    r.root = a.tree.root[row];
    if (r.root >= 0) {
      pos = a.tree.positions[row];
      r.tree_base = a.tree.positions[r.root];  // the root's position is its slot
      r.mask_offset = a.tree.mask_offset[row];
    }
  }
  r.first = a.window > 0 ? pos - a.window + 1 : 0;
  return r;
}

template <bool Trees, class T, class C>
__device__ __forceinline__ bool sees(const prefill_attention_args<T, C>& a, const prefill_row<Trees>& r, int32_t j) {
  if (j > r.slot) return false;
  if constexpr (Trees) {
    const int32_t t = j - r.tree_base;  // >= 0: the slot of tree row t
    if (t >= 0) {
      if (!((a.tree.mask[r.mask_offset + (t >> 5)] >> (t & 31)) & 1u)) return false;
      return a.tree.positions[r.root + t] >= r.first;
    }
  }
  return j >= r.first;
}

// Copies `keys` rows of K (or V) from positions k0.. through the block table into one stage's tile,
// bf16; rows from `end` on are zeros (P.V must not multiply a zero probability by stale memory).
template <int D, class C>
__device__ __forceinline__ void load_kv_tile_bf16(uint16_t (*dst)[mma_tile_shape<D>::pitch], const C* cache,
                                                  const prefill_walk& w, int64_t kind_off, int32_t k0) {
  const int32_t end = w.end, bs = w.block_size;
  using shape = mma_tile_shape<D>;
  constexpr int chunks = D / 8;  // 8 elements per 16-byte shared-memory chunk
  for (int idx = static_cast<int>(threadIdx.x); idx < shape::keys * chunks; idx += shape::threads) {
    const int key = idx / chunks, c = idx % chunks;
    const int32_t j = k0 + key;
    const bool in = j < end;
    const C* src = in ? cache + static_cast<int64_t>(w.table[j / bs]) * w.block_elems + kind_off +
                            static_cast<int64_t>(j % bs) * D + 8 * c
                      : cache;
    if constexpr (sizeof(C) == 2) {
      ptx::cp_async_cg_zfill(&dst[key][8 * c], src, in ? 16 : 0);
    } else {  // fp8: 8 codes -> 8 bf16, exact (3 mantissa bits fit in bf16's 7)
      uint4 out = make_uint4(0u, 0u, 0u, 0u);
      if (in) {
        float f[8];
        load_floats<C, 8>(src, f);
        out = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                         pack_bf16x2(f[6], f[7]));
      }
      *reinterpret_cast<uint4*>(&dst[key][8 * c]) = out;
    }
  }
}

// grid: (num_kv_heads * group_chunks, num_tiles, num_splits), block: mma_tile_shape<D>::threads.
// Row r of the CTA is token r / heads_per_cta of the tile and query head head0 + r % heads_per_cta,
// as in the SIMT kernel. Lane (g, t) = (lane / 4, lane % 4) of warp w holds rows 16 w + g and
// 16 w + g + 8 of every S and O fragment; a row's max and sum are shuffles over its 4 lanes.
template <int D, class C, bool Trees>
__global__ void __launch_bounds__(mma_tile_shape<D>::threads)
    prefill_attention_mma_kernel(prefill_attention_args<__nv_bfloat16, C> a, int32_t heads_per_cta,
                                 int32_t group_chunks) {
  pdl_prologue();  // first: see gpu/launch.cuh
  using shape = mma_tile_shape<D>;
  constexpr int KT = shape::keys, P = shape::pitch, KSTEPS = D / 16, NS = KT / 8, NO = D / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ __align__(16) uint16_t k_s[2][KT][P];
  __shared__ __align__(16) uint16_t v_s[2][KT][P];

  const prefill_tile tile = a.tiles[blockIdx.y];
  const prefill_heads heads = prefill_heads_of(a, heads_per_cta, group_chunks);
  const int32_t kvh = heads.kv_head, head0 = heads.first, num_heads_here = heads.count;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, t = lane & 3;

  // This lane's two rows: token, head, and what each sees (slot -1: unused, never written).
  int32_t row_token[2], row_head[2];
  prefill_row<Trees> row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + g + 8 * h;
    row_token[h] = r / heads_per_cta;
    row_head[h] = head0 + r % heads_per_cta;
    row[h] = prefill_row_of<Trees>(a, tile, row_token[h],
                                   row_token[h] < tile.num_tokens && r % heads_per_cta < num_heads_here);
  }

  // Q's A fragments, k-step s = dims [16 s, 16 s + 16): a[0], a[2] from row 0 (columns 2t, 2t + 8),
  // a[1], a[3] from row 1. k_scale folded in here (the cache holds K / k_scale).
  uint32_t qa[KSTEPS][4];
  const float q_scale = a.scale * a.k_scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float* q = row[h].slot < 0 ? nullptr
                                     : a.q + static_cast<int64_t>(tile.token_begin + row_token[h]) * a.q_stride +
                                           static_cast<int64_t>(row_head[h]) * D;
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = 16 * s + 8 * half + 2 * t;
        const float2 v = q ? *reinterpret_cast<const float2*>(q + col) : make_float2(0.0f, 0.0f);
        qa[s][h + 2 * half] = pack_bf16x2(v.x * q_scale, v.y * q_scale);
      }
    }
  }

  const prefill_walk w = prefill_walk_of<Trees>(a, tile, kvh);
  const int32_t split = static_cast<int32_t>(blockIdx.z), start = w.start, end = w.end;
  const bool capped = a.softcap > 0.0f;
  const float inv_cap = capped ? 1.0f / a.softcap : 0.0f;
  auto issue = [&](int32_t k0, int stage) {
    load_kv_tile_bf16<D>(k_s[stage], a.kv_cache, w, w.k_off, k0);
    load_kv_tile_bf16<D>(v_s[stage], a.kv_cache, w, w.v_off, k0);
    ptx::cp_async_commit_group();
  };

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  if (start < end) issue(start, 0);
  for (int32_t k0 = start, stage = 0; k0 < end; k0 += KT, stage ^= 1) {
    // Prefetch the next tile into the other stage (consumed by the previous iteration, which ended on
    // a barrier), then wait for this one.
    if (k0 + KT < end) {
      issue(k0 + KT, stage ^ 1);
      ptx::cp_async_wait_group<1>();
    } else {
      ptx::cp_async_wait_group<0>();
    }
    __syncthreads();

    // S = Q K^T: 16 rows x KT keys per warp. ldmatrix.x4 over keys [16 np, 16 np + 16) and dims
    // [16 s, 16 s + 16): lane l gives row l % 8 of matrix l / 8 = (keys + 8 (l / 16), dims + 8 (l / 8 % 2)).
    float sc[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int np = 0; np < NS / 2; ++np) {
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        uint32_t b[4];
        ptx::ldmatrix<4>(b, &k_s[stage][16 * np + 8 * (lane >> 4) + (lane & 7)][16 * s + 8 * ((lane >> 3) & 1)]);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        ptx::mma_m16n8k16_bf16(sc[2 * np], qa[s], b0, sc[2 * np]);
        ptx::mma_m16n8k16_bf16(sc[2 * np + 1], qa[s], b1, sc[2 * np + 1]);
      }
    }

    // Soft-cap, masks and the online softmax of each of this lane's two rows (fragment elements
    // 0, 1: row 0; 2, 3: row 1; key k0 + 8 n + 2 t + (e & 1)).
    float correction[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const int32_t j = k0 + 8 * n + 2 * t + (e & 1);
          float s = sc[n][e];
          if (capped) s = a.softcap * tanhf(s * inv_cap);
          if (!sees(a, row[h], j) || j >= end) s = -INFINITY;
          sc[n][e] = s;
          mx = fmaxf(mx, s);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      const bool none = m_new == -INFINITY;  // no visible position yet (unused row, or before this split)
      // exp(x - m) as exp2(x log2(e) - m log2(e)): one FMA and the hardware's ex2 (FlashAttention-2's
      // form), where expf would range-reduce in software.
      const float m_log2 = m_new * kLog2e;
      correction[h] = none ? 1.0f : exp2f(fmaf(m[h], kLog2e, -m_log2));
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const float p = none ? 0.0f : exp2f(fmaf(sc[n][e], kLog2e, -m_log2));
          sc[n][e] = p;
          sum += p;
        }
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[h] = l[h] * correction[h] + sum;
      m[h] = m_new;
    }
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[n][0] *= correction[0];
      o[n][1] *= correction[0];
      o[n][2] *= correction[1];
      o[n][3] *= correction[1];
    }

    // O += P V. P's S fragments of keys [16 kk, 16 kk + 16) are the A fragment of k-step kk; V's B
    // fragments come from ldmatrix.trans over (keys + 8 (l / 8 % 2), dims + 8 (l / 16)).
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < NO / 2; ++nd) {
        uint32_t b[4];
        ptx::ldmatrix_trans<4>(b, &v_s[stage][16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)][16 * nd + 8 * (lane >> 4)]);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        ptx::mma_m16n8k16_bf16(o[2 * nd], pa, b0, o[2 * nd]);
        ptx::mma_m16n8k16_bf16(o[2 * nd + 1], pa, b1, o[2 * nd + 1]);
      }
    }
    __syncthreads();  // this stage is consumed before the next iteration's prefetch overwrites it
  }

  // Rows of this lane: write the normalised output (times v_scale), or the split's partial state.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h].slot < 0) continue;
    if (a.num_splits > 1) {
      const int64_t part =
          prefill_part_index(blockIdx.y, a.tile_tokens, row_token[h], a.num_heads, row_head[h], a.num_splits) + split;
      const int64_t num_parts = static_cast<int64_t>(gridDim.y) * a.tile_tokens * a.num_heads * a.num_splits;
      float* dst = a.workspace + part * D;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        *reinterpret_cast<float2*>(dst + 8 * n + 2 * t) =
            make_float2(o[n][2 * h] * a.v_scale, o[n][2 * h + 1] * a.v_scale);
      }
      if (t == 0) {
        a.workspace[num_parts * D + 2 * part] = m[h];
        a.workspace[num_parts * D + 2 * part + 1] = l[h];
      }
      continue;
    }
    const float inv = a.v_scale / l[h];  // l >= 1: the row's maximum position contributes exp(0)
    __nv_bfloat16* dst = a.out + static_cast<int64_t>(tile.token_begin + row_token[h]) * a.out_stride +
                         static_cast<int64_t>(row_head[h]) * D;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * n + 2 * t) =
          __floats2bfloat162_rn(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
  }
  merge_prefill_splits_in_last_cta(a, tile, head0, num_heads_here);
}

}  // namespace tessera::gpu::detail
