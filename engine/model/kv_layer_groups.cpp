#include "engine/model/kv_layer_groups.hpp"

#include <algorithm>
#include <map>

namespace tessera {

kv_layer_groups single_kv_group(const model_config& config) {
  kv_layer_groups g;
  g.layers_per_block = config.num_layers;
  g.windows = {config.kv_window()};
  g.layer_group.assign(static_cast<size_t>(config.num_layers), 0);
  g.layer_slot.resize(static_cast<size_t>(config.num_layers));
  for (int32_t l = 0; l < config.num_layers; ++l) g.layer_slot[static_cast<size_t>(l)] = l;
  return g;
}

kv_layer_groups group_kv_layers(const model_config& config) {
  // Window classes in order of first appearance, each with its layers in order.
  std::vector<int32_t> class_window;
  std::vector<std::vector<int32_t>> class_layers;
  for (int32_t l = 0; l < config.num_layers; ++l) {
    const int32_t w = std::max(0, config.layer(l).sliding_window);
    auto it = std::find(class_window.begin(), class_window.end(), w);
    if (it == class_window.end()) {
      class_window.push_back(w);
      class_layers.emplace_back();
      it = std::prev(class_window.end());
    }
    class_layers[static_cast<size_t>(it - class_window.begin())].push_back(l);
  }
  if (class_window.size() <= 1) return single_kv_group(config);
  size_t size = class_layers.front().size();
  for (const auto& c : class_layers) size = std::min(size, c.size());
  kv_layer_groups g;
  g.layers_per_block = static_cast<int32_t>(size);
  g.layer_group.resize(static_cast<size_t>(config.num_layers));
  g.layer_slot.resize(static_cast<size_t>(config.num_layers));
  for (size_t c = 0; c < class_layers.size(); ++c) {
    const std::vector<int32_t>& layers = class_layers[c];
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % size == 0) g.windows.push_back(class_window[c]);
      g.layer_group[static_cast<size_t>(layers[i])] = g.num_groups() - 1;
      g.layer_slot[static_cast<size_t>(layers[i])] = static_cast<int32_t>(i % size);
    }
  }
  return g;
}

std::string describe(const kv_layer_groups& groups) {
  std::map<int32_t, int32_t> by_window;
  for (int32_t w : groups.windows) ++by_window[w];
  std::string s = std::to_string(groups.num_groups()) + (groups.num_groups() == 1 ? " group" : " groups") + " of " +
                  std::to_string(groups.layers_per_block) + (groups.layers_per_block == 1 ? " layer" : " layers");
  std::string sep = ": ";
  for (const auto& [w, n] : by_window) {
    s += sep + std::to_string(n) + (w > 0 ? " with window " + std::to_string(w) : " global");
    sep = ", ";
  }
  return s;
}

}  // namespace tessera
