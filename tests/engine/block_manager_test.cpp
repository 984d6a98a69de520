#include "engine/block_manager.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "engine/base/error.hpp"

namespace tessera {
namespace {

std::vector<token_id> iota_tokens(int32_t n, token_id first = 100) {
  std::vector<token_id> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

block_manager make(int32_t block_size, int32_t device, int32_t host = 0, bool caching = true) {
  return block_manager(block_manager_options{block_size, device, host, caching});
}

#define EXPECT_INVARIANTS(bm) EXPECT_EQ((bm).check_invariants(), "")

TEST(block_manager, rejects_bad_sizes) {
  EXPECT_THROW(make(0, 4), invalid_request);
  EXPECT_THROW(make(4, 0), invalid_request);
  EXPECT_THROW(make(4, 4, -1), invalid_request);
}

TEST(block_manager, allocates_blocks_for_token_ranges_and_frees_them) {
  auto bm = make(4, 8);
  std::vector<block_copy> copies;
  auto t = iota_tokens(10);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 6, 0, copies));  // positions 0..5 -> 2 blocks
  EXPECT_EQ(bm.num_blocks(seq_id{1}), 2);
  bm.commit_computed(seq_id{1}, t, 6);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 6, 4, 0, copies));  // 0..9 -> 3 blocks
  EXPECT_EQ(bm.num_blocks(seq_id{1}), 3);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_INVARIANTS(bm);
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_FALSE(bm.has(seq_id{1}));
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, failed_allocation_changes_nothing) {
  auto bm = make(4, 4);
  std::vector<block_copy> copies;
  auto t = iota_tokens(20);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 8, 0, copies));
  auto before = bm.snapshot();
  EXPECT_FALSE(bm.allocate_slots(seq_id{2}, t, 0, 12, 0, copies));  // 3 blocks, 2 free
  EXPECT_FALSE(bm.allocate_slots(seq_id{1}, t, 8, 4, 2, copies));   // 1 block but 2 reserved
  EXPECT_TRUE(bm.allocate_slots(seq_id{1}, t, 8, 4, 1, copies));
  EXPECT_EQ(bm.num_blocks(seq_id{2}), 0);
  EXPECT_EQ(before[3].ref_count, 0);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, fork_shares_blocks_and_copies_on_write) {
  auto bm = make(4, 8, 0, false);
  std::vector<block_copy> copies;
  auto t = iota_tokens(10);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 10, 0, copies));
  bm.commit_computed(seq_id{1}, t, 10);
  bm.fork(seq_id{1}, seq_id{2});
  bm.fork(seq_id{1}, seq_id{3});
  const auto table = bm.block_table(seq_id{1});
  EXPECT_EQ(bm.block_table(seq_id{2}), table);
  EXPECT_EQ(bm.snapshot()[static_cast<size_t>(table[2])].ref_count, 3);
  EXPECT_EQ(bm.num_free_blocks(), 5);  // nothing copied yet
  EXPECT_INVARIANTS(bm);

  // Child 2 writes position 10, inside the shared partial block 2: it gets a private copy.
  auto t2 = t;
  t2.push_back(7);
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t2, 10, 1, 0, copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, table[2]);
  EXPECT_NE(copies[0].dst, table[2]);
  EXPECT_EQ(bm.block_table(seq_id{2})[2], copies[0].dst);
  EXPECT_EQ(bm.block_table(seq_id{2})[0], table[0]);  // full blocks stay shared
  copies.clear();
  // Child 3 copies as well; then the parent is the last holder and writes in place.
  ASSERT_TRUE(bm.allocate_slots(seq_id{3}, t2, 10, 1, 0, copies));
  EXPECT_EQ(copies.size(), 1u);
  copies.clear();
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t2, 10, 1, 0, copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.block_table(seq_id{1}), table);
  EXPECT_INVARIANTS(bm);
  for (uint64_t s : {1, 2, 3}) bm.free(seq_id{s});
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, fork_at_block_boundary_needs_no_copy) {
  auto bm = make(4, 8, 0, false);
  std::vector<block_copy> copies;
  auto t = iota_tokens(9);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 8, 0, copies));
  bm.commit_computed(seq_id{1}, t, 8);
  bm.fork(seq_id{1}, seq_id{2});
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t, 8, 1, 0, copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.num_blocks(seq_id{2}), 3);
  EXPECT_NE(bm.block_table(seq_id{2})[2], bm.block_table(seq_id{1}).size() > 2 ? bm.block_table(seq_id{1})[2] : -1);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, copy_on_write_counts_in_blocks_needed) {
  auto bm = make(4, 3, 0, false);
  std::vector<block_copy> copies;
  auto t = iota_tokens(7);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 6, 0, copies));  // 2 blocks, 1 free
  bm.commit_computed(seq_id{1}, t, 6);
  bm.fork(seq_id{1}, seq_id{2});
  EXPECT_EQ(bm.blocks_needed(seq_id{2}, t, 6, 1), 1);  // copy of the shared partial block
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t, 6, 1, 0, copies));
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(bm.blocks_needed(seq_id{1}, t, 6, 1), 0);  // now sole owner
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, prefix_cache_reuses_full_blocks_of_the_longest_prefix) {
  auto bm = make(4, 16);
  std::vector<block_copy> copies;
  auto a = iota_tokens(11);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 11, 0, copies));
  // Nothing is cached before the computation is committed.
  EXPECT_EQ(bm.cached_prefix_tokens(a), 0);
  bm.commit_computed(seq_id{1}, a, 11);
  EXPECT_EQ(bm.cached_prefix_tokens(a), 8);  // two full blocks; the partial third is not cached

  auto b = iota_tokens(20);
  b[9] = 5;  // differs inside block 2
  EXPECT_EQ(bm.cached_prefix_tokens(b), 8);
  auto c = iota_tokens(20);
  c[2] = 5;  // differs in block 0: nothing matches, the chain breaks at the first block
  EXPECT_EQ(bm.cached_prefix_tokens(c), 0);
  auto d = iota_tokens(20, 104);  // block 1 of `a` alone, at a different position: no match
  EXPECT_EQ(bm.cached_prefix_tokens(d), 0);
  auto exact = iota_tokens(8);  // a prompt equal to the cached prefix keeps one token to compute
  EXPECT_EQ(bm.cached_prefix_tokens(exact), 4);

  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, b, 8, 12, 0, copies));
  EXPECT_EQ(bm.block_table(seq_id{2})[0], bm.block_table(seq_id{1})[0]);
  EXPECT_EQ(bm.block_table(seq_id{2})[1], bm.block_table(seq_id{1})[1]);
  EXPECT_NE(bm.block_table(seq_id{2})[2], bm.block_table(seq_id{1})[2]);
  EXPECT_TRUE(copies.empty());
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, freed_cached_blocks_are_revived_then_evicted_lru) {
  auto bm = make(4, 4);
  std::vector<block_copy> copies;
  auto a = iota_tokens(9, 100);
  auto b = iota_tokens(9, 500);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 8, 0, copies));
  bm.commit_computed(seq_id{1}, a, 8);
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_cached_free_blocks(), 2);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_EQ(bm.cached_prefix_tokens(a), 8);
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, b, 0, 8, 0, copies));  // takes the 2 plain free blocks
  EXPECT_EQ(bm.cached_prefix_tokens(a), 8);
  bm.commit_computed(seq_id{2}, b, 8);
  // A third allocation must evict: `a`'s tail block (freed first) goes before its head block.
  auto c = iota_tokens(5, 900);
  ASSERT_TRUE(bm.allocate_slots(seq_id{3}, c, 0, 4, 0, copies));
  EXPECT_EQ(bm.cached_prefix_tokens(a), 4);
  EXPECT_INVARIANTS(bm);
  // Reviving the remaining cached block takes it off the free list.
  bm.free(seq_id{3});
  EXPECT_EQ(bm.blocks_needed(seq_id{4}, a, 4, 4), 2);
  ASSERT_TRUE(bm.allocate_slots(seq_id{4}, a, 4, 4, 0, copies));
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, reviving_a_cached_block_counts_against_free_blocks) {
  auto bm = make(4, 3);
  std::vector<block_copy> copies;
  auto a = iota_tokens(9);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 8, 0, copies));
  bm.commit_computed(seq_id{1}, a, 8);
  bm.free(seq_id{1});
  // 8 cached tokens: 2 revived + 1 new block = all 3 blocks.
  EXPECT_EQ(bm.blocks_needed(seq_id{2}, a, 8, 1), 3);
  EXPECT_FALSE(bm.allocate_slots(seq_id{2}, a, 8, 1, 1, copies));
  EXPECT_TRUE(bm.allocate_slots(seq_id{2}, a, 8, 1, 0, copies));
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, disabled_prefix_cache_never_hits) {
  auto bm = make(4, 8, 0, false);
  std::vector<block_copy> copies;
  auto a = iota_tokens(9);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 9, 0, copies));
  bm.commit_computed(seq_id{1}, a, 9);
  EXPECT_EQ(bm.cached_prefix_tokens(a), 0);
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_cached_free_blocks(), 0);
}

