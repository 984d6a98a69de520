// Paged KV-cache bookkeeping (PagedAttention, Kwon et al., SOSP'23): the device pool is cut into
// fixed-size blocks of `block_size` token slots; every sequence owns a block table mapping its
// logical blocks to physical ones. The block manager only does bookkeeping — the executor owns the
// memory and applies the swap/copy lists this class emits.
//
//  * Reference counts: fork() shares every block of a sequence (parallel sampling, n > 1); the
//    first write into a shared block copies it first (copy-on-write, a block_copy in the step plan).
//  * Automatic prefix caching: a full, computed block is indexed by a hash chain
//    h_i = XXH3_64(tokens of block i, seed = h_{i-1}), so equal hashes mean equal whole prefixes.
//    A new sequence reuses the blocks of its longest cached prefix. Blocks whose reference count
//    drops to 0 stay indexed ("cached free") and are evicted least-recently-freed first, only when
//    the plain free list is empty.
//  * Host swap pool: swap_out() moves a sequence's blocks to host blocks, swap_in() back.
//  * Sliding-window attention (attention_window w > 0: every layer of the model has a window, the
//    widest being w; model_config::kv_window): a query at position p reads no key before p - w + 1,
//    so once a sequence has n computed tokens every later query (at >= n) reads nothing before
//    n - w + 1. Its leading blocks that lie wholly before that point are released (reference - 1,
//    to the free or cached-free list like any freed block) and their table entries become no_block:
//    the table keeps its logical length, so positions still map to table[pos / block_size]. A
//    sequence holds at most ceil((w - 1) / block_size) + 1 blocks between steps, plus the blocks of
//    the chunk it computes next. Prefix hits need only the blocks of the hit's own window to be
//    cached (the hash chain vouches for the prefix before them), as vLLM's sliding-window manager.
//  * KV layer groups (engine/model/kv_layer_groups.hpp; options.group_windows): with G groups every
//    sequence has G block tables of the same logical length, one per group, all drawing from the one
//    pool; each group frees by its own window (0: never), and the prefix cache indexes a block by
//    (group, hash). Counts of a sequence's blocks (held, needed, freed, host) are sums over its groups;
//    a prefix hit needs every group's blocks that its first query reads.
//
// Every mutating call either succeeds completely or returns false with nothing changed.
#pragma once
#include <algorithm>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/executor.hpp"
#include "engine/sequence.hpp"
#include "engine/step_record.hpp"

namespace tessera {

struct block_manager_options {
  int32_t block_size = 16;
  int32_t num_device_blocks = 0;
  int32_t num_host_blocks = 0;
  bool enable_prefix_caching = true;
  // 0: every computed position stays in the cache while its sequence lives. w > 0: no query reads a
  // key more than w - 1 positions behind it (model_config::kv_window), so blocks behind that are freed.
  int32_t attention_window = 0;
  // One window per KV layer group (0: full attention), each group with its own block table per
  // sequence. Empty: one group whose window is attention_window.
  std::vector<int32_t> group_windows;
};

class block_manager {
 public:
  // Throws invalid_request when the sizes are not positive (host blocks may be 0).
  explicit block_manager(const block_manager_options& options);

