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
#include "engine/model/rope.hpp"
#include "engine/model/safetensors.hpp"

namespace tessera {

namespace fs = std::filesystem;
namespace sj = simdjson;
using namespace hf_json;  // NOLINT: this file is the JSON reader's main user

namespace {

struct hf_arch {
  std::string_view class_name;  // config.json "architectures"
  std::string_view model_type;  // config.json "model_type"
  model_arch arch;
};

// transformers' modeling classes these loaders follow (models/<name>/modeling_<name>.py).
constexpr hf_arch k_archs[] = {
    {"LlamaForCausalLM", "llama", model_arch::llama},    {"MistralForCausalLM", "mistral", model_arch::mistral},
    {"Qwen2ForCausalLM", "qwen2", model_arch::qwen2},    {"Qwen3ForCausalLM", "qwen3", model_arch::qwen3},
    {"Gemma2ForCausalLM", "gemma2", model_arch::gemma2}, {"Gemma3ForCausalLM", "gemma3_text", model_arch::gemma3},
    {"Phi3ForCausalLM", "phi3", model_arch::phi3},
};

const hf_arch* find_arch_class(std::string_view name) {
  for (const hf_arch& a : k_archs) {
    if (a.class_name == name) return &a;
  }
  return nullptr;
}

std::string supported_classes() {
  std::string s;
  for (const hf_arch& a : k_archs) s += (s.empty() ? "" : ", ") + std::string(a.class_name);
  return s;
}

// A rope_scaling / rope_parameters object (transformers < 5 / >= 5; modeling_rope_utils.py).
struct rope_params {
  std::optional<double> theta;
  std::optional<std::string> type;
  std::optional<sj::dom::object> obj;
};

rope_params read_rope_object(const json_file& f, sj::dom::object o) {
  rope_params r;
  r.obj = o;
  r.theta = float_field(f, o, "rope_theta");
  r.type = string_field(f, o, "rope_type");
  if (!r.type) r.type = string_field(f, o, "type");
  return r;
}

std::vector<float> float_list(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  std::vector<float> out;
  if (!e) return out;
  if (!e->is_array()) f.fail("'" + std::string(key) + "' is not a list");
  for (auto v : e->get_array()) {
    const std::optional<double> d = v.is_double()  ? std::optional<double>(v.get_double().value())
                                    : v.is_int64() ? std::optional<double>(double(v.get_int64().value()))
                                                   : std::nullopt;
    if (!d) f.fail("'" + std::string(key) + "' holds a non-number");
    out.push_back(static_cast<float>(*d));
  }
  return out;
}

// Fills config.scaling from one rope_scaling object. `original` is the config's
// original_max_position_embeddings (top level) when the object lacks one.
void read_rope_scaling(const json_file& f, const rope_params& rp, model_config& c, std::optional<int64_t> original,
                       std::vector<std::string>* warnings) {
  if (!rp.type || *rp.type == "default") return;
  const std::string& type = *rp.type;
  const sj::dom::object o = *rp.obj;
  rope_scaling& s = c.scaling;
  const auto factor = float_field(f, o, "factor");
  if (const auto orig = int_field(f, o, "original_max_position_embeddings")) original = orig;
  s.original_context = original ? positive_int32(f, "original_max_position_embeddings", *original) : 0;
  if (type == "linear") {
    if (!factor) f.fail("linear RoPE scaling without a factor");
    s.kind = rope_scaling_kind::linear;
    s.factor = static_cast<float>(*factor);
  } else if (type == "llama3") {
    s.kind = rope_scaling_kind::llama3;
    s.factor = static_cast<float>(factor.value_or(8.0));
    s.low_freq_factor = static_cast<float>(float_field(f, o, "low_freq_factor").value_or(1.0));
    s.high_freq_factor = static_cast<float>(float_field(f, o, "high_freq_factor").value_or(4.0));
    if (s.original_context <= 0) f.fail("llama3 RoPE scaling without original_max_position_embeddings");
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      f.fail("llama3 RoPE scaling needs high_freq_factor > low_freq_factor");
    }
    s.freq_factors = llama3_freq_factors(c.rope_theta, c.rope_dims, s);
  } else if (type == "yarn") {
    // transformers _compute_yarn_parameters (truncate = true): the original context is the config's
    // original_max_position_embeddings, else max_position_embeddings.
    s.kind = rope_scaling_kind::yarn;
    s.factor = static_cast<float>(factor.value_or(1.0));
    if (s.original_context <= 0) s.original_context = c.context_length;
    s.beta_fast = static_cast<float>(float_field(f, o, "beta_fast").value_or(32.0));
    s.beta_slow = static_cast<float>(float_field(f, o, "beta_slow").value_or(1.0));
    for (const char* key : {"mscale", "mscale_all_dim"}) {
      if (field(o, key)) f.fail(std::string("yarn RoPE scaling with '") + key + "' (DeepSeek style) is not supported");
    }
    if (const auto t = bool_field(f, o, "truncate"); t && !*t) {
      f.fail("yarn RoPE scaling with truncate = false is not supported");
    }
    const auto af = float_field(f, o, "attention_factor");
    s.attention_factor = af ? static_cast<float>(*af) : yarn_default_attention_factor(s.factor);
    s.freq_factors = yarn_freq_factors(c.rope_theta, c.rope_dims, s);
  } else if (type == "longrope" || type == "su") {
    // transformers _compute_longrope_parameters; the factor set is chosen once for the whole context like
    // llama.cpp does (long when the context exceeds the original one). transformers switches per
    // sequence length (longrope_frequency_update), which agrees for every sequence when the context
    // is the original one, and for sequences longer than the original one otherwise.
    s.kind = rope_scaling_kind::longrope;
    if (s.original_context <= 0) f.fail("longrope RoPE scaling without original_max_position_embeddings");
    const std::vector<float> long_f = float_list(f, o, "long_factor");
    const std::vector<float> short_f = float_list(f, o, "short_factor");
    if (long_f.empty() || short_f.empty()) f.fail("longrope RoPE scaling without long_factor / short_factor");
    s.factor = factor ? static_cast<float>(*factor)
                      : static_cast<float>(c.context_length) / static_cast<float>(s.original_context);
    s.freq_factors = c.context_length > s.original_context ? long_f : short_f;
    if (const auto af = float_field(f, o, "attention_factor")) {
      s.attention_factor = static_cast<float>(*af);
    } else {
      s.attention_factor =
          s.factor <= 1.0f
              ? 1.0f
              : static_cast<float>(std::sqrt(1.0 + std::log(double(s.factor)) / std::log(double(s.original_context))));
    }
    if (c.context_length > s.original_context) {
      note(warnings, f.name + ": longrope: the long factors are used for every sequence (context " +
                         std::to_string(c.context_length) + " > original " + std::to_string(s.original_context) +
                         "); transformers uses the short ones for sequences up to the original length");
    }
  } else if (type == "dynamic") {
    // Dynamic NTK (transformers _compute_dynamic_ntk_parameters / dynamic_rope_update): the identity up to
    // the original context; beyond it transformers re-bases every position of the sequence by its current
    // length, which a paged cache of already-rotated keys cannot follow. So: exact, within the original
    // context, which becomes the context.
    s.kind = rope_scaling_kind::dynamic_ntk;
    s.factor = static_cast<float>(factor.value_or(1.0));
    if (s.original_context <= 0) s.original_context = c.context_length;
    if (c.context_length > s.original_context) {
      note(warnings, f.name + ": dynamic NTK RoPE: context capped at the original " +
                         std::to_string(s.original_context) + " positions, where it is exact");
      c.context_length = s.original_context;
    }
  } else {
    f.fail("RoPE scaling '" + type + "' is not supported (linear, dynamic, yarn, llama3, longrope)");
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

  const hf_arch* arch = nullptr;
  std::string first_class;
  if (const auto archs = field(cfg, "architectures")) {
    if (!archs->is_array()) f->fail("'architectures' is not a list");
    for (auto a : archs->get_array()) {
      std::string_view s;
      if (a.get_string().get(s)) f->fail("'architectures' holds a non-string");
      if (first_class.empty()) first_class = std::string(s);
      if ((arch = find_arch_class(s)) != nullptr) break;
    }
  }
  if (arch == nullptr && first_class.empty()) {
    const auto type = string_field(*f, cfg, "model_type");
    for (const hf_arch& a : k_archs) {
      if (type && a.model_type == *type) arch = &a;
    }
    if (arch == nullptr) f->fail("no 'architectures' and model_type '" + type.value_or("") + "' is not supported");
  }
  if (arch == nullptr) f->fail("architecture '" + first_class + "' is not supported (" + supported_classes() + ")");

  model_config c;
  c.architecture = arch->arch;
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
  const bool gemma = c.architecture == model_arch::gemma2 || c.architecture == model_arch::gemma3;
  // LlamaConfig's default is untied; Gemma's configs default to tied.
  c.tied_embeddings = bool_field(*f, cfg, "tie_word_embeddings").value_or(gemma);
  if (const auto factor = float_field(*f, cfg, "partial_rotary_factor"); factor && *factor != 1.0) {
    f->fail("partial_rotary_factor " + std::to_string(*factor) + " is not supported");
  }
  c.rope_dims = c.head_dim;
  c.rope = rope_style::half;  // HF keeps Q/K rows in rotate_half order (no llama.cpp permutation)

  // ---- RoPE: theta and scaling at the top level (transformers < 5) or in rope_parameters (>= 5), which
  // Gemma 3 splits into "full_attention" and "sliding_attention" entries.
  rope_params global, local;
  global.theta = float_field(*f, cfg, "rope_theta");
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto e = field(cfg, key);
    if (!e) continue;
    sj::dom::object o;
    if (e->get_object().get(o)) f->fail("'" + std::string(key) + "' is not an object");
    if (const auto full = field(o, "full_attention")) {
      sj::dom::object fo, so;
      if (full->get_object().get(fo)) f->fail("'" + std::string(key) + ".full_attention' is not an object");
      const rope_params g = read_rope_object(*f, fo);
      global.obj = g.obj;
      if (g.theta) global.theta = g.theta;
      if (g.type) global.type = g.type;
      if (const auto sl = field(o, "sliding_attention"); sl && !sl->get_object().get(so)) {
        local = read_rope_object(*f, so);
      }
    } else {
      const rope_params g = read_rope_object(*f, o);
      global.obj = g.obj;
      if (g.theta) global.theta = g.theta;
      if (g.type) global.type = g.type;
    }
  }
  const double theta = global.theta.value_or(gemma ? (c.architecture == model_arch::gemma3 ? 1e6 : 10000.0) : 10000.0);
  if (!(theta > 0)) f->fail("rope_theta must be positive");
  c.rope_theta = static_cast<float>(theta);
  read_rope_scaling(*f, global, c, int_field(*f, cfg, "original_max_position_embeddings"), warnings);
  if (local.type && *local.type != "default") {
    f->fail("RoPE scaling '" + *local.type + "' on sliding layers is not supported");
  }

