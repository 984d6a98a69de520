// Hyper-parameters of a decoder-only transformer of the LLaMA family and its relatives (Qwen2/3,
// Mistral, Gemma 2/3, Phi-3), independent of where the weights came from. What differs between the
// architectures is spelled out as named features (model_features, rope_scaling, per-layer attention)
// so that an executor asks "which norm, which activation, which window" instead of "which model".
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// The architectures the loaders bind (GGUF general.architecture / HF model_type spelling).
enum class model_arch { llama, qwen2, qwen3, mistral, gemma2, gemma3, phi3 };
std::string_view to_string(model_arch a);

// How RoPE pairs the dimensions of a head.
enum class rope_style {
  interleaved,  // pairs (2i, 2i+1): GGUF llama files (llama.cpp permutes Q/K at conversion)
  half,         // pairs (i, i + d/2), "rotate_half": Hugging Face checkpoints, GGUF NEOX-style models
};

// RMSNorm's weight: y = x / rms(x) * w (LLaMA), or * (1 + w) (Gemma stores the offset from 1;
// transformers' GemmaRMSNorm, the Gemma reports).
enum class norm_kind { rms, rms_one_plus };

// Activation of the gated feed-forward: act(gate(x)) * up(x), then down.
enum class ffn_activation {
  silu,       // SwiGLU (LLaMA, Qwen, Mistral, Phi-3)
  gelu_tanh,  // GeGLU with the tanh approximation of GELU (Gemma: hidden_activation gelu_pytorch_tanh)
};

// RoPE frequency scaling. Every kind is expressed as a per-pair divisor of the base frequency and a
// multiplier of cos/sin (see engine/model/rope.hpp), which is how llama.cpp applies them too.
enum class rope_scaling_kind {
  none,
  linear,       // positions / factor (Chen et al. 2023, "Extending Context Window ... Positional Interpolation")
  dynamic_ntk,  // NTK-aware base change beyond the original context; the identity within it (see read_hf_config)
  yarn,         // Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models"
  llama3,       // Meta's Llama 3.1 band-wise interpolation (transformers _compute_llama3_parameters)
  longrope,     // Phi-3's per-dimension factors (Ding et al. 2024, "LongRoPE"; HF type "longrope"/"su")
};
std::string_view to_string(rope_scaling_kind k);

struct rope_scaling {
  rope_scaling_kind kind = rope_scaling_kind::none;
  float factor = 1.0f;            // linear, dynamic_ntk, yarn, llama3; longrope: context / original
  int32_t original_context = 0;   // the pre-training context the scaling extends
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  float beta_fast = 32.0f;        // yarn: ramp bounds, in rotations over the original context
  float beta_slow = 1.0f;
  float attention_factor = 1.0f;  // yarn, longrope: cos/sin multiplier ("mscale")
  // Per-pair divisors of the base frequency, rope_dims / 2 of them, when the file states them
  // (GGUF rope_freqs.weight, Phi-3's long/short factors) or the loader derived them (llama3).
  std::vector<float> freq_factors;
};

// Soft-capping: cap * tanh(x / cap) (Gemma 2 report, sec. 2); cap == 0 is off.
struct softcap {
  float cap = 0.0f;
  bool on() const { return cap > 0.0f; }
};

// What the transformer block computes beyond the LLaMA baseline.
struct model_features {
  norm_kind norm = norm_kind::rms;
  ffn_activation activation = ffn_activation::silu;
  bool qkv_bias = false;         // Q, K and V projections have biases (Qwen2)
  bool qk_norm = false;          // per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
  bool post_norms = false;       // RMSNorm of the attention and FFN outputs before the residual add (Gemma 2/3)
  bool scale_embedding = false;  // embeddings multiplied by sqrt(hidden) (Gemma)
  softcap attn_softcap;          // of the attention scores (Gemma 2)
  softcap final_softcap;         // of the output logits (Gemma 2)
  float attention_scale = 0.0f;  // scores multiplier; 0: 1 / sqrt(head_dim). Gemma: query_pre_attn_scalar^-1/2
};

// One layer's attention: full causal, or a sliding window, with its own RoPE base (Gemma 3's local
// layers use rope_local_base_freq and no scaling).
struct layer_attention {
  int32_t sliding_window = 0;  // 0: full causal attention; w: a query at p sees keys at (p - w, p]
  float rope_theta = 0.0f;     // 0: model_config::rope_theta
  bool rope_scaled = true;     // model_config::scaling applies to this layer
};

struct model_config {
  model_arch architecture = model_arch::llama;
  std::string name;
  int32_t num_layers = 0;
  int32_t hidden_size = 0;        // d_model
  int32_t intermediate_size = 0;  // gated FFN hidden width
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;  // < num_heads: GQA, == 1: MQA
  int32_t head_dim = 0;      // hidden_size / num_heads unless the model says otherwise (Gemma, Qwen3)
  int32_t vocab_size = 0;
  int32_t context_length = 0;  // trained maximum sequence length
  int32_t rope_dims = 0;       // dimensions of each head that are rotated (== head_dim for all supported)
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  rope_style rope = rope_style::interleaved;
  bool tied_embeddings = false;  // output projection reuses the token embedding
  rope_scaling scaling;
  model_features features;
  // Empty: every layer is full attention with rope_theta and the scaling. Else num_layers entries.
  std::vector<layer_attention> layers;

  // Layer i's attention, with rope_theta filled in.
  layer_attention layer(int32_t i) const;
  bool has_sliding_window() const;
  // How far back any layer still looks: the widest sliding window when EVERY layer has one (Mistral
  // v0.1, Gemma 3 GGUFs whose pattern makes all layers local), else 0. A query at p then reads no key
  // before p - kv_window() + 1 in any layer, so K/V older than that is dead and its KV blocks can be
  // freed (block_manager_options::attention_window). One full-attention layer (Gemma 2/3's global
  // layers) keeps every position alive: 0.
  int32_t kv_window() const;

  // Throws load_error when the numbers are inconsistent or out of sane bounds.
  void validate() const;
};

// "llama3 rope scaling (factor 8), qkv bias, ..." for logs and `tessera inspect`.
std::string describe_features(const model_config& c);

}  // namespace tessera
