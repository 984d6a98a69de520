#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "gpu/attention.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/launch.cuh"
#include "gpu/mma.cuh"

namespace tessera::gpu {

namespace {

using detail::from_float;
using detail::load_floats;
using detail::merge_splits;
using detail::warp_max;
using detail::warp_sum;

constexpr int kThreads = 128;    // per CTA
constexpr int kTile = kThreads;  // positions per tile: one per thread for Q.K
constexpr int kMaxGroup = 8;     // query heads per CTA (larger GQA groups take several CTAs)

// Query heads one CTA serves, G, is a template parameter: the smallest of 1, 2, 4, 8 that holds the
// GQA group (kMaxGroup for larger groups). The per-head registers (accumulators, scores) and the
// shared partial outputs scale with G, so a group of 4 (Llama-3-8B) neither computes P.V for 4
// empty heads nor pays 32 KiB of shared memory that would cap the CTAs resident per SM.
constexpr int heads_per_cta(int32_t group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kMaxGroup; }
// V dims per thread in P.V: VEC, a template parameter (16 bytes of T by default; see launch_for_dim).

template <class T, class C>
__device__ void merge_if_last(const paged_attention_args<T, C>& a, int32_t token, int32_t head0, int32_t ng, int D);

template <class C>
struct decode_cta;
// Dim d of query head head0 + g: o / l (the unnormalised output and its sum of weights) into out, or
// with a split the partial state (o, max m, l) into the workspace for the merge.
template <class T, class C>
__device__ __forceinline__ void store_result(const paged_attention_args<T, C>& a, const decode_cta<C>& cta, int g,
                                             int d, float o, float m, float l);

// Each head's running max (-inf), sum (0) and unnormalised output (0) before the first position.
template <int G, int E>
__device__ __forceinline__ void start_online_softmax(float (&m)[G], float (&l)[G], float (&acc)[G][E]) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }
}

// One CTA's work in both decode kernels: grid (num_tokens, num_kv_heads * group_chunks, num_splits).
// Its query token, KV head, the `ng` query heads from head0 (at most G), and the positions
// [start, end) it walks: causal, from the window's start on a sliding-window layer (blocks wholly
// before it are never read, nor the table entries naming them; the splits cut the window, not the
// context), its split's partition. A token tree's row (tree_attention_view) sits at position `pos`
// below its slot, and of the slots from tree_base on sees its ancestors' only (and, with a window,
// those whose position is inside it: ancestor r has depth <= r, so its slot base + r is at or after
// its position, which the window admits). Elsewhere pos = ctx - 1 and nothing is masked.
template <class C>
struct decode_cta {
  int32_t token = 0, kv_head = 0, head0 = 0, ng = 0, split = 0;
  int32_t start = 0, end = 0;
  int32_t pos = 0, tree_base = 0, root = -1;
  const uint32_t* ancestors = nullptr;
  const int32_t* table = nullptr;
  int32_t block_size = 0, head_dim = 0;
  int64_t block_elems = 0, k_off = 0, v_off = 0;

  template <class T>
  __device__ decode_cta(const paged_attention_args<T, C>& a, int32_t heads_per_cta, int32_t group_chunks) {
    const int32_t G = heads_per_cta;
    token = blockIdx.x;
    kv_head = static_cast<int32_t>(blockIdx.y) / group_chunks;
    const int32_t chunk = static_cast<int32_t>(blockIdx.y) % group_chunks;
    split = blockIdx.z;
    const int32_t nkv = a.layout.num_kv_heads, group = a.num_heads / nkv, D = a.layout.head_dim;
    head0 = kv_head * group + chunk * G;
    ng = min(G, group - chunk * G);
    const int32_t ctx = a.context_lens[token];
    table = a.block_tables + static_cast<int64_t>(a.token_seq[token]) * a.max_blocks_per_seq;
    root = a.tree.root != nullptr ? a.tree.root[token] : -1;
    pos = root >= 0 ? a.tree.positions[token] : ctx - 1;
    tree_base = root >= 0 ? a.context_lens[root] - 1 : ctx;
    ancestors = root >= 0 ? a.tree.mask + a.tree.mask_offset[token] : nullptr;
    const int32_t first = a.window > 0 ? max(0, pos + 1 - a.window) : 0;
    start = first + (a.num_splits == 1 ? 0 : split * a.partition_size);
    end = a.num_splits == 1 ? ctx : min(ctx, start + a.partition_size);
    block_size = a.layout.block_size;
    head_dim = D;
    block_elems = a.layout.block_elems();
    k_off = ((static_cast<int64_t>(a.layer) * 2 + 0) * nkv + kv_head) * block_size * D;
    v_off = ((static_cast<int64_t>(a.layer) * 2 + 1) * nkv + kv_head) * block_size * D;
  }
  // Position j's slot in the cache (K at + k_off, V at + v_off).
  __device__ const C* row(const C* cache, int32_t j) const {
    return cache + static_cast<int64_t>(table[j / block_size]) * block_elems +
           static_cast<int64_t>(j % block_size) * head_dim;
  }
  // False for a tree slot this row may not see (not an ancestor, or outside the window).
  template <class T>
  __device__ bool visible(const paged_attention_args<T, C>& a, int32_t j) const {
    const int32_t r = j - tree_base;  // >= 0: the slot of tree row r
    if (r < 0) return true;
    if (!((ancestors[r >> 5] >> (r & 31)) & 1u)) return false;
    return a.window <= 0 || a.tree.positions[root + r] > pos - a.window;
  }
};

