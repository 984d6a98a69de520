#include "engine/block_manager.hpp"

#include <xxhash.h>

#include <algorithm>
#include <stdexcept>

#include "engine/base/error.hpp"

namespace tessera {

namespace {
// Seed of the first block's hash: an arbitrary constant, so that "no parent" is a value too.
constexpr uint64_t root_hash = 0x7e55e7a0c0ffee11ULL;
const std::vector<block_id> empty_table;
}  // namespace

block_manager::block_manager(const block_manager_options& options)
    : block_size_(options.block_size),
      num_host_blocks_(options.num_host_blocks),
      prefix_caching_(options.enable_prefix_caching),
      windows_(options.group_windows.empty() ? std::vector<int32_t>{options.attention_window} : options.group_windows),
      window_(0) {
  if (options.block_size <= 0) throw invalid_request("block_size must be positive");
  for (int32_t w : windows_)
    if (w < 0) throw invalid_request("attention_window must not be negative");
  // The window bounding every group: a full-attention group keeps every position.
  window_ = *std::max_element(windows_.begin(), windows_.end());
  if (*std::min_element(windows_.begin(), windows_.end()) == 0) window_ = 0;
  index_.resize(windows_.size());
  if (options.num_device_blocks <= 0) throw invalid_request("num_kv_blocks must be positive");
  if (options.num_host_blocks < 0) throw invalid_request("num_host_blocks must not be negative");
  blocks_.resize(static_cast<size_t>(options.num_device_blocks));
  // Stack order: block 0 is handed out first (deterministic, easy to read in tests).
  free_.reserve(blocks_.size());
  for (int32_t b = options.num_device_blocks - 1; b >= 0; --b) free_.push_back(b);
  free_host_.reserve(static_cast<size_t>(options.num_host_blocks));
  for (int32_t b = options.num_host_blocks - 1; b >= 0; --b) free_host_.push_back(b);
}

int32_t block_manager::num_free_blocks() const { return static_cast<int32_t>(free_.size() + lru_.size()); }

pool_usage block_manager::device_usage() const {
  pool_usage u;
  u.num_total = num_device_blocks();
  u.num_free = num_free_blocks();
  u.num_used = u.num_total - u.num_free;
  u.num_cached = num_cached_free_blocks();
  return u;
}

pool_usage block_manager::host_usage() const {
  pool_usage u;
  u.num_total = num_host_blocks_;
  u.num_free = num_free_host_blocks();
  u.num_used = u.num_total - u.num_free;
  return u;
}

bool block_manager::is_swapped(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second.swapped;
}

int32_t block_manager::window_freed_blocks(int32_t num_computed) const {
  int32_t n = 0;
  for (int32_t g = 0; g < num_groups(); ++g) n += blocks_outside_window(num_computed, g);
  return n;
}

const std::vector<block_id>& block_manager::block_table(seq_id seq, int32_t group) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? empty_table : it->second.groups.at(static_cast<size_t>(group)).device;
}

void block_manager::tables_into(seq_id seq, sequence_slice& slice) const {
  slice.block_table = block_table(seq, 0);
  slice.group_tables.resize(static_cast<size_t>(num_groups() - 1));
  for (int32_t g = 1; g < num_groups(); ++g) slice.group_tables[static_cast<size_t>(g - 1)] = block_table(seq, g);
}

block_manager::seq_state& block_manager::new_state(seq_id seq) {
  seq_state& s = seqs_[seq];
  if (s.groups.empty()) s.groups.resize(windows_.size());
  return s;
}

int32_t block_manager::num_blocks(seq_id seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.swapped) return 0;
  int32_t n = 0;
  for (const group_table& g : it->second.groups) n += g.held();
  return n;
}

int32_t block_manager::num_freed_blocks(seq_id seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int32_t n = 0;
  for (const group_table& g : it->second.groups) n += g.num_freed;
  return n;
}

int32_t block_manager::num_logical_blocks(seq_id seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  return it->second.groups.front().length(it->second.swapped);  // every group's table has the same length
}

int32_t block_manager::num_host_blocks_of(seq_id seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int32_t n = 0;
  for (const group_table& g : it->second.groups) n += static_cast<int32_t>(g.host.size());
  return n;
}

// ---- prefix cache ------------------------------------------------------------------------------

uint64_t block_manager::block_hash(uint64_t parent, std::span<const token_id> block_tokens) const {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent);
}

