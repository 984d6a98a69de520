#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/kernels.hpp"
#include "gpu/launch.cuh"

namespace tessera::gpu {

namespace {

using detail::block_sum;
using detail::from_float;
using detail::to_float;
using detail::warp_sum;

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_gather_kernel(float* out, const T* table, const int32_t* ids, int32_t hidden, int32_t vocab,
                                        float scale) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int32_t row = blockIdx.x;
  const int32_t id = ids[row];
  float* dst = out + static_cast<int64_t>(row) * hidden;
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + static_cast<int64_t>(valid ? id : 0) * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = valid ? to_float(src[i]) * scale : 0.0f;
}

// out[b] = rms_norm(source row) * weight. The source row is residual[i], i = b or row_index[b], plus,
// when x is given, x[i] (add_rms_norm) or rms_norm(x[i]) * post_weight (a post-norm, Gemma 2/3). The
// sum is written back to residual only without row_index (rms_norm_rows reads its rows only); out may
// be null (the residual update alone). The sums of squares are accumulated in fp32 like the CPU
// executor's; the row is read twice (the second read hits L1/L2: hidden <= 16K floats per row).
template <class T>
__global__ void rms_norm_kernel(T* out, float* residual, const float* x, const float* post_weight,
                                const int32_t* row_index, const float* weight, int32_t hidden, float eps) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int64_t src_row = row_index ? row_index[blockIdx.x] : blockIdx.x;
  float* src = residual + src_row * hidden;
  const float* add = x ? x + src_row * hidden : nullptr;
  float add_scale = 1.0f;
  if (add && post_weight) {
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) ss += add[i] * add[i];
    add_scale = rsqrtf(block_sum(ss) / static_cast<float>(hidden) + eps);
  }
  const bool write_back = add && !row_index;
  // The row's value at i (CPU order: x + (y * scale) * w).
  auto value = [&](int32_t i) {
    float v = src[i];
    if (add) v += post_weight ? add[i] * add_scale * post_weight[i] : add[i];
    return v;
  };
  float sum_sq = 0.0f;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = value(i);
    if (write_back) src[i] = v;
    sum_sq += v * v;
  }
  if (!out) return;  // the same for every thread: no barrier is left half-reached
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);
  T* dst = out + static_cast<int64_t>(blockIdx.x) * hidden;
  // After write_back, each thread re-reads only the elements it wrote itself.
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    dst[i] = from_float<T>((write_back ? src[i] : value(i)) * inv_rms * weight[i]);
  }
}

// The same norm with the row held in registers: every 16-byte load of the row is issued before
// the first store, so a row costs one memory round trip. The kernel above loads, adds and stores one
// element per iteration, and as its pointers may alias, each iteration's loads wait for the previous
// store: at batch 1 (one CTA) that is a chain of hidden / 256 round trips per norm, which made the
// 97 norm and RoPE launches of a Llama-3-8B decode step cost 1.3 ms on an H200.
// Used when hidden % 4 == 0, hidden <= kNormMaxHidden and the pointers are 16-byte aligned.
constexpr int kNormChunks = 8;  // float4 per thread
constexpr int32_t kNormMaxHidden = kThreads * kNormChunks * 4;

