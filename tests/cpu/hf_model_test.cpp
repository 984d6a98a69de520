// The Hugging Face loader against the GGUF loader on the same model. scripts/make_hf_fixture.py has
// transformers dequantize the default GGUF (SmolLM2-135M-Instruct Q4_1) to float32, undo llama.cpp's
// Q/K permutation and save an ordinary HF checkpoint in models/SmolLM2-135M-Instruct-hf/. So both
// directories hold the same numbers: the configs must agree (except the RoPE pairing), the
// tokenizers must produce the same ids, and the CPU executor must compute the same logits — which
// checks the rotate-half RoPE path against the interleaved one the GGUF tests already pin down.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/base/error.hpp"
#include "engine/model/hf_model.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/model/rope.hpp"
#include "support/base64.hpp"
#include "tests/support/logit_rank.hpp"

namespace tessera {
namespace {

using test_support::argmax;
using test_support::top2_margin;

namespace fs = std::filesystem;

const fs::path gguf_path = fs::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
const fs::path hf_dir = fs::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct-hf";

// Both loaded once for the whole file (the f32 checkpoint is 540 MB, mapped).
struct models {
  loaded_model gguf;
  loaded_model hf;
};

const models* load_or_null() {
  static const models* m = []() -> const models* {
    if (!fs::exists(gguf_path) || !fs::exists(hf_dir / "config.json")) return nullptr;
    return new models{load_model(gguf_path), load_model(hf_dir)};
  }();
  return m;
}

#define SKIP_WITHOUT_MODELS(m)                               \
  if ((m) == nullptr)                                        \
  GTEST_SKIP() << "needs " << gguf_path << " and " << hf_dir \
               << " (scripts/setup, then python3 scripts/make_hf_fixture.py)"

TEST(hf_model, config_matches_the_gguf_except_rope_pairing) {
  const models* m = load_or_null();
  SKIP_WITHOUT_MODELS(m);
  const model_config& g = m->gguf.weights->config;
  const model_config& h = m->hf.weights->config;
  EXPECT_EQ(h.architecture, g.architecture);
  EXPECT_EQ(h.num_layers, g.num_layers);
  EXPECT_EQ(h.hidden_size, g.hidden_size);
  EXPECT_EQ(h.intermediate_size, g.intermediate_size);
  EXPECT_EQ(h.num_heads, g.num_heads);
  EXPECT_EQ(h.num_kv_heads, g.num_kv_heads);
  EXPECT_EQ(h.head_dim, g.head_dim);
  EXPECT_EQ(h.vocab_size, g.vocab_size);
  EXPECT_EQ(h.context_length, g.context_length);
  EXPECT_EQ(h.rope_dims, g.rope_dims);
  EXPECT_EQ(h.rope_theta, g.rope_theta);
  EXPECT_EQ(h.rms_norm_eps, g.rms_norm_eps);
  EXPECT_EQ(h.tied_embeddings, g.tied_embeddings);
  EXPECT_EQ(g.rope, rope_style::interleaved);
  EXPECT_EQ(h.rope, rope_style::half);
  // Tied: the LM head is the embedding itself, not a copy.
  EXPECT_EQ(m->hf.weights->output.data, m->hf.weights->token_embedding.data);
  EXPECT_EQ(m->hf.weights->token_embedding.type, ggml_type::f32);
  EXPECT_TRUE(m->hf.warnings.empty()) << m->hf.warnings.front();
}

TEST(hf_model, chat_template_and_special_tokens_match) {
  const models* m = load_or_null();
  SKIP_WITHOUT_MODELS(m);
  ASSERT_TRUE(m->hf.chat_template.has_value());
  EXPECT_EQ(*m->hf.chat_template, m->gguf.chat_template.value_or(""));
  const tokenizer& g = *m->gguf.tok;
  const tokenizer& h = *m->hf.tok;
  ASSERT_EQ(h.vocab_size(), g.vocab_size());
  EXPECT_EQ(h.pre_tokenizer(), g.pre_tokenizer());
  EXPECT_EQ(h.bos(), g.bos());
  EXPECT_EQ(h.eos(), g.eos());
  EXPECT_EQ(h.unk(), g.unk());
  EXPECT_EQ(h.pad(), g.pad());
  EXPECT_EQ(h.add_bos(), g.add_bos());
  EXPECT_EQ(h.add_eos(), g.add_eos());
  EXPECT_TRUE(std::equal(h.eog_tokens().begin(), h.eog_tokens().end(), g.eog_tokens().begin(), g.eog_tokens().end()));
  size_t num_differences = 0;
  for (token_id id = 0; id < static_cast<token_id>(g.vocab_size()); ++id) {
    if (h.token_text(id) != g.token_text(id) || h.is_special(id) != g.is_special(id)) {
      if (++num_differences <= 5) {
        ADD_FAILURE() << "token " << id << ": '" << h.token_text(id) << "' vs '" << g.token_text(id) << "'";
      }
    }
  }
  EXPECT_EQ(num_differences, 0u);
}

using test::base64_decode;

// "text_b64" of one line of the parity corpus, and whether it is a special=false case.
bool plain_case(const std::string& line, std::string& text) {
  const size_t k = line.find("\"text_b64\": \"");
  if (k == std::string::npos || line.find("\"special\": false") == std::string::npos) return false;
  const size_t begin = k + 13;
  const size_t end = line.find('"', begin);
  if (end == std::string::npos) return false;
  text = base64_decode(std::string_view(line).substr(begin, end - begin));
  return true;
}

TEST(hf_model, tokenizes_the_parity_corpus_like_the_gguf) {
  const models* m = load_or_null();
  SKIP_WITHOUT_MODELS(m);
  std::ifstream in(fs::path(TESSERA_TEST_DATA_DIR) / "tokenizer" / "smollm_parity.jsonl");
  if (!in) GTEST_SKIP() << "no tests/data/tokenizer/smollm_parity.jsonl";
  std::string line, text;
  size_t num_cases = 0, num_mismatches = 0;
  while (std::getline(in, line)) {
    if (!plain_case(line, text) || sanitize_utf8(text) != text) continue;
    ++num_cases;
    for (const bool add_special : {false, true}) {
      const encode_options o{.add_special = add_special, .parse_special = false};
      const auto h = m->hf.tok->encode(text, o);
      const auto g = m->gguf.tok->encode(text, o);
      if (h != g && ++num_mismatches <= 10) {
        ADD_FAILURE() << ::testing::PrintToString(text) << ": " << ::testing::PrintToString(h) << " vs GGUF "
                      << ::testing::PrintToString(g);
      }
    }
  }
  EXPECT_GE(num_cases, 300u);
  EXPECT_EQ(num_mismatches, 0u) << "of " << num_cases;
  // Special tokens in text are matched when asked to, as with the GGUF.
  const std::string chat = "<|im_start|>user\nHi 2024!<|im_end|>\n";
  EXPECT_EQ(m->hf.tok->encode(chat, {.parse_special = true}), m->gguf.tok->encode(chat, {.parse_special = true}));
}

step_output prompt_logits(std::shared_ptr<const model_weights> w, const std::vector<token_id>& prompt, bool exact) {
  cpu_executor_options o;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = 8;
  o.dequantize_weights = exact;
  // Both sides in f32 math: an F32 checkpoint is not "dequantized", so the automatic KV dtype would be
  // fp16 for it and fp32 for the dequantized GGUF.
  o.kv_dtype = cpu_kv_dtype::fp32;
  auto ex = make_cpu_executor(std::move(w), o);
  step_batch b;
  sequence_slice s;
  s.seq = seq_id{1};
  s.tokens = prompt;
  s.block_table = {5, 2};
  s.logits = sequence_slice::logits_mode::all;
  b.seqs.push_back(s);
  step_output out;
  ex->execute(b, out);
  return out;
}

struct logit_diff {
  double max_abs = 0;
  int argmax_mismatches = 0;
};

logit_diff compare(const step_output& a, const step_output& b, int32_t rows) {
  logit_diff d;
  for (int32_t r = 0; r < rows; ++r) {
    const auto x = a.row(r);
    const auto y = b.row(r);
    for (size_t i = 0; i < x.size(); ++i) {
      d.max_abs = std::max(d.max_abs, std::fabs(static_cast<double>(x[i]) - y[i]));
    }
    d.argmax_mismatches += argmax(x) != argmax(y);
  }
  return d;
}

TEST(hf_model, logits_match_the_gguf_through_rotate_half_rope) {
  const models* m = load_or_null();
  SKIP_WITHOUT_MODELS(m);
  // A ChatML turn, tokenized by each model's own tokenizer (equal ids are checked above).
  const std::string text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  const auto prompt = m->hf.tok->encode(text, {.parse_special = true});
  ASSERT_EQ(prompt, m->gguf.tok->encode(text, {.parse_special = true}));
  const auto rows = static_cast<int32_t>(prompt.size());
  ASSERT_GE(rows, 10);

  // The GGUF in exact f32 math (weights dequantized) is the reference; the HF checkpoint holds those
  // same values as F32, with Q/K rows in the other order and RoPE pairing dimensions (i, i + d/2).
  const step_output gguf = prompt_logits(m->gguf.weights, prompt, true);
  const step_output hf = prompt_logits(m->hf.weights, prompt, false);
  ASSERT_EQ(hf.logits.size(), gguf.logits.size());
  const logit_diff d = compare(hf, gguf, rows);
  std::printf("HF vs GGUF (f32 math) over %d positions: max |diff| %.2e, argmax mismatches %d\n", rows, d.max_abs,
              d.argmax_mismatches);
  EXPECT_EQ(d.argmax_mismatches, 0);
  // Same numbers, different summation order only (logits are ~10-30 in magnitude).
  EXPECT_LT(d.max_abs, 1e-3);  // measured: 3e-5

  // The comparison can fail: the same weights with the GGUF's interleaved pairing are far off.
  auto wrong = std::make_shared<model_weights>(*m->hf.weights);
  wrong->config.rope = rope_style::interleaved;
  const logit_diff bad = compare(prompt_logits(wrong, prompt, false), gguf, rows);
  EXPECT_GT(bad.max_abs, 1.0);
}

// ---- tiny synthetic checkpoints: the loader's choices and refusals without the real model ----------

namespace tiny {

std::string json_escape(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// GPT-2's byte -> printable code point table (the byte-level BPE alphabet), as UTF-8.
std::string byte_char(uint8_t b) {
  uint32_t cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    uint32_t n = 0;
    for (uint32_t x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

struct tensor_spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

void write_safetensors(const fs::path& path, const std::vector<tensor_spec>& tensors) {
  std::string header = "{";
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t n = t.dtype == "F32" ? 4 : t.dtype == "F64" ? 8 : 2;
    std::string shape;
    for (int64_t d : t.shape) {
      n *= static_cast<uint64_t>(d);
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    }
    header += (header.size() > 1 ? "," : "") + json_escape(t.name) + ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" +
              shape + "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + n) + "]}";
    offset += n;
  }
  header += "}";
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  out << header;
  // BF16/F16 0x3c00/0x3f80-ish patterns are irrelevant here: the loader never reads the values.
  for (uint64_t i = 0; i < offset; ++i) out.put(static_cast<char>(i % 7 == 0 ? 0x3c : 0));
}

constexpr int k_hidden = 8, k_heads = 2, k_kv_heads = 1, k_head_dim = 4, k_ffn = 16, k_vocab = 262;

std::vector<tensor_spec> llama_tensors(const std::string& dtype, bool lm_head) {
  std::vector<tensor_spec> t = {{"model.embed_tokens.weight", dtype, {k_vocab, k_hidden}},
                                {"model.norm.weight", dtype, {k_hidden}}};
  const std::string p = "model.layers.0.";
  for (const auto& [name, rows, cols] :
       std::vector<std::tuple<std::string, int, int>>{{"self_attn.q_proj", k_heads * k_head_dim, k_hidden},
                                                      {"self_attn.k_proj", k_kv_heads * k_head_dim, k_hidden},
                                                      {"self_attn.v_proj", k_kv_heads * k_head_dim, k_hidden},
                                                      {"self_attn.o_proj", k_hidden, k_heads * k_head_dim},
                                                      {"mlp.gate_proj", k_ffn, k_hidden},
                                                      {"mlp.up_proj", k_ffn, k_hidden},
                                                      {"mlp.down_proj", k_hidden, k_ffn}}) {
    t.push_back({p + name + ".weight", dtype, {rows, cols}});
  }
  t.push_back({p + "input_layernorm.weight", dtype, {k_hidden}});
  t.push_back({p + "post_attention_layernorm.weight", dtype, {k_hidden}});
  if (lm_head) t.push_back({"lm_head.weight", dtype, {k_vocab, k_hidden}});
  return t;
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string config_json(const std::string& arch, bool tied, const std::string& extra = "") {
  return "{\"architectures\":[\"" + arch + "\"],\"hidden_size\":" + std::to_string(k_hidden) +
         ",\"intermediate_size\":" + std::to_string(k_ffn) +
         ",\"num_hidden_layers\":1,\"num_attention_heads\":" + std::to_string(k_heads) +
         ",\"num_key_value_heads\":" + std::to_string(k_kv_heads) +
         ",\"head_dim\":null,\"rope_theta\":500000.0,\"rms_norm_eps\":1e-05,\"max_position_embeddings\":2048,"
         "\"vocab_size\":" +
         std::to_string(k_vocab) + ",\"tie_word_embeddings\":" + (tied ? "true" : "false") +
         ",\"hidden_act\":\"silu\",\"bos_token_id\":256" + extra + "}";
}

// 256 byte tokens (id == byte value), specials <|begin|> (256) and <|end|> (257), a non-special added
// token "<tool>" (258), merges "a b" -> "ab" (259) and "ab c" -> "abc" (260). vocab_size 262 pads 261.
std::string tokenizer_json(const std::string& pre_tokenizer, bool pair_merges) {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    vocab += (b ? "," : "") + json_escape(byte_char(static_cast<uint8_t>(b))) + ":" + std::to_string(b);
  }
  vocab += ",\"ab\":259,\"abc\":260}";
  const std::string merges = pair_merges ? R"([["a","b"],["ab","c"]])" : R"(["a b","ab c"])";
  return R"({"version":"1.0","added_tokens":[)"
         R"({"id":256,"content":"<|begin|>","special":true},{"id":257,"content":"<|end|>","special":true},)"
         R"({"id":258,"content":"<tool>","special":false}],"normalizer":null,"pre_tokenizer":)" +
         pre_tokenizer +
         R"(,"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|begin|>","type_id":0}},)"
         R"({"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{}},)"
         R"("decoder":{"type":"ByteLevel"},"model":{"type":"BPE","byte_fallback":false,"vocab":)" +
         vocab + ",\"merges\":" + merges + "}}";
}

const std::string k_llama3_pre =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)" +
    json_escape(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+") +
    R"(},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]})";
const std::string k_gpt2_pre = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("tessera_hf_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
};

// A complete LLaMA-3-style checkpoint; tests then break one thing.
void write_model(const fs::path& dir, const std::string& dtype = "BF16") {
  write_text(dir / "config.json", config_json("LlamaForCausalLM", false));
  write_safetensors(dir / "model.safetensors", llama_tensors(dtype, true));
  write_text(dir / "tokenizer.json", tokenizer_json(k_llama3_pre, true));
  write_text(dir / "tokenizer_config.json",
             R"({"bos_token":{"content":"<|begin|>","special":true},"eos_token":"<|end|>","model_max_length":)"
             R"(1000000000000000019884624838656,"chat_template":[{"name":"tool_use","template":"T"},)"
             R"({"name":"default","template":"{{ messages }}"}]})");
}

std::string load_error_of(const fs::path& dir) {
  try {
    load_model(dir);
  } catch (const load_error& e) { return e.what(); }
  return "";
}

}  // namespace tiny