block_id block_manager::lookup(int32_t group, uint64_t hash, std::span<const token_id> block_tokens) const {
  const auto& index = index_[static_cast<size_t>(group)];
  auto it = index.find(hash);
  if (it == index.end()) return -1;
  // The hash chain makes a false match need a 64-bit collision; comparing the block's own tokens
  // makes even that require a collision of the parent hash as well.
  const block_meta& m = blocks_[static_cast<size_t>(it->second)];
  if (!std::equal(m.tokens.begin(), m.tokens.end(), block_tokens.begin(), block_tokens.end())) return -1;
  return it->second;
}

int32_t block_manager::cached_prefix_blocks(std::span<const token_id> tokens, std::vector<std::vector<block_id>>* out,
                                            std::vector<uint64_t>* hashes) const {
  if (out) out->assign(windows_.size(), {});
  if (!prefix_caching_ || tokens.empty()) return 0;
  // Leave at least the last token to compute: the sampler needs its logits.
  const int32_t max_blocks = (static_cast<int32_t>(tokens.size()) - 1) / block_size_;
  const auto G = static_cast<size_t>(num_groups());
  uint64_t parent = root_hash;
  std::vector<std::vector<block_id>> found(G);
  std::vector<uint64_t> chain;
  int32_t best = 0;
  std::vector<int32_t> run_start(G, 0);  // per group: first block of the current run of consecutive hits
  for (int32_t n = 0; n < max_blocks; ++n) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(n) * block_size_, static_cast<size_t>(block_size_));
    const uint64_t h = block_hash(parent, block_tokens);
    parent = h;
    chain.push_back(h);
    bool ends = false;
    for (size_t g = 0; g < G; ++g) {
      const block_id b = lookup(static_cast<int32_t>(g), h, block_tokens);
      found[g].push_back(b);
      if (b >= 0) continue;
      // Without a window every block of the prefix is read again, so the first miss ends the hit.
      // With one, a later stretch of hits may still cover a later prefix's window: scan on.
      if (windows_[g] == 0) ends = true;
      run_start[g] = n + 1;
    }
    if (ends) break;
    // A sequence that starts with n + 1 blocks computed reads each group's blocks from
    // blocks_outside_window on.
    bool hit = true;
    for (size_t g = 0; g < G; ++g)
      hit = hit && run_start[g] <= blocks_outside_window((n + 1) * block_size_, static_cast<int32_t>(g));
    if (hit) best = n + 1;
  }
  for (size_t g = 0; g < G && out; ++g) {
    const int32_t skipped = blocks_outside_window(best * block_size_, static_cast<int32_t>(g));
    for (int32_t i = 0; i < best; ++i) (*out)[g].push_back(i < skipped ? no_block : found[g][static_cast<size_t>(i)]);
  }
  if (hashes) hashes->assign(chain.begin(), chain.begin() + best);
  return best;
}

int32_t block_manager::cached_prefix_tokens(std::span<const token_id> tokens) const {
  return cached_prefix_blocks(tokens, nullptr, nullptr) * block_size_;
}

// ---- allocation ----------------------------------------------------------------------------------

block_id block_manager::take_free_block() {
  if (!free_.empty()) {
    const block_id b = free_.back();
    free_.pop_back();
    blocks_[static_cast<size_t>(b)].ref_count = 1;
    return b;
  }
  // Evict the least recently freed cached block: its content is lost to the prefix cache.
  const block_id b = lru_.front();
  lru_.pop_front();
  uncache(b);
  blocks_[static_cast<size_t>(b)].ref_count = 1;
  return b;
}

void block_manager::uncache(block_id b) {
  block_meta& m = blocks_[static_cast<size_t>(b)];
  if (!m.cached) return;
  index_[static_cast<size_t>(m.group)].erase(m.hash);
  m.cached = false;
  m.tokens.clear();
}

void block_manager::release(block_id b) {
  block_meta& m = blocks_[static_cast<size_t>(b)];
  if (m.ref_count <= 0) throw std::logic_error("block_manager: double free of block " + std::to_string(b));
  if (--m.ref_count > 0) return;
  if (m.cached) {
    lru_.push_back(b);
    m.lru_pos = std::prev(lru_.end());
  } else {
    free_.push_back(b);
  }
}