template <class T, class C>
__device__ __forceinline__ void store_result(const paged_attention_args<T, C>& a, const decode_cta<C>& cta, int g,
                                             int d, float o, float m, float l) {
  const int32_t D = a.layout.head_dim, head = cta.head0 + g;
  if (a.num_splits == 1) {
    a.out[static_cast<int64_t>(cta.token) * a.out_stride + static_cast<int64_t>(head) * D + d] =
        from_float<T>(l > 0.0f ? o / l : 0.0f);
    return;
  }
  const int64_t slot = (static_cast<int64_t>(cta.token) * a.num_heads + head) * a.num_splits + cta.split;
  float* part_o = a.workspace;
  float* part_ml = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * a.num_splits * D;
  part_o[slot * D + d] = o;
  if (d == 0) {
    part_ml[2 * slot] = m;
    part_ml[2 * slot + 1] = l;
  }
}

// grid: (num_tokens, num_kv_heads * group_chunks, num_splits), block: kThreads; G query heads per CTA.
// The CTA walks its positions in tiles of kTile (flash-decoding):
//   1. Q.K: thread t scores position tile0 + t against every query head of the group (the whole K row
//      is one thread's: 16-byte loads, no cross-lane reduction per position);
//   2. softmax: tile max and sum per head by block reductions; the running max m and sum l (the same
//      in every thread) are rescaled as in flash-attention;
//   3. P.V: thread t owns VEC consecutive dims of one row part: row_lanes = D / VEC threads cover a
//      V row (coalesced), and the kThreads / row_lanes parts take every parts-th position of the tile.
// The parts' accumulators are summed through shared memory at the end.
// An earlier version gave each warp one position at a time with the head dim split over lanes: a
// warp reduction per position and head made it latency-bound (measured on an H200: 14% of HBM
// bandwidth at 32k, and 43% of a batch-1 Llama-3-8B decode step).
template <int D, int VEC, int G, class T, class C>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(paged_attention_args<T, C> a, int32_t group_chunks) {
  pdl_prologue();  // first: see gpu/launch.cuh
  constexpr int row_lanes = D / VEC;
  constexpr int parts = kThreads / row_lanes;
  static_assert(row_lanes <= kThreads && kThreads % row_lanes == 0, "head_dim must be 4..512 and divide the CTA");
  __shared__ float4 q_s[G][D / 4];  // float4: one 16-byte shared load feeds 4 FMAs per head
  __shared__ float p_s[G][kTile];
  __shared__ float red_s[kThreads / 32][G];
  __shared__ float acc_s[parts][G][D];

  const decode_cta<C> cta(a, G, group_chunks);
  const int32_t token = cta.token, head0 = cta.head0, ng = cta.ng, start = cta.start, end = cta.end;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int part = tid / row_lanes, d0 = (tid % row_lanes) * VEC;

  const float* q = a.q + static_cast<int64_t>(token) * a.q_stride + static_cast<int64_t>(head0) * D;
  for (int i = tid; i < G * D; i += kThreads) {
    // An fp8 cache holds K / k_scale: the scale goes into Q once instead of into every K element.
    reinterpret_cast<float*>(&q_s[0][0])[i] = i / D < ng ? q[i] * a.scale * a.k_scale : 0.0f;
  }
  __syncthreads();

  const bool capped = a.softcap > 0.0f;
  const float inv_cap = capped ? 1.0f / a.softcap : 0.0f;
  auto row = [&](int32_t j) { return cta.row(a.kv_cache, j); };

  float m[G], l[G], acc[G][VEC];
  start_online_softmax(m, l, acc);

  for (int32_t tile0 = start; tile0 < end; tile0 += kTile) {
    const int32_t n = min(kTile, end - tile0);
    // 1. scores of position tile0 + tid
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.0f;
    if (tid < n) {
      const C* k = row(tile0 + tid) + cta.k_off;
#pragma unroll 4
      for (int c = 0; c < D; c += 8) {
        float kf[8];
        load_floats<C, 8>(k + c, kf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (g < ng) {
            const float4 q0 = q_s[g][c / 4], q1 = q_s[g][c / 4 + 1];
            s[g] += q0.x * kf[0] + q0.y * kf[1] + q0.z * kf[2] + q0.w * kf[3] + q1.x * kf[4] + q1.y * kf[5] +
                    q1.z * kf[6] + q1.w * kf[7];
          }
        }
      }
      if (capped) {  // soft-capping of the scaled score (Gemma 2), with the CPU executor's 1/cap multiply
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = a.softcap * tanhf(s[g] * inv_cap);
      }
      if (!cta.visible(a, tile0 + tid)) {
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = -INFINITY;
      }
    }
    // 2. tile max, new running max, probabilities, tile sum
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float v = warp_max(tid < n ? s[g] : -INFINITY);
      if (lane == 0) red_s[warp][g] = v;
    }
    __syncthreads();
    float corr[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float tile_max = red_s[0][g];
#pragma unroll
      for (int w = 1; w < kThreads / 32; ++w) tile_max = fmaxf(tile_max, red_s[w][g]);
      // -inf only while every position so far was a masked tree slot (a split may hold nothing else):
      // then nothing is rescaled and every probability is 0.
      const float m_new = fmaxf(m[g], tile_max);
      corr[g] = m_new == -INFINITY ? 1.0f : expf(m[g] - m_new);  // 0 on the first tile (m = -inf)
      m[g] = m_new;
      s[g] = tid < n && s[g] != -INFINITY ? expf(s[g] - m_new) : 0.0f;
      p_s[g][tid] = s[g];
    }
    __syncthreads();  // red_s is reused for the sums; p_s complete
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float v = warp_sum(s[g]);
      if (lane == 0) red_s[warp][g] = v;
    }
    // 3. P.V over this thread's part of the tile
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[g][e] *= corr[g];
    }
