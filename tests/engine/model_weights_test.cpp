// GGUF binding: read_gguf_config / load_gguf_weights on tiny models written in-test, every
// refusal path naming the key or tensor, model_config::validate, and the real SmolLM2 file (whose
// dequantized rows are compared with gguf-py's, tests/data/gguf/smollm2_rows.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/gguf_test_writer.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/model_weights.hpp"
#include "engine/model/rope.hpp"

namespace tessera {
namespace {

using test::gguf_writer;
namespace vt = test::vt;

constexpr uint32_t t_f32 = 0, t_q8_0 = 8, t_q8_k = 15;

// Bytes of a tensor, computed here from ggml's block sizes (not with the engine's row_bytes).
size_t tensor_bytes(uint32_t type, const std::vector<uint64_t>& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  switch (type) {
    case t_f32: return n * 4;
    case t_q8_0: return n / 32 * 34;
    case t_q8_k: return n / 256 * 292;
    default: return 0;
  }
}

// A tiny LLaMA: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, FFN 96, vocab 40.
struct tiny_llama {
  int layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 96, vocab = 40;
  bool with_output = false;
  bool write_vocab_size = true;
  std::set<std::string> skip;  // tensors left out
  std::map<std::string, std::vector<uint64_t>> dims_override;
  std::map<std::string, uint32_t> type_override;
  std::function<void(gguf_writer&)> extra_kv;  // appended metadata (or replacements)
  std::set<std::string> skip_kv;

  std::vector<std::byte> build() const {
    gguf_writer w;
    auto kv_u32 = [&](const std::string& k, uint32_t v) {
      if (!skip_kv.count(k)) w.kv_u32(k, v);
    };
    if (!skip_kv.count("general.architecture")) w.kv_str("general.architecture", "llama");
    w.kv_str("general.name", "tiny");
    kv_u32("llama.block_count", static_cast<uint32_t>(layers));
    kv_u32("llama.embedding_length", static_cast<uint32_t>(hidden));
    kv_u32("llama.feed_forward_length", static_cast<uint32_t>(ffn));
    kv_u32("llama.attention.head_count", static_cast<uint32_t>(heads));
    kv_u32("llama.attention.head_count_kv", static_cast<uint32_t>(kv_heads));
    kv_u32("llama.context_length", 128);
    if (!skip_kv.count("llama.attention.layer_norm_rms_epsilon"))
      w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
    if (write_vocab_size) kv_u32("llama.vocab_size", static_cast<uint32_t>(vocab));
    std::vector<std::string> tokens;
    for (int i = 0; i < vocab; ++i) tokens.push_back("tok" + std::to_string(i));
    w.kv_str_array("tokenizer.ggml.tokens", tokens);
    if (extra_kv) extra_kv(w);

    const auto h = static_cast<uint64_t>(hidden);
    const auto hd = static_cast<uint64_t>(hidden / heads);
    auto add = [&](const std::string& name, uint32_t type, std::vector<uint64_t> dims) {
      if (skip.count(name)) return;
      if (auto it = dims_override.find(name); it != dims_override.end()) dims = it->second;
      if (auto it = type_override.find(name); it != type_override.end()) type = it->second;
      std::vector<std::byte> data(tensor_bytes(type, dims));
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 + name.size());
      w.tensor({name, type, dims, std::move(data), std::nullopt, std::nullopt});
    };
    add("token_embd.weight", t_q8_0, {h, static_cast<uint64_t>(vocab)});
    add("output_norm.weight", t_f32, {h});
    if (with_output) add("output.weight", t_q8_0, {h, static_cast<uint64_t>(vocab)});
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", t_f32, {h});
      add(p + "attn_q.weight", t_q8_0, {h, static_cast<uint64_t>(heads) * hd});
      add(p + "attn_k.weight", t_q8_0, {h, static_cast<uint64_t>(kv_heads) * hd});
      add(p + "attn_v.weight", t_q8_0, {h, static_cast<uint64_t>(kv_heads) * hd});
      add(p + "attn_output.weight", t_q8_0, {static_cast<uint64_t>(heads) * hd, h});
      add(p + "ffn_norm.weight", t_f32, {h});
      add(p + "ffn_gate.weight", t_q8_0, {h, static_cast<uint64_t>(ffn)});
      add(p + "ffn_up.weight", t_q8_0, {h, static_cast<uint64_t>(ffn)});
      add(p + "ffn_down.weight", t_q8_0, {static_cast<uint64_t>(ffn), h});
    }
    return w.build();
  }
  std::shared_ptr<const gguf_file> file() const { return gguf_file::from_bytes(build()); }
};

