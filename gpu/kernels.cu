#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/launch.cuh"
#include "gpu/kernels.hpp"

namespace tessera::gpu {

namespace {

using detail::block_sum;
using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_gather_kernel(float* out, const T* table, const int32_t* ids, int32_t hidden,
                                        int32_t vocab) {
  const int32_t row = blockIdx.x;
  const int32_t id = ids[row];
  float* dst = out + static_cast<int64_t>(row) * hidden;
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + static_cast<int64_t>(valid ? id : 0) * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = valid ? to_float(src[i]) : 0.0f;
}

// The sum of squares is accumulated in fp32 like the CPU reference; the row is read twice (the second
// read hits L1/L2: hidden <= 16K floats per row).
template <class T>
__global__ void add_rms_norm_kernel(T* out, float* residual, const float* x, const float* weight, int32_t hidden,
                                    float eps) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  float sum_sq = 0.0f;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = residual[base + i];
    if (x) {
      v += x[base + i];
      residual[base + i] = v;
    }
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[base + i] = from_float<T>(residual[base + i] * inv_rms * weight[i]);
  }
}

template <class T>
__global__ void rms_norm_rows_kernel(T* out, const float* x, const int32_t* row_index, const float* weight,
                                     int32_t hidden, float eps) {
  const float* src = x + static_cast<int64_t>(row_index[blockIdx.x]) * hidden;
  T* dst = out + static_cast<int64_t>(blockIdx.x) * hidden;
  float sum_sq = 0.0f;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) sum_sq += src[i] * src[i];
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = from_float<T>(src[i] * inv_rms * weight[i]);
}

template <class T>
__global__ void silu_and_mul_kernel(T* out, const float* gate_up, int32_t rows, int32_t inter) {
  // Flat over rows * inter, so a single decode row (14336 elements for Llama-3-8B) still spreads over
  // many multiprocessors (one CTA per row took 40 us on an H200 at batch 1).
  const int64_t total = static_cast<int64_t>(rows) * inter;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / inter, col = i % inter;
    const float g = gate_up[row * 2 * inter + col];
    out[i] = from_float<T>(g / (1.0f + expf(-g)) * gate_up[row * 2 * inter + inter + col]);
  }
}

template <class T>
__global__ void rope_kv_write_kernel(rope_kv_args a, T* kv) {
  const int32_t t = blockIdx.x;
  const int32_t hd = a.layout.head_dim;
  const int32_t nkv = a.layout.num_kv_heads;
  const int32_t half = a.rope_dims / 2;
  float* row = a.qkv + static_cast<int64_t>(t) * a.qkv_stride;
  const float pos = static_cast<float>(a.positions[t]);
  // Q heads then K heads are contiguous in the row: rotate every (head, pair) of both.
  const int32_t num_pairs = (a.num_heads + nkv) * half;
  for (int32_t i = threadIdx.x; i < num_pairs; i += blockDim.x) {
    const int32_t h = i / half, k = i % half;
    float* v = row + static_cast<int64_t>(h) * hd;
    const float angle = pos * a.inv_freq[k];
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    const float cf = static_cast<float>(c), sf = static_cast<float>(s);
    const int32_t ia = a.interleaved_pairs ? 2 * k : k;
    const int32_t ib = a.interleaved_pairs ? 2 * k + 1 : k + half;
    const float x0 = v[ia], x1 = v[ib];
    v[ia] = x0 * cf - x1 * sf;
    v[ib] = x0 * sf + x1 * cf;
  }
  __syncthreads();
  const int32_t slot = a.slot_mapping[t];
  const int32_t block = slot / a.layout.block_size, offset = slot % a.layout.block_size;
  const float* k = row + static_cast<int64_t>(a.num_heads) * hd;
  const float* v = k + static_cast<int64_t>(nkv) * hd;
  for (int32_t i = threadIdx.x; i < nkv * hd; i += blockDim.x) {
    const int32_t h = i / hd, d = i % hd;
    kv[a.layout.offset(block, a.layer, 0, h, offset) + d] = from_float<T>(k[i]);
    kv[a.layout.offset(block, a.layer, 1, h, offset) + d] = from_float<T>(v[i]);
  }
}

