// Test kernels for gpu/mma.cuh (declared, with what each writes, in tests/gpu/mma_kernels.hpp). They
// build fragments and addresses the way the PTX ISA manual's tables say (section names in
// gpu/mma.cuh) and dump the raw results, so tests/gpu/mma_test.cpp can hold every lane to the manual.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/launch.cuh"
#include "gpu/mma.cuh"
#include "tests/gpu/mma_kernels.hpp"

namespace tessera::gpu::mma_test {
namespace {

constexpr int kMaxK = 64;
constexpr int kAPitch = kMaxK + 8;  // b16 elements per A / B^T row in shared memory (144 bytes)
constexpr int kBPitch = 16;         // per row of a K x 8 B (32 bytes: 8 used)

__device__ __forceinline__ uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }

template <int N, bool Trans>
__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* matrices, const int32_t* row_slot) {
  __shared__ __align__(16) uint16_t tile[kWarps * 32 * kLdmatrixPitch];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int i = tid; i < kWarps * 4 * 64; i += blockDim.x) {
    const int w = i / 256, m = (i / 64) % 4, r = (i / 8) % 8, c = i % 8;
    tile[row_slot[(w * 4 + m) * 8 + r] * kLdmatrixPitch + c] = matrices[i];
  }
  __syncthreads();
  // Lane l gives row l % 8 of matrix l / 8; for .x1/.x2 the lanes past 8 N point at rows of the other
  // matrices, which must not be used.
  const uint16_t* row = &tile[row_slot[(warp * 4 + lane / 8) * 8 + lane % 8] * kLdmatrixPitch];
  uint32_t r[N];
  if constexpr (Trans) {
    ptx::ldmatrix_trans<N>(r, row);
  } else {
    ptx::ldmatrix<N>(r, row);
  }
  for (int i = 0; i < N; ++i) out[(warp * 32 + lane) * 4 + i] = r[i];
}

