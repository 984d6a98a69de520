// What the executor tests (CPU executor against the CUDA executor, on a GPU or its CPU emulation)
// start from: a small LLaMA shape with GQA (4 heads, 2 KV heads, head_dim 64), small enough for the
// emulation; f32 dummy weights, so the CPU executor computes exactly what it is given; a KV pool of
// 16-token blocks; and the CPU executor every comparison is made against.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/executor.hpp"
#include "engine/model/dummy_weights.hpp"
#include "engine/model/model_config.hpp"

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

inline std::shared_ptr<const model_weights> f32_dummy_weights(const model_config& config, uint64_t seed) {
  dummy_weights_options wo;
  wo.type = ggml_type::f32;
  wo.seed = seed;
  return make_dummy_weights(config, wo);
}

inline kv_cache_spec kv_pool(int32_t num_device_blocks, int32_t num_host_blocks = 0) {
  kv_cache_spec kv;
  kv.block_size = 16;
  kv.num_device_blocks = num_device_blocks;
  kv.num_host_blocks = num_host_blocks;
  return kv;
}

// dequantize_weights: fp32 math for a quantized model too (--dequantize-weights), not int8 activations.
inline std::unique_ptr<executor> cpu_reference_executor(std::shared_ptr<const model_weights> weights,
                                                        const kv_cache_spec& kv, int32_t num_threads,
                                                        bool dequantize_weights = false) {
  cpu_executor_options co;
  co.kv = kv;
  co.num_threads = num_threads;
  co.dequantize_weights = dequantize_weights;
  // fp32 KV: the reference the CUDA executor's f32 variants are held to within 1e-5 (the CPU's
  // automatic choice is fp16, whose rounding alone exceeds that).
  co.kv_dtype = cpu_kv_dtype::fp32;
  return make_cpu_executor(std::move(weights), co);
}

// n token ids in [0, vocab), a different sequence per seed.
inline std::vector<token_id> pseudo_tokens(int32_t n, int32_t seed, int32_t vocab = 512) {
  std::vector<token_id> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 131 + seed * 17 + 5) % vocab;
  return t;
}

}  // namespace tessera::test_support
