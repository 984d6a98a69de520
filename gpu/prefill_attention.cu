// Tiled causal prefill attention over the paged KV cache (FlashAttention, Dao et al. 2022,
// https://arxiv.org/abs/2205.14135, algorithm 1: K/V tiles in shared memory, online softmax).
// See gpu/prefill_attention.hpp for the contract and docs/gpu_executor.md for the design.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/env_setting.hpp"
#include "gpu/launch.cuh"
#include "gpu/prefill_attention.hpp"
#include "gpu/prefill_attention_mma.cuh"

namespace tessera::gpu {

namespace {

using detail::from_float;
using detail::load_floats;
using detail::merge_splits;
using detail::prefill_part_index;

// A CTA's work: `rows` query rows (tile tokens x the heads it serves) against K/V tiles of `keys`
// positions, with `threads` threads. Sized so that the three shared arrays stay within the 48 KiB of
// static shared memory in fp32 (Q rows, one K-or-V tile, the probabilities): 45.5 KiB for head_dim 128.
// head_dim 256 gets 24 rows only (42 KiB); bf16 executors run it on the tensor-core kernel's 64 rows.
// key_lanes: threads side by side over a tile's keys (scores) and over the output's float4 columns
// (P.V), so a row's reductions are xor-shuffles within key_lanes lanes: 16 (a half-warp), and 8 for
// head_dim 32, whose 8 float4 columns would leave half of 16 lanes without one (Qwen3-style small
// heads; 21 KiB).
template <int D>
struct tile_shape;
template <>
struct tile_shape<32> {
  static constexpr int rows = 64, keys = 32, threads = 128, key_lanes = 8;
};
template <>
struct tile_shape<64> {
  static constexpr int rows = 64, keys = 32, threads = 128, key_lanes = 16;
};
template <>
struct tile_shape<128> {
  static constexpr int rows = 64, keys = 16, threads = 128, key_lanes = 16;
};
template <>
struct tile_shape<256> {
  static constexpr int rows = 24, keys = 16, threads = 128, key_lanes = 16;
};

// The CTA's rows for a compiled head_dim, 0 for another: the SIMT kernel's tile_shape, or the
// tensor-core kernel's 4 warps of 16 rows for every head_dim.
int32_t tile_rows(prefill_kernel kernel, int32_t head_dim) {
  int32_t simt_rows = 0;
  switch (head_dim) {
    case 32: simt_rows = tile_shape<32>::rows; break;
    case 64: simt_rows = tile_shape<64>::rows; break;
    case 128: simt_rows = tile_shape<128>::rows; break;
    case 256: simt_rows = tile_shape<256>::rows; break;
    default: return 0;
  }
  static_assert(detail::mma_tile_shape<32>::rows == 64 && detail::mma_tile_shape<256>::rows == 64);
  return kernel == prefill_kernel::simt ? simt_rows : detail::mma_tile_shape<256>::rows;
}

// Max / sum over aligned groups of L lanes (xor offsets below L stay inside the group).
template <int L>
__device__ __forceinline__ float lanes_max(float v) {
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
template <int L>
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// grid: (num_kv_heads * group_chunks, num_tiles, num_splits), block: tile_shape<D>::threads.
//
// Row r of the CTA is token r / heads_per_cta of the tile and query head head0 + r % heads_per_cta.
// With KL = key_lanes (16, or 8 for head_dim 32), thread (tr, tc) = (threadIdx.x / KL, threadIdx.x % KL)
// owns rows [tr * RPT, tr * RPT + RPT):
//   scores: keys tc, tc + KL, ... of the K tile;   output: float4 columns tc, tc + KL, ... of each row.
// So the KL threads of a lane group share the same rows: the row max and sum of a tile are shuffles
// within the group, and each thread keeps its rows' running max m, sum l (replicated across the KL)
// and its columns of the unnormalised output acc, all fp32.
// Soft-capping (a.softcap) applies to the scaled scores before the masks (detail::sees: causal, a
// sliding window's keys before p - window + 1 for the row at p, a token tree's non-ancestors), and
// the walk starts at the window of the tile's lowest position, so K/V tiles (and blocks) wholly
// before every row's window are never loaded.
template <int D, class T, class C, bool Trees>
__global__ void __launch_bounds__(tile_shape<D>::threads)
    prefill_attention_kernel(prefill_attention_args<T, C> a, int32_t heads_per_cta, int32_t group_chunks) {
  pdl_prologue();  // first: see gpu/launch.cuh
  using shape = tile_shape<D>;
  constexpr int R = shape::rows, K = shape::keys, NT = shape::threads, D4 = D / 4, KL = shape::key_lanes;
  constexpr int RPT = R / (NT / KL);  // rows per thread
  constexpr int KPT = K / KL;         // keys per thread (scores)
  constexpr int CPT = D4 / KL;        // float4 output columns per thread
  static_assert(RPT >= 1 && KPT >= 1 && CPT >= 1 && R % (NT / KL) == 0 && K % KL == 0 && D4 % KL == 0, "tile shape");
  __shared__ float4 q_s[R][D4];       // scaled Q rows: read as broadcasts (one row per half-warp)
  __shared__ float4 kv_s[K][D4 + 1];  // the K tile, then the V tile; +1: keys start in different banks
  __shared__ float p_s[R][K + 1];     // this tile's probabilities exp(s - m)

  const prefill_tile tile = a.tiles[blockIdx.y];
  const detail::prefill_heads heads = detail::prefill_heads_of(a, heads_per_cta, group_chunks);
  const int32_t kvh = heads.kv_head, head0 = heads.first, num_heads_here = heads.count;
  const int tr = static_cast<int>(threadIdx.x) / KL, tc = static_cast<int>(threadIdx.x) % KL;

  for (int idx = static_cast<int>(threadIdx.x); idx < R * D4; idx += NT) {
    const int r = idx / D4, c4 = idx % D4;
    const int i = r / heads_per_cta, g = r % heads_per_cta;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < tile.num_tokens && g < num_heads_here) {
      const float* src =
          a.q + static_cast<int64_t>(tile.token_begin + i) * a.q_stride + static_cast<int64_t>(head0 + g) * D + 4 * c4;
      v = make_float4(src[0] * a.scale, src[1] * a.scale, src[2] * a.scale, src[3] * a.scale);
    }
    q_s[r][c4] = v;
  }
  // What each row sees (detail::prefill_row); the CTA's unused rows (past the tile's tokens or the
  // group's heads) see no position and are never written.
  detail::prefill_row<Trees> row[RPT];
#pragma unroll
  for (int rr = 0; rr < RPT; ++rr) {
    const int r = tr * RPT + rr;
    const int i = r / heads_per_cta, g = r % heads_per_cta;
    row[rr] = detail::prefill_row_of<Trees>(a, tile, i, i < tile.num_tokens && g < num_heads_here);
  }

  // The positions this CTA reads (causal, from the window's start, its split's partition).
  const detail::prefill_walk w = detail::prefill_walk_of<Trees>(a, tile, kvh);
  const int32_t split = static_cast<int32_t>(blockIdx.z), start = w.start, end = w.end, bs = w.block_size;
  const int32_t* table = w.table;
  const int64_t block_elems = w.block_elems, k_off = w.k_off, v_off = w.v_off;
  const bool capped = a.softcap > 0.0f;
  const float inv_cap = capped ? 1.0f / a.softcap : 0.0f;

  // kv_s[key] = positions k0 + key of K (or V) through the block table, times the cache's scale (an
  // fp8 cache holds K / k_scale, V / v_scale; 1 otherwise: exact); zeros from `end` on, so that P.V
  // never multiplies a zero probability by uninitialised memory.
  auto load_tile = [&](int32_t k0, int64_t kind_off, float scale) {
    for (int idx = static_cast<int>(threadIdx.x); idx < K * D4; idx += NT) {
      const int key = idx / D4, c4 = idx % D4;
      const int32_t j = k0 + key;
      float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (j < end) {
        load_floats<C, 4>(a.kv_cache + static_cast<int64_t>(table[j / bs]) * block_elems + kind_off +
                              static_cast<int64_t>(j % bs) * D + 4 * c4,
                          f);
      }
      kv_s[key][c4] = make_float4(f[0] * scale, f[1] * scale, f[2] * scale, f[3] * scale);
    }
  };

  float m[RPT], l[RPT];
  float4 acc[RPT][CPT];
#pragma unroll
  for (int rr = 0; rr < RPT; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; ++c) acc[rr][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  for (int32_t k0 = start; k0 < end; k0 += K) {
    __syncthreads();  // the previous V tile is consumed (and, the first time, q_s is written)
    load_tile(k0, k_off, a.k_scale);
    __syncthreads();

    // S = Q K^T for this thread's rows x keys.
    float s[RPT][KPT];
#pragma unroll
    for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
      for (int kk = 0; kk < KPT; ++kk) s[rr][kk] = 0.0f;
#pragma unroll 8
    for (int d4 = 0; d4 < D4; ++d4) {
      float4 kf[KPT];
#pragma unroll
      for (int kk = 0; kk < KPT; ++kk) kf[kk] = kv_s[tc + KL * kk][d4];
#pragma unroll
      for (int rr = 0; rr < RPT; ++rr) {
        const float4 qf = q_s[tr * RPT + rr][d4];
#pragma unroll
        for (int kk = 0; kk < KPT; ++kk) {
          s[rr][kk] = fmaf(qf.x, kf[kk].x, s[rr][kk]);
          s[rr][kk] = fmaf(qf.y, kf[kk].y, s[rr][kk]);
          s[rr][kk] = fmaf(qf.z, kf[kk].z, s[rr][kk]);
          s[rr][kk] = fmaf(qf.w, kf[kk].w, s[rr][kk]);
        }
      }
    }

    // Soft-cap, causal and window masks, then the online-softmax update of each row (rescale by
    // exp(m_old - m_new)).
#pragma unroll
    for (int rr = 0; rr < RPT; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int kk = 0; kk < KPT; ++kk) {
        const int32_t j = k0 + tc + KL * kk;
        if (capped) s[rr][kk] = a.softcap * tanhf(s[rr][kk] * inv_cap);  // the CPU executor's 1/cap multiply
        if (!detail::sees(a, row[rr], j) || j >= end) s[rr][kk] = -INFINITY;
        mx = fmaxf(mx, s[rr][kk]);
      }
      mx = lanes_max<KL>(mx);
      const float m_new = fmaxf(m[rr], mx);
      // m_new = -inf: the row has seen no visible position yet (an unused row, or a row whose position
      // precedes this split's partition).
      const bool none = m_new == -INFINITY;
      const float correction = none ? 1.0f : expf(m[rr] - m_new);  // 0 on the row's first tile
      float sum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KPT; ++kk) {
        const float p = none ? 0.0f : expf(s[rr][kk] - m_new);
        p_s[tr * RPT + rr][tc + KL * kk] = p;
        sum += p;
      }
      sum = lanes_sum<KL>(sum);
      l[rr] = l[rr] * correction + sum;
      m[rr] = m_new;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        acc[rr][c].x *= correction;
        acc[rr][c].y *= correction;
        acc[rr][c].z *= correction;
        acc[rr][c].w *= correction;
      }
    }
    __syncthreads();  // every K read is done before V overwrites the tile; p_s is complete
    load_tile(k0, v_off, a.v_scale);
    __syncthreads();

