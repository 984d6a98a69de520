// The CPU emulation of CUDA (tests/cuda_emu) itself: kernels that use barriers, shuffles and votes right
// give the right answers under every scheduling order; the bugs it exists to catch are caught: a
// missing __syncthreads changes the result under some order, a divergent __syncthreads, a deadlock and
// a shuffle naming an exited lane are errors, as are bad launch configurations, pointers outside
// allocations, out-of-range copies, unsafe calls during stream capture and stale pointers in a
// replayed graph. The emulated cuBLAS GEMM is checked against an independent column-major loop.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/launch.cuh"
#include "tests/cuda_emu/emulator.hpp"

namespace tessera::gpu::emu {
namespace {

// ---- kernels -----------------------------------------------------------------------------------

// out[block] = sum of in[block * n .. + n), a shared-memory + shuffle block reduction.
__global__ void block_sum_kernel(float* out, const float* in, int n) {
  __shared__ float partial[32];
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += in[static_cast<int64_t>(blockIdx.x) * n + i];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = (blockDim.x + 31) / 32;
    v = lane < num_warps ? partial[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) out[blockIdx.x] = v;
  }
}

// Per warp: inclusive prefix sums (__shfl_up_sync), a broadcast of lane 7 (__shfl_sync), the sum of
// each half-warp (width 16), and votes.
__global__ void warp_ops_kernel(int* scan, int* bcast, int* half_sums, unsigned* ballots, int* any_all, const int* in) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32;
  int x = in[t];
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  scan[t] = x;
  bcast[t] = __shfl_sync(0xffffffffu, in[t], 7);
  int h = in[t];
  for (int off = 8; off > 0; off >>= 1) h += __shfl_xor_sync(0xffffffffu, h, off, 16);
  half_sums[t] = h;
  ballots[t] = __ballot_sync(0xffffffffu, in[t] % 2 == 1);
  any_all[t] = __any_sync(0xffffffffu, in[t] > 90) * 2 + __all_sync(0xffffffffu, in[t] >= 0);
}

// Block votes (__syncthreads_count/_and/_or) and sm_80 warp reductions, per thread.
__global__ void votes_and_reductions_kernel(int* block_votes, int* warp_reductions, const int* in) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = in[t];
  block_votes[3 * t] = __syncthreads_count(v > 50);
  block_votes[3 * t + 1] = __syncthreads_and(v >= 0);
  block_votes[3 * t + 2] = __syncthreads_or(v > 98);
  warp_reductions[4 * t] = __reduce_add_sync(0xffffffffu, v);
  warp_reductions[4 * t + 1] = __reduce_min_sync(0xffffffffu, v - 50);
  warp_reductions[4 * t + 2] = static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<unsigned>(v)));
  warp_reductions[4 * t + 3] = static_cast<int>(__reduce_xor_sync(0xffffffffu, static_cast<unsigned>(v)));
}

// out[t] = in[(t + 1) % n] through shared memory. With the barrier it is correct under any order;
// without it a thread may read its neighbour's slot before the neighbour wrote it.
template <bool kWithBarrier>
__global__ void rotate_kernel(float* out, const float* in) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  s[t] = in[t];
  if constexpr (kWithBarrier) __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void deadlock_kernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x == 0) {
    v = __shfl_sync(0xffffffffu, v, 1);  // waits for lanes 1..31, which wait at the barrier
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 5) return;
  float v = static_cast<float>(threadIdx.x);
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

// Threads past n leave early; the others still meet at the barrier (legal: exited threads do not count).
__global__ void early_exit_kernel(float* out, const float* in, int n) {
  __shared__ float s[128];
  const int t = threadIdx.x;
  if (t >= n) return;
  s[t] = in[t] * 2.0f;
  __syncthreads();
  out[t] = s[n - 1 - t];
}

__global__ void fill_kernel(float* out, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

__global__ void add_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += in[i];
}

