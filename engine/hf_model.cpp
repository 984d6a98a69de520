// Hugging Face checkpoint directories -> model_weights + vocab_data.
// Key and tensor names follow transformers' LlamaConfig / LlamaForCausalLM (models/llama/), the
// tokenizer.json layout is the `tokenizers` library's serialization (model, added_tokens,
// pre_tokenizer, post_processor), and sharded checkpoints follow model.safetensors.index.json
// ("weight_map": tensor name -> shard file).
#include "engine/hf_model.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "engine/error.hpp"
#include "engine/safetensors.hpp"

namespace tessera {

namespace fs = std::filesystem;
namespace sj = simdjson;

namespace {

constexpr uintmax_t k_max_json_bytes = 1ull << 30;  // tokenizer.json files are tens of MB
constexpr int64_t k_max_vocab = 1 << 24;

// A parsed JSON file; elements point into the parser, so it travels with them.
struct json_file {
  std::string name;
  sj::dom::parser parser;
  sj::dom::element root;

  [[noreturn]] void fail(const std::string& what) const { throw load_error(name + ": " + what); }

  sj::dom::object object() const {
    sj::dom::object o;
    if (root.get_object().get(o)) fail("not a JSON object");
    return o;
  }
};

// simdjson 3.0 refuses integers beyond 64 bits, which transformers writes (tokenizer_config.json's
// "model_max_length": 1000000000000000019884624838656). Such integers become decimals ("...656.0"),
// which parse as doubles; everything inside strings is left alone.
std::string widen_big_integers(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  bool in_string = false;
  for (size_t i = 0; i < json.size();) {
    const char c = json[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < json.size()) {
        out.push_back(json[i + 1]);
        i += 2;
        continue;
      }
      in_string = c != '"';
      ++i;
      continue;
    }
    if (c == '"') in_string = true;
    if (c != '-' && (c < '0' || c > '9')) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t end = i;
    size_t digits = 0;
    bool integer = true;
    while (end < json.size()) {
      const char d = json[end];
      if (d >= '0' && d <= '9') {
        ++digits;
      } else if (d == '.' || d == 'e' || d == 'E') {
        integer = false;
      } else if (d != '-' && d != '+') {
        break;
      }
      ++end;
    }
    out.append(json.substr(i, end - i));
    if (integer && digits > 19) out.append(".0");
    i = end;
  }
  return out;
}

std::unique_ptr<json_file> load_json(const fs::path& path) {
  auto f = std::make_unique<json_file>();
  f->name = path.string();
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) f->fail("cannot read: " + ec.message());
  if (size > k_max_json_bytes) f->fail("larger than 1 GiB; refusing to parse");
  sj::padded_string raw;
  if (sj::padded_string::load(path.string()).get(raw)) f->fail("cannot read");
  const sj::padded_string text(widen_big_integers(std::string_view(raw)));
  if (const auto err = f->parser.parse(text).get(f->root); err) {
    f->fail(std::string("invalid JSON: ") + sj::error_message(err));
  }
  return f;
}

// Looks up `key`; nullopt when absent or null (HF writes `"head_dim": null` and the like).
std::optional<sj::dom::element> field(sj::dom::object o, std::string_view key) {
  sj::dom::element e;
  if (o.at_key(key).get(e) || e.is_null()) return std::nullopt;
  return e;
}

std::optional<std::string> string_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  std::string_view s;
  if (e->get_string().get(s)) f.fail("'" + std::string(key) + "' is not a string");
  return std::string(s);
}

std::optional<bool> bool_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  bool b = false;
  if (e->get_bool().get(b)) f.fail("'" + std::string(key) + "' is not a boolean");
  return b;
}

std::optional<int64_t> int_value(sj::dom::element e) {
  int64_t v = 0;
  if (!e.get_int64().get(v)) return v;
  double d = 0;  // some writers emit 8192.0
  if (!e.get_double().get(d) && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::optional<int64_t> int_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  const auto v = int_value(*e);
  if (!v) f.fail("'" + std::string(key) + "' is not an integer");
  return v;
}

int32_t positive_int32(const json_file& f, std::string_view key, int64_t v) {
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    f.fail("'" + std::string(key) + "' = " + std::to_string(v) + " is out of range (1..2^31-1)");
  }
  return static_cast<int32_t>(v);
}

