// The PTX instructions of gpu/mma.cuh as the CPU emulation of CUDA (tests/cuda_emu) runs them: gpu/mma.cuh
// calls these under TESSERA_CUDA_EMULATION instead of its inline PTX. What each does and checks is
// written down in docs/cuda_emulation.md ("Warp matrix instructions and cp.async").
//
// * mma_sync: mma.sync.aligned.{m16n8k16,m16n8k8}.row.col.f32.{bf16,f16}.{bf16,f16}.f32, a warp
//   collective: every lane gives its A, B and C fragments (the layouts of the PTX ISA manual,
//   "Matrix Fragments for mma.m16n8k16 with floating point type" / "... for mma.m16n8k8"), the last
//   lane to arrive computes D = A B + C for the whole warp, and each lane gets its D fragment.
// * ldmatrix_sync: ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16, a warp collective: lanes
//   0..8*num-1 each give the shared-memory address of one 8x8 matrix row (16 bytes), every lane gets
//   its fragment of each matrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix").
// * cp_async*: cp.async.{ca,cg}.shared.global with cp-size 4/8/16 and optional src-size (zero fill),
//   cp.async.commit_group, cp.async.wait_group N, cp.async.wait_all. A copy is queued by the thread
//   and performed by the wait that covers it, not before.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <source_location>

namespace tessera::gpu::emu {

enum class mma_shape : uint8_t { m16n8k16, m16n8k8 };
enum class mma_input : uint8_t { bf16, f16 };

// a: 4 registers (m16n8k16) or 2 (m16n8k8), b: 2 or 1, c and d: 4 floats (d may be c).
void mma_sync(mma_shape shape, mma_input input, float* d, const uint32_t* a, const uint32_t* b, const float* c,
              const std::source_location& where);
// num: 1, 2 or 4 matrices; r: num registers.
void ldmatrix_sync(int num, bool trans, uint32_t* r, const void* row, const std::source_location& where);
// cp_size bytes to dst_shared, the first src_size of them from src_global, the rest zeros.
void cp_async(void* dst_shared, const void* src_global, int cp_size, int src_size, const std::source_location& where);
void cp_async_commit_group();
void cp_async_wait_group(int n);
void cp_async_wait_all();

}  // namespace tessera::gpu::emu
