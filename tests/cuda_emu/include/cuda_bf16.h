// CPU emulation of CUDA (tests/cuda_emu): __nv_bfloat16 with 16-bit storage and the toolkit's conversions
// (round to nearest even; NaN becomes the canonical 0x7FFF, as __float2bfloat16_rn does).
#pragma once
#include <bit>
#include <cstdint>

#include "cuda_runtime.h"

namespace tessera::gpu::emu {
inline unsigned short float_to_bf16_rn(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<unsigned short>(x >> 16);
}
inline float bf16_to_float(unsigned short h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
}  // namespace tessera::gpu::emu

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::tessera::gpu::emu::float_to_bf16_rn(f)) {}
  __nv_bfloat16(double d) : __x(::tessera::gpu::emu::float_to_bf16_rn(static_cast<float>(d))) {}
  __nv_bfloat16(int i) : __x(::tessera::gpu::emu::float_to_bf16_rn(static_cast<float>(i))) {}
  operator float() const { return ::tessera::gpu::emu::bf16_to_float(__x); }
  operator __nv_bfloat16_raw() const { return {__x}; }
};
static_assert(sizeof(__nv_bfloat16) == 2);

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
  __nv_bfloat16_raw r{static_cast<unsigned short>(std::bit_cast<uint32_t>(f) >> 16)};
  if (f != f) r.x = 0x7FFFu;
  return __nv_bfloat16(r);
}
inline float __bfloat162float(__nv_bfloat16 h) { return ::tessera::gpu::emu::bf16_to_float(h.__x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return {__nv_bfloat16(a), __nv_bfloat16(a)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