TEST(hf_model_tiny, loads_a_llama3_style_checkpoint) {
  tiny::temp_dir d("llama3");
  tiny::write_model(d.path);
  const loaded_model m = load_model(d.path);
  const model_config& c = m.weights->config;
  EXPECT_EQ(c.num_layers, 1);
  EXPECT_EQ(c.hidden_size, tiny::k_hidden);
  EXPECT_EQ(c.num_heads, tiny::k_heads);
  EXPECT_EQ(c.num_kv_heads, tiny::k_kv_heads);
  EXPECT_EQ(c.head_dim, tiny::k_head_dim);  // head_dim: null -> hidden / heads
  EXPECT_EQ(c.vocab_size, tiny::k_vocab);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope, rope_style::half);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_NE(m.weights->output.data, m.weights->token_embedding.data);
  EXPECT_EQ(m.weights->layers[0].wk.type, ggml_type::bf16);
  EXPECT_EQ(m.weights->layers[0].wk.rows, tiny::k_kv_heads * tiny::k_head_dim);
  EXPECT_EQ(m.weights->layers[0].w_down.cols, tiny::k_ffn);
  EXPECT_EQ(m.chat_template, "{{ messages }}");
  EXPECT_TRUE(m.warnings.empty()) << m.warnings.front();

  const tokenizer& t = *m.tok;
  EXPECT_EQ(t.vocab_size(), static_cast<size_t>(tiny::k_vocab));
  EXPECT_EQ(t.pre_tokenizer(), "llama3");
  EXPECT_EQ(t.bos(), 256);
  EXPECT_EQ(t.eos(), 257);
  EXPECT_TRUE(t.add_bos());  // from the TemplateProcessing post-processor
  EXPECT_EQ(t.token_type(256), token_type::control);
  EXPECT_EQ(t.token_type(258), token_type::user_defined);
  EXPECT_EQ(t.token_type(261), token_type::unused);  // padding up to vocab_size
  // [a, b] merge pairs: "abc" merges to one token, "ab d" to "ab" then " " "d".
  EXPECT_EQ(t.encode("abc"), (std::vector<token_id>{260}));
  EXPECT_EQ(t.encode("abc", {.add_special = true}), (std::vector<token_id>{256, 260}));
  // Byte tokens have id == byte value here; the LLaMA-3 split keeps " d" apart from "ab".
  EXPECT_EQ(t.encode("ab d"), (std::vector<token_id>{259, ' ', 'd'}));
  EXPECT_EQ(t.encode("x<tool>y"), (std::vector<token_id>{'x', 258, 'y'}));
  EXPECT_EQ(t.decode(t.encode("ab d\n")), "ab d\n");
}

