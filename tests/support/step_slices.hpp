// One sequence_slice of a step_batch, for the executor tests (CPU executor, CUDA executor, its CPU
// emulation), which each wrap it with the logits mode their steps usually want.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/executor.hpp"

namespace tessera::test_support {

inline sequence_slice make_slice(uint64_t id, std::vector<token_id> tokens, int32_t num_computed,
                                 std::vector<block_id> table, sequence_slice::logits_mode mode) {
  sequence_slice s;
  s.seq = seq_id{id};
  s.tokens = std::move(tokens);
  s.num_computed = num_computed;
  s.block_table = std::move(table);
  s.logits = mode;
  return s;
}

}  // namespace tessera::test_support
