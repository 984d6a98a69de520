// CUDA names the CPU emulation (tests/cuda_emu) does not emulate, declared so that using one fails to
// compile with a message that says so and where the supported subset is written down
// (docs/cuda_emulation.md), instead of "not declared", a wrong overload, or, worse, a toolkit header
// found elsewhere on the include path. Each is a template whose static_assert fires only when the
// name is called. tests/gpu_emu/not_emulated_cases.cpp, compiled by ctest (emu_contract:*), checks
// that a sample of them fails with this message and that the supported surface compiles.
//
// The list is the part of the toolkit a kernel or the executor's host code could plausibly reach
// for next; anything else the toolkit has is simply not declared. Included by the emulated
// <cuda_runtime.h>; the cuBLAS names are at the end of the emulated <cublas_v2.h>.
#pragma once

namespace tessera::gpu::emu {
template <class...>
inline constexpr bool not_emulated = false;
}  // namespace tessera::gpu::emu

#define TESSERA_EMU_NOT_EMULATED(result, name)                                                         \
  template <class... Args>                                                                             \
  inline result name(Args&&...) {                                                                      \
    static_assert(::tessera::gpu::emu::not_emulated<Args...>,                                          \
                  #name " is not emulated by the CPU emulation of CUDA (see docs/cuda_emulation.md)"); \
    return static_cast<result>(0);                                                                     \
  }

// ---- runtime API: memory kinds, copies and launches the emulation has no model of ----------------
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMallocManaged)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMallocPitch)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMallocArray)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMallocFromPoolAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemPoolCreate)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceGetDefaultMemPool)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpy2D)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpy2DAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpy3D)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpy3DAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpyPeer)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpyPeerAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpyToSymbol)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpyToSymbolAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpyFromSymbol)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemcpyFromSymbolAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGetSymbolAddress)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemPrefetchAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaMemAdvise)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaHostRegister)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaHostUnregister)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaHostGetDevicePointer)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaPointerGetAttributes)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaIpcGetMemHandle)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaIpcOpenMemHandle)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaLaunchKernel)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaLaunchKernelEx)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaLaunchKernelExC)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaLaunchCooperativeKernel)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaLaunchHostFunc)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaStreamAddCallback)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaStreamAttachMemAsync)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaStreamCreateWithPriority)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceGetStreamPriorityRange)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaStreamGetCaptureInfo)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaStreamUpdateCaptureDependencies)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaEventRecordWithFlags)
// ---- graphs built node by node, or edited after instantiation ------------------------------------
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphCreate)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphClone)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphGetNodes)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphAddKernelNode)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphAddMemcpyNode)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphAddMemsetNode)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphAddHostNode)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphAddChildGraphNode)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphExecUpdate)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphExecKernelNodeSetParams)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaGraphUpload)
// ---- device properties and limits beyond cudaDeviceGetAttribute / cudaGetDeviceProperties --------
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaFuncGetAttributes)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaFuncSetCacheConfig)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaOccupancyMaxPotentialBlockSize)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceSetLimit)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceGetLimit)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceSetCacheConfig)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceCanAccessPeer)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaDeviceEnablePeerAccess)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaCreateTextureObject)
TESSERA_EMU_NOT_EMULATED(cudaError_t, cudaCreateSurfaceObject)

// ---- device code: intrinsics with no model here ---------------------------------------------------
// Warp match, the pre-CUDA-9 warp intrinsics without a mask, cache-hinted loads and stores (__ldg is
// emulated), clocks (no timing), address-space queries and conversions (the wrappers of gpu/mma.cuh
// take generic pointers), scoped atomics, and the half / bf16 arithmetic intrinsics (arithmetic on
// __nv_bfloat16 converts to float here).
TESSERA_EMU_NOT_EMULATED(unsigned, __match_any_sync)
TESSERA_EMU_NOT_EMULATED(unsigned, __match_all_sync)
TESSERA_EMU_NOT_EMULATED(int, __shfl)
TESSERA_EMU_NOT_EMULATED(int, __shfl_up)
TESSERA_EMU_NOT_EMULATED(int, __shfl_down)
TESSERA_EMU_NOT_EMULATED(int, __shfl_xor)
TESSERA_EMU_NOT_EMULATED(unsigned, __ballot)
TESSERA_EMU_NOT_EMULATED(int, __any)
TESSERA_EMU_NOT_EMULATED(int, __all)
TESSERA_EMU_NOT_EMULATED(int, __ldca)
TESSERA_EMU_NOT_EMULATED(int, __ldcg)
TESSERA_EMU_NOT_EMULATED(int, __ldcs)
TESSERA_EMU_NOT_EMULATED(int, __ldlu)
TESSERA_EMU_NOT_EMULATED(int, __ldcv)
TESSERA_EMU_NOT_EMULATED(int, __stwb)
TESSERA_EMU_NOT_EMULATED(int, __stcg)
TESSERA_EMU_NOT_EMULATED(int, __stcs)
TESSERA_EMU_NOT_EMULATED(int, __stwt)
TESSERA_EMU_NOT_EMULATED(long long, clock64)
TESSERA_EMU_NOT_EMULATED(unsigned, __isShared)
TESSERA_EMU_NOT_EMULATED(unsigned, __isGlobal)
TESSERA_EMU_NOT_EMULATED(size_t, __cvta_generic_to_shared)
TESSERA_EMU_NOT_EMULATED(size_t, __cvta_generic_to_global)
TESSERA_EMU_NOT_EMULATED(int, atomicAdd_block)
TESSERA_EMU_NOT_EMULATED(int, atomicAdd_system)
TESSERA_EMU_NOT_EMULATED(int, atomicCAS_block)
TESSERA_EMU_NOT_EMULATED(int, atomicCAS_system)
TESSERA_EMU_NOT_EMULATED(int, atomicExch_block)
TESSERA_EMU_NOT_EMULATED(int, atomicExch_system)
TESSERA_EMU_NOT_EMULATED(int, __hadd)
TESSERA_EMU_NOT_EMULATED(int, __hsub)
TESSERA_EMU_NOT_EMULATED(int, __hmul)
TESSERA_EMU_NOT_EMULATED(int, __hdiv)
TESSERA_EMU_NOT_EMULATED(int, __hfma)
TESSERA_EMU_NOT_EMULATED(int, __hmax)
TESSERA_EMU_NOT_EMULATED(int, __hmin)
TESSERA_EMU_NOT_EMULATED(int, __hneg)
TESSERA_EMU_NOT_EMULATED(int, __habs)
TESSERA_EMU_NOT_EMULATED(int, __hadd2)
TESSERA_EMU_NOT_EMULATED(int, __hmul2)
TESSERA_EMU_NOT_EMULATED(int, __hfma2)
