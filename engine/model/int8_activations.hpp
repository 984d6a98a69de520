// Activations quantised to int8 for dot products with GGUF-quantised weights, as llama.cpp's kernels
// quantise theirs (ggml's block_q8_1 / block_q8_K): the CPU executor's kernels (cpu/kernels.hpp) and
// the CUDA executor's int8 path (gpu/quantized_gemm.hpp) share these layouts and the rule that fills
// them, so both compute the same integer dot products (and a test can hand one's blocks to the other).
//
// The rule, per block: amax = max |x|, d = amax / 127, q[i] = x[i] * (127 / amax) rounded to the
// nearest integer, ties to even (all zero, d = 0, for an all-zero block).
#pragma once
#include <cstdint>

namespace tessera {

inline constexpr int64_t act_block_elems = 32;
inline constexpr int64_t act_block_k_elems = 256;

// 32 activations quantized symmetrically: x[i] ~= d * q[i]; s = d * sum(q) serves the zero-point
// term of Q4_1 (m * sum(x)) and the -8 offset of Q4_0; sum = sum(q) the packed kernels' integer
// offsets (Q4_0's -8, Q5_0's -16 and Q8_0's -128 of its weights shifted to unsigned, in int32).
// Like ggml's block_q8_1, with f32 scales.
struct act_block {
  float d;
  float s;
  int32_t sum;
  int8_t q[32];
};
static_assert(sizeof(act_block) == 44);

// 256 activations quantized symmetrically with one scale (the K-quants' super-block): x[i] ~= d * q[i];
// bsums[j] = sum(q[16j .. 16j+16)) serves the weights' per-sub-block offsets (Q2_K/Q4_K/Q5_K mins,
// Q3_K's -4 and Q6_K's -32). Same content as ggml's block_q8_K; q first and 32-byte aligned so that
// the kernels' 32/64-byte loads of q never split a cache line.
struct alignas(32) act_block_k {
  int8_t q[256];
  int16_t bsums[16];
  float d;
};
static_assert(sizeof(act_block_k) == 320);

}  // namespace tessera
