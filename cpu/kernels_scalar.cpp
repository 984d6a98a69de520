// Portable kernels (the fallback and the reference the SIMD tables are tested against) and the
// run-time choice of table.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "cpu/kernels.hpp"

namespace tessera::cpu {

float half_to_float(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits = 0;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace {

uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void quantize_act_scalar(const float* x, act_block* dst, int64_t n) {
  for (int64_t b = 0; b < n / act_block_elems; ++b) {
    const float* xb = x + b * act_block_elems;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      dst[b].q[i] = static_cast<int8_t>(q);
      sum += q;
    }
    dst[b].d = d;
    dst[b].s = d * static_cast<float>(sum);
    dst[b].sum = sum;
  }
}

// Same rule as quantize_act over 256 values (one scale; |q| <= 127, so 16 of them sum to an int16).
void quantize_act_k_scalar(const float* x, act_block_k* dst, int64_t n) {
  for (int64_t b = 0; b < n / act_block_k_elems; ++b) {
    const float* xb = x + b * act_block_k_elems;
    float amax = 0.0f;
    for (int i = 0; i < 256; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        const int q = static_cast<int>(std::nearbyint(xb[i] * id));
        dst[b].q[i] = static_cast<int8_t>(q);
        sum += q;
      }
      dst[b].bsums[j] = static_cast<int16_t>(sum);
    }
    dst[b].d = amax / 127.0f;
  }
}

float half_at(const uint8_t* p) { return half_to_float(load_u16(reinterpret_cast<const std::byte*>(p))); }

// A legacy block's weights as unsigned integers u[0..32) (element order) with x = d * u + m, where
// m is an f32 offset (Q4_0: -8d, Q5_0: -16d); block layouts from ggml-common.h.
struct legacy_block {
  int u[32];
  float d;
  float m;
  bool has_offset;  // false: Q8_0, whose u is signed and which has no offset
};

void unpack_q4(const uint8_t* qs, int* u) {
  for (int i = 0; i < 16; ++i) {
    u[i] = qs[i] & 0x0f;
    u[i + 16] = qs[i] >> 4;
  }
}

// Q5_0/Q5_1: qh is a little-endian 32-bit mask, bit j the fifth bit of element j.
void add_fifth_bits(const uint8_t* qh_bytes, int* u) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  for (int j = 0; j < 32; ++j) u[j] |= static_cast<int>((qh >> j) & 1u) << 4;
}

legacy_block unpack_legacy(ggml_type t, const uint8_t* blk) {
  legacy_block b{};
  b.has_offset = true;
  switch (t) {
    case ggml_type::q8_0:  // {f16 d; int8 qs[32]}
      b.d = half_at(blk);
      for (int i = 0; i < 32; ++i) b.u[i] = static_cast<int8_t>(blk[2 + i]);
      b.has_offset = false;
      break;
    case ggml_type::q4_0:  // {f16 d; u8 qs[16]}: x = d * (q - 8)
      b.d = half_at(blk);
      unpack_q4(blk + 2, b.u);
      b.m = -8.0f * b.d;
      break;
    case ggml_type::q4_1:  // {f16 d; f16 m; u8 qs[16]}: x = d * q + m
      b.d = half_at(blk);
      b.m = half_at(blk + 2);
      unpack_q4(blk + 4, b.u);
      break;
    case ggml_type::q5_0:  // {f16 d; u8 qh[4]; u8 qs[16]}: x = d * (q - 16)
      b.d = half_at(blk);
      unpack_q4(blk + 6, b.u);
      add_fifth_bits(blk + 2, b.u);
      b.m = -16.0f * b.d;
      break;
    case ggml_type::q5_1:  // {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: x = d * q + m
      b.d = half_at(blk);
      b.m = half_at(blk + 2);
      unpack_q4(blk + 8, b.u);
      add_fifth_bits(blk + 4, b.u);
      break;
    default: break;
  }
  return b;
}

// A K-quant super-block as unsigned integers u[0..256) (element order) with, per 16-value group j,
// x = fa * c1[j] * u + fb * c2[j]: the dot with an act_block_k is then
// d_a * (fa * sum_j c1[j] * dot_j(u, q) + fb * sum_j c2[j] * bsums[j]), all sums but the last step in
// int32. Layouts: ggml-common.h block_q2_K .. block_q6_K.
struct k_block {
  int u[256];
  int c1[16];
  int c2[16];
  float fa;
  float fb;
};

