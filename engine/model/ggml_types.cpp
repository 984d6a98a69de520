// ggml element types: the type table, row sizes, fp16/bf16 conversion and dequantization.
// Block layouts follow ggml's ggml-common.h (struct block_q4_0 ... block_q8_K); the dequantization
// formulas follow the reference (scalar) routines of ggml-quants.c. Everything here reads bytes with
// memcpy so that it is correct on any alignment and endianness-independent on little-endian hosts
// (GGUF is little endian; we only build for little-endian targets, see the static_assert below).
#include "engine/model/ggml_types.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF data is little endian");

constexpr int64_t qk = 32;     // elements per block of the "legacy" quants (QK4_0, QK8_0, ...)
constexpr int64_t qk_k = 256;  // elements per super-block of the k-quants (QK_K)

// Q8_1 and Q8_K are ggml's activation-side formats (the other operand of a quantized dot product);
// they do not appear as model weights, so we only know their sizes.
constexpr std::array<ggml_type_info, 15> type_table{{
    {ggml_type::f32, "F32", 1, 4, true},
    {ggml_type::f16, "F16", 1, 2, true},
    {ggml_type::q4_0, "Q4_0", qk, 2 + qk / 2, true},
    {ggml_type::q4_1, "Q4_1", qk, 2 + 2 + qk / 2, true},
    {ggml_type::q5_0, "Q5_0", qk, 2 + 4 + qk / 2, true},
    {ggml_type::q5_1, "Q5_1", qk, 2 + 2 + 4 + qk / 2, true},
    {ggml_type::q8_0, "Q8_0", qk, 2 + qk, true},
    {ggml_type::q8_1, "Q8_1", qk, 2 + 2 + qk, false},
    {ggml_type::q2_k, "Q2_K", qk_k, qk_k / 16 + qk_k / 4 + 2 + 2, true},
    {ggml_type::q3_k, "Q3_K", qk_k, qk_k / 8 + qk_k / 4 + 12 + 2, true},
    {ggml_type::q4_k, "Q4_K", qk_k, 2 + 2 + 12 + qk_k / 2, true},
    {ggml_type::q5_k, "Q5_K", qk_k, 2 + 2 + 12 + qk_k / 8 + qk_k / 2, true},
    {ggml_type::q6_k, "Q6_K", qk_k, qk_k / 2 + qk_k / 4 + qk_k / 16 + 2, true},
    {ggml_type::q8_k, "Q8_K", qk_k, 4 + qk_k + 2 * (qk_k / 16), false},
    {ggml_type::bf16, "BF16", 1, 2, true},
}};

