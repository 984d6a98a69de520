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
      window_(options.attention_window) {
  if (options.block_size <= 0) throw invalid_request("block_size must be positive");
  if (options.attention_window < 0) throw invalid_request("attention_window must not be negative");
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

const std::vector<block_id>& block_manager::block_table(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? empty_table : it->second.device;
}

int32_t block_manager::num_blocks(seq_id seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.swapped) return 0;
  return static_cast<int32_t>(it->second.device.size()) - it->second.num_freed;
}

int32_t block_manager::num_freed_blocks(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.num_freed;
}

int32_t block_manager::num_logical_blocks(seq_id seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  const seq_state& s = it->second;
  return s.num_freed +
         static_cast<int32_t>(s.swapped ? s.host.size() : s.device.size() - static_cast<size_t>(s.num_freed));
}

int32_t block_manager::num_host_blocks_of(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.host.size());
}

// ---- prefix cache ------------------------------------------------------------------------------

uint64_t block_manager::block_hash(uint64_t parent, std::span<const token_id> block_tokens) const {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent);
}

block_id block_manager::lookup(uint64_t hash, std::span<const token_id> block_tokens) const {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return -1;
  // The hash chain makes a false match need a 64-bit collision; comparing the block's own tokens
  // makes even that require a collision of the parent hash as well.
  const block_meta& m = blocks_[static_cast<size_t>(it->second)];
  if (!std::equal(m.tokens.begin(), m.tokens.end(), block_tokens.begin(), block_tokens.end())) return -1;
  return it->second;
}

