// Test kernels for the warp matrix and cp.async wrappers of gpu/mma.cuh (tests/gpu/mma_kernels.cu):
// each dumps what the instructions produced, lane by lane, for tests/gpu/mma_test.cpp to compare with
// the PTX ISA manual's fragment tables and with scalar references. Compiled by nvcc for the GPU and
// as C++ for the CPU emulation of CUDA. All run on the legacy default stream, two warps per block
// unless noted; pointers are device memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::gpu::mma_test {

enum class mma_variant { m16n8k16_bf16, m16n8k16_f16, m16n8k8_bf16, m16n8k8_f16 };

constexpr int kWarps = 2;
constexpr int kLdmatrixPitch = 24;  // b16 elements per shared-memory row slot (48 bytes: rows are not contiguous)

// matrices: [kWarps][4][8][8] b16 values, row-major per 8x8 matrix. The kernel stores row r of
// matrix m of warp w in shared-memory slot row_slot[(w * 4 + m) * 8 + r] (a permutation of 0..63,
// kLdmatrixPitch elements per slot); lane l of warp w then gives the address of row l % 8 of matrix
// l / 8 and calls ldmatrix with `num` matrices (1, 2, 4), transposed or not. out[(w * 32 + l) * 4 + i]
// = register i of lane l (i < num; the other words are left as they were).
void ldmatrix_fragments(uint32_t* out, const uint16_t* matrices, const int32_t* row_slot, int num, bool trans);

// One mma per warp, its fragments gathered from memory lane by lane as the manual's tables say:
// a: [kWarps][16][K] row-major, b: [kWarps][K][8] row-major (K x N), both bf16 or f16 bits; c:
// [kWarps][16][8] fp32. The result replaces the accumulator registers in place (d = c);
// out[(w * 32 + l) * 4 + i] = d[i] of lane l, unmapped.
void mma_fragments(float* out, const uint16_t* a, const uint16_t* b, const float* c, mma_variant v);

// D = A B for one 16 x k A (row-major) and a k x 8 B, both bf16 or f16 bits, k a multiple of the
// variant's K: one warp stages A and B into shared memory with cp.async (16 bytes per copy), loads
// A with ldmatrix .x4 (.x2 for m16n8k8) and B with ldmatrix .x2.trans (.x1.trans) from its row-major
// K x N form, or, when b_transposed, B^T ([8][k], N x K) with ldmatrix .x2 (.x1) without .trans, and
// accumulates the k / K mma steps from zero. d: [16][8] row-major fp32, placed by the C/D table.
void ldmatrix_mma(float* d, const uint16_t* a, const uint16_t* b, int k, mma_variant v, bool b_transposed);

// cp.async into shared memory, one block of kCopyThreads threads: see mma_kernels.cu, cp_async_kernel.
constexpr int kCopyThreads = 64;
constexpr int kCopyBytes = kCopyThreads * (4 + 8 + 16 + 16 + 16);  // per thread: ca 4, ca 8, cg 16, ca/cg zero fill
constexpr int kCopySourceBytes = kCopyBytes + 64;
// src: kCopySourceBytes bytes. out: kCopyBytes, the shared buffer after every wait; first_group:
// kCopyThreads * 4 bytes, what each thread read back from its first group after cp.async.wait_group 3.
void cp_async_copies(uint8_t* out, uint8_t* first_group, const uint8_t* src);
// The source offset of thread t's copy at destination offset `dst` (src is shifted against dst so a
// copy from the wrong place shows), and how many source bytes thread t's zero-fill copies take.
__host__ __device__ constexpr int cp_async_source_offset(int dst) { return dst + 48; }
__host__ __device__ constexpr int cp_async_zfill_bytes(int thread, int which) {
  return which == 0 ? thread % 17 : (3 * thread) % 17;
}

}  // namespace tessera::gpu::mma_test