#pragma unroll 8
    for (int32_t jj = part; jj < n; jj += parts) {
      float vf[VEC];
      load_floats<C, VEC>(row(tile0 + jj) + cta.v_off + d0, vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float p = p_s[g][jj];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[g][e] += p * vf[e];
      }
    }
    __syncthreads();  // the sums are in red_s; p_s and red_s are free for the next tile afterwards
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float tile_sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) tile_sum += red_s[w][g];
      l[g] = l[g] * corr[g] + tile_sum;
    }
    __syncthreads();
  }

#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc_s[part][g][d0 + e] = acc[g][e];
  }
  __syncthreads();

  for (int i = tid; i < ng * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float o = 0.0f;
#pragma unroll
    for (int p = 0; p < parts; ++p) o += acc_s[p][g][d];
    o *= a.v_scale;  // an fp8 cache holds V / v_scale (1 otherwise: exact)
    // m and l are the same in every thread; select the head's by unrolled compare (no local memory)
    float mg = -INFINITY, lg = 0.0f;
#pragma unroll
    for (int k = 0; k < G; ++k) {
      if (k == g) {
        mg = m[k];
        lg = l[k];
      }
    }
    store_result(a, cta, g, d, o, mg, lg);
  }
  if (a.num_splits > 1 && a.split_counters != nullptr) merge_if_last(a, token, head0, ng, D);
}

// ---- v2 and v3: warp tiles ------------------------------------------------------------------------

// 8 consecutive elements of a K or V row as loaded: one 8-byte (fp8), 16-byte (bf16) or two 16-byte
// (f32) loads, kept as raw words until used so that a tile's loads are all in flight at once for
// half (bf16) or a quarter (fp8) of the registers of floats.
template <class C>
struct kv_chunk {
  static constexpr int words = 2 * static_cast<int>(sizeof(C));
  uint32_t w[words];

  // From global memory (v2) or from this lane's slot of the shared stage (v3): the same words.
  __device__ __forceinline__ void load(const void* p) {
    if constexpr (words == 2) {
      const uint2 u = *static_cast<const uint2*>(p);
      w[0] = u.x;
      w[1] = u.y;
    } else {
#pragma unroll
      for (int i = 0; i < words / 4; ++i) {
        const uint4 u = static_cast<const uint4*>(p)[i];
        w[4 * i] = u.x;
        w[4 * i + 1] = u.y;
        w[4 * i + 2] = u.z;
        w[4 * i + 3] = u.w;
      }
    }
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < words; ++i) w[i] = 0u;
  }
  __device__ __forceinline__ float operator[](int e) const {
    if constexpr (sizeof(C) == 4) {
      return __uint_as_float(w[e]);
    } else if constexpr (sizeof(C) == 2) {  // bf16: the high half of an fp32
      return __uint_as_float(((w[e / 2] >> (16 * (e % 2))) & 0xFFFFu) << 16);
    } else {
      return fp8_e4m3_to_float(static_cast<uint8_t>(w[e / 4] >> (8 * (e % 4))));
    }
  }
};

