// Test-side quantizers: f32 rows -> every weight type the CPU executor computes with, in ggml's block
// layouts (ggml/src/ggml-common.h). Written for the tests only and independent of the engine's
// decoding and kernels: plain round-to-nearest with min/max (or max-|x|) scales, not ggml's
// search for the best scales, so the blocks are valid and close to the input but not what
// llama-quantize would write. The tests check them against dequantize_row (round trip error bounds).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/model/ggml_types.hpp"

namespace tessera::test_support {

inline void put_half(std::byte* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// The value a float takes once stored as f16 (what the decoder will use).
inline float as_half(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

inline int round_clamp(float v, int lo, int hi) { return static_cast<int>(std::clamp<long>(std::lround(v), lo, hi)); }

// The element of x with the largest magnitude, sign kept.
inline float signed_absmax(const float* x, int n) {
  float best = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
  }
  return best;
}

namespace detail {

// Q4_0 / Q5_0: d = max / -2^(bits-1), q = round(x / d) + 2^(bits-1).
inline void encode_symmetric(const float* xb, std::byte* blk, int bits) {
  const int offset = 1 << (bits - 1), qmax = (1 << bits) - 1;
  const float d = signed_absmax(xb, 32) / static_cast<float>(-offset);
  put_half(blk, d);
  const float dd = as_half(d);
  int q[32];
  for (int i = 0; i < 32; ++i) {
    q[i] = dd != 0.0f ? static_cast<int>(std::clamp<long>(std::lround(xb[i] / dd) + offset, 0, qmax)) : offset;
  }
  std::byte* qs = blk + (bits == 4 ? 2 : 6);
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<std::byte>((q[i] & 15) | (q[i + 16] & 15) << 4);
  if (bits == 5) {
    uint32_t qh = 0;
    for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>(q[i] >> 4) << i;
    std::memcpy(blk + 2, &qh, 4);
  }
}

// Q4_1 / Q5_1: x = d * q + m with m = min, d = (max - min) / (2^bits - 1).
inline void encode_affine(const float* xb, std::byte* blk, int bits) {
  const int qmax = (1 << bits) - 1;
  const float lo = *std::min_element(xb, xb + 32), hi = *std::max_element(xb, xb + 32);
  const float d = (hi - lo) / static_cast<float>(qmax);
  put_half(blk, d);
  put_half(blk + 2, lo);
  const float dd = as_half(d), mm = as_half(lo);
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = dd > 0.0f ? round_clamp((xb[i] - mm) / dd, 0, qmax) : 0;
  std::byte* qs = blk + (bits == 4 ? 4 : 8);
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<std::byte>((q[i] & 15) | (q[i + 16] & 15) << 4);
  if (bits == 5) {
    uint32_t qh = 0;
    for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>(q[i] >> 4) << i;
    std::memcpy(blk + 4, &qh, 4);
  }
}

// Per group of `group` values (of 256) x = d * sc * q - dmin * m, q in [0, qmax], sc and m integers in
// [0, smax] (Q2_K: 16 groups, 4-bit; Q4_K/Q5_K: 8 groups, 6-bit). Fills q, sc, m; returns (d, dmin).
inline void affine_k(const float* x, int group, int qmax, int smax, int* q, int* sc, int* m, float& d, float& dmin) {
  const int groups = 256 / group;
  float scale[16], mn[16], max_scale = 0.0f, max_min = 0.0f;
  for (int g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    const float lo = std::min(0.0f, *std::min_element(xg, xg + group)), hi = *std::max_element(xg, xg + group);
    scale[g] = (std::max(hi, lo) - lo) / static_cast<float>(qmax);
    mn[g] = -lo;
    max_scale = std::max(max_scale, scale[g]);
    max_min = std::max(max_min, mn[g]);
  }
  d = as_half(max_scale / static_cast<float>(smax));
  dmin = as_half(max_min / static_cast<float>(smax));
  for (int g = 0; g < groups; ++g) {
    sc[g] = d > 0.0f ? round_clamp(scale[g] / d, 0, smax) : 0;
    m[g] = dmin > 0.0f ? round_clamp(mn[g] / dmin, 0, smax) : 0;
    const float step = d * static_cast<float>(sc[g]), off = dmin * static_cast<float>(m[g]);
    for (int i = g * group; i < (g + 1) * group; ++i)
      q[i] = step > 0.0f ? round_clamp((x[i] + off) / step, 0, qmax) : 0;
  }
}

// Per group of 16 x = d * sc * q, q in [qmin, -qmin - 1], sc a signed integer in [-smax - 1, smax]
// (Q3_K: 6-bit, Q6_K: 8-bit). Fills q (signed), sc; returns d.
inline void symmetric_k(const float* x, int qmin, int smax, int* q, int* sc, float& d) {
  float scale[16], max_scale = 0.0f;
  for (int g = 0; g < 16; ++g) {
    scale[g] = signed_absmax(x + 16 * g, 16) / static_cast<float>(qmin);
    max_scale = std::max(max_scale, std::fabs(scale[g]));
  }
  d = as_half(max_scale / static_cast<float>(smax));
  for (int g = 0; g < 16; ++g) {
    sc[g] = d > 0.0f ? round_clamp(scale[g] / d, -smax - 1, smax) : 0;
    const float step = d * static_cast<float>(sc[g]);
    for (int i = 16 * g; i < 16 * g + 16; ++i) q[i] = step != 0.0f ? round_clamp(x[i] / step, qmin, -qmin - 1) : 0;
  }
}

// Element e of a 256-value super-block stored 2 bits at a time (Q2_K, Q3_K's low bits): bits
// 2 * (e / 32 % 4) of byte 32 * (e / 128) + e % 32.
inline void put_2bit(std::byte* qs, int e, int v) {
  qs[32 * (e / 128) + e % 32] |= static_cast<std::byte>((v & 3) << (2 * (e / 32 % 4)));
}

inline void encode_q2_k(const float* x, std::byte* blk) {  // {scales[16]; qs[64]; d; dmin}
  int q[256], sc[16], m[16];
  float d, dmin;
  affine_k(x, 16, 3, 15, q, sc, m, d, dmin);
  for (int j = 0; j < 16; ++j) blk[j] = static_cast<std::byte>(sc[j] | m[j] << 4);
  for (int e = 0; e < 256; ++e) put_2bit(blk + 16, e, q[e]);
  put_half(blk + 80, d);
  put_half(blk + 82, dmin);
}

inline void encode_q3_k(const float* x, std::byte* blk) {  // {hmask[32]; qs[64]; scales[12]; d}
  int q[256], sc[16];
  float d;
  symmetric_k(x, -4, 31, q, sc, d);
  for (int e = 0; e < 256; ++e) {
    const int u = q[e] + 4;  // the decoder subtracts 4 where the hmask bit is clear
    put_2bit(blk + 32, e, u & 3);
    blk[e % 32] |= static_cast<std::byte>((u >> 2) << (e / 32));
  }
  for (int j = 0; j < 16; ++j) {  // 6-bit sc + 32: low nibble in byte j % 8, top two bits in byte 8 + j % 4
    const int v = sc[j] + 32;
    blk[96 + j % 8] |= static_cast<std::byte>((v & 15) << (4 * (j / 8)));
    blk[96 + 8 + j % 4] |= static_cast<std::byte>((v >> 4) << (2 * (j / 4)));
  }
  put_half(blk + 108, d);
}

// Q4_K / Q5_K: {d; dmin; scales[12]; (qh[32];) qs[128]}.
inline void encode_q45_k(const float* x, std::byte* blk, int bits) {
  int q[256], sc[8], m[8];
  float d, dmin;
  affine_k(x, 32, (1 << bits) - 1, 63, q, sc, m, d, dmin);
  put_half(blk, d);
  put_half(blk + 2, dmin);
  std::byte* s = blk + 4;  // the inverse of ggml's get_scale_min_k4
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<std::byte>(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<std::byte>(m[j] | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<std::byte>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
  std::byte* qs = blk + (bits == 4 ? 16 : 48);
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 32; ++l)
      qs[32 * k + l] = static_cast<std::byte>((q[64 * k + l] & 15) | (q[64 * k + 32 + l] & 15) << 4);
  }
  if (bits == 5) {
    for (int e = 0; e < 256; ++e) blk[16 + e % 32] |= static_cast<std::byte>((q[e] >> 4) << (e / 32));
  }
}

inline void encode_q6_k(const float* x, std::byte* blk) {  // {ql[128]; qh[64]; int8 scales[16]; d}
  int q[256], sc[16];
  float d;
  symmetric_k(x, -32, 127, q, sc, d);
  for (int e = 0; e < 256; ++e) {
    const int u = q[e] + 32, h = e / 128, s = e % 128 / 32, l = e % 32;
    blk[64 * h + l + 32 * (s % 2)] |= static_cast<std::byte>((u & 15) << (s < 2 ? 0 : 4));
    blk[128 + 32 * h + l] |= static_cast<std::byte>((u >> 4) << (2 * s));
  }
  for (int j = 0; j < 16; ++j) blk[192 + j] = static_cast<std::byte>(static_cast<int8_t>(sc[j]));
  put_half(blk + 208, d);
}

}  // namespace detail

// One row of n values in `type`. pre: n is a whole number of the type's blocks.
inline std::vector<std::byte> encode_row(ggml_type type, const float* x, int64_t n) {
  std::vector<std::byte> out(static_cast<size_t>(row_bytes(type, n)));
  switch (type) {
    case ggml_type::f32: std::memcpy(out.data(), x, out.size()); return out;
    case ggml_type::f16:
      for (int64_t i = 0; i < n; ++i) put_half(out.data() + 2 * i, x[i]);
      return out;
    case ggml_type::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      return out;
    default: break;
  }
  const ggml_type_info& info = type_info(type);
  for (int64_t b = 0; b < n / info.block_elems; ++b) {
    const float* xb = x + b * info.block_elems;
    std::byte* blk = out.data() + b * info.block_bytes;
    switch (type) {
      case ggml_type::q8_0: {  // {d; int8 qs[32]}: d = max|x| / 127
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / 127.0f;
        put_half(blk, d);
        for (int i = 0; i < 32; ++i) {
          blk[2 + i] = static_cast<std::byte>(static_cast<int8_t>(d > 0 ? std::lround(xb[i] / d) : 0));
        }
        break;
      }
      case ggml_type::q4_0: detail::encode_symmetric(xb, blk, 4); break;
      case ggml_type::q5_0: detail::encode_symmetric(xb, blk, 5); break;
      case ggml_type::q4_1: detail::encode_affine(xb, blk, 4); break;
      case ggml_type::q5_1: detail::encode_affine(xb, blk, 5); break;
      case ggml_type::q2_k: detail::encode_q2_k(xb, blk); break;
      case ggml_type::q3_k: detail::encode_q3_k(xb, blk); break;
      case ggml_type::q4_k: detail::encode_q45_k(xb, blk, 4); break;
      case ggml_type::q5_k: detail::encode_q45_k(xb, blk, 5); break;
      case ggml_type::q6_k: detail::encode_q6_k(xb, blk); break;
      default: return {};
    }
  }
  return out;
}

}  // namespace tessera::test_support
