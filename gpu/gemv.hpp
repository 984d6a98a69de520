// Small-batch GEMM ("GEMV") for decode steps: out[rows, n] = in[rows, k] . W[n, k]^T with few rows.
//
// Why not cuBLAS: with 1-8 rows a GEMM is a pass over the weight matrix (1 FLOP per weight byte for
// bf16 and one row, 8 for eight: far below the tensor cores' balance point), so its speed is HBM
// bandwidth alone.
// cuBLAS's kernels for this shape reached ~66% of an H200's bandwidth in a batch-1 Llama-3-8B decode
// step (docs/benchmarks.md). The kernel here streams W once with 16-byte coalesced loads, several in
// flight per lane, and uses each loaded weight for every input row (docs/gpu_executor.md,
// "Small-batch GEMM").
//
// Same contract as the executor's cuBLAS call (gemm() in gpu/cuda_executor.cpp): W row-major [n, k],
// in row-major [rows, k] (row stride k), out row-major with row stride ldc >= n, fp32 accumulation,
//   out[r, j] = (accumulate ? out[r, j] : 0) + sum_i in[r, i] * W[j, i].
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace tessera::gpu {

// The most input rows one small_batch_gemm serves (more: cuBLAS, whose tiled kernels reuse W from
// shared memory across rows).
inline constexpr int32_t kMaxGemvRows = 8;

// True when small_batch_gemm can run this shape: 1 <= rows <= kMaxGemvRows, n and k >= 1, w and in
// 16-byte aligned and k a multiple of 16 / sizeof(T) (so every row is whole 16-byte loads). Otherwise
// the caller keeps cuBLAS.
bool small_batch_gemm_supports(const float* w, int64_t n, int64_t k, const float* in, int32_t rows) noexcept;
bool small_batch_gemm_supports(const bf16* w, int64_t n, int64_t k, const bf16* in, int32_t rows) noexcept;

// Launches the kernel on `stream` (asynchronous; graph-capturable). Throws std::invalid_argument when
// small_batch_gemm_supports is false or ldc < n, and CUDA errors as CUDA_CHECK does.
void small_batch_gemm(const float* w, int64_t n, int64_t k, const float* in, int32_t rows, float* out, int64_t ldc,
                      bool accumulate, cudaStream_t stream);
void small_batch_gemm(const bf16* w, int64_t n, int64_t k, const bf16* in, int32_t rows, float* out, int64_t ldc,
                      bool accumulate, cudaStream_t stream);

// ---- tuning, for gpu/tools/gemv_bench.cpp and the tests --------------------------------------
// warps_per_column: warps that share one output column, each taking an interleaved part of k (1, 2
// or 4): more than one when n alone gives too few warps to keep HBM busy. columns_per_warp (1 or 2):
// output columns one warp computes together, so each input load serves two columns (for many rows,
// where input loads from L1 would otherwise outnumber the weight loads 8 to 1).
struct small_batch_gemm_tuning {
  int32_t warps_per_column = 1;
  int32_t columns_per_warp = 1;
};
// What small_batch_gemm picks for the shape (elem_bytes: sizeof(T)).
small_batch_gemm_tuning small_batch_gemm_default_tuning(int64_t n, int64_t k, int32_t rows,
                                                        int32_t elem_bytes) noexcept;
// small_batch_gemm with the tuning forced (std::invalid_argument when out of range).
void small_batch_gemm_with(const float* w, int64_t n, int64_t k, const float* in, int32_t rows, float* out, int64_t ldc,
                           bool accumulate, const small_batch_gemm_tuning& tuning, cudaStream_t stream);
void small_batch_gemm_with(const bf16* w, int64_t n, int64_t k, const bf16* in, int32_t rows, float* out, int64_t ldc,
                           bool accumulate, const small_batch_gemm_tuning& tuning, cudaStream_t stream);

// The most rows of a step whose GEMMs the CUDA executor runs through small_batch_gemm when its
// options leave it unset: the environment variable TESSERA_GEMV, a number 0 (cuBLAS always) to
// kMaxGemvRows; unset or anything else: 1, where an H200 measured the kernel faster than cuBLAS
// (at 2, 4 and 8 rows it was slower: docs/gpu_executor.md). Read once per process.
int32_t small_batch_gemm_rows_from_env() noexcept;

}  // namespace tessera::gpu