// Reverses each block's slice through dynamic shared memory; reports words read before this block
// wrote them (they must not look like anything written: NaN).
__global__ void dynamic_shared_kernel(float* out, const float* in, int* unwritten_reads) {
  TESSERA_DYNAMIC_SHARED(float, smem);
  const int t = threadIdx.x, n = blockDim.x;
  if (t == 0 && !std::isnan(smem[n])) atomicAdd(unwritten_reads, 1);
  smem[t] = in[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = smem[n - 1 - t];
}

// ---- helpers -----------------------------------------------------------------------------------

class Emulator : public ::testing::Test {
 protected:
  void TearDown() override {
    for (void* p : allocations_) CUDA_CHECK(cudaFree(p));
    set_schedule(schedule_order::forward);
    cudaGetLastError();
  }
  template <class T>
  T* upload(const std::vector<T>& host) {
    T* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(1, host.size()) * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    allocations_.push_back(dev);
    return dev;
  }
  template <class T>
  T* alloc(size_t n) {
    T* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(T)));
    allocations_.push_back(dev);
    return dev;
  }
  template <class T>
  static std::vector<T> download(const T* dev, size_t n) {
    std::vector<T> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  std::vector<void*> allocations_;
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

const schedule_order kOrders[] = {schedule_order::forward, schedule_order::reverse, schedule_order::shuffled};

// Runs f and returns the std::logic_error's message it throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::logic_error& e) { return e.what(); }
  return "";
}

// ---- kernels that are right ---------------------------------------------------------------------

TEST_F(Emulator, BlockReductionWithBarriersAndShufflesIsRightUnderEveryOrder) {
  const int n = 1000, blocks = 3;
  const auto in = random_floats(size_t(n) * blocks, 1);
  const float* d_in = upload(in);
  float* d_out = alloc<float>(blocks);
  for (const int threads : {32, 96, 256, 1024}) {
    for (const schedule_order order : kOrders) {
      set_schedule(order, 7);
      TESSERA_LAUNCH(blocks, threads, 0, nullptr, block_sum_kernel)(d_out, d_in, n);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      const auto got = download(d_out, blocks);
      for (int b = 0; b < blocks; ++b) {
        double want = 0;
        for (int i = 0; i < n; ++i) want += in[size_t(b) * n + i];
        EXPECT_NEAR(got[size_t(b)], want, 1e-3) << threads << " threads, block " << b;
      }
    }
  }
}

TEST_F(Emulator, WarpShufflesAndVotesFollowCudaSemantics) {
  const int threads = 64, blocks = 2, total = threads * blocks;
  std::vector<int> in(total);
  std::mt19937 rng(3);
  for (auto& x : in) x = static_cast<int>(rng() % 100);
  const int* d_in = upload(in);
  int* scan = alloc<int>(total);
  int* bcast = alloc<int>(total);
  int* half = alloc<int>(total);
  unsigned* ballots = alloc<unsigned>(total);
  int* any_all = alloc<int>(total);
  TESSERA_LAUNCH(blocks, threads, 0, nullptr, warp_ops_kernel)(scan, bcast, half, ballots, any_all, d_in);
  const auto g_scan = download(scan, total), g_bcast = download(bcast, total), g_half = download(half, total);
  const auto g_ballot = download(ballots, total);
  const auto g_any_all = download(any_all, total);
  for (int w = 0; w < total / 32; ++w) {
    int run = 0, half_sum[2] = {0, 0};
    unsigned odd = 0;
    bool any_big = false;
    for (int l = 0; l < 32; ++l) {
      half_sum[l / 16] += in[size_t(w * 32 + l)];
      if (in[size_t(w * 32 + l)] % 2 == 1) odd |= 1u << l;
      any_big |= in[size_t(w * 32 + l)] > 90;
    }
    for (int l = 0; l < 32; ++l) {
      const size_t t = size_t(w * 32 + l);
      run += in[t];
      EXPECT_EQ(g_scan[t], run) << "lane " << l;
      EXPECT_EQ(g_bcast[t], in[size_t(w * 32 + 7)]);
      EXPECT_EQ(g_half[t], half_sum[l / 16]);
      EXPECT_EQ(g_ballot[t], odd);
      EXPECT_EQ(g_any_all[t], (any_big ? 2 : 0) + 1);
    }
  }
}