int32_t block_manager::blocks_needed(seq_id seq, std::span<const token_id> tokens, int32_t num_computed,
                                     int32_t num_new) const {
  const int32_t total_blocks = blocks_for(num_computed + num_new);
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || (it->second.groups.front().device.empty() && !it->second.swapped)) {
    // New sequence: the cached prefix blocks cost nothing unless they sit in the cached-free list.
    std::vector<std::vector<block_id>> hits;
    const int32_t num_hit_blocks = num_computed / block_size_;
    if (num_hit_blocks > 0)
      cached_prefix_blocks(tokens.first(std::min(tokens.size(), static_cast<size_t>(num_computed) + 1)), &hits,
                           nullptr);
    int32_t revived = 0;  // hit blocks outside the window (no_block) are not taken: they cost nothing
    for (const std::vector<block_id>& group_hits : hits) {
      for (int32_t i = 0; i < num_hit_blocks && i < static_cast<int32_t>(group_hits.size()); ++i) {
        const block_id b = group_hits[static_cast<size_t>(i)];
        if (b != no_block && blocks_[static_cast<size_t>(b)].ref_count == 0) ++revived;
      }
    }
    return revived + (total_blocks - num_hit_blocks) * num_groups();
  }
  int32_t need = 0;
  const int32_t write_block = num_computed / block_size_;
  for (const group_table& g : it->second.groups) {
    const int32_t have = static_cast<int32_t>(g.device.size());
    need += std::max(0, total_blocks - have);
    // Copy-on-write: the next write lands in an existing, shared block.
    if (num_new > 0 && write_block < have &&
        blocks_[static_cast<size_t>(g.device[static_cast<size_t>(write_block)])].ref_count > 1)
      ++need;
  }
  return need;
}

bool block_manager::allocate_slots(seq_id seq, std::span<const token_id> tokens, int32_t num_computed, int32_t num_new,
                                   int32_t reserve_blocks, std::vector<block_copy>& copies) {
  if (num_computed < 0 || num_new < 0 || num_computed + num_new > static_cast<int32_t>(tokens.size()))
    throw std::logic_error("block_manager::allocate_slots: token range out of bounds");
  auto it = seqs_.find(seq);
  if (it != seqs_.end() && it->second.swapped)
    throw std::logic_error("block_manager::allocate_slots: sequence is swapped out");
  const int32_t need = blocks_needed(seq, tokens, num_computed, num_new);
  if (need > num_free_blocks() - reserve_blocks) return false;

  seq_state& s = new_state(seq);
  if (s.groups.front().device.empty()) {
    // Admission: adopt the cached prefix.
    const int32_t num_hit_blocks = num_computed / block_size_;
    if (num_computed % block_size_ != 0)
      throw std::logic_error("block_manager::allocate_slots: a new sequence starts at a block boundary");
    if (num_hit_blocks > 0) {
      std::vector<std::vector<block_id>> hits;
      std::vector<uint64_t> hashes;
      const int32_t found = cached_prefix_blocks(
          tokens.first(std::min(tokens.size(), static_cast<size_t>(num_computed) + 1)), &hits, &hashes);
      if (found < num_hit_blocks) throw std::logic_error("block_manager::allocate_slots: claimed prefix is not cached");
      s.hashes.assign(hashes.begin(), hashes.begin() + num_hit_blocks);
      for (size_t g = 0; g < s.groups.size(); ++g) {
        group_table& t = s.groups[g];
        for (int32_t i = 0; i < num_hit_blocks; ++i) {
          const block_id b = hits[g][static_cast<size_t>(i)];
          t.device.push_back(b);
          if (b == no_block) {  // before the group's window of the first query: never read, not taken
            ++t.num_freed;
            continue;
          }
          block_meta& m = blocks_[static_cast<size_t>(b)];
          if (m.ref_count == 0) lru_.erase(m.lru_pos);  // revive a cached-free block
          ++m.ref_count;
        }
      }
    }
    s.num_computed = num_computed;
  }
  const int32_t write_block = num_computed / block_size_;
  const int32_t total_blocks = blocks_for(num_computed + num_new);
  for (group_table& t : s.groups) {
    // Copy-on-write of the block that receives the first new token.
    if (num_new > 0 && write_block < static_cast<int32_t>(t.device.size())) {
      block_id& slot = t.device[static_cast<size_t>(write_block)];
      // The block of position num_computed is inside every window (w >= 1), so never freed.
      if (slot == no_block) throw std::logic_error("block_manager::allocate_slots: write into a freed block");
      if (blocks_[static_cast<size_t>(slot)].ref_count > 1) {
        const block_id fresh = take_free_block();
        copies.push_back({slot, fresh});
        release(slot);
        slot = fresh;
      }
    }
    while (static_cast<int32_t>(t.device.size()) < total_blocks) t.device.push_back(take_free_block());
  }
  return true;
}

