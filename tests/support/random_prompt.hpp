// A random prompt for the engine tests: `len` ids in [1, vocab), so that id 0 (the fake models' and
// the char tokenizer's reserved id) never appears.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera::test_support {

inline std::vector<token_id> random_prompt(std::mt19937& rng, int32_t vocab, int32_t len) {
  std::vector<token_id> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(static_cast<token_id>(1 + rng() % (vocab - 1)));
  return p;
}

}  // namespace tessera::test_support
