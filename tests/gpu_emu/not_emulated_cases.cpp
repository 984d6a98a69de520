// Compile-time half of the CPU emulation's contract (docs/cuda_emulation.md), compiled, never run, by
// ctest (tests/CMakeLists.txt) with the emulation's flags:
//
//   * emu_contract:supported_surface: this file as it is must compile: it calls every runtime
//     function, device intrinsic, type and cuBLAS call the document lists as emulated (so the list
//     cannot promise what is not declared);
//   * emu_contract:not_emulated:<case>: with -DTESSERA_EMU_CASE_<case>, one use of something the
//     emulation does not have, which must fail to compile with the message that says so (the
//     "is not emulated" static_assert of tests/cuda_emu/not_emulated.hpp or #error of a stand-in
//     header; inline PTX fails in the host assembler).
#if defined(TESSERA_EMU_CASE_mma_h)
#include <mma.h>
#elif defined(TESSERA_EMU_CASE_cooperative_groups)
#include <cooperative_groups.h>
#elif defined(TESSERA_EMU_CASE_cuda_fp16)
#include <cuda_fp16.h>
#elif defined(TESSERA_EMU_CASE_cuda_pipeline)
#include <cuda_pipeline.h>
#elif defined(TESSERA_EMU_CASE_cublasLt)
#include <cublasLt.h>
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "gpu/launch.cuh"
#include "gpu/mma.cuh"