TEST_F(Emulator, BlockVotesAndWarpReductionsCombineEveryParticipant) {
  const int threads = 96, blocks = 2, total = threads * blocks;
  std::vector<int> in(total);
  std::mt19937 rng(9);
  for (auto& x : in) x = static_cast<int>(rng() % 100);
  int* votes = alloc<int>(3 * total);
  int* reductions = alloc<int>(4 * total);
  TESSERA_LAUNCH(blocks, threads, 0, nullptr, votes_and_reductions_kernel)(votes, reductions, upload(in));
  const auto v = download(votes, 3 * total), r = download(reductions, 4 * total);
  for (int b = 0; b < blocks; ++b) {
    int count = 0, any = 0;
    for (int t = 0; t < threads; ++t)
      count += in[size_t(b * threads + t)] > 50, any |= in[size_t(b * threads + t)] > 98;
    for (int t = 0; t < threads; ++t) {
      const size_t i = size_t(b * threads + t);
      EXPECT_EQ(v[3 * i], count);
      EXPECT_EQ(v[3 * i + 1], 1);
      EXPECT_EQ(v[3 * i + 2], any);
    }
  }
  for (int w = 0; w < total / 32; ++w) {
    int sum = 0, mn = 1000, mx = -1;
    unsigned x = 0;
    for (int l = 0; l < 32; ++l) {
      const int a = in[size_t(w * 32 + l)];
      sum += a, mn = std::min(mn, a - 50), mx = std::max(mx, a), x ^= static_cast<unsigned>(a);
    }
    for (int l = 0; l < 32; ++l) {
      const size_t i = size_t(w * 32 + l);
      EXPECT_EQ(r[4 * i], sum);
      EXPECT_EQ(r[4 * i + 1], mn);  // signed: negative minima stay negative
      EXPECT_EQ(r[4 * i + 2], mx);
      EXPECT_EQ(r[4 * i + 3], static_cast<int>(x));
    }
  }
}

TEST_F(Emulator, ThreadsThatExitEarlyDoNotHoldTheBarrier) {
  const int n = 100;
  const auto in = random_floats(n, 4);
  float* out = alloc<float>(n);
  TESSERA_LAUNCH(1, 128, 0, nullptr, early_exit_kernel)(out, upload(in), n);
  const auto got = download(out, n);
  for (int t = 0; t < n; ++t) EXPECT_EQ(got[size_t(t)], in[size_t(n - 1 - t)] * 2.0f);
}

// ---- bugs it catches --------------------------------------------------------------------------

TEST_F(Emulator, AMissingSyncthreadsGivesAWrongResultUnderSomeOrder) {
  const int n = 256;
  float* out = alloc<float>(n);
  uint32_t seed = 10;
  auto run = [&](auto kernel, schedule_order order) {
    set_schedule(order, seed);
    const auto in = random_floats(n, seed++);  // fresh values: stale shared memory cannot look right
    TESSERA_LAUNCH(1, n, 0, nullptr, kernel)(out, upload(in));
    const auto got = download(out, n);
    int wrong = 0;
    for (int t = 0; t < n; ++t) wrong += got[size_t(t)] != in[size_t((t + 1) % n)];
    return wrong;
  };
  for (const schedule_order order : kOrders) EXPECT_EQ(run(rotate_kernel<true>, order), 0);
  // Forward order runs thread t to its end before t + 1 starts: every thread but the last reads a
  // slot not written yet. Reverse order catches the wrap-around read of slot 0.
  EXPECT_EQ(run(rotate_kernel<false>, schedule_order::forward), n - 1);
  EXPECT_EQ(run(rotate_kernel<false>, schedule_order::reverse), 1);
}

// Each block extends the previous block's result: it assumes blocks run in order, which no GPU promises.
__global__ void chained_blocks_kernel(int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = (blockIdx.x > 0 ? out[blockIdx.x - 1] : 0) + 1;
}