__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(bf16* p, float4 v) {
  __nv_bfloat162 pair[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
  *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(pair);
}

// Same arguments and result as rms_norm_kernel.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rms_norm_vec4_kernel(T* __restrict__ out, float* __restrict__ residual, const float* __restrict__ x,
                         const float* __restrict__ post_weight, const int32_t* __restrict__ row_index,
                         const float* __restrict__ weight, int32_t hidden, float eps) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int64_t src_row = row_index ? row_index[blockIdx.x] : blockIdx.x;
  float4* src = reinterpret_cast<float4*>(residual + src_row * hidden);
  const float4* add = x ? reinterpret_cast<const float4*>(x + src_row * hidden) : nullptr;
  const int32_t n4 = hidden / 4;
  float4 v[kNormChunks], a[kNormChunks];
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int32_t i = c * kThreads + static_cast<int32_t>(threadIdx.x);
    if (i < n4) {
      v[c] = src[i];
      a[c] = add ? add[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  if (add && post_weight) {  // a post-norm: a = rms_norm(x) * post_weight first (CPU order: (x * scale) * w)
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < kNormChunks; ++c) {
      const int32_t i = c * kThreads + static_cast<int32_t>(threadIdx.x);
      if (i < n4) ss += a[c].x * a[c].x + a[c].y * a[c].y + a[c].z * a[c].z + a[c].w * a[c].w;
    }
    const float scale = rsqrtf(block_sum(ss) / static_cast<float>(hidden) + eps);
    const float4* pw = reinterpret_cast<const float4*>(post_weight);
#pragma unroll
    for (int c = 0; c < kNormChunks; ++c) {
      const int32_t i = c * kThreads + static_cast<int32_t>(threadIdx.x);
      if (i < n4) {
        const float4 w = pw[i];
        a[c] = make_float4(a[c].x * scale * w.x, a[c].y * scale * w.y, a[c].z * scale * w.z, a[c].w * scale * w.w);
      }
    }
  }
  const bool write_back = add && !row_index;
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int32_t i = c * kThreads + static_cast<int32_t>(threadIdx.x);
    if (i < n4) {
      if (add) v[c] = make_float4(v[c].x + a[c].x, v[c].y + a[c].y, v[c].z + a[c].z, v[c].w + a[c].w);
      if (write_back) src[i] = v[c];
      sum_sq += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
    }
  }
  if (!out) return;  // the same for every thread
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);
  const float4* w = reinterpret_cast<const float4*>(weight);
  T* dst = out + static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int32_t i = c * kThreads + static_cast<int32_t>(threadIdx.x);
    if (i < n4) {
      const float4 wi = w[i];
      store4(dst + 4 * static_cast<int64_t>(i), make_float4(v[c].x * inv_rms * wi.x, v[c].y * inv_rms * wi.y,
                                                            v[c].z * inv_rms * wi.z, v[c].w * inv_rms * wi.w));
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T>
bool norm_fits_vec4(const T* out, const float* residual, const float* x, const float* post_weight, const float* weight,
                    int32_t hidden) {
  return hidden % 4 == 0 && hidden <= kNormMaxHidden && aligned16(residual) && aligned16(weight) && aligned16(x) &&
         aligned16(post_weight) && reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) == 0;
}

enum class gated_act { silu, gelu_tanh };

template <gated_act A>
__device__ __forceinline__ float activate(float g) {
  if constexpr (A == gated_act::silu) {
    return g / (1.0f + expf(-g));
  } else {
    // The CPU executor's expression, term for term (cpu/cpu_executor.cpp gelu_tanh_mul).
    constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
  }
}

template <gated_act A, class T>
__global__ void gated_and_mul_kernel(T* out, const float* gate_up, int32_t rows, int32_t inter) {
  pdl_prologue();  // first: see gpu/launch.cuh
  // Flat over rows * inter, so a single decode row (14336 elements for Llama-3-8B) still spreads over
  // many multiprocessors (one CTA per row took 40 us on an H200 at batch 1).
  const int64_t total = static_cast<int64_t>(rows) * inter;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / inter, col = i % inter;
    const float g = gate_up[row * 2 * inter + col];
    out[i] = from_float<T>(activate<A>(g) * gate_up[row * 2 * inter + inter + col]);
  }
}

// cap * tanh(x / cap), with the CPU executor's 1/cap multiply (cpu/cpu_executor.cpp soft_cap).
__global__ void soft_cap_kernel(float* x, int64_t n, float cap) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const float inv = 1.0f / cap;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = cap * tanhf(x[i] * inv);
  }
}