namespace tessera::gpu::emu_contract {

// ---- device code ---------------------------------------------------------------------------------

__device__ __forceinline__ float device_helper(float x) { return x * 2.0f; }

__global__ void __launch_bounds__(256)
    supported_kernel(float* out, const float* in, int* counters, unsigned* bits, const __nv_bfloat16* bf) {
  __shared__ __align__(16) float tile[256];
  __shared__ __align__(16) uint16_t halves[8 * 16];
  TESSERA_DYNAMIC_SHARED(float, dynamic);
  const int t = static_cast<int>(threadIdx.x + blockIdx.x * blockDim.x + threadIdx.y + threadIdx.z + blockIdx.y +
                                 blockIdx.z + blockDim.y + blockDim.z + gridDim.x + gridDim.y + gridDim.z) %
                warpSize;
  const dim3 d3(1, 2, 3);
  const uint3 u3 = threadIdx;
  float v = __ldg(&in[t]) + device_helper(static_cast<float>(d3.x + u3.x));
  // Barriers and votes over the block.
  __syncthreads();
  v += static_cast<float>(__syncthreads_count(v > 0.0f) + __syncthreads_and(v > 0.0f) + __syncthreads_or(v > 0.0f));
  // Warp collectives.
  __syncwarp();
  __syncwarp(0xffffffffu);
  v += __shfl_sync(0xffffffffu, v, 0) + __shfl_xor_sync(0xffffffffu, v, 1) + __shfl_down_sync(0xffffffffu, v, 2) +
       __shfl_up_sync(0xffffffffu, v, 3, 16);
  const unsigned ballot = __ballot_sync(0xffffffffu, v > 0.0f) + static_cast<unsigned>(__any_sync(0xffffffffu, 1)) +
                          static_cast<unsigned>(__all_sync(0xffffffffu, 1)) + __activemask();
  const int r =
      __reduce_add_sync(0xffffffffu, t) + __reduce_min_sync(0xffffffffu, t) + __reduce_max_sync(0xffffffffu, t);
  const unsigned ru = __reduce_add_sync(0xffffffffu, 1u) + __reduce_min_sync(0xffffffffu, 1u) +
                      __reduce_max_sync(0xffffffffu, 1u) + __reduce_and_sync(0xffffffffu, 1u) +
                      __reduce_or_sync(0xffffffffu, 1u) + __reduce_xor_sync(0xffffffffu, 1u);
  __threadfence();
  __threadfence_block();
  __nanosleep(1);
  // Atomics.
  atomicAdd(&counters[0], 1);
  atomicAdd(&bits[0], 1u);
  atomicAdd(&out[0], 1.0f);
  atomicSub(&counters[1], 1);
  atomicExch(&counters[2], 1);
  atomicMax(&counters[3], t);
  atomicMin(&counters[4], t);
  atomicAnd(&bits[1], 1u);
  atomicOr(&bits[2], 1u);
  atomicXor(&bits[3], 1u);
  atomicInc(&bits[4], 10u);
  atomicDec(&bits[5], 10u);
  atomicCAS(&counters[5], 0, 1);
  // Math, conversions and bit operations.
  float s = 0.0f, c = 0.0f;
  __sincosf(v, &s, &c);
  v += __expf(v) + __logf(1.0f) + __log2f(1.0f) + __sinf(v) + __cosf(v) + __tanf(v) + __powf(v, 2.0f) + __exp10f(v) +
       __fdividef(v, 3.0f) + __frcp_rn(2.0f) + __fsqrt_rn(4.0f) + __fadd_rn(v, 1.0f) + __fsub_rn(v, 1.0f) +
       __fmul_rn(v, 2.0f) + __fdiv_rn(v, 2.0f) + __fmaf_rn(v, 2.0f, 1.0f) + rsqrtf(4.0f) + __saturatef(v) + s + c +
       expf(v) + fmaxf(v, 1.0f) + fminf(v, 1.0f) + max(v, 1) + min(v, 1u) + CUDART_INF_F + CUDART_PI_F;
  v += static_cast<float>(__float_as_int(v) + static_cast<int>(__float_as_uint(v)) + __float2int_rn(v) +
                          __float2int_rz(v) + __float2int_rd(v) + __float2int_ru(v) + __popc(ballot) + __popcll(1ull) +
                          __clz(r) + __clzll(1ll) + __ffs(r) + __ffsll(1ll) + static_cast<int>(__brev(ru)) +
                          static_cast<int>(__umulhi(ru, ru)) + __dp4a(r, r, r) + static_cast<int>(__dp4a(ru, ru, ru)) +
                          static_cast<int>(umin(ru, 3u) + umax(ru, 3u)));
  v += __int_as_float(1) + __uint_as_float(1u) + __int2float_rn(t) + static_cast<float>(llmin(1, 2) + llmax(1, 2)) +
       static_cast<float>(__longlong_as_double(__double_as_longlong(1.0)) + rsqrt(4.0));
  if (isnan(v) || isinf(v) || !isfinite(v)) __trap();
  // bf16.
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  const __nv_bfloat162 h2 = __floats2bfloat162_rn(v, 1.0f);
  v += __bfloat162float(h) + __low2float(h2) + __high2float(__float2bfloat162_rn(v)) + __bfloat1622float2(h2).x +
       static_cast<float>(__bfloat16_as_ushort(__ushort_as_bfloat16(1))) + __bfloat162float(__float2bfloat16_rz(v)) +
       __bfloat162float(__float2bfloat16(v)) + static_cast<float>(bf[0]);
  // Vector types.
  const float4 f4 = make_float4(v, v, v, v);
  const uint4 u4 = make_uint4(1, 2, 3, 4);
  const int4 i4 = make_int4(1, 2, 3, 4);
  const float2 f2 = make_float2(v, v);
  const uint2 u2 = make_uint2(1, 2);
  const int2 i2 = make_int2(1, 2);
  v += f4.w + static_cast<float>(u4.x + static_cast<unsigned>(i4.y) + u2.x + static_cast<unsigned>(i2.y)) + f2.y;
  // gpu/mma.cuh: the warp matrix instructions and cp.async.
  uint32_t a[4] = {}, b[2] = {}, m1[1], m2[2], m4[4];
  float acc[4] = {};
  ptx::mma_m16n8k16_bf16(acc, a, b, acc);
  ptx::mma_m16n8k16_f16(acc, a, b, acc);
  const uint32_t a2[2] = {};
  ptx::mma_m16n8k8_bf16(acc, a2, b[0], acc);
  ptx::mma_m16n8k8_f16(acc, a2, b[0], acc);
  ptx::ldmatrix<1>(m1, &halves[(t % 8) * 16]);
  ptx::ldmatrix<2>(m2, &halves[(t % 8) * 16]);
  ptx::ldmatrix<4>(m4, &halves[(t % 8) * 16]);
  ptx::ldmatrix_trans<1>(m1, &halves[(t % 8) * 16]);
  ptx::ldmatrix_trans<2>(m2, &halves[(t % 8) * 16]);
  ptx::ldmatrix_trans<4>(m4, &halves[(t % 8) * 16]);
  ptx::cp_async_ca<4>(&tile[t * 4], &in[t * 4]);
  ptx::cp_async_ca<8>(&tile[t * 4], &in[t * 4]);
  ptx::cp_async_ca<16>(&tile[t * 4], &in[t * 4]);
  ptx::cp_async_ca_zfill<16>(&tile[t * 4], &in[t * 4], 8);
  ptx::cp_async_cg(&tile[t * 4], &in[t * 4]);
  ptx::cp_async_cg_zfill(&tile[t * 4], &in[t * 4], 0);
  ptx::cp_async_commit_group();
  ptx::cp_async_wait_group<0>();
  ptx::cp_async_wait_all();
  out[t] = v + acc[0] + static_cast<float>(m1[0] + m2[0] + m4[0]) + tile[t] + dynamic[t];

#if defined(TESSERA_EMU_CASE_match_any_sync)
  out[0] = static_cast<float>(__match_any_sync(0xffffffffu, t));
#elif defined(TESSERA_EMU_CASE_legacy_shfl)
  out[0] = static_cast<float>(__shfl(t, 0));
#elif defined(TESSERA_EMU_CASE_ldcs)
  out[0] = static_cast<float>(__ldcs(&counters[0]));
#elif defined(TESSERA_EMU_CASE_clock64)
  out[0] = static_cast<float>(clock64());
#elif defined(TESSERA_EMU_CASE_half_arithmetic)
  out[0] = static_cast<float>(__hadd(h, h));
#elif defined(TESSERA_EMU_CASE_cvta_to_shared)
  out[0] = static_cast<float>(__cvta_generic_to_shared(tile));
#elif defined(TESSERA_EMU_CASE_scoped_atomic)
  atomicAdd_block(&counters[0], 1);
#elif defined(TESSERA_EMU_CASE_inline_ptx)
  asm volatile("cp.async.wait_all;");  // PTX outside gpu/mma.cuh: the host assembler rejects it
#endif
}

// ---- host code -----------------------------------------------------------------------------------

int supported_host_calls() {
  int n = 0, device = 0, value = 0;
  cudaDeviceProp prop{};
  void *p = nullptr, *h = nullptr;
  size_t free_bytes = 0, total_bytes = 0;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamCaptureStatus status{};
  float ms = 0.0f;
  cudaError_t r = cudaGetDeviceCount(&n);
  r = cudaSetDevice(0), r = cudaGetDevice(&device),
  r = cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0);
  r = cudaGetDeviceProperties(&prop, 0), r = cudaDeviceSynchronize(), r = cudaMemGetInfo(&free_bytes, &total_bytes);
  r = cudaMalloc(&p, 64), r = cudaMallocHost(&h, 64), r = cudaHostAlloc(&h, 64, cudaHostAllocDefault);
  r = cudaMallocAsync(&p, 64, s), r = cudaFreeAsync(p, s);
  r = cudaMemcpy(p, h, 64, cudaMemcpyHostToDevice), r = cudaMemcpyAsync(h, p, 64, cudaMemcpyDeviceToHost, s);
  r = cudaMemcpyAsync(p, p, 64, cudaMemcpyDefault), r = cudaMemset(p, 0, 64), r = cudaMemsetAsync(p, 0, 64, s);
  r = cudaStreamCreate(&s), r = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), r = cudaStreamQuery(s);
  r = cudaStreamSynchronize(s), r = cudaStreamSynchronize(cudaStreamLegacy),
  r = cudaStreamSynchronize(cudaStreamPerThread);
  r = cudaEventCreate(&e0), r = cudaEventCreateWithFlags(&e1, cudaEventDisableTiming | cudaEventBlockingSync);
  r = cudaEventRecord(e0, s), r = cudaStreamWaitEvent(s, e0, 0), r = cudaEventSynchronize(e0), r = cudaEventQuery(e0);
  r = cudaEventElapsedTime(&ms, e0, e1), r = cudaEventDestroy(e0), r = cudaEventDestroy(e1);
  r = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), r = cudaStreamIsCapturing(s, &status);
  r = cudaStreamEndCapture(s, &graph), r = cudaGraphInstantiate(&exec, graph, 0), r = cudaGraphLaunch(exec, s);
  r = cudaGraphExecDestroy(exec), r = cudaGraphDestroy(graph), r = cudaStreamDestroy(s);
  r = cudaFuncSetAttribute(supported_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
  r = cudaFuncSetAttribute(supported_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 50);
  r = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, supported_kernel, 256, 0);
  TESSERA_LAUNCH(dim3(1, 1, 1), dim3(64), 256, s, supported_kernel)
  (static_cast<float*>(p), static_cast<const float*>(p), static_cast<int*>(p), static_cast<unsigned*>(p),
   static_cast<const __nv_bfloat16*>(p));
  r = cudaGetLastError(), r = cudaPeekAtLastError();
  const char* names = cudaGetErrorName(r);
  names = cudaGetErrorString(r);
  r = cudaFree(p), r = cudaFreeHost(h);

  cublasHandle_t handle = nullptr;
  cublasStatus_t st = cublasCreate(&handle);
  const float one = 1.0f;
  st = cublasSetStream(handle, s), st = cublasGetStream(handle, &s), st = cublasSetWorkspace(handle, p, 64);
  st = cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), st = cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST);
  st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 8, 8, 8, &one, p, CUDA_R_16BF, 8, p, CUDA_R_16BF, 8, &one, p,
                    CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  st = cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, p, CUDA_R_32F, 8, 64, p, CUDA_R_32F,
                                  8, 64, &one, p, CUDA_R_32F, 8, 64, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  st = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, static_cast<const float*>(p), 8,
                   static_cast<const float*>(p), 8, &one, static_cast<float*>(p), 8);
  const char* status_name = cublasGetStatusName(st);
  status_name = cublasGetStatusString(st);
  st = cublasDestroy(handle);