TEST(block_manager, swap_out_and_in_round_trip) {
  auto bm = make(4, 4, 3);
  std::vector<block_copy> out, in, copies;
  auto t = iota_tokens(10);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 10, 0, copies));
  bm.commit_computed(seq_id{1}, t, 10);
  const auto table = bm.block_table(seq_id{1});
  ASSERT_TRUE(bm.swap_out(seq_id{1}, out));
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i].src, table[i]);
  EXPECT_TRUE(bm.is_swapped(seq_id{1}));
  EXPECT_EQ(bm.num_host_blocks_of(seq_id{1}), 3);
  EXPECT_EQ(bm.num_free_host_blocks(), 0);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_INVARIANTS(bm);
  // Someone else takes 2 blocks: only 2 remain, swap-in must fail cleanly.
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t, 0, 8, 0, copies));
  EXPECT_FALSE(bm.swap_in(seq_id{1}, 0, in));
  EXPECT_TRUE(in.empty());
  bm.free(seq_id{2});
  EXPECT_FALSE(bm.swap_in(seq_id{1}, 2, in));  // 4 free, 3 needed, 2 reserved
  ASSERT_TRUE(bm.swap_in(seq_id{1}, 1, in));
  ASSERT_EQ(in.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(in[i].src, out[i].dst);  // host block i comes back as logical block i
    EXPECT_EQ(in[i].dst, bm.block_table(seq_id{1})[i]);
  }
  EXPECT_EQ(bm.num_free_host_blocks(), 3);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, swap_out_fails_when_the_host_pool_is_full) {
  auto bm = make(4, 4, 1);
  std::vector<block_copy> out, copies;
  auto t = iota_tokens(8);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 8, 0, copies));
  EXPECT_FALSE(bm.swap_out(seq_id{1}, out));
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(bm.is_swapped(seq_id{1}));
  EXPECT_INVARIANTS(bm);
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_free_blocks(), 4);
}