int32_t required_int32(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto v = int_field(f, o, key);
  if (!v) f.fail("required key '" + std::string(key) + "' is missing");
  return positive_int32(f, key, *v);
}

std::optional<double> float_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  double d = 0;
  if (e->get_double().get(d)) {
    const auto i = int_value(*e);
    if (!i) f.fail("'" + std::string(key) + "' is not a number");
    d = static_cast<double>(*i);
  }
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
    f.fail("'" + std::string(key) + "' is not a finite float");
  }
  return d;
}

// `bos_token_id` and friends: an integer or (eos in newer configs) a list whose first entry we use.
std::optional<int64_t> first_int_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  if (e->is_array()) {
    for (auto v : e->get_array()) {
      if (const auto i = int_value(v)) return i;
      f.fail("'" + std::string(key) + "' holds a non-integer");
    }
    return std::nullopt;
  }
  return int_field(f, o, key);
}

void note(std::vector<std::string>* warnings, std::string text) {
  if (warnings != nullptr) warnings->push_back(std::move(text));
}

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
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / "config.json", ec);
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

// ---- tokenizer ------------------------------------------------------------------------------------

namespace {

// The split expressions that transformers/tokenizers write for the pre-tokenizers we implement
// (the same ones llama.cpp's convert_hf_to_gguf.py recognises).
constexpr std::string_view k_llama3_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view k_qwen2_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct pre_tokenizer_step {
  std::string type;
  bool individual_digits = false;  // Digits
  bool use_regex = true;           // ByteLevel
  bool add_prefix_space = false;   // ByteLevel
  std::string regex;               // Split: pattern.Regex
};

void collect_steps(const json_file& f, sj::dom::element e, std::vector<pre_tokenizer_step>& out) {
  sj::dom::object o;
  if (e.get_object().get(o)) f.fail("'pre_tokenizer' is not an object");
  pre_tokenizer_step s;
  s.type = string_field(f, o, "type").value_or("");
  if (s.type == "Sequence") {
    const auto list = field(o, "pretokenizers");
    if (!list || !list->is_array()) f.fail("Sequence pre_tokenizer without 'pretokenizers'");
    for (auto child : list->get_array()) collect_steps(f, child, out);
    return;
  }
  s.individual_digits = bool_field(f, o, "individual_digits").value_or(false);
  s.use_regex = bool_field(f, o, "use_regex").value_or(true);
  s.add_prefix_space = bool_field(f, o, "add_prefix_space").value_or(false);
  if (const auto pattern = field(o, "pattern"); pattern && pattern->is_object()) {
    s.regex = string_field(f, pattern->get_object(), "Regex").value_or("");
  }
  out.push_back(std::move(s));
}

// Which of tokenizer.hpp's pre-tokenizers the tokenizer.json describes; "" when none.
std::string detect_pre(const std::vector<pre_tokenizer_step>& steps) {
  auto is_byte_level = [](const pre_tokenizer_step& s, bool regex) {
    return s.type == "ByteLevel" && s.use_regex == regex;
  };
  if (steps.size() == 1 && is_byte_level(steps[0], true)) return "gpt2";
  if (steps.size() == 2 && steps[0].type == "Digits" && steps[0].individual_digits && is_byte_level(steps[1], true)) {
    return "smollm";
  }
  if (steps.size() == 2 && steps[0].type == "Split" && is_byte_level(steps[1], false)) {
    if (steps[0].regex == k_llama3_regex) return "llama3";
    if (steps[0].regex == k_qwen2_regex) return "qwen2";
  }
  return "";
}

// tokenizer_config.json's bos_token etc.: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> special_text(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  if (e->is_string()) return std::string(std::string_view(e->get_string()));
  if (e->is_object()) return string_field(f, e->get_object(), "content");
  f.fail("'" + std::string(key) + "' is neither a string nor an object");
}

}  // namespace