void expect_load_error(const tiny_llama& m, const std::string& expect) {
  try {
    load_gguf_weights(m.file());
    ADD_FAILURE() << "loaded; expected an error containing: " << expect;
  } catch (const load_error& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what() << "\nexpected: " << expect;
  }
}

TEST(LlamaWeights, BindsEveryTensorOfATinyModel) {
  const auto file = tiny_llama{}.file();
  const auto w = load_gguf_weights(file);
  const model_config& c = w->config;
  EXPECT_EQ(c.architecture, model_arch::llama);
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 40);
  EXPECT_EQ(c.context_length, 128);
  EXPECT_EQ(c.rope_dims, 16);         // default: head_dim
  EXPECT_EQ(c.rope_theta, 10000.0f);  // default freq_base
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope, rope_style::interleaved);
  EXPECT_TRUE(c.tied_embeddings);

  EXPECT_EQ(w->token_embedding.rows, 40);
  EXPECT_EQ(w->token_embedding.cols, 64);
  EXPECT_EQ(w->token_embedding.type, ggml_type::q8_0);
  EXPECT_EQ(w->token_embedding.row_stride_bytes, 2 * 34);
  EXPECT_EQ(w->token_embedding.data, file->tensor("token_embd.weight")->data);
  EXPECT_EQ(w->output.data, w->token_embedding.data);  // tied
  EXPECT_EQ(w->output.rows, 40);
  EXPECT_EQ(w->output_norm.rows, 1);
  EXPECT_EQ(w->output_norm.cols, 64);
  ASSERT_EQ(w->layers.size(), 2u);
  const layer_weights& l1 = w->layers[1];
  EXPECT_EQ(l1.wq.rows, 64);
  EXPECT_EQ(l1.wk.rows, 32);
  EXPECT_EQ(l1.wk.cols, 64);
  EXPECT_EQ(l1.wv.rows, 32);
  EXPECT_EQ(l1.wo.rows, 64);
  EXPECT_EQ(l1.wo.cols, 64);
  EXPECT_EQ(l1.w_gate.rows, 96);
  EXPECT_EQ(l1.w_up.rows, 96);
  EXPECT_EQ(l1.w_down.rows, 64);
  EXPECT_EQ(l1.w_down.cols, 96);
  EXPECT_EQ(l1.w_down.row_stride_bytes, 3 * 34);
  EXPECT_EQ(l1.w_down.name, "blk.1.ffn_down.weight");
  EXPECT_EQ(l1.w_down.data, file->tensor("blk.1.ffn_down.weight")->data);
  EXPECT_EQ(l1.ffn_norm.type, ggml_type::f32);
  EXPECT_EQ(l1.attn_norm.data, file->tensor("blk.1.attn_norm.weight")->data);
  EXPECT_EQ(l1.w_up.row(2), l1.w_up.data + 2 * l1.w_up.row_stride_bytes);
}

TEST(LlamaWeights, StorageKeepsTheFileAlive) {
  auto file = tiny_llama{}.file();
  const std::byte first = *file->tensor("blk.0.ffn_up.weight")->data;
  const auto w = load_gguf_weights(std::move(file));
  file.reset();
  EXPECT_EQ(*w->layers[0].w_up.data, first);  // ASan would flag a freed mapping here
  EXPECT_NE(w->storage, nullptr);
}

TEST(LlamaWeights, SeparateOutputMatrix) {
  tiny_llama m;
  m.with_output = true;
  const auto file = m.file();
  const auto w = load_gguf_weights(file);
  EXPECT_FALSE(w->config.tied_embeddings);
  EXPECT_EQ(w->output.data, file->tensor("output.weight")->data);
  EXPECT_NE(w->output.data, w->token_embedding.data);
}