int32_t block_manager::cached_prefix_blocks(std::span<const token_id> tokens, std::vector<block_id>* out,
                                            std::vector<uint64_t>* hashes) const {
  if (!prefix_caching_ || tokens.empty()) return 0;
  // Leave at least the last token to compute: the sampler needs its logits.
  const int32_t max_blocks = (static_cast<int32_t>(tokens.size()) - 1) / block_size_;
  uint64_t parent = root_hash;
  std::vector<block_id> found;
  std::vector<uint64_t> chain;
  int32_t best = 0;
  int32_t run_start = 0;  // first block of the current run of consecutive hits
  for (int32_t n = 0; n < max_blocks; ++n) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(n) * block_size_, static_cast<size_t>(block_size_));
    const uint64_t h = block_hash(parent, block_tokens);
    const block_id b = lookup(h, block_tokens);
    parent = h;
    found.push_back(b);
    chain.push_back(h);
    if (b < 0) {
      // Without a window every block of the prefix is read again, so the first miss ends the hit.
      // With one, a later stretch of hits may still cover a later prefix's window: scan on.
      if (window_ == 0) break;
      run_start = n + 1;
      continue;
    }
    // A sequence that starts with n + 1 blocks computed reads blocks from blocks_outside_window on.
    if (run_start <= blocks_outside_window((n + 1) * block_size_)) best = n + 1;
  }
  const int32_t skipped = blocks_outside_window(best * block_size_);
  for (int32_t i = 0; i < best; ++i) {
    if (out) out->push_back(i < skipped ? no_block : found[static_cast<size_t>(i)]);
    if (hashes) hashes->push_back(chain[static_cast<size_t>(i)]);
  }
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
  hash_to_block_.erase(m.hash);
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
  if (it == seqs_.end() || (it->second.device.empty() && !it->second.swapped)) {
    // New sequence: the cached prefix blocks cost nothing unless they sit in the cached-free list.
    std::vector<block_id> hits;
    const int32_t num_hit_blocks = num_computed / block_size_;
    if (num_hit_blocks > 0)
      cached_prefix_blocks(tokens.first(std::min(tokens.size(), static_cast<size_t>(num_computed) + 1)), &hits,
                           nullptr);
    int32_t revived = 0;  // hit blocks outside the window (no_block) are not taken: they cost nothing
    for (int32_t i = 0; i < num_hit_blocks && i < static_cast<int32_t>(hits.size()); ++i) {
      const block_id b = hits[static_cast<size_t>(i)];
      if (b != no_block && blocks_[static_cast<size_t>(b)].ref_count == 0) ++revived;
    }
    return revived + (total_blocks - num_hit_blocks);
  }
  const seq_state& s = it->second;
  const int32_t have = static_cast<int32_t>(s.device.size());
  int32_t need = std::max(0, total_blocks - have);
  // Copy-on-write: the next write lands in an existing, shared block.
  const int32_t write_block = num_computed / block_size_;
  if (num_new > 0 && write_block < have &&
      blocks_[static_cast<size_t>(s.device[static_cast<size_t>(write_block)])].ref_count > 1)
    ++need;
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

  seq_state& s = seqs_[seq];
  if (s.device.empty()) {
    // Admission: adopt the cached prefix.
    const int32_t num_hit_blocks = num_computed / block_size_;
    if (num_computed % block_size_ != 0)
      throw std::logic_error("block_manager::allocate_slots: a new sequence starts at a block boundary");
    if (num_hit_blocks > 0) {
      std::vector<block_id> hits;
      std::vector<uint64_t> hashes;
      cached_prefix_blocks(tokens.first(std::min(tokens.size(), static_cast<size_t>(num_computed) + 1)), &hits,
                           &hashes);
      if (static_cast<int32_t>(hits.size()) < num_hit_blocks)
        throw std::logic_error("block_manager::allocate_slots: claimed prefix is not cached");
      for (int32_t i = 0; i < num_hit_blocks; ++i) {
        const block_id b = hits[static_cast<size_t>(i)];
        s.device.push_back(b);
        s.hashes.push_back(hashes[static_cast<size_t>(i)]);
        if (b == no_block) {  // before the window of the first query: never read, not taken
          ++s.num_freed;
          continue;
        }
        block_meta& m = blocks_[static_cast<size_t>(b)];
        if (m.ref_count == 0) lru_.erase(m.lru_pos);  // revive a cached-free block
        ++m.ref_count;
      }
    }
    s.num_computed = num_computed;
  }
  // Copy-on-write of the block that receives the first new token.
  const int32_t write_block = num_computed / block_size_;
  if (num_new > 0 && write_block < static_cast<int32_t>(s.device.size())) {
    block_id& slot = s.device[static_cast<size_t>(write_block)];
    // The block of position num_computed is inside every window (w >= 1), so never freed.
    if (slot == no_block) throw std::logic_error("block_manager::allocate_slots: write into a freed block");
    if (blocks_[static_cast<size_t>(slot)].ref_count > 1) {
      const block_id fresh = take_free_block();
      copies.push_back({slot, fresh});
      release(slot);
      slot = fresh;
    }
  }
  const int32_t total_blocks = blocks_for(num_computed + num_new);
  while (static_cast<int32_t>(s.device.size()) < total_blocks) s.device.push_back(take_free_block());
  return true;
}

void block_manager::commit_computed(seq_id seq, std::span<const token_id> tokens, int32_t num_computed) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seq_state& s = it->second;
  if (s.swapped) throw std::logic_error("block_manager::commit_computed: sequence is swapped out");
  s.num_computed = num_computed;
  const int32_t num_full =
      prefix_caching_ ? std::min(num_computed / block_size_, static_cast<int32_t>(s.device.size())) : 0;
  while (static_cast<int32_t>(s.hashes.size()) < num_full) {
    const size_t i = s.hashes.size();
    auto block_tokens = tokens.subspan(i * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_));
    const uint64_t h = block_hash(i == 0 ? root_hash : s.hashes.back(), block_tokens);
    s.hashes.push_back(h);
    const block_id b = s.device[i];
    if (b == no_block) continue;  // freed for the window (the chain goes on: later blocks need it)
    block_meta& m = blocks_[static_cast<size_t>(b)];
    // An equal block already indexed (computed twice concurrently) keeps the index; this copy is
    // freed normally later.
    if (m.cached || hash_to_block_.count(h) != 0) continue;
    m.cached = true;
    m.hash = h;
    m.tokens.assign(block_tokens.begin(), block_tokens.end());
    hash_to_block_.emplace(h, b);
  }
  // After indexing: a full block that leaves the window in the same step (a long prefill chunk)
  // goes to the cached-free list and stays revivable by a later prefix hit.
  release_outside_window(s);
}

