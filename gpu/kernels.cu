#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;

__global__ void embedding_gather_kernel(float* out, const float* table, const int32_t* ids, int32_t hidden,
                                        int32_t vocab) {
  const int32_t row = blockIdx.x;
  const int32_t id = ids[row];
  float* dst = out + static_cast<int64_t>(row) * hidden;
  const bool valid = id >= 0 && id < vocab;
  const float* src = table + static_cast<int64_t>(valid ? id : 0) * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = valid ? src[i] : 0.0f;
}

// Block-wide sum with warp shuffles; every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) >> 5;
  v = lane < num_warps ? partial[lane] : 0.0f;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // partial[] may be reused by the next call
  return v;
}

__global__ void add_rms_norm_kernel(float* out, float* residual, const float* x, const float* weight, int32_t hidden,
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
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) out[base + i] = residual[base + i] * inv_rms * weight[i];
}

__global__ void silu_and_mul_kernel(float* out, const float* gate_up, int32_t inter) {
  const int64_t row = blockIdx.x;
  const float* gate = gate_up + row * 2 * inter;
  const float* up = gate + inter;
  for (int32_t i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = gate[i];
    out[row * inter + i] = g / (1.0f + __expf(-g)) * up[i];
  }
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
  if (rows == 0) return;
  embedding_gather_kernel<<<rows, kThreads, 0, stream>>>(out, table, ids, hidden, vocab);
  CUDA_CHECK(cudaGetLastError());
}

void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream) {
  if (rows == 0) return;
  add_rms_norm_kernel<<<rows, kThreads, 0, stream>>>(out, residual, x, weight, hidden, eps);
  CUDA_CHECK(cudaGetLastError());
}

void silu_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream) {
  if (rows == 0) return;
  silu_and_mul_kernel<<<rows, kThreads, 0, stream>>>(out, gate_up, inter);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessera::gpu
