// check_weight_shapes: the one weight check both executors run before converting or uploading
// anything. Dummy weights of a small GQA shape pass; each way a tensor can be unusable (missing,
// wrong shape, rows too close together, a type nothing decodes, a norm of the wrong size, a wrong
// layer count) is refused with a message that names the executor and the tensor.
#include "engine/model/weight_shapes.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "engine/base/error.hpp"
#include "engine/model/dummy_weights.hpp"

namespace tessera {
namespace {

model_config tiny_config(bool tied) {
  model_config c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_heads = 4;
  c.num_kv_heads = 2;  // q_dim 64, kv_dim 32
  c.head_dim = 16;
  c.vocab_size = 300;
  c.context_length = 128;
  c.rope_dims = 16;
  c.tied_embeddings = tied;
  return c;
}

std::shared_ptr<const model_weights> dummy(bool tied = false) {
  dummy_weights_options o;
  o.type = ggml_type::f32;
  o.num_threads = 1;
  return make_dummy_weights(tiny_config(tied), o);
}

// The load_error message of check_weight_shapes on a copy of the dummy weights changed by `edit`
// ("" when accepted).
std::string refusal(const std::function<void(model_weights&)>& edit, const char* executor_name = "cpu",
                    bool tied = false) {
  model_weights w = *dummy(tied);
  edit(w);
  try {
    check_weight_shapes(w, executor_name);
  } catch (const load_error& e) { return e.what(); }
  return "";
}

TEST(weight_shapes, accepts_weights_of_the_configs_shape) {
  EXPECT_EQ(refusal([](model_weights&) {}), "");
  EXPECT_EQ(refusal([](model_weights&) {}, "cuda", /*tied=*/true), "");
  // Untied weights whose output is left empty: the embedding serves as the LM head.
  EXPECT_EQ(refusal([](model_weights& w) { w.output = weight_tensor{}; }), "");
  // Rows further apart than they need to be are fine (a view into a wider buffer).
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[0].wq.row_stride_bytes += 4; }), "");
}

TEST(weight_shapes, refuses_a_layer_count_the_config_does_not_have) {
  EXPECT_EQ(refusal([](model_weights& w) { w.layers.pop_back(); }),
            "cpu executor: layer count does not match the config");
  EXPECT_EQ(refusal([](model_weights& w) { w.layers.push_back(w.layers[0]); }, "cuda"),
            "cuda executor: layer count does not match the config");
}

TEST(weight_shapes, refuses_an_unusable_token_embedding) {
  const std::string msg = "cpu executor: token embedding missing or of the wrong shape/type";
  EXPECT_EQ(refusal([](model_weights& w) { w.token_embedding.data = nullptr; }), msg);
  EXPECT_EQ(refusal([](model_weights& w) { w.token_embedding.rows = 299; }), msg);
  EXPECT_EQ(refusal([](model_weights& w) { w.token_embedding.cols = 32; }), msg);
  EXPECT_EQ(refusal([](model_weights& w) { w.token_embedding.type = ggml_type::q8_k; }), msg);
  // Tied, the embedding is checked once more as the LM head: a bad row stride is named there.
  EXPECT_EQ(refusal([](model_weights& w) {
              w.output = weight_tensor{};
              w.token_embedding.row_stride_bytes = 8;
            }),
            "cpu executor: weight output has a bad row stride");
}

TEST(weight_shapes, refuses_a_matrix_of_the_wrong_shape_or_missing) {
  const std::string wk = dummy()->layers[1].wk.name;
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[1].wk.rows = 16; }, "cuda"),
            "cuda executor: weight wk ('" + wk + "') has shape [16, 64], expected [32, 64]");
  const std::string wo = dummy()->layers[0].wo.name;
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[0].wo.cols = 32; }),
            "cpu executor: weight wo ('" + wo + "') has shape [64, 32], expected [64, 64]");
  // Missing reads as a shape mismatch (the shape it would have had, as both executors always said).
  const std::string down = dummy()->layers[1].w_down.name;
  EXPECT_EQ(refusal([](model_weights& w) {
              w.layers[1].w_down.data = nullptr;
            }).rfind("cpu executor: weight w_down ('" + down + "') has shape ", 0),
            0u);
  const std::string out = dummy()->output.name;
  EXPECT_EQ(refusal([](model_weights& w) { w.output.rows = 301; }),
            "cpu executor: weight output ('" + out + "') has shape [301, 64], expected [300, 64]");
}

