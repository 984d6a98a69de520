// model_config::validate: the numbers every later stage (weights binding, KV sizing, kernels)
// relies on, checked once at load time so that nothing downstream divides by zero or overflows.
#include <cmath>
#include <string>

#include "engine/base/error.hpp"
#include "engine/model/model_config.hpp"

namespace tessera {
namespace {

// Generous upper bounds: far above any LLaMA-family model, low enough that products such as
// num_layers * context_length * num_kv_heads * head_dim stay far from int64 overflow.
constexpr int32_t max_layers = 1024;
constexpr int32_t max_hidden = 1 << 17;        // 131072
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

  if (static_cast<int64_t>(num_heads) * head_dim != hidden_size) {
    throw load_error("model config: num_heads (" + std::to_string(num_heads) + ") * head_dim (" +
                     std::to_string(head_dim) + ") != hidden_size (" + std::to_string(hidden_size) + ")");
  }
  if (num_heads % num_kv_heads != 0) {
    throw load_error("model config: num_heads (" + std::to_string(num_heads) +
                     ") is not a multiple of num_kv_heads (" + std::to_string(num_kv_heads) + ")");
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
}

}  // namespace tessera
