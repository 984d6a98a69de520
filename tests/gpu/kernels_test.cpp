// CUDA kernels against straightforward CPU references. Skips (with the reason) where no GPU is present,
// which is the case in CI; scripts/gpu-check.sh runs these on a machine with one.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace tessera::gpu {
namespace {

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: GPU kernel tests skipped";
  }

  template <class T>
  T* upload(const std::vector<T>& host) {
    T* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, host.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    allocations_.push_back(dev);
    return dev;
  }
  float* alloc(size_t n) {
    float* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(float)));
    allocations_.push_back(dev);
    return dev;
  }
  static std::vector<float> download(const float* dev, size_t n) {
    std::vector<float> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
  }
  static std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
  }

  std::vector<void*> allocations_;
};

TEST_F(GpuKernels, EmbeddingGatherMatchesCpu) {
  const int32_t vocab = 1000, hidden = 576, rows = 37;
  auto table = random_floats(size_t(vocab) * hidden, 1);
  std::vector<int32_t> ids(rows);
  for (int32_t r = 0; r < rows; ++r) ids[r] = (r * 997 + 13) % vocab;
  float* out = alloc(size_t(rows) * hidden);
  embedding_gather(out, upload(table), upload(ids), rows, hidden, vocab, nullptr);
  auto got = download(out, size_t(rows) * hidden);
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < hidden; ++i) ASSERT_EQ(got[size_t(r) * hidden + i], table[size_t(ids[r]) * hidden + i]);
}

TEST_F(GpuKernels, AddRmsNormMatchesCpu) {
  const int32_t rows = 19, hidden = 576;
  const float eps = 1e-5f;
  auto residual = random_floats(size_t(rows) * hidden, 2);
  auto x = random_floats(size_t(rows) * hidden, 3);
  auto weight = random_floats(hidden, 4);
  float* d_res = upload(residual);
  float* out = alloc(residual.size());
  add_rms_norm(out, d_res, upload(x), upload(weight), rows, hidden, eps, nullptr);
  auto got = download(out, residual.size());
  auto got_res = download(d_res, residual.size());
  for (int32_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int32_t i = 0; i < hidden; ++i) {
      const float v = residual[size_t(r) * hidden + i] + x[size_t(r) * hidden + i];
      ASSERT_NEAR(got_res[size_t(r) * hidden + i], v, 1e-6f);
      ss += double(v) * v;
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int32_t i = 0; i < hidden; ++i) {
      const double want = (residual[size_t(r) * hidden + i] + x[size_t(r) * hidden + i]) * inv * weight[i];
      ASSERT_NEAR(got[size_t(r) * hidden + i], want, 1e-4 * (1 + std::fabs(want))) << "row " << r << " col " << i;
    }
  }
}

TEST_F(GpuKernels, SiluAndMulMatchesCpu) {
  const int32_t rows = 7, inter = 1536;
  auto gate_up = random_floats(size_t(rows) * 2 * inter, 5);
  float* out = alloc(size_t(rows) * inter);
  silu_and_mul(out, upload(gate_up), rows, inter, nullptr);
  auto got = download(out, size_t(rows) * inter);
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < inter; ++i) {
      const float g = gate_up[size_t(r) * 2 * inter + i], u = gate_up[size_t(r) * 2 * inter + inter + i];
      const float want = g / (1.0f + std::exp(-g)) * u;
      ASSERT_NEAR(got[size_t(r) * inter + i], want, 1e-5f * (1 + std::fabs(want)));
    }
}

}  // namespace
}  // namespace tessera::gpu