// The shape of a warp tile, shared by v2 and v3: L = head_dim / 8 lanes read 8 elements each of a
// row, so a warp reads RW = 32 / L rows per instruction; a lane takes RPL rows a tile (8, or 4 where
// the registers would not hold 8: f32 rows, 8 heads), so a warp tile is TW = RW * RPL positions.
template <int D, int G, class C>
struct warp_tile_shape {
  static constexpr int VE = 8, L = D / VE, RW = 32 / L;
  static constexpr int RPL = (sizeof(C) == 4 || G == kMaxGroup) ? 4 : 8;
  static constexpr int TW = RW * RPL;
  static constexpr int W = kThreads / 32;
  static_assert(L >= 1 && L <= 32 && 32 % L == 0, "head_dim must be 8..256 and a power of two");
};

// One lane's part of a warp's walk (v2 and v3): its 8 dims of each head's query and, per head, the
// running max, sum and partial output. A lane's row in each warp-wide load is rg; its dims d0..d0+7.
template <int D, int G, class C>
struct warp_walk {
  using shape = warp_tile_shape<D, G, C>;
  static constexpr int VE = shape::VE, L = shape::L, RW = shape::RW, RPL = shape::RPL;
  int rg, d0;
  float qr[G][VE];
  float m[G], l[G], acc[G][VE];

  // An fp8 cache holds K / k_scale, so k_scale goes into the query here.
  template <class T>
  __device__ __forceinline__ warp_walk(const paged_attention_args<T, C>& a, const decode_cta<C>& cta, int lane)
      : rg(lane / L), d0((lane % L) * VE) {
    const float* q = a.q + static_cast<int64_t>(cta.token) * a.q_stride + static_cast<int64_t>(cta.head0) * D + d0;
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < VE; ++e) qr[g][e] = g < cta.ng ? q[g * D + e] * a.scale * a.k_scale : 0.0f;
    }
    start_online_softmax(m, l, acc);
  }

  // The tile of positions from tile0, whose row i (position tile0 + i * RW + rg) has its K chunk
  // k_of(i) and its V chunk v_of(i), zeros past cta.end (v2: from registers loaded before; v3: read
  // from shared memory where used, so only the row in use takes registers).
  //   * a score is the lane's 8-term dot product reduced over its L lanes (xor shuffles);
  //   * online softmax: the tile's max over the warp (the row groups' maxima by xor shuffles above
  //     L), then weights and this lane's partial sums; m is the same in every lane of the warp;
  //   * the weights stay in the lanes that own the row, which accumulate P.V for their 8 dims.
  template <class T, class KOf, class VOf>
  __device__ __forceinline__ void tile(const paged_attention_args<T, C>& a, const decode_cta<C>& cta, int32_t tile0,
                                       const KOf& k_of, const VOf& v_of) {
    const bool capped = a.softcap > 0.0f;
    const float inv_cap = capped ? 1.0f / a.softcap : 0.0f;
    float s[G][RPL];
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const kv_chunk<C> kc = k_of(i);
      float kf[VE];
#pragma unroll
      for (int e = 0; e < VE; ++e) kf[e] = kc[e];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < VE; ++e) dot = fmaf(qr[g][e], kf[e], dot);
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        s[g][i] = dot;
      }
      const int32_t j = tile0 + i * RW + rg;
      const bool seen = j < cta.end && cta.visible(a, j);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (capped) s[g][i] = a.softcap * tanhf(s[g][i] * inv_cap);  // the CPU executor's 1/cap multiply
        if (!seen) s[g][i] = -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float tile_max = s[g][0];
#pragma unroll
      for (int i = 1; i < RPL; ++i) tile_max = fmaxf(tile_max, s[g][i]);
#pragma unroll
      for (int off = L; off < 32; off <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float m_new = fmaxf(m[g], tile_max);
      // -inf while every position so far was masked (a tree slot), or beyond the end: rescale nothing.
      const float corr = m_new == -INFINITY ? 1.0f : expf(m[g] - m_new);
      m[g] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        s[g][i] = s[g][i] == -INFINITY ? 0.0f : expf(s[g][i] - m_new);
        sum += s[g][i];
      }
      l[g] = l[g] * corr + sum;
#pragma unroll
      for (int e = 0; e < VE; ++e) acc[g][e] *= corr;
    }
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const kv_chunk<C> vc = v_of(i);
#pragma unroll
      for (int e = 0; e < VE; ++e) {
        const float v = vc[e];
#pragma unroll
        for (int g = 0; g < G; ++g) acc[g][e] = fmaf(s[g][i], v, acc[g][e]);
      }
    }
  }
};

// The warps' states in shared memory for the merge at the end of both warp kernels.
template <int D, int G>
struct warp_states {
  float m[kThreads / 32][G], l[kThreads / 32][G];
  float acc[kThreads / 32][G][D];
};