// One thread per independent piece of a token's row, over a flat grid: a rotary pair of Q (rotated in
// place), a rotary pair of K (rotated in place and stored to the cache), a K element past rope_dims
// (partial rotary), or a V element. So nothing waits on anything: an earlier version gave each token
// one CTA that looped over the pairs and then over K/V, a chain of dependent memory round trips that
// took ~14 us per layer at batch 1 on an H200.
// grid: (num_tokens, ceil(items / 128)), block 128. items = (num_heads + nkv) * rope_dims / 2
// + nkv * (head_dim - rope_dims) + nkv * head_dim.
template <class T>
__global__ void rope_kv_write_kernel(rope_kv_args a, T* kv) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int32_t t = blockIdx.x;
  const int32_t hd = a.layout.head_dim;
  const int32_t nkv = a.layout.num_kv_heads;
  const int32_t half = a.rope_dims / 2;
  const int32_t tail = hd - a.rope_dims;
  const int32_t q_pairs = a.num_heads * half, k_pairs = nkv * half, k_tail = nkv * tail;
  int32_t i = static_cast<int32_t>(blockIdx.y * blockDim.x + threadIdx.x);
  if (i >= q_pairs + k_pairs + k_tail + nkv * hd) return;
  float* row = a.qkv + static_cast<int64_t>(t) * a.qkv_stride;
  float* k = row + static_cast<int64_t>(a.num_heads) * hd;
  const float* v = k + static_cast<int64_t>(nkv) * hd;
  const int32_t slot = a.slot_mapping[t];
  const int32_t block = slot / a.layout.block_size, offset = slot % a.layout.block_size;
  auto cache = [&](int32_t kind, int32_t h) { return kv + a.layout.offset(block, a.layer, kind, h, offset); };
  const float k_inv = 1.0f / a.k_scale, v_inv = 1.0f / a.v_scale;  // 1 but for an fp8 cache

  if (i < q_pairs + k_pairs) {
    const bool is_k = i >= q_pairs;
    if (is_k) i -= q_pairs;
    const int32_t h = i / half, p = i % half;
    float* x = (is_k ? k : row) + static_cast<int64_t>(h) * hd;
    double s, c;  // in double, as the CPU executor does; then x the attention factor in fp32, as it does
    sincos(static_cast<double>(static_cast<float>(a.positions[t]) * a.inv_freq[p]), &s, &c);
    const float cf = static_cast<float>(c) * a.attention_factor, sf = static_cast<float>(s) * a.attention_factor;
    const int32_t ia = a.interleaved_pairs ? 2 * p : p;
    const int32_t ib = a.interleaved_pairs ? 2 * p + 1 : p + half;
    const float x0 = x[ia], x1 = x[ib];
    const float r0 = x0 * cf - x1 * sf, r1 = x0 * sf + x1 * cf;
    x[ia] = r0;
    x[ib] = r1;
    if (is_k) {
      T* dst = cache(0, h);
      dst[ia] = from_float<T>(r0 * k_inv);
      dst[ib] = from_float<T>(r1 * k_inv);
    }
    return;
  }
  i -= q_pairs + k_pairs;
  if (i < k_tail) {
    const int32_t h = i / tail, d = a.rope_dims + i % tail;
    cache(0, h)[d] = from_float<T>(k[static_cast<int64_t>(h) * hd + d] * k_inv);
    return;
  }
  i -= k_tail;
  cache(1, i / hd)[i % hd] = from_float<T>(v[i] * v_inv);
}

// The same with Q/K/V biases and per-head q/k norms, which need a whole head (the norm is a sum over
// it): one warp per head of a token's row, Q heads, then K heads, then V heads. A warp stages its head
// in shared memory (+ bias, then the norm for Q and K), then rotates the pairs from there and writes
// the row back (and K, V to the cache). grid: (num_tokens, ceil(heads / kRopeWarps)),
// block kRopeWarps * 32, head_dim <= kRopeMaxHeadDim.
constexpr int kRopeWarps = 4;
constexpr int32_t kRopeMaxHeadDim = 256;

