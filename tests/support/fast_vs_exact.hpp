// The CPU executor's two paths on the same weights: the fast one (weights as stored, quantized
// activations) and the exact one (--dequantize-weights, fp32), and how far apart their logits are.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cpu/cpu_executor.hpp"

namespace tessera::test_support {

struct logit_distance {
  double max = 0.0;
  double mean = 0.0;
};

// Logits of every position of `prompt` (one step, blocks {3, 1}: the pool needs >= 4 blocks of >= 16).
inline step_output all_position_logits(std::shared_ptr<const model_weights> w, cpu_executor_options o,
                                       const std::vector<token_id>& prompt, bool exact) {
  o.dequantize_weights = exact;
  auto ex = make_cpu_executor(std::move(w), o);
  step_batch b;
  sequence_slice s;
  s.tokens = prompt;
  s.block_table = {3, 1};
  s.logits = sequence_slice::logits_mode::all;
  b.seqs.push_back(s);
  step_output out;
  ex->execute(b, out);
  return out;
}

// Max and mean |a - b| over every logit; every logit of both must be finite.
inline logit_distance distance(const step_output& a, const step_output& b) {
  EXPECT_EQ(a.logits.size(), b.logits.size());
  logit_distance d;
  const size_t n = std::min(a.logits.size(), b.logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::isfinite(a.logits[i]) && std::isfinite(b.logits[i])) << "logit " << i;
    const double diff = std::fabs(static_cast<double>(a.logits[i]) - b.logits[i]);
    d.max = std::max(d.max, diff);
    sum += diff;
  }
  d.mean = n ? sum / static_cast<double>(n) : 0.0;
  return d;
}

}  // namespace tessera::test_support