void block_manager::commit_computed(seq_id seq, std::span<const token_id> tokens, int32_t num_computed) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seq_state& s = it->second;
  if (s.swapped) throw std::logic_error("block_manager::commit_computed: sequence is swapped out");
  s.num_computed = num_computed;
  const int32_t num_full =
      prefix_caching_ ? std::min(num_computed / block_size_, static_cast<int32_t>(s.groups.front().device.size())) : 0;
  while (static_cast<int32_t>(s.hashes.size()) < num_full) {
    const size_t i = s.hashes.size();
    auto block_tokens = tokens.subspan(i * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_));
    const uint64_t h = block_hash(i == 0 ? root_hash : s.hashes.back(), block_tokens);
    s.hashes.push_back(h);
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const block_id b = s.groups[g].device[i];
      if (b == no_block) continue;  // freed for the window (the chain goes on: later blocks need it)
      block_meta& m = blocks_[static_cast<size_t>(b)];
      // An equal block already indexed (computed twice concurrently) keeps the index; this copy is
      // freed normally later.
      if (m.cached || index_[g].count(h) != 0) continue;
      m.cached = true;
      m.group = static_cast<int32_t>(g);
      m.hash = h;
      m.tokens.assign(block_tokens.begin(), block_tokens.end());
      index_[g].emplace(h, b);
    }
  }
  // After indexing: a full block that leaves the window in the same step (a long prefill chunk)
  // goes to the cached-free list and stays revivable by a later prefix hit.
  release_outside_window(s);
}

void block_manager::release_outside_window(seq_state& s) {
  for (size_t g = 0; g < s.groups.size(); ++g) {
    group_table& t = s.groups[g];
    const int32_t dead =
        std::min(blocks_outside_window(s.num_computed, static_cast<int32_t>(g)), static_cast<int32_t>(t.device.size()));
    // Oldest first: they enter the LRU list first and so are evicted first.
    for (; t.num_freed < dead; ++t.num_freed) {
      block_id& b = t.device[static_cast<size_t>(t.num_freed)];
      release(b);
      b = no_block;
      ++num_window_freed_;
    }
  }
}

void block_manager::truncate(seq_id seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seq_state& s = it->second;
  if (s.swapped) throw std::logic_error("block_manager::truncate: sequence is swapped out");
  if (num_tokens < s.num_computed) throw std::logic_error("block_manager::truncate: would drop computed tokens");
  for (group_table& t : s.groups) {
    const auto keep = static_cast<size_t>(std::max(blocks_for(num_tokens), t.num_freed));
    // Last first, like free(): the freed tail leaves in the order it was allocated, reversed.
    while (t.device.size() > keep) {
      release(t.device.back());
      t.device.pop_back();
    }
  }
}

void block_manager::fork(seq_id parent, seq_id child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end() || it->second.swapped) throw std::logic_error("block_manager::fork: parent not resident");
  if (has(child)) throw std::logic_error("block_manager::fork: child already has blocks");
  seq_state copy = it->second;  // freed window entries included: the child is at the same position
  for (const group_table& t : copy.groups)
    for (block_id b : t.device)
      if (b != no_block) ++blocks_[static_cast<size_t>(b)].ref_count;
  seqs_.emplace(child, std::move(copy));
}

void block_manager::free(seq_id seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seq_state& s = it->second;
  // Tail blocks first: they enter the LRU list earlier, so they are evicted before the prefix
  // blocks that other requests are more likely to share.
  for (const group_table& t : s.groups) {
    for (auto b = t.device.rbegin(); b != t.device.rend(); ++b)
      if (*b != no_block) release(*b);
    for (block_id h : t.host) free_host_.push_back(h);
  }
  seqs_.erase(it);
}

void block_manager::forget_cached(seq_id seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (const group_table& t : it->second.groups)
    for (block_id b : t.device)
      if (b != no_block) uncache(b);
  it->second.hashes.clear();
}