TEST_F(Emulator, BlocksThatAssumeAnOrderGiveAWrongResultUnderAnotherOrder) {
  const int n = 8;
  int* out = alloc<int>(n);
  auto last = [&](schedule_order order) {
    set_schedule(order);
    CUDA_CHECK(cudaMemset(out, 0, n * sizeof(int)));
    TESSERA_LAUNCH(n, 32, 0, nullptr, chained_blocks_kernel)(out);
    return download(out, n)[n - 1];
  };
  EXPECT_EQ(last(schedule_order::forward), n);
  EXPECT_EQ(last(schedule_order::reverse), 1);
}

TEST_F(Emulator, DivergentSyncthreadsIsAnError) {
  int* out = alloc<int>(64);
  const std::string e = error_of([&] { TESSERA_LAUNCH(1, 64, 0, nullptr, divergent_barrier_kernel)(out); });
  EXPECT_NE(e.find("divergent __syncthreads"), std::string::npos) << e;
  EXPECT_NE(e.find("divergent_barrier_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("emulator_test.cpp"), std::string::npos) << e;
}

TEST_F(Emulator, ADeadlockIsAnErrorNamingWhereThreadsWait) {
  int* out = alloc<int>(64);
  const std::string e = error_of([&] { TESSERA_LAUNCH(1, 64, 0, nullptr, deadlock_kernel)(out); });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("__shfl_sync"), std::string::npos) << e;
  EXPECT_NE(e.find("__syncthreads"), std::string::npos) << e;
  // The emulator recovers: the next launch runs normally.
  float* f = alloc<float>(32);
  TESSERA_LAUNCH(1, 32, 0, nullptr, fill_kernel)(f, 3.0f, 32);
  EXPECT_EQ(download(f, 32)[31], 3.0f);
}

TEST_F(Emulator, AShuffleNamingAnExitedLaneIsAnError) {
  float* out = alloc<float>(32);
  const std::string e = error_of([&] { TESSERA_LAUNCH(1, 32, 0, nullptr, exited_lane_kernel)(out); });
  EXPECT_NE(e.find("exited"), std::string::npos) << e;
}

TEST_F(Emulator, InvalidLaunchConfigurationsSetTheLastErrorAndRunNothing) {
  float* out = alloc<float>(2048);
  CUDA_CHECK(cudaMemset(out, 0, 2048 * sizeof(float)));
  TESSERA_LAUNCH(1, 1025, 0, nullptr, fill_kernel)(out, 1.0f, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and reset
  TESSERA_LAUNCH(0, 32, 0, nullptr, fill_kernel)(out, 1.0f, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  TESSERA_LAUNCH(dim3(1, 70000), 32, 0, nullptr, fill_kernel)(out, 1.0f, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(download(out, 2048)[0], 0.0f);
}

TEST_F(Emulator, KernelPointersMustBeInsideLiveAllocations) {
  std::vector<float> host(64);
  std::string e = error_of([&] { TESSERA_LAUNCH(1, 64, 0, nullptr, fill_kernel)(host.data(), 1.0f, 64); });
  EXPECT_NE(e.find("pointer argument 1"), std::string::npos) << e;
  float* freed = nullptr;
  CUDA_CHECK(cudaMalloc(&freed, 256));
  CUDA_CHECK(cudaFree(freed));
  e = error_of([&] { TESSERA_LAUNCH(1, 64, 0, nullptr, fill_kernel)(freed, 1.0f, 64); });
  EXPECT_NE(e.find("not inside a live"), std::string::npos) << e;
}

TEST_F(Emulator, MemoryIsTrackedAndCheckedLikeADevice) {
  const memory_stats before = memory();
  size_t free0 = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  EXPECT_EQ(total, before.device_limit);
  float* p = alloc<float>(1000);
  size_t free1 = 0;
  CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0 - free1, 4096u);  // rounded to 256 bytes
  // Fresh device memory reads as NaN, not as a friendly zero.
  EXPECT_TRUE(std::isnan(download(p, 1)[0]));
  std::vector<float> host(1001);
  EXPECT_EQ(cudaMemcpy(p, host.data(), 1000 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), 1001 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), p, 10, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // wrong direction
  EXPECT_EQ(cudaMemset(p + 1000, 0, 1000), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(p + 1), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidDevicePointer);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, before.device_limit + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(memory().device_allocations, before.device_allocations + 1);
}

TEST_F(Emulator, DynamicSharedMemoryIsPerBlockAndLimited) {
  const int threads = 128, blocks = 3;
  const auto in = random_floats(size_t(threads) * blocks, 5);
  float* out = alloc<float>(in.size());
  int* unwritten = upload(std::vector<int>{0});
  TESSERA_LAUNCH(blocks, threads, (threads + 1) * sizeof(float), nullptr, dynamic_shared_kernel)
  (out, upload(in), unwritten);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto got = download(out, in.size());
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t)
      EXPECT_EQ(got[size_t(b * threads + t)], in[size_t(b * threads + threads - 1 - t)]);
  EXPECT_EQ(download(unwritten, 1)[0], 0);  // every block starts with NaN-filled shared memory
  // Over 48 KiB needs the opt-in attribute; over 227 KiB is never possible.
  TESSERA_LAUNCH(1, threads, 64 * 1024, nullptr, dynamic_shared_kernel)(out, upload(in), unwritten);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  TESSERA_LAUNCH(1, threads, 64 * 1024, nullptr, dynamic_shared_kernel)(out, upload(in), unwritten);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  TESSERA_LAUNCH(1, threads, 300 * 1024, nullptr, dynamic_shared_kernel)(out, upload(in), unwritten);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

__global__ void occupancy_kernel(float* out) { out[threadIdx.x] = 0.0f; }

// Occupancy is what the emulation can see of a launch: 2048 threads and 32 CTAs per SM, and 228 KiB
// of shared memory per SM for the dynamic shared memory plus 1 KiB per CTA (no registers).
TEST_F(Emulator, OccupancyCountsThreadsCtasAndDynamicSharedMemory) {
  int n = -1;
  auto blocks = [&](int threads, size_t shared) {
    n = -1;
    EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, occupancy_kernel, threads, shared), cudaSuccess);
    return n;
  };
  EXPECT_EQ(blocks(128, 0), 16);
  EXPECT_EQ(blocks(1024, 0), 2);
  EXPECT_EQ(blocks(32, 0), 32);  // the CTA limit
  EXPECT_EQ(blocks(65, 0), 21);  // 3 warps
  EXPECT_EQ(blocks(128, 40 * 1024), 5);
  EXPECT_EQ(blocks(128, 64 * 1024), 0);  // over 48 KiB without the attribute: no CTA could launch
  ASSERT_EQ(cudaFuncSetAttribute(occupancy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024),
            cudaSuccess);
  EXPECT_EQ(blocks(128, 64 * 1024), 3);
  EXPECT_EQ(blocks(128, 100 * 1024), 2);
  EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, occupancy_kernel, 0, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, occupancy_kernel, 1025, 0), cudaErrorInvalidValue);
  cudaGetLastError();
}