// The end of both warp kernels: the row groups' partial sums and outputs added (every lane of a row
// group has the same ones), so lanes 0..L-1 hold the warp's; then the warps' states merged as splits
// are, and the result (or a split's partials) stored.
template <int D, int G, class T, class C>
__device__ __forceinline__ void finish_warp_walks(const paged_attention_args<T, C>& a, const decode_cta<C>& cta,
                                                  warp_walk<D, G, C>& walk, warp_states<D, G>& st, int warp, int lane) {
  constexpr int L = warp_walk<D, G, C>::L, VE = warp_walk<D, G, C>::VE, W = kThreads / 32;
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int off = L; off < 32; off <<= 1) {
      walk.l[g] += __shfl_xor_sync(0xffffffffu, walk.l[g], off);
#pragma unroll
      for (int e = 0; e < VE; ++e) walk.acc[g][e] += __shfl_xor_sync(0xffffffffu, walk.acc[g][e], off);
    }
    if (lane < L) {
#pragma unroll
      for (int e = 0; e < VE; ++e) st.acc[warp][g][walk.d0 + e] = walk.acc[g][e];
    }
    if (lane == 0) {
      st.m[warp][g] = walk.m[g];
      st.l[warp][g] = walk.l[g];
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < cta.ng * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, st.m[w][g]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      if (st.m[w][g] == -INFINITY) continue;  // a warp that saw no position
      const float f = expf(st.m[w][g] - mx);
      o += st.acc[w][g][d] * f;
      sum += st.l[w][g] * f;
    }
    store_result(a, cta, g, d, o * a.v_scale, mx, sum);  // an fp8 cache holds V / v_scale
  }
  if (a.num_splits > 1 && a.split_counters != nullptr) merge_if_last(a, cta.token, cta.head0, cta.ng, D);
}

// grid, block and contract as paged_attention_kernel (v1); the default (decode_kernel::warp_tiles),
// after FlashInfer's and vLLM v2's decode kernels:
//   * lanes split each K/V row: L = head_dim / 8 lanes read 8 elements each, so a warp reads 32 / L
//     rows per instruction, coalesced (v1 gave each thread a whole row);
//   * each warp walks its own tiles of positions (warp w: tiles w, w + 4, ...) with its own running
//     max, sum and output, so the main loop has no block barrier (v1: four per tile); the four warps'
//     states are merged through shared memory once, at the end;
//   * a tile's K and V rows are all loaded before any is used (RPL rows per lane), so each warp keeps
//     RPL 16-byte loads per lane in flight for K and as many for V (warp_walk::tile computes).
template <int D, int G, class T, class C>
__global__ void __launch_bounds__(kThreads)
    paged_attention_warp_kernel(paged_attention_args<T, C> a, int32_t group_chunks) {
  pdl_prologue();  // first: see gpu/launch.cuh
  using shape = warp_tile_shape<D, G, C>;
  constexpr int RPL = shape::RPL, RW = shape::RW, TW = shape::TW, W = shape::W;
  __shared__ warp_states<D, G> states;

  const decode_cta<C> cta(a, G, group_chunks);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  warp_walk<D, G, C> walk(a, cta, lane);

  for (int32_t tile0 = cta.start + warp * TW; tile0 < cta.end; tile0 += W * TW) {
    kv_chunk<C> kc[RPL], vc[RPL];
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const int32_t j = tile0 + i * RW + walk.rg;
      if (j < cta.end) {
        const C* slot = cta.row(a.kv_cache, j) + walk.d0;
        kc[i].load(slot + cta.k_off);
        vc[i].load(slot + cta.v_off);
      } else {
        kc[i].clear();
        vc[i].clear();
      }
    }
    walk.tile(
        a, cta, tile0, [&](int i) { return kc[i]; }, [&](int i) { return vc[i]; });
  }
  finish_warp_walks(a, cta, walk, states, warp, lane);
}

// v3 (decode_kernel::staged_warp_tiles), for bf16 and fp8 caches: v2 with a two-stage cp.async
// pipeline per warp. While a warp computes tile t from shared memory, the copies of its tile t + 1
// are in flight (cp.async: global to shared with no registers), so each warp always has a tile of
// loads outstanding instead of v2's load-then-compute bursts, and the rows take registers only when
// read. Every lane reads back only the bytes it copied itself, so the pipeline needs no barrier: a
// cp.async.wait_group before reading a stage, and a __syncwarp before refilling the stage the warp
// has just read (its shared loads ordered before the copies). Rows past the end are zero-filled.
// Dynamic shared memory: kThreads / 32 warps x 2 stages x RPL rows x (K, V) x 32 lanes x 8 elements.
template <int D, int G, class C>
struct staged_tile_shape : warp_tile_shape<D, G, C> {
  using base = warp_tile_shape<D, G, C>;
  static constexpr int stages = 2;
  static constexpr int chunk_bytes = 8 * static_cast<int>(sizeof(C));
  static constexpr size_t shared_bytes = size_t{base::W} * stages * base::RPL * 2 * 32 * chunk_bytes;
  // Byte offset of (warp, stage, row i, K or V, lane)'s chunk: a lane's chunks are 8 or 16 bytes apart
  // from its neighbours', so a warp's read of one (row, K/V) is conflict-free.
  __device__ static size_t offset(int warp, int stage, int i, int kv, int lane) {
    return ((((static_cast<size_t>(warp) * stages + stage) * base::RPL + i) * 2 + kv) * 32 + lane) * chunk_bytes;
  }
};

