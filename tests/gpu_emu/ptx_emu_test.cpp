// What only the CPU emulation of CUDA can show about the instructions of gpu/mma.cuh (their results
// are checked on a GPU and here by tests/gpu/mma_test.cpp): a cp.async is performed by the wait that
// covers it, so a kernel that reads before waiting reads the old bytes; and the misuses the PTX ISA
// manual calls undefined are errors naming the kernel, thread and line: misaligned or non-shared
// addresses, overlapping copies in flight, a warp instruction in a partial warp, in divergent code, or
// with lanes at different variants.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/launch.cuh"
#include "gpu/mma.cuh"

namespace tessera::gpu::emu {
namespace {

// ---- kernels -------------------------------------------------------------------------------------

// Two committed groups; after wait_group 1 only the first is complete, so the thread sees the second
// group's destination still holding what was there before (0xAB) until wait_all.
__global__ void cp_async_order_kernel(uint8_t* seen, const uint8_t* src) {
  __shared__ __align__(16) uint8_t s[64];
  const int t = threadIdx.x;
  for (int i = 0; i < 32; ++i) s[t * 32 + i] = 0xAB;
  ptx::cp_async_cg(&s[t * 32], &src[t * 32]);
  ptx::cp_async_commit_group();
  ptx::cp_async_cg(&s[t * 32 + 16], &src[t * 32 + 16]);
  ptx::cp_async_commit_group();
  uint8_t* out = seen + t * 96;
  for (int i = 0; i < 32; ++i) out[i] = s[t * 32 + i];  // before any wait: all 0xAB
  ptx::cp_async_wait_group<1>();
  for (int i = 0; i < 32; ++i) out[32 + i] = s[t * 32 + i];  // first 16 bytes copied
  ptx::cp_async_wait_all();
  for (int i = 0; i < 32; ++i) out[64 + i] = s[t * 32 + i];  // all 32
}

enum class misuse {
  overlapping_copies,
  misaligned_destination,
  misaligned_source,
  destination_in_global_memory,
  destination_on_the_stack,
  source_in_shared_memory,
  src_size_past_copy_size,
  dynamic_shared_out_of_range,
};

__global__ void cp_async_misuse_kernel(misuse what, uint8_t* global, const uint8_t* src) {
  __shared__ __align__(16) uint8_t s[64];
  TESSERA_DYNAMIC_SHARED(uint8_t, dyn);
  __align__(16) uint8_t local[16] = {};
  switch (what) {
    case misuse::overlapping_copies:
      ptx::cp_async_cg(&s[0], src);
      ptx::cp_async_commit_group();
      ptx::cp_async_ca<8>(&s[8], src);  // the first copy (another group) is not waited for yet
      break;
    case misuse::misaligned_destination: ptx::cp_async_ca<8>(&s[4], src); break;
    case misuse::misaligned_source: ptx::cp_async_cg(&s[0], src + 8); break;
    case misuse::destination_in_global_memory: ptx::cp_async_cg(global, src); break;
    case misuse::destination_on_the_stack: ptx::cp_async_cg(local, src); break;
    case misuse::source_in_shared_memory: ptx::cp_async_cg(&s[0], &s[16]); break;
    case misuse::src_size_past_copy_size: ptx::cp_async_cg_zfill(&s[0], src, 17); break;
    case misuse::dynamic_shared_out_of_range: ptx::cp_async_cg(dyn + 32, src); break;  // 32 bytes launched
  }
  ptx::cp_async_wait_all();
  global[16] = local[0] + s[0];
}

enum class warp_misuse {
  partial_warp,
  divergent_lanes,
  different_variants,
  exited_lane,
  misaligned_row,
  row_in_global_memory,
  unused_lanes_give_no_address,
};

__global__ void warp_matrix_misuse_kernel(warp_misuse what, float* out, uint8_t* global) {
  __shared__ __align__(16) uint16_t tile[8 * 16];
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < 8 * 16; i += blockDim.x) tile[i] = static_cast<uint16_t>(i);
  __syncthreads();
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float acc[4] = {0, 0, 0, 0};
  uint32_t r[1] = {0};
  switch (what) {
    case warp_misuse::partial_warp:  // launched with 48 threads: warp 1 has 16
    case warp_misuse::unused_lanes_give_no_address:
      // Lanes 8..31 of .x1 give no address (null here): legal, they are not used.
      ptx::ldmatrix<1>(r, lane < 8 ? &tile[lane * 16] : nullptr);
      break;
    case warp_misuse::divergent_lanes:
      if (lane < 16) ptx::mma_m16n8k16_bf16(acc, a, b, acc);
      break;
    case warp_misuse::different_variants:
      if (lane < 16) {
        ptx::mma_m16n8k16_bf16(acc, a, b, acc);
      } else {
        ptx::mma_m16n8k16_f16(acc, a, b, acc);
      }
      break;
    case warp_misuse::exited_lane:
      if (lane == 3) return;
      ptx::ldmatrix<1>(r, &tile[(lane % 8) * 16]);
      break;
    case warp_misuse::misaligned_row: ptx::ldmatrix<1>(r, &tile[(lane % 8) * 16 + 4]); break;
    case warp_misuse::row_in_global_memory: ptx::ldmatrix<1>(r, global + (lane % 8) * 16); break;
  }
  out[threadIdx.x] = acc[0] + static_cast<float>(r[0]);
}

// ---- tests ---------------------------------------------------------------------------------------

class EmulatedPtx : public ::testing::Test {
 protected:
  void TearDown() override {
    for (void* p : allocations_) CUDA_CHECK(cudaFree(p));
    cudaGetLastError();
  }
  template <class T>
  T* alloc(size_t n) {
    T* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(T)));
    CUDA_CHECK(cudaMemset(dev, 0, n * sizeof(T)));
    allocations_.push_back(dev);
    return dev;
  }
  std::vector<void*> allocations_;
};