__global__ void read_at_kernel(float* out, const float* in, int offset) {
  out[threadIdx.x] = in[static_cast<int>(threadIdx.x) + offset];
}

// Every allocation ends at an inaccessible guard page: an access past it (or before it, or after
// cudaFree) kills the process with a message naming the allocation and the CUDA thread.
TEST(EmulatorDeathTest, OutOfBoundsAndUseAfterFreeAccessesDieNamingTheAllocation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float *in = nullptr, *out = nullptr;
  CUDA_CHECK(cudaMalloc(&in, 64 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&out, 64 * sizeof(float)));
  TESSERA_LAUNCH(1, 32, 0, nullptr, read_at_kernel)(out, in, 32);  // the last 32 floats: fine
  EXPECT_DEATH(TESSERA_LAUNCH(1, 32, 0, nullptr, read_at_kernel)(out, in, 33),
               "kernel read_at_kernel, block \\(0,0,0\\), thread \\(31,0,0\\) accessed .*, 0 bytes past the end of a "
               "256-byte device allocation");
  EXPECT_DEATH(TESSERA_LAUNCH(1, 32, 0, nullptr, read_at_kernel)(out, in, -1024),
               "before the start of a 256-byte device allocation");
  CUDA_CHECK(cudaFree(in));
  EXPECT_DEATH(std::printf("%f\n", double(static_cast<volatile float*>(in)[3])), "already given back with cudaFree");
  CUDA_CHECK(cudaFree(out));
}