TEST(block_manager, snapshot_and_slot_usage_count_shared_blocks_once) {
  auto bm = make(4, 8, 0, false);
  std::vector<block_copy> copies;
  auto t = iota_tokens(6);
  ASSERT_TRUE(bm.allocate_slots(seq_id{7}, t, 0, 6, 0, copies));
  bm.commit_computed(seq_id{7}, t, 6);
  bm.fork(seq_id{7}, seq_id{9});
  auto snap = bm.snapshot();
  const auto table = bm.block_table(seq_id{7});
  EXPECT_EQ(snap[static_cast<size_t>(table[0])].num_filled, 4);
  EXPECT_EQ(snap[static_cast<size_t>(table[1])].num_filled, 2);
  EXPECT_EQ(snap[static_cast<size_t>(table[1])].ref_count, 2);
  EXPECT_EQ(snap[static_cast<size_t>(table[1])].owner, seq_id{7});
  auto usage = bm.slots();
  EXPECT_EQ(usage.num_allocated, 8);
  EXPECT_EQ(usage.num_filled, 6);
  EXPECT_DOUBLE_EQ(usage.waste(), 0.25);
}

TEST(block_manager, host_snapshot_shows_swapped_blocks_and_their_owner) {
  auto bm = make(4, 8, 6, false);
  std::vector<block_copy> copies, out, in;
  auto t = iota_tokens(10);
  ASSERT_TRUE(bm.allocate_slots(seq_id{3}, t, 0, 10, 0, copies));
  bm.commit_computed(seq_id{3}, t, 10);
  auto host = bm.host_snapshot();
  ASSERT_EQ(host.size(), 6u);
  for (const auto& b : host) EXPECT_EQ(b.ref_count, 0);
  ASSERT_TRUE(bm.swap_out(seq_id{3}, out));
  host = bm.host_snapshot();
  ASSERT_EQ(out.size(), 3u);
  std::vector<int32_t> filled;
  for (const auto& c : out) {  // device -> host pairs, in block-table order
    const block_info& b = host[static_cast<size_t>(c.dst)];
    EXPECT_EQ(b.id, c.dst);
    EXPECT_EQ(b.ref_count, 1);
    EXPECT_EQ(b.owner, seq_id{3});
    EXPECT_FALSE(b.cached);
    filled.push_back(b.num_filled);
  }
  EXPECT_EQ(filled, (std::vector<int32_t>{4, 4, 2}));
  int held = 0;
  for (const auto& b : host) held += b.ref_count;
  EXPECT_EQ(held, 3);
  for (const auto& b : bm.snapshot()) EXPECT_EQ(b.ref_count, 0) << "swapped out: no device block held";
  ASSERT_TRUE(bm.swap_in(seq_id{3}, 0, in));
  for (const auto& b : bm.host_snapshot()) EXPECT_EQ(b.ref_count, 0);
}

// ---- sliding-window attention: blocks no layer's window reaches are freed -----------------------