TEST(LlamaWeights, OptionalKeysAndVocabFromTokens) {
  tiny_llama m;
  m.write_vocab_size = false;
  m.skip_kv = {"llama.attention.head_count_kv", "llama.attention.layer_norm_rms_epsilon"};
  m.kv_heads = 4;  // tensors shaped for head_count_kv defaulting to head_count
  m.extra_kv = [](gguf_writer& w) {
    w.kv_u32("llama.rope.dimension_count", 8);
    w.kv_f32("llama.rope.freq_base", 100000.0f);
  };
  const auto c = read_gguf_config(*m.file());
  EXPECT_EQ(c.vocab_size, 40);  // tokenizer.ggml.tokens length
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_dims, 8);
  EXPECT_EQ(c.rope_theta, 100000.0f);
}

TEST(LlamaWeights, RefusesBadMetadata) {
  tiny_llama m;
  m.skip_kv = {"general.architecture"};
  expect_load_error(m, "general.architecture is missing");
  m = {};
  m.skip_kv = {"general.architecture"};
  m.extra_kv = [](gguf_writer& w) { w.kv_str("general.architecture", "gpt2"); };
  expect_load_error(m, "architecture 'gpt2' is not supported");
  m = {};
  m.skip_kv = {"llama.block_count"};
  expect_load_error(m, "required key 'llama.block_count' is missing");
  m = {};
  m.skip_kv = {"llama.attention.head_count_kv"};
  m.extra_kv = [](gguf_writer& w) { w.kv_str("llama.attention.head_count_kv", "2"); };
  expect_load_error(m, "'llama.attention.head_count_kv' has type string");
  m = {};
  m.skip_kv = {"llama.block_count"};
  m.extra_kv = [](gguf_writer& w) { w.kv_u64("llama.block_count", uint64_t{1} << 40); };
  expect_load_error(m, "llama.block_count = 1099511627776 is out of range");
  m = {};
  m.skip_kv = {"llama.attention.head_count"};
  m.extra_kv = [](gguf_writer& w) { w.kv_u32("llama.attention.head_count", 5); };
  expect_load_error(m, "not a multiple of head_count 5");
  m = {};
  m.skip_kv = {"llama.attention.head_count_kv"};
  m.extra_kv = [](gguf_writer& w) { w.kv_u32("llama.attention.head_count_kv", 3); };
  expect_load_error(m, "not a multiple of num_kv_heads (3)");
  m = {};
  m.extra_kv = [](gguf_writer& w) { w.kv_u32("llama.rope.dimension_count", 7); };
  expect_load_error(m, "rope_dims (7) must be even");
  m = {};
  m.extra_kv = [](gguf_writer& w) { w.kv_u32("llama.rope.dimension_count", 32); };
  expect_load_error(m, "rope_dims = 32 is outside 2..16");
  m = {};
  m.extra_kv = [](gguf_writer& w) { w.kv_str("llama.rope.scaling.type", "ntk-by-parts"); };
  expect_load_error(m, "rope scaling 'ntk-by-parts' is not supported");
  m = {};
  m.extra_kv = [](gguf_writer& w) { w.kv_str("llama.rope.scaling.type", "yarn"); };  // without its context
  expect_load_error(m, "yarn rope scaling without original_context_length");
  m = {};
  m.extra_kv = [](gguf_writer& w) { w.kv_u32("llama.attention.key_length", 32); };
  expect_load_error(m, "llama.attention.key_length = 32 differs");
  m = {};
  m.write_vocab_size = false;
  m.extra_kv = [](gguf_writer& w) { w.kv_f32("llama.attention.layer_norm_rms_epsilon", NAN); };
  m.skip_kv = {"llama.attention.layer_norm_rms_epsilon"};
  expect_load_error(m, "layer_norm_rms_epsilon");
}