template <int D, int G, class T, class C>
__global__ void __launch_bounds__(kThreads)
    paged_attention_staged_kernel(paged_attention_args<T, C> a, int32_t group_chunks) {
  pdl_prologue();  // first: see gpu/launch.cuh
  using shape = staged_tile_shape<D, G, C>;
  constexpr int RPL = shape::RPL, RW = shape::RW, TW = shape::TW, W = shape::W, S = shape::stages;
  static_assert(sizeof(C) <= 2, "v3 stages bf16 or fp8 rows (an f32 row chunk is two copies)");
  __shared__ warp_states<D, G> states;
  TESSERA_DYNAMIC_SHARED(uint8_t, ring);

  const decode_cta<C> cta(a, G, group_chunks);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  warp_walk<D, G, C> walk(a, cta, lane);

  // Copies the tile at tile0 into `stage` (rows past the end zero-filled, a tile wholly past it not at
  // all) and commits them as one group, empty or not, so that a group per tile keeps the wait counts.
  auto stage_tile = [&](int32_t tile0, int stage) {
    if (tile0 < cta.end) {
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int32_t j = tile0 + i * RW + walk.rg;
        const bool in = j < cta.end;
        const C* slot = cta.row(a.kv_cache, in ? j : cta.start) + walk.d0;
        const int bytes = in ? shape::chunk_bytes : 0;
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
          void* dst = ring + shape::offset(warp, stage, i, kv, lane);
          const C* src = slot + (kv == 0 ? cta.k_off : cta.v_off);
          if constexpr (shape::chunk_bytes == 16) {
            ptx::cp_async_cg_zfill(dst, src, bytes);
          } else {
            ptx::cp_async_ca_zfill<shape::chunk_bytes>(dst, src, bytes);
          }
        }
      }
    }
    ptx::cp_async_commit_group();
  };

  const int32_t first = cta.start + warp * TW;
#pragma unroll
  for (int p = 0; p < S - 1; ++p) stage_tile(first + p * W * TW, p);
  int stage = 0;
  for (int32_t tile0 = first; tile0 < cta.end; tile0 += W * TW) {
    __syncwarp();  // the stage refilled next was read in the previous iteration
    stage_tile(tile0 + (S - 1) * W * TW, (stage + S - 1) % S);
    ptx::cp_async_wait_group<S - 1>();  // this tile's group has landed
    auto staged_row = [&](int i, int kv) {
      kv_chunk<C> c;
      c.load(ring + shape::offset(warp, stage, i, kv, lane));
      return c;
    };
    walk.tile(
        a, cta, tile0, [&](int i) { return staged_row(i, 0); }, [&](int i) { return staged_row(i, 1); });
    stage = (stage + 1) % S;
  }
  ptx::cp_async_wait_all();  // nothing of this CTA's copies outlives it
  finish_warp_walks(a, cta, walk, states, warp, lane);
}

// The fused merge (paged_attention_args::split_counters): the CTA that finishes its (token, head group)
// last merges every split's partials for the group's heads and resets the counter for the next
// launch (a graph replays it).
template <class T, class C>
__device__ void merge_if_last(const paged_attention_args<T, C>& a, int32_t token, int32_t head0, int32_t ng, int D) {
  int32_t* counter = a.split_counters + static_cast<int64_t>(token) * gridDim.y + blockIdx.y;
  if (!detail::last_of_splits(counter, a.num_splits)) return;
  const volatile float* part_o = a.workspace;
  const volatile float* part_ml = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * a.num_splits * D;
  for (int i = static_cast<int>(threadIdx.x); i < ng * D; i += static_cast<int>(blockDim.x)) {
    const int32_t head = head0 + i / D, d = i % D;
    const int64_t first = (static_cast<int64_t>(token) * a.num_heads + head) * a.num_splits;
    a.out[static_cast<int64_t>(token) * a.out_stride + static_cast<int64_t>(head) * D + d] =
        from_float<T>(merge_splits(part_o, part_ml, first, a.num_splits, D, d));
  }
  if (threadIdx.x == 0) *counter = 0;
}