template <class T>
__global__ void __launch_bounds__(kRopeWarps * 32) rope_head_kv_write_kernel(rope_kv_args a, T* kv) {
  pdl_prologue();  // first: see gpu/launch.cuh
  __shared__ float head_s[kRopeWarps][kRopeMaxHeadDim];
  const int32_t t = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t hd = a.layout.head_dim, nkv = a.layout.num_kv_heads, nh = a.num_heads;
  const int32_t hh = static_cast<int32_t>(blockIdx.y) * kRopeWarps + warp;
  if (hh >= nh + 2 * nkv) return;  // a whole warp: no lane of a warp that goes on leaves
  const bool is_q = hh < nh, is_v = hh >= nh + nkv;
  float* x = a.qkv + static_cast<int64_t>(t) * a.qkv_stride + static_cast<int64_t>(hh) * hd;
  const float* b = a.bias ? a.bias + static_cast<int64_t>(hh) * hd : nullptr;
  float* s = head_s[warp];
  float ss = 0.0f;
  for (int32_t d = lane; d < hd; d += 32) {
    const float v = b ? x[d] + b[d] : x[d];
    s[d] = v;
    ss += v * v;
  }
  if (!is_v && a.q_norm) {  // the CPU executor's rms_norm: x * (1 / sqrt(mean(x^2) + eps)) * w
    const float* w = is_q ? a.q_norm : a.k_norm;
    const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(hd) + a.eps);
    for (int32_t d = lane; d < hd; d += 32) s[d] = s[d] * inv * w[d];
  }
  __syncwarp();  // the pairs below read other lanes' elements
  const int32_t slot = a.slot_mapping[t];
  const int32_t block = slot / a.layout.block_size, offset = slot % a.layout.block_size;
  if (is_v) {
    T* dst = kv + a.layout.offset(block, a.layer, 1, hh - nh - nkv, offset);
    const float v_inv = 1.0f / a.v_scale;
    for (int32_t d = lane; d < hd; d += 32) {
      x[d] = s[d];
      dst[d] = from_float<T>(s[d] * v_inv);
    }
    return;
  }
  const float k_inv = 1.0f / a.k_scale;
  T* kdst = is_q ? nullptr : kv + a.layout.offset(block, a.layer, 0, hh - nh, offset);
  const float pos = static_cast<float>(a.positions[t]);
  const int32_t half = a.rope_dims / 2;
  for (int32_t p = lane; p < half; p += 32) {
    double sn, cs;  // as rope_kv_write_kernel
    sincos(static_cast<double>(pos * a.inv_freq[p]), &sn, &cs);
    const float cf = static_cast<float>(cs) * a.attention_factor, sf = static_cast<float>(sn) * a.attention_factor;
    const int32_t ia = a.interleaved_pairs ? 2 * p : p;
    const int32_t ib = a.interleaved_pairs ? 2 * p + 1 : p + half;
    const float x0 = s[ia], x1 = s[ib];
    const float r0 = x0 * cf - x1 * sf, r1 = x0 * sf + x1 * cf;
    x[ia] = r0;
    x[ib] = r1;
    if (kdst) {
      kdst[ia] = from_float<T>(r0 * k_inv);
      kdst[ib] = from_float<T>(r1 * k_inv);
    }
  }
  for (int32_t d = a.rope_dims + lane; d < hd; d += 32) {  // partial rotary: the rest as it is
    x[d] = s[d];
    if (kdst) kdst[d] = from_float<T>(s[d] * k_inv);
  }
}

__global__ void block_copy_kernel(uint4* kv, const int32_t* pairs, int64_t words_per_block) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int64_t src = pairs[2 * blockIdx.y], dst = pairs[2 * blockIdx.y + 1];
  if (src == dst) return;
  const uint4* from = kv + src * words_per_block;
  uint4* to = kv + dst * words_per_block;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words_per_block;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    to[i] = from[i];
  }
}

__global__ void take_sampled_tokens_kernel(int32_t* ids, const int32_t* pairs, int32_t n, const int32_t* sampled) {
  pdl_prologue();  // first: see gpu/launch.cuh
  for (int32_t i = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int32_t>(gridDim.x * blockDim.x)) {
    ids[pairs[2 * i]] = sampled[pairs[2 * i + 1]];
  }
}

template <class T>
void launch_embedding(float* out, const T* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream, float scale) {
  if (rows == 0) return;
  TESSERA_LAUNCH_PDL(rows, kThreads, 0, stream, embedding_gather_kernel<T>)(out, table, ids, hidden, vocab, scale);
  CUDA_CHECK(cudaGetLastError());
}

