// CUDA error handling: every runtime call goes through CUDA_CHECK, which throws with the call site.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tessera::gpu {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                           ") in " + expr + " at " + file + ":" + std::to_string(line));
}

}  // namespace tessera::gpu

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t tessera_cuda_err_ = (expr);                                           \
    if (tessera_cuda_err_ != cudaSuccess)                                             \
      ::tessera::gpu::throw_cuda_error(tessera_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)