// The message of the std::logic_error f throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::logic_error& e) { return e.what(); }
  return "";
}

TEST_F(EmulatedPtx, CpAsyncLandsOnlyAtTheWaitThatCoversIt) {
  uint8_t* src = alloc<uint8_t>(64);
  std::vector<uint8_t> host(64);
  for (int i = 0; i < 64; ++i) host[i] = static_cast<uint8_t>(i + 1);
  CUDA_CHECK(cudaMemcpy(src, host.data(), 64, cudaMemcpyHostToDevice));
  uint8_t* seen = alloc<uint8_t>(2 * 96);
  TESSERA_LAUNCH(1, 2, 0, nullptr, cp_async_order_kernel)(seen, src);
  std::vector<uint8_t> got(2 * 96);
  CUDA_CHECK(cudaMemcpy(got.data(), seen, got.size(), cudaMemcpyDeviceToHost));
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 32; ++i) {
      const uint8_t data = host[t * 32 + i];
      EXPECT_EQ(got[t * 96 + i], 0xAB) << "thread " << t << " byte " << i << " before any wait";
      EXPECT_EQ(got[t * 96 + 32 + i], i < 16 ? data : 0xAB) << "thread " << t << " byte " << i << " after wait_group 1";
      EXPECT_EQ(got[t * 96 + 64 + i], data) << "thread " << t << " byte " << i << " after wait_all";
    }
  }
}

TEST_F(EmulatedPtx, CpAsyncMisusesAreErrors) {
  const struct {
    misuse what;
    const char* message;
  } cases[] = {
      {misuse::overlapping_copies, "overlaps the destination of an earlier cp.async not waited for"},
      {misuse::misaligned_destination, "destination 0x"},
      {misuse::misaligned_source, "is not aligned to the copy size"},
      {misuse::destination_in_global_memory, "(global memory), not shared memory"},
      {misuse::destination_on_the_stack, "(a local variable), not shared memory"},
      {misuse::source_in_shared_memory, "the source must be global memory"},
      {misuse::src_size_past_copy_size, "src-size 17"},
      {misuse::dynamic_shared_out_of_range, "runs outside the launch's 32 bytes of dynamic shared memory"},
  };
  uint8_t* global = alloc<uint8_t>(64);
  uint8_t* src = alloc<uint8_t>(64);
  for (const auto& c : cases) {
    const std::string error = error_of([&] {
      TESSERA_LAUNCH(1, 1, 32, nullptr, cp_async_misuse_kernel)
      (c.what, global, src);
    });
    EXPECT_NE(error.find(c.message), std::string::npos) << static_cast<int>(c.what) << ": " << error;
    EXPECT_NE(error.find("cp_async_misuse_kernel"), std::string::npos) << error;
    EXPECT_NE(error.find("ptx_emu_test.cpp:"), std::string::npos) << "names the kernel's line: " << error;
  }
}

TEST_F(EmulatedPtx, WarpMatrixMisusesAreErrors) {
  float* out = alloc<float>(64);
  uint8_t* global = alloc<uint8_t>(256);
  const struct {
    warp_misuse what;
    int threads;
    const char* message;  // nullptr: no error
  } cases[] = {
      {warp_misuse::partial_warp, 48, "which has 16 threads: the instruction needs a whole warp of 32"},
      {warp_misuse::divergent_lanes, 32, "exited"},
      {warp_misuse::different_variants, 32, "meet at different warp intrinsics"},
      {warp_misuse::exited_lane, 32, "exited"},
      {warp_misuse::misaligned_row, 32, "lane 0's row address is not 16-byte aligned"},
      {warp_misuse::row_in_global_memory, 32, "(global memory), not shared memory"},
      {warp_misuse::unused_lanes_give_no_address, 32, nullptr},
  };
  for (const auto& c : cases) {
    const std::string error = error_of([&] {
      TESSERA_LAUNCH(1, c.threads, 0, nullptr, warp_matrix_misuse_kernel)
      (c.what, out, global);
    });
    if (!c.message) {
      EXPECT_EQ(error, "") << static_cast<int>(c.what);
      continue;
    }
    EXPECT_NE(error.find(c.message), std::string::npos) << static_cast<int>(c.what) << ": " << error;
    EXPECT_NE(error.find("warp_matrix_misuse_kernel"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace tessera::gpu::emu