TEST(hf_model_tiny, string_merges_gpt2_pre_tokenizer_and_f32) {
  tiny::temp_dir d("gpt2");
  tiny::write_model(d.path, "F32");
  tiny::write_text(d.path / "tokenizer.json", tiny::tokenizer_json(tiny::k_gpt2_pre, false));
  const loaded_model m = load_model(d.path);
  EXPECT_EQ(m.tok->pre_tokenizer(), "gpt2");
  EXPECT_EQ(m.tok->encode("abc"), (std::vector<token_id>{260}));
  EXPECT_EQ(m.weights->layers[0].wq.type, ggml_type::f32);
}

TEST(hf_model_tiny, unknown_pre_tokenizer_warns_and_falls_back_to_gpt2) {
  tiny::temp_dir d("unknown_pre");
  tiny::write_model(d.path);
  tiny::write_text(d.path / "tokenizer.json", tiny::tokenizer_json(R"({"type":"Sequence","pretokenizers":[)"
                                                                   R"({"type":"Split","pattern":{"Regex":"\\d+"}},)"
                                                                   R"({"type":"ByteLevel","use_regex":false}]})",
                                                                   true));
  const loaded_model m = load_model(d.path);
  EXPECT_EQ(m.tok->pre_tokenizer(), "gpt2");
  ASSERT_FALSE(m.warnings.empty());
  EXPECT_NE(m.warnings.front().find("pre_tokenizer not recognised"), std::string::npos) << m.warnings.front();
}

