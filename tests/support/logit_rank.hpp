// The winner of a logits row and by how much it wins: what greedy-parity tests compare.
#pragma once
#include <algorithm>
#include <functional>
#include <span>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera::test_support {

// The first id with the largest logit (greedy's choice).
inline token_id argmax(std::span<const float> row) {
  return static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Gap between the best and second-best logit: below ~0.5 the quantized paths may legitimately
// disagree about the winner.
inline double top2_margin(std::span<const float> row) {
  std::vector<float> v(row.begin(), row.end());
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return double(v[0]) - double(v[1]);
}

}  // namespace tessera::test_support