// residual: the source rows (written when x is given and row_index is not); row_index: the rows to
// normalise (null: every row). The register-held kernel when the row fits it, else the general one.
template <class T>
void launch_rms_norm(T* out, float* residual, const float* x, const float* post_weight, const int32_t* row_index,
                     const float* weight, int32_t rows, int32_t hidden, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  if (norm_fits_vec4(out, residual, x, post_weight, weight, hidden)) {
    TESSERA_LAUNCH_PDL(rows, kThreads, 0, stream, rms_norm_vec4_kernel<T>)
    (out, residual, x, post_weight, row_index, weight, hidden, eps);
  } else {
    TESSERA_LAUNCH_PDL(rows, kThreads, 0, stream, rms_norm_kernel<T>)
    (out, residual, x, post_weight, row_index, weight, hidden, eps);
  }
  CUDA_CHECK(cudaGetLastError());
}

template <gated_act A, class T>
void launch_gated_and_mul(T* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t total = static_cast<int64_t>(rows) * inter;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 4096));
  TESSERA_LAUNCH_PDL(blocks, kThreads, 0, stream, gated_and_mul_kernel<A, T>)(out, gate_up, rows, inter);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_rope_kv_write(const rope_kv_args& a, T* kv, cudaStream_t stream) {
  if (a.num_tokens == 0) return;
  if (a.rope_dims < 2 || a.rope_dims % 2 != 0 || a.rope_dims > a.layout.head_dim) {
    throw std::invalid_argument("rope_kv_write: rope_dims must be even and in [2, head_dim]");
  }
  const int32_t nkv = a.layout.num_kv_heads, hd = a.layout.head_dim;
  if (!(a.k_scale > 0.0f) || !(a.v_scale > 0.0f)) throw std::invalid_argument("rope_kv_write: scales must be > 0");
  if ((a.q_norm == nullptr) != (a.k_norm == nullptr)) {
    throw std::invalid_argument("rope_kv_write: q_norm and k_norm come together");
  }
  if (a.bias || a.q_norm) {
    if (hd > kRopeMaxHeadDim) throw std::invalid_argument("rope_kv_write: bias / q/k norm need head_dim <= 256");
    const int32_t heads = a.num_heads + 2 * nkv;
    const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>((heads + kRopeWarps - 1) / kRopeWarps));
    TESSERA_LAUNCH_PDL(grid, kRopeWarps * 32, 0, stream, rope_head_kv_write_kernel<T>)(a, kv);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int64_t items =
      int64_t{a.num_heads + nkv} * (a.rope_dims / 2) + int64_t{nkv} * (hd - a.rope_dims) + int64_t{nkv} * hd;
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>((items + 127) / 128));
  TESSERA_LAUNCH_PDL(grid, 128, 0, stream, rope_kv_write_kernel<T>)(a, kv);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

void embedding_gather(float* out, const float* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream, float scale) {
  launch_embedding(out, table, ids, rows, hidden, vocab, stream, scale);
}
void embedding_gather(float* out, const bf16* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream, float scale) {
  launch_embedding(out, table, ids, rows, hidden, vocab, stream, scale);
}

void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream) {
  launch_rms_norm(out, residual, x, nullptr, nullptr, weight, rows, hidden, eps, stream);
}
void add_rms_norm(bf16* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream) {
  launch_rms_norm(out, residual, x, nullptr, nullptr, weight, rows, hidden, eps, stream);
}

void post_norm_add_rms_norm(float* out, float* residual, const float* y, const float* post_weight, const float* weight,
                            int32_t rows, int32_t hidden, float eps, cudaStream_t stream) {
  launch_rms_norm(out, residual, y, post_weight, nullptr, weight, rows, hidden, eps, stream);
}
void post_norm_add_rms_norm(bf16* out, float* residual, const float* y, const float* post_weight, const float* weight,
                            int32_t rows, int32_t hidden, float eps, cudaStream_t stream) {
  launch_rms_norm(out, residual, y, post_weight, nullptr, weight, rows, hidden, eps, stream);
}

