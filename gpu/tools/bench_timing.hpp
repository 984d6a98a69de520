// What the GPU microbenchmarks of gpu/tools share: the mean time of a call on the device, and how far
// two kernels' outputs are apart (so a wrong kernel cannot look fast).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "gpu/cuda_check.hpp"

namespace tessera::gpu::tools {

// µs per call of call(copy), copy cycling through [0, copies) (each copy its own weights, so the L2
// does not hold them between calls), from CUDA events around max(20, 2 * copies) calls after 3 warm-up
// calls, on the legacy stream.
template <class F>
double time_us(F&& call, int copies) {
  for (int i = 0; i < 3; ++i) call(i % copies);
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  const int iters = std::max(20, 2 * copies);
  CUDA_CHECK(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) call(i % copies);
  CUDA_CHECK(cudaEventRecord(t1));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return ms * 1e3 / iters;
}

// max |a - b| over the largest |b|, of n floats on the device; infinity when either has a non-finite value.
inline double max_rel_diff(const float* a_dev, const float* b_dev, size_t n) {
  std::vector<float> a(n), b(n);
  CUDA_CHECK(cudaMemcpy(a.data(), a_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), b_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

}  // namespace tessera::gpu::tools