vocab_data read_hf_vocab(const fs::path& dir, int32_t min_vocab_size, std::vector<std::string>* warnings) {
  const auto f = load_json(dir / "tokenizer.json");
  const sj::dom::object root = f->object();
  const auto model_e = field(root, "model");
  if (!model_e || !model_e->is_object()) f->fail("'model' is missing");
  const sj::dom::object model = model_e->get_object();
  const std::string type = string_field(*f, model, "type").value_or("BPE");
  if (type != "BPE") f->fail("tokenizer model '" + type + "' is not supported (byte-level BPE only)");
  if (bool_field(*f, model, "byte_fallback").value_or(false)) {
    f->fail("SentencePiece-style BPE (byte_fallback) tokenizers are not supported yet; use a GGUF file");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto s = string_field(*f, model, key); s && !s->empty()) {
      f->fail(std::string(key) + " '" + *s + "' is not supported");
    }
  }

  vocab_data v;
  v.kind = vocab_kind::bpe;
  // ---- tokens: model.vocab (text -> id), then added_tokens (which may extend it) ----
  std::vector<std::optional<std::string>> slots;
  std::vector<token_type> types;
  auto place = [&](int64_t id, std::string text, token_type t, bool may_replace) {
    if (id < 0 || id >= k_max_vocab) f->fail("token id " + std::to_string(id) + " is out of range");
    const auto i = static_cast<size_t>(id);
    if (i >= slots.size()) {
      slots.resize(i + 1);
      types.resize(i + 1, token_type::normal);
    }
    if (slots[i] && !(may_replace && *slots[i] == text)) {
      f->fail("token id " + std::to_string(id) + " is used by both '" + *slots[i] + "' and '" + text + "'");
    }
    slots[i] = std::move(text);
    types[i] = t;
  };
  const auto vocab_e = field(model, "vocab");
  sj::dom::object vocab;
  if (!vocab_e || vocab_e->get_object().get(vocab)) f->fail("'model.vocab' is missing or not an object");
  for (auto e : vocab) {
    const auto id = int_value(e.value);
    if (!id) f->fail("vocab entry '" + std::string(e.key) + "' has a non-integer id");
    place(*id, std::string(e.key), token_type::normal, false);
  }
  if (const auto added = field(root, "added_tokens")) {
    if (!added->is_array()) f->fail("'added_tokens' is not a list");
    for (auto a : added->get_array()) {
      sj::dom::object o;
      if (a.get_object().get(o)) f->fail("an added_tokens entry is not an object");
      const auto id = int_field(*f, o, "id");
      const auto content = string_field(*f, o, "content");
      if (!id || !content) f->fail("an added_tokens entry lacks 'id' or 'content'");
      // special: never produced from plain text (control); otherwise matched in text like llama.cpp's
      // user-defined tokens. Their content is raw text, not GPT-2 byte alphabet.
      const bool special = bool_field(*f, o, "special").value_or(false);
      place(*id, *content, special ? token_type::control : token_type::user_defined, true);
    }
  }
  size_t holes = 0;  // ids inside the tokenizer's own range without a token
  const size_t num_defined = slots.size();
  const size_t wanted = std::max(slots.size(), static_cast<size_t>(std::max<int32_t>(min_vocab_size, 0)));
  slots.resize(wanted);
  types.resize(wanted, token_type::normal);
  v.tokens.reserve(wanted);
  for (size_t i = 0; i < wanted; ++i) {
    if (slots[i]) {
      v.tokens.push_back(std::move(*slots[i]));
    } else {
      // Ids without a token (gaps, or embedding rows beyond the tokenizer): placeholders that plain
      // text can never produce.
      v.tokens.push_back("<|tessera_unused_" + std::to_string(i) + "|>");
      types[i] = token_type::unused;
      holes += i < num_defined;
    }
  }
  v.types = std::move(types);
  if (holes > 0) {
    note(warnings, f->name + ": " + std::to_string(holes) + " token id(s) without a token; filled with placeholders");
  }

  // ---- merges: "left right" strings (tokenizers < 0.20) or [left, right] pairs ----
  const auto merges_e = field(model, "merges");
  if (!merges_e || !merges_e->is_array()) f->fail("'model.merges' is missing or not a list");
  for (auto m : merges_e->get_array()) {
    if (m.is_string()) {
      v.merges.emplace_back(std::string_view(m.get_string()));
      continue;
    }
    std::vector<std::string_view> parts;
    if (m.is_array()) {
      for (auto p : m.get_array()) {
        std::string_view s;
        if (p.get_string().get(s)) f->fail("a merge pair holds a non-string");
        parts.push_back(s);
      }
    }
    if (parts.size() != 2) f->fail("a merge is neither \"a b\" nor [a, b]");
    if (parts[0].find(' ') != std::string_view::npos || parts[1].find(' ') != std::string_view::npos) {
      f->fail("merge [" + std::string(parts[0]) + ", " + std::string(parts[1]) + "] contains a space");
    }
    v.merges.push_back(std::string(parts[0]) + " " + std::string(parts[1]));
  }

  // ---- pre-tokenizer ----
  std::vector<pre_tokenizer_step> steps;
  if (const auto pre = field(root, "pre_tokenizer")) collect_steps(*f, *pre, steps);
  if (std::none_of(steps.begin(), steps.end(), [](const auto& s) { return s.type == "ByteLevel"; })) {
    f->fail("pre_tokenizer is not byte-level (no ByteLevel step); only byte-level BPE is supported");
  }
  v.pre = detect_pre(steps);
  if (v.pre.empty()) {
    v.pre = "gpt2";
    note(warnings, f->name + ": pre_tokenizer not recognised (not GPT-2, SmolLM digits, LLaMA-3 or Qwen2); "
                             "falling back to the GPT-2 split, so some texts may tokenize differently");
  }
  if (std::any_of(steps.begin(), steps.end(), [](const auto& s) { return s.add_prefix_space; })) {
    note(warnings, f->name + ": ByteLevel add_prefix_space is ignored");
  }
  if (const auto norm = field(root, "normalizer")) {
    const auto t = norm->is_object() ? string_field(*f, norm->get_object(), "type") : std::nullopt;
    if (t != "NFC") note(warnings, f->name + ": normalizer '" + t.value_or("?") + "' is ignored");
  }
  v.add_space_prefix = false;

  // ---- special tokens ----
  std::unordered_map<std::string_view, token_id> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<token_id>(i));
  auto id_of = [&](const std::string& text) -> std::optional<token_id> {
    const auto it = ids.find(text);
    if (it == ids.end()) {
      note(warnings, f->name + ": special token '" + text + "' is not in the vocabulary");
      return std::nullopt;
    }
    return it->second;
  };
  // post_processor TemplateProcessing: special tokens around the single sequence $A mean add_bos/eos.
  std::optional<token_id> template_bos, template_eos;
  if (const auto pp = field(root, "post_processor"); pp && pp->is_object()) {
    std::vector<sj::dom::object> processors;
    const sj::dom::object ppo = pp->get_object();
    if (string_field(*f, ppo, "type") == "Sequence") {
      if (const auto list = field(ppo, "processors"); list && list->is_array()) {
        for (auto p : list->get_array()) {
          if (p.is_object()) processors.push_back(p.get_object());
        }
      }
    } else {
      processors.push_back(ppo);
    }
    for (const auto& p : processors) {
      if (string_field(*f, p, "type") != "TemplateProcessing") continue;
      const auto single = field(p, "single");
      if (!single || !single->is_array()) continue;
      std::vector<std::optional<std::string>> items;  // nullopt: the sequence itself
      for (auto item : single->get_array()) {
        sj::dom::element special;
        if (item.is_object() && !item.get_object().at_key("SpecialToken").get(special) && special.is_object()) {
          items.push_back(string_field(*f, special.get_object(), "id"));
        } else {
          items.push_back(std::nullopt);
        }
      }
      if (!items.empty() && items.front()) template_bos = id_of(*items.front());
      if (items.size() > 1 && items.back()) template_eos = id_of(*items.back());
    }
  }
  std::unique_ptr<json_file> tc;
  if (std::error_code ec; fs::exists(dir / "tokenizer_config.json", ec)) tc = load_json(dir / "tokenizer_config.json");
  std::unique_ptr<json_file> cfg;
  if (std::error_code ec; fs::exists(dir / "config.json", ec)) cfg = load_json(dir / "config.json");
  auto special = [&](std::string_view tc_key, std::string_view cfg_key) -> std::optional<token_id> {
    if (tc) {
      if (const auto text = special_text(*tc, tc->object(), tc_key)) return id_of(*text);
    }
    if (cfg) {
      if (const auto id = first_int_field(*cfg, cfg->object(), cfg_key)) {
        if (*id < 0 || *id >= static_cast<int64_t>(v.tokens.size())) {
          cfg->fail(std::string(cfg_key) + " " + std::to_string(*id) + " is outside the vocabulary");
        }
        return static_cast<token_id>(*id);
      }
    }
    return std::nullopt;
  };
  v.bos = special("bos_token", "bos_token_id");
  v.eos = special("eos_token", "eos_token_id");
  v.pad = special("pad_token", "pad_token_id");
  v.unk = special("unk_token", "unk_token_id");
  if (!v.unk) {
    if (const auto unk = string_field(*f, model, "unk_token")) v.unk = id_of(*unk);
  }
  if (!v.bos) v.bos = template_bos;
  if (!v.eos) v.eos = template_eos;
  std::optional<bool> add_bos = tc ? bool_field(*tc, tc->object(), "add_bos_token") : std::nullopt;
  std::optional<bool> add_eos = tc ? bool_field(*tc, tc->object(), "add_eos_token") : std::nullopt;
  v.add_bos = add_bos.value_or(template_bos.has_value());
  v.add_eos = add_eos.value_or(template_eos.has_value());
  if (*v.add_bos && !v.bos) v.add_bos = false;
  if (*v.add_eos && !v.eos) v.add_eos = false;
  return v;
}

