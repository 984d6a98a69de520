// --load-format dummy: random weights of a config's shape, deterministic in the seed, with the
// statistics the header promises; the byte-level placeholder tokenizer; loading from a config.json.
#include "engine/model/dummy_weights.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/base/error.hpp"
#include "engine/model/hf_model.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/text/byte_tokenizer.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

model_config tiny_config() {
  model_config c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 300;
  c.context_length = 128;
  c.rope_dims = 16;
  c.rope = rope_style::half;
  return c;
}

std::vector<float> values(const weight_tensor& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequantize_row(w.type, w.row(r), out.data() + r * w.cols, w.cols);
  return out;
}

TEST(DummyWeights, ShapesFollowTheConfig) {
  const model_config c = tiny_config();
  const auto w = make_dummy_weights(c);
  ASSERT_EQ(w->layers.size(), 2u);
  EXPECT_EQ(w->token_embedding.rows, 300);
  EXPECT_EQ(w->token_embedding.cols, 64);
  EXPECT_EQ(w->output.rows, 300);
  EXPECT_NE(w->output.data, w->token_embedding.data);  // untied: its own matrix
  for (const layer_weights& l : w->layers) {
    EXPECT_EQ(l.wq.rows, 64);
    EXPECT_EQ(l.wk.rows, 32);
    EXPECT_EQ(l.wv.rows, 32);
    EXPECT_EQ(l.wo.cols, 64);
    EXPECT_EQ(l.w_gate.rows, 96);
    EXPECT_EQ(l.w_down.cols, 96);
    EXPECT_EQ(l.wq.type, ggml_type::bf16);
    EXPECT_EQ(l.wq.row_stride_bytes, 64 * 2);
    for (float v : values(l.attn_norm)) ASSERT_EQ(v, 1.0f);
  }
  model_config tied = c;
  tied.tied_embeddings = true;
  const auto wt = make_dummy_weights(tied);
  EXPECT_EQ(wt->output.data, wt->token_embedding.data);
}

TEST(DummyWeights, DeterministicInTheSeedAndIndependentOfThreads) {
  dummy_weights_options a;
  a.seed = 7;
  a.num_threads = 1;
  dummy_weights_options b = a;
  b.num_threads = 3;
  dummy_weights_options other = a;
  other.seed = 8;
  const auto wa = make_dummy_weights(tiny_config(), a);
  const auto wb = make_dummy_weights(tiny_config(), b);
  const auto wo = make_dummy_weights(tiny_config(), other);
  EXPECT_EQ(values(wa->layers[1].w_up), values(wb->layers[1].w_up));
  EXPECT_EQ(values(wa->token_embedding), values(wb->token_embedding));
  EXPECT_NE(values(wa->layers[1].w_up), values(wo->layers[1].w_up));
  // Different tensors of one model are different streams.
  EXPECT_NE(values(wa->layers[0].wq), values(wa->layers[1].wq));
}