inline uint16_t load_u16(const uint8_t* p) noexcept {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float load_half(const uint8_t* p) noexcept { return fp16_to_fp32(load_u16(p)); }

// ---- legacy 32-element blocks ----------------------------------------------------------------
// In all of them the low nibbles of qs[0..16) are elements 0..15 and the high nibbles 16..31.

void dequant_q4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += qk) {
    const float d = load_half(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += qk) {
    const float d = load_half(b);
    const float m = load_half(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// Q5: qh is a 32-bit little-endian mask holding the fifth bit of element j at bit j.
void dequant_q5_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += qk) {
    const float d = load_half(b);
    const uint32_t qh = load_u32(b + 2);
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequant_q5_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 24, y += qk) {
    const float d = load_half(b);
    const float m = load_half(b + 2);
    const uint32_t qh = load_u32(b + 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + 16] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequant_q8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += qk) {
    const float d = load_half(b);
    const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

// ---- k-quants: 256-element super-blocks ------------------------------------------------------

// Q2_K: {scales[16], qs[64], d, dmin}. Sixteen groups of 16; scales[g] holds a 4-bit scale (low)
// and a 4-bit min (high). qs packs four 2-bit values per byte: byte l of a 32-byte chunk holds
// elements l (bits 0-1), l+32 (2-3), l+64 (4-5), l+96 (6-7) of that chunk's 128 elements.
void dequant_q2_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 84) {
    const uint8_t* scales = b;
    const uint8_t* q = b + 16;
    const float d = load_half(b + 80);
    const float dmin = load_half(b + 82);
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = scales[is++];
          const float dl = d * static_cast<float>(sc & 0x0F);
          const float ml = dmin * static_cast<float>(sc >> 4);
          const uint8_t* qq = q + 16 * part;
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((qq[l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// Q3_K: {hmask[32], qs[64], scales[12], d}. The 2-bit low parts are laid out as in Q2_K; the third
// bit comes from hmask (bit k of hmask[l] for the k-th group of 32 of element l's position), and a
// CLEAR bit means "subtract 4". Sixteen 6-bit signed scales (offset 32) are packed in 12 bytes:
// low nibbles in bytes 0..7, high 2-bit pairs in bytes 8..11.
void dequant_q3_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 110) {
    const uint8_t* hm = b;
    const uint8_t* q = b + 32;
    const uint8_t* packed = b + 96;
    const float d_all = load_half(b + 108);
    int scales[16];
    for (int s = 0; s < 16; ++s) {
      const int low = (packed[s % 8] >> (4 * (s / 8))) & 0x0F;
      const int high = (packed[8 + s % 4] >> (2 * (s / 4))) & 0x03;
      scales[s] = (low | (high << 4)) - 32;
    }
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * static_cast<float>(scales[is++]);
          const uint8_t* qq = q + 16 * part;
          const uint8_t* hh = hm + 16 * part;
          for (int l = 0; l < 16; ++l) {
            const int v = ((qq[l] >> shift) & 3) - ((hh[l] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

// The eight 6-bit (scale, min) pairs of Q4_K/Q5_K, packed in 12 bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: {d, dmin, scales[12], qs[128]}; eight groups of 32, y = d*sc*q - dmin*m. Each 32-byte run
// of qs holds two groups: low nibbles first, then high nibbles.
void dequant_q4_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = load_half(b);
    const float dmin = load_half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int g = 0; g < 8; g += 2, q += 32) {
      int sc, mn;
      scale_min_k4(g, scales, sc, mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      scale_min_k4(g + 1, scales, sc, mn);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q5_K: Q4_K plus qh[32]: bit g of qh[l] is the fifth bit of element l of group g.
void dequant_q5_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176) {
    const float d = load_half(b);
    const float dmin = load_half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    for (int g = 0; g < 8; g += 2, ql += 32) {
      int sc, mn;
      scale_min_k4(g, scales, sc, mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      scale_min_k4(g + 1, scales, sc, mn);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
      const uint8_t u1 = static_cast<uint8_t>(1u << g), u2 = static_cast<uint8_t>(2u << g);
      for (int l = 0; l < 32; ++l) { *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + ((qh[l] & u1) ? 16 : 0)) - m1; }
      for (int l = 0; l < 32; ++l) { *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2; }
    }
  }
}

// Q6_K: {ql[128], qh[64], int8 scales[16], d}; sixteen groups of 16, y = d*scale*(q - 32). Each half
// (128 elements) uses 64 bytes of ql (low nibbles then high nibbles) and 32 bytes of qh (2 bits each).
void dequant_q6_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_half(b + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

const ggml_type_info* find_type_info(uint32_t raw) noexcept {
  for (const auto& info : type_table) {
    if (static_cast<uint32_t>(info.type) == raw) return &info;
  }
  return nullptr;
}

const ggml_type_info& type_info(ggml_type t) {
  const ggml_type_info* info = find_type_info(static_cast<uint32_t>(t));
  if (info == nullptr) throw std::invalid_argument("type_info: unknown ggml type");
  return *info;
}

int64_t row_bytes(ggml_type t, int64_t n) noexcept {
  const ggml_type_info* info = find_type_info(static_cast<uint32_t>(t));
  if (info == nullptr || n < 0 || n % info->block_elems != 0) return -1;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n / info->block_elems, info->block_bytes, &bytes)) return -1;
  return bytes;
}

void dequantize_row(ggml_type t, const void* src, float* dst, int64_t n) {
  const ggml_type_info& info = type_info(t);
  if (!info.can_dequantize) throw std::invalid_argument("dequantize_row: unsupported type");
  if (n < 0 || n % info.block_elems != 0) {
    throw std::invalid_argument("dequantize_row: n is not a whole number of blocks");
  }
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / info.block_elems;
  switch (t) {
    case ggml_type::f32: std::memcpy(dst, p, static_cast<size_t>(n) * sizeof(float)); return;
    case ggml_type::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(p + 2 * i));
      return;
    case ggml_type::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(p + 2 * i));
      return;
    case ggml_type::q4_0: return dequant_q4_0(p, dst, nb);
    case ggml_type::q4_1: return dequant_q4_1(p, dst, nb);
    case ggml_type::q5_0: return dequant_q5_0(p, dst, nb);
    case ggml_type::q5_1: return dequant_q5_1(p, dst, nb);
    case ggml_type::q8_0: return dequant_q8_0(p, dst, nb);
    case ggml_type::q2_k: return dequant_q2_k(p, dst, nb);
    case ggml_type::q3_k: return dequant_q3_k(p, dst, nb);
    case ggml_type::q4_k: return dequant_q4_k(p, dst, nb);
    case ggml_type::q5_k: return dequant_q5_k(p, dst, nb);
    case ggml_type::q6_k: return dequant_q6_k(p, dst, nb);
    case ggml_type::q8_1:
    case ggml_type::q8_k: break;
  }
  throw std::invalid_argument("dequantize_row: unsupported type");
}

// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float fp16_to_fp32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal half: normalise. value = mant * 2^-24.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t fp32_to_fp16(float f) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN (NaN: keep the top payload bits, force quiet)
    if (abs == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  // Values at or above 65520 round to infinity (65504 is the largest half; 65520 is the midpoint).
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even.
    if (abs < 0x33000000u) return sign;  // below 2^-25: rounds to 0 (2^-25 itself is a tie -> 0)
    const uint32_t e = abs >> 23;        // 102..112
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24: mant * 2^(e-150) / 2^-24 = mant >> (126 - e)
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even; a carry
  // out of the mantissa correctly bumps the exponent (up to infinity, excluded above).
  uint32_t h = ((abs >> 13) - ((127u - 15u) << 10));
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_fp32(uint16_t h) noexcept { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_bf16(float f) noexcept {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);  // round to nearest even (cannot overflow past inf for finite x)
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace tessera