block_manager make_windowed(int32_t block_size, int32_t device, int32_t window, int32_t host = 0, bool caching = true) {
  block_manager_options o{block_size, device, host, caching};
  o.attention_window = window;
  return block_manager(o);
}

TEST(block_manager, window_frees_a_block_exactly_when_it_leaves_the_window) {
  // Window 6: the query at p reads keys p-5..p. Block 0 (positions 0..3) is dead once the next query
  // is at 9 (it reads 4..9), i.e. after 9 computed tokens; at 8 computed the query at 8 still reads 3.
  auto bm = make_windowed(4, 16, 6);
  EXPECT_EQ(bm.attention_window(), 6);
  std::vector<block_copy> copies;
  const auto t = iota_tokens(40);
  const int32_t free_before = bm.num_free_blocks();
  for (int32_t n = 0; n < 40; ++n) {
    ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, n, 1, 0, copies));
    bm.commit_computed(seq_id{1}, t, n + 1);
    const int32_t computed = n + 1;
    const int32_t dead = std::max(0, computed - 5) / 4;  // blocks wholly before computed - 6 + 1
    ASSERT_EQ(bm.num_freed_blocks(seq_id{1}), dead) << computed;
    ASSERT_EQ(bm.blocks_outside_window(computed), dead);
    const auto& table = bm.block_table(seq_id{1});
    ASSERT_EQ(static_cast<int32_t>(table.size()), bm.blocks_for(computed)) << "the table keeps its logical length";
    ASSERT_EQ(bm.num_logical_blocks(seq_id{1}), bm.blocks_for(computed));
    for (int32_t i = 0; i < static_cast<int32_t>(table.size()); ++i) {
      // An entry is freed exactly when its whole block is before the next query's first key.
      ASSERT_EQ(table[static_cast<size_t>(i)] == no_block, (i + 1) * 4 <= computed - 5) << computed << " " << i;
    }
    ASSERT_EQ(bm.num_blocks(seq_id{1}), bm.blocks_for(computed) - dead);
    ASSERT_LE(bm.num_blocks(seq_id{1}), (6 - 1 + 3) / 4 + 1) << "ceil((w - 1) / block_size) + 1 between steps";
    ASSERT_EQ(bm.num_free_blocks(), free_before - bm.num_blocks(seq_id{1}));
    ASSERT_EQ(bm.check_invariants(), "") << computed;
  }
  EXPECT_EQ(bm.num_freed_blocks(seq_id{1}), 35 / 4);
  EXPECT_EQ(bm.num_window_freed_blocks(), 35 / 4);
  EXPECT_TRUE(copies.empty());
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_free_blocks(), 16);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, window_of_a_prefill_chunk_frees_after_the_commit) {
  // A 20-token prefill holds all 5 blocks during its step; its commit indexes the full blocks and
  // then frees the three the next query (at 20, keys 15..20) no longer reads: cached-free, revivable.
  auto bm = make_windowed(4, 8, 6);
  std::vector<block_copy> copies;
  const auto t = iota_tokens(24);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 20, 0, copies));
  EXPECT_EQ(bm.num_blocks(seq_id{1}), 5);
  EXPECT_EQ(bm.num_freed_blocks(seq_id{1}), 0);
  bm.commit_computed(seq_id{1}, t, 20);
  EXPECT_EQ(bm.num_freed_blocks(seq_id{1}), 3);
  EXPECT_EQ(bm.num_blocks(seq_id{1}), 2);
  EXPECT_EQ(bm.num_cached_free_blocks(), 3);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  const auto snap = bm.snapshot();
  int32_t cached_free = 0;
  for (const block_info& b : snap) cached_free += b.cached && b.ref_count == 0 && b.num_filled == 4;
  EXPECT_EQ(cached_free, 3) << "the dashboard shows them as cached-free blocks";
  const auto usage = bm.slots();
  EXPECT_EQ(usage.num_allocated, 8) << "only held blocks count as allocated";
  EXPECT_EQ(usage.num_filled, 8);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, window_prefix_hit_takes_only_the_blocks_its_window_reads) {
  auto bm = make_windowed(4, 8, 6);
  std::vector<block_copy> copies;
  const auto a = iota_tokens(20);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 20, 0, copies));
  bm.commit_computed(seq_id{1}, a, 20);  // blocks 0..4 indexed, 0..2 freed (cached-free)
  const std::vector<block_id> table_a = bm.block_table(seq_id{1});

  auto b = iota_tokens(24);  // a's 20 tokens, then 4 more
  EXPECT_EQ(bm.cached_prefix_tokens(b), 20);
  // Admitted at 20 computed: the query at 20 reads 15..20, blocks 3..4 (a's, held) and the new 5.
  EXPECT_EQ(bm.blocks_needed(seq_id{2}, b, 20, 4), 1) << "nothing revived, one new block";
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, b, 20, 4, 0, copies));
  const auto& table_b = bm.block_table(seq_id{2});
  ASSERT_EQ(table_b.size(), 6u);
  EXPECT_EQ(table_b[0], no_block);
  EXPECT_EQ(table_b[1], no_block);
  EXPECT_EQ(table_b[2], no_block);
  EXPECT_EQ(table_b[3], table_a[3]);
  EXPECT_EQ(table_b[4], table_a[4]);
  EXPECT_EQ(bm.num_freed_blocks(seq_id{2}), 3);
  EXPECT_EQ(bm.num_cached_free_blocks(), 3) << "the freed prefix blocks are not revived";
  EXPECT_TRUE(copies.empty());
  EXPECT_INVARIANTS(bm);

  // Evict every cached-free block: hits whose window still is cached (blocks 3..4) survive, because the
  // chain hash of block 4 vouches for the whole 20-token prefix; shorter hits, which would read the
  // evicted blocks, are gone.
  bm.commit_computed(seq_id{2}, b, 24);
  const auto c = iota_tokens(17, 900);
  ASSERT_TRUE(bm.allocate_slots(seq_id{3}, c, 0, 17, 0, copies));  // 5 blocks: 2 plain free, then 3 evicted
  EXPECT_EQ(bm.num_cached_free_blocks(), 0);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(bm.cached_prefix_tokens(iota_tokens(21)), 20);
  EXPECT_EQ(bm.cached_prefix_tokens(iota_tokens(13)), 0) << "a hit at 12 would read the evicted block 2";
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, without_a_window_a_hit_needs_every_prefix_block) {
  auto bm = make(4, 8);
  std::vector<block_copy> copies;
  const auto a = iota_tokens(20);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 20, 0, copies));
  bm.commit_computed(seq_id{1}, a, 20);
  bm.free(seq_id{1});  // all 5 cached-free; block 4 (the tail) is evicted first
  const auto c = iota_tokens(13, 900);
  ASSERT_TRUE(bm.allocate_slots(seq_id{3}, c, 0, 13, 0, copies));  // 3 plain free + 1 evicted
  EXPECT_EQ(bm.cached_prefix_tokens(iota_tokens(21)), 16);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, window_fork_shares_held_blocks_and_each_child_frees_its_own_references) {
  auto bm = make_windowed(4, 12, 5, 0, false);
  std::vector<block_copy> copies;
  auto t = iota_tokens(14);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 14, 0, copies));
  bm.commit_computed(seq_id{1}, t, 14);  // the query at 14 reads 10..14: blocks 0, 1 freed
  ASSERT_EQ(bm.num_freed_blocks(seq_id{1}), 2);
  bm.fork(seq_id{1}, seq_id{2});
  EXPECT_EQ(bm.block_table(seq_id{2}), bm.block_table(seq_id{1}));
  EXPECT_EQ(bm.num_freed_blocks(seq_id{2}), 2);
  const auto table = bm.block_table(seq_id{1});
  EXPECT_EQ(bm.snapshot()[static_cast<size_t>(table[2])].ref_count, 2);
  EXPECT_EQ(bm.snapshot()[static_cast<size_t>(table[3])].ref_count, 2);
  EXPECT_INVARIANTS(bm);
  // Both write position 14 inside the shared partial block 3: the child copies it first.
  auto t2 = t;
  t2.push_back(7);
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t2, 14, 1, 0, copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, table[3]);
  bm.commit_computed(seq_id{2}, t2, 15);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t2, 14, 1, 0, copies));
  EXPECT_EQ(copies.size(), 1u) << "the parent is now the last holder and writes in place";
  bm.commit_computed(seq_id{1}, t2, 15);
  EXPECT_INVARIANTS(bm);
  // Both decode on to 19: block 2 (8..11) leaves the window at 16 computed (keys 12..16), in each.
  for (int32_t n = 15; n < 19; ++n) {
    t2.push_back(8);
    for (const uint64_t s : {1, 2}) {
      ASSERT_TRUE(bm.allocate_slots(seq_id{s}, t2, n, 1, 0, copies));
      bm.commit_computed(seq_id{s}, t2, n + 1);
    }
    ASSERT_EQ(bm.check_invariants(), "") << n;
    // Right after both committed 16 (the block is reused by later allocations of the free list).
    if (n == 15) { EXPECT_EQ(bm.snapshot()[static_cast<size_t>(table[2])].ref_count, 0) << "freed by both"; }
  }
  EXPECT_EQ(bm.num_freed_blocks(seq_id{1}), 3);
  EXPECT_EQ(bm.num_freed_blocks(seq_id{2}), 3);
  for (const uint64_t s : {1, 2}) bm.free(seq_id{s});
  EXPECT_EQ(bm.num_free_blocks(), 12);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, window_swap_moves_only_the_held_blocks) {
  auto bm = make_windowed(4, 8, 6, 4, false);
  std::vector<block_copy> out, in, copies;
  auto t = iota_tokens(22);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 22, 0, copies));
  bm.commit_computed(seq_id{1}, t, 22);  // the query at 22 reads 17..22: blocks 0..3 freed, 4..5 held
  ASSERT_EQ(bm.num_freed_blocks(seq_id{1}), 4);
  const auto table = bm.block_table(seq_id{1});
  ASSERT_TRUE(bm.swap_out(seq_id{1}, out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].src, table[4]);
  EXPECT_EQ(out[1].src, table[5]);
  EXPECT_EQ(bm.num_host_blocks_of(seq_id{1}), 2);
  EXPECT_EQ(bm.num_blocks(seq_id{1}), 0);
  EXPECT_EQ(bm.num_logical_blocks(seq_id{1}), 6);
  EXPECT_EQ(bm.num_freed_blocks(seq_id{1}), 4);
  std::vector<int32_t> filled;
  for (const block_copy& c : out) filled.push_back(bm.host_snapshot()[static_cast<size_t>(c.dst)].num_filled);
  EXPECT_EQ(filled, (std::vector<int32_t>{4, 2})) << "host block i holds table entry num_freed + i";
  EXPECT_INVARIANTS(bm);
  ASSERT_TRUE(bm.swap_in(seq_id{1}, 0, in));
  ASSERT_EQ(in.size(), 2u);
  const auto& back = bm.block_table(seq_id{1});
  ASSERT_EQ(back.size(), 6u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(back[i], no_block);
  EXPECT_EQ(back[4], in[0].dst);
  EXPECT_EQ(back[5], in[1].dst);
  EXPECT_INVARIANTS(bm);
}

