// GGUF-quantised weight matrices on the GPU: GEMMs that read Q8_0, Q4_0, Q4_1, Q4_K or Q6_K blocks as
// they are in the file instead of a bf16 copy made at load (a Q4_K matrix is 4.5 bits a weight
// against bf16's 16, so a decode step, which streams every weight once, reads ~3.5x fewer bytes).
//
// Same contract as gemm() of gpu/cuda_executor.cpp: W row-major [n, k] (row r at w + r * row_bytes,
// GGUF's blocks along k), in row-major bf16 [rows, k], out fp32 with row stride ldc >= n,
//   out[r, j] = (accumulate ? out[r, j] : 0) + sum_i in[r, i] * W[j, i],
// W's values exactly those of the engine's dequantize_row (engine/model/ggml_types.hpp), computed in
// fp32. Two paths, as llama.cpp's CUDA backend has (mmvq for small batches, dequantise + cuBLAS for
// large ones):
//   * quantized_small_batch_gemm, for 1 to kMaxQuantizedGemvRows input rows: one warp per output
//     column walks the column's blocks once, each lane a chunk of 8 or 16 weights at a time
//     (dequantised in registers) against every input row;
//   * dequantize_rows_to_bf16: the matrix as bf16 into a scratch buffer, for cuBLAS's tensor-core
//     GEMM when a step has more rows (prefill, large decode batches), where the weights' bytes are no
//     longer what limits the step.
// The small-batch kernel also has an int8 form, llama.cpp's mmvq: the input rows quantised to int8 first
// (quantize_activations_int8), then each chunk's dot product summed exactly in int32 with dp4a (four
// byte products a 32-bit instruction) and scaled once, instead of a float FMA per weight. Its
// activations are the CPU executor's (engine/model/int8_activations.hpp): 32-value act_blocks with one
// f32 scale for Q8_0/Q4_0/Q4_1, 256-value act_block_ks with one scale and the sums of every 16 for
// Q4_K/Q6_K (ggml's block_q8_K), quantised by the same rule, so the int8 path computes what the CPU
// executor does up to the order of the float sums.
// Block layouts: ggml's (llama.cpp ggml-common.h), as documented at each CPU dequantiser.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/ggml_types.hpp"
#include "engine/model/int8_activations.hpp"
#include "gpu/kernels.hpp"

namespace tessera::gpu {

// The most input rows quantized_small_batch_gemm serves.
inline constexpr int32_t kMaxQuantizedGemvRows = 8;

// The GGUF types these kernels read: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K (other types are dequantised to bf16
// at load by the executor).
bool quantized_gemm_supports(ggml_type type) noexcept;

// Throws std::invalid_argument for an unsupported type, k not a multiple of the type's block, row_bytes
// short of a row, w or row_bytes not 16-byte aligned for Q4_K (read 16 bytes at a time), rows outside
// [1, kMaxQuantizedGemvRows], ldc < n, or `in` not 16-byte aligned.
void quantized_small_batch_gemm(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in,
                                int32_t rows, float* out, int64_t ldc, bool accumulate, cudaStream_t stream);

// ---- the int8 path ---------------------------------------------------------------------------------

// Bytes of `rows` rows of k activations quantised for weights of `type` (act_blocks for Q8_0, Q4_0 and
// Q4_1, act_block_ks for Q4_K and Q6_K; rows k / 32 or k / 256 blocks apart).
// Throws std::invalid_argument for an unsupported type or k not a multiple of its block.
int64_t int8_activation_bytes(ggml_type type, int32_t rows, int64_t k);

// act (int8_activation_bytes, 32-byte aligned) = in[rows, k] (row-major bf16) quantised for `type`.
// Throws std::invalid_argument as int8_activation_bytes, or for rows < 1, act misaligned.
void quantize_activations_int8(ggml_type type, const bf16* in, int32_t rows, int64_t k, void* act, cudaStream_t stream);

// quantized_small_batch_gemm over activations quantize_activations_int8 wrote for the same type, rows and
// k: out[r, j] = (accumulate ? out[r, j] : 0) + sum over blocks of the block's exact int32 dot products
// times its scales (the CPU executor's arithmetic per block: cpu/kernels_scalar.cpp dot_row_scalar).
// Throws std::invalid_argument as quantized_small_batch_gemm, or for act misaligned.
void quantized_small_batch_gemm_int8(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k,
                                     const void* act, int32_t rows, float* out, int64_t ldc, bool accumulate,
                                     cudaStream_t stream);

// Whether the executor's small batches of quantised matrices take the int8 path: TESSERA_QGEMV=int8 (the
// float path, the default, otherwise; read once).
bool int8_quantized_gemv_from_env() noexcept;

// ---- the tiled tensor-core path (more rows) -----------------------------------------------------

// The most rows the executor sends through quantized_tiled_gemm by default; steps of more rows take
// dequantize_rows_to_bf16 and cuBLAS (prefill-sized steps, where the tensor-core throughput of cuBLAS
// counts more than the matrix's bytes). Not yet measured on a GPU (docs/gpu_executor.md).
inline constexpr int32_t kDefaultQuantizedTiledGemmRows = 256;

// Whether quantized_tiled_gemm takes a matrix of this type and k (a multiple of its 128-value K tile).
bool quantized_tiled_gemm_supports(ggml_type type, int64_t k) noexcept;

// The same product for any number of rows, as the "dequantise-to-bf16 tiles + tensor cores" GEMM
// llama.cpp's mmq is to mmvq: 64 x 64 output tiles, the weights' blocks dequantised tile by tile into
// shared memory as bf16 (the values dequantize_rows_to_bf16 writes) and multiplied with the bf16 input
// on tensor cores (mma.sync, fp32 accumulation), so the matrix is read once per 64 rows instead of
// three times (blocks, bf16 written, bf16 read) on the way to cuBLAS. Throws std::invalid_argument as
// quantized_small_batch_gemm (any rows >= 1), or for k not a multiple of 128.
void quantized_tiled_gemm(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in,
                          int32_t rows, float* out, int64_t ldc, bool accumulate, cudaStream_t stream);

// The executor's threshold: TESSERA_QGEMM_ROWS (0: never) if set, else kDefaultQuantizedTiledGemmRows.
int32_t quantized_tiled_gemm_rows_from_env() noexcept;

// out[n, k] (row-major bf16, row stride k) = W's values rounded to bf16 (nearest even).
// Throws std::invalid_argument as above.
void dequantize_rows_to_bf16(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, bf16* out,
                             cudaStream_t stream);

}  // namespace tessera::gpu
