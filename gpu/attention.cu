#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "gpu/attention.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/launch.cuh"

namespace tessera::gpu {

namespace {

using detail::from_float;
using detail::load_floats;
using detail::warp_sum;

constexpr int kWarps = 4;     // warps per CTA; each walks every kWarps-th position of the partition
constexpr int kMaxGroup = 8;  // query heads per CTA (larger GQA groups take several CTAs)
constexpr int kUnroll = 4;    // positions a warp loads before computing on them

// grid: (num_tokens, num_kv_heads * group_chunks, num_splits), block: 32 * kWarps.
// Warp w walks runs of kUnroll positions starting at start + (w + kWarps * i) * kUnroll. Each warp
// keeps, for each of the CTA's query heads, a running max m, sum l and unnormalised output acc over
// the positions it visited (a lane holds D/32 consecutive dims); the warps' states are then merged
// through shared memory: the same algebra as flash-attention's rescaling.
template <int D, class T>
__global__ void __launch_bounds__(32 * kWarps) paged_attention_kernel(paged_attention_args<T> a, int32_t group_chunks) {
  constexpr int E = D / 32;
  __shared__ float q_s[kMaxGroup][D];
  __shared__ float m_s[kWarps][kMaxGroup];
  __shared__ float l_s[kWarps][kMaxGroup];
  __shared__ float acc_s[kWarps][kMaxGroup][D];

  const int32_t token = blockIdx.x;
  const int32_t kvh = blockIdx.y / group_chunks;
  const int32_t chunk = blockIdx.y % group_chunks;
  const int32_t split = blockIdx.z;
  const int32_t nkv = a.layout.num_kv_heads;
  const int32_t group = a.num_heads / nkv;
  const int32_t head0 = kvh * group + chunk * kMaxGroup;
  const int32_t ng = min(kMaxGroup, group - chunk * kMaxGroup);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const float* q = a.q + static_cast<int64_t>(token) * a.q_stride + static_cast<int64_t>(head0) * D;
  for (int i = threadIdx.x; i < ng * D; i += blockDim.x) q_s[i / D][i % D] = q[i] * a.scale;
  __syncthreads();

  const int32_t ctx = a.context_lens[token];
  const int32_t* table = a.block_tables + static_cast<int64_t>(a.token_seq[token]) * a.max_blocks_per_seq;
  const int32_t start = a.num_splits == 1 ? 0 : split * a.partition_size;
  const int32_t end = a.num_splits == 1 ? ctx : min(ctx, start + a.partition_size);
  const int32_t bs = a.layout.block_size;
  const int64_t block_elems = a.layout.block_elems();
  const int64_t k_off = ((static_cast<int64_t>(a.layer) * 2 + 0) * nkv + kvh) * bs * D + lane * E;
  const int64_t v_off = ((static_cast<int64_t>(a.layer) * 2 + 1) * nkv + kvh) * bs * D + lane * E;

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][E];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }
  // Each warp takes kUnroll consecutive positions at a time and issues all their K/V loads before
  // any arithmetic, so several memory requests per warp are in flight (decode is bandwidth-bound).
  for (int32_t j0 = start + warp * kUnroll; j0 < end; j0 += kWarps * kUnroll) {
    float kf[kUnroll][E], vf[kUnroll][E];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = j0 + u;
      if (j < end) {
        const T* base = a.kv_cache + static_cast<int64_t>(table[j / bs]) * block_elems + static_cast<int64_t>(j % bs) * D;
        load_floats<T, E>(base + k_off, kf[u]);
        load_floats<T, E>(base + v_off, vf[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j0 + u >= end) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < ng) {
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < E; ++e) s += q_s[g][lane * E + e] * kf[u][e];
          s = warp_sum(s);
          const float m_new = fmaxf(m[g], s);
          const float correction = expf(m[g] - m_new);  // 0 on the first position (m = -inf)
          const float p = expf(s - m_new);
          l[g] = l[g] * correction + p;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * correction + p * vf[u][e];
          m[g] = m_new;
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < ng) {
      if (lane == 0) {
        m_s[warp][g] = m[g];
        l_s[warp][g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < E; ++e) acc_s[warp][g][lane * E + e] = acc[g][e];
    }
  }
  __syncthreads();

  for (int i = threadIdx.x; i < ng * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][g]);
    float sum = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = expf(m_s[w][g] - mx);  // 0 for a warp that saw no position
        sum += l_s[w][g] * f;
        o += acc_s[w][g][d] * f;
      }
    }
    const int32_t head = head0 + g;
    if (a.num_splits == 1) {
      a.out[static_cast<int64_t>(token) * a.out_stride + static_cast<int64_t>(head) * D + d] =
          from_float<T>(sum > 0.0f ? o / sum : 0.0f);
    } else {
      const int64_t part = (static_cast<int64_t>(token) * a.num_heads + head) * a.num_splits + split;
      float* part_o = a.workspace;
      float* part_ml = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * a.num_splits * D;
      part_o[part * D + d] = o;
      if (d == 0) {
        part_ml[2 * part] = mx;
        part_ml[2 * part + 1] = sum;
      }
    }
  }
}

