// Compute kernels of the CPU executor, one table per instruction-set level.
//
// Quantized weights (Q8_0, Q4_0, Q4_1; block layouts of ggml/src/ggml-common.h) are multiplied
// with activations that are quantized on the fly to `act_block`s (32 int8 values with an f32 scale,
// like ggml's q8_1 but with f32 scales): the inner loop is then an int8 x int8 (or u8 x s8) dot
// product, which AVX2 (vpmaddubsw) and VNNI (vpdpbusd) do 32 lanes at a time. F32 weights use an
// f32 FMA path. Each table is compiled for its ISA in its own translation unit (kernels_*.cpp) and
// picked at run time, so the binary still runs on plain x86-64 (scalar table).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model/ggml_types.hpp"

namespace tessera::cpu {

inline constexpr int64_t act_block_elems = 32;

// 32 activations quantized symmetrically: x[i] ~= d * q[i]; s = d * sum(q) serves the zero-point
// term of Q4_1 (m * sum(x)) and the -8 offset of Q4_0.
struct act_block {
  float d;
  float s;
  int8_t q[32];
};
static_assert(sizeof(act_block) == 40);

// out[t * out_stride + r] (+)= dot(weight row r, activation row t) for r in [row_begin, row_end).
struct qmatmul_args {
  ggml_type type = ggml_type::q8_0;  // q8_0, q4_0 or q4_1
  const std::byte* weights = nullptr;
  int64_t weight_stride = 0;  // bytes per weight row
  int64_t num_blocks = 0;     // 32-value blocks per row
  const act_block* act = nullptr;
  int64_t act_stride = 0;     // act_blocks between consecutive tokens
  int32_t num_tokens = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  bool accumulate = false;
};

struct fmatmul_args {
  const float* weights = nullptr;  // [rows, cols]
  int64_t cols = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int32_t num_tokens = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  bool accumulate = false;
};

struct kernel_table {
  const char* name;
  // dst[0 .. n/32) from x[0 .. n). pre: n % 32 == 0.
  void (*quantize_act)(const float* x, act_block* dst, int64_t n);
  void (*matmul_q)(const qmatmul_args& a);
  void (*matmul_f32)(const fmatmul_args& a);
  // out[j] = scale * dot(q, k + j*head_dim) for j < n.
  void (*attn_scores)(const float* q, const float* k, int32_t n, int32_t head_dim, float scale,
                      float* out);
  // out[0 .. head_dim) += sum_j p[j] * v[j*head_dim ..].
  void (*attn_accumulate)(const float* p, const float* v, int32_t n, int32_t head_dim, float* out);
  // x[j] = exp(x[j] - max) for j < n; returns the sum.
  float (*softmax_exp)(float* x, int32_t n, float max);
  // out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (SwiGLU).
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n);
};

// True for weight types matmul_q handles.
bool has_quant_kernel(ggml_type t) noexcept;

const kernel_table& scalar_kernels() noexcept;
// Every table this CPU can run, slowest first (scalar always present). For tests and benches.
std::vector<const kernel_table*> available_kernels();
// The fastest table this CPU supports; TESSERA_CPU_KERNELS=<name> overrides (e.g. "scalar").
const kernel_table& best_kernels();

// Per-ISA tables; each returns nullptr when the running CPU lacks the instructions.
const kernel_table* avx2_kernels() noexcept;
const kernel_table* avxvnni_kernels() noexcept;
const kernel_table* avx512vnni_kernels() noexcept;

// Scalar helpers shared by the scalar kernels and the executor.
float half_to_float(uint16_t h) noexcept;

}  // namespace tessera::cpu