TEST(hf_model_tiny, tied_embeddings_alias_the_embedding) {
  tiny::temp_dir d("tied");
  tiny::write_model(d.path);
  tiny::write_text(d.path / "config.json", tiny::config_json("LlamaForCausalLM", true));
  const loaded_model m = load_model(d.path);
  EXPECT_TRUE(m.weights->config.tied_embeddings);
  EXPECT_EQ(m.weights->output.data, m.weights->token_embedding.data);
}

TEST(hf_model_tiny, sharded_checkpoints_follow_the_index) {
  tiny::temp_dir d("sharded");
  tiny::write_model(d.path);
  fs::remove(d.path / "model.safetensors");
  auto all = tiny::llama_tensors("F16", true);
  const std::vector<tiny::tensor_spec> first(all.begin(), all.begin() + 5), second(all.begin() + 5, all.end());
  tiny::write_safetensors(d.path / "model-00001-of-00002.safetensors", first);
  tiny::write_safetensors(d.path / "model-00002-of-00002.safetensors", second);
  auto index = [&](const std::string& second_name) {
    std::string map;
    for (size_t i = 0; i < all.size(); ++i) {
      map += (i ? "," : "") + tiny::json_escape(all[i].name) + ":" +
             tiny::json_escape(i < 5 ? "model-00001-of-00002.safetensors" : second_name);
    }
    return R"({"metadata":{"total_size":1},"weight_map":{)" + map + "}}";
  };
  tiny::write_text(d.path / "model.safetensors.index.json", index("model-00002-of-00002.safetensors"));
  const loaded_model m = load_model(d.path);
  EXPECT_EQ(m.weights->layers[0].w_up.type, ggml_type::f16);

  tiny::write_text(d.path / "model.safetensors.index.json", index("../model-00002-of-00002.safetensors"));
  EXPECT_NE(tiny::load_error_of(d.path).find("not a file name in the directory"), std::string::npos);
  tiny::write_text(d.path / "model.safetensors.index.json", index("model-00001-of-00002.safetensors"));
  EXPECT_NE(tiny::load_error_of(d.path).find("which lacks it"), std::string::npos);
}

