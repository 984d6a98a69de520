// RoPE frequencies of a layer, with every supported scaling folded into two numbers per model the way
// llama.cpp applies them (ggml_rope_ext: freq_factors, attn_factor): a divisor of each pair's base
// frequency and a multiplier of cos/sin. The loaders derive the divisors once (from HF rope_scaling /
// rope_parameters, or GGUF rope_freqs.weight and rope.scaling.* keys); executors only evaluate
//   angle(pos, i) = pos * theta^(-2i / rope_dims) / freq_factors[i],
//   q' = rotate(q, angle) * attention_factor   (and the same for k).
// No executor code: this is the model's definition, shared by the CPU and CUDA executors.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model/model_config.hpp"

namespace tessera {

struct rope_table {
  std::vector<float> inv_freq;  // rope_dims / 2 angular frequencies (radians per position)
  float attention_factor = 1.0f;
};

// The frequencies layer `layer` rotates with.
rope_table rope_frequencies(const model_config& c, int32_t layer);

// Llama 3.1's band-wise divisors (transformers modeling_rope_utils._compute_llama3_parameters; the same
// numbers llama.cpp's converter writes to rope_freqs.weight): 1 for wavelengths below
// original / high_freq_factor, `factor` above original / low_freq_factor, a smooth blend between.
std::vector<float> llama3_freq_factors(float theta, int32_t rope_dims, const rope_scaling& s);

// YaRN's divisors (Peng et al. 2023, eq. 18-20; transformers _compute_yarn_parameters with truncate=true,
// llama.cpp ggml_rope_yarn_corr_dims): dimensions that rotate more than beta_fast times over the
// original context keep their frequency, those below beta_slow are interpolated by `factor`, a linear
// ramp between.
std::vector<float> yarn_freq_factors(float theta, int32_t rope_dims, const rope_scaling& s);

// YaRN's default cos/sin multiplier, 0.1 ln(factor) + 1 (paper eq. 22; 1 when factor <= 1).
float yarn_default_attention_factor(float factor);

}  // namespace tessera
