// model_config::validate: the numbers every later stage (weights binding, KV sizing, kernels)
// relies on, checked once at load time so that nothing downstream divides by zero or overflows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/model_config.hpp"

namespace tessera {
namespace {

// Generous upper bounds: far above any LLaMA-family model, low enough that products such as
// num_layers * context_length * num_kv_heads * head_dim stay far from int64 overflow.
constexpr int32_t max_layers = 1024;
constexpr int32_t max_hidden = 1 << 17;  // 131072
constexpr int32_t max_intermediate = 1 << 20;
constexpr int32_t max_heads = 1024;
constexpr int32_t max_head_dim = 1024;
constexpr int32_t max_vocab = 1 << 24;
constexpr int32_t max_context = 1 << 24;

void check_range(const char* what, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    throw load_error("model config: " + std::string(what) + " = " + std::to_string(v) + " is outside " +
                     std::to_string(lo) + ".." + std::to_string(hi));
  }
}

}  // namespace

void model_config::validate() const {
  check_range("num_layers", num_layers, 1, max_layers);
  check_range("hidden_size", hidden_size, 1, max_hidden);
  check_range("intermediate_size", intermediate_size, 1, max_intermediate);
  check_range("num_heads", num_heads, 1, max_heads);
  check_range("num_kv_heads", num_kv_heads, 1, num_heads);
  check_range("head_dim", head_dim, 1, max_head_dim);
  check_range("vocab_size", vocab_size, 1, max_vocab);
  check_range("context_length", context_length, 1, max_context);
  check_range("rope_dims", rope_dims, 2, head_dim);

  // Qwen3 and Gemma state head_dim on its own (Gemma 2 9B: 16 heads x 256 = 4096 != 3584); the others
  // derive it from hidden_size, and a file that disagrees is refused at load.
  const bool own_head_dim =
      architecture == model_arch::qwen3 || architecture == model_arch::gemma2 || architecture == model_arch::gemma3;
  if (!own_head_dim && static_cast<int64_t>(num_heads) * head_dim != hidden_size) {
    throw load_error("model config: num_heads (" + std::to_string(num_heads) + ") * head_dim (" +
                     std::to_string(head_dim) + ") != hidden_size (" + std::to_string(hidden_size) + ")");
  }
  if (num_heads % num_kv_heads != 0) {
    throw load_error("model config: num_heads (" + std::to_string(num_heads) + ") is not a multiple of num_kv_heads (" +
                     std::to_string(num_kv_heads) + ")");
  }
  if (rope_dims % 2 != 0) {
    throw load_error("model config: rope_dims (" + std::to_string(rope_dims) + ") must be even (RoPE rotates pairs)");
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 1.0f) {
    throw load_error("model config: rope_theta " + std::to_string(rope_theta) + " must be finite and > 1");
  }
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps <= 0.0f || rms_norm_eps >= 1.0f) {
    throw load_error("model config: rms_norm_eps " + std::to_string(rms_norm_eps) + " must be in (0, 1)");
  }
  if (!layers.empty() && static_cast<int32_t>(layers.size()) != num_layers) {
    throw load_error("model config: " + std::to_string(layers.size()) + " per-layer attention entries for " +
                     std::to_string(num_layers) + " layers");
  }
  for (const layer_attention& l : layers) {
    if (l.sliding_window < 0) throw load_error("model config: negative sliding window");
    if (l.rope_theta != 0.0f && (!std::isfinite(l.rope_theta) || l.rope_theta <= 1.0f)) {
      throw load_error("model config: a layer's rope_theta " + std::to_string(l.rope_theta) +
                       " must be finite and > 1");
    }
  }
  const rope_scaling& s = scaling;
  if (s.kind != rope_scaling_kind::none) {
    const std::string what = "model config: " + std::string(to_string(s.kind)) + " rope scaling: ";
    if (!std::isfinite(s.factor) || s.factor <= 0.0f) throw load_error(what + "factor must be positive");
    if (!std::isfinite(s.attention_factor) || s.attention_factor <= 0.0f) {
      throw load_error(what + "attention factor must be positive");
    }
    if (!s.freq_factors.empty() && static_cast<int32_t>(s.freq_factors.size()) * 2 != rope_dims) {
      throw load_error(what + std::to_string(s.freq_factors.size()) + " frequency factors for " +
                       std::to_string(rope_dims) + " rotated dimensions (want rope_dims / 2)");
    }
    for (const float f : s.freq_factors) {
      if (!std::isfinite(f) || f <= 0.0f) throw load_error(what + "frequency factors must be finite and positive");
    }
    const bool needs_original = s.kind == rope_scaling_kind::yarn || s.kind == rope_scaling_kind::llama3 ||
                                s.kind == rope_scaling_kind::dynamic_ntk;
    if (needs_original && s.original_context <= 0 && s.freq_factors.empty()) {
      throw load_error(what + "original_max_position_embeddings is missing");
    }
    if (s.kind == rope_scaling_kind::longrope && s.freq_factors.empty()) {
      throw load_error(what + "the per-dimension factors are missing");
    }
  }
  for (const softcap& c : {features.attn_softcap, features.final_softcap}) {
    if (!std::isfinite(c.cap) || c.cap < 0.0f) throw load_error("model config: soft-cap must be >= 0");
  }
  if (!std::isfinite(features.attention_scale) || features.attention_scale < 0.0f) {
    throw load_error("model config: attention scale must be >= 0");
  }
}

