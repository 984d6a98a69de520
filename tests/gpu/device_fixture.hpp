// GoogleTest fixture base for the GPU kernel tests: skips without a device (a real GPU or the CPU
// emulation), and owns the device buffers a test uploads or allocates (freed in TearDown).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace tessera::gpu {

template <class Base = ::testing::Test>
class device_fixture : public Base {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: GPU kernel tests skipped";
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
    allocations_.clear();
  }

  template <class T>
  T* upload(const std::vector<T>& host) {
    T* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(1, host.size()) * sizeof(T)));
    if (!host.empty()) CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    allocations_.push_back(dev);
    return dev;
  }
  // n zeroed elements.
  template <class T = float>
  T* alloc(size_t n) {
    T* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(T)));
    CUDA_CHECK(cudaMemset(dev, 0, n * sizeof(T)));
    allocations_.push_back(dev);
    return dev;
  }
  // Waits for the device, then copies n elements back.
  template <class T = float>
  static std::vector<T> download(const T* dev, size_t n) {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

  std::vector<void*> allocations_;
};

}  // namespace tessera::gpu
