#include "engine/model/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tessera {

rope_table rope_frequencies(const model_config& c, int32_t layer) {
  const layer_attention l = c.layer(layer);
  const int32_t half = c.rope_dims / 2;
  rope_table t;
  t.inv_freq.resize(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) {
    t.inv_freq[static_cast<size_t>(i)] =
        static_cast<float>(std::pow(static_cast<double>(l.rope_theta), -2.0 * i / c.rope_dims));
  }
  const rope_scaling& s = c.scaling;
  if (!l.rope_scaled || s.kind == rope_scaling_kind::none || s.kind == rope_scaling_kind::dynamic_ntk) return t;
  if (s.kind == rope_scaling_kind::linear && s.freq_factors.empty()) {
    for (float& f : t.inv_freq) f /= s.factor;  // position interpolation: pos / factor
  }
  for (size_t i = 0; i < s.freq_factors.size() && i < t.inv_freq.size(); ++i) t.inv_freq[i] /= s.freq_factors[i];
  t.attention_factor = s.attention_factor;
  return t;
}

std::vector<float> llama3_freq_factors(float theta, int32_t rope_dims, const rope_scaling& s) {
  const double old_context = s.original_context;
  const double low_wavelen = old_context / s.low_freq_factor;
  const double high_wavelen = old_context / s.high_freq_factor;
  std::vector<float> out;
  for (int32_t i = 0; i < rope_dims / 2; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(theta), 2.0 * i / rope_dims);
    const double wavelen = 2 * std::numbers::pi / freq;
    double divisor = 1.0;
    if (wavelen > low_wavelen) {
      divisor = s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      divisor = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    out.push_back(static_cast<float>(divisor));
  }
  return out;
}

std::vector<float> yarn_freq_factors(float theta, int32_t rope_dims, const rope_scaling& s) {
  const double dim = rope_dims;
  // The dimension index whose frequency completes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return dim * std::log(s.original_context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(double(theta)));
  };
  const double low = std::max(0.0, std::floor(correction_dim(s.beta_fast)));
  double high = std::min(dim - 1, std::ceil(correction_dim(s.beta_slow)));
  if (high == low) high += 0.001;  // transformers' linear_ramp_factor guard
  std::vector<float> out;
  for (int32_t i = 0; i < rope_dims / 2; ++i) {
    // extrapolation share: 1 for fast-rotating (high-frequency) pairs, 0 for slow ones.
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolate = 1.0 - ramp;
    out.push_back(static_cast<float>(1.0 / ((1 - extrapolate) / s.factor + extrapolate)));
  }
  return out;
}

float yarn_default_attention_factor(float factor) {
  return factor <= 1.0f ? 1.0f : static_cast<float>(0.1 * std::log(double(factor)) + 1.0);
}

}  // namespace tessera