__global__ void block_copy_kernel(uint4* kv, const int32_t* pairs, int64_t words_per_block) {
  const int64_t src = pairs[2 * blockIdx.y], dst = pairs[2 * blockIdx.y + 1];
  if (src == dst) return;
  const uint4* from = kv + src * words_per_block;
  uint4* to = kv + dst * words_per_block;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words_per_block;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    to[i] = from[i];
  }
}

template <class T>
void launch_embedding(float* out, const T* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream) {
  if (rows == 0) return;
  TESSERA_LAUNCH(rows, kThreads, 0, stream, embedding_gather_kernel)(out, table, ids, hidden, vocab);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_add_rms_norm(T* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                         float eps, cudaStream_t stream) {
  if (rows == 0) return;
  TESSERA_LAUNCH(rows, kThreads, 0, stream, add_rms_norm_kernel)(out, residual, x, weight, hidden, eps);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_rms_norm_rows(T* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                          int32_t hidden, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  TESSERA_LAUNCH(rows, kThreads, 0, stream, rms_norm_rows_kernel)(out, x, row_index, weight, hidden, eps);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_silu_and_mul(T* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t total = static_cast<int64_t>(rows) * inter;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 4096));
  TESSERA_LAUNCH(blocks, kThreads, 0, stream, silu_and_mul_kernel)(out, gate_up, rows, inter);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_rope_kv_write(const rope_kv_args& a, T* kv, cudaStream_t stream) {
  if (a.num_tokens == 0) return;
  if (a.rope_dims < 2 || a.rope_dims % 2 != 0 || a.rope_dims > a.layout.head_dim) {
    throw std::invalid_argument("rope_kv_write: rope_dims must be even and in [2, head_dim]");
  }
  TESSERA_LAUNCH(a.num_tokens, 128, 0, stream, rope_kv_write_kernel)(a, kv);
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
                      cudaStream_t stream) {
  launch_embedding(out, table, ids, rows, hidden, vocab, stream);
}
void embedding_gather(float* out, const bf16* table, const int32_t* ids, int32_t rows, int32_t hidden, int32_t vocab,
                      cudaStream_t stream) {
  launch_embedding(out, table, ids, rows, hidden, vocab, stream);
}

void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream) {
  launch_add_rms_norm(out, residual, x, weight, rows, hidden, eps, stream);
}
void add_rms_norm(bf16* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream) {
  launch_add_rms_norm(out, residual, x, weight, rows, hidden, eps, stream);
}

void rms_norm_rows(float* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream) {
  launch_rms_norm_rows(out, x, row_index, weight, rows, hidden, eps, stream);
}
void rms_norm_rows(bf16* out, const float* x, const int32_t* row_index, const float* weight, int32_t rows,
                   int32_t hidden, float eps, cudaStream_t stream) {
  launch_rms_norm_rows(out, x, row_index, weight, rows, hidden, eps, stream);
}

void silu_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  launch_silu_and_mul(out, gate_up, rows, inter, stream);
}
void silu_and_mul(bf16* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  launch_silu_and_mul(out, gate_up, rows, inter, stream);
}

void rope_kv_write(const rope_kv_args& a, float* kv_cache, cudaStream_t stream) { launch_rope_kv_write(a, kv_cache, stream); }
void rope_kv_write(const rope_kv_args& a, bf16* kv_cache, cudaStream_t stream) { launch_rope_kv_write(a, kv_cache, stream); }

void block_copy(void* kv_cache, int64_t block_bytes, const int32_t* pairs, int32_t num_copies, cudaStream_t stream) {
  if (num_copies == 0) return;
  if (block_bytes % 16 != 0) throw std::invalid_argument("block_copy: block size in bytes is not a multiple of 16");
  const int64_t words = block_bytes / 16;
  const int64_t per_cta = 256 * 8;  // 32 KiB per CTA
  constexpr int32_t max_grid_y = 65535;
  for (int32_t first = 0; first < num_copies; first += max_grid_y) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((words + per_cta - 1) / per_cta, 1024)),
                    static_cast<unsigned>(std::min(max_grid_y, num_copies - first)));
    TESSERA_LAUNCH(grid, 256, 0, stream, block_copy_kernel)(static_cast<uint4*>(kv_cache), pairs + 2 * int64_t{first}, words);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace tessera::gpu