    // O += P V over the tile's positions that exist (the rest are zero rows of V anyway).
    const int num_keys = min(K, end - k0);
    for (int k = 0; k < num_keys; ++k) {
      float p[RPT];
#pragma unroll
      for (int rr = 0; rr < RPT; ++rr) p[rr] = p_s[tr * RPT + rr][k];
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const float4 v = kv_s[k][tc + KL * c];
#pragma unroll
        for (int rr = 0; rr < RPT; ++rr) {
          acc[rr][c].x = fmaf(p[rr], v.x, acc[rr][c].x);
          acc[rr][c].y = fmaf(p[rr], v.y, acc[rr][c].y);
          acc[rr][c].z = fmaf(p[rr], v.z, acc[rr][c].z);
          acc[rr][c].w = fmaf(p[rr], v.w, acc[rr][c].w);
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < RPT; ++rr) {
    if (row[rr].slot < 0) continue;
    const int r = tr * RPT + rr;
    const int i = r / heads_per_cta, g = r % heads_per_cta;
    if (a.num_splits > 1) {
      // The partial state, -inf / 0 / zeros for a row that saw nothing here (the merge skips it).
      const int64_t part =
          prefill_part_index(blockIdx.y, a.tile_tokens, i, a.num_heads, head0 + g, a.num_splits) + split;
      const int64_t num_parts = static_cast<int64_t>(gridDim.y) * a.tile_tokens * a.num_heads * a.num_splits;
      float* o = a.workspace + part * D;
#pragma unroll
      for (int c = 0; c < CPT; ++c) reinterpret_cast<float4*>(o)[tc + KL * c] = acc[rr][c];
      if (tc == 0) {
        a.workspace[num_parts * D + 2 * part] = m[rr];
        a.workspace[num_parts * D + 2 * part + 1] = l[rr];
      }
      continue;
    }
    // l >= 1: the row's maximum position contributes exp(0).
    const float inv = 1.0f / l[rr];
    T* dst = a.out + static_cast<int64_t>(tile.token_begin + i) * a.out_stride + static_cast<int64_t>(head0 + g) * D;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const int col = 4 * (tc + KL * c);
      dst[col + 0] = from_float<T>(acc[rr][c].x * inv);
      dst[col + 1] = from_float<T>(acc[rr][c].y * inv);
      dst[col + 2] = from_float<T>(acc[rr][c].z * inv);
      dst[col + 3] = from_float<T>(acc[rr][c].w * inv);
    }
  }
  detail::merge_prefill_splits_in_last_cta(a, tile, head0, num_heads_here);
}

// grid: (num_tiles, num_heads), block: head_dim threads. Merges the splits of each (tile token, head),
// with the same merge_splits as the decode kernel's combine_splits_kernel.
template <class T, class C>
__global__ void prefill_combine_kernel(prefill_attention_args<T, C> a) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const prefill_tile tile = a.tiles[blockIdx.x];
  const int32_t head = static_cast<int32_t>(blockIdx.y), d = static_cast<int32_t>(threadIdx.x);
  const int32_t D = a.layout.head_dim;
  const int64_t num_parts = static_cast<int64_t>(gridDim.x) * a.tile_tokens * a.num_heads * a.num_splits;
  const float* part_o = a.workspace;
  const float* part_ml = a.workspace + num_parts * D;
  for (int32_t i = 0; i < tile.num_tokens; ++i) {
    const int64_t first = prefill_part_index(blockIdx.x, a.tile_tokens, i, a.num_heads, head, a.num_splits);
    a.out[static_cast<int64_t>(tile.token_begin + i) * a.out_stride + static_cast<int64_t>(head) * D + d] =
        from_float<T>(merge_splits(part_o, part_ml, first, a.num_splits, D, d));
  }
}

