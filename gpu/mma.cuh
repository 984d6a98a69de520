// Device-function wrappers for the warp-level matrix and asynchronous-copy instructions of sm_80+
// (Tensor Core MMA, ldmatrix, cp.async), one source for both builds: with nvcc each is inline PTX;
// under the CPU emulation of CUDA (TESSERA_CUDA_EMULATION) the emulator runs it, with the PTX ISA
// manual's semantics and fragment layouts and with checks (docs/cuda_emulation.md, "Warp matrix
// instructions and cp.async"). Tested against scalar references in tests/gpu/mma_test.cpp.
//
// Fragments are the manual's: bf16/f16 operands are packed two per 32-bit register, the element
// with the lower index in the low 16 bits. With groupID = lane >> 2 and threadID_in_group = lane % 4
// (PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type"):
//
//   A (16 x 16, row-major), a[4]: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
//                                 a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B (16 x 8, K x N),      b[2]: b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   C, D (16 x 8, fp32),    c[4]: C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
//
// m16n8k8 (9.7.14.5.7) keeps a[0], a[1] (K = 8 columns of A) and b[0] (B 8 x 8), C/D the same.
// ldmatrix (9.7.14.5.15) hands lane l the pair (row l / 4, columns 2 (l % 4), +1) of each 8x8
// matrix, so ldmatrix<4> over A's four 8x8 quadrants (lane l gives the address of row l % 16,
// column 8 (l / 16)) yields a[0..3], and ldmatrix_trans<2> over a row-major K x N B (lane l < 16
// gives row l) yields b[0..1].
//
// Every lane of the warp must call each warp instruction (.sync.aligned): not in divergent code.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(TESSERA_CUDA_EMULATION)
// The emulation's include/ folder is on the include path only in its own build (a test tool).
#include <cuda_emu/ptx.hpp>
#include <source_location>
// Under the emulation every wrapper also takes the caller's source line, for error messages.
#define TESSERA_PTX_SITE , std::source_location tessera_ptx_site = std::source_location::current()
#else
#define TESSERA_PTX_SITE
#endif

namespace tessera::gpu::ptx {

// ---- Tensor Core MMA: D = A B + C, fp32 accumulation -------------------------------------------

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32; d may be c.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4] TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::mma_sync(::tessera::gpu::emu::mma_shape::m16n8k16, ::tessera::gpu::emu::mma_input::bf16, d, a, b,
                                c, tessera_ptx_site);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32; d may be c.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4] TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::mma_sync(::tessera::gpu::emu::mma_shape::m16n8k16, ::tessera::gpu::emu::mma_input::f16, d, a, b,
                                c, tessera_ptx_site);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32; d may be c.
__device__ __forceinline__ void mma_m16n8k8_bf16(float (&d)[4], const uint32_t (&a)[2], uint32_t b,
                                                 const float (&c)[4] TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::mma_sync(::tessera::gpu::emu::mma_shape::m16n8k8, ::tessera::gpu::emu::mma_input::bf16, d, a, &b,
                                c, tessera_ptx_site);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32; d may be c.
__device__ __forceinline__ void mma_m16n8k8_f16(float (&d)[4], const uint32_t (&a)[2], uint32_t b,
                                                const float (&c)[4] TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::mma_sync(::tessera::gpu::emu::mma_shape::m16n8k8, ::tessera::gpu::emu::mma_input::f16, d, a, &b,
                                c, tessera_ptx_site);
#else
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// ---- ldmatrix: 8x8 b16 matrices from shared memory into fragments --------------------------------

// ldmatrix.sync.aligned.m8n8.x{N}{.trans}.shared.b16: lane 8 i + j (j < 8) gives the address of row j
// of matrix i (16 bytes, 16-byte aligned, in shared memory); the other lanes' addresses are unused.
// Register i of every lane receives its fragment of matrix i (see the top of this file).
// Preceding writes by other threads to the rows need a __syncthreads/__syncwarp first, as any read.
template <int N, bool Trans = false>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row TESSERA_PTX_SITE) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 8x8 matrices (.x1, .x2, .x4)");
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::ldmatrix_sync(N, Trans, r, row, tessera_ptx_site);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (N == 1 && !Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
  } else if constexpr (N == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
  } else if constexpr (N == 2 && !Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
  } else if constexpr (N == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(address));
  } else if constexpr (!Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
#endif
}

template <int N>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[N], const void* row TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ldmatrix<N, true>(r, row, tessera_ptx_site);
#else
  ldmatrix<N, true>(r, row);
#endif
}

// ---- cp.async: global -> shared without registers (PTX ISA 9.7.9.25.3) ---------------------------

// cp.async.ca.shared.global [dst], [src], Bytes (4, 8 or 16; cached in L1 and L2): both addresses
// aligned to Bytes, dst in shared memory, src in global memory. The data may be read only after a
// cp_async_wait_group / cp_async_wait_all that covers this copy (and, by other threads, after a
// barrier following that wait).
template <int Bytes>
__device__ __forceinline__ void cp_async_ca(void* dst, const void* src TESSERA_PTX_SITE) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async(dst, src, Bytes, Bytes, tessera_ptx_site);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(address), "l"(src), "n"(Bytes));
#endif
}

// cp.async.ca with src-size: copies the first src_bytes (0..Bytes) of src and zero-fills the rest of
// the Bytes at dst (src is not read when src_bytes is 0), e.g. for rows past the end of a matrix.
template <int Bytes>
__device__ __forceinline__ void cp_async_ca_zfill(void* dst, const void* src, int src_bytes TESSERA_PTX_SITE) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async(dst, src, Bytes, src_bytes, tessera_ptx_site);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(address), "l"(src), "n"(Bytes), "r"(src_bytes));
#endif
}

// cp.async.cg.shared.global [dst], [src], 16 (cached in L2 only; .cg takes 16 bytes only).
__device__ __forceinline__ void cp_async_cg(void* dst, const void* src TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async(dst, src, 16, 16, tessera_ptx_site);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(src));
#endif
}

// cp.async.cg with src-size (see cp_async_ca_zfill).
__device__ __forceinline__ void cp_async_cg_zfill(void* dst, const void* src, int src_bytes TESSERA_PTX_SITE) {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async(dst, src, 16, src_bytes, tessera_ptx_site);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(src_bytes));
#endif
}

// cp.async.commit_group: this thread's cp.async calls since the last commit become one group.
__device__ __forceinline__ void cp_async_commit_group() {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async_commit_group();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// cp.async.wait_group N: waits until at most the N most recent groups of this thread are pending.
// The "memory" clobber keeps the compiler from moving shared-memory reads above the wait.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  static_assert(N >= 0, "cp.async.wait_group takes a non-negative constant");
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async_wait_group(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// cp.async.wait_all: commits the pending copies and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(TESSERA_CUDA_EMULATION)
  ::tessera::gpu::emu::cp_async_wait_all();
#else
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace tessera::gpu::ptx

#undef TESSERA_PTX_SITE