template <mma_variant V>
__global__ void mma_fragments_kernel(float* out, const uint16_t* a, const uint16_t* b, const float* c) {
  constexpr bool k16 = V == mma_variant::m16n8k16_bf16 || V == mma_variant::m16n8k16_f16;
  constexpr int K = k16 ? 16 : 8;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane >> 2, t = lane % 4;
  const uint16_t* A = a + warp * 16 * K;  // A[row * K + col]
  const uint16_t* B = b + warp * K * 8;   // B[k * 8 + n]
  const float* C = c + warp * 16 * 8;
  float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  if constexpr (k16) {
    const uint32_t fa[4] = {
        pack(A[g * K + 2 * t], A[g * K + 2 * t + 1]), pack(A[(g + 8) * K + 2 * t], A[(g + 8) * K + 2 * t + 1]),
        pack(A[g * K + 2 * t + 8], A[g * K + 2 * t + 9]), pack(A[(g + 8) * K + 2 * t + 8], A[(g + 8) * K + 2 * t + 9])};
    const uint32_t fb[2] = {pack(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]),
                            pack(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
    if constexpr (V == mma_variant::m16n8k16_bf16) {
      ptx::mma_m16n8k16_bf16(acc, fa, fb, acc);
    } else {
      ptx::mma_m16n8k16_f16(acc, fa, fb, acc);
    }
  } else {
    const uint32_t fa[2] = {pack(A[g * K + 2 * t], A[g * K + 2 * t + 1]),
                            pack(A[(g + 8) * K + 2 * t], A[(g + 8) * K + 2 * t + 1])};
    const uint32_t fb = pack(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
    if constexpr (V == mma_variant::m16n8k8_bf16) {
      ptx::mma_m16n8k8_bf16(acc, fa, fb, acc);
    } else {
      ptx::mma_m16n8k8_f16(acc, fa, fb, acc);
    }
  }
  for (int i = 0; i < 4; ++i) out[(warp * 32 + lane) * 4 + i] = acc[i];
}

template <mma_variant V, bool BTransposed>
__global__ void ldmatrix_mma_kernel(float* d, const uint16_t* a, const uint16_t* b, int k) {
  constexpr bool k16 = V == mma_variant::m16n8k16_bf16 || V == mma_variant::m16n8k16_f16;
  constexpr int K = k16 ? 16 : 8;
  __shared__ __align__(16) uint16_t sa[16 * kAPitch];
  __shared__ __align__(16) uint16_t sb[BTransposed ? 8 * kAPitch : kMaxK * kBPitch];
  const int lane = threadIdx.x;
  // Stage A (16 x k) and B (k x 8, or B^T: 8 x k) with 16-byte cp.async copies.
  const int chunks = k / 8;
  for (int i = lane; i < 16 * chunks; i += 32)
    ptx::cp_async_cg(&sa[(i / chunks) * kAPitch + (i % chunks) * 8], &a[i * 8]);
  if constexpr (BTransposed) {
    for (int i = lane; i < 8 * chunks; i += 32)
      ptx::cp_async_cg(&sb[(i / chunks) * kAPitch + (i % chunks) * 8], &b[i * 8]);
  } else {
    for (int i = lane; i < k; i += 32) ptx::cp_async_cg(&sb[i * kBPitch], &b[i * 8]);
  }
  ptx::cp_async_wait_all();
  __syncthreads();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int ks = 0; ks < k; ks += K) {
    if constexpr (k16) {
      // Matrices 0..3 of .x4 are A's quadrants (rows 0-7 | 8-15) x (columns ks | ks + 8): a[0..3].
      uint32_t fa[4];
      ptx::ldmatrix<4>(fa, &sa[(lane % 16) * kAPitch + ks + 8 * (lane / 16)]);
      uint32_t fb[2];
      if constexpr (BTransposed) {
        ptx::ldmatrix<2>(fb, &sb[(lane % 8) * kAPitch + ks + 8 * ((lane / 8) % 2)]);  // B^T rows are n
      } else {
        ptx::ldmatrix_trans<2>(fb, &sb[(ks + lane % 16) * kBPitch]);  // rows k .. k + 15, transposed
      }
      if constexpr (V == mma_variant::m16n8k16_bf16) {
        ptx::mma_m16n8k16_bf16(acc, fa, fb, acc);
      } else {
        ptx::mma_m16n8k16_f16(acc, fa, fb, acc);
      }
    } else {
      uint32_t fa[2];
      ptx::ldmatrix<2>(fa, &sa[(lane % 16) * kAPitch + ks]);
      uint32_t fb[1];
      if constexpr (BTransposed) {
        ptx::ldmatrix<1>(fb, &sb[(lane % 8) * kAPitch + ks]);
      } else {
        ptx::ldmatrix_trans<1>(fb, &sb[(ks + lane % 8) * kBPitch]);
      }
      if constexpr (V == mma_variant::m16n8k8_bf16) {
        ptx::mma_m16n8k8_bf16(acc, fa, fb[0], acc);
      } else {
        ptx::mma_m16n8k8_f16(acc, fa, fb[0], acc);
      }
    }
  }
  const int g = lane >> 2, t = lane % 4;
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Regions of the shared buffer (bytes): thread t's copy of each kind at region + t * size.
constexpr int kRegionCa4 = 0;
constexpr int kRegionCa8 = kRegionCa4 + kCopyThreads * 4;
constexpr int kRegionCg16 = kRegionCa8 + kCopyThreads * 8;
constexpr int kRegionCaZfill = kRegionCg16 + kCopyThreads * 16;
constexpr int kRegionCgZfill = kRegionCaZfill + kCopyThreads * 16;
static_assert(kRegionCgZfill + kCopyThreads * 16 == kCopyBytes);

// Four committed groups (ca 4 | ca 8 | cg 16 | ca 16 zero fill) and one copy left uncommitted (cg 16
// zero fill) for cp.async.wait_all to commit. After wait_group 3 only the first group is known to be
// complete: each thread reads that back at once.
__global__ void cp_async_kernel(uint8_t* out, uint8_t* first_group, const uint8_t* src) {
  __shared__ __align__(16) uint8_t s[kCopyBytes];
  const int t = threadIdx.x;
  for (int i = t; i < kCopyBytes; i += blockDim.x) s[i] = 0xAB;
  __syncthreads();
  auto copy_src = [&](int dst) { return src + cp_async_source_offset(dst); };
  ptx::cp_async_ca<4>(&s[kRegionCa4 + t * 4], copy_src(kRegionCa4 + t * 4));
  ptx::cp_async_commit_group();
  ptx::cp_async_ca<8>(&s[kRegionCa8 + t * 8], copy_src(kRegionCa8 + t * 8));
  ptx::cp_async_commit_group();
  ptx::cp_async_cg(&s[kRegionCg16 + t * 16], copy_src(kRegionCg16 + t * 16));
  ptx::cp_async_commit_group();
  ptx::cp_async_ca_zfill<16>(&s[kRegionCaZfill + t * 16], copy_src(kRegionCaZfill + t * 16),
                             cp_async_zfill_bytes(t, 0));
  ptx::cp_async_commit_group();
  ptx::cp_async_cg_zfill(&s[kRegionCgZfill + t * 16], copy_src(kRegionCgZfill + t * 16), cp_async_zfill_bytes(t, 1));
  ptx::cp_async_wait_group<3>();
  for (int j = 0; j < 4; ++j) first_group[t * 4 + j] = s[kRegionCa4 + t * 4 + j];
  ptx::cp_async_wait_group<0>();
  ptx::cp_async_wait_all();
  __syncthreads();
  for (int i = t; i < kCopyBytes; i += blockDim.x) out[i] = s[i];
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <mma_variant V>
void launch_ldmatrix_mma(float* d, const uint16_t* a, const uint16_t* b, int k, bool b_transposed) {
  if (b_transposed) {
    TESSERA_LAUNCH(1, 32, 0, nullptr, ldmatrix_mma_kernel<V, true>)(d, a, b, k);
  } else {
    TESSERA_LAUNCH(1, 32, 0, nullptr, ldmatrix_mma_kernel<V, false>)(d, a, b, k);
  }
}

}  // namespace

void ldmatrix_fragments(uint32_t* out, const uint16_t* matrices, const int32_t* row_slot, int num, bool trans) {
  const int threads = kWarps * 32;
  if (num == 1 && !trans) TESSERA_LAUNCH(1, threads, 0, nullptr, ldmatrix_kernel<1, false>)(out, matrices, row_slot);
  if (num == 1 && trans) TESSERA_LAUNCH(1, threads, 0, nullptr, ldmatrix_kernel<1, true>)(out, matrices, row_slot);
  if (num == 2 && !trans) TESSERA_LAUNCH(1, threads, 0, nullptr, ldmatrix_kernel<2, false>)(out, matrices, row_slot);
  if (num == 2 && trans) TESSERA_LAUNCH(1, threads, 0, nullptr, ldmatrix_kernel<2, true>)(out, matrices, row_slot);
  if (num == 4 && !trans) TESSERA_LAUNCH(1, threads, 0, nullptr, ldmatrix_kernel<4, false>)(out, matrices, row_slot);
  if (num == 4 && trans) TESSERA_LAUNCH(1, threads, 0, nullptr, ldmatrix_kernel<4, true>)(out, matrices, row_slot);
  if (num != 1 && num != 2 && num != 4) throw std::invalid_argument("ldmatrix_fragments: num must be 1, 2 or 4");
  check_launch("ldmatrix_kernel");
}

void mma_fragments(float* out, const uint16_t* a, const uint16_t* b, const float* c, mma_variant v) {
  const int threads = kWarps * 32;
  switch (v) {
    case mma_variant::m16n8k16_bf16:
      TESSERA_LAUNCH(1, threads, 0, nullptr, mma_fragments_kernel<mma_variant::m16n8k16_bf16>)(out, a, b, c);
      break;
    case mma_variant::m16n8k16_f16:
      TESSERA_LAUNCH(1, threads, 0, nullptr, mma_fragments_kernel<mma_variant::m16n8k16_f16>)(out, a, b, c);
      break;
    case mma_variant::m16n8k8_bf16:
      TESSERA_LAUNCH(1, threads, 0, nullptr, mma_fragments_kernel<mma_variant::m16n8k8_bf16>)(out, a, b, c);
      break;
    case mma_variant::m16n8k8_f16:
      TESSERA_LAUNCH(1, threads, 0, nullptr, mma_fragments_kernel<mma_variant::m16n8k8_f16>)(out, a, b, c);
      break;
  }
  check_launch("mma_fragments_kernel");
}

void ldmatrix_mma(float* d, const uint16_t* a, const uint16_t* b, int k, mma_variant v, bool b_transposed) {
  const int step = (v == mma_variant::m16n8k16_bf16 || v == mma_variant::m16n8k16_f16) ? 16 : 8;
  if (k <= 0 || k > kMaxK || k % step != 0)
    throw std::invalid_argument("ldmatrix_mma: k must be a multiple of K up to 64");
  switch (v) {
    case mma_variant::m16n8k16_bf16: launch_ldmatrix_mma<mma_variant::m16n8k16_bf16>(d, a, b, k, b_transposed); break;
    case mma_variant::m16n8k16_f16: launch_ldmatrix_mma<mma_variant::m16n8k16_f16>(d, a, b, k, b_transposed); break;
    case mma_variant::m16n8k8_bf16: launch_ldmatrix_mma<mma_variant::m16n8k8_bf16>(d, a, b, k, b_transposed); break;
    case mma_variant::m16n8k8_f16: launch_ldmatrix_mma<mma_variant::m16n8k8_f16>(d, a, b, k, b_transposed); break;
  }
  check_launch("ldmatrix_mma_kernel");
}

void cp_async_copies(uint8_t* out, uint8_t* first_group, const uint8_t* src) {
  TESSERA_LAUNCH(1, kCopyThreads, 0, nullptr, cp_async_kernel)(out, first_group, src);
  check_launch("cp_async_kernel");
}

}  // namespace tessera::gpu::mma_test
