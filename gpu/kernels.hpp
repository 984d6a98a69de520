// Host-callable launchers for the elementwise / normalisation kernels of the LLaMA layer.
// Pointers are device pointers; every launcher is asynchronous on `stream`.
// Each kernel has a CPU reference in tests/gpu/kernels_test.cpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::gpu {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count() noexcept;

// out[r, :] = table[ids[r], :]   table [vocab, hidden] f32, ids [rows], out [rows, hidden] f32.
// Ids outside [0, vocab) produce a zero row (ids are validated by the engine before this point).
void embedding_gather(float* out, const float* table, const int32_t* ids, int32_t rows, int32_t hidden,
                      int32_t vocab, cudaStream_t stream);

// Fused residual add + RMSNorm: residual[r] += x[r]; out[r] = residual[r] / rms(residual[r]) * weight.
// x may be null (plain RMSNorm of residual). Shapes [rows, hidden]; one block per row.
void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int32_t rows, int32_t hidden,
                  float eps, cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]   gate_up [rows, 2*inter], out [rows, inter].
void silu_and_mul(float* out, const float* gate_up, int32_t rows, int32_t inter, cudaStream_t stream);

}  // namespace tessera::gpu
