// Small device helpers shared by the kernels: element conversions, vector loads, reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gpu/fp8.hpp"

namespace tessera::gpu::detail {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(fp8_e4m3 v) { return fp8_e4m3_to_float(v.bits); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ fp8_e4m3 from_float<fp8_e4m3>(float v) {
  return {float_to_fp8_e4m3(v)};
}

// out[0..E) = p[0..E) as floats, with one 4/8/16-byte load per 16 bytes where the size allows.
// pre: p aligned to the load size (every caller's offsets are multiples of E elements).
template <class T, int E>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[E]) {
  constexpr int bytes = static_cast<int>(sizeof(T)) * E;
  if constexpr (bytes % 16 == 0) {
    constexpr int per = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int i = 0; i < E / per; ++i) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      const T* t = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < per; ++j) out[i * per + j] = to_float(t[j]);
    }
  } else if constexpr (bytes == 8 || bytes == 4) {
    using word = std::conditional_t<bytes == 8, uint2, uint32_t>;
    const word u = *reinterpret_cast<const word*>(p);
    const T* t = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = to_float(t[j]);
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = to_float(p[j]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Split-KV merge (flash-decoding): the normalised output at dim d of one (query, head) from its
// num_splits partitions, each a (max, sum) pair at part_ml[2 * (first + s)] and an unnormalised output
// row at part_o[(first + s) * D]. Partitions that saw no position (max -inf) are skipped; 0 when
// none did.
// F: const float, or const volatile float where other CTAs of the same launch wrote the partials (the
// loads then bypass L1, which is not coherent between multiprocessors).
template <class F = const float>
__device__ __forceinline__ float merge_splits(F* part_o, F* part_ml, int64_t first, int32_t num_splits, int32_t D,
                                              int32_t d) {
  float mx = -INFINITY;
  for (int32_t s = 0; s < num_splits; ++s) mx = fmaxf(mx, part_ml[2 * (first + s)]);
  float sum = 0.0f, o = 0.0f;
  for (int32_t s = 0; s < num_splits; ++s) {
    const float m = part_ml[2 * (first + s)];
    if (m == -INFINITY) continue;
    const float f = expf(m - mx);
    sum += part_ml[2 * (first + s) + 1] * f;
    o += part_o[(first + s) * D + d] * f;
  }
  return sum > 0.0f ? o / sum : 0.0f;
}

// Split-KV merged by the last CTA to finish (flash-decoding's second kernel folded into the first):
// after a fence that publishes this CTA's partials, counts it in on `counter` (one per group of CTAs
// whose splits merge together). True in every thread of the CTA that completes the count, which may
// then read the others' partials (through volatile loads: L1 is not coherent across SMs) and must
// reset the counter to 0 for the next launch. Every thread of the CTA calls it.
__device__ __forceinline__ bool last_of_splits(int32_t* counter, int32_t num_splits) {
  __shared__ int last;
  __threadfence();
  __syncthreads();  // every thread's partial is written and fenced
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == num_splits - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();  // the other CTAs' partials, fenced before their increments, are visible now
  return true;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Block-wide sum with warp shuffles; every thread gets the total. Any blockDim.x <= 1024.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) >> 5;
  v = lane < num_warps ? partial[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();  // partial[] may be reused by the next call
  return v;
}

}  // namespace tessera::gpu::detail
