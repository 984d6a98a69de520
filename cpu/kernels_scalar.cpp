// Portable kernels (the fallback and the reference the SIMD tables are tested against) and the
// run-time choice of table.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

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
  }
}

// Dot of one weight row with one activation row, per ggml block layout.
float dot_row_scalar(ggml_type t, const std::byte* w, const act_block* a, int64_t nb) {
  float total = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    switch (t) {
      case ggml_type::q8_0: {  // {f16 d; int8 qs[32]}
        const std::byte* blk = w + b * 34;
        const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
        for (int i = 0; i < 32; ++i) isum += qs[i] * a[b].q[i];
        total += half_to_float(load_u16(blk)) * a[b].d * static_cast<float>(isum);
        break;
      }
      case ggml_type::q4_0: {  // {f16 d; u8 qs[16]}: x = d * (nibble - 8)
        const std::byte* blk = w + b * 18;
        const auto* qs = reinterpret_cast<const uint8_t*>(blk + 2);
        for (int i = 0; i < 16; ++i) {
          isum += (qs[i] & 0x0f) * a[b].q[i] + (qs[i] >> 4) * a[b].q[i + 16];
        }
        const float d = half_to_float(load_u16(blk));
        total += d * (a[b].d * static_cast<float>(isum) - 8.0f * a[b].s);
        break;
      }
      case ggml_type::q4_1: {  // {f16 d; f16 m; u8 qs[16]}: x = d * nibble + m
        const std::byte* blk = w + b * 20;
        const auto* qs = reinterpret_cast<const uint8_t*>(blk + 4);
        for (int i = 0; i < 16; ++i) {
          isum += (qs[i] & 0x0f) * a[b].q[i] + (qs[i] >> 4) * a[b].q[i + 16];
        }
        const float d = half_to_float(load_u16(blk));
        const float m = half_to_float(load_u16(blk + 2));
        total += d * a[b].d * static_cast<float>(isum) + m * a[b].s;
        break;
      }
      default:
        return 0.0f;
    }
  }
  return total;
}

void matmul_q_scalar(const qmatmul_args& a) {
  for (int32_t t = 0; t < a.num_tokens; ++t) {
    const act_block* act = a.act + t * a.act_stride;
    for (int64_t r = a.row_begin; r < a.row_end; ++r) {
      const float v = dot_row_scalar(a.type, a.weights + r * a.weight_stride, act, a.num_blocks);
      float& o = a.out[t * a.out_stride + r];
      o = a.accumulate ? o + v : v;
    }
  }
}

void matmul_f32_scalar(const fmatmul_args& a) {
  for (int32_t t = 0; t < a.num_tokens; ++t) {
    const float* x = a.x + t * a.x_stride;
    for (int64_t r = a.row_begin; r < a.row_end; ++r) {
      const float* w = a.weights + r * a.cols;
      float v = 0.0f;
      for (int64_t c = 0; c < a.cols; ++c) v += w[c] * x[c];
      float& o = a.out[t * a.out_stride + r];
      o = a.accumulate ? o + v : v;
    }
  }
}

void attn_scores_scalar(const float* q, const float* k, int32_t n, int32_t hd, float scale,
                        float* out) {
  for (int32_t j = 0; j < n; ++j) {
    float s = 0.0f;
    for (int32_t d = 0; d < hd; ++d) s += q[d] * k[j * hd + d];
    out[j] = s * scale;
  }
}

void attn_accumulate_scalar(const float* p, const float* v, int32_t n, int32_t hd, float* out) {
  for (int32_t j = 0; j < n; ++j) {
    for (int32_t d = 0; d < hd; ++d) out[d] += p[j] * v[j * hd + d];
  }
}

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
    "scalar",         quantize_act_scalar,    matmul_q_scalar,    matmul_f32_scalar,
    attn_scores_scalar, attn_accumulate_scalar, softmax_exp_scalar, silu_mul_scalar,
};

}  // namespace

bool has_quant_kernel(ggml_type t) noexcept {
  return t == ggml_type::q8_0 || t == ggml_type::q4_0 || t == ggml_type::q4_1;
}

const kernel_table& scalar_kernels() noexcept { return scalar_table; }

std::vector<const kernel_table*> available_kernels() {
  std::vector<const kernel_table*> tables{&scalar_table};
  for (const kernel_table* t : {avx2_kernels(), avx512vnni_kernels(), avxvnni_kernels()}) {
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
