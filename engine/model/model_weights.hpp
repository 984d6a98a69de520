// Views of a decoder's weights in their stored element type (quantized or not), plus the
// storage that keeps them alive (a GGUF mapping, or owned buffers). No device code here: executors
// turn these views into whatever layout they compute with.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "engine/model/model_config.hpp"

namespace tessera {

class gguf_file;

// A 2-D (or 1-D with rows == 1) weight matrix, row-major: `rows` output features, each a run of
// `cols` input-feature values encoded as whole blocks of `type`.
struct weight_tensor {
  std::string name;
  ggml_type type = ggml_type::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  const std::byte* data = nullptr;
  int64_t row_stride_bytes = 0;  // == row_bytes(type, cols)

  const std::byte* row(int64_t r) const { return data + r * row_stride_bytes; }
  bool empty() const { return data == nullptr; }
};

struct layer_weights {
  weight_tensor attn_norm;  // [hidden]
  weight_tensor wq;         // [num_heads*head_dim, hidden]
  weight_tensor wk;         // [num_kv_heads*head_dim, hidden]
  weight_tensor wv;         // [num_kv_heads*head_dim, hidden]
  weight_tensor wo;         // [hidden, num_heads*head_dim]
  weight_tensor ffn_norm;   // [hidden]
  weight_tensor w_gate;     // [intermediate, hidden]
  weight_tensor w_up;       // [intermediate, hidden]
  weight_tensor w_down;     // [hidden, intermediate]
  // Optional, per model_config::features (empty when the feature is off; check_weight_shapes
  // requires them exactly when it is on).
  weight_tensor bq;              // [1, q_dim]   qkv_bias (Qwen2)
  weight_tensor bk;              // [1, kv_dim]
  weight_tensor bv;              // [1, kv_dim]
  weight_tensor q_norm;          // [1, head_dim] qk_norm, shared by every head (Qwen3, Gemma 3)
  weight_tensor k_norm;          // [1, head_dim]
  weight_tensor post_attn_norm;  // [1, hidden]  post_norms (Gemma 2/3): on the attention output
  weight_tensor post_ffn_norm;   // [1, hidden]  on the FFN output
};

struct model_weights {
  model_config config;
  weight_tensor token_embedding;  // [vocab, hidden]
  weight_tensor output_norm;      // [hidden]
  weight_tensor output;           // [vocab, hidden]; aliases token_embedding when tied
  std::vector<layer_weights> layers;
  std::shared_ptr<const void> storage;  // keeps the mapping / buffers alive
};

// Reads `<arch>.*` metadata (llama, qwen2, qwen3, gemma2, gemma3, phi3 as llama.cpp's converter
// writes them) and binds every tensor, checking names, types and shapes against the config. Throws
// load_error.
model_config read_gguf_config(const gguf_file& file);

std::shared_ptr<const model_weights> load_gguf_weights(std::shared_ptr<const gguf_file> file);

}  // namespace tessera
