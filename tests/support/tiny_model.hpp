// The small LLaMA shape the executor tests run (CPU executor against the CUDA executor, on a GPU or
// its CPU emulation): GQA (4 heads, 2 KV heads), head_dim 64, small enough for the emulation.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/executor.hpp"
#include "engine/model_config.hpp"

namespace tessera::test_support {

inline model_config tiny_executor_config(rope_style rope = rope_style::half, int32_t context_length = 4096) {
  model_config c;
  c.num_layers = 2;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 512;
  c.context_length = context_length;
  c.rope_dims = 64;
  c.rope = rope;
  return c;
}

// n token ids in [0, vocab), a different sequence per seed.
inline std::vector<token_id> pseudo_tokens(int32_t n, int32_t seed, int32_t vocab = 512) {
  std::vector<token_id> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 131 + seed * 17 + 5) % vocab;
  return t;
}

}  // namespace tessera::test_support
