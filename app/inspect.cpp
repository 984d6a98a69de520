// `tessera inspect MODEL`: what a GGUF file holds, as the loader sees it.
#include <cstdio>
#include <map>
#include <string>

#include "app/commands.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/model/model_weights.hpp"

namespace tessera::app {

void inspect_command::add_to(CLI::App& app) {
  cmd_ = app.add_subcommand("inspect", "Print a GGUF model's metadata, config and tensors");
  cmd_->add_option("model", model_, "Path to a .gguf file (default: the model fetched by scripts/setup)");
  cmd_->add_flag("--tensors", tensors_, "List every tensor");
}

int inspect_command::run() {
  const auto path = model_.empty() ? default_model_path() : std::filesystem::path(model_);
  auto file = gguf_file::open(path);
  std::printf("file: %s\nGGUF version %u, alignment %llu, %zu tensors\n\nmetadata:\n", path.c_str(), file->version(),
              static_cast<unsigned long long>(file->alignment()), file->tensors().size());
  for (const auto& key : file->keys()) std::printf("  %s = %s\n", key.c_str(), file->describe(key).c_str());
  const model_config c = read_gguf_config(*file);
  std::printf("\narchitecture: %s\nfeatures: %s\n", std::string(to_string(c.architecture)).c_str(),
              describe_features(c).c_str());
  // The quant mix: how many tensors of each type (a "Q4_K_M" file is mostly Q4_K with some Q6_K).
  std::map<std::string, int> mix;
  for (const auto& t : file->tensors()) ++mix[std::string(type_info(t.type).name)];
  std::printf("tensor types:");
  for (const auto& [type, n] : mix) std::printf(" %s x%d", type.c_str(), n);
  std::printf("\n");
  std::printf(
      "\nconfig: layers %d, hidden %d, ffn %d, heads %d, kv heads %d, head dim %d, vocab %d, context %d, "
      "rope dims %d theta %g, rms eps %g\n",
      c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
      c.context_length, c.rope_dims, static_cast<double>(c.rope_theta), static_cast<double>(c.rms_norm_eps));
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