bool block_manager::swap_out(seq_id seq, std::vector<block_copy>& swap_out_list) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.swapped) throw std::logic_error("block_manager::swap_out: not resident");
  seq_state& s = it->second;
  if (num_blocks(seq) > static_cast<int32_t>(free_host_.size())) return false;
  for (group_table& t : s.groups) {
    const auto held = std::span(t.device).subspan(static_cast<size_t>(t.num_freed));  // freed entries: nothing to copy
    for (block_id d : held) {
      const block_id h = free_host_.back();
      free_host_.pop_back();
      swap_out_list.push_back({d, h});
      t.host.push_back(h);
    }
    for (auto b = held.rbegin(); b != held.rend(); ++b) release(*b);
    t.device.clear();
  }
  s.swapped = true;
  return true;
}

bool block_manager::swap_in(seq_id seq, int32_t reserve_blocks, std::vector<block_copy>& swap_in_list) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || !it->second.swapped) throw std::logic_error("block_manager::swap_in: not swapped");
  seq_state& s = it->second;
  if (num_host_blocks_of(seq) > num_free_blocks() - reserve_blocks) return false;
  for (group_table& t : s.groups) {
    t.device.assign(static_cast<size_t>(t.num_freed), no_block);
    for (block_id h : t.host) {
      const block_id d = take_free_block();
      swap_in_list.push_back({h, d});
      t.device.push_back(d);
      free_host_.push_back(h);
    }
    t.host.clear();
  }
  s.swapped = false;
  // The restored copies are new blocks: the next commit_computed() rebuilds the hash chain and
  // indexes those whose content is not indexed elsewhere (the originals may still be cached).
  s.hashes.clear();
  return true;
}

// ---- observability -------------------------------------------------------------------------------

std::vector<block_info> block_manager::snapshot() const {
  std::vector<block_info> out(blocks_.size());
  for (size_t b = 0; b < blocks_.size(); ++b) {
    out[b].id = static_cast<block_id>(b);
    out[b].ref_count = blocks_[b].ref_count;
    out[b].cached = blocks_[b].cached;
    if (blocks_[b].cached && blocks_[b].ref_count == 0) out[b].num_filled = block_size_;
  }
  for (const auto& [id, s] : seqs_) {
    for (const group_table& t : s.groups) {
      for (size_t i = static_cast<size_t>(t.num_freed); i < t.device.size(); ++i) {
        block_info& info = out[static_cast<size_t>(t.device[i])];
        const int32_t filled = std::clamp(s.num_computed - static_cast<int32_t>(i) * block_size_, 0, block_size_);
        info.num_filled = std::max(info.num_filled, filled);
        if (!info.owner || id < info.owner) info.owner = id;
      }
    }
  }
  return out;
}

std::vector<block_info> block_manager::host_snapshot() const {
  std::vector<block_info> out(static_cast<size_t>(num_host_blocks_));
  for (size_t b = 0; b < out.size(); ++b) out[b].id = static_cast<block_id>(b);
  for (const auto& [id, s] : seqs_) {
    for (const group_table& t : s.groups) {
      for (size_t i = 0; i < t.host.size(); ++i) {
        block_info& info = out[static_cast<size_t>(t.host[i])];
        info.ref_count = 1;
        const int32_t logical = t.num_freed + static_cast<int32_t>(i);  // host[i] holds table entry num_freed + i
        info.num_filled = std::clamp(s.num_computed - logical * block_size_, 0, block_size_);
        info.owner = id;
      }
    }
  }
  return out;
}

block_manager::slot_usage block_manager::slots() const {
  slot_usage u;
  std::vector<int32_t> filled(blocks_.size(), -1);
  for (const auto& [id, s] : seqs_) {
    for (const group_table& t : s.groups) {
      for (size_t i = static_cast<size_t>(t.num_freed); i < t.device.size(); ++i) {
        const int32_t f = std::clamp(s.num_computed - static_cast<int32_t>(i) * block_size_, 0, block_size_);
        int32_t& slot = filled[static_cast<size_t>(t.device[i])];
        slot = std::max(slot, f);
      }
    }
  }
  for (int32_t f : filled) {
    if (f < 0) continue;
    u.num_allocated += block_size_;
    u.num_filled += f;
  }
  return u;
}

