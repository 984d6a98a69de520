// ggml tensor element types as stored in GGUF files, and their (de)quantization.
// Block layouts follow ggml (ggml/src/ggml-common.h): a type stores `block_elems` values in
// `block_bytes` bytes; rows are whole blocks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera {

// Numbering is GGUF's on-disk value; do not renumber.
enum class ggml_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};

struct ggml_type_info {
  ggml_type type;
  std::string_view name;  // "Q4_1", ...
  int64_t block_elems;    // values per block (1 for f32/f16/bf16)
  int64_t block_bytes;    // bytes per block
  bool can_dequantize;    // dequantize_row supports it
};

// nullptr when `raw` is not a type this build knows (the caller reports it as a file error).
const ggml_type_info* find_type_info(uint32_t raw) noexcept;
const ggml_type_info& type_info(ggml_type t);  // pre: a known type

// Bytes of a row of `n` values; -1 when n is not a multiple of the block size or overflows.
int64_t row_bytes(ggml_type t, int64_t n) noexcept;

// dst[0..n) = values of the row at src. pre: n % block_elems == 0, type can_dequantize.
void dequantize_row(ggml_type t, const void* src, float* dst, int64_t n);

// IEEE half / bfloat16 helpers used across the engine.
float fp16_to_fp32(uint16_t h) noexcept;
uint16_t fp32_to_fp16(float f) noexcept;
float bf16_to_fp32(uint16_t h) noexcept;
uint16_t fp32_to_bf16(float f) noexcept;  // round to nearest even

}  // namespace tessera