TEST(LlamaWeights, RefusesMissingOrMisshapenTensors) {
  tiny_llama m;
  m.skip = {"blk.1.ffn_up.weight"};
  expect_load_error(m, "tensor 'blk.1.ffn_up.weight' is missing");
  m = {};
  m.skip = {"output_norm.weight"};
  expect_load_error(m, "tensor 'output_norm.weight' is missing");
  m = {};
  m.dims_override["blk.0.attn_k.weight"] = {64, 64};
  expect_load_error(m, "tensor 'blk.0.attn_k.weight' has shape [64, 64], expected [64, 32]");
  m = {};
  m.dims_override["blk.1.ffn_down.weight"] = {64, 96};  // transposed
  expect_load_error(m, "tensor 'blk.1.ffn_down.weight' has shape [64, 96], expected [96, 64]");
  m = {};
  m.dims_override["token_embd.weight"] = {64, 41};
  expect_load_error(m, "tensor 'token_embd.weight' has shape [64, 41]");
  m = {};
  m.dims_override["blk.0.attn_norm.weight"] = {64, 2};
  expect_load_error(m, "tensor 'blk.0.attn_norm.weight' has shape [64, 2], expected [64]");
  m = {};
  m.with_output = true;
  m.dims_override["output.weight"] = {32, 40};
  expect_load_error(m, "tensor 'output.weight' has shape [32, 40]");
  m = {};
  m.hidden = 256;  // Q8_K needs 256-wide rows
  m.heads = 4;
  m.type_override["blk.0.ffn_gate.weight"] = t_q8_k;
  expect_load_error(m, "tensor 'blk.0.ffn_gate.weight' has type Q8_K, which this build cannot compute with");
  m = {};
  // llama3 frequency factors: one per rotated pair (head_dim 16: 8), not 5.
  m.extra_kv = [](gguf_writer& w) { w.f32_tensor("rope_freqs.weight", {5}, [](uint64_t) { return 1.0; }); };
  expect_load_error(m, "tensor 'rope_freqs.weight' has shape [5], expected [8]");
}

