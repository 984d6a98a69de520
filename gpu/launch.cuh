// One spelling for kernel launches, so the same kernel sources build for a real GPU (nvcc) and for
// the CPU emulation of CUDA in gpu/emu/ (the host compiler cannot parse `<<<...>>>`):
//
//   TESSERA_LAUNCH(grid, block, shared_bytes, stream, kernel<D, T>)(args...);
//
// The kernel comes last because its template arguments may contain commas.
#pragma once

#if defined(TESSERA_CUDA_EMULATION)
#include "gpu/emu/launch.hpp"
#define TESSERA_LAUNCH(grid, block, shared_bytes, stream, ...) \
  ::tessera::gpu::emu::launcher(grid, block, shared_bytes, stream, __VA_ARGS__)
#else
#define TESSERA_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#endif
