// KV cache layer groups, as vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_utils.py,
// "hybrid allocator"): in a model whose layers keep different spans of the past (Gemma 2/3: layers
// with a sliding window interleaved with global ones) one block table per sequence for all layers
// keeps every position of every layer, because the global layers read them all. Here the layers are
// cut into groups of equal size, each group holding layers of one window only; a KV block holds one
// group's layers for block_size positions, every group draws its blocks from the one pool, and a
// sequence has one block table per group. A window group frees the blocks that leave its window
// (block_manager), the global groups keep theirs.
//
// Example, Gemma 3 270M (18 layers, every 6th global): 15 local layers (window 512) and 3 global
// ones; groups of 3 layers: five local groups and one global group. A block is 3 layers' K/V, and a
// long sequence holds ceil(n / bs) global blocks but only about 512 / bs blocks per local group.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model_config.hpp"

namespace tessera {

struct kv_layer_groups {
  int32_t layers_per_block = 0;      // layers whose K/V one block holds: one group's
  std::vector<int32_t> windows;      // per group: the sliding window of its layers, 0 = full attention
  std::vector<int32_t> layer_group;  // per layer: its group
  std::vector<int32_t> layer_slot;   // per layer: its index among the layers of one of its group's blocks

  int32_t num_groups() const { return static_cast<int32_t>(windows.size()); }
  int32_t group_of(int32_t layer) const { return layer_group[static_cast<size_t>(layer)]; }
  int32_t slot_of(int32_t layer) const { return layer_slot[static_cast<size_t>(layer)]; }
};

// One group of every layer: a block holds all layers (the layout without groups); its window is
// config.kv_window() (the widest when every layer has one, else 0).
kv_layer_groups single_kv_group(const model_config& config);

// Groups by window when the layers' windows differ (one class per window value, in order of first
// appearance; the group size is the smallest class's layer count, as vLLM; a class whose count is
// no multiple of it has a last group with fewer layers, whose blocks leave slots unused); else the
// single group.
kv_layer_groups group_kv_layers(const model_config& config);

// "6 groups of 3 layers: 5 with window 512, 1 global" for logs and `tessera inspect`.
std::string describe(const kv_layer_groups& groups);

}  // namespace tessera
