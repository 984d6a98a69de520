// FP8 E4M3 ("e4m3fn"), the KV cache element of --kv-cache-dtype fp8: 1 sign bit, 4 exponent bits
// (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN, so the largest finite value is 448 and
// the smallest subnormal 2^-9. Defined by the OCP 8-bit Floating Point Specification (OFP8) 1.0, 2023,
// from Micikevicius et al., "FP8 Formats for Deep Learning", 2022 (https://arxiv.org/abs/2209.05433);
// the same format as CUDA's __nv_fp8_e4m3 and torch.float8_e4m3fn.
//
// Conversions here are plain integer arithmetic, callable from host code, device code and the CPU
// emulation alike (its <cuda_fp8.h> is not emulated), so a kernel and its CPU reference round the
// same way. Encoding rounds to nearest even and saturates to +-448 (CUDA's __NV_SATFINITE): a
// value beyond the range keeps its sign and the largest magnitude rather than becoming NaN.
#pragma once
#include <cstdint>
#include <cstring>

#include "gpu/kernels.hpp"  // TESSERA_HOST_DEVICE

namespace tessera::gpu {

// One E4M3 element; a distinct type so the kernels' templates pick its conversions.
struct fp8_e4m3 {
  uint8_t bits;
};
static_assert(sizeof(fp8_e4m3) == 1);

namespace detail {
TESSERA_HOST_DEVICE inline float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
TESSERA_HOST_DEVICE inline uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
}  // namespace detail

TESSERA_HOST_DEVICE inline float fp8_e4m3_to_float(uint8_t b) {
  const uint32_t em = b & 0x7Fu;  // exponent and mantissa
  float v;
  if (em == 0x7Fu) {
    v = detail::bits_to_float(0x7FC00000u);  // NaN
  } else if (em < 8u) {
    v = static_cast<float>(em) * (1.0f / 512.0f);  // subnormal: m * 2^-9
  } else {
    // Normal: 2^(e-7) * (1 + m/8) is fp32's exponent e - 7 + 127 = e + 120 over the same 3 mantissa bits.
    v = detail::bits_to_float((em + (120u << 3)) << 20);
  }
  return (b & 0x80u) ? -v : v;
}

TESSERA_HOST_DEVICE inline uint8_t float_to_fp8_e4m3(float x) {
  const uint32_t u = detail::float_to_bits(x);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);        // NaN stays NaN
  constexpr uint8_t kMaxFinite = 0x7E;                                     // 448
  if (mag >= 0x43E00000u) return static_cast<uint8_t>(sign | kMaxFinite);  // >= 448 (and inf): saturate
  const int32_t exp = static_cast<int32_t>(mag >> 23) - 127;
  uint32_t code;
  if (exp < -6) {
    // Subnormal range (below 2^-6): the nearest multiple of 2^-9, ties to even. A 24-bit significand
    // shifted right by (-exp - 6) + 20 bits; 8 (rounded up from just below 2^-6) is the code of 2^-6.
    if (exp < -10) return sign;  // below 2^-10: half the smallest subnormal or less rounds to 0
    const uint32_t sig = (mag & 0x7FFFFFu) | 0x800000u;
    const int shift = 20 + (-6 - exp);
    const uint32_t keep = sig >> shift, rest = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
    code = keep + ((rest > half || (rest == half && (keep & 1u))) ? 1u : 0u);
  } else {
    // Normal: the exponent field e + 7 over the top 3 of 23 mantissa bits, ties to even; a carry out
    // of the mantissa moves into the exponent, which is the right value.
    const uint32_t keep = (static_cast<uint32_t>(exp + 7) << 3) | ((mag >> 20) & 7u);
    const uint32_t rest = mag & 0xFFFFFu, half = 0x80000u;
    code = keep + ((rest > half || (rest == half && (keep & 1u))) ? 1u : 0u);
    if (code > kMaxFinite) code = kMaxFinite;  // 448 < x < 464 rounds to 448 anyway; guards the carry
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace tessera::gpu