// grid: (num_tokens, num_heads), block: head_dim threads. Merges the partitions of one (token, head).
template <class T>
__global__ void combine_splits_kernel(paged_attention_args<T> a) {
  const int32_t token = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  const int32_t D = a.layout.head_dim;
  const int64_t first = (static_cast<int64_t>(token) * a.num_heads + head) * a.num_splits;
  const float* part_o = a.workspace;
  const float* part_ml = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * a.num_splits * D;
  float mx = -INFINITY;
  for (int32_t s = 0; s < a.num_splits; ++s) mx = fmaxf(mx, part_ml[2 * (first + s)]);
  float sum = 0.0f, o = 0.0f;
  if (mx != -INFINITY) {
    for (int32_t s = 0; s < a.num_splits; ++s) {
      const float m = part_ml[2 * (first + s)];
      if (m == -INFINITY) continue;  // a partition past this token's context
      const float f = expf(m - mx);
      sum += part_ml[2 * (first + s) + 1] * f;
      o += part_o[(first + s) * D + d] * f;
    }
  }
  a.out[static_cast<int64_t>(token) * a.out_stride + static_cast<int64_t>(head) * D + d] =
      from_float<T>(sum > 0.0f ? o / sum : 0.0f);
}

template <int D, class T>
void launch_for_dim(const paged_attention_args<T>& a, cudaStream_t stream) {
  const int32_t nkv = a.layout.num_kv_heads;
  const int32_t group = a.num_heads / nkv;
  const int32_t group_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(nkv * group_chunks),
                  static_cast<unsigned>(a.num_splits));
  TESSERA_LAUNCH(grid, 32 * kWarps, 0, stream, paged_attention_kernel<D, T>)(a, group_chunks);
  CUDA_CHECK(cudaGetLastError());
  if (a.num_splits > 1) {
    TESSERA_LAUNCH(dim3(a.num_tokens, a.num_heads), D, 0, stream, combine_splits_kernel<T>)(a);
    CUDA_CHECK(cudaGetLastError());
  }
}

template <class T>
void launch(const paged_attention_args<T>& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return;
  if (a.layout.num_kv_heads < 1 || a.num_heads % a.layout.num_kv_heads != 0) {
    throw std::invalid_argument("paged_attention: num_heads must be a multiple of num_kv_heads");
  }
  if (a.num_splits < 1 || a.num_splits > 65535 || (a.num_splits > 1 && (a.partition_size < 1 || !a.workspace))) {
    throw std::invalid_argument("paged_attention: bad split (num_splits, partition_size, workspace)");
  }
  if (a.layout.num_kv_heads * ((a.num_heads / a.layout.num_kv_heads + kMaxGroup - 1) / kMaxGroup) > 65535) {
    throw std::invalid_argument("paged_attention: too many heads for one launch");
  }
  switch (a.layout.head_dim) {
    case 64: return launch_for_dim<64>(a, stream);
    case 128: return launch_for_dim<128>(a, stream);
    case 256: return launch_for_dim<256>(a, stream);
    default:
      throw std::invalid_argument("paged_attention: head_dim " + std::to_string(a.layout.head_dim) +
                                  " is not compiled (64, 128, 256)");
  }
}

}  // namespace

bool attention_supports_head_dim(int32_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

int64_t attention_workspace_floats(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t num_splits) {
  return static_cast<int64_t>(num_tokens) * num_heads * num_splits * (head_dim + 2);
}

split_plan plan_attention_split(int32_t num_tokens, int32_t num_kv_heads, int32_t max_context, int32_t num_sms) {
  split_plan p;
  // Below ~1k positions one CTA per (token, KV head) is fast enough; above it, split only when the
  // unsplit grid would leave multiprocessors idle (decode of a small batch on a long context).
  constexpr int32_t min_partition = 512;
  const int64_t ctas = static_cast<int64_t>(num_tokens) * num_kv_heads;
  if (ctas == 0 || max_context <= 2 * min_partition || ctas >= 2 * static_cast<int64_t>(num_sms)) return p;
  const int64_t want = (4 * static_cast<int64_t>(num_sms) + ctas - 1) / ctas;  // ~4 CTAs per SM
  const int64_t most = (max_context + min_partition - 1) / min_partition;
  const int64_t splits = std::clamp<int64_t>(std::min(want, most), 1, 256);
  if (splits == 1) return p;
  p.num_splits = static_cast<int32_t>(splits);
  p.partition_size = static_cast<int32_t>((max_context + splits - 1) / splits);
  return p;
}

void paged_attention(const paged_attention_args<float>& a, cudaStream_t stream) { launch(a, stream); }
void paged_attention(const paged_attention_args<bf16>& a, cudaStream_t stream) { launch(a, stream); }

}  // namespace tessera::gpu
