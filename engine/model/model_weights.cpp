// Binding a LLaMA GGUF file to model_config + model_weights.
// Metadata keys and tensor names follow llama.cpp's conventions (gguf-py/gguf/constants.py:
// LLM_KV_* and MODEL_TENSOR names for MODEL_ARCH.LLAMA).
#include "engine/model/model_weights.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"

namespace tessera {
namespace {

int32_t to_int32(const std::string& key, int64_t v) {
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    throw load_error("GGUF llama: " + key + " = " + std::to_string(v) + " is out of range (1..2^31-1)");
  }
  return static_cast<int32_t>(v);
}

int32_t required_int(const gguf_file& f, const std::string& key) {
  const std::optional<int64_t> v = f.get_int(key);
  if (!v) throw load_error("GGUF llama: required key '" + key + "' is missing");
  return to_int32(key, *v);
}

int32_t optional_int(const gguf_file& f, const std::string& key, int32_t fallback) {
  const std::optional<int64_t> v = f.get_int(key);
  return v ? to_int32(key, *v) : fallback;
}

float optional_float(const gguf_file& f, const std::string& key, float fallback) {
  const std::optional<double> v = f.get_float(key);
  if (!v) return fallback;
  if (!std::isfinite(*v) || std::fabs(*v) > std::numeric_limits<float>::max()) {
    throw load_error("GGUF llama: " + key + " = " + std::to_string(*v) + " is not a finite float");
  }
  return static_cast<float>(*v);
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Binds tensor `name` as a [rows, cols] matrix (GGUF dims are ne0 = cols, ne1 = rows); a 1-D weight
// is rows == 1. Trailing dimensions of 1 are accepted (some writers keep them).
weight_tensor bind(const gguf_file& f, const std::string& name, int64_t rows, int64_t cols, bool one_d) {
  const gguf_tensor_info* t = f.tensor(name);
  if (t == nullptr) throw load_error("GGUF llama: tensor '" + name + "' is missing");
  const std::string expected = one_d ? "[" + std::to_string(cols) + "]"
                                     : "[" + std::to_string(cols) + ", " + std::to_string(rows) + "]";
  const size_t want_dims = one_d ? 1 : 2;
  bool ok = t->dims.size() >= want_dims && t->dims[0] == cols && (one_d || t->dims[1] == rows);
  for (size_t i = want_dims; ok && i < t->dims.size(); ++i) ok = t->dims[i] == 1;
  if (!ok) {
    throw load_error("GGUF llama: tensor '" + name + "' has shape " + shape_string(t->dims) + ", expected " +
                     expected + " (ne0 first)");
  }
  const ggml_type_info& info = type_info(t->type);
  if (!info.can_dequantize) {
    throw load_error("GGUF llama: tensor '" + name + "' has type " + std::string(info.name) +
                     ", which this build cannot compute with");
  }
  weight_tensor w;
  w.name = name;
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.data = t->data;
  w.row_stride_bytes = row_bytes(t->type, cols);  // the reader checked num_bytes == this * rows
  return w;
}

}  // namespace

model_config read_llama_config(const gguf_file& f) {
  const std::optional<std::string> arch = f.get_string("general.architecture");
  if (!arch) throw load_error("GGUF: general.architecture is missing");
  if (*arch != "llama") {
    throw load_error("GGUF: architecture '" + *arch + "' is not supported (only 'llama')");
  }
  model_config c;
  c.architecture = *arch;
  c.name = f.get_string("general.name").value_or("");
  c.num_layers = required_int(f, "llama.block_count");
  c.hidden_size = required_int(f, "llama.embedding_length");
  c.intermediate_size = required_int(f, "llama.feed_forward_length");
  c.num_heads = required_int(f, "llama.attention.head_count");
  c.num_kv_heads = optional_int(f, "llama.attention.head_count_kv", c.num_heads);
  c.context_length = required_int(f, "llama.context_length");
  if (c.hidden_size % c.num_heads != 0) {
    throw load_error("GGUF llama: embedding_length " + std::to_string(c.hidden_size) +
                     " is not a multiple of head_count " + std::to_string(c.num_heads));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  // Files that state the per-head sizes must agree with hidden / heads (we have no separate field).
  for (const char* key : {"llama.attention.key_length", "llama.attention.value_length"}) {
    if (const auto v = f.get_int(key); v && *v != c.head_dim) {
      throw load_error("GGUF llama: " + std::string(key) + " = " + std::to_string(*v) +
                       " differs from embedding_length / head_count = " + std::to_string(c.head_dim) +
                       " (unsupported)");
    }
  }
  c.rope_dims = optional_int(f, "llama.rope.dimension_count", c.head_dim);
  c.rope_theta = optional_float(f, "llama.rope.freq_base", 10000.0f);
  c.rms_norm_eps = optional_float(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  c.rope = rope_style::interleaved;  // llama.cpp's converter permutes Q/K rows for this pairing

  // RoPE scaling changes the math; refusing it is better than silently wrong outputs.
  if (const auto scaling = f.get_string("llama.rope.scaling.type"); scaling && *scaling != "none") {
    throw load_error("GGUF llama: rope scaling '" + *scaling + "' is not supported");
  }
  if (const auto factor = f.get_float("llama.rope.scaling.factor"); factor && *factor != 0.0 && *factor != 1.0) {
    throw load_error("GGUF llama: rope scaling factor " + std::to_string(*factor) + " is not supported");
  }
  if (f.tensor("rope_freqs.weight") != nullptr) {
    throw load_error("GGUF llama: tensor 'rope_freqs.weight' (llama-3 style RoPE frequency factors) is not supported");
  }

  if (const auto vocab = f.get_int("llama.vocab_size")) {
    c.vocab_size = to_int32("llama.vocab_size", *vocab);
  } else if (const auto* tokens = f.get_string_array("tokenizer.ggml.tokens")) {
    c.vocab_size = to_int32("length of tokenizer.ggml.tokens", static_cast<int64_t>(tokens->size()));
  } else {
    throw load_error("GGUF llama: vocabulary size unknown (neither llama.vocab_size nor tokenizer.ggml.tokens)");
  }
  c.validate();
  return c;
}

std::shared_ptr<const model_weights> load_gguf_weights(std::shared_ptr<const gguf_file> file) {
  if (!file) throw load_error("load_gguf_weights: no file");
  const gguf_file& f = *file;
  auto w = std::make_shared<model_weights>();
  w->config = read_llama_config(f);
  model_config& c = w->config;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t ffn = c.intermediate_size;

  w->token_embedding = bind(f, "token_embd.weight", c.vocab_size, hidden, false);
  w->output_norm = bind(f, "output_norm.weight", 1, hidden, true);
  if (f.tensor("output.weight") != nullptr) {
    w->output = bind(f, "output.weight", c.vocab_size, hidden, false);
    c.tied_embeddings = false;
  } else {
    w->output = w->token_embedding;  // tied: the LM head reuses the embedding matrix
    c.tied_embeddings = true;
  }
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    layer_weights& l = w->layers[static_cast<size_t>(i)];
    l.attn_norm = bind(f, p + "attn_norm.weight", 1, hidden, true);
    l.wq = bind(f, p + "attn_q.weight", q_dim, hidden, false);
    l.wk = bind(f, p + "attn_k.weight", kv_dim, hidden, false);
    l.wv = bind(f, p + "attn_v.weight", kv_dim, hidden, false);
    l.wo = bind(f, p + "attn_output.weight", hidden, q_dim, false);
    l.ffn_norm = bind(f, p + "ffn_norm.weight", 1, hidden, true);
    l.w_gate = bind(f, p + "ffn_gate.weight", ffn, hidden, false);
    l.w_up = bind(f, p + "ffn_up.weight", ffn, hidden, false);
    l.w_down = bind(f, p + "ffn_down.weight", hidden, ffn, false);
  }
  w->storage = std::move(file);  // the mapping outlives every view above
  return w;
}

}  // namespace tessera