// grid: (num_tokens, num_heads), block: head_dim threads. Merges the partitions of one (token, head).
template <class T, class C>
__global__ void combine_splits_kernel(paged_attention_args<T, C> a) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int32_t token = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  const int32_t D = a.layout.head_dim;
  const int64_t first = (static_cast<int64_t>(token) * a.num_heads + head) * a.num_splits;
  const float* part_o = a.workspace;
  const float* part_ml = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * a.num_splits * D;
  a.out[static_cast<int64_t>(token) * a.out_stride + static_cast<int64_t>(head) * D + d] =
      from_float<T>(merge_splits(part_o, part_ml, first, a.num_splits, D, d));
}

// v3's ring may be over the 48 KiB a kernel gets without asking: asked once per kernel, before its
// first launch or occupancy query (the executor's query comes before it captures any graph).
template <int D, int G, class T, class C>
void allow_staged_ring() {
  static const bool allowed = [] {
    CUDA_CHECK(cudaFuncSetAttribute(paged_attention_staged_kernel<D, G, T, C>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(staged_tile_shape<D, G, C>::shared_bytes)));
    return true;
  }();
  (void)allowed;
}

template <int D, int VEC, int G, class T, class C>
void launch_kernels(const paged_attention_args<T, C>& a, cudaStream_t stream) {
  const int32_t nkv = a.layout.num_kv_heads;
  const int32_t group = a.num_heads / nkv;
  const int32_t group_chunks = (group + G - 1) / G;
  if (static_cast<int64_t>(nkv) * group_chunks > 65535) {  // gridDim.y
    throw std::invalid_argument("paged_attention: too many heads for one launch");
  }
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(nkv * group_chunks),
                  static_cast<unsigned>(a.num_splits));
  switch (a.kernel) {
    case decode_kernel::thread_rows:
      TESSERA_LAUNCH_PDL(grid, kThreads, 0, stream, paged_attention_kernel<D, VEC, G, T, C>)(a, group_chunks);
      break;
    case decode_kernel::warp_tiles:
      TESSERA_LAUNCH_PDL(grid, kThreads, 0, stream, paged_attention_warp_kernel<D, G, T, C>)(a, group_chunks);
      break;
    case decode_kernel::staged_warp_tiles:
      if constexpr (sizeof(C) <= 2) {  // launch() refuses it for an f32 cache
        allow_staged_ring<D, G, T, C>();
        constexpr size_t ring_bytes = staged_tile_shape<D, G, C>::shared_bytes;
        TESSERA_LAUNCH_PDL(grid, kThreads, ring_bytes, stream, paged_attention_staged_kernel<D, G, T, C>)
        (a, group_chunks);
      }
      break;
  }
  CUDA_CHECK(cudaGetLastError());
  if (a.num_splits > 1 && a.split_counters == nullptr) {
    TESSERA_LAUNCH_PDL(dim3(a.num_tokens, a.num_heads), D, 0, stream, combine_splits_kernel<T, C>)(a);
    CUDA_CHECK(cudaGetLastError());
  }
}

// What to do with the kernel a launch of `a` runs: launch it, or count the CTAs of it a multiprocessor
// holds (for the split plan). Both go through with_kernel, so the kernel counted is the one launched.
struct launch_action {
  cudaStream_t stream;
  template <int D, int VEC, int G, class T, class C>
  void run(const paged_attention_args<T, C>& a) const {
    launch_kernels<D, VEC, G>(a, stream);
  }
};
struct occupancy_action {
  int32_t* ctas_per_sm;
  template <int D, int VEC, int G, class T, class C>
  void run(const paged_attention_args<T, C>& a) const {
    switch (a.kernel) {
      case decode_kernel::thread_rows:
        *ctas_per_sm = resident_ctas_per_sm(paged_attention_kernel<D, VEC, G, T, C>, kThreads);
        break;
      case decode_kernel::warp_tiles:
        *ctas_per_sm = resident_ctas_per_sm(paged_attention_warp_kernel<D, G, T, C>, kThreads);
        break;
      case decode_kernel::staged_warp_tiles:
        if constexpr (sizeof(C) <= 2) {  // with_kernel refuses it for an f32 cache
          allow_staged_ring<D, G, T, C>();
          *ctas_per_sm = resident_ctas_per_sm(paged_attention_staged_kernel<D, G, T, C>, kThreads,
                                              staged_tile_shape<D, G, C>::shared_bytes);
        }
        break;
    }
  }
};

template <int D, int VEC, class T, class C, class Action>
void for_group(const paged_attention_args<T, C>& a, const Action& action) {
  switch (heads_per_cta(a.num_heads / a.layout.num_kv_heads)) {
    case 1: return action.template run<D, VEC, 1>(a);
    case 2: return action.template run<D, VEC, 2>(a);
    case 4: return action.template run<D, VEC, 4>(a);
    default: return action.template run<D, VEC, kMaxGroup>(a);
  }
}

