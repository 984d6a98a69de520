// `tessera inspect MODEL`: what a GGUF file or a Hugging Face directory holds, as the loader sees it:
// the architecture, its features, the tensor-type mix, then (GGUF) the metadata.
#include <cstdio>
#include <map>
#include <string>

#include "app/commands.hpp"
#include "app/model_lookup.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/hf_model.hpp"
#include "engine/model/kv_layer_groups.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/model/model_weights.hpp"

namespace tessera::app {

namespace {

void print_config(const model_config& c) {
  std::printf("architecture: %s\nfeatures: %s\n", std::string(to_string(c.architecture)).c_str(),
              describe_features(c).c_str());
  std::printf(
      "config: layers %d, hidden %d, ffn %d, heads %d, kv heads %d, head dim %d, vocab %d, context %d, "
      "rope dims %d theta %g, rms eps %g\n",
      c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
      c.context_length, c.rope_dims, static_cast<double>(c.rope_theta), static_cast<double>(c.rms_norm_eps));
  std::printf("kv cache: %s\n", describe(group_kv_layers(c)).c_str());
}

// The quant mix: how many tensors of each type (a "Q4_K_M" file is mostly Q4_K with some Q6_K).
void print_mix(const std::map<std::string, int>& mix) {
  std::printf("tensor types:");
  for (const auto& [type, n] : mix) std::printf(" %s x%d", type.c_str(), n);
  std::printf("\n");
}

int inspect_hf(const std::filesystem::path& dir) {
  std::vector<std::string> warnings;
  const model_config c = read_hf_config(dir, &warnings);
  const auto w = load_hf_weights(dir, c, &warnings);
  std::printf("directory: %s (Hugging Face)\n", dir.c_str());
  print_config(w->config);
  std::map<std::string, int> mix;
  auto count = [&](const weight_tensor& t) {
    if (!t.empty()) ++mix[std::string(type_info(t.type).name)];
  };
  count(w->token_embedding);
  count(w->output_norm);
  if (!w->config.tied_embeddings) count(w->output);
  for (const layer_weights& l : w->layers) {
    for (const weight_tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down,
                                   &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm}) {
      count(*t);
    }
  }
  print_mix(mix);
  for (const auto& warning : warnings) std::printf("warning: %s\n", warning.c_str());
  return 0;
}

}  // namespace

void inspect_command::add_to(CLI::App& app) {
  cmd_ = app.add_subcommand("inspect", "Print a model's architecture, features, tensor types and (GGUF) metadata");
  cmd_->add_option(
      "model", model_,
      "A library name (tessera list), a .gguf file or a Hugging Face model directory (default: the default model, "
      "smollm2-135m)");
  cmd_->add_flag("--tensors", tensors_, "List every tensor (GGUF)");
}

int inspect_command::run() {
  const std::filesystem::path path = resolve_model(model_).path;
  if (is_hf_model_dir(path)) return inspect_hf(path);
  auto file = gguf_file::open(path);
  std::printf("file: %s\nGGUF version %u, alignment %llu, %zu tensors\n", path.c_str(), file->version(),
              static_cast<unsigned long long>(file->alignment()), file->tensors().size());
  print_config(read_gguf_config(*file));
  std::map<std::string, int> mix;
  for (const auto& t : file->tensors()) ++mix[std::string(type_info(t.type).name)];
  print_mix(mix);
  std::printf("\nmetadata:\n");
  for (const auto& key : file->keys()) std::printf("  %s = %s\n", key.c_str(), file->describe(key).c_str());
  if (tensors_) {
    std::printf("\ntensors:\n");
    for (const auto& t : file->tensors()) {
      std::string dims;
      for (size_t i = 0; i < t.dims.size(); ++i) dims += (i ? " x " : "") + std::to_string(t.dims[i]);
      std::printf("  %-32s %-6s [%s] %llu bytes\n", t.name.c_str(), std::string(type_info(t.type).name).c_str(),
                  dims.c_str(), static_cast<unsigned long long>(t.num_bytes));
    }
  }
  return 0;
}

}  // namespace tessera::app
