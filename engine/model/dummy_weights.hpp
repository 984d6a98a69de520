// Random weights of a real model's shape, from its config alone (`--load-format dummy`): lets the
// executors be benchmarked on large shapes (Llama-3-8B, Qwen2.5-7B) without downloading their weights,
// as vLLM's dummy load format does. The values are deterministic in (seed, tensor, element), so a run
// is reproducible and independent of the number of threads that generate it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>

#include "engine/model/ggml_types.hpp"
#include "engine/model/model_config.hpp"
#include "engine/model/model_weights.hpp"

namespace tessera {

struct dummy_weights_options {
  uint64_t seed = 0;
  // Element type of the matrices: bf16 (default: what the GPU computes with, half the host memory of
  // f32), f16, f32, or a GGUF quant type the CPU computes natively, q8_0 or q4_0 (the random values
  // quantized as llama.cpp's reference quantizer does: a 7-8B shape in q4_0 is about 4.5 GB, which a
  // CPU machine of 24 GiB holds with its repacked copy). Norm weights and biases are f32.
  ggml_type type = ggml_type::bf16;
  int num_threads = 0;  // 0: hardware concurrency
};

// Every tensor of `config` (validated first; throws load_error) filled with uniform values whose
// standard deviation is 1/sqrt(fan_in) for matrices (activations stay O(1) through the layers, so
// logits are not all equal and greedy decoding is not a string of ties), 0.5 for the embedding and
// exactly 1 for the RMSNorm weights. Throws invalid_request for an unsupported element type.
// The element types make_dummy_weights accepts.
bool is_dummy_weight_type(ggml_type t) noexcept;

std::shared_ptr<const model_weights> make_dummy_weights(const model_config& config,
                                                        const dummy_weights_options& options = {});

}  // namespace tessera
