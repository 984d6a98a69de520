// Greedy decoding of exactly max_tokens tokens (ignore_eos: the output never ends early, so tests
// compare whole outputs of a known length): the sampling the engine tests compare runs with.
#pragma once
#include <cstdint>

#include "engine/sampling_params.hpp"

namespace tessera::test_support {

inline sampling_params greedy_to_length(int32_t max_tokens) {
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace tessera::test_support
