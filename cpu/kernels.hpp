// Compute kernels of the CPU executor, one table per instruction-set level.
//
// Every weight type is computed as stored (block layouts of ggml/src/ggml-common.h); what the other
// operand of the dot product looks like depends on the type (`act_format_of`):
//   * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: activations quantized on the fly to `act_block`s (32 int8 values
//     with an f32 scale, like ggml's q8_1 but with f32 scales); the inner loop is a u8 x s8 dot
//     product, which AVX2 (vpmaddubsw) and VNNI (vpdpbusd) do 32 lanes at a time;
//   * Q2_K .. Q6_K: activations quantized per 256-value super-block to `act_block_k` (ggml's q8_K:
//     one scale, int8 values, sums of every 16), so that a whole super-block is summed in int32 with
//     the weights' small integer sub-block scales (vpmaddubsw, then vpmaddwd / vpdpwssd against them);
//   * F32, F16, BF16: f32 activations (for BF16 rounded to bf16, so that AVX-512 BF16 `vdpbf16ps`
//     can take them as they are) against weights widened to f32 in registers, f32 FMA.
// Each table is compiled for its ISA in its own translation unit (kernels_*.cpp) and picked at run
// time, so the binary still runs on plain x86-64 (scalar table).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "engine/model/int8_activations.hpp"

