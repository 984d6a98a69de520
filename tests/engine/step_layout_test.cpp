// build_step_layout: every refusal with the message both executors have always given (named after the
// executor that asks), nothing refused that only looks odd (blocks allocated ahead, empty slices), and
// the flattened rows of a batch mixing prefill chunks, decodes, empty slices and every logits mode,
// checked element by element with and without sampling on the device.
#include "engine/step_layout.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/error.hpp"

namespace tessera {
namespace {

using mode = sequence_slice::logits_mode;

constexpr int32_t k_vocab = 100;

model_config tiny_config() {
  model_config c;
  c.vocab_size = k_vocab;
  return c;
}

kv_cache_spec pool(int32_t block_size, int32_t device_blocks) {
  kv_cache_spec s;
  s.block_size = block_size;
  s.num_device_blocks = device_blocks;
  return s;
}

sequence_slice slice(std::vector<token_id> tokens, int32_t num_computed, std::vector<block_id> table,
                     mode logits = mode::last) {
  sequence_slice s;
  s.tokens = std::move(tokens);
  s.num_computed = num_computed;
  s.block_table = std::move(table);
  s.logits = logits;
  return s;
}

// The message of the invalid_request build_step_layout throws for `batch`, or "" when it accepts it.
std::string refusal(const step_batch& batch, const char* executor_name = "cpu", bool device_sampling = false) {
  step_layout layout;
  step_output out;
  try {
    build_step_layout(batch, pool(4, 8), tiny_config(), device_sampling, executor_name, layout, out);
  } catch (const invalid_request& e) { return e.what(); }
  return "";
}

step_batch one(sequence_slice s) {
  step_batch b;
  b.seqs.push_back(std::move(s));
  return b;
}

TEST(step_layout, refuses_a_bad_num_computed) {
  EXPECT_EQ(refusal(one(slice({1}, -1, {0}))), "cpu executor: bad num_computed");
  // Past half the int32 range, even with a table that would cover it.
  const int32_t big = std::numeric_limits<int32_t>::max() / 2;
  EXPECT_EQ(refusal(one(slice({1}, big, {0}))), "cpu executor: bad num_computed");
  EXPECT_EQ(refusal(one(slice({}, big + 1, {0}))), "cpu executor: bad num_computed");
  EXPECT_EQ(refusal(one(slice({1}, -5, {0})), "cuda"), "cuda executor: bad num_computed");
}

// Overlapped steps: only an executor that samples on its device can have kept a token there.
TEST(step_layout, refuses_a_kept_token_where_the_executor_keeps_none) {
  sequence_slice kept = slice({0}, 3, {0});
  kept.last_token_from = 0;
  EXPECT_EQ(refusal(one(kept)), "cpu executor: last_token_from names no token it kept");
  EXPECT_EQ(refusal(one(kept), "cuda", true), "");
  sequence_slice empty = slice({}, 3, {0});
  empty.last_token_from = 0;
  EXPECT_EQ(refusal(one(empty), "cuda", true), "cuda executor: last_token_from names no token it kept");
}

TEST(step_layout, refuses_a_block_table_that_does_not_cover_the_sequence) {
  // Positions [0, 5) need two blocks of 4.
  EXPECT_EQ(refusal(one(slice({1, 2, 3, 4, 5}, 0, {0}))), "cpu executor: block table does not cover the sequence");
  // The cached positions count too: [4, 5) is in the second block.
  EXPECT_EQ(refusal(one(slice({1}, 4, {0})), "cuda"), "cuda executor: block table does not cover the sequence");
  EXPECT_EQ(refusal(one(slice({}, 1, {}))), "cpu executor: block table does not cover the sequence");
  EXPECT_EQ(refusal(one(slice({1, 2, 3, 4}, 0, {0}))), "");  // exactly one full block
}

TEST(step_layout, refuses_a_used_block_outside_the_device_pool) {
  EXPECT_EQ(refusal(one(slice({1}, 0, {8}))), "cpu executor: block id out of range");
  EXPECT_EQ(refusal(one(slice({1}, 0, {-1}))), "cpu executor: block id out of range");
  // A block holding only cached positions is used as well (attention reads it).
  EXPECT_EQ(refusal(one(slice({1}, 4, {9, 0})), "cuda"), "cuda executor: block id out of range");
  // Blocks past the last position are not looked at: tables may carry blocks allocated ahead.
  EXPECT_EQ(refusal(one(slice({1}, 0, {7, 99, -1}))), "");
}

// Every layer with a window (the widest 6): the slice's first query at 13 reads keys 8..13, so the
// entries of blocks 0 and 1 may be no_block (freed); inside the window they may not, nor anything out
// of range before it. One full-attention layer makes every entry read.
TEST(step_layout, accepts_freed_entries_before_the_window_only) {
  model_config windowed = tiny_config();
  windowed.num_layers = 2;
  windowed.layers = {layer_attention{6}, layer_attention{4}};
  ASSERT_EQ(windowed.kv_window(), 6);
  auto check = [&](const model_config& c, std::vector<block_id> table, int32_t num_computed = 13) -> std::string {
    step_layout layout;
    step_output out;
    try {
      build_step_layout(one(slice({1, 2}, num_computed, std::move(table))), pool(4, 8), c, false, "cpu", layout, out);
    } catch (const invalid_request& e) { return e.what(); }
    return "";
  };
  EXPECT_EQ(check(windowed, {no_block, no_block, 3, 4}), "");
  EXPECT_EQ(check(windowed, {5, no_block, 3, 4}), "");
  EXPECT_EQ(check(windowed, {no_block, no_block, no_block, 4}), "cpu executor: block id out of range");
  EXPECT_EQ(check(windowed, {no_block, 9, 3, 4}), "cpu executor: block id out of range");
  EXPECT_EQ(check(windowed, {no_block, no_block, 3, 4}, 12), "cpu executor: block id out of range")
      << "the query at 12 reads key 7, in block 1";
  model_config global = windowed;
  global.layers[1].sliding_window = 0;
  ASSERT_EQ(global.kv_window(), 0);
  EXPECT_EQ(check(global, {no_block, no_block, 3, 4}), "cpu executor: block id out of range");
}

TEST(step_layout, refuses_a_token_outside_the_vocabulary) {
  EXPECT_EQ(refusal(one(slice({1, k_vocab}, 0, {0}))), "cpu executor: token id out of range");
  EXPECT_EQ(refusal(one(slice({-1}, 0, {0})), "cuda"), "cuda executor: token id out of range");
  EXPECT_EQ(refusal(one(slice({0, k_vocab - 1}, 0, {0}))), "");
}

TEST(step_layout, reports_the_first_problem_in_batch_order) {
  step_batch b;
  b.seqs.push_back(slice({1}, 0, {0}));
  b.seqs.push_back(slice({k_vocab}, 0, {8}));  // both its block and its token are out of range
  b.seqs.push_back(slice({1}, -1, {0}));
  EXPECT_EQ(refusal(b), "cpu executor: block id out of range");
  // Swaps and copies are check_block_moves' business, not this function's.
  step_batch moves;
  moves.swap_in.push_back({99, 99});
  moves.copies.push_back({-1, 99});
  EXPECT_EQ(refusal(moves), "");
}

// Block size 4, 8 device blocks, vocabulary 100:
//   s0  prompt chunk   tokens 10..14 at positions 0..4   logits none
//   s1  decode         token 20 at position 6            logits last
//   s2  later chunk    tokens 30..32 at positions 2..4   logits all
//   s3  empty slice    9 positions cached                logits last (and a sampling state): no row
//   s4  decode         token 40 at position 3            logits last, with a sampling state
step_batch mixed_batch() {
  step_batch b;
  b.seqs.push_back(slice({10, 11, 12, 13, 14}, 0, {0, 1}, mode::none));
  b.seqs.push_back(slice({20}, 6, {2, 3}, mode::last));
  b.seqs.push_back(slice({30, 31, 32}, 2, {4, 5}, mode::all));
  b.seqs.push_back(slice({}, 9, {6, 7, 1}, mode::last));
  b.seqs.back().sampling = device_sampling{};
  b.seqs.push_back(slice({40}, 3, {7}, mode::last));
  b.seqs.back().sampling = device_sampling{};
  return b;
}

void expect_mixed_rows(const step_layout& l) {
  EXPECT_EQ(l.token_ids, (std::vector<token_id>{10, 11, 12, 13, 14, 20, 30, 31, 32, 40}));
  EXPECT_EQ(l.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 6, 2, 3, 4, 3}));
  EXPECT_EQ(l.token_seq, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 2, 2, 2, 4}));
  EXPECT_EQ(l.num_tokens(), 10);
  ASSERT_EQ(l.seqs.size(), 5u);
  const std::vector<std::pair<int32_t, int32_t>> want = {{0, 5}, {5, 1}, {6, 3}, {9, 0}, {9, 1}};
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(l.seqs[s].token_begin, want[s].first) << "sequence " << s;
    EXPECT_EQ(l.seqs[s].num_tokens, want[s].second) << "sequence " << s;
  }
  // The empty slice's 9 cached positions are the longest context, though it brings no token.
  EXPECT_EQ(l.max_context, 9);
}