// Randomized: a reference model of reference counts checked against the manager after every op.
// `groups`: windows of KV layer groups (empty: one group with `window`).
void random_operations(uint32_t seed, int32_t window, std::vector<int32_t> groups = {}) {
  {
    std::mt19937 rng(seed);
    const int32_t bs = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t device =
        (4 + static_cast<int32_t>(rng() % 12)) * std::max<int32_t>(1, static_cast<int32_t>(groups.size()));
    block_manager_options o{bs, device,
                            static_cast<int32_t>(rng() % 8) * std::max<int32_t>(1, static_cast<int32_t>(groups.size())),
                            rng() % 2 == 0};
    o.attention_window = window;
    o.group_windows = groups;
    block_manager bm(o);
    struct live {
      std::vector<token_id> tokens;
      int32_t computed = 0;
    };
    std::map<seq_id, live> seqs;
    seq_id next = seq_id{1};
    std::vector<block_copy> copies, swaps;
    for (int op = 0; op < 300; ++op) {
      const uint32_t kind = rng() % 6;
      if (kind == 0 || seqs.empty()) {  // new sequence, from a small alphabet so prefixes repeat
        live l;
        const int32_t n = 1 + static_cast<int32_t>(rng() % 12);
        for (int32_t i = 0; i < n; ++i) l.tokens.push_back(static_cast<token_id>(rng() % 2));
        const int32_t cached = bm.cached_prefix_tokens(l.tokens);
        ASSERT_EQ(cached % bs, 0);
        ASSERT_LT(cached, n);
        if (bm.allocate_slots(next, l.tokens, cached, n - cached, 0, copies)) {
          bm.commit_computed(next, l.tokens, n);
          l.computed = n;
          seqs.emplace(next, l);
        }
        next = next.next();
      } else {
        auto it = seqs.begin();
        std::advance(it, rng() % seqs.size());
        const seq_id s = it->first;
        live& l = it->second;
        if (kind == 1) {
          bm.free(s);
          seqs.erase(it);
        } else if (kind == 2 && !bm.is_swapped(s)) {
          bm.fork(s, next);
          seqs.emplace(next, l);
          next = next.next();
        } else if (kind == 3 && !bm.is_swapped(s)) {
          l.tokens.push_back(static_cast<token_id>(rng() % 2));
          if (bm.allocate_slots(s, l.tokens, l.computed, 1, 0, copies)) {
            bm.commit_computed(s, l.tokens, ++l.computed);
          } else {
            l.tokens.pop_back();
          }
        } else if (kind == 4 && !bm.is_swapped(s)) {
          bm.swap_out(s, swaps);
        } else if (kind == 5 && bm.is_swapped(s)) {
          bm.swap_in(s, 0, swaps);
        }
      }
      ASSERT_EQ(bm.check_invariants(), "") << "seed " << seed << " window " << window << " op " << op;
      for (const auto& [id, l] : seqs) {
        if (bm.is_swapped(id)) continue;
        // Between steps a group with window w holds at most ceil((w - 1) / bs) + 1 blocks.
        int32_t bound = 0;
        for (int32_t g = 0; g < bm.num_groups(); ++g) {
          const int32_t w = bm.group_window(g);
          bound += w > 0 ? std::min(bm.blocks_for(l.computed), (w - 1 + bs - 1) / bs + 1) : bm.blocks_for(l.computed);
        }
        ASSERT_LE(bm.num_blocks(id), bound) << "seed " << seed << " op " << op;
      }
    }
    for (auto& [s, l] : seqs) bm.free(s);
    ASSERT_EQ(bm.num_free_blocks(), bm.num_device_blocks()) << "seed " << seed;
    ASSERT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks()) << "seed " << seed;
    ASSERT_EQ(bm.check_invariants(), "");
  }
}