void block_manager::release_outside_window(seq_state& s) {
  const int32_t dead = std::min(blocks_outside_window(s.num_computed), static_cast<int32_t>(s.device.size()));
  // Oldest first: they enter the LRU list first and so are evicted first.
  for (; s.num_freed < dead; ++s.num_freed) {
    block_id& b = s.device[static_cast<size_t>(s.num_freed)];
    release(b);
    b = no_block;
    ++num_window_freed_;
  }
}

void block_manager::truncate(seq_id seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seq_state& s = it->second;
  if (s.swapped) throw std::logic_error("block_manager::truncate: sequence is swapped out");
  if (num_tokens < s.num_computed) throw std::logic_error("block_manager::truncate: would drop computed tokens");
  const auto keep = static_cast<size_t>(std::max(blocks_for(num_tokens), s.num_freed));
  // Last first, like free(): the freed tail leaves in the order it was allocated, reversed.
  while (s.device.size() > keep) {
    release(s.device.back());
    s.device.pop_back();
  }
}

void block_manager::fork(seq_id parent, seq_id child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end() || it->second.swapped) throw std::logic_error("block_manager::fork: parent not resident");
  if (has(child)) throw std::logic_error("block_manager::fork: child already has blocks");
  seq_state copy = it->second;  // freed window entries included: the child is at the same position
  for (block_id b : copy.device)
    if (b != no_block) ++blocks_[static_cast<size_t>(b)].ref_count;
  seqs_.emplace(child, std::move(copy));
}

void block_manager::free(seq_id seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seq_state& s = it->second;
  // Tail blocks first: they enter the LRU list earlier, so they are evicted before the prefix
  // blocks that other requests are more likely to share.
  for (auto b = s.device.rbegin(); b != s.device.rend(); ++b)
    if (*b != no_block) release(*b);
  for (block_id h : s.host) free_host_.push_back(h);
  seqs_.erase(it);
}

bool block_manager::swap_out(seq_id seq, std::vector<block_copy>& swap_out_list) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.swapped) throw std::logic_error("block_manager::swap_out: not resident");
  seq_state& s = it->second;
  const auto held = std::span(s.device).subspan(static_cast<size_t>(s.num_freed));  // freed entries: nothing to copy
  if (held.size() > free_host_.size()) return false;
  for (block_id d : held) {
    const block_id h = free_host_.back();
    free_host_.pop_back();
    swap_out_list.push_back({d, h});
    s.host.push_back(h);
  }
  for (auto b = held.rbegin(); b != held.rend(); ++b) release(*b);
  s.device.clear();
  s.swapped = true;
  return true;
}

bool block_manager::swap_in(seq_id seq, int32_t reserve_blocks, std::vector<block_copy>& swap_in_list) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || !it->second.swapped) throw std::logic_error("block_manager::swap_in: not swapped");
  seq_state& s = it->second;
  if (static_cast<int32_t>(s.host.size()) > num_free_blocks() - reserve_blocks) return false;
  s.device.assign(static_cast<size_t>(s.num_freed), no_block);
  for (block_id h : s.host) {
    const block_id d = take_free_block();
    swap_in_list.push_back({h, d});
    s.device.push_back(d);
    free_host_.push_back(h);
  }
  s.host.clear();
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
    for (size_t i = static_cast<size_t>(s.num_freed); i < s.device.size(); ++i) {
      block_info& info = out[static_cast<size_t>(s.device[i])];
      const int32_t filled = std::clamp(s.num_computed - static_cast<int32_t>(i) * block_size_, 0, block_size_);
      info.num_filled = std::max(info.num_filled, filled);
      if (!info.owner || id < info.owner) info.owner = id;
    }
  }
  return out;
}