// Dynamic NTK is the identity within the original context and re-bases the whole sequence beyond it
// (transformers dynamic_rope_update), which a cache of rotated keys cannot follow: the context is
// capped where it is exact, with a note. Linear scaling divides every frequency.
TEST(hf_model_tiny, dynamic_ntk_caps_the_context_and_linear_divides) {
  tiny::temp_dir d("rope");
  tiny::write_model(d.path);
  tiny::write_text(d.path / "config.json", tiny::config_json("LlamaForCausalLM", false,
                                                             R"(,"rope_scaling":{"rope_type":"dynamic","factor":2.0,)"
                                                             R"("original_max_position_embeddings":512})"));
  loaded_model m = load_model(d.path);
  EXPECT_EQ(m.weights->config.scaling.kind, rope_scaling_kind::dynamic_ntk);
  EXPECT_EQ(m.weights->config.context_length, 512);
  ASSERT_FALSE(m.warnings.empty());
  EXPECT_NE(m.warnings.front().find("dynamic NTK RoPE: context capped"), std::string::npos) << m.warnings.front();
  tiny::write_text(d.path / "config.json", tiny::config_json("LlamaForCausalLM", false,
                                                             R"(,"rope_scaling":{"rope_type":"linear","factor":4.0})"));
  m = load_model(d.path);
  EXPECT_EQ(m.weights->config.scaling.kind, rope_scaling_kind::linear);
  const rope_table t = rope_frequencies(m.weights->config, 0);
  EXPECT_NEAR(t.inv_freq[1], std::pow(500000.0, -2.0 / m.weights->config.rope_dims) / 4, 1e-9);
}