TEST(step_layout, flattens_a_mixed_batch_for_host_sampling) {
  const step_batch b = mixed_batch();
  step_layout l;
  step_output out;
  out.sampled.resize(2);  // an executor that does not sample leaves it alone
  build_step_layout(b, pool(4, 8), tiny_config(), /*samples_on_device=*/false, "cpu", l, out);
  expect_mixed_rows(l);
  // Rows: s1's last token, s2's three, s4's last (its sampling state is ignored here).
  EXPECT_EQ(l.logit_tokens, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_TRUE(l.device_sampled_seqs.empty());
  EXPECT_TRUE(l.device_sampled_tokens.empty());
  EXPECT_EQ(out.vocab_size, k_vocab);
  EXPECT_EQ(out.first_row, (std::vector<int32_t>{0, 0, 1, 4, 4}));
  EXPECT_EQ(out.num_rows, (std::vector<int32_t>{0, 1, 3, 0, 1}));
  EXPECT_EQ(out.logits.size(), 5u * k_vocab);
  EXPECT_EQ(out.sampled.size(), 2u);
}

TEST(step_layout, flattens_a_mixed_batch_for_device_sampling) {
  const step_batch b = mixed_batch();
  step_layout l;
  step_output out;
  out.sampled.resize(1);
  out.sampled[0].token = 7;
  build_step_layout(b, pool(4, 8), tiny_config(), /*samples_on_device=*/true, "cuda", l, out);
  expect_mixed_rows(l);
  // s4 is sampled on the device: no host row, its last token (row 9) listed separately. s3 has a
  // sampling state too but no token, so nothing to sample.
  EXPECT_EQ(l.logit_tokens, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(l.device_sampled_seqs, (std::vector<int32_t>{4}));
  EXPECT_EQ(l.device_sampled_tokens, (std::vector<int32_t>{9}));
  EXPECT_EQ(out.first_row, (std::vector<int32_t>{0, 0, 1, 4, 4}));
  EXPECT_EQ(out.num_rows, (std::vector<int32_t>{0, 1, 3, 0, 0}));
  EXPECT_EQ(out.logits.size(), 4u * k_vocab);
  ASSERT_EQ(out.sampled.size(), 5u);  // one fresh entry per sequence
  for (const sampled_token& t : out.sampled) EXPECT_EQ(t.token, -1);
}

TEST(step_layout, starts_afresh_each_step) {
  step_layout l;
  step_output out;
  build_step_layout(mixed_batch(), pool(4, 8), tiny_config(), true, "cuda", l, out);
  step_batch decode;
  decode.seqs.push_back(slice({55}, 1, {3}, mode::last));
  build_step_layout(decode, pool(4, 8), tiny_config(), true, "cuda", l, out);
  EXPECT_EQ(l.token_ids, (std::vector<token_id>{55}));
  EXPECT_EQ(l.positions, (std::vector<int32_t>{1}));
  EXPECT_EQ(l.token_seq, (std::vector<int32_t>{0}));
  ASSERT_EQ(l.seqs.size(), 1u);
  EXPECT_EQ(l.seqs[0].token_begin, 0);
  EXPECT_EQ(l.seqs[0].num_tokens, 1);
  EXPECT_EQ(l.logit_tokens, (std::vector<int32_t>{0}));
  EXPECT_TRUE(l.device_sampled_seqs.empty());
  EXPECT_TRUE(l.device_sampled_tokens.empty());
  EXPECT_EQ(l.max_context, 2);
  EXPECT_EQ(out.first_row, (std::vector<int32_t>{0}));
  EXPECT_EQ(out.num_rows, (std::vector<int32_t>{1}));
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(k_vocab));
  EXPECT_EQ(out.sampled.size(), 1u);
  // An empty batch: no rows at all.
  build_step_layout(step_batch{}, pool(4, 8), tiny_config(), false, "cpu", l, out);
  EXPECT_EQ(l.num_tokens(), 0);
  EXPECT_TRUE(l.seqs.empty());
  EXPECT_TRUE(l.logit_tokens.empty());
  EXPECT_EQ(l.max_context, 0);
  EXPECT_TRUE(out.first_row.empty());
  EXPECT_TRUE(out.logits.empty());
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Embedding slices (sequence_slice::hidden) get one zeroed row of step_output::hidden each, in batch
// order, and no logits row; empty ones get none.
TEST(step_layout, pooled_sequences_get_their_hidden_rows) {
  model_config c = tiny_config();
  c.hidden_size = 3;
  step_batch b;
  b.seqs.push_back(slice({1, 2, 3}, 0, {0}, mode::none));
  b.seqs.back().hidden = sequence_slice::hidden_mode::sum;
  b.seqs.push_back(slice({4}, 3, {1}, mode::last));  // a decode between them
  b.seqs.push_back(slice({5, 6}, 0, {2}, mode::none));
  b.seqs.back().hidden = sequence_slice::hidden_mode::last;
  b.seqs.push_back(slice({}, 0, {3}, mode::none));  // nothing new: nothing pooled
  b.seqs.back().hidden = sequence_slice::hidden_mode::sum;
  step_layout layout;
  step_output out;
  out.hidden.assign(100, 7.0f);  // a reused output: the rows are zeroed
  build_step_layout(b, pool(4, 8), c, false, "cpu", layout, out);
  EXPECT_EQ(layout.pooled_seqs, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(out.hidden_row, (std::vector<int32_t>{0, -1, 1, -1}));
  EXPECT_EQ(out.hidden_size, 3);
  EXPECT_EQ(out.hidden, std::vector<float>(6, 0.0f));
  EXPECT_EQ(out.num_rows, (std::vector<int32_t>{0, 1, 0, 0}));
  EXPECT_EQ(out.hidden_of(2).size(), 3u);
  EXPECT_TRUE(out.hidden_of(1).empty());
}

// Token trees (sequence_slice::tree_parents): rows keep their slots (num_computed + i) but take their
// depth as position, each row's ancestor set is itself plus its parent's, and only an executor that
// verifies trees may get one; malformed parents and trees with hidden rows or prompt scores are refused.
TEST(step_layout, token_trees_get_positions_by_depth_slots_by_row_and_their_ancestors) {
  sequence_slice chain = slice({5, 6}, 3, {0, 1}, mode::last);
  // Root 7 at 10; children 8 and 9 of the root; 10 under 8; 11 under 10.
  sequence_slice tree = slice({7, 8, 9, 10, 11}, 10, {2, 3, 4, 5}, mode::all);
  tree.tree_parents = {-1, 0, 0, 1, 3};
  step_batch b;
  b.seqs.push_back(chain);
  b.seqs.push_back(tree);
  step_layout layout;
  step_output out;
  build_step_layout(b, pool(4, 8), tiny_config(), false, "cpu", layout, out, /*allow_trees=*/true);
  EXPECT_EQ(layout.positions, (std::vector<int32_t>{3, 4, 10, 11, 11, 12, 13}));
  EXPECT_EQ(layout.slots, (std::vector<int32_t>{3, 4, 10, 11, 12, 13, 14}));
  EXPECT_EQ(layout.tree_row, (std::vector<int32_t>{-1, -1, 0, 1, 2, 3, 4}));
  EXPECT_TRUE(layout.ancestors[0].empty());
  auto sees = [&](int32_t q) {
    std::vector<int32_t> v;
    for (int32_t k = 0; k < 5; ++k)
      if (layout.sees(1, q, k)) v.push_back(k);
    return v;
  };
  EXPECT_EQ(sees(0), (std::vector<int32_t>{0}));
  EXPECT_EQ(sees(2), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(sees(4), (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_EQ(out.num_rows, (std::vector<int32_t>{1, 5}));

  EXPECT_EQ(refusal(one(tree)), "cpu executor: token trees are not supported");  // allow_trees false
  auto refused = [&](sequence_slice s) {
    step_layout l;
    step_output o;
    try {
      build_step_layout(one(std::move(s)), pool(4, 8), tiny_config(), false, "cpu", l, o, true);
    } catch (const invalid_request& e) { return std::string(e.what()); }
    return std::string();
  };
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{0, 0, 0, 1, 3}, std::vector<int32_t>{-1, 0, 0, 1}}) {
    sequence_slice s = tree;
    s.tree_parents = bad;
    EXPECT_EQ(refused(s), "cpu executor: tree_parents must have one entry per token, -1 first");
  }
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{-1, 0, 2, 1, 3}, std::vector<int32_t>{-1, -1, 0, 1, 3}}) {
    sequence_slice s = tree;
    s.tree_parents = bad;
    EXPECT_EQ(refused(s), "cpu executor: a tree parent must be an earlier token of the slice");
  }
  sequence_slice pooled = tree;
  pooled.hidden = sequence_slice::hidden_mode::sum;
  EXPECT_EQ(refused(pooled), "cpu executor: a token tree has no hidden rows or prompt scores");
  EXPECT_EQ(refused(tree), "");
}

}  // namespace
}  // namespace tessera