std::optional<std::string> read_hf_chat_template(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "tokenizer_config.json", ec)) {
    const auto tc = load_json(dir / "tokenizer_config.json");
    if (const auto e = field(tc->object(), "chat_template")) {
      if (e->is_string()) return std::string(std::string_view(e->get_string()));
      if (e->is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        for (auto entry : e->get_array()) {
          if (!entry.is_object()) continue;
          if (string_field(*tc, entry.get_object(), "name") == "default") {
            return string_field(*tc, entry.get_object(), "template");
          }
        }
      }
      tc->fail("'chat_template' is neither a string nor a list with a \"default\" entry");
    }
  }
  const fs::path jinja = dir / "chat_template.jinja";  // transformers >= 4.43 may write it separately
  if (fs::is_regular_file(jinja, ec)) {
    if (fs::file_size(jinja, ec) > k_max_json_bytes) throw load_error(jinja.string() + ": too large");
    sj::padded_string text;
    if (sj::padded_string::load(jinja.string()).get(text)) throw load_error(jinja.string() + ": cannot read");
    return std::string(std::string_view(text));
  }
  return std::nullopt;
}

hf_model load_hf_model(const fs::path& dir) {
  if (!is_hf_model_dir(dir)) throw load_error(dir.string() + ": not a directory with config.json");
  hf_model m;
  const model_config config = read_hf_config(dir, &m.warnings);
  m.weights = load_hf_weights(dir, config, &m.warnings);
  vocab_data vocab = read_hf_vocab(dir, config.vocab_size, &m.warnings);
  if (vocab.tokens.size() > static_cast<size_t>(config.vocab_size)) {
    throw load_error(dir.string() + ": tokenizer.json has " + std::to_string(vocab.tokens.size()) +
                     " tokens but the model's vocabulary (vocab_size) is " + std::to_string(config.vocab_size));
  }
  try {
    m.tok = std::make_shared<const tokenizer>(std::move(vocab));
  } catch (const load_error& e) {
    throw load_error((dir / "tokenizer.json").string() + ": " + e.what());
  }
  for (const auto& w : m.tok->warnings()) m.warnings.push_back(w);
  m.chat_template = read_hf_chat_template(dir);
  return m;
}

}  // namespace tessera
