// Hugging Face checkpoint directories -> model_weights + vocab_data.
// Key and tensor names follow transformers' LlamaConfig / LlamaForCausalLM (models/llama/), the
// tokenizer.json layout is the `tokenizers` library's serialization (model, added_tokens,
// pre_tokenizer, post_processor), and sharded checkpoints follow model.safetensors.index.json
// ("weight_map": tensor name -> shard file).
#include "engine/model/hf_model.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "engine/base/error.hpp"
#include "engine/model/hf_json.hpp"
#include "engine/model/safetensors.hpp"

namespace tessera {

namespace fs = std::filesystem;
namespace sj = simdjson;
using namespace hf_json;  // NOLINT: this file is the JSON reader's main user

namespace {

// What transformers' rope_scaling / rope_parameters may say without changing the math.
void check_rope_type(const json_file& f, sj::dom::object cfg, std::string_view key) {
  const auto e = field(cfg, key);
  if (!e) return;
  sj::dom::object o;
  if (e->get_object().get(o)) f.fail("'" + std::string(key) + "' is not an object");
  std::optional<std::string> type = string_field(f, o, "rope_type");
  if (!type) type = string_field(f, o, "type");
  if (type && *type != "default") {
    f.fail("RoPE scaling '" + *type + "' (" + std::string(key) + ") is not supported");
  }
}

}  // namespace

bool is_hf_model_dir(const fs::path& dir) {
  std::error_code ec;
  // config.json present as anything (a FIFO, a directory, ...) makes this a model directory whose
  // loading then fails naming the file (load_json refuses non-regular files) rather than one
  // reported as "without config.json".
  return fs::is_directory(dir, ec) && fs::exists(dir / "config.json", ec);
}

model_config read_hf_config(const fs::path& dir, std::vector<std::string>* warnings) {
  const auto f = load_json(dir / "config.json");
  const sj::dom::object cfg = f->object();

  // Architectures whose checkpoints are LLaMA with different names (Mistral: same layout plus a
  // sliding window; Qwen2: LLaMA with Q/K/V biases, which we refuse when present).
  static const std::set<std::string, std::less<>> k_supported = {"LlamaForCausalLM", "MistralForCausalLM",
                                                                 "Qwen2ForCausalLM"};
  std::string arch;
  if (const auto archs = field(cfg, "architectures")) {
    if (!archs->is_array()) f->fail("'architectures' is not a list");
    for (auto a : archs->get_array()) {
      std::string_view s;
      if (a.get_string().get(s)) f->fail("'architectures' holds a non-string");
      if (arch.empty()) arch = std::string(s);
      if (k_supported.contains(s)) {
        arch = std::string(s);
        break;
      }
    }
  }
  if (arch.empty()) {
    const auto type = string_field(*f, cfg, "model_type");
    if (type == "llama") arch = "LlamaForCausalLM";
    else if (type == "mistral") arch = "MistralForCausalLM";
    else if (type == "qwen2") arch = "Qwen2ForCausalLM";
    else f->fail("no 'architectures' and model_type '" + type.value_or("") + "' is not a LLaMA-family decoder");
  }
  if (!k_supported.contains(arch)) {
    f->fail("architecture '" + arch + "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  }

  model_config c;
  c.architecture = "llama";
  c.name = string_field(*f, cfg, "_name_or_path").value_or(string_field(*f, cfg, "_model_name_or_path").value_or(""));
  if (c.name.empty()) c.name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  c.num_layers = required_int32(*f, cfg, "num_hidden_layers");
  c.hidden_size = required_int32(*f, cfg, "hidden_size");
  c.intermediate_size = required_int32(*f, cfg, "intermediate_size");
  c.num_heads = required_int32(*f, cfg, "num_attention_heads");
  const auto kv = int_field(*f, cfg, "num_key_value_heads");
  c.num_kv_heads = kv ? positive_int32(*f, "num_key_value_heads", *kv) : c.num_heads;
  if (const auto hd = int_field(*f, cfg, "head_dim")) {
    c.head_dim = positive_int32(*f, "head_dim", *hd);
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      f->fail("hidden_size " + std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads " +
              std::to_string(c.num_heads));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.vocab_size = required_int32(*f, cfg, "vocab_size");
  c.context_length = required_int32(*f, cfg, "max_position_embeddings");
  c.rms_norm_eps = static_cast<float>(float_field(*f, cfg, "rms_norm_eps").value_or(1e-6));
  c.tied_embeddings = bool_field(*f, cfg, "tie_word_embeddings").value_or(false);  // LlamaConfig's default

  // RoPE: theta at the top level (transformers < 5) or inside rope_parameters (>= 5).
  double theta = float_field(*f, cfg, "rope_theta").value_or(10000.0);
  if (const auto rp = field(cfg, "rope_parameters"); rp && rp->is_object()) {
    if (const auto t = float_field(*f, rp->get_object(), "rope_theta")) theta = *t;
  }
  if (!(theta > 0)) f->fail("rope_theta must be positive");
  c.rope_theta = static_cast<float>(theta);
  check_rope_type(*f, cfg, "rope_scaling");
  check_rope_type(*f, cfg, "rope_parameters");
  if (const auto factor = float_field(*f, cfg, "partial_rotary_factor"); factor && *factor != 1.0) {
    f->fail("partial_rotary_factor " + std::to_string(*factor) + " is not supported");
  }
  c.rope_dims = c.head_dim;
  c.rope = rope_style::half;  // HF keeps Q/K rows in rotate_half order (no llama.cpp permutation)

  if (const auto act = string_field(*f, cfg, "hidden_act"); act && *act != "silu") {
    f->fail("hidden_act '" + *act + "' is not supported (SwiGLU with silu only)");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (bool_field(*f, cfg, key).value_or(false)) f->fail(std::string(key) + " is true: biases are not supported");
  }
  // A sliding window only matters beyond its length: cap the context there instead of computing
  // attention the model was not trained with.
  const bool window_on = arch == "MistralForCausalLM" ||
                         (arch == "Qwen2ForCausalLM" && bool_field(*f, cfg, "use_sliding_window").value_or(false));
  if (const auto window = int_field(*f, cfg, "sliding_window"); window_on && window && *window > 0 &&
                                                                 *window < c.context_length) {
    note(warnings, f->name + ": sliding_window " + std::to_string(*window) + " < max_position_embeddings " +
                       std::to_string(c.context_length) + "; context capped at the window");
    c.context_length = static_cast<int32_t>(*window);
  }
  try {
    c.validate();
  } catch (const load_error& e) {
    f->fail(e.what());
  }
  return c;
}

// ---- weights --------------------------------------------------------------------------------------

namespace {

struct hf_storage {
  std::vector<std::shared_ptr<const safetensors_file>> files;
  std::vector<std::unique_ptr<std::byte[]>> realigned;  // copies of tensors stored misaligned
};

// Opens the checkpoint's safetensors files: the shards named by model.safetensors.index.json,
// else model.safetensors, else every *.safetensors in the directory.
void open_checkpoint(const fs::path& dir, hf_storage& storage,
                     std::map<std::string, const safetensors_tensor*>& by_name) {
  std::vector<fs::path> paths;
  std::map<std::string, std::string> weight_map;
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    const auto idx = load_json(index_path);
    const auto map = field(idx->object(), "weight_map");
    sj::dom::object m;
    if (!map || map->get_object().get(m)) idx->fail("'weight_map' is missing or not an object");
    std::set<std::string> shards;
    for (auto e : m) {
      std::string_view file;
      if (e.value.get_string().get(file)) idx->fail("weight_map entry '" + std::string(e.key) + "' is not a string");
      // A shard is a plain file name next to the index: never a path that leaves the directory.
      if (file.empty() || file.find('/') != std::string_view::npos || file.find('\\') != std::string_view::npos ||
          file == "." || file == "..") {
        idx->fail("weight_map names '" + std::string(file) + "', which is not a file name in the directory");
      }
      if (!weight_map.emplace(std::string(e.key), std::string(file)).second) {
        idx->fail("weight_map lists '" + std::string(e.key) + "' twice");
      }
      if (shards.insert(std::string(file)).second) paths.push_back(dir / std::string(file));
    }
    if (paths.empty()) idx->fail("weight_map is empty");
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    paths.push_back(dir / "model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") paths.push_back(e.path());
    }
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) {
      throw load_error(dir.string() + ": no model.safetensors, model.safetensors.index.json or *.safetensors file");
    }
  }
  std::map<std::string, std::string> shard_of;  // tensor name -> file name it was found in
  for (const auto& p : paths) {
    storage.files.push_back(safetensors_file::open(p));
    const auto& file = *storage.files.back();
    for (const auto& t : file.tensors()) {
      if (!by_name.emplace(t.name, &t).second) {
        throw load_error(file.name() + ": tensor '" + t.name + "' also appears in another shard");
      }
      shard_of.emplace(t.name, p.filename().string());
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (const auto it = shard_of.find(name); it == shard_of.end() || it->second != shard) {
      throw load_error(index_path.string() + ": weight_map puts '" + name + "' in " + shard + ", which lacks it");
    }
  }
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

class binder {
 public:
  binder(const fs::path& dir, hf_storage& storage, const std::map<std::string, const safetensors_tensor*>& by_name)
      : dir_(dir), storage_(storage), by_name_(by_name) {}

  bool has(const std::string& name) const { return by_name_.contains(name); }

  // HF linear weights are [out_features, in_features] row-major: rows = out, cols = in.
  weight_tensor bind(const std::string& name, int64_t rows, int64_t cols, bool one_d) {
    const auto it = by_name_.find(name);
    if (it == by_name_.end()) throw load_error(dir_.string() + ": tensor '" + name + "' is missing");
    const safetensors_tensor& t = *it->second;
    used_.insert(name);
    const std::vector<int64_t> want = one_d ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
    if (t.shape != want) {
      throw load_error(dir_.string() + ": tensor '" + name + "' has shape " + shape_string(t.shape) + ", expected " +
                       shape_string(want));
    }
    if (!t.supported) {
      throw load_error(dir_.string() + ": tensor '" + name + "' has dtype " + t.dtype +
                       "; only F32, F16 and BF16 are supported");
    }
    weight_tensor w;
    w.name = name;
    w.type = t.type;
    w.rows = rows;
    w.cols = cols;
    w.data = t.data;
    w.row_stride_bytes = row_bytes(t.type, cols);
    // safetensors only promises byte offsets; kernels read whole floats, so copy the rare tensor
    // whose start is not aligned to its element size.
    const auto align = static_cast<uintptr_t>(type_info(t.type).block_bytes);
    if (reinterpret_cast<uintptr_t>(t.data) % align != 0) {
      auto copy = std::make_unique<std::byte[]>(static_cast<size_t>(t.num_bytes));
      std::memcpy(copy.get(), t.data, static_cast<size_t>(t.num_bytes));
      w.data = copy.get();
      storage_.realigned.push_back(std::move(copy));
    }
    return w;
  }

  // Tensors the model does not use: biases change the math (refuse), the rest are reported.
  void check_unused(std::vector<std::string>* warnings) const {
    size_t ignored = 0;
    std::string first;
    for (const auto& [name, t] : by_name_) {
      if (used_.contains(name)) continue;
      if (name.ends_with(".bias")) {
        throw load_error(dir_.string() + ": tensor '" + name +
                         "' is a bias; checkpoints with biases (e.g. Qwen2 attention) are not supported");
      }
      if (name.ends_with("rotary_emb.inv_freq") || name == "lm_head.weight") continue;  // recomputed / tied
      if (ignored++ == 0) first = name;
    }
    if (ignored > 0) {
      note(warnings,
           dir_.string() + ": ignored " + std::to_string(ignored) + " unknown tensor(s), e.g. '" + first + "'");
    }
  }

 private:
  const fs::path& dir_;
  hf_storage& storage_;
  const std::map<std::string, const safetensors_tensor*>& by_name_;
  std::set<std::string> used_;
};

}  // namespace

std::shared_ptr<const model_weights> load_hf_weights(const fs::path& dir, const model_config& config,
                                                     std::vector<std::string>* warnings) {
  auto storage = std::make_shared<hf_storage>();
  std::map<std::string, const safetensors_tensor*> by_name;
  open_checkpoint(dir, *storage, by_name);
  binder b(dir, *storage, by_name);

  auto w = std::make_shared<model_weights>();
  w->config = config;
  model_config& c = w->config;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t ffn = c.intermediate_size;

  w->token_embedding = b.bind("model.embed_tokens.weight", c.vocab_size, hidden, false);
  w->output_norm = b.bind("model.norm.weight", 1, hidden, true);
  if (!c.tied_embeddings && b.has("lm_head.weight")) {
    w->output = b.bind("lm_head.weight", c.vocab_size, hidden, false);
  } else {
    if (!c.tied_embeddings) {
      note(warnings, dir.string() + ": no lm_head.weight although tie_word_embeddings is false; using the embedding");
    }
    w->output = w->token_embedding;  // tied: transformers ties lm_head to the embedding (and ignores lm_head)
    c.tied_embeddings = true;
  }
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layer_weights& l = w->layers[static_cast<size_t>(i)];
    l.attn_norm = b.bind(p + "input_layernorm.weight", 1, hidden, true);
    l.wq = b.bind(p + "self_attn.q_proj.weight", q_dim, hidden, false);
    l.wk = b.bind(p + "self_attn.k_proj.weight", kv_dim, hidden, false);
    l.wv = b.bind(p + "self_attn.v_proj.weight", kv_dim, hidden, false);
    l.wo = b.bind(p + "self_attn.o_proj.weight", hidden, q_dim, false);
    l.ffn_norm = b.bind(p + "post_attention_layernorm.weight", 1, hidden, true);
    l.w_gate = b.bind(p + "mlp.gate_proj.weight", ffn, hidden, false);
    l.w_up = b.bind(p + "mlp.up_proj.weight", ffn, hidden, false);
    l.w_down = b.bind(p + "mlp.down_proj.weight", hidden, ffn, false);
  }
  b.check_unused(warnings);
  w->storage = std::move(storage);  // the mappings (and realigned copies) outlive every view above
  return w;
}

}  // namespace tessera