TEST(block_manager, random_operations_keep_invariants) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    random_operations(seed, 0);
    if (HasFatalFailure()) return;
  }
}

TEST(block_manager, random_operations_with_a_window_keep_invariants) {
  for (uint32_t seed = 0; seed < 300; ++seed) {
    random_operations(seed, 1 + static_cast<int32_t>(seed % 9));
    if (HasFatalFailure()) return;
  }
}

TEST(block_manager, random_operations_with_layer_groups_keep_invariants) {
  for (uint32_t seed = 0; seed < 300; ++seed) {
    const auto w = 1 + static_cast<int32_t>(seed % 7);
    // Interleaved (windows and a global group, as Gemma), two windows, and windows only.
    const std::vector<std::vector<int32_t>> shapes = {{w, 0}, {w, w, 0}, {w, w + 3}, {0, w}};
    random_operations(seed, 0, shapes[seed % shapes.size()]);
    if (HasFatalFailure()) return;
  }
}

// ---- KV layer groups: one table per group, each freed by its own window ---------------------------

block_manager make_grouped(int32_t block_size, int32_t device, std::vector<int32_t> windows, int32_t host = 0) {
  block_manager_options o{block_size, device, host, true};
  o.group_windows = std::move(windows);
  return block_manager(o);
}

TEST(block_manager, groups_free_only_their_windowed_tables) {
  // Group 0: window 6, group 1: global. Block size 4, 40 tokens decoded one by one.
  auto bm = make_grouped(4, 32, {6, 0});
  EXPECT_EQ(bm.num_groups(), 2);
  EXPECT_EQ(bm.attention_window(), 0) << "a global group bounds nothing";
  std::vector<block_copy> copies;
  const auto t = iota_tokens(40);
  for (int32_t n = 0; n < 40; ++n) {
    ASSERT_EQ(bm.blocks_needed(seq_id{1}, t, n, 1), n % 4 == 0 ? 2 : 0) << "one block per group at a boundary";
    ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, n, 1, 0, copies));
    bm.commit_computed(seq_id{1}, t, n + 1);
    const int32_t computed = n + 1;
    const int32_t dead = std::max(0, computed - 5) / 4;
    const auto& local = bm.block_table(seq_id{1}, 0);
    const auto& global = bm.block_table(seq_id{1}, 1);
    ASSERT_EQ(local.size(), global.size());
    ASSERT_EQ(static_cast<int32_t>(local.size()), bm.blocks_for(computed));
    for (size_t i = 0; i < local.size(); ++i) {
      ASSERT_EQ(local[i] == no_block, static_cast<int32_t>(i) < dead) << computed;
      ASSERT_NE(global[i], no_block);
      ASSERT_NE(global[i], local[i]) << "the groups' blocks are distinct";
    }
    ASSERT_EQ(bm.num_freed_blocks(seq_id{1}), dead);
    ASSERT_EQ(bm.window_freed_blocks(computed), dead);
    ASSERT_EQ(bm.num_blocks(seq_id{1}), 2 * bm.blocks_for(computed) - dead);
    ASSERT_EQ(bm.num_free_blocks(), 32 - bm.num_blocks(seq_id{1}));
    ASSERT_EQ(bm.check_invariants(), "") << computed;
  }
  sequence_slice slice;
  bm.tables_into(seq_id{1}, slice);
  EXPECT_EQ(slice.block_table, bm.block_table(seq_id{1}, 0));
  ASSERT_EQ(slice.group_tables.size(), 1u);
  EXPECT_EQ(slice.table(1), bm.block_table(seq_id{1}, 1));
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_free_blocks(), 32);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, groups_prefix_hit_needs_every_group_and_takes_each_groups_window) {
  auto bm = make_grouped(4, 32, {6, 0});
  std::vector<block_copy> copies;
  const auto a = iota_tokens(20);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, a, 0, 20, 0, copies));
  bm.commit_computed(seq_id{1}, a, 20);  // both groups' blocks 0..4 indexed; the local 0..2 freed
  const std::vector<block_id> local_a = bm.block_table(seq_id{1}, 0), global_a = bm.block_table(seq_id{1}, 1);
  const auto b = iota_tokens(24);
  EXPECT_EQ(bm.cached_prefix_tokens(b), 20);
  EXPECT_EQ(bm.blocks_needed(seq_id{2}, b, 20, 4), 2) << "one new block per group";
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, b, 20, 4, 0, copies));
  const auto& local_b = bm.block_table(seq_id{2}, 0);
  const auto& global_b = bm.block_table(seq_id{2}, 1);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(local_b[i], i < 3 ? no_block : local_a[i]) << i;
    EXPECT_EQ(global_b[i], global_a[i]) << "the global group shares its whole prefix";
  }
  EXPECT_EQ(bm.num_freed_blocks(seq_id{2}), 3);
  EXPECT_INVARIANTS(bm);

  // Freed, all ten indexed blocks are cached-free, in LRU order: local 0, 1, 2 (freed at the commit),
  // local 4, 3, then global 4, 3, 2, 1, 0. Taking 28 blocks evicts the first six: the global blocks
  // 0..3 stay cached, but every hit would also need local blocks of its window: none is left.
  bm.free(seq_id{2});
  bm.free(seq_id{1});
  EXPECT_EQ(bm.num_cached_free_blocks(), 10);
  const auto c = iota_tokens(32 * 4, 900);
  ASSERT_TRUE(bm.allocate_slots(seq_id{3}, c, 0, 4 * 14, 0, copies));
  EXPECT_EQ(bm.num_cached_free_blocks(), 4);
  EXPECT_EQ(bm.cached_prefix_tokens(iota_tokens(21)), 0);
  EXPECT_INVARIANTS(bm);
}

