// KV cache tiles (cpu/kernels.hpp, "KV cache tiles"): layout, and the scalar conversions of the write
// path (one token's head vector per call: O(head_dim), not worth an ISA).
#include <cmath>
#include <cstring>

#include "cpu/kernels.hpp"

namespace tessera::cpu {
namespace {

int64_t round4(int64_t n) { return (n + 3) / 4 * 4; }

float* tile_scales(std::byte* tile, int32_t block_size, int32_t head_dim) {
  return reinterpret_cast<float*>(tile + round4(int64_t{block_size} * head_dim));
}

const float* tile_scales(const std::byte* tile, int32_t block_size, int32_t head_dim) {
  return reinterpret_cast<const float*>(tile + round4(int64_t{block_size} * head_dim));
}

// Element `e` of a tile of dtype d set from x.
void put(kv_dtype d, std::byte* tile, int64_t e, float x, float inv_scale) {
  switch (d) {
    case kv_dtype::f32: std::memcpy(tile + 4 * e, &x, 4); break;
    case kv_dtype::f16: {
      const uint16_t h = fp32_to_fp16(x);
      std::memcpy(tile + 2 * e, &h, 2);
      break;
    }
    case kv_dtype::bf16: {
      const uint16_t h = fp32_to_bf16(x);
      std::memcpy(tile + 2 * e, &h, 2);
      break;
    }
    case kv_dtype::i8: {
      // |x| * inv_scale <= 127 up to rounding: nearbyint stays within [-127, 127].
      const float q = std::nearbyint(x * inv_scale);
      tile[e] = static_cast<std::byte>(static_cast<int8_t>(q));
      break;
    }
  }
}

float get(kv_dtype d, const std::byte* tile, int64_t e) {
  switch (d) {
    case kv_dtype::f32: {
      float x;
      std::memcpy(&x, tile + 4 * e, 4);
      return x;
    }
    case kv_dtype::f16:
    case kv_dtype::bf16: {
      uint16_t h;
      std::memcpy(&h, tile + 2 * e, 2);
      return d == kv_dtype::f16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    case kv_dtype::i8: return static_cast<float>(static_cast<int8_t>(tile[e]));
  }
  return 0.0f;
}

// The int8 scale of a head vector (stored in the slot) and its inverse (used to quantize).
float int8_scale(const float* x, int32_t n, float& inv) {
  float amax = 0.0f;
  for (int32_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  return amax / 127.0f;
}

}  // namespace

const char* to_string(kv_dtype d) noexcept {
  switch (d) {
    case kv_dtype::f32: return "fp32";
    case kv_dtype::f16: return "fp16";
    case kv_dtype::bf16: return "bf16";
    case kv_dtype::i8: return "int8";
  }
  return "?";
}

int64_t kv_elem_bytes(kv_dtype d) noexcept { return d == kv_dtype::f32 ? 4 : d == kv_dtype::i8 ? 1 : 2; }

int64_t kv_tile_bytes(kv_dtype d, int32_t block_size, int32_t head_dim) noexcept {
  const int64_t elems = round4(int64_t{block_size} * head_dim * kv_elem_bytes(d));
  return elems + (d == kv_dtype::i8 ? 4 * int64_t{block_size} : 0);
}

void kv_store_k(kv_dtype d, const float* x, int32_t block_size, int32_t head_dim, int32_t slot,
                std::byte* tile) noexcept {
  float inv = 0.0f;
  if (d == kv_dtype::i8) tile_scales(tile, block_size, head_dim)[slot] = int8_scale(x, head_dim, inv);
  for (int32_t i = 0; i < head_dim; ++i) put(d, tile, int64_t{i} * block_size + slot, x[i], inv);
}

void kv_store_v(kv_dtype d, const float* x, int32_t block_size, int32_t head_dim, int32_t slot,
                std::byte* tile) noexcept {
  float inv = 0.0f;
  if (d == kv_dtype::i8) tile_scales(tile, block_size, head_dim)[slot] = int8_scale(x, head_dim, inv);
  for (int32_t i = 0; i < head_dim; ++i) put(d, tile, int64_t{slot} * head_dim + i, x[i], inv);
}

float kv_element(kv_dtype d, const std::byte* tile, int64_t e) noexcept { return get(d, tile, e); }

const float* kv_slot_scales(const std::byte* tile, int32_t block_size, int32_t head_dim) noexcept {
  return tile_scales(tile, block_size, head_dim);
}

void attn_accumulate_dims(const attn_block_args& a, int32_t d0) noexcept {
  const float* vscale = kv_slot_scales(a.tile, a.block_size, a.head_dim);
  for (int32_t m = 0; m < a.rows; ++m) {
    float* o = a.o + int64_t{m} * a.o_ld;
    for (int32_t j = 0; j < a.n; ++j) {
      const float p = a.s[int64_t{m} * a.ld + j];
      const float w = a.dtype == kv_dtype::i8 ? p * vscale[j] : p;
      for (int32_t d = d0; d < a.head_dim; ++d)
        o[d] = std::fmaf(w, get(a.dtype, a.tile, int64_t{j} * a.head_dim + d), o[d]);
    }
  }
}

float kv_load_k(kv_dtype d, const std::byte* tile, int32_t block_size, int32_t head_dim, int32_t slot,
                int32_t i) noexcept {
  const float v = get(d, tile, int64_t{i} * block_size + slot);
  return d == kv_dtype::i8 ? v * tile_scales(tile, block_size, head_dim)[slot] : v;
}

float kv_load_v(kv_dtype d, const std::byte* tile, int32_t block_size, int32_t head_dim, int32_t slot,
                int32_t i) noexcept {
  const float v = get(d, tile, int64_t{slot} * head_dim + i);
  return d == kv_dtype::i8 ? v * tile_scales(tile, block_size, head_dim)[slot] : v;
}

}  // namespace tessera::cpu