  int32_t block_size() const { return block_size_; }
  int32_t num_device_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_host_blocks() const { return num_host_blocks_; }
  bool prefix_caching() const { return prefix_caching_; }
  // The window that bounds every group: the widest when every group has one, else 0.
  int32_t attention_window() const { return window_; }
  int32_t num_groups() const { return static_cast<int32_t>(windows_.size()); }
  int32_t group_window(int32_t group) const { return windows_[static_cast<size_t>(group)]; }
  int32_t blocks_for(int32_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  // Leading blocks of a sequence with `num_computed` tokens that no later query of `group`'s layers
  // reads: 0 without a window, else floor(max(0, num_computed - w + 1) / block_size). Exactly these
  // entries of the group's table are no_block (check_invariants).
  int32_t blocks_outside_window(int32_t num_computed, int32_t group = 0) const {
    const int32_t w = windows_[static_cast<size_t>(group)];
    return w > 0 ? std::max(0, num_computed - w + 1) / block_size_ : 0;
  }
  // The sum of that over every group: what num_freed_blocks() of a resident sequence must be.
  int32_t window_freed_blocks(int32_t num_computed) const;

  // Free device blocks, including cached-free ones (which an allocation may evict).
  int32_t num_free_blocks() const;
  int32_t num_cached_free_blocks() const { return static_cast<int32_t>(lru_.size()); }
  int32_t num_free_host_blocks() const { return static_cast<int32_t>(free_host_.size()); }
  pool_usage device_usage() const;
  pool_usage host_usage() const;

  // ---- per sequence ----------------------------------------------------------------------------
  bool has(seq_id seq) const { return seqs_.count(seq) != 0; }
  bool is_swapped(seq_id seq) const;
  // Device block table of one group (empty for an unknown or swapped sequence); its leading
  // blocks_outside_window(computed, group) entries are no_block (outside the group's window).
  const std::vector<block_id>& block_table(seq_id seq, int32_t group = 0) const;
  // Puts every group's table into `slice` (block_table, group_tables).
  void tables_into(seq_id seq, sequence_slice& slice) const;
  int32_t num_blocks(seq_id seq) const;          // device blocks it holds, all groups (freed entries not counted)
  int32_t num_freed_blocks(seq_id seq) const;    // entries freed for the windows, all groups (also while swapped)
  int32_t num_logical_blocks(seq_id seq) const;  // one group's table length: freed + held (device or host)
  int32_t num_host_blocks_of(seq_id seq) const;
  // Blocks freed because they fell outside the attention window, since construction.
  int64_t num_window_freed_blocks() const { return num_window_freed_; }

  // Tokens of the longest prefix of `tokens` held by cached full blocks, a multiple of block_size,
  // capped at tokens.size() - 1 so at least one token is computed (its logits are needed).
  // With a window, only the blocks the prefix's next query can read must be cached (those before it
  // may have been evicted: the chain hash of a later block vouches for them). Read-only; 0 when
  // prefix caching is off.
  int32_t cached_prefix_tokens(std::span<const token_id> tokens) const;

  // Ensures `seq` has device slots for positions [0, num_computed + num_new) (freed entries of the
  // window aside). A sequence without blocks starts with `num_computed` tokens from the prefix cache
  // (0, or exactly what cached_prefix_tokens(tokens) returned): those blocks are shared, not
  // recomputed; with a window, the hit blocks already outside it are not taken at all (no_block).
  // If the block receiving position num_computed is shared, it is first copied to a fresh block
  // (appended to `copies`). Fails, changing nothing, if that needs more than
  // num_free_blocks() - reserve_blocks blocks.
  bool allocate_slots(seq_id seq, std::span<const token_id> tokens, int32_t num_computed, int32_t num_new,
                      int32_t reserve_blocks, std::vector<block_copy>& copies);

  // Device blocks allocate_slots would take from the free pool (cache revivals included).
  int32_t blocks_needed(seq_id seq, std::span<const token_id> tokens, int32_t num_computed, int32_t num_new) const;

  // The first `num_computed` of `tokens` now have K/V: full blocks enter the prefix cache, then the
  // leading blocks now wholly outside the attention window are freed (cached ones stay revivable).
  // Call only after the executor step that computed them succeeded.
  void commit_computed(seq_id seq, std::span<const token_id> tokens, int32_t num_computed);

  // Speculative decoding: releases `seq`'s trailing device blocks beyond those holding positions
  // [0, num_tokens) — slots that were allocated for draft tokens the target rejected. pre: num_tokens
  // >= its computed tokens (nothing computed is dropped); those blocks are never cached (not computed).
  void truncate(seq_id seq, int32_t num_tokens);

  // `child` shares every block of `parent` (reference counts + 1). pre: child has no blocks.
  void fork(seq_id parent, seq_id child);

  // Releases every device and host block of `seq` (no-op for an unknown sequence).
  void free(seq_id seq);
  // Takes `seq`'s device blocks out of the prefix cache (they stay its own): their K/V may not be what
  // their hashes say, e.g. after a step committed before its results (overlapped steps) failed.
  // Other sequences holding one keep it; nobody finds it by its tokens any more.
  void forget_cached(seq_id seq);

  // Moves `seq`'s device blocks to the host pool (device -> host pairs appended to `swap_out`); freed
  // window entries stay freed (nothing to copy). Fails, changing nothing, if the host pool has too
  // few free blocks.
  bool swap_out(seq_id seq, std::vector<block_copy>& swap_out);
  // Moves them back (host -> device pairs appended to `swap_in`); fails, changing nothing, if the
  // device pool has fewer than blocks + reserve_blocks free.
  bool swap_in(seq_id seq, int32_t reserve_blocks, std::vector<block_copy>& swap_in);

  // ---- observability -----------------------------------------------------------------------------
  std::vector<block_info> snapshot() const;  // one entry per device block; O(blocks)
  // One entry per host (swap) block: ids are host block ids; a held block has ref_count 1 (a swapped
  // sequence owns its host copies alone) and is never cached. O(host blocks).
  std::vector<block_info> host_snapshot() const;
  // Allocated device slots and the slots holding computed tokens (shared blocks counted once).
  struct slot_usage {
    int64_t num_allocated = 0;
    int64_t num_filled = 0;
    double waste() const { return num_allocated == 0 ? 0.0 : 1.0 - double(num_filled) / double(num_allocated); }
  };
  slot_usage slots() const;
  // Empty when every structural invariant holds, else a description of the first violation.
  std::string check_invariants() const;

 private:
  struct block_meta {
    int32_t ref_count = 0;
    bool cached = false;  // indexed in index_[group]
    int32_t group = 0;    // while cached: the group whose layers it holds
    uint64_t hash = 0;
    std::vector<token_id> tokens;             // the block's tokens while cached (collision check)
    std::list<block_id>::iterator lru_pos{};  // valid while cached and ref_count == 0
  };
  // One group's table of a sequence.
  struct group_table {
    std::vector<block_id> device;  // num_freed leading no_block entries, then held blocks
    std::vector<block_id> host;    // non-empty only while swapped out: copies of device[num_freed..]
    int32_t num_freed = 0;         // leading entries released for the group's window
    int32_t held() const { return static_cast<int32_t>(device.size()) - num_freed; }
    // Its logical length: freed entries and held blocks, on the device or (swapped) on the host.
    int32_t length(bool swapped) const {
      return swapped ? num_freed + static_cast<int32_t>(host.size()) : static_cast<int32_t>(device.size());
    }
  };
  struct seq_state {
    std::vector<group_table> groups;  // one per KV layer group, all of one logical length
    std::vector<uint64_t> hashes;     // hash chain of its first hashes.size() full blocks
    int32_t num_computed = 0;
    bool swapped = false;
  };

  uint64_t block_hash(uint64_t parent, std::span<const token_id> block_tokens) const;
  // Cached block of `group` holding exactly these tokens after `parent`, or -1.
  block_id lookup(int32_t group, uint64_t hash, std::span<const token_id> block_tokens) const;
  // Number of leading full blocks of `tokens` a new sequence can take from the cache (capped as in
  // cached_prefix_tokens); `out` (one vector per group) gets their blocks (no_block for those outside
  // the group's window) and `hashes` their chain hashes.
  int32_t cached_prefix_blocks(std::span<const token_id> tokens, std::vector<std::vector<block_id>>* out,
                               std::vector<uint64_t>* hashes) const;
  // Releases the leading blocks of every group of `s` that blocks_outside_window says are dead.
  void release_outside_window(seq_state& s);
  seq_state& new_state(seq_id seq);
  block_id take_free_block();  // pre: num_free_blocks() > 0
  void release(block_id b);    // reference count - 1; to a free list at 0
  void uncache(block_id b);

  int32_t block_size_;
  int32_t num_host_blocks_;
  bool prefix_caching_;
  std::vector<int32_t> windows_;  // per group
  int32_t window_;
  int64_t num_window_freed_ = 0;
  std::vector<block_meta> blocks_;
  std::vector<block_id> free_;                                 // plain free blocks (no cached content), used as a stack
  std::list<block_id> lru_;                                    // cached free blocks, least recently freed first
  std::vector<std::unordered_map<uint64_t, block_id>> index_;  // per group: chain hash -> cached block
  std::vector<block_id> free_host_;
  std::unordered_map<seq_id, seq_state> seqs_;
};

}  // namespace tessera
