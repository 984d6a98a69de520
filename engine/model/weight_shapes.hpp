// What an executor needs of model_weights before it converts or uploads a single tensor: every tensor
// present, of the shape the config implies, with rows it can read and decode. One check for both
// executors (cpu/, gpu/), so a model one of them accepts is a model the other accepts.
#pragma once

#include "engine/model/model_weights.hpp"

namespace tessera {

// Throws load_error "<executor_name> executor: ..." unless, against w.config:
//   * there are num_layers layers;
//   * token_embedding is [vocab, hidden] of a type dequantize_row decodes;
//   * each layer's attn_norm and ffn_norm hold `hidden` decodable values, and wq [q_dim, hidden],
//     wk and wv [kv_dim, hidden], wo [hidden, q_dim], w_gate and w_up [ffn, hidden], w_down
//     [hidden, ffn] are present with those shapes, rows at least row_bytes(type, cols) apart, and a
//     decodable type;
//   * the optional tensors are present exactly when their feature is on (bq [q_dim], bk and bv [kv_dim]:
//     qkv_bias; q_norm and k_norm [head_dim]: qk_norm; post_attn_norm and post_ffn_norm [hidden]:
//     post_norms), with that many decodable values;
//   * output_norm holds `hidden` decodable values, and the LM head (output, or token_embedding when
//     output is empty: tied) is [vocab, hidden] as above.
// Checked in that order; the message names the first tensor that fails.
void check_weight_shapes(const model_weights& w, const char* executor_name);

}  // namespace tessera