// The kernel prefill_kernel_of(a) names, in its variant with or without token trees.
template <int D, bool Trees, class T, class C>
void launch_kernel(const prefill_attention_args<T, C>& a, dim3 grid, int32_t heads_per_cta, int32_t group_chunks,
                   cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (prefill_kernel_of(a) == prefill_kernel::tensor_cores) {
      TESSERA_LAUNCH_PDL(grid, detail::mma_tile_shape<D>::threads, 0, stream,
                         detail::prefill_attention_mma_kernel<D, C, Trees>)
      (a, heads_per_cta, group_chunks);
      return;
    }
  }
  TESSERA_LAUNCH_PDL(grid, tile_shape<D>::threads, 0, stream, prefill_attention_kernel<D, T, C, Trees>)
  (a, heads_per_cta, group_chunks);
}

// CTAs per SM of the kernel launch_kernel<D, Trees> launches for a.
template <int D, bool Trees, class T, class C>
int32_t kernel_ctas_per_sm(const prefill_attention_args<T, C>& a) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (prefill_kernel_of(a) == prefill_kernel::tensor_cores) {
      return resident_ctas_per_sm(detail::prefill_attention_mma_kernel<D, C, Trees>,
                                  detail::mma_tile_shape<D>::threads);
    }
  }
  return resident_ctas_per_sm(prefill_attention_kernel<D, T, C, Trees>, tile_shape<D>::threads);
}

