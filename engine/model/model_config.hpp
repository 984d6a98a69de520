// Hyper-parameters of a LLaMA-family decoder, independent of where the weights came from.
#pragma once
#include <cstdint>
#include <string>

namespace tessera {

// How RoPE pairs the dimensions of a head.
enum class rope_style {
  interleaved,  // pairs (2i, 2i+1): GGUF llama files (llama.cpp permutes Q/K at conversion)
  half,         // pairs (i, i + d/2), "rotate_half": Hugging Face checkpoints
};

struct model_config {
  std::string architecture = "llama";
  std::string name;
  int32_t num_layers = 0;
  int32_t hidden_size = 0;        // d_model
  int32_t intermediate_size = 0;  // SwiGLU hidden width
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;       // < num_heads: GQA, == 1: MQA
  int32_t head_dim = 0;           // hidden_size / num_heads
  int32_t vocab_size = 0;
  int32_t context_length = 0;     // trained maximum sequence length
  int32_t rope_dims = 0;          // dimensions of each head that are rotated (== head_dim for llama)
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  rope_style rope = rope_style::interleaved;
  bool tied_embeddings = false;   // output projection reuses the token embedding

  // Throws load_error when the numbers are inconsistent or out of sane bounds.
  void validate() const;
};

}  // namespace tessera