// ---- streams, events, graphs -------------------------------------------------------------------

TEST_F(Emulator, CapturedWorkRunsOnlyWhenTheGraphIsReplayed) {
  const int n = 300;
  float* acc = alloc<float>(n);
  float* ones = alloc<float>(n);
  std::vector<float> host(n, 0.0f);
  CUDA_CHECK(cudaMemcpy(acc, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  TESSERA_LAUNCH((n + 127) / 128, 128, 0, s, fill_kernel)(ones, 1.0f, n);
  TESSERA_LAUNCH((n + 127) / 128, 128, 0, s, add_kernel)(acc, ones, n);
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(download(acc, n)[0], 0.0f);  // nothing ran during capture
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(download(acc, n)[n - 1], 3.0f);

  // A graph replays the pointers it captured: once one is freed, the replay is an error.
  allocations_.erase(std::find(allocations_.begin(), allocations_.end(), static_cast<void*>(ones)));
  CUDA_CHECK(cudaFree(ones));
  const std::string e = error_of([&] {
    cudaGraphLaunch(exec, s);
    cudaStreamSynchronize(s);  // the replay runs here (work on a stream is deferred)
  });
  EXPECT_NE(e.find("when run"), std::string::npos) << e;
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaErrorInvalidResourceHandle);  // destroyed twice
  CUDA_CHECK(cudaStreamDestroy(s));
}

TEST_F(Emulator, UnsafeCallsDuringCaptureInvalidateIt) {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t outside = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(outside, s));
  for (int which = 0; which < 4; ++which) {
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    void* p = nullptr;
    switch (which) {
      case 0: EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported); break;
      case 1: EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported); break;
      case 2: EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported); break;
      case 3: EXPECT_EQ(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation); break;
    }
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated) << which;
    EXPECT_EQ(graph, nullptr);
  }
  CUDA_CHECK(cudaEventDestroy(outside));
  CUDA_CHECK(cudaStreamDestroy(s));
  cudaGetLastError();
}