void rms_norm_rows(float* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream, const float* y, const float* post_weight) {
  // Read only: with row_index the kernels never write their source.
  launch_rms_norm(out, const_cast<float*>(x), y, post_weight, row_index, weight, rows, hidden, eps, stream);
}
void rms_norm_rows(bf16* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream, const float* y, const float* post_weight) {
  // Read only: with row_index the kernels never write their source.
  launch_rms_norm(out, const_cast<float*>(x), y, post_weight, row_index, weight, rows, hidden, eps, stream);
}

split_plan plan_wave_split(int64_t ctas, int32_t max_context, int32_t min_partition, int32_t granule, cta_slots slots) {
  const int64_t wave = std::max<int64_t>(slots.total(), 1);
  if (ctas < 1 || min_partition < 1 || granule < 1 || ctas >= wave || max_context <= min_partition) return {};
  const int64_t most = (static_cast<int64_t>(max_context) + min_partition - 1) / min_partition;
  const int64_t splits = std::min<int64_t>({wave / ctas, most, 256});
  if (splits <= 1) return {};
  const int64_t partition = ((max_context + splits - 1) / splits + granule - 1) / granule * granule;
  split_plan p;
  p.num_splits = static_cast<int32_t>((max_context + partition - 1) / partition);  // none left empty
  p.partition_size = static_cast<int32_t>(partition);
  return p.num_splits > 1 ? p : split_plan{};
}

void silu_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  launch_gated_and_mul<gated_act::silu>(out, gate_up, rows, inter, stream);
}
void silu_and_mul(bf16* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  launch_gated_and_mul<gated_act::silu>(out, gate_up, rows, inter, stream);
}
void gelu_tanh_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  launch_gated_and_mul<gated_act::gelu_tanh>(out, gate_up, rows, inter, stream);
}
void gelu_tanh_and_mul(bf16* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  launch_gated_and_mul<gated_act::gelu_tanh>(out, gate_up, rows, inter, stream);
}

void soft_cap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  if (!(cap > 0.0f)) throw std::invalid_argument("soft_cap: cap must be > 0");
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  TESSERA_LAUNCH_PDL(blocks, kThreads, 0, stream, soft_cap_kernel)(x, n, cap);
  CUDA_CHECK(cudaGetLastError());
}

void rope_kv_write(const rope_kv_args& a, float* kv_cache, cudaStream_t stream) {
  launch_rope_kv_write(a, kv_cache, stream);
}
void rope_kv_write(const rope_kv_args& a, bf16* kv_cache, cudaStream_t stream) {
  launch_rope_kv_write(a, kv_cache, stream);
}
void rope_kv_write(const rope_kv_args& a, fp8_e4m3* kv_cache, cudaStream_t stream) {
  launch_rope_kv_write(a, kv_cache, stream);
}

void take_sampled_tokens(int32_t* ids, const int32_t* pairs, int32_t n, const int32_t* sampled, cudaStream_t stream) {
  if (n == 0) return;
  TESSERA_LAUNCH_PDL(std::min((n + 255) / 256, 64), 256, 0, stream, take_sampled_tokens_kernel)(ids, pairs, n, sampled);
  CUDA_CHECK(cudaGetLastError());
}

void block_copy(void* kv_cache, int64_t block_bytes, const int32_t* pairs, int32_t num_copies, cudaStream_t stream) {
  if (num_copies == 0) return;
  if (block_bytes % 16 != 0) throw std::invalid_argument("block_copy: block size in bytes is not a multiple of 16");
  const int64_t words = block_bytes / 16;
  const int64_t per_cta = 256 * 8;  // 32 KiB per CTA
  constexpr int32_t max_grid_y = 65535;
  for (int32_t first = 0; first < num_copies; first += max_grid_y) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((words + per_cta - 1) / per_cta, 1024)),
                    static_cast<unsigned>(std::min(max_grid_y, num_copies - first)));
    TESSERA_LAUNCH_PDL(grid, 256, 0, stream, block_copy_kernel)
    (static_cast<uint4*>(kv_cache), pairs + 2 * int64_t{first}, words);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace tessera::gpu