namespace tessera::cpu {

// The activation blocks (engine/model/int8_activations.hpp), shared with the CUDA executor's int8 path.
using tessera::act_block;
using tessera::act_block_elems;
using tessera::act_block_k;
using tessera::act_block_k_elems;

// The other operand's format for weights of each type (none: no kernel, dequantize at load).
enum class act_format : uint8_t {
  none,
  f32,   // F32, F16: the activations as they are
  bf16,  // BF16: the activations rounded to bf16 (round_act_bf16), as f32 and as packed bf16
  q8,    // legacy 32-value blocks: act_block
  q8_k,  // K-quants: act_block_k
};
act_format act_format_of(ggml_type t) noexcept;

// out[t * out_stride + r] (+)= dot(weight row r, activation row t) for r in [row_begin, row_end).
struct qmatmul_args {
  ggml_type type = ggml_type::q8_0;  // a type whose act_format is q8 or q8_k
  const std::byte* weights = nullptr;
  int64_t weight_stride = 0;           // bytes per weight row
  int64_t num_blocks = 0;              // blocks of the weight type per row (32 values, or 256 for K-quants)
  const act_block* act = nullptr;      // act_format q8
  const act_block_k* act_k = nullptr;  // act_format q8_k
  int64_t act_stride = 0;              // act_blocks (act_block_ks) between consecutive tokens
  int32_t num_tokens = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  bool accumulate = false;
};

// The same for F32, F16 and BF16 weights.
struct fmatmul_args {
  ggml_type type = ggml_type::f32;  // f32, f16 or bf16
  const void* weights = nullptr;    // [rows, cols] of `type`
  int64_t weight_stride = 0;        // bytes between rows; 0: dense (cols * element size)
  int64_t cols = 0;
  const float* x = nullptr;          // for bf16 weights: values rounded to bf16 (round_act_bf16)
  const uint16_t* x_bf16 = nullptr;  // bf16 weights: the same values as bf16 bits, same strides; lets
                                     // the kernels use vdpbf16ps (null: they widen the weights, FMA)
  int64_t x_stride = 0;
  int32_t num_tokens = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  bool accumulate = false;
};

// ---- packed weights ----------------------------------------------------------------------------
//
// The quantized types can also be computed from a *packed* copy made at load (pack_weights): rows in
// panels of 16, each panel stored block by block, and inside a panel-block every field of the ggml block
// (ggml-common.h) transposed across the 16 rows: a 2-byte field (an f16 scale) as 16 consecutive
// halves, any other field (quants, sub-block scales; all multiples of 4 bytes) as its 4-byte words,
// word i of rows 0..15 side by side (64 bytes). A field at offset o of the block starts at 16 * o of
// the panel-block, so the packed matrix has exactly the bytes of the original (plus zero rows that pad
// the last panel). One 64-byte load then holds 4 consecutive quants of 16 rows: vpdpbusd against the
// activations' 4 bytes broadcast gives 16 rows' partial dots in the 16 int32 lanes, so each weight
// load feeds every token of the tile and no horizontal sums are needed (docs/cpu_executor.md, "Packed
// weights"). Q5_0/Q5_1 also permute the bits of each row's 32-bit qh word (new bit 8j + g = old bit
// 4g + j, new bit 8j + 4 + g = old bit 16 + 4g + j, j, g < 4) so that the fifth bits of the chunk of
// elements 4g..4g+3 sit at bit g of their bytes, as Q5_K's do.
inline constexpr int64_t panel_rows = 16;

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K.
bool has_packed_kernel(ggml_type t) noexcept;
// Bytes of the packed form of a rows x cols matrix: ceil(rows / 16) panels of 16 rows.
int64_t packed_matrix_bytes(ggml_type t, int64_t rows, int64_t cols) noexcept;
// dst (packed_matrix_bytes) = the packed form of rows [0, rows) at src (rows src_stride bytes apart).
// pre: has_packed_kernel(t), cols a multiple of the block size.
void pack_weights(ggml_type t, const std::byte* src, int64_t src_stride, int64_t rows, int64_t cols, std::byte* dst);
// Row r of a packed matrix back in ggml's layout (row_bytes(t, cols) bytes): the inverse, for tests.
void unpack_weight_row(ggml_type t, const std::byte* packed, int64_t cols, int64_t r, std::byte* dst);
// One block of one lane (row of the panel) of a packed panel-block, back in ggml's layout.
void unpack_panel_block(ggml_type t, const std::byte* panel_block, int lane, std::byte* dst);

// ---- KV cache tiles ------------------------------------------------------------------------------
//
// A KV block holds, per (layer, K|V, kv head), one tile of `block_size` token slots in the cache's dtype:
//   K: transposed, element (d, slot) at d * block_size + slot, so that the scores of 8 / 16 consecutive
//      slots are one vector FMA per head dimension against q[d] broadcast (no horizontal sums);
//   V: row-major, element (slot, d) at slot * head_dim + d (the accumulation runs along d).
// int8 tiles hold symmetric int8 values with one f32 scale per slot (token) after the elements
// (x ~= scale * q, scale = max|x| / 127 of that token's head vector): a token's row is quantized once, when
// it is written, and never again, so a block's earlier rows do not change as it fills (a per-tile scale
// would have to requantize them, and results would depend on how tokens were batched).
enum class kv_dtype : uint8_t { f32, f16, bf16, i8 };
const char* to_string(kv_dtype d) noexcept;  // "fp32", "fp16", "bf16", "int8"
int64_t kv_elem_bytes(kv_dtype d) noexcept;
// Bytes of one tile (elements rounded up to 4 bytes, then the int8 scales); a multiple of 4.
int64_t kv_tile_bytes(kv_dtype d, int32_t block_size, int32_t head_dim) noexcept;
// Writes one token's K or V head vector (head_dim floats) into `slot` of a tile (f16 / bf16: round to
// nearest even; int8: the slot's scale and round-to-nearest-even values).
void kv_store_k(kv_dtype d, const float* x, int32_t block_size, int32_t head_dim, int32_t slot,
                std::byte* tile) noexcept;
void kv_store_v(kv_dtype d, const float* x, int32_t block_size, int32_t head_dim, int32_t slot,
                std::byte* tile) noexcept;
// The stored element e of a tile before its int8 scale (f16 / bf16 widened exactly), and the int8 tile's
// per-slot scales: what the kernels compute with (scores: fma over d of q[d] * element, times scale x the
// slot's scale; accumulate: fma of probability x the slot's scale times element, over slots in order).
float kv_element(kv_dtype d, const std::byte* tile, int64_t e) noexcept;
const float* kv_slot_scales(const std::byte* tile, int32_t block_size, int32_t head_dim) noexcept;
// The value the kernels read for element (slot, d) (tests and references).
float kv_load_k(kv_dtype d, const std::byte* tile, int32_t block_size, int32_t head_dim, int32_t slot,
                int32_t i) noexcept;
float kv_load_v(kv_dtype d, const std::byte* tile, int32_t block_size, int32_t head_dim, int32_t slot,
                int32_t i) noexcept;

// Attention over slots [0, n) of one tile for `rows` query rows.
//   attn_scores:     s[m * ld + j] = scale * dot(q[m], k_j) for m < rows, j < n (K tile), the dot product
//                    as four partial sums p_i over d = i (mod 4) in increasing d, then (p0 + p1) + (p2 + p3)
//                    (independent FMA chains for the few rows of a decode step);
//   attn_accumulate: o[m * o_ld + d] += sum_{j < n} s[m * ld + j] * v_j[d] (V tile; s holds probabilities).
// The kernels may read and write whole vectors past n (up to ld, a multiple of 16 >= n; tiles need 64
// readable bytes after them, which the KV pools provide); each row's result is the same sequence of
// operations whatever `rows`, and an entry of s that is 0 adds exactly 0, so results do not depend on which
// rows share a call. Every table does the same f32 operations in the same order on kv_element values (see
// above), so all tables agree bitwise.
struct attn_block_args {
  kv_dtype dtype = kv_dtype::f32;
  const std::byte* tile = nullptr;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  int32_t n = 0;
  int32_t rows = 0;
  const float* const* q = nullptr;  // attn_scores: rows pointers to head_dim floats
  float scale = 1.0f;
  float* s = nullptr;
  int32_t ld = 0;
  float* o = nullptr;  // attn_accumulate
  int32_t o_ld = 0;
};

// The reference V accumulation of attn_block_args for the head dimensions [d0, head_dim): the scalar
// table's whole kernel and the SIMD tables' tail past the last full vector. One out-of-line definition
// (kv_cache.cpp, built without ISA flags), so the tails are the scalar table's code, not a recompilation
// of it: the AVX-512 build of the same loop once rounded differently.
void attn_accumulate_dims(const attn_block_args& a, int32_t d0) noexcept;

struct kernel_table {
  const char* name;
  // dst[0 .. n/32) from x[0 .. n). pre: n % 32 == 0.
  void (*quantize_act)(const float* x, act_block* dst, int64_t n);
  // dst[0 .. n/256) from x[0 .. n). pre: n % 256 == 0.
  void (*quantize_act_k)(const float* x, act_block_k* dst, int64_t n);
  void (*matmul_q)(const qmatmul_args& a);
  // The same over packed weights (a.weights: pack_weights' output; a.weight_stride unused). Every panel
  // that overlaps [row_begin, row_end) is computed whole, only rows in the range are written. Each
  // (row, token) output is the same sequence of integer sums and f32 fmas in every table (exact integer
  // dots per block or super-block, then fma with the scales), so all tables agree bitwise and the result
  // depends neither on the token count nor on the row range.
  void (*matmul_packed)(const qmatmul_args& a);
  void (*matmul_f32)(const fmatmul_args& a);  // f32, f16 and bf16 weights
  // Attention over one KV tile (kv_tile_bytes above), read in its dtype: see attn_block_args.
  void (*attn_scores)(const attn_block_args& a);
  void (*attn_accumulate)(const attn_block_args& a);
  // x[j] = exp(x[j] - max) for j < n; returns the sum.
  float (*softmax_exp)(float* x, int32_t n, float max);
  // out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (SwiGLU).
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n);
};

// True for every weight type the kernels compute with as stored (act_format_of(t) != none): F32,
// F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K. Not the activation-only Q8_1 / Q8_K.
bool has_quant_kernel(ggml_type t) noexcept;

// x[i] rounded to the nearest bf16 (even on ties), as f32 (xf) and as bf16 bits (xb): the activation
// format of BF16 weights. Scalar and shared by all tables: O(n) per input row, not worth an ISA.
void round_act_bf16(const float* x, float* xf, uint16_t* xb, int64_t n) noexcept;

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