layer_attention model_config::layer(int32_t i) const {
  layer_attention l = layers.empty() ? layer_attention{} : layers.at(static_cast<size_t>(i));
  if (l.rope_theta == 0.0f) l.rope_theta = rope_theta;
  return l;
}

bool model_config::has_sliding_window() const {
  for (const layer_attention& l : layers) {
    if (l.sliding_window > 0) return true;
  }
  return false;
}

int32_t model_config::kv_window() const {
  if (layers.empty() || num_layers <= 0) return 0;
  int32_t widest = 0;
  for (int32_t i = 0; i < num_layers; ++i) {
    const int32_t w = layer(i).sliding_window;
    if (w <= 0) return 0;  // a full-attention layer reads every past position
    widest = std::max(widest, w);
  }
  return widest;
}

std::string_view to_string(model_arch a) {
  switch (a) {
    case model_arch::llama: return "llama";
    case model_arch::qwen2: return "qwen2";
    case model_arch::qwen3: return "qwen3";
    case model_arch::mistral: return "mistral";
    case model_arch::gemma2: return "gemma2";
    case model_arch::gemma3: return "gemma3";
    case model_arch::phi3: return "phi3";
  }
  return "?";
}

std::string_view to_string(rope_scaling_kind k) {
  switch (k) {
    case rope_scaling_kind::none: return "none";
    case rope_scaling_kind::linear: return "linear";
    case rope_scaling_kind::dynamic_ntk: return "dynamic";
    case rope_scaling_kind::yarn: return "yarn";
    case rope_scaling_kind::llama3: return "llama3";
    case rope_scaling_kind::longrope: return "longrope";
  }
  return "?";
}

std::string describe_features(const model_config& c) {
  std::vector<std::string> parts;
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const model_features& f = c.features;
  parts.push_back(c.rope == rope_style::half ? "rope neox (rotate_half)" : "rope interleaved");
  if (c.scaling.kind != rope_scaling_kind::none) {
    std::string s = std::string(to_string(c.scaling.kind)) + " rope scaling (factor " + num(c.scaling.factor);
    if (c.scaling.original_context > 0) s += ", original context " + std::to_string(c.scaling.original_context);
    if (c.scaling.attention_factor != 1.0f) s += ", attention factor " + num(c.scaling.attention_factor);
    parts.push_back(s + ")");
  }
  parts.push_back(f.norm == norm_kind::rms_one_plus ? "rmsnorm (1+w)" : "rmsnorm");
  parts.push_back(f.activation == ffn_activation::gelu_tanh ? "geglu (tanh gelu)" : "swiglu");
  if (f.qkv_bias) parts.push_back("qkv bias");
  if (f.qk_norm) parts.push_back("q/k norm");
  if (f.post_norms) parts.push_back("post-norms");
  if (f.scale_embedding) parts.push_back("embedding x sqrt(hidden)");
  if (f.attn_softcap.on()) parts.push_back("attention softcap " + num(f.attn_softcap.cap));
  if (f.final_softcap.on()) parts.push_back("final softcap " + num(f.final_softcap.cap));
  if (f.attention_scale > 0.0f) parts.push_back("attention scale " + num(f.attention_scale));
  if (c.tied_embeddings) parts.push_back("tied embeddings");
  int32_t sliding = 0, window = 0;
  for (const layer_attention& l : c.layers) {
    if (l.sliding_window > 0) {
      ++sliding;
      window = l.sliding_window;
    }
  }
  if (sliding > 0) {
    std::string s = "sliding window " + std::to_string(window) + " on " + std::to_string(sliding) + "/" +
                    std::to_string(c.num_layers) + " layers";
    for (const layer_attention& l : c.layers) {
      if (l.rope_theta != 0.0f && l.rope_theta != c.rope_theta) {
        s += " (their rope base " + num(l.rope_theta) + ")";
        break;
      }
    }
    parts.push_back(s);
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

}  // namespace tessera
