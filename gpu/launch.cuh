// One spelling for kernel launches, so the same kernel sources build for a real GPU (nvcc) and for
// the CPU emulation of CUDA in tests/cuda_emu/ (the host compiler cannot parse `<<<...>>>`):
//
//   TESSERA_LAUNCH(grid, block, shared_bytes, stream, kernel<D, T>)(args...);
//
// The kernel comes last because its template arguments may contain commas.
//
// Dynamic shared memory (the launch's shared_bytes) is declared inside the kernel with
//
//   TESSERA_DYNAMIC_SHARED(float, smem);   // smem: float*, 16-byte aligned
//
// (more than 48 KiB needs cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n)).
#pragma once

#if defined(TESSERA_CUDA_EMULATION)
// The emulation's include/ folder is on the include path only in its own build (a test tool).
#include <cuda_emu/launch.hpp>
#define TESSERA_LAUNCH(grid, block, shared_bytes, stream, ...)                                               \
  ::tessera::gpu::emu::launcher(                                                                             \
      ::tessera::gpu::emu::launch_config{dim3(grid), dim3(block), static_cast<size_t>(shared_bytes), stream, \
                                         #__VA_ARGS__},                                                      \
      [=](const auto&... tessera_emu_args) { __VA_ARGS__(tessera_emu_args...); })
#define TESSERA_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::tessera::gpu::emu::dynamic_shared_memory())
#else
#define TESSERA_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define TESSERA_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif
