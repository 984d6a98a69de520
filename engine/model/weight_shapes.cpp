#include "engine/model/weight_shapes.hpp"

#include <string>

#include "engine/base/error.hpp"
#include "engine/model/ggml_types.hpp"

namespace tessera {
namespace {

void check_matrix(const weight_tensor& w, int64_t rows, int64_t cols, const std::string& prefix, const char* what) {
  if (w.empty() || w.rows != rows || w.cols != cols) {
    throw load_error(prefix + "weight " + what + " ('" + w.name + "') has shape [" + std::to_string(w.rows) + ", " +
                     std::to_string(w.cols) + "], expected [" + std::to_string(rows) + ", " + std::to_string(cols) +
                     "]");
  }
  // Rows are whole blocks of their type (32 values, 256 for the K-quants): the CPU's kernels and
  // activation blocks, and dequantize_row, work block by block.
  if (const ggml_type_info* info = find_type_info(static_cast<uint32_t>(w.type));
      info != nullptr && cols % info->block_elems != 0) {
    throw load_error(prefix + "weight " + what + " ('" + w.name + "') has " + std::to_string(cols) +
                     " columns, not a multiple of the " + std::to_string(info->block_elems) + "-value blocks of " +
                     std::string(info->name));
  }
  const int64_t rb = row_bytes(w.type, cols);
  if (rb < 0 || w.row_stride_bytes < rb) throw load_error(prefix + "weight " + what + " has a bad row stride");
  // Every type an executor computes with directly (the CPU's kernels: every type but Q8_1/Q8_K)
  // also dequantizes, so this is the one type rule both executors share.
  const ggml_type_info& info = type_info(w.type);
  if (!info.can_dequantize) {
    throw load_error(prefix + "weight " + what + " has unsupported type " + std::string(info.name));
  }
}

void check_vector(const weight_tensor& w, int64_t n, const std::string& prefix, const char* what) {
  if (w.empty() || w.rows * w.cols != n || !type_info(w.type).can_dequantize) {
    throw load_error(prefix + "norm weight " + what + " is missing or has the wrong size");
  }
}

void check_optional(const weight_tensor& w, bool feature_on, int64_t n, const std::string& prefix, const char* what) {
  if (!feature_on) {
    if (!w.empty()) throw load_error(prefix + "weight " + what + " is present but the model config does not use it");
    return;
  }
  if (w.empty()) throw load_error(prefix + "weight " + what + " is missing");
  if (w.rows * w.cols != n || !type_info(w.type).can_dequantize) {
    throw load_error(prefix + "weight " + what + " ('" + w.name + "') has " + std::to_string(w.rows * w.cols) +
                     " values, expected " + std::to_string(n));
  }
}

}  // namespace

void check_weight_shapes(const model_weights& w, const char* executor_name) {
  const model_config& c = w.config;
  const std::string prefix = std::string(executor_name) + " executor: ";
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t ffn = c.intermediate_size;
  if (static_cast<int64_t>(w.layers.size()) != c.num_layers) {
    throw load_error(prefix + "layer count does not match the config");
  }
  const weight_tensor& emb = w.token_embedding;
  if (emb.empty() || emb.rows != c.vocab_size || emb.cols != hidden || !type_info(emb.type).can_dequantize) {
    throw load_error(prefix + "token embedding missing or of the wrong shape/type");
  }
  for (const layer_weights& lw : w.layers) {
    check_vector(lw.attn_norm, hidden, prefix, "attn_norm");
    check_vector(lw.ffn_norm, hidden, prefix, "ffn_norm");
    check_matrix(lw.wq, q_dim, hidden, prefix, "wq");
    check_matrix(lw.wk, kv_dim, hidden, prefix, "wk");
    check_matrix(lw.wv, kv_dim, hidden, prefix, "wv");
    check_matrix(lw.wo, hidden, q_dim, prefix, "wo");
    check_matrix(lw.w_gate, ffn, hidden, prefix, "w_gate");
    check_matrix(lw.w_up, ffn, hidden, prefix, "w_up");
    check_matrix(lw.w_down, hidden, ffn, prefix, "w_down");
    // The optional tensors: present exactly when the feature that reads them is on, so a loader that
    // forgot one (or bound one the executor would ignore) fails here instead of computing another model.
    const model_features& f = c.features;
    check_optional(lw.bq, f.qkv_bias, q_dim, prefix, "bq (qkv_bias)");
    check_optional(lw.bk, f.qkv_bias, kv_dim, prefix, "bk (qkv_bias)");
    check_optional(lw.bv, f.qkv_bias, kv_dim, prefix, "bv (qkv_bias)");
    check_optional(lw.q_norm, f.qk_norm, c.head_dim, prefix, "q_norm (qk_norm)");
    check_optional(lw.k_norm, f.qk_norm, c.head_dim, prefix, "k_norm (qk_norm)");
    check_optional(lw.post_attn_norm, f.post_norms, hidden, prefix, "post_attn_norm (post_norms)");
    check_optional(lw.post_ffn_norm, f.post_norms, hidden, prefix, "post_ffn_norm (post_norms)");
  }
  check_vector(w.output_norm, hidden, prefix, "output_norm");
  check_matrix(w.output.empty() ? emb : w.output, c.vocab_size, hidden, prefix, "output");
}

}  // namespace tessera