// f(std::integral_constant<int, D>) for a compiled head_dim D (tile_rows says which).
template <class F>
decltype(auto) with_head_dim(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return f(std::integral_constant<int, 256>{});
  }
}

// The shape checks every use of a kernel needs: head counts, and a compiled head_dim.
template <class T, class C>
void check_shape(const prefill_attention_args<T, C>& a) {
  if (a.layout.num_kv_heads < 1 || a.num_heads < 1 || a.num_heads % a.layout.num_kv_heads != 0) {
    throw std::invalid_argument("prefill_attention: num_heads must be a positive multiple of num_kv_heads");
  }
  if (tile_rows(prefill_kernel_of(a), a.layout.head_dim) == 0) {
    throw std::invalid_argument("prefill_attention: head_dim " + std::to_string(a.layout.head_dim) +
                                " is not compiled (32, 64, 128, 256)");
  }
}

template <int D, class T, class C>
void launch_for_dim(const prefill_attention_args<T, C>& a, cudaStream_t stream) {
  const int32_t nkv = a.layout.num_kv_heads;
  const int32_t group = a.num_heads / nkv;
  const int32_t heads_per_cta = std::min(group, tile_rows(prefill_kernel_of(a), D));
  const int32_t group_chunks = (group + heads_per_cta - 1) / heads_per_cta;
  // gridDim.y is at most 65535: more tiles take several launches.
  constexpr int32_t max_tiles = 65535;
  for (int32_t first = 0; first < a.num_tiles; first += max_tiles) {
    prefill_attention_args<T, C> part = a;
    part.tiles = a.tiles + first;
    part.num_tiles = std::min(max_tiles, a.num_tiles - first);
    const dim3 grid(static_cast<unsigned>(nkv * group_chunks), static_cast<unsigned>(part.num_tiles),
                    static_cast<unsigned>(a.num_splits));
    if (a.tree.root != nullptr) {
      launch_kernel<D, true>(part, grid, heads_per_cta, group_chunks, stream);
    } else {
      launch_kernel<D, false>(part, grid, heads_per_cta, group_chunks, stream);
    }
    CUDA_CHECK(cudaGetLastError());
    // Without counters a second kernel merges, before the next part: the workspace is indexed by tile
    // within one launch.
    if (a.num_splits > 1 && a.split_counters == nullptr) {
      TESSERA_LAUNCH_PDL(dim3(part.num_tiles, a.num_heads), D, 0, stream, prefill_combine_kernel<T, C>)(part);
      CUDA_CHECK(cudaGetLastError());
    }
  }
}

