#include "engine/model/kv_layer_groups.hpp"

#include <gtest/gtest.h>

namespace tessera {
namespace {

model_config with_windows(const std::vector<int32_t>& windows) {
  model_config c;
  c.num_layers = static_cast<int32_t>(windows.size());
  for (int32_t w : windows) c.layers.push_back(layer_attention{w});
  return c;
}

TEST(kv_layer_groups, gemma3_pattern_makes_five_sliding_groups_and_one_global) {
  // Gemma 3 270M: 18 layers, every 6th global, the others window 512.
  std::vector<int32_t> windows;
  for (int32_t l = 0; l < 18; ++l) windows.push_back(l % 6 == 5 ? 0 : 512);
  const kv_layer_groups g = group_kv_layers(with_windows(windows));
  EXPECT_EQ(g.layers_per_block, 3);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{512, 512, 512, 512, 512, 0}));
  // Sliding layers in order, three to a group; the global layers 5, 11 and 17 in the last group.
  EXPECT_EQ(g.layer_group, (std::vector<int32_t>{0, 0, 0, 1, 1, 5, 1, 2, 2, 2, 3, 5, 3, 3, 4, 4, 4, 5}));
  EXPECT_EQ(g.layer_slot, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 2, 0, 1, 2, 0, 1, 1, 2, 0, 1, 2, 2}));
  for (int32_t l = 0; l < 18; ++l)
    EXPECT_EQ(g.windows[static_cast<size_t>(g.group_of(l))], windows[static_cast<size_t>(l)]);
  EXPECT_EQ(describe(g), "6 groups of 3 layers: 1 global, 5 with window 512");
}

TEST(kv_layer_groups, alternating_layers_make_two_groups) {
  // Gemma 2: sliding and global layers alternate.
  const kv_layer_groups g = group_kv_layers(with_windows({4096, 0, 4096, 0, 4096, 0}));
  EXPECT_EQ(g.layers_per_block, 3);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{4096, 0}));
  EXPECT_EQ(g.layer_group, (std::vector<int32_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(g.layer_slot, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
}

TEST(kv_layer_groups, uneven_classes_leave_the_last_group_short) {
  // 5 sliding and 2 global layers: groups of 2, the sliding class in 3 groups (the last with 1 layer).
  const kv_layer_groups g = group_kv_layers(with_windows({8, 8, 0, 8, 8, 8, 0}));
  EXPECT_EQ(g.layers_per_block, 2);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{8, 8, 8, 0}));
  EXPECT_EQ(g.layer_group, (std::vector<int32_t>{0, 0, 3, 1, 1, 2, 3}));
  EXPECT_EQ(g.layer_slot, (std::vector<int32_t>{0, 1, 0, 0, 1, 0, 1}));
}

TEST(kv_layer_groups, uniform_layers_keep_one_group_of_all) {
  for (const std::vector<int32_t>& windows : {std::vector<int32_t>{0, 0, 0}, std::vector<int32_t>{64, 64}}) {
    const model_config c = with_windows(windows);
    const kv_layer_groups g = group_kv_layers(c);
    EXPECT_EQ(g.num_groups(), 1);
    EXPECT_EQ(g.layers_per_block, c.num_layers);
    EXPECT_EQ(g.windows, (std::vector<int32_t>{c.kv_window()}));
    for (int32_t l = 0; l < c.num_layers; ++l) {
      EXPECT_EQ(g.group_of(l), 0);
      EXPECT_EQ(g.slot_of(l), l);
    }
  }
  model_config plain;  // no per-layer entries: every layer full attention
  plain.num_layers = 4;
  EXPECT_EQ(group_kv_layers(plain).num_groups(), 1);
  EXPECT_EQ(single_kv_group(with_windows({8, 0})).windows, (std::vector<int32_t>{0}));
  EXPECT_EQ(describe(single_kv_group(plain)), "1 group of 4 layers: 1 global");
}

TEST(kv_layer_groups, different_windows_are_different_groups) {
  const kv_layer_groups g = group_kv_layers(with_windows({8, 16, 8, 16}));
  EXPECT_EQ(g.windows, (std::vector<int32_t>{8, 16}));
  EXPECT_EQ(g.layers_per_block, 2);
}

}  // namespace
}  // namespace tessera