std::string block_manager::check_invariants() const {
  std::vector<int32_t> refs(blocks_.size(), 0);
  std::vector<int32_t> host_refs(static_cast<size_t>(num_host_blocks_), 0);
  for (const auto& [id, s] : seqs_) {
    if (s.groups.size() != windows_.size())
      return "sequence " + std::to_string(id.value()) + " has " + std::to_string(s.groups.size()) + " tables";
    const int32_t length = s.groups.front().length(s.swapped);
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const group_table& t = s.groups[g];
      const std::string seq_name =
          "sequence " + std::to_string(id.value()) + (windows_.size() > 1 ? " group " + std::to_string(g) : "");
      if (s.swapped && !t.device.empty()) return "swapped " + seq_name + " holds device blocks";
      if (!s.swapped && !t.host.empty()) return "resident " + seq_name + " holds host blocks";
      if (t.length(s.swapped) != length) return seq_name + ": its table's length differs from group 0's";
      // The window: exactly the blocks no later query reads are freed, all of them leading entries.
      const int32_t expected = blocks_outside_window(s.num_computed, static_cast<int32_t>(g));
      if (t.num_freed != expected)
        return seq_name + ": " + std::to_string(t.num_freed) + " blocks freed for the window, expected " +
               std::to_string(expected) + " at " + std::to_string(s.num_computed) + " computed tokens";
      if (!s.swapped && static_cast<int32_t>(t.device.size()) < t.num_freed)
        return seq_name + ": table shorter than its freed entries";
      for (size_t i = 0; i < t.device.size(); ++i) {
        const block_id b = t.device[i];
        if ((b == no_block) != (static_cast<int32_t>(i) < t.num_freed))
          return seq_name + ": table entry " + std::to_string(i) + (b == no_block ? " is freed" : " is held") +
                 " but " + std::to_string(t.num_freed) + " leading entries are freed";
        if (b == no_block) continue;
        if (b < 0 || b >= num_device_blocks()) return "block id out of range";
        const block_meta& m = blocks_[static_cast<size_t>(b)];
        if (m.cached && m.group != static_cast<int32_t>(g))
          return seq_name + ": holds block " + std::to_string(b) + " cached for group " + std::to_string(m.group);
        ++refs[static_cast<size_t>(b)];
      }
      for (block_id h : t.host) {
        if (h < 0 || h >= num_host_blocks_) return "host block id out of range";
        ++host_refs[static_cast<size_t>(h)];
      }
    }
  }
  std::vector<int32_t> on_free(blocks_.size(), 0);
  for (block_id b : free_) ++on_free[static_cast<size_t>(b)];
  for (block_id b : lru_) {
    ++on_free[static_cast<size_t>(b)];
    if (!blocks_[static_cast<size_t>(b)].cached) return "uncached block " + std::to_string(b) + " in the LRU list";
  }
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const block_meta& m = blocks_[b];
    const std::string name = "block " + std::to_string(b);
    if (m.ref_count != refs[b])
      return name + ": ref_count " + std::to_string(m.ref_count) + " but " + std::to_string(refs[b]) + " table entries";
    if (m.ref_count == 0 && on_free[b] != 1)
      return name + ": free but on " + std::to_string(on_free[b]) + " free lists";
    if (m.ref_count > 0 && on_free[b] != 0) return name + ": in use and on a free list";
    if (m.cached) {
      if (m.group < 0 || m.group >= num_groups()) return name + ": cached for group " + std::to_string(m.group);
      const auto& index = index_[static_cast<size_t>(m.group)];
      auto it = index.find(m.hash);
      if (it == index.end() || it->second != static_cast<block_id>(b)) return name + ": cached but not indexed";
      if (static_cast<int32_t>(m.tokens.size()) != block_size_) return name + ": cached block is not full";
    }
  }
  for (size_t g = 0; g < index_.size(); ++g)
    for (const auto& [h, b] : index_[g]) {
      const block_meta& m = blocks_[static_cast<size_t>(b)];
      if (!m.cached || m.hash != h || m.group != static_cast<int32_t>(g))
        return "hash index points at block " + std::to_string(b) + " which does not carry that hash";
    }
  std::vector<int32_t> host_free(static_cast<size_t>(num_host_blocks_), 0);
  for (block_id h : free_host_) ++host_free[static_cast<size_t>(h)];
  for (int32_t h = 0; h < num_host_blocks_; ++h)
    if (host_refs[static_cast<size_t>(h)] + host_free[static_cast<size_t>(h)] != 1)
      return "host block " + std::to_string(h) + " is owned " + std::to_string(host_refs[static_cast<size_t>(h)]) +
             " times and free " + std::to_string(host_free[static_cast<size_t>(h)]) + " times";
  return {};
}

}  // namespace tessera