TEST(block_manager, groups_fork_swap_and_truncate_move_every_groups_blocks) {
  auto bm = make_grouped(4, 32, {6, 0, 6}, 16);
  std::vector<block_copy> copies, out, in;
  auto t = iota_tokens(22);
  ASSERT_TRUE(bm.allocate_slots(seq_id{1}, t, 0, 18, 0, copies));
  bm.commit_computed(seq_id{1}, t, 18);  // 5 blocks per group; the windowed groups free 3 each
  EXPECT_EQ(bm.num_blocks(seq_id{1}), 2 + 5 + 2);
  bm.fork(seq_id{1}, seq_id{2});
  EXPECT_EQ(bm.num_blocks(seq_id{2}), 9);
  // The child writes position 18: block 4 of every group is shared, so each group copies it.
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t, 18, 1, 0, copies));
  EXPECT_EQ(copies.size(), 3u);
  EXPECT_INVARIANTS(bm);
  ASSERT_TRUE(bm.swap_out(seq_id{2}, out));
  EXPECT_EQ(out.size(), 9u) << "only held blocks move, of every group";
  EXPECT_EQ(bm.num_host_blocks_of(seq_id{2}), 9);
  EXPECT_EQ(bm.num_logical_blocks(seq_id{2}), 5);
  EXPECT_INVARIANTS(bm);
  ASSERT_FALSE(bm.swap_in(seq_id{2}, bm.num_free_blocks() - 8, in)) << "needs 9 blocks";
  ASSERT_TRUE(bm.swap_in(seq_id{2}, 0, in));
  EXPECT_EQ(in.size(), 9u);
  EXPECT_EQ(bm.block_table(seq_id{2}, 0)[2], no_block);
  EXPECT_INVARIANTS(bm);
  // Speculative slots beyond 19 tokens, then rolled back: every group drops its tail block.
  ASSERT_TRUE(bm.allocate_slots(seq_id{2}, t, 19, 3, 0, copies));
  EXPECT_EQ(bm.num_logical_blocks(seq_id{2}), 6);
  bm.truncate(seq_id{2}, 19);
  EXPECT_EQ(bm.num_logical_blocks(seq_id{2}), 5);
  EXPECT_INVARIANTS(bm);
  bm.free(seq_id{1});
  bm.free(seq_id{2});
  EXPECT_EQ(bm.num_free_blocks(), 32);
  EXPECT_EQ(bm.num_free_host_blocks(), 16);
}

}  // namespace
}  // namespace tessera
