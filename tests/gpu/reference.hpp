// Straightforward CPU references of the CUDA kernels (gpu/kernels.hpp, gpu/attention.hpp): the same
// math written the obvious way, in double where it accumulates. They follow the CPU executor's
// conventions (cpu/cpu_executor.cpp): RoPE angles pos * inv_freq in float, cos/sin in double; the
// paged KV layout of gpu::kv_layout.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/model/model_config.hpp"

namespace tessera::gpu::ref {

struct kv_geometry {
  int32_t num_layers = 1;
  int32_t num_kv_heads = 1;
  int32_t block_size = 16;
  int32_t head_dim = 64;
  int64_t block_elems() const { return int64_t{num_layers} * 2 * num_kv_heads * block_size * head_dim; }
  int64_t offset(int64_t block, int32_t layer, int32_t kind, int32_t kv_head, int32_t slot) const {
    return block * block_elems() + ((int64_t{layer} * 2 + kind) * num_kv_heads + kv_head) * block_size * head_dim +
           int64_t{slot} * head_dim;
  }
};

inline std::vector<float> inv_freq(int32_t rope_dims, float theta) {
  std::vector<float> f(static_cast<size_t>(rope_dims / 2));
  for (int32_t i = 0; i < rope_dims / 2; ++i) {
    f[static_cast<size_t>(i)] = static_cast<float>(std::pow(static_cast<double>(theta), -2.0 * i / rope_dims));
  }
  return f;
}

inline void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * inv * w[i]);
}

// Rotates one head vector in place, as cpu_executor's rope lambda (cos/sin times attention_factor).
inline void rope_head(float* v, int32_t pos, const std::vector<float>& inv_freq, rope_style style,
                      float attention_factor = 1.0f) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[static_cast<size_t>(i)];
    const auto c = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
    const auto s = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
    const int64_t a = style == rope_style::interleaved ? 2 * i : i;
    const int64_t b = style == rope_style::interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

// What the RoPE + KV write does before rotating (cpu_executor's order): + bias over Q|K|V, then a
// per-head RMSNorm of Q and K heads; and the cos/sin multiplier. Empty vectors: off.
struct rope_extras {
  std::vector<float> bias;            // [(num_heads + 2 kv_heads) * head_dim]
  std::vector<float> q_norm, k_norm;  // [head_dim] multipliers
  float eps = 1e-6f;
  float attention_factor = 1.0f;
};

// qkv [tokens, stride] processed in place (bias, q/k norm, RoPE); K and V stored into `kv` (floats of
// the cache's elements).
inline void rope_kv_write(std::vector<float>& qkv, int64_t stride, std::vector<float>& kv, const kv_geometry& g,
                          int32_t layer, int32_t num_heads, const std::vector<int32_t>& positions,
                          const std::vector<int32_t>& slots, const std::vector<float>& inv_freq, rope_style style,
                          const rope_extras& x = {}) {
  const int32_t hd = g.head_dim;
  for (size_t t = 0; t < positions.size(); ++t) {
    float* row = qkv.data() + static_cast<int64_t>(t) * stride;
    const int64_t width = int64_t{num_heads + 2 * g.num_kv_heads} * hd;
    for (int64_t i = 0; i < static_cast<int64_t>(x.bias.size()) && i < width; ++i)
      row[i] += x.bias[static_cast<size_t>(i)];
    if (!x.q_norm.empty()) {
      for (int32_t h = 0; h < num_heads + g.num_kv_heads; ++h) {
        float* v = row + int64_t{h} * hd;
        rms_norm(v, (h < num_heads ? x.q_norm : x.k_norm).data(), v, hd, x.eps);
      }
    }
    for (int32_t h = 0; h < num_heads + g.num_kv_heads; ++h) {
      rope_head(row + int64_t{h} * hd, positions[t], inv_freq, style, x.attention_factor);
    }
    const int32_t block = slots[t] / g.block_size, off = slots[t] % g.block_size;
    const float* k = row + int64_t{num_heads} * hd;
    const float* v = k + int64_t{g.num_kv_heads} * hd;
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      for (int32_t d = 0; d < hd; ++d) {
        kv[static_cast<size_t>(g.offset(block, layer, 0, h, off) + d)] = k[h * hd + d];
        kv[static_cast<size_t>(g.offset(block, layer, 1, h, off) + d)] = v[h * hd + d];
      }
    }
  }
}

// Softmax attention of each token t over the cache slots keys[t] of its sequence (positions read
// through the block table), in double. Scores are softcap * tanh(s / softcap) when softcap > 0
// (Gemma 2). out [tokens, num_heads * head_dim].
inline std::vector<float> attention_over(const std::vector<float>& q, int64_t q_stride, const std::vector<float>& kv,
                                         const kv_geometry& g, int32_t layer, int32_t num_heads,
                                         const std::vector<std::vector<int32_t>>& keys,
                                         const std::vector<int32_t>& token_seq, const std::vector<int32_t>& tables,
                                         int32_t max_blocks, float scale, float softcap = 0.0f) {
  const int32_t hd = g.head_dim;
  const int32_t group = num_heads / g.num_kv_heads;
  std::vector<float> out(keys.size() * static_cast<size_t>(num_heads) * static_cast<size_t>(hd));
  std::vector<double> scores;
  for (size_t t = 0; t < keys.size(); ++t) {
    const int32_t* table = tables.data() + static_cast<int64_t>(token_seq[t]) * max_blocks;
    auto at = [&](int32_t j, int32_t kind, int32_t kvh) {
      return kv.data() + g.offset(table[j / g.block_size], layer, kind, kvh, j % g.block_size);
    };
    for (int32_t h = 0; h < num_heads; ++h) {
      const float* qh = q.data() + static_cast<int64_t>(t) * q_stride + int64_t{h} * hd;
      const int32_t kvh = h / group;
      scores.clear();
      double mx = -1e300;
      for (const int32_t j : keys[t]) {
        const float* k = at(j, 0, kvh);
        double s = 0;
        for (int32_t d = 0; d < hd; ++d) s += double(qh[d]) * k[d];
        s *= scale;
        if (softcap > 0) s = softcap * std::tanh(s / softcap);
        scores.push_back(s);
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - mx));
      float* o = out.data() + (static_cast<int64_t>(t) * num_heads + h) * hd;
      for (int32_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t i = 0; i < scores.size(); ++i) acc += scores[i] * at(keys[t][i], 1, kvh)[d];
        o[d] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

// Causal softmax attention of each token over positions [0, context_lens[t]) of its sequence (the last
// `window` of them when window > 0): attention_over those positions.
inline std::vector<float> paged_attention(const std::vector<float>& q, int64_t q_stride, const std::vector<float>& kv,
                                          const kv_geometry& g, int32_t layer, int32_t num_heads,
                                          const std::vector<int32_t>& context_lens,
                                          const std::vector<int32_t>& token_seq, const std::vector<int32_t>& tables,
                                          int32_t max_blocks, float scale, float softcap = 0.0f, int32_t window = 0) {
  std::vector<std::vector<int32_t>> keys(context_lens.size());
  for (size_t t = 0; t < context_lens.size(); ++t) {
    const int32_t n = context_lens[t];
    for (int32_t j = window > 0 ? std::max(0, n - window) : 0; j < n; ++j) keys[t].push_back(j);
  }
  return attention_over(q, q_stride, kv, g, layer, num_heads, keys, token_seq, tables, max_blocks, scale, softcap);
}

}  // namespace tessera::gpu::ref