template <int D, class T, class C, class Action>
void for_dim(const paged_attention_args<T, C>& a, const Action& action) {
  // v1's V elements per thread: 16 bytes of a 2- or 4-byte cache; 8 fp8 elements (8 bytes), not 16,
  // whose per-thread accumulators and per-part shared sums (acc_s: 16 parts x 8 heads x D floats) would
  // not fit. (Its 8-byte variant, TESSERA_ATTN_VEC_BYTES=8, went with v2: a third of this file's
  // kernel instantiations and of its nvcc time, for a kernel that is now the fallback.)
  constexpr int vec16 = 16 / static_cast<int>(sizeof(C) < 2 ? 2 : sizeof(C));
  for_group<D, vec16>(a, action);
}

// The kernel for a's head_dim, GQA group, types and decode_kernel, given to `action`.
template <class T, class C, class Action>
void with_kernel(const paged_attention_args<T, C>& a, const Action& action) {
  if (a.layout.num_kv_heads < 1 || a.num_heads % a.layout.num_kv_heads != 0) {
    throw std::invalid_argument("paged_attention: num_heads must be a multiple of num_kv_heads");
  }
  if (a.kernel == decode_kernel::staged_warp_tiles && sizeof(C) > 2) {
    throw std::invalid_argument("paged_attention: the staged kernel (v3) takes a bf16 or fp8 cache");
  }
  switch (a.layout.head_dim) {
    case 32: return for_dim<32>(a, action);
    case 64: return for_dim<64>(a, action);
    case 128: return for_dim<128>(a, action);
    case 256: return for_dim<256>(a, action);
    default:
      throw std::invalid_argument("paged_attention: head_dim " + std::to_string(a.layout.head_dim) +
                                  " is not compiled (32, 64, 128, 256)");
  }
}

template <class T, class C>
void launch(const paged_attention_args<T, C>& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return;
  if (a.num_splits < 1 || a.num_splits > 65535 || (a.num_splits > 1 && (a.partition_size < 1 || !a.workspace))) {
    throw std::invalid_argument("paged_attention: bad split (num_splits, partition_size, workspace)");
  }
  if (a.window < 0 || !(a.softcap >= 0.0f)) throw std::invalid_argument("paged_attention: negative window or soft-cap");
  if (!(a.k_scale > 0.0f) || !(a.v_scale > 0.0f)) throw std::invalid_argument("paged_attention: scales must be > 0");
  with_kernel(a, launch_action{stream});
}

template <class T, class C>
int32_t ctas_per_sm(const paged_attention_args<T, C>& a) {
  int32_t n = 0;
  with_kernel(a, occupancy_action{&n});
  return n;
}

}  // namespace

decode_kernel decode_kernel_from_env() noexcept {
  static const decode_kernel kernel = [] {
    const char* v = std::getenv("TESSERA_DECODE_ATTENTION");
    if (v != nullptr && std::strcmp(v, "v1") == 0) return decode_kernel::thread_rows;
    if (v != nullptr && std::strcmp(v, "v3") == 0) return decode_kernel::staged_warp_tiles;
    return decode_kernel::warp_tiles;
  }();
  return kernel;
}

bool attention_supports_head_dim(int32_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int64_t attention_workspace_floats(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t num_splits) {
  return static_cast<int64_t>(num_tokens) * num_heads * num_splits * (head_dim + 2);
}

split_plan plan_attention_split(int32_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t max_context,
                                cta_slots slots) {
  split_plan p;
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0) return p;
  // Split only when the unsplit grid leaves part of a wave idle (decode of a small batch) and the walk
  // is over two tiles, into as many partitions as fill the wave without starting a second, at most one
  // per two tiles of the walk, each of whole tiles.
  constexpr int32_t min_partition = 2 * kTile;
  const int32_t group = num_heads / num_kv_heads;
  const int64_t ctas = static_cast<int64_t>(num_tokens) * num_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup);
  return plan_wave_split(ctas, max_context, min_partition, kTile, slots);
}

int32_t paged_attention_ctas_per_sm(const paged_attention_args<float>& a) { return ctas_per_sm(a); }
int32_t paged_attention_ctas_per_sm(const paged_attention_args<bf16>& a) { return ctas_per_sm(a); }
int32_t paged_attention_ctas_per_sm(const paged_attention_args<bf16, fp8_e4m3>& a) { return ctas_per_sm(a); }

void paged_attention(const paged_attention_args<float>& a, cudaStream_t stream) { launch(a, stream); }
void paged_attention(const paged_attention_args<bf16>& a, cudaStream_t stream) { launch(a, stream); }
void paged_attention(const paged_attention_args<bf16, fp8_e4m3>& a, cudaStream_t stream) { launch(a, stream); }

}  // namespace tessera::gpu
