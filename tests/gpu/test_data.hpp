// Host-side test data for the GPU kernel tests: random normals and bf16 round trips through the
// engine's converters (bit-compatible with __nv_bfloat16).
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/model/ggml_types.hpp"

namespace tessera::gpu {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = fp32_to_bf16(v[i]);
  return out;
}

inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_fp32(v[i]);
  return out;
}

inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

}  // namespace tessera::gpu