  // ---- the block's features
  model_features& ft = c.features;
  if (gemma) {
    // Gemma 2/3 (transformers models/gemma2, gemma3; Gemma 2 report sec. 2): (1 + w) RMSNorm, GeGLU,
    // pre- and post-norms, embeddings scaled by sqrt(hidden), attention scaled by query_pre_attn_scalar^-1/2.
    ft.norm = norm_kind::rms_one_plus;
    ft.post_norms = true;
    ft.scale_embedding = true;
    ft.qk_norm = c.architecture == model_arch::gemma3;
    std::string act = string_field(*f, cfg, "hidden_activation")
                          .value_or(string_field(*f, cfg, "hidden_act").value_or("gelu_pytorch_tanh"));
    if (act != "gelu_pytorch_tanh") {
      f->fail("hidden_activation '" + act + "' is not supported (gelu_pytorch_tanh only)");
    }
    ft.activation = ffn_activation::gelu_tanh;
    const double scalar = float_field(*f, cfg, "query_pre_attn_scalar").value_or(c.head_dim);
    if (!(scalar > 0)) f->fail("query_pre_attn_scalar must be positive");
    ft.attention_scale = static_cast<float>(1.0 / std::sqrt(scalar));
    ft.attn_softcap.cap = static_cast<float>(float_field(*f, cfg, "attn_logit_softcapping").value_or(0.0));
    ft.final_softcap.cap = static_cast<float>(float_field(*f, cfg, "final_logit_softcapping").value_or(0.0));
    if (bool_field(*f, cfg, "attention_bias").value_or(false)) {
      f->fail("attention_bias is true: biases are not supported");
    }
  } else {
    if (const auto act = string_field(*f, cfg, "hidden_act"); act && *act != "silu") {
      f->fail("hidden_act '" + *act + "' is not supported (SwiGLU with silu only)");
    }
    // Qwen2 always has Q/K/V biases (Qwen2Attention); LLaMA's attention_bias adds one to o_proj too.
    ft.qkv_bias = c.architecture == model_arch::qwen2;
    ft.qk_norm = c.architecture == model_arch::qwen3;
    if (bool_field(*f, cfg, "attention_bias").value_or(false)) {
      f->fail("attention_bias is true: biases are not supported (" + std::string(to_string(c.architecture)) +
              (c.architecture == model_arch::qwen3 ? " with Q/K/V/O biases)" : " with an output-projection bias)"));
    }
  }
  if (bool_field(*f, cfg, "mlp_bias").value_or(false)) f->fail("mlp_bias is true: biases are not supported");