// Q4_K/Q5_K: eight 6-bit (scale, min) pairs packed in 12 bytes (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int& sc, int& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void unpack_k(ggml_type t, const uint8_t* blk, k_block& k) {
  switch (t) {
    case ggml_type::q2_k: {  // {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: x = d*sc*q - dmin*m
      // Element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; scales[j]: scale low, min high nibble.
      for (int e = 0; e < 256; ++e) k.u[e] = (blk[16 + 32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
      for (int j = 0; j < 16; ++j) {
        k.c1[j] = blk[j] & 0x0f;
        k.c2[j] = blk[j] >> 4;
      }
      k.fa = half_at(blk + 80);
      k.fb = -half_at(blk + 82);
      break;
    }
    case ggml_type::q3_k: {  // {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: x = d*sc*(q - 4*!h)
      // Low bits as in Q2_K; bit e/32 of hmask[e % 32] set means "no -4", so u = low + 4h = q + 4.
      for (int e = 0; e < 256; ++e) {
        const int low = (blk[32 + 32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
        k.u[e] = low | (((blk[e % 32] >> (e / 32)) & 1) << 2);
      }
      const uint8_t* p = blk + 96;  // 16 6-bit scales, offset 32: low nibbles in 0..7, high pairs in 8..11
      for (int j = 0; j < 16; ++j) {
        const int low = (p[j % 8] >> (4 * (j / 8))) & 0x0f;
        const int high = (p[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        k.c1[j] = k.c2[j] = (low | (high << 4)) - 32;
      }
      k.fa = half_at(blk + 108);
      k.fb = -4.0f * k.fa;
      break;
    }
    case ggml_type::q4_k:    // {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: x = d*sc*q - dmin*m
    case ggml_type::q5_k: {  // {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
      // Element 64k + l is the low nibble of qs[32k + l], 64k + 32 + l the high one; Q5_K's fifth bit
      // of element e is bit e/32 of qh[e % 32]. Groups of 32 share a (scale, min) pair.
      const bool five = t == ggml_type::q5_k;
      const uint8_t* qs = blk + (five ? 48 : 16);
      for (int e = 0; e < 256; ++e) {
        const uint8_t byte = qs[32 * (e / 64) + e % 32];
        k.u[e] = (e % 64 < 32 ? byte & 0x0f : byte >> 4) | (five ? ((blk[16 + e % 32] >> (e / 32)) & 1) << 4 : 0);
      }
      for (int g = 0; g < 8; ++g) {
        int sc = 0, mn = 0;
        scale_min_k4(g, blk + 4, sc, mn);
        k.c1[2 * g] = k.c1[2 * g + 1] = sc;
        k.c2[2 * g] = k.c2[2 * g + 1] = mn;
      }
      k.fa = half_at(blk);
      k.fb = -half_at(blk + 2);
      break;
    }
    case ggml_type::q6_k: {  // {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}: x = d*sc*(q - 32)
      // Per half h (128 values): element 128h + 32s + l has its low nibble in ql[64h + l + 32(s%2)]
      // (low nibble for s < 2, high for s >= 2) and its top two bits at 2s in qh[32h + l].
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, s = e % 128 / 32, l = e % 32;
        const uint8_t lo = blk[64 * h + l + 32 * (s % 2)];
        k.u[e] = (s < 2 ? lo & 0x0f : lo >> 4) | (((blk[128 + 32 * h + l] >> (2 * s)) & 3) << 4);
      }
      for (int j = 0; j < 16; ++j) k.c1[j] = k.c2[j] = static_cast<int8_t>(blk[192 + j]);
      k.fa = half_at(blk + 208);
      k.fb = -32.0f * k.fa;
      break;
    }
    default: break;
  }
}

bool is_k_type(ggml_type t) {
  return t == ggml_type::q2_k || t == ggml_type::q3_k || t == ggml_type::q4_k || t == ggml_type::q5_k ||
         t == ggml_type::q6_k;
}

// Dot of one weight row with one activation row, per ggml block layout.
float dot_row_scalar(ggml_type t, const std::byte* w, const qmatmul_args& a, int32_t token) {
  const auto* row = reinterpret_cast<const uint8_t*>(w);
  const int64_t bb = type_info(t).block_bytes;
  float total = 0.0f;
  if (is_k_type(t)) {
    const act_block_k* act = a.act_k + token * a.act_stride;
    k_block k;
    for (int64_t b = 0; b < a.num_blocks; ++b) {
      unpack_k(t, row + b * bb, k);
      int s1 = 0, s2 = 0;
      for (int j = 0; j < 16; ++j) {
        int dot = 0;
        for (int i = 16 * j; i < 16 * j + 16; ++i) dot += k.u[i] * act[b].q[i];
        s1 += k.c1[j] * dot;
        s2 += k.c2[j] * act[b].bsums[j];
      }
      total += act[b].d * (k.fa * static_cast<float>(s1) + k.fb * static_cast<float>(s2));
    }
    return total;
  }
  const act_block* act = a.act + token * a.act_stride;
  for (int64_t b = 0; b < a.num_blocks; ++b) {
    const legacy_block lb = unpack_legacy(t, row + b * bb);
    int isum = 0;
    for (int i = 0; i < 32; ++i) isum += lb.u[i] * act[b].q[i];
    // sum(x * a) = d * d_a * sum(u * q) + m * d_a * sum(q) = ... + m * s.
    total += lb.d * act[b].d * static_cast<float>(isum) + (lb.has_offset ? lb.m * act[b].s : 0.0f);
  }
  return total;
}

void matmul_q_scalar(const qmatmul_args& a) {
  for (int32_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t r = a.row_begin; r < a.row_end; ++r) {
      const float v = dot_row_scalar(a.type, a.weights + r * a.weight_stride, a, t);
      float& o = a.out[t * a.out_stride + r];
      o = a.accumulate ? o + v : v;
    }
  }
}

// The packed kernels' arithmetic (kernels.hpp, matmul_packed), which every SIMD table reproduces
// bitwise: per legacy block an exact int32 dot with the weights' integer offset applied to the
// activations' integer sum, then acc = fma(float(dot), d_w * d_a, acc) (+ fma(m_w, s_a, acc) for Q4_1 /
// Q5_1); per K-quant super-block the exact int32 sums S1 = sum_j c1_j dot_j and S2 = sum_j c2_j bsums_j,
// then acc = fma(float(S1 - 2^k S2), fa * d_a, acc) for Q3_K / Q6_K (fb = -2^k fa) or
// acc = fma(float(S1), fa * d_a, acc), acc = fma(float(S2), fb * d_a, acc) for the others.
int legacy_offset(ggml_type t) { return t == ggml_type::q4_0 ? 8 : t == ggml_type::q5_0 ? 16 : 0; }

int k_fold_shift(ggml_type t) { return t == ggml_type::q3_k ? 2 : t == ggml_type::q6_k ? 5 : -1; }

void matmul_packed_scalar(const qmatmul_args& a) {
  const ggml_type t = a.type;
  const int64_t bb = type_info(t).block_bytes, nb = a.num_blocks;
  const bool k_type = is_k_type(t);
  std::vector<float> acc(static_cast<size_t>(a.num_tokens));
  std::byte blk[256];
  k_block kb;
  const auto* base = a.weights;
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const std::byte* panel = base + r / panel_rows * nb * panel_rows * bb;
    const int lane = static_cast<int>(r % panel_rows);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      unpack_panel_block(t, panel + b * panel_rows * bb, lane, blk);
      const auto* w = reinterpret_cast<const uint8_t*>(blk);
      if (k_type) {
        unpack_k(t, w, kb);
        for (int32_t tok = 0; tok < a.num_tokens; ++tok) {
          const act_block_k& x = a.act_k[tok * a.act_stride + b];
          int s1 = 0, s2 = 0;
          for (int j = 0; j < 16; ++j) {
            int dot = 0;
            for (int i = 16 * j; i < 16 * j + 16; ++i) dot += kb.u[i] * x.q[i];
            s1 += kb.c1[j] * dot;
            s2 += kb.c2[j] * x.bsums[j];
          }
          float& o = acc[static_cast<size_t>(tok)];
          if (k_fold_shift(t) >= 0) {
            o = std::fma(static_cast<float>(s1 - s2 * (1 << k_fold_shift(t))), kb.fa * x.d, o);
          } else {
            o = std::fma(static_cast<float>(s1), kb.fa * x.d, o);
            o = std::fma(static_cast<float>(s2), kb.fb * x.d, o);
          }
        }
      } else {
        const legacy_block lb = unpack_legacy(t, w);
        const int off = legacy_offset(t);
        const bool has_m = t == ggml_type::q4_1 || t == ggml_type::q5_1;
        for (int32_t tok = 0; tok < a.num_tokens; ++tok) {
          const act_block& x = a.act[tok * a.act_stride + b];
          int dot = 0;
          for (int i = 0; i < 32; ++i) dot += lb.u[i] * x.q[i];
          dot -= off * x.sum;
          float& o = acc[static_cast<size_t>(tok)];
          o = std::fma(static_cast<float>(dot), lb.d * x.d, o);
          if (has_m) o = std::fma(lb.m, x.s, o);
        }
      }
    }
    for (int32_t tok = 0; tok < a.num_tokens; ++tok) {
      float& o = a.out[tok * a.out_stride + r];
      o = a.accumulate ? o + acc[static_cast<size_t>(tok)] : acc[static_cast<size_t>(tok)];
    }
  }
}

float weight_at(ggml_type t, const std::byte* row, int64_t c) {
  if (t == ggml_type::f32) {
    float v;
    std::memcpy(&v, row + 4 * c, sizeof v);
    return v;
  }
  const uint16_t h = load_u16(row + 2 * c);
  return t == ggml_type::f16 ? half_to_float(h) : bf16_to_fp32(h);
}

void matmul_f32_scalar(const fmatmul_args& a) {
  const int64_t elem = a.type == ggml_type::f32 ? 4 : 2;
  const int64_t stride = a.weight_stride != 0 ? a.weight_stride : a.cols * elem;
  for (int32_t t = 0; t < a.num_tokens; ++t) {
    const float* x = a.x + t * a.x_stride;
    for (int64_t r = a.row_begin; r < a.row_end; ++r) {
      const std::byte* w = static_cast<const std::byte*>(a.weights) + r * stride;
      float v = 0.0f;
      for (int64_t c = 0; c < a.cols; ++c) v += weight_at(a.type, w, c) * x[c];
      float& o = a.out[t * a.out_stride + r];
      o = a.accumulate ? o + v : v;
    }
  }
}

// The reference of the SIMD tables' operation order (kernels_attn_simd.inc): per score one fmaf chain
// over the head dimensions, then one multiply; per output element one fmaf chain over the slots
// (attn_accumulate_dims).
void attn_scores_scalar(const attn_block_args& a) {
  const float* kscale = kv_slot_scales(a.tile, a.block_size, a.head_dim);
  for (int32_t m = 0; m < a.rows; ++m) {
    for (int32_t j = 0; j < a.n; ++j) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // partial sums over d = i (mod 4): kernels.hpp
      for (int32_t d = 0; d < a.head_dim; ++d) {
        acc[d % 4] = std::fmaf(a.q[m][d], kv_element(a.dtype, a.tile, int64_t{d} * a.block_size + j), acc[d % 4]);
      }
      const float dot = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      a.s[m * a.ld + j] = dot * (a.dtype == kv_dtype::i8 ? kscale[j] * a.scale : a.scale);
    }
  }
}