template <class T, class C>
void launch(const prefill_attention_args<T, C>& a, cudaStream_t stream) {
  if (a.num_tiles <= 0) return;
  check_shape(a);
  const prefill_kernel kernel = prefill_kernel_of(a);
  // The kernel gives each tile token heads_per_cta rows: tiles cut for another shape or kernel would
  // overflow.
  if (a.tile_tokens != prefill_tile_tokens(kernel, a.layout.head_dim, a.num_heads, a.layout.num_kv_heads)) {
    throw std::invalid_argument(
        "prefill_attention: tiles were not cut with prefill_tile_tokens for this shape and kernel");
  }
  if (a.num_splits < 1 || a.num_splits > 65535 || (a.num_splits > 1 && (a.partition_size < 1 || !a.workspace))) {
    throw std::invalid_argument("prefill_attention: bad split (num_splits, partition_size, workspace)");
  }
  if (a.window < 0 || !(a.softcap >= 0.0f))
    throw std::invalid_argument("prefill_attention: negative window or soft-cap");
  if (!(a.k_scale > 0.0f) || !(a.v_scale > 0.0f)) throw std::invalid_argument("prefill_attention: scales must be > 0");
  with_head_dim(a.layout.head_dim, [&](auto d) { launch_for_dim<decltype(d)::value>(a, stream); });
}