TEST(weight_shapes, refuses_rows_closer_than_their_encoding) {
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[0].w_up.row_stride_bytes = 64 * 4 - 4; }),
            "cpu executor: weight w_up has a bad row stride");
  // Q8_0 encodes 32 values per block: rows of 100 columns do not exist in it.
  const std::string down = dummy()->layers[0].w_down.name;
  EXPECT_EQ(
      refusal([](model_weights& w) {
        w.config.intermediate_size = 100;
        for (layer_weights& l : w.layers) {
          l.w_gate.rows = l.w_up.rows = 100;
          l.w_down.cols = 100;
          l.w_down.type = ggml_type::q8_0;
        }
      }),
      "cpu executor: weight w_down ('" + down + "') has 100 columns, not a multiple of the 32-value blocks of Q8_0");
  // The K-quants' blocks are 256 values: a 64-column Q4_K matrix is refused the same way.
  const std::string wq = dummy()->layers[0].wq.name;
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[0].wq.type = ggml_type::q4_k; }, "cuda"),
            "cuda executor: weight wq ('" + wq + "') has 64 columns, not a multiple of the 256-value blocks of Q4_K");
}

TEST(weight_shapes, refuses_a_type_nothing_decodes) {
  // Q8_1 is an activation format: its size is known, but no weight of it can be dequantized.
  EXPECT_EQ(refusal(
                [](model_weights& w) {
                  w.layers[1].wv.type = ggml_type::q8_1;
                  w.layers[1].wv.row_stride_bytes = row_bytes(ggml_type::q8_1, 64);
                },
                "cuda"),
            "cuda executor: weight wv has unsupported type Q8_1");
}

TEST(weight_shapes, refuses_a_norm_of_the_wrong_size) {
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[0].attn_norm.cols = 63; }),
            "cpu executor: norm weight attn_norm is missing or has the wrong size");
  EXPECT_EQ(refusal([](model_weights& w) { w.layers[1].ffn_norm.data = nullptr; }, "cuda"),
            "cuda executor: norm weight ffn_norm is missing or has the wrong size");
  EXPECT_EQ(refusal([](model_weights& w) { w.output_norm.type = ggml_type::q8_k; }),
            "cpu executor: norm weight output_norm is missing or has the wrong size");
}

TEST(weight_shapes, names_the_first_bad_tensor) {
  // Layer 0's norms come before its matrices, layer 0 before layer 1, the layers before the head.
  EXPECT_EQ(refusal([](model_weights& w) {
              w.layers[0].wq.rows = 1;
              w.layers[0].ffn_norm.cols = 1;
              w.output_norm.cols = 1;
            }),
            "cpu executor: norm weight ffn_norm is missing or has the wrong size");
  EXPECT_EQ(refusal([](model_weights& w) {
              w.layers[1].wq.rows = 1;
              w.output.rows = 1;
            }),
            "cpu executor: weight wq ('" + dummy()->layers[1].wq.name + "') has shape [1, 64], expected [64, 64]");
}

// The optional tensors: present exactly when the config's feature reads them, of the right size.
TEST(weight_shapes, optional_tensors_follow_the_features) {
  model_config c = tiny_config(false);
  c.features.qkv_bias = true;
  c.features.qk_norm = true;
  c.features.post_norms = true;
  dummy_weights_options o;
  o.type = ggml_type::f32;
  o.num_threads = 1;
  const auto with = make_dummy_weights(c, o);
  auto check = [&](const std::function<void(model_weights&)>& edit) {
    model_weights w = *with;
    edit(w);
    try {
      check_weight_shapes(w, "cpu");
    } catch (const load_error& e) { return std::string(e.what()); }
    return std::string();
  };
  EXPECT_EQ(check([](model_weights&) {}), "");
  EXPECT_NE(check([](model_weights& w) { w.layers[1].bk = weight_tensor{}; }).find("bk (qkv_bias) is missing"),
            std::string::npos);
  EXPECT_NE(check([](model_weights& w) { w.layers[0].q_norm.cols = 8; }).find("q_norm (qk_norm)"), std::string::npos);
  EXPECT_NE(check([](model_weights& w) {
              w.layers[0].post_ffn_norm = weight_tensor{};
            }).find("post_ffn_norm (post_norms) is missing"),
            std::string::npos);
  // A tensor the config does not use is refused too: an executor would silently ignore it.
  EXPECT_NE(check([](model_weights& w) {
              w.config.features.qkv_bias = false;
            }).find("bq (qkv_bias) is present but the model config does not use it"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