void attn_accumulate_scalar(const attn_block_args& a) { attn_accumulate_dims(a, 0); }

float softmax_exp_scalar(float* x, int32_t n, float max) {
  float sum = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - max);
    sum += x[j];
  }
  return sum;
}

void silu_mul_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

constexpr kernel_table scalar_table{
    "scalar",          quantize_act_scalar, quantize_act_k_scalar,  matmul_q_scalar,    matmul_packed_scalar,
    matmul_f32_scalar, attn_scores_scalar,  attn_accumulate_scalar, softmax_exp_scalar, silu_mul_scalar,
};

}  // namespace

act_format act_format_of(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::f32:
    case ggml_type::f16: return act_format::f32;
    case ggml_type::bf16: return act_format::bf16;
    case ggml_type::q4_0:
    case ggml_type::q4_1:
    case ggml_type::q5_0:
    case ggml_type::q5_1:
    case ggml_type::q8_0: return act_format::q8;
    case ggml_type::q2_k:
    case ggml_type::q3_k:
    case ggml_type::q4_k:
    case ggml_type::q5_k:
    case ggml_type::q6_k: return act_format::q8_k;
    case ggml_type::q8_1:
    case ggml_type::q8_k: break;
  }
  return act_format::none;
}

bool has_quant_kernel(ggml_type t) noexcept { return act_format_of(t) != act_format::none; }

