// The pure per-element functions of the sampler that must give bit-identical results on the host
// (engine/sampler.cpp) and on a GPU (gpu/sampling.cu), so that a seed picks the same token on either
// for the same logits. Header-only and free of CUDA headers: TESSERA_HOST_DEVICE is empty for a host
// compiler and `__host__ __device__` under nvcc.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef TESSERA_HOST_DEVICE
#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif
#endif

namespace tessera::sampling_math {

// SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", OOPSLA 2014):
// the n-th output of a stream with state s is mix64(s + n * golden_gamma). Used as a counter-based
// generator, so any output position can be drawn without drawing the ones before.
inline constexpr uint64_t golden_gamma = 0x9E3779B97F4A7C15ull;

TESSERA_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The stream key of fork `fork_index` of a request seeded with `seed`. mix64 is a bijection and
// (fork_index + 1) * gamma differs per fork (gamma is odd), so the forks of one seed get distinct keys.
TESSERA_HOST_DEVICE inline uint64_t derive_stream_key(uint64_t seed, uint64_t fork_index) {
  return mix64(mix64(seed) + (fork_index + 1) * golden_gamma);
}

// The uniform draw in [0, 1) at output position `position` of the stream `key`: 53 random bits.
TESSERA_HOST_DEVICE inline double uniform_draw(uint64_t key, uint64_t position) {
  const uint64_t bits = mix64(key + (position + 1) * golden_gamma);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// NaN (a broken executor row) becomes -inf (never sampled); +inf the largest float (it would turn the
// softmax into NaN). Adding +0 turns -0 into +0, so equal values also have equal bit patterns.
TESSERA_HOST_DEVICE inline float sanitize_logit(float x) {
  const float not_nan = x == x ? x : -INFINITY;
  return (not_nan < FLT_MAX ? not_nan : FLT_MAX) + 0.0f;
}

// The unnormalized probability of a candidate: exp(logit - max_logit), in [0, 1], exactly 1 for the
// most likely token. Computed in double and rounded once to float, so host and device agree bit for
// bit unless their (faithfully rounded) double exps straddle a float rounding boundary, about one
// element in 2^29; single-precision expf differs between libm and CUDA by up to 2 ulp.
TESSERA_HOST_DEVICE inline float candidate_weight(float logit, float max_logit) {
  return static_cast<float>(exp(static_cast<double>(logit) - static_cast<double>(max_logit)));
}

// Maps a float to an unsigned key with the same order (IEEE 754 totalOrder for non-NaN values).
TESSERA_HOST_DEVICE inline uint32_t order_key(float x) {
  uint32_t bits = 0;
  memcpy(&bits, &x, sizeof bits);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

}  // namespace tessera::sampling_math