// RoPE scaling as llama.cpp's files state it, folded into per-pair divisors (engine/model/rope.hpp).
TEST(LlamaWeights, ReadsRopeScaling) {
  const double base = 10000.0;  // tiny_llama: head_dim 16, freq_base default
  auto plain = [&](int i) { return std::pow(base, -2.0 * i / 16); };
  tiny_llama m;
  m.extra_kv = [](gguf_writer& w) {
    w.kv_str("llama.rope.scaling.type", "linear");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
  };
  model_config c = read_gguf_config(*m.file());
  EXPECT_EQ(c.scaling.kind, rope_scaling_kind::linear);
  rope_table t = rope_frequencies(c, 0);
  ASSERT_EQ(t.inv_freq.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(t.inv_freq[static_cast<size_t>(i)], plain(i) / 4, 1e-6 * plain(i)) << i;
  EXPECT_EQ(t.attention_factor, 1.0f);

  // Llama 3.1: the converter's divisors in rope_freqs.weight, used as they are.
  m = {};
  m.extra_kv = [](gguf_writer& w) {
    w.f32_tensor("rope_freqs.weight", {8}, [](uint64_t i) { return 1.0 + double(i); });
  };
  c = read_gguf_config(*m.file());
  EXPECT_EQ(c.scaling.kind, rope_scaling_kind::llama3);
  t = rope_frequencies(c, 0);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(t.inv_freq[static_cast<size_t>(i)], plain(i) / (1 + i), 1e-6 * plain(i)) << i;

  // YaRN (Peng et al. 2023): fast pairs keep their frequency, slow ones are divided by the factor, and
  // cos/sin carry 0.1 ln(factor) + 1.
  m = {};
  m.extra_kv = [](gguf_writer& w) {
    w.kv_str("llama.rope.scaling.type", "yarn");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
    w.kv_u32("llama.rope.scaling.original_context_length", 64);
  };
  c = read_gguf_config(*m.file());
  EXPECT_EQ(c.scaling.kind, rope_scaling_kind::yarn);
  t = rope_frequencies(c, 0);
  EXPECT_NEAR(t.inv_freq[0], plain(0), 1e-9);
  EXPECT_NEAR(t.inv_freq[7], plain(7) / 4, 1e-6 * plain(7));
  EXPECT_NEAR(t.attention_factor, 0.1 * std::log(4.0) + 1, 1e-6);
}

TEST(LlamaWeights, AcceptsTrailingUnitDimensions) {
  tiny_llama m;
  m.dims_override["blk.0.attn_norm.weight"] = {64, 1, 1};
  m.dims_override["blk.0.attn_q.weight"] = {64, 64, 1};
  EXPECT_NO_THROW(load_gguf_weights(m.file()));
}

model_config good_config() {
  model_config c;
  c.num_layers = 30;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.vocab_size = 49152;
  c.context_length = 8192;
  c.rope_dims = 64;
  c.rope_theta = 100000.0f;
  c.rms_norm_eps = 1e-5f;
  return c;
}

TEST(ModelConfig, Validate) {
  EXPECT_NO_THROW(good_config().validate());
  const std::vector<std::pair<std::string, std::function<void(model_config&)>>> broken = {
      {"num_layers", [](model_config& c) { c.num_layers = 0; }},
      {"num_layers", [](model_config& c) { c.num_layers = 100000; }},
      {"hidden_size", [](model_config& c) { c.hidden_size = -576; }},
      {"intermediate_size", [](model_config& c) { c.intermediate_size = 0; }},
      {"num_heads", [](model_config& c) { c.num_heads = 0; }},
      {"num_kv_heads", [](model_config& c) { c.num_kv_heads = 0; }},
      {"num_kv_heads", [](model_config& c) { c.num_kv_heads = 18; }},
      {"num_kv_heads (2)", [](model_config& c) { c.num_kv_heads = 2; }},
      {"head_dim", [](model_config& c) { c.head_dim = 0; }},
      {"!= hidden_size",
       [](model_config& c) {
         c.head_dim = 32;
         c.rope_dims = 32;
       }},
      {"vocab_size", [](model_config& c) { c.vocab_size = 0; }},
      {"context_length", [](model_config& c) { c.context_length = -1; }},
      {"rope_dims", [](model_config& c) { c.rope_dims = 0; }},
      {"rope_dims", [](model_config& c) { c.rope_dims = 66; }},
      {"must be even", [](model_config& c) { c.rope_dims = 63; }},
      {"rope_theta", [](model_config& c) { c.rope_theta = 0.0f; }},
      {"rope_theta", [](model_config& c) { c.rope_theta = INFINITY; }},
      {"rms_norm_eps", [](model_config& c) { c.rms_norm_eps = 0.0f; }},
      {"rms_norm_eps", [](model_config& c) { c.rms_norm_eps = NAN; }},
  };
  for (const auto& [expect, mutate] : broken) {
    model_config c = good_config();
    mutate(c);
    try {
      c.validate();
      ADD_FAILURE() << "accepted: " << expect;
    } catch (const load_error& e) { EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what(); }
  }
}

// ---- the real model ----------------------------------------------------------------------------

TEST(LlamaWeightsRealModel, SmolLM2) {
  const std::filesystem::path path = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model file not present: " << path;
  const auto w = load_gguf_weights(gguf_file::open(path));
  const model_config& c = w->config;
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_EQ(c.rope_dims, 64);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(w->token_embedding.type, ggml_type::q8_0);
  EXPECT_EQ(w->output.data, w->token_embedding.data);
  EXPECT_EQ(w->layers.size(), 30u);
  EXPECT_EQ(w->layers[29].w_down.type, ggml_type::q4_1);
  EXPECT_EQ(w->layers[0].wk.rows, 192);

  // Dequantized rows against gguf-py's (written by scripts/make_quant_fixtures.py).
  std::ifstream in(std::filesystem::path(TESSERA_TEST_DATA_DIR) / "gguf" / "smollm2_rows.txt");
  ASSERT_TRUE(in.good()) << "missing tests/data/gguf/smollm2_rows.txt";
  std::map<std::string, const weight_tensor*> by_name = {{"token_embd.weight", &w->token_embedding},
                                                         {"output_norm.weight", &w->output_norm},
                                                         {"blk.0.attn_q.weight", &w->layers[0].wq},
                                                         {"blk.0.attn_norm.weight", &w->layers[0].attn_norm},
                                                         {"blk.29.ffn_down.weight", &w->layers[29].w_down}};
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    int64_t row = 0, n = 0;
    ls >> name >> row >> n;
    ASSERT_TRUE(by_name.count(name)) << name;
    const weight_tensor& t = *by_name[name];
    std::vector<float> got(static_cast<size_t>(t.cols));
    dequantize_row(t.type, t.row(row), got.data(), t.cols);
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      ls >> want;
      EXPECT_NEAR(got[static_cast<size_t>(i)], want, 1e-6 * std::fabs(want) + 1e-12)
          << name << " row " << row << " [" << i << "]";
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

}  // namespace
}  // namespace tessera