void round_act_bf16(const float* x, float* xf, uint16_t* xb, int64_t n) noexcept {
  for (int64_t i = 0; i < n; ++i) {
    xb[i] = fp32_to_bf16(x[i]);
    xf[i] = bf16_to_fp32(xb[i]);
  }
}

const kernel_table& scalar_kernels() noexcept { return scalar_table; }

std::vector<const kernel_table*> available_kernels() {
  std::vector<const kernel_table*> tables{&scalar_table};
  // Slowest first: with the packed kernels the 512-bit table (16 rows per vector, 8-token tiles) beats
  // the 256-bit VNNI one on Sapphire Rapids (prefill of the default model: 0.11 vs 0.17 CPU s for 128
  // tokens on one core); without packing (repack_weights off) avxvnni was the faster of the two.
  for (const kernel_table* t : {avx2_kernels(), avxvnni_kernels(), avx512vnni_kernels()}) {
    if (t != nullptr) tables.push_back(t);
  }
  return tables;
}

const kernel_table& best_kernels() {
  const std::vector<const kernel_table*> tables = available_kernels();
  if (const char* want = std::getenv("TESSERA_CPU_KERNELS"); want != nullptr && *want != '\0') {
    for (const kernel_table* t : tables) {
      if (std::string_view(t->name) == want) return *t;
    }
  }
  return *tables.back();
}

}  // namespace tessera::cpu