TEST(hf_model_tiny, refusals_name_the_problem) {
  tiny::temp_dir d("refuse");
  auto expect_refused = [&](const std::string& fragment) {
    const std::string msg = tiny::load_error_of(d.path);
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message: '" << msg << "'";
    tiny::write_model(d.path);  // restore for the next case
  };
  tiny::write_model(d.path);
  ASSERT_EQ(tiny::load_error_of(d.path), "");

  tiny::write_text(d.path / "config.json", tiny::config_json("GPT2LMHeadModel", false));
  expect_refused("architecture 'GPT2LMHeadModel' is not supported");
  // Qwen2 checkpoints carry Q/K/V biases.
  tiny::write_text(d.path / "config.json", tiny::config_json("Qwen2ForCausalLM", false));
  auto with_bias = tiny::llama_tensors("BF16", true);
  with_bias.push_back({"model.layers.0.self_attn.q_proj.bias", "BF16", {tiny::k_heads * tiny::k_head_dim}});
  tiny::write_safetensors(d.path / "model.safetensors", with_bias);
  expect_refused("tensor 'model.layers.0.self_attn.k_proj.bias' is missing");  // Qwen2 has all three
  tiny::write_text(d.path / "config.json", tiny::config_json("LlamaForCausalLM", false));
  tiny::write_safetensors(d.path / "model.safetensors", with_bias);
  expect_refused("is a bias this architecture does not have");
  tiny::write_text(d.path / "config.json", tiny::config_json("LlamaForCausalLM", false, ",\"attention_bias\":true"));
  expect_refused("attention_bias");
  tiny::write_text(d.path / "config.json",
                   tiny::config_json("LlamaForCausalLM", false, ",\"rope_scaling\":{\"rope_type\":\"llama3\"}"));
  expect_refused("llama3 RoPE scaling without original_max_position_embeddings");
  tiny::write_text(d.path / "config.json",
                   tiny::config_json("LlamaForCausalLM", false, ",\"rope_scaling\":{\"rope_type\":\"ntk-by-parts\"}"));
  expect_refused("RoPE scaling 'ntk-by-parts' is not supported");
  std::string gelu = tiny::config_json("LlamaForCausalLM", false);
  gelu.replace(gelu.find("\"silu\""), 6, "\"gelu\"");
  tiny::write_text(d.path / "config.json", gelu);
  expect_refused("hidden_act 'gelu' is not supported");
  auto f64 = tiny::llama_tensors("BF16", true);
  f64[1].dtype = "F64";
  tiny::write_safetensors(d.path / "model.safetensors", f64);
  expect_refused("dtype F64; only F32, F16 and BF16");
  auto wrong_shape = tiny::llama_tensors("BF16", true);
  wrong_shape[2].shape = {3, 3};
  tiny::write_safetensors(d.path / "model.safetensors", wrong_shape);
  expect_refused("has shape [3, 3], expected [8, 8]");
  fs::remove(d.path / "model.safetensors");
  expect_refused("no model.safetensors");
  tiny::write_text(d.path / "tokenizer.json", R"({"model":{"type":"Unigram","vocab":[]}})");
  expect_refused("tokenizer model 'Unigram' is not supported");
  tiny::write_text(d.path / "tokenizer.json", "{\"model\": ");
  expect_refused("tokenizer.json: invalid JSON");
}

}  // namespace
}  // namespace tessera