// Work on a stream runs as late as CUDA allows, so a missing cross-stream wait gives a wrong result.
TEST_F(Emulator, AMissingStreamWaitEventShowsAsAWrongResult) {
  const int n = 256;
  float* data = alloc<float>(n);
  float* acc = alloc<float>(n);
  cudaStream_t producer = nullptr, consumer = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  cudaEvent_t ready = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  for (const bool wait : {true, false}) {
    TESSERA_LAUNCH(1, n, 0, consumer, fill_kernel)(acc, 0.0f, n);
    TESSERA_LAUNCH(1, n, 0, producer, fill_kernel)(data, wait ? 2.0f : 5.0f, n);
    CUDA_CHECK(cudaEventRecord(ready, producer));
    if (wait) CUDA_CHECK(cudaStreamWaitEvent(consumer, ready, 0));
    TESSERA_LAUNCH(1, n, 0, consumer, add_kernel)(acc, data, n);
    EXPECT_EQ(cudaEventQuery(ready), cudaErrorNotReady);  // nothing forced the producer yet
    CUDA_CHECK(cudaStreamSynchronize(consumer));
    // With the wait the consumer sees the producer's 2s; without it, what `data` held before (2s from
    // the first round, not this round's 5s).
    EXPECT_EQ(download(acc, n)[0], 2.0f) << (wait ? "with" : "without") << " the wait";
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  CUDA_CHECK(cudaEventDestroy(ready));
  CUDA_CHECK(cudaStreamDestroy(producer));
  CUDA_CHECK(cudaStreamDestroy(consumer));
}

TEST_F(Emulator, EventsTimeTheWorkBetweenThem) {
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  float* out = alloc<float>(1 << 16);
  CUDA_CHECK(cudaEventRecord(a, nullptr));
  TESSERA_LAUNCH(256, 256, 0, nullptr, fill_kernel)(out, 2.0f, 1 << 16);
  CUDA_CHECK(cudaEventRecord(b, nullptr));
  float ms = -1.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  EXPECT_GT(ms, 0.0f);
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
}

// ---- what is declared but not emulated: an error, never something else ------------------------------

// The contract (docs/cuda_emulation.md): calls the emulation has no model of do not compile
// (tests/gpu_emu/not_emulated_cases.cpp); flags and argument values it has no model of fail with
// CUDA's own error code and a "gpu emulation:" line, instead of being ignored.
TEST_F(Emulator, ArgumentsItDoesNotEmulateAreErrors) {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, 0x10), cudaErrorInvalidValue);
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e = nullptr;
  EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming), cudaErrorNotSupported);
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(e, s));
  EXPECT_EQ(cudaStreamWaitEvent(s, e, cudaEventWaitExternal), cudaErrorNotSupported);
  EXPECT_EQ(cudaStreamWaitEvent(s, e, cudaEventWaitDefault), cudaSuccess);

  float* out = alloc<float>(32);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  TESSERA_LAUNCH(1, 32, 0, s, fill_kernel)(out, 1.0f, 32);
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  // Another stream joining the capture through an event recorded in it (CUDA's fork/join).
  cudaStream_t other = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t fork = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CUDA_CHECK(cudaEventRecord(fork, s));
  EXPECT_EQ(cudaStreamWaitEvent(other, fork, 0), cudaErrorNotSupported);
  cudaGraph_t forked = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &forked));
  CUDA_CHECK(cudaGraphDestroy(forked));
  CUDA_CHECK(cudaEventDestroy(fork));
  CUDA_CHECK(cudaStreamDestroy(other));
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch), cudaErrorNotSupported);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch), cudaErrorNotSupported);
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));

  void* pinned = nullptr;
  EXPECT_EQ(cudaHostAlloc(&pinned, 64, 0x40), cudaErrorInvalidValue);
  CUDA_CHECK(cudaHostAlloc(&pinned, 64, cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined));
  CUDA_CHECK(cudaFreeHost(pinned));
  EXPECT_EQ(cudaDeviceReset(), cudaErrorNotSupported);
  int value = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&value, static_cast<cudaDeviceAttr>(200), 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(fill_kernel, static_cast<cudaFuncAttribute>(3), 1), cudaErrorInvalidValue);

  // cuBLAS: a type combination it does not emulate (f16 operands) is CUBLAS_STATUS_NOT_SUPPORTED.
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f;
  uint16_t* half = alloc<uint16_t>(64);
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, half, CUDA_R_16F, 8, half, CUDA_R_16F, 8, &one,
                         out, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  CUDA_CHECK(cudaEventDestroy(e));
  CUDA_CHECK(cudaStreamDestroy(s));
  cudaGetLastError();
}

// ---- cuBLAS ------------------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C in column-major storage, as cuBLAS documents it, in double.
std::vector<double> reference_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& A,
                                   int lda, const std::vector<float>& B, int ldb, float beta,
                                   const std::vector<float>& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const double a = ta ? A[size_t(i) * lda + p] : A[size_t(p) * lda + i];
        const double b = tb ? B[size_t(p) * ldb + j] : B[size_t(j) * ldb + p];
        s += a * b;
      }
      out[size_t(j) * ldc + i] = alpha * s + (beta == 0.0f ? 0.0 : beta * C[size_t(j) * ldc + i]);
    }
  }
  return out;
}

