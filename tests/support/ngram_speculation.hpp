// The speculative decoding settings the speculative tests run with: n-gram prompt lookup of suffixes
// 1..max_n, 4 draft tokens, speculating up to max_batch decoding sequences (docs/speculative.md).
#pragma once
#include <cstdint>

#include "engine/speculative/speculative_options.hpp"

namespace tessera::test_support {

inline speculative_options ngram_speculation(int32_t max_n, int32_t max_batch) {
  speculative_options s;
  s.mode = speculative_mode::ngram;
  s.num_tokens = 4;
  s.ngram = {.min_n = 1, .max_n = max_n};
  s.max_batch = max_batch;
  return s;
}

}  // namespace tessera::test_support
