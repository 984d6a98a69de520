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
//
// Programmatic dependent launch (PDL, sm_90; CUDA programming guide, "Programmatic Dependent Launch
// and Synchronization"): the engine's kernels launch with
//
//   TESSERA_LAUNCH_PDL(grid, block, shared_bytes, stream, kernel<D, T>)(args...);
//
// which lets the GPU start a kernel's CTAs while the previous kernel on the stream is finishing (its
// launch latency and CTA ramp-up hidden behind the other's tail: the gaps between the ~10 kernels per
// layer of a decode step), and every such kernel starts with pdl_prologue(): griddepcontrol.wait,
// which returns once the grids it depends on have completed and their memory is visible (so nothing
// before it may read or write global memory), then griddepcontrol.launch_dependents, which lets the
// next kernel be launched now (its CTAs then wait in their own prologue). Inside a CUDA graph the
// stream capture keeps these as programmatic edges. TESSERA_PDL=0 launches plainly (A/B runs). Under
// the emulation launches run one after another: both are no-ops there.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu/cuda_check.hpp"

#if defined(TESSERA_CUDA_EMULATION)
// The emulation's include/ folder is on the include path only in its own build (a test tool).
#include <cuda_emu/launch.hpp>
#define TESSERA_LAUNCH(grid, block, shared_bytes, stream, ...)                                               \
  ::tessera::gpu::emu::launcher(                                                                             \
      ::tessera::gpu::emu::launch_config{dim3(grid), dim3(block), static_cast<size_t>(shared_bytes), stream, \
                                         #__VA_ARGS__},                                                      \
      [=](const auto&... tessera_emu_args) { __VA_ARGS__(tessera_emu_args...); })
#define TESSERA_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::tessera::gpu::emu::dynamic_shared_memory())
#define TESSERA_LAUNCH_PDL TESSERA_LAUNCH
#else
#define TESSERA_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define TESSERA_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

namespace tessera::gpu {

// CTAs of `kernel` one multiprocessor holds at `threads` per CTA and `dynamic_shared` bytes (at least
// 1: a kernel that fits none would fail at launch, and a plan that counts on it would divide by 0).
template <class Kernel>
int32_t resident_ctas_per_sm(Kernel* kernel, int threads, size_t dynamic_shared = 0) {
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_shared));
  return blocks > 1 ? blocks : 1;
}

// The first statement of every kernel launched with TESSERA_LAUNCH_PDL (see the top of this file).
__device__ __forceinline__ void pdl_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace tessera::gpu

#if !defined(TESSERA_CUDA_EMULATION)
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tessera::gpu {

// False when TESSERA_PDL=0: TESSERA_LAUNCH_PDL then launches without the attribute.
inline bool programmatic_dependent_launch() {
  static const bool on = [] {
    const char* v = std::getenv("TESSERA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// TESSERA_LAUNCH_PDL's launcher: cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization.
template <class... Params>
struct pdl_launch {
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  void (*kernel)(Params...);

  template <class... Args>
  void operator()(Args&&... args) const {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = programmatic_dependent_launch() ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  }
};

template <class... Params>
pdl_launch<Params...> make_pdl_launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                                      void (*kernel)(Params...)) {
  return {grid, block, shared_bytes, stream, kernel};
}

}  // namespace tessera::gpu

#define TESSERA_LAUNCH_PDL(grid, block, shared_bytes, stream, ...) \
  ::tessera::gpu::make_pdl_launch(dim3(grid), dim3(block), static_cast<size_t>(shared_bytes), stream, __VA_ARGS__)
#endif