TEST(DummyWeights, StatisticsScaleWithFanIn) {
  for (ggml_type t : {ggml_type::f32, ggml_type::f16, ggml_type::bf16}) {
    dummy_weights_options o;
    o.type = t;
    const auto w = make_dummy_weights(tiny_config(), o);
    const std::vector<float> v = values(w->layers[0].w_down);  // fan-in 96
    double sum = 0, sq = 0;
    for (float x : v) {
      sum += x;
      sq += double(x) * x;
      ASSERT_LE(std::fabs(x), std::sqrt(3.0f / 96.0f) * 1.01f);
    }
    const double mean = sum / v.size(), sd = std::sqrt(sq / v.size() - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(sd, 1.0 / std::sqrt(96.0), 0.1 / std::sqrt(96.0)) << type_info(t).name;
  }
  dummy_weights_options bad;
  bad.type = ggml_type::q4_k;
  EXPECT_THROW(make_dummy_weights(tiny_config(), bad), invalid_request);
  model_config broken = tiny_config();
  broken.num_kv_heads = 3;
  EXPECT_THROW(make_dummy_weights(broken), load_error);
}

// q8_0 and q4_0 (--dummy-weight-type, for CPU smoke runs of 7-8B shapes): the f32 model's values,
// quantized as ggml's reference quantizer does, so each value is within a quantization step of its
// block (Q8_0: half of max|x| / 127; Q4_0: max|x| / 8, the clamped end of the range; each plus the
// fp16 rounding of the block's scale); biases and
// norms stay f32; a dimension that is not whole blocks of 32 is refused by name.
TEST(DummyWeights, QuantizedTypesAreTheFloatValuesQuantizedAsGgmlDoes) {
  model_config c = tiny_config();
  c.features.qkv_bias = true;
  dummy_weights_options f32;
  f32.type = ggml_type::f32;
  const auto exact = make_dummy_weights(c, f32);
  for (const ggml_type t : {ggml_type::q8_0, ggml_type::q4_0}) {
    dummy_weights_options o;
    o.type = t;
    const auto w = make_dummy_weights(c, o);
    const layer_weights& l = w->layers[1];
    EXPECT_EQ(l.w_up.type, t);
    EXPECT_EQ(l.w_up.row_stride_bytes, 64 / 32 * type_info(t).block_bytes);
    EXPECT_EQ(l.bq.type, ggml_type::f32);
    EXPECT_EQ(values(l.bq), values(exact->layers[1].bq));
    EXPECT_EQ(l.attn_norm.type, ggml_type::f32);
    for (const auto& [got, want] :
         {std::pair{&l.w_up, &exact->layers[1].w_up}, std::pair{&w->token_embedding, &exact->token_embedding},
          std::pair{&l.w_down, &exact->layers[1].w_down}}) {
      const std::vector<float> q = values(*got), x = values(*want);
      ASSERT_EQ(q.size(), x.size());
      double worst = 0;
      for (size_t b = 0; b < x.size(); b += 32) {
        float amax = 0;
        for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        // Plus the fp16 rounding of the scale d: at most 2^-11 of it, times |q| <= 127 (or 8).
        const float step = (t == ggml_type::q8_0 ? amax / 127.0f * 0.5f : amax / 8.0f) + amax / 2048.0f;
        for (size_t i = b; i < b + 32; ++i) {
          ASSERT_LE(std::fabs(q[i] - x[i]), step * 1.001f + 1e-7f) << type_info(t).name << " value " << i;
          worst = std::max(worst, double(std::fabs(q[i] - x[i])));
        }
      }
      EXPECT_GT(worst, 0.0) << "quantized, not copied";
    }
  }
  model_config odd = tiny_config();
  odd.intermediate_size = 100;
  dummy_weights_options q4;
  q4.type = ggml_type::q4_0;
  try {
    make_dummy_weights(odd, q4);
    FAIL() << "no exception";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size to be a multiple of 32, got 100"), std::string::npos)
        << e.what();
  }
}

// q4_k (for the CUDA executor's quantized GEMMs on 7-8B shapes): the f32 model's values in Q4_K
// super-blocks of 256, read back through the engine's own dequantiser, each within the bound its
// quantiser promises: half a step of its group (d * 6-bit scale, the scale rounded up from range / 15)
// plus half of dmin (the 6-bit min's rounding) plus the fp16 rounding of d and dmin; dimensions that
// are not whole super-blocks are refused.
TEST(DummyWeights, Q4KIsTheFloatValuesInSuperBlocksWithinTheirStep) {
  model_config c = tiny_config();
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_dims = 64;
  dummy_weights_options f32;
  f32.type = ggml_type::f32;
  const auto exact = make_dummy_weights(c, f32);
  dummy_weights_options o;
  o.type = ggml_type::q4_k;
  const auto w = make_dummy_weights(c, o);
  for (const auto& [got, want] : {std::pair{&w->layers[0].w_up, &exact->layers[0].w_up},
                                  std::pair{&w->layers[1].w_down, &exact->layers[1].w_down}}) {
    ASSERT_EQ(got->type, ggml_type::q4_k);
    ASSERT_EQ(got->row_stride_bytes, got->cols / 256 * 144);
    const std::vector<float> q = values(*got), x = values(*want);
    double err2 = 0, x2 = 0;
    for (size_t b = 0; b < x.size(); b += 256) {
      float max_scale = 0, max_min = 0, scale[8];
      for (int g = 0; g < 8; ++g) {
        float lo = 0, hi = x[b + 32 * g];
        for (int i = 0; i < 32; ++i) lo = std::min(lo, x[b + 32 * g + i]), hi = std::max(hi, x[b + 32 * g + i]);
        scale[g] = (hi - lo) / 15;
        max_scale = std::max(max_scale, scale[g]);
        max_min = std::max(max_min, -lo);
      }
      const float d = max_scale / 63, dmin = max_min / 63;
      for (int g = 0; g < 8; ++g) {
        const float bound = 0.5f * (scale[g] + d) + 0.5f * dmin + 64 * (d + dmin) / 1024 + 1e-7f;
        for (size_t i = b + 32 * g; i < b + 32 * g + 32; ++i) {
          ASSERT_LE(std::fabs(q[i] - x[i]), bound) << "value " << i;
          err2 += double(q[i] - x[i]) * (q[i] - x[i]);
          x2 += double(x[i]) * x[i];
        }
      }
    }
    EXPECT_GT(err2, 0.0) << "quantized, not copied";
    EXPECT_LT(std::sqrt(err2 / x2), 0.1) << "4-bit: the error is a small part of the values";
  }
  model_config odd = c;
  odd.intermediate_size = 320;
  try {
    make_dummy_weights(odd, o);
    FAIL() << "no exception";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size to be a multiple of 256, got 320"), std::string::npos)
        << e.what();
  }
}

TEST(DummyWeights, ByteTokenizerRoundTripsText) {
  const auto tok = make_byte_tokenizer(300);
  EXPECT_EQ(tok->vocab_size(), 300u);
  const std::string text =
      "Paged KV caches \xc3\xa9t\xc3\xa9 \x01 \xe2\x82\xac end.";  // valid UTF-8 (BPE repairs invalid bytes)
  const std::vector<token_id> ids = tok->encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte: no merges
  for (token_id id : ids) EXPECT_LT(id, 256);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_THROW(make_byte_tokenizer(100), load_error);
}

TEST(DummyWeights, LoadsTheCommittedModelShapes) {
  // The 8B shapes' configs are read (not their weights: 16 GB): what the GPU benchmark loads.
  const fs::path models = fs::path(TESSERA_TEST_DATA_DIR) / ".." / ".." / "bench" / "models";
  const model_config llama = read_hf_config(models / "llama-3-8b");
  EXPECT_EQ(llama.num_layers, 32);
  EXPECT_EQ(llama.hidden_size, 4096);
  EXPECT_EQ(llama.num_kv_heads, 8);
  EXPECT_EQ(llama.vocab_size, 128256);
  EXPECT_EQ(llama.rope, rope_style::half);
  const model_config qwen = read_hf_config(models / "qwen2.5-7b");
  EXPECT_EQ(qwen.num_layers, 28);
  EXPECT_EQ(qwen.num_heads, 28);
  EXPECT_EQ(qwen.num_kv_heads, 4);
  EXPECT_EQ(qwen.intermediate_size, 18944);
  EXPECT_TRUE(qwen.features.qkv_bias);
  const model_config llama31 = read_hf_config(models / "llama-3.1-8b");
  EXPECT_EQ(llama31.num_layers, 32);
  EXPECT_EQ(llama31.context_length, 131072);
  EXPECT_EQ(llama31.vocab_size, 128256);
  EXPECT_EQ(llama31.scaling.kind, rope_scaling_kind::llama3);
}

TEST(DummyWeights, LoadModelReadsOnlyTheConfig) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_dummy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "vocab_size": 300, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0})";
  for (const fs::path& p : {dir, dir / "config.json"}) {
    const loaded_model m = load_model(p, load_format::dummy);
    EXPECT_EQ(m.weights->config.hidden_size, 64);
    EXPECT_EQ(m.weights->layers.size(), 2u);
    EXPECT_EQ(m.tok->vocab_size(), 300u);
    EXPECT_FALSE(m.warnings.empty());  // says the vocabulary is a placeholder
  }
  // Without the dummy format the directory is a checkpoint missing its weights: a clear load error.
  EXPECT_THROW(load_model(dir), load_error);
  EXPECT_THROW(load_model(dir / "missing", load_format::dummy), load_error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
