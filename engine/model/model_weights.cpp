// Binding a GGUF file to model_config + model_weights.
// Metadata keys and tensor names follow llama.cpp's conventions (gguf-py/gguf/constants.py: LLM_KV_*
// and MODEL_TENSOR names per MODEL_ARCH; src/llama-model.cpp and src/models/<arch>.cpp for how
// llama.cpp reads them, which is the meaning the converter writes them with).
#include "engine/model/model_weights.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/rope.hpp"

namespace tessera {
namespace {

int32_t to_int32(const std::string& key, int64_t v) {
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    throw load_error("GGUF: " + key + " = " + std::to_string(v) + " is out of range (1..2^31-1)");
  }
  return static_cast<int32_t>(v);
}

int32_t required_int(const gguf_file& f, const std::string& key) {
  const std::optional<int64_t> v = f.get_int(key);
  if (!v) throw load_error("GGUF: required key '" + key + "' is missing");
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
    throw load_error("GGUF: " + key + " = " + std::to_string(*v) + " is not a finite float");
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
  if (t == nullptr) throw load_error("GGUF: tensor '" + name + "' is missing");
  const std::string expected =
      one_d ? "[" + std::to_string(cols) + "]" : "[" + std::to_string(cols) + ", " + std::to_string(rows) + "]";
  const size_t want_dims = one_d ? 1 : 2;
  bool ok = t->dims.size() >= want_dims && t->dims[0] == cols && (one_d || t->dims[1] == rows);
  for (size_t i = want_dims; ok && i < t->dims.size(); ++i) ok = t->dims[i] == 1;
  if (!ok) {
    throw load_error("GGUF: tensor '" + name + "' has shape " + shape_string(t->dims) + ", expected " + expected +
                     " (ne0 first)");
  }
  const ggml_type_info& info = type_info(t->type);
  if (!info.can_dequantize) {
    throw load_error("GGUF: tensor '" + name + "' has type " + std::string(info.name) +
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

// One 1-D f32-decodable tensor as floats (rope factor tables).
std::vector<float> read_floats(const gguf_file& f, const std::string& name, int64_t n) {
  const weight_tensor t = bind(f, name, 1, n, true);
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

// A view of rows [begin, begin + rows) of a fused matrix (Phi-3's attn_qkv and gate|up ffn_up).
weight_tensor row_slice(const weight_tensor& w, int64_t begin, int64_t rows, const std::string& name) {
  weight_tensor v = w;
  v.name = name;
  v.rows = rows;
  v.data = w.data + begin * w.row_stride_bytes;
  return v;
}

// What the architecture's GGUF files look like (llama.cpp: llama_model_rope_type, load_arch_hparams).
struct gguf_arch {
  model_arch arch;
  rope_style rope;  // LLAMA_ROPE_TYPE_NORM (converter-permuted Q/K) or NEOX
};

std::optional<gguf_arch> find_arch(std::string_view name) {
  if (name == "llama") return gguf_arch{model_arch::llama, rope_style::interleaved};
  if (name == "qwen2") return gguf_arch{model_arch::qwen2, rope_style::half};
  if (name == "qwen3") return gguf_arch{model_arch::qwen3, rope_style::half};
  if (name == "gemma2") return gguf_arch{model_arch::gemma2, rope_style::half};
  if (name == "gemma3") return gguf_arch{model_arch::gemma3, rope_style::half};
  if (name == "phi3") return gguf_arch{model_arch::phi3, rope_style::half};
  return std::nullopt;
}

// rope.scaling.* (llama.cpp llama_model::load_hparams: LLM_KV_ROPE_SCALING_*), plus the factor tensors.
void read_rope_scaling(const gguf_file& f, const std::string& a, model_config& c) {
  rope_scaling& s = c.scaling;
  const std::string type = f.get_string(a + ".rope.scaling.type").value_or("none");
  // llama.cpp's older files state a linear factor without a type (rope.scale_linear).
  const double linear = f.get_float(a + ".rope.scale_linear").value_or(1.0);
  const double factor = f.get_float(a + ".rope.scaling.factor").value_or(linear);
  s.original_context = optional_int(f, a + ".rope.scaling.original_context_length", 0);
  const bool has_freqs = f.tensor("rope_freqs.weight") != nullptr;
  const bool has_long = f.tensor("rope_factors_long.weight") != nullptr;
  if (type == "none" && factor != 0.0 && factor != 1.0) {
    throw load_error("GGUF: rope scaling factor " + std::to_string(factor) +
                     " without a rope scaling type is not supported");
  }
  if (type == "linear") {
    s.kind = rope_scaling_kind::linear;
    s.factor = static_cast<float>(factor);
  } else if (type == "yarn") {
    s.kind = rope_scaling_kind::yarn;
    s.factor = static_cast<float>(factor);
    s.beta_fast = optional_float(f, a + ".rope.scaling.yarn_beta_fast", 32.0f);
    s.beta_slow = optional_float(f, a + ".rope.scaling.yarn_beta_slow", 1.0f);
    if (const auto ext = f.get_float(a + ".rope.scaling.yarn_ext_factor"); ext && *ext != 1.0 && *ext >= 0.0) {
      throw load_error("GGUF: yarn_ext_factor " + std::to_string(*ext) + " (a partial YaRN ramp) is not supported");
    }
    // llama.cpp: mscale = yarn_attn_factor * (1 + 0.1 ln(factor)) (ggml rope_yarn, llama-graph's attn_factor).
    s.attention_factor = optional_float(f, a + ".rope.scaling.attn_factor", 1.0f) *
                         optional_float(f, a + ".rope.scaling.yarn_attn_factor", 1.0f) *
                         yarn_default_attention_factor(s.factor);
    if (s.original_context <= 0) throw load_error("GGUF: yarn rope scaling without original_context_length");
    s.freq_factors = yarn_freq_factors(c.rope_theta, c.rope_dims, s);
  } else if (type == "longrope" || has_long) {
    // Phi-3: llama.cpp picks the long factors when the context exceeds the original one
    // (llama_model::get_rope_factors); our context is the trained one, so the same test.
    s.kind = rope_scaling_kind::longrope;
    if (!has_long || f.tensor("rope_factors_short.weight") == nullptr) {
      throw load_error("GGUF: longrope rope scaling needs rope_factors_long.weight and rope_factors_short.weight");
    }
    if (s.original_context <= 0) throw load_error("GGUF: longrope rope scaling without original_context_length");
    const bool use_long = c.context_length > s.original_context;
    s.factor = static_cast<float>(c.context_length) / static_cast<float>(s.original_context);
    s.freq_factors =
        read_floats(f, use_long ? "rope_factors_long.weight" : "rope_factors_short.weight", c.rope_dims / 2);
    s.attention_factor = optional_float(f, a + ".rope.scaling.attn_factor", 1.0f);
  } else if (type != "none") {
    throw load_error("GGUF: rope scaling '" + type +
                     "' is not supported (none, linear, yarn, longrope; llama3 via rope_freqs.weight)");
  }
  if (has_freqs) {
    // Llama 3.1+: per-pair divisors the converter computed from rope_scaling (llama3 type).
    if (s.kind != rope_scaling_kind::none) {
      throw load_error("GGUF: rope_freqs.weight together with rope scaling '" + type + "' is not supported");
    }
    s.kind = rope_scaling_kind::llama3;
    s.freq_factors = read_floats(f, "rope_freqs.weight", c.rope_dims / 2);
    s.factor = *std::max_element(s.freq_factors.begin(), s.freq_factors.end());
  }
}

}  // namespace

model_config read_gguf_config(const gguf_file& f) {
  const std::optional<std::string> arch_name = f.get_string("general.architecture");
  if (!arch_name) throw load_error("GGUF: general.architecture is missing");
  const std::optional<gguf_arch> arch = find_arch(*arch_name);
  if (!arch) {
    throw load_error("GGUF: architecture '" + *arch_name +
                     "' is not supported (llama, qwen2, qwen3, gemma2, gemma3, phi3)");
  }
  const std::string a = *arch_name;
  model_config c;
  c.architecture = arch->arch;
  c.rope = arch->rope;
  c.name = f.get_string("general.name").value_or("");
  c.num_layers = required_int(f, a + ".block_count");
  c.hidden_size = required_int(f, a + ".embedding_length");
  c.intermediate_size = required_int(f, a + ".feed_forward_length");
  c.num_heads = required_int(f, a + ".attention.head_count");
  c.num_kv_heads = optional_int(f, a + ".attention.head_count_kv", c.num_heads);
  c.context_length = required_int(f, a + ".context_length");
  const bool own_head_dim = c.architecture == model_arch::qwen3 || c.architecture == model_arch::gemma2 ||
                            c.architecture == model_arch::gemma3;
  if (own_head_dim && f.get_int(a + ".attention.key_length")) {
    c.head_dim = required_int(f, a + ".attention.key_length");
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      throw load_error("GGUF " + a + ": embedding_length " + std::to_string(c.hidden_size) +
                       " is not a multiple of head_count " + std::to_string(c.num_heads));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  // Files that state the per-head sizes must agree with the head size we use (one for K and V).
  for (const std::string& key : {a + ".attention.key_length", a + ".attention.value_length"}) {
    if (const auto v = f.get_int(key); v && *v != c.head_dim) {
      throw load_error("GGUF " + a + ": " + key + " = " + std::to_string(*v) + " differs from " +
                       (own_head_dim ? "attention.key_length" : "embedding_length / head_count") + " = " +
                       std::to_string(c.head_dim) + " (unsupported)");
    }
  }
  c.rope_dims = optional_int(f, a + ".rope.dimension_count", c.head_dim);
  c.rope_theta = optional_float(f, a + ".rope.freq_base", 10000.0f);
  c.rms_norm_eps = optional_float(f, a + ".attention.layer_norm_rms_epsilon", 1e-5f);

  if (const auto vocab = f.get_int(a + ".vocab_size")) {
    c.vocab_size = to_int32(a + ".vocab_size", *vocab);
  } else if (const auto* tokens = f.get_string_array("tokenizer.ggml.tokens")) {
    c.vocab_size = to_int32("length of tokenizer.ggml.tokens", static_cast<int64_t>(tokens->size()));
  } else {
    throw load_error("GGUF: vocabulary size unknown (neither " + a + ".vocab_size nor tokenizer.ggml.tokens)");
  }

  c.tied_embeddings = f.tensor("output.weight") == nullptr;  // the LM head reuses token_embd
  model_features& ft = c.features;
  ft.qkv_bias = f.tensor("blk.0.attn_q.bias") != nullptr || f.tensor("blk.0.attn_qkv.bias") != nullptr;
  ft.qk_norm = f.tensor("blk.0.attn_q_norm.weight") != nullptr;
  const bool gemma = c.architecture == model_arch::gemma2 || c.architecture == model_arch::gemma3;
  if (gemma) {
    // The converter stores Gemma's norm weights as 1 + w (conversion/gemma.py), so plain RMSNorm here.
    ft.activation = ffn_activation::gelu_tanh;
    ft.post_norms = true;
    ft.scale_embedding = true;
    ft.final_softcap.cap = optional_float(f, a + ".final_logit_softcapping", 0.0f);
    if (c.architecture == model_arch::gemma2) {
      ft.attn_softcap.cap = optional_float(f, a + ".attn_logit_softcapping", 0.0f);
    }
    // llama.cpp (models/gemma2.cpp, gemma3.cpp, after gemma_pytorch's config): 1/sqrt(hidden / heads) for
    // the 27B models (query_pre_attn_scalar 144), 1/sqrt(head_dim) otherwise. GGUF has no key for it.
    const bool is_27b = (c.architecture == model_arch::gemma2 && c.num_layers == 46) ||
                        (c.architecture == model_arch::gemma3 && c.num_layers == 62);
    ft.attention_scale = 1.0f / std::sqrt(static_cast<float>(is_27b ? c.hidden_size / c.num_heads : c.head_dim));
    // Interleaved local (sliding) and global layers: llama.cpp's set_swa_pattern(n, dense_first = false)
    // makes layer i local unless i % n == n - 1; n = 2 (Gemma 2) or 6 (Gemma 3) unless the file says.
    const int32_t window =
        optional_int(f, a + ".attention.sliding_window", c.architecture == model_arch::gemma2 ? 4096 : 0);
    if (window > 0) {
      const std::string pattern_key = a + ".attention.sliding_window_pattern";
      const gguf_value* pv = f.find(pattern_key);
      const std::vector<int64_t>* per_layer =
          pv && pv->type == gguf_value_type::array ? f.get_int_array(pattern_key) : nullptr;
      if (per_layer && static_cast<int32_t>(per_layer->size()) != c.num_layers) {
        throw load_error("GGUF " + a + ": " + pattern_key + " has " + std::to_string(per_layer->size()) +
                         " entries for " + std::to_string(c.num_layers) + " layers");
      }
      const int64_t pattern =
          per_layer ? 0 : f.get_int(pattern_key).value_or(c.architecture == model_arch::gemma2 ? 2 : 6);
      if (pattern < 0) throw load_error("GGUF " + a + ": " + pattern_key + " is negative");
      // Without rope.freq_base_swa (older converters, e.g. the PyPI Gemma 3 270M file), llama.cpp's
      // local layers use llama_hparams' default 10000 for Gemma 3 (models/gemma3.cpp reads the key only
      // when present) but the global base for Gemma 2 (models/gemma2.cpp copies it). Falling back to the
      // global 1e6 on Gemma 3 ran its local layers with the wrong rotary frequencies.
      const float local_theta =
          optional_float(f, a + ".rope.freq_base_swa", c.architecture == model_arch::gemma3 ? 10000.0f : c.rope_theta);
      c.layers.resize(static_cast<size_t>(c.num_layers));
      for (int32_t i = 0; i < c.num_layers; ++i) {
        // A pattern of 0 makes every layer local (llama_hparams::set_swa_pattern).
        const bool local =
            per_layer ? (*per_layer)[static_cast<size_t>(i)] != 0 : pattern == 0 || i % pattern < pattern - 1;
        if (local) {
          // Gemma 3's local layers: their own base and no scaling (llama.cpp rope_freq_scale_train_swa = 1).
          c.layers[static_cast<size_t>(i)] = {window, local_theta, c.architecture == model_arch::gemma2};
        }
      }
    }
  }
  // Other architectures' attention.sliding_window (Phi-3, Qwen2) is run as full attention, as llama.cpp
  // does (models/phi3.cpp: "TODO: fix conversion scripts to correctly populate n_swa"): the same model.
  read_rope_scaling(f, a, c);
  c.validate();
  return c;
}

std::shared_ptr<const model_weights> load_gguf_weights(std::shared_ptr<const gguf_file> file) {
  if (!file) throw load_error("load_gguf_weights: no file");
  const gguf_file& f = *file;
  auto w = std::make_shared<model_weights>();
  w->config = read_gguf_config(f);
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
  const model_features& ft = c.features;
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    layer_weights& l = w->layers[static_cast<size_t>(i)];
    l.attn_norm = bind(f, p + "attn_norm.weight", 1, hidden, true);
    if (f.tensor(p + "attn_qkv.weight") != nullptr) {
      // Fused Q|K|V rows (Phi-3): views of one matrix, so quantized blocks stay whole.
      const weight_tensor qkv = bind(f, p + "attn_qkv.weight", q_dim + 2 * kv_dim, hidden, false);
      l.wq = row_slice(qkv, 0, q_dim, qkv.name + "[q]");
      l.wk = row_slice(qkv, q_dim, kv_dim, qkv.name + "[k]");
      l.wv = row_slice(qkv, q_dim + kv_dim, kv_dim, qkv.name + "[v]");
    } else {
      l.wq = bind(f, p + "attn_q.weight", q_dim, hidden, false);
      l.wk = bind(f, p + "attn_k.weight", kv_dim, hidden, false);
      l.wv = bind(f, p + "attn_v.weight", kv_dim, hidden, false);
    }
    if (ft.qkv_bias) {
      if (f.tensor(p + "attn_qkv.bias") != nullptr) {
        const weight_tensor b = bind(f, p + "attn_qkv.bias", 1, q_dim + 2 * kv_dim, true);
        auto part = [&](int64_t begin, int64_t n, const char* what) {
          weight_tensor v = b;
          v.name = b.name + what;
          v.cols = n;
          v.row_stride_bytes = row_bytes(b.type, n);
          v.data = b.data + row_bytes(b.type, begin);
          return v;
        };
        l.bq = part(0, q_dim, "[q]");
        l.bk = part(q_dim, kv_dim, "[k]");
        l.bv = part(q_dim + kv_dim, kv_dim, "[v]");
      } else {
        l.bq = bind(f, p + "attn_q.bias", 1, q_dim, true);
        l.bk = bind(f, p + "attn_k.bias", 1, kv_dim, true);
        l.bv = bind(f, p + "attn_v.bias", 1, kv_dim, true);
      }
    }
    if (ft.qk_norm) {
      l.q_norm = bind(f, p + "attn_q_norm.weight", 1, c.head_dim, true);
      l.k_norm = bind(f, p + "attn_k_norm.weight", 1, c.head_dim, true);
    }
    l.wo = bind(f, p + "attn_output.weight", hidden, q_dim, false);
    l.ffn_norm = bind(f, p + "ffn_norm.weight", 1, hidden, true);
    if (f.tensor(p + "ffn_gate.weight") == nullptr && c.architecture == model_arch::phi3) {
      // Phi-3 keeps gate|up fused in ffn_up (llama.cpp LLM_FFN_SWIGLU on the halves: gate first).
      const weight_tensor gu = bind(f, p + "ffn_up.weight", 2 * ffn, hidden, false);
      l.w_gate = row_slice(gu, 0, ffn, gu.name + "[gate]");
      l.w_up = row_slice(gu, ffn, ffn, gu.name + "[up]");
    } else {
      l.w_gate = bind(f, p + "ffn_gate.weight", ffn, hidden, false);
      l.w_up = bind(f, p + "ffn_up.weight", ffn, hidden, false);
    }
    l.w_down = bind(f, p + "ffn_down.weight", hidden, ffn, false);
    if (ft.post_norms) {
      l.post_attn_norm = bind(f, p + "post_attention_norm.weight", 1, hidden, true);
      l.post_ffn_norm = bind(f, p + "post_ffw_norm.weight", 1, hidden, true);
    }
  }
  w->storage = std::move(file);  // the mapping outlives every view above
  return w;
}

}  // namespace tessera