#if defined(TESSERA_EMU_CASE_cudaMallocManaged)
  r = cudaMallocManaged(&p, 64);
#elif defined(TESSERA_EMU_CASE_cudaMemcpy2DAsync)
  r = cudaMemcpy2DAsync(p, 64, h, 64, 64, 1, cudaMemcpyHostToDevice, s);
#elif defined(TESSERA_EMU_CASE_cudaMemcpyToSymbol)
  r = cudaMemcpyToSymbol(value, h, 4);
#elif defined(TESSERA_EMU_CASE_cudaLaunchKernel)
  r = cudaLaunchKernel(reinterpret_cast<const void*>(&supported_kernel), dim3(1), dim3(32), nullptr, 0, s);
#elif defined(TESSERA_EMU_CASE_cudaLaunchHostFunc)
  r = cudaLaunchHostFunc(s, nullptr, nullptr);
#elif defined(TESSERA_EMU_CASE_cudaGraphExecUpdate)
  r = cudaGraphExecUpdate(exec, graph, nullptr);
#elif defined(TESSERA_EMU_CASE_cudaOccupancyMaxPotentialBlockSize)
  r = cudaOccupancyMaxPotentialBlockSize(&n, &n, supported_kernel, 0, 0);
#elif defined(TESSERA_EMU_CASE_cudaPointerGetAttributes)
  r = cudaPointerGetAttributes(nullptr, p);
#elif defined(TESSERA_EMU_CASE_cublasSgemmStridedBatched)
  st = cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, nullptr, 8, 64, nullptr, 8, 64, &one,
                                 nullptr, 8, 64, 2);
#endif
  return static_cast<int>(r) + static_cast<int>(st) + (names != nullptr) + (status_name != nullptr);
}

}  // namespace tessera::gpu::emu_contract