std::vector<block_info> block_manager::host_snapshot() const {
  std::vector<block_info> out(static_cast<size_t>(num_host_blocks_));
  for (size_t b = 0; b < out.size(); ++b) out[b].id = static_cast<block_id>(b);
  for (const auto& [id, s] : seqs_) {
    for (size_t i = 0; i < s.host.size(); ++i) {
      block_info& info = out[static_cast<size_t>(s.host[i])];
      info.ref_count = 1;
      const int32_t logical = s.num_freed + static_cast<int32_t>(i);  // host[i] holds table entry num_freed + i
      info.num_filled = std::clamp(s.num_computed - logical * block_size_, 0, block_size_);
      info.owner = id;
    }
  }
  return out;
}

block_manager::slot_usage block_manager::slots() const {
  slot_usage u;
  std::vector<int32_t> filled(blocks_.size(), -1);
  for (const auto& [id, s] : seqs_) {
    for (size_t i = static_cast<size_t>(s.num_freed); i < s.device.size(); ++i) {
      const int32_t f = std::clamp(s.num_computed - static_cast<int32_t>(i) * block_size_, 0, block_size_);
      int32_t& slot = filled[static_cast<size_t>(s.device[i])];
      slot = std::max(slot, f);
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
    if (s.swapped && !s.device.empty())
      return "swapped sequence " + std::to_string(id.value()) + " holds device blocks";
    if (!s.swapped && !s.host.empty()) return "resident sequence " + std::to_string(id.value()) + " holds host blocks";
    const std::string seq_name = "sequence " + std::to_string(id.value());
    // The window: exactly the blocks no later query reads are freed, all of them leading entries.
    if (s.num_freed != blocks_outside_window(s.num_computed))
      return seq_name + ": " + std::to_string(s.num_freed) + " blocks freed for the window, expected " +
             std::to_string(blocks_outside_window(s.num_computed)) + " at " + std::to_string(s.num_computed) +
             " computed tokens";
    if (!s.swapped && static_cast<int32_t>(s.device.size()) < s.num_freed)
      return seq_name + ": table shorter than its freed entries";
    for (size_t i = 0; i < s.device.size(); ++i) {
      const block_id b = s.device[i];
      if ((b == no_block) != (static_cast<int32_t>(i) < s.num_freed))
        return seq_name + ": table entry " + std::to_string(i) + (b == no_block ? " is freed" : " is held") + " but " +
               std::to_string(s.num_freed) + " leading entries are freed";
      if (b == no_block) continue;
      if (b < 0 || b >= num_device_blocks()) return "block id out of range";
      ++refs[static_cast<size_t>(b)];
    }
    for (block_id h : s.host) {
      if (h < 0 || h >= num_host_blocks_) return "host block id out of range";
      ++host_refs[static_cast<size_t>(h)];
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
      auto it = hash_to_block_.find(m.hash);
      if (it == hash_to_block_.end() || it->second != static_cast<block_id>(b))
        return name + ": cached but not indexed";
      if (static_cast<int32_t>(m.tokens.size()) != block_size_) return name + ": cached block is not full";
    }
  }
  for (const auto& [h, b] : hash_to_block_)
    if (!blocks_[static_cast<size_t>(b)].cached || blocks_[static_cast<size_t>(b)].hash != h)
      return "hash index points at block " + std::to_string(b) + " which does not carry that hash";
  std::vector<int32_t> host_free(static_cast<size_t>(num_host_blocks_), 0);
  for (block_id h : free_host_) ++host_free[static_cast<size_t>(h)];
  for (int32_t h = 0; h < num_host_blocks_; ++h)
    if (host_refs[static_cast<size_t>(h)] + host_free[static_cast<size_t>(h)] != 1)
      return "host block " + std::to_string(h) + " is owned " + std::to_string(host_refs[static_cast<size_t>(h)]) +
             " times and free " + std::to_string(host_free[static_cast<size_t>(h)]) + " times";
  return {};
}

}  // namespace tessera