template <class T, class C>
int32_t ctas_per_sm(const prefill_attention_args<T, C>& a, bool with_trees) {
  check_shape(a);
  return with_head_dim(a.layout.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return with_trees ? kernel_ctas_per_sm<D, true>(a) : kernel_ctas_per_sm<D, false>(a);
  });
}

}  // namespace

int32_t prefill_tile_tokens(prefill_kernel kernel, int32_t head_dim, int32_t num_heads, int32_t num_kv_heads) {
  const int32_t rows = tile_rows(kernel, head_dim);
  if (rows == 0 || num_kv_heads < 1 || num_heads < 1 || num_heads % num_kv_heads != 0) return 0;
  return rows / std::min(num_heads / num_kv_heads, rows);
}

split_plan plan_prefill_split(prefill_kernel kernel, int32_t num_tiles, int32_t head_dim, int32_t num_heads,
                              int32_t num_kv_heads, int32_t max_context, cta_slots slots) {
  if (prefill_tile_tokens(kernel, head_dim, num_heads, num_kv_heads) == 0 || num_tiles < 1) return {};
  // As plan_attention_split, for walks over 1024 positions, in partitions of over 512 (n / ceil(n /
  // 1024) > 512 for n > 1024), each a multiple of every K-tile size (16, 32), so that no K tile is cut
  // in two.
  const int32_t group = num_heads / num_kv_heads;
  const int32_t heads_per_cta = std::min(group, tile_rows(kernel, head_dim));
  const int64_t ctas = static_cast<int64_t>(num_tiles) * num_kv_heads * ((group + heads_per_cta - 1) / heads_per_cta);
  return plan_wave_split(ctas, max_context, 1024, 32, slots);
}

int64_t prefill_workspace_floats(int32_t num_tiles, int32_t tile_tokens, int32_t num_heads, int32_t head_dim,
                                 int32_t num_splits) {
  // Per launch of at most 65535 tiles (prefill_attention launches larger plans in parts).
  const int64_t tiles = std::min(num_tiles, 65535);
  return tiles * tile_tokens * num_heads * num_splits * (head_dim + 2);
}

int32_t prefill_min_tokens_from_env() noexcept {
  static const int32_t tokens =
      int_setting_from_env("TESSERA_PREFILL_MIN_TOKENS", kDefaultPrefillMinTokens, 1, 1 << 20);
  return tokens;
}

std::vector<prefill_tile> plan_prefill_tiles(const std::vector<prefill_tile>& chunks, int32_t tile_tokens) {
  if (tile_tokens < 1) throw std::invalid_argument("plan_prefill_tiles: tile_tokens must be >= 1");
  std::vector<prefill_tile> tiles;
  for (const prefill_tile& c : chunks) {
    for (int32_t t0 = 0; t0 < c.num_tokens; t0 += tile_tokens) {
      tiles.push_back(
          {c.token_begin + t0, std::min(tile_tokens, c.num_tokens - t0), c.first_position + t0, c.table_row});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const prefill_tile& x, const prefill_tile& y) {
    return x.first_position + x.num_tokens > y.first_position + y.num_tokens;
  });
  return tiles;
}

int32_t prefill_attention_ctas_per_sm(const prefill_attention_args<float>& a, bool with_trees) {
  return ctas_per_sm(a, with_trees);
}
int32_t prefill_attention_ctas_per_sm(const prefill_attention_args<bf16>& a, bool with_trees) {
  return ctas_per_sm(a, with_trees);
}
int32_t prefill_attention_ctas_per_sm(const prefill_attention_args<bf16, fp8_e4m3>& a, bool with_trees) {
  return ctas_per_sm(a, with_trees);
}

void prefill_attention(const prefill_attention_args<float>& a, cudaStream_t stream) { launch(a, stream); }
void prefill_attention(const prefill_attention_args<bf16>& a, cudaStream_t stream) { launch(a, stream); }
void prefill_attention(const prefill_attention_args<bf16, fp8_e4m3>& a, cudaStream_t stream) { launch(a, stream); }

}  // namespace tessera::gpu