  // ---- per-layer attention: layer_types (transformers >= 4.5x), else the architecture's rule.
  std::vector<bool> sliding(static_cast<size_t>(c.num_layers), false);
  const auto window = int_field(*f, cfg, "sliding_window");
  if (const auto types = field(cfg, "layer_types")) {
    if (!types->is_array()) f->fail("'layer_types' is not a list");
    size_t i = 0;
    for (auto t : types->get_array()) {
      std::string_view s;
      if (t.get_string().get(s)) f->fail("'layer_types' holds a non-string");
      if (i >= sliding.size()) f->fail("'layer_types' has more entries than num_hidden_layers");
      if (s == "sliding_attention") {
        sliding[i] = true;
      } else if (s != "full_attention") {
        f->fail("layer type '" + std::string(s) + "' is not supported");
      }
      ++i;
    }
    if (i != sliding.size()) f->fail("'layer_types' has fewer entries than num_hidden_layers");
  } else if (c.architecture == model_arch::mistral || c.architecture == model_arch::phi3) {
    std::fill(sliding.begin(), sliding.end(), true);  // one window for every layer, when set
  } else if (c.architecture == model_arch::qwen2 || c.architecture == model_arch::qwen3) {
    if (bool_field(*f, cfg, "use_sliding_window").value_or(false)) {
      const int64_t from = int_field(*f, cfg, "max_window_layers").value_or(c.num_layers);
      for (int64_t i = from; i < c.num_layers; ++i) sliding[static_cast<size_t>(i)] = true;
    }
  } else if (gemma) {
    const int64_t pattern =
        int_field(*f, cfg, "sliding_window_pattern").value_or(c.architecture == model_arch::gemma2 ? 2 : 6);
    for (int64_t i = 0; i < c.num_layers; ++i) sliding[static_cast<size_t>(i)] = pattern > 0 && (i + 1) % pattern != 0;
  }
  // Qwen's configs carry a sliding_window even with use_sliding_window false; layer_types is the truth.
  if ((c.architecture == model_arch::qwen2 || c.architecture == model_arch::qwen3) && !field(cfg, "layer_types") &&
      !bool_field(*f, cfg, "use_sliding_window").value_or(false)) {
    std::fill(sliding.begin(), sliding.end(), false);
  }
  // A window as long as the context never masks anything (some Qwen2 configs): no window.
  const bool any_sliding = window && *window > 0 && *window < c.context_length &&
                           std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  // transformers' Gemma3TextConfig defaults rope_local_base_freq to 10000 (the global base is 1e6).
  const double local_theta = local.theta.value_or(
      float_field(*f, cfg, "rope_local_base_freq").value_or(c.architecture == model_arch::gemma3 ? 10000.0 : theta));
  if (any_sliding || local_theta != theta) {
    c.layers.resize(static_cast<size_t>(c.num_layers));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      if (!sliding[static_cast<size_t>(i)]) continue;
      layer_attention& l = c.layers[static_cast<size_t>(i)];
      l.sliding_window = any_sliding ? positive_int32(*f, "sliding_window", *window) : 0;
      if (c.architecture == model_arch::gemma3) {
        // Gemma 3's local layers: rope_local_base_freq, and the global layers' scaling does not apply.
        l.rope_theta = static_cast<float>(local_theta);
        l.rope_scaled = false;
      }
    }
  }
  try {
    c.validate();
  } catch (const load_error& e) { f->fail(e.what()); }
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

// Rows [begin, begin + rows) of a fused [out, in] matrix: a view, the mapping stays the storage.
weight_tensor row_slice(const weight_tensor& w, int64_t begin, int64_t rows, const char* part) {
  weight_tensor v = w;
  v.name = w.name + part;
  v.rows = rows;
  v.data = w.data + begin * w.row_stride_bytes;
  return v;
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
        throw load_error(
            dir_.string() + ": tensor '" + name +
            "' is a bias this architecture does not have; biases other than Qwen2's Q/K/V ones are not supported");
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
  const model_features& ft = c.features;
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layer_weights& l = w->layers[static_cast<size_t>(i)];
    l.attn_norm = b.bind(p + "input_layernorm.weight", 1, hidden, true);
    if (c.architecture == model_arch::phi3) {
      // Phi-3 fuses Q|K|V and gate|up (Phi3Attention.qkv_proj, Phi3MLP.gate_up_proj): row views.
      const weight_tensor qkv = b.bind(p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden, false);
      l.wq = row_slice(qkv, 0, q_dim, "[q]");
      l.wk = row_slice(qkv, q_dim, kv_dim, "[k]");
      l.wv = row_slice(qkv, q_dim + kv_dim, kv_dim, "[v]");
      const weight_tensor gu = b.bind(p + "mlp.gate_up_proj.weight", 2 * ffn, hidden, false);
      l.w_gate = row_slice(gu, 0, ffn, "[gate]");
      l.w_up = row_slice(gu, ffn, ffn, "[up]");
    } else {
      l.wq = b.bind(p + "self_attn.q_proj.weight", q_dim, hidden, false);
      l.wk = b.bind(p + "self_attn.k_proj.weight", kv_dim, hidden, false);
      l.wv = b.bind(p + "self_attn.v_proj.weight", kv_dim, hidden, false);
      l.w_gate = b.bind(p + "mlp.gate_proj.weight", ffn, hidden, false);
      l.w_up = b.bind(p + "mlp.up_proj.weight", ffn, hidden, false);
    }
    if (ft.qkv_bias) {
      l.bq = b.bind(p + "self_attn.q_proj.bias", 1, q_dim, true);
      l.bk = b.bind(p + "self_attn.k_proj.bias", 1, kv_dim, true);
      l.bv = b.bind(p + "self_attn.v_proj.bias", 1, kv_dim, true);
    }
    if (ft.qk_norm) {
      l.q_norm = b.bind(p + "self_attn.q_norm.weight", 1, c.head_dim, true);
      l.k_norm = b.bind(p + "self_attn.k_norm.weight", 1, c.head_dim, true);
    }
    l.wo = b.bind(p + "self_attn.o_proj.weight", hidden, q_dim, false);
    if (ft.post_norms) {
      // Gemma: post_attention_layernorm is the norm of the attention output; the FFN's input norm is
      // pre_feedforward_layernorm (Gemma2DecoderLayer).
      l.post_attn_norm = b.bind(p + "post_attention_layernorm.weight", 1, hidden, true);
      l.ffn_norm = b.bind(p + "pre_feedforward_layernorm.weight", 1, hidden, true);
      l.post_ffn_norm = b.bind(p + "post_feedforward_layernorm.weight", 1, hidden, true);
    } else {
      l.ffn_norm = b.bind(p + "post_attention_layernorm.weight", 1, hidden, true);
    }
    l.w_down = b.bind(p + "mlp.down_proj.weight", hidden, ffn, false);
  }
  b.check_unused(warnings);
  w->storage = std::move(storage);  // the mappings (and realigned copies) outlive every view above
  return w;
}

}  // namespace tessera