// dp4a: signed bytes for int operands, unsigned for unsigned ones, added to c with 32-bit wrap-around
// (PTX ISA, "dp4a"): the quantised GEMV's integer dot products.
TEST_F(Emulator, Dp4aMultipliesBytesAsSignedOrUnsignedAndAccumulates) {
  // bytes (low first) a = {1, 127, -1, -128}, b = {2, 2, -3, -1}: 2 + 254 + 3 + 128 = 387
  const int a = static_cast<int>(0x80FF7F01u), b = static_cast<int>(0xFFFD0202u);
  EXPECT_EQ(__dp4a(a, b, 0), 387);
  EXPECT_EQ(__dp4a(a, b, -400), -13);
  // unsigned: {1, 127, 255, 128} . {2, 2, 253, 255} = 2 + 254 + 64515 + 32640
  EXPECT_EQ(__dp4a(static_cast<unsigned>(a), static_cast<unsigned>(b), 5u), 97416u);
  EXPECT_EQ(__dp4a(0x01010101u, 0xFFFFFFFFu, 0xFFFFFFFFu), 1019u);  // wraps
  EXPECT_EQ(__dp4a(0x01010101, static_cast<int>(0x80808080u), 0), -512);
}

TEST_F(Emulator, CublasGemmExFollowsColumnMajorSemantics) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 37, k = 70;
  for (const int n : {1, 5, 40}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const bool bf16 : {false, true}) {
          const int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 1, ldc = m + 2;
          auto A = random_floats(size_t(lda) * (ta ? m : k), 20), B = random_floats(size_t(ldb) * (tb ? k : n), 21);
          auto C = random_floats(size_t(ldc) * n, 22);
          std::vector<uint16_t> A16(A.size()), B16(B.size());
          if (bf16) {  // the reference sees exactly the bf16 values
            for (size_t i = 0; i < A.size(); ++i) A16[i] = fp32_to_bf16(A[i]), A[i] = bf16_to_fp32(A16[i]);
            for (size_t i = 0; i < B.size(); ++i) B16[i] = fp32_to_bf16(B[i]), B[i] = bf16_to_fp32(B16[i]);
          }
          for (const float beta : {0.0f, 1.0f, 0.5f}) {
            const float alpha = 1.5f;
            float* dC = upload(C);
            if (beta == 0.0f) CUDA_CHECK(cudaMemset(dC, 0xFF, C.size() * sizeof(float)));  // NaN: must not be read
            const void* dA = bf16 ? static_cast<const void*>(upload(A16)) : upload(A);
            const void* dB = bf16 ? static_cast<const void*>(upload(B16)) : upload(B);
            const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
            ASSERT_EQ(
                cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, dA, t,
                             lda, dB, t, ldb, &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_SUCCESS);
            const auto want = reference_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
            const auto got = download(dC, C.size());
            for (int j = 0; j < n; ++j)
              for (int i = 0; i < ldc; ++i) {
                const size_t at = size_t(j) * ldc + i;
                if (i >= m) {  // rows between m and ldc are not touched
                  if (beta != 0.0f) { EXPECT_EQ(got[at], C[at]); }
                  continue;
                }
                ASSERT_NEAR(got[at], want[at], 1e-4 * k)
                    << "ta " << ta << " tb " << tb << " bf16 " << bf16 << " beta " << beta;
              }
          }
        }
      }
    }
  }
  // cuBLAS's argument checks.
  const float one = 1.0f;
  float* d = alloc<float>(64);
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F, 4, d, CUDA_R_32F, 8, &one, d,
                         CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  const std::string e = error_of([&] {
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 9, 8, &one, d, CUDA_R_32F, 8, d, CUDA_R_32F, 8, &one, d, CUDA_R_32F, 8,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  EXPECT_NE(e.find("past the end"), std::string::npos) << e;  // B is 8 x 9 in a 64-float buffer
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_NOT_INITIALIZED);
  cudaGetLastError();
}

}  // namespace
}  // namespace tessera::gpu::emu
