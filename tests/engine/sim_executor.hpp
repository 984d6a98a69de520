// A simulated executor for engine tests: no model, but a faithful KV store.
//
// Every device/host block holds `block_size` slots of (token, position). A step applies swap-ins,
// swap-outs and copies in the executor contract's order, then for every sequence slice:
//   1. reads back positions [0, num_computed) through its block table and checks each slot holds
//      that position (and, for a sequence it has seen before, the same tokens as last time);
//   2. writes (token, position) of the new tokens into their slots — refusing to write a block that
//      another slice of the same step reads or writes (a missing copy-on-write);
//   3. returns deterministic fake logits that are a function of the WHOLE token history as read
//      back from the cache plus the new tokens, and for embedding slices (sequence_slice::hidden)
//      fake hidden rows (fake_hidden) made the same way, summed over the slice or its last one, and
//      for scored prompt rows (sequence_slice::prompt_targets) score_prompt_row over those logits.
// So any paging bug (sharing without CoW, a bad swap/copy, a block reused while still owned, a
// stale prefix-cache hit) either trips a check here or changes the logits, and thus the tokens the
// engine generates, which tests compare with an oracle computed from the true token history.
//
// With set_window(w) it models a one-layer sliding-window model: a query sees only the last w
// positions (its own included), so step 1 reads back only [num_computed - w + 1, num_computed) and
// the logits are a function of the visible window and its position (visible_history). Reading any
// other slot, or a no_block entry inside the window, is an error; the freed entries before it are
// never touched (reads_only_window), which is what lets the engine free those blocks.
//
// With set_verifies_trees(true) it takes token trees (sequence_slice::tree_parents): node j is written
// to the slot of num_computed + j with its own position num_computed + depth(j), and its logits are a
// function of the context read back and its ancestors' tokens, so a slot whose position is not its
// index (a tree node the engine counted as computed where it does not belong) trips the read-back check.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/executor.hpp"

namespace tessera::testing {

// FNV-1a over the token history: fake logits depend on every token and its position.
inline uint64_t history_hash(std::span<const token_id> tokens) {
  uint64_t h = 1469598103934665603ULL;
  for (token_id t : tokens) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL;
    h *= 1099511628211ULL;
  }
  return h;
}

// Deterministic logits in [-4, 4) for the token following `history`.
inline std::vector<float> fake_logits(std::span<const token_id> history, int32_t vocab_size) {
  std::vector<float> out(static_cast<size_t>(vocab_size));
  uint64_t x = history_hash(history);
  for (int32_t v = 0; v < vocab_size; ++v) {
    // splitmix64 stream seeded by the history
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    out[static_cast<size_t>(v)] = static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
  }
  return out;
}

// What a one-layer model with a sliding window of w sees when it predicts the token after `history`:
// its last w tokens and where they stand (w == 0: the whole history).
inline std::vector<token_id> visible_history(std::span<const token_id> history, int32_t window) {
  if (window <= 0) return {history.begin(), history.end()};
  const size_t n = std::min(history.size(), static_cast<size_t>(window));
  std::vector<token_id> v(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
  v.push_back(static_cast<token_id>(history.size()));  // the position: equal windows elsewhere differ
  return v;
}

// The fake model's final hidden state at the last token of `history` (what an embedding pools):
// `hidden_size` values in [-1, 1), a function of the whole history like the logits.
inline std::vector<float> fake_hidden(std::span<const token_id> history, int32_t hidden_size) {
  std::vector<float> h = fake_logits(history, hidden_size);
  for (float& v : h) v /= 4.0f;
  return h;
}

// Token of rank `rank` (0 = argmax) in fake_logits(history); ties broken by the lower id.
inline token_id ranked_token(std::span<const token_id> history, int32_t vocab_size, int32_t rank = 0) {
  std::vector<float> l = fake_logits(history, vocab_size);
  std::vector<token_id> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<token_id>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](token_id a, token_id b) { return l[size_t(a)] > l[size_t(b)]; });
  return ids[static_cast<size_t>(rank)];
}

class sim_executor : public executor {
 public:
  sim_executor(int32_t block_size, int32_t num_device_blocks, int32_t num_host_blocks, int32_t vocab_size = 64,
               int64_t block_bytes = 4096)
      : block_bytes_(block_bytes) {
    spec_.block_size = block_size;
    spec_.num_device_blocks = num_device_blocks;
    spec_.num_host_blocks = num_host_blocks;
    config_.name = "sim";
    config_.num_layers = 1;
    config_.vocab_size = vocab_size;
    config_.hidden_size = 4;
    config_.context_length = 1 << 20;
    device_.assign(static_cast<size_t>(num_device_blocks) * block_size, slot{});
    host_.assign(static_cast<size_t>(num_host_blocks) * block_size, slot{});
  }

  const model_config& config() const override { return config_; }
  const kv_cache_spec& kv_spec() const override { return spec_; }
  int64_t kv_block_bytes() const override { return block_bytes_; }
  const char* name() const override { return "sim"; }
  bool reads_only_window() const override { return true; }
  bool pools_hidden_states() const override { return true; }
  bool scores_prompts() const override { return scores_prompts_; }
  void set_scores_prompts(bool on) { scores_prompts_ = on; }
  // Scored prompt rows so far, per (sequence, position of the row): each prompt row should be scored once.
  const std::map<std::pair<seq_id, int32_t>, int32_t>& scored_rows() const { return scored_; }
  // Makes the executor return no scored rows from execute() call number `step` on (a broken executor).
  void drop_scores_from_step(int64_t step) { drop_scores_from_ = step; }

  // One sliding-window layer of w positions (0: full attention): config().kv_window() becomes w.
  void set_window(int32_t w) {
    window_ = w;
    config_.layers.assign(1, layer_attention{w});
  }
  int32_t window() const { return window_; }
  void set_verifies_trees(bool on) { trees_ = on; }
  bool verifies_token_trees() const override { return trees_; }
  int64_t num_tree_slices() const { return num_tree_slices_; }

  // Every contract violation seen so far (tests assert this stays empty).
  const std::vector<std::string>& errors() const { return errors_; }
  int64_t num_steps() const { return num_steps_; }
  int64_t num_computed_tokens() const { return num_computed_tokens_; }
  // Makes the execute() call number `step` (1-based) throw after applying nothing.
  void fail_at_step(int64_t step) { fail_at_ = step; }

  void execute(const step_batch& batch, step_output& out) override {
    ++num_steps_;
    if (num_steps_ == fail_at_) throw std::runtime_error("sim_executor: injected failure");
    const int32_t bs = spec_.block_size;
    auto copy_block = [&](std::vector<slot>& from, block_id src, std::vector<slot>& to, block_id dst) {
      for (int32_t i = 0; i < bs; ++i) to[static_cast<size_t>(dst) * bs + i] = from[static_cast<size_t>(src) * bs + i];
    };
    for (const block_copy& c : batch.swap_in) {
      if (!in_range(c.src, spec_.num_host_blocks) || !in_range(c.dst, spec_.num_device_blocks)) {
        error("swap_in out of range");
        continue;
      }
      copy_block(host_, c.src, device_, c.dst);
    }
    for (const block_copy& c : batch.swap_out) {
      if (!in_range(c.src, spec_.num_device_blocks) || !in_range(c.dst, spec_.num_host_blocks)) {
        error("swap_out out of range");
        continue;
      }
      copy_block(device_, c.src, host_, c.dst);
    }
    for (const block_copy& c : batch.copies) {
      if (!in_range(c.src, spec_.num_device_blocks) || !in_range(c.dst, spec_.num_device_blocks)) {
        error("copy out of range");
        continue;
      }
      copy_block(device_, c.src, device_, c.dst);
    }

    // Blocks each slice reads (positions in [first_read, num_computed)) and writes (its new tokens).
    std::map<block_id, std::set<seq_id>> readers, writers;
    for (const sequence_slice& s : batch.seqs) {
      const int32_t end = s.num_computed + static_cast<int32_t>(s.tokens.size());
      if (static_cast<int32_t>(s.block_table.size()) * bs < end) {
        error("seq " + std::to_string(s.seq.value()) + ": block table too short");
        continue;
      }
      for (int32_t p = first_read(s); p < end; ++p) {
        const block_id b = s.block_table[static_cast<size_t>(p / bs)];
        if (b == no_block) {
          error("seq " + std::to_string(s.seq.value()) + ": position " + std::to_string(p) + " is in a freed block");
          continue;
        }
        (p < s.num_computed ? readers : writers)[b].insert(s.seq);
      }
    }
    for (const auto& [b, w] : writers) {
      if (w.size() > 1) error("block " + std::to_string(b) + " written by two sequences in one step");
      auto r = readers.find(b);
      if (r != readers.end())
        for (seq_id reader : r->second)
          if (!w.count(reader)) error("block " + std::to_string(b) + " written while another sequence reads it");
    }

    out.vocab_size = config_.vocab_size;
    out.logits.clear();
    out.first_row.assign(batch.seqs.size(), 0);
    out.num_rows.assign(batch.seqs.size(), 0);
    out.hidden_size = config_.hidden_size;
    out.hidden.clear();
    out.hidden_row.assign(batch.seqs.size(), -1);
    out.prompt_logprobs.clear();
    out.prompt_first.assign(batch.seqs.size(), 0);
    out.prompt_count.assign(batch.seqs.size(), 0);
    int32_t row = 0;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const sequence_slice& s = batch.seqs[i];
      const int32_t end = s.num_computed + static_cast<int32_t>(s.tokens.size());
      if (static_cast<int32_t>(s.block_table.size()) * bs < end) continue;
      const int32_t first = first_read(s);
      bool freed = false;
      for (int32_t p = first; p < end; ++p) freed = freed || s.block_table[static_cast<size_t>(p / bs)] == no_block;
      if (freed) continue;  // reported above
      // Positions before `first` are outside every query's window: unknown here, never used.
      std::vector<token_id> history(static_cast<size_t>(first), token_id{-1});
      history.reserve(static_cast<size_t>(end));
      for (int32_t p = first; p < s.num_computed; ++p) {
        const slot& sl = device_[static_cast<size_t>(s.block_table[static_cast<size_t>(p / bs)]) * bs + p % bs];
        if (sl.pos != p) {
          error("seq " + std::to_string(s.seq.value()) + ": position " + std::to_string(p) +
                " reads a slot holding position " + std::to_string(sl.pos));
        }
        history.push_back(sl.token);
      }
      auto known = histories_.find(s.seq);
      // (Positions a windowed step did not read are -1 in the record: not compared.)
      auto same = [](token_id read, token_id before) { return before < 0 || read == before; };
      if (known != histories_.end() && static_cast<int32_t>(known->second.size()) >= s.num_computed &&
          !std::equal(history.begin() + first, history.end(), known->second.begin() + first, same))
        error("seq " + std::to_string(s.seq.value()) + ": cached K/V differ from the tokens it computed before");
      const bool tree = !s.tree_parents.empty();
      if (tree && !trees_) error("seq " + std::to_string(s.seq.value()) + ": a token tree, not asked for");
      if (tree) ++num_tree_slices_;
      const size_t context = history.size();
      std::vector<int32_t> depth(s.tokens.size(), 0);
      for (size_t j = 0; j < s.tokens.size(); ++j) {
        const int32_t parent = tree ? s.tree_parents[j] : static_cast<int32_t>(j) - 1;
        if (parent >= static_cast<int32_t>(j)) error("a tree parent after its child");
        depth[j] = parent < 0 || parent >= static_cast<int32_t>(j) ? 0 : depth[static_cast<size_t>(parent)] + 1;
        const int32_t p = s.num_computed + static_cast<int32_t>(j);
        slot& sl = device_[static_cast<size_t>(s.block_table[static_cast<size_t>(p / bs)]) * bs + p % bs];
        sl.token = s.tokens[j];
        sl.pos = s.num_computed + depth[j];
        history.push_back(s.tokens[j]);
      }
      // The tokens row j sees: the context, then its ancestors (a chain: every row before it) and itself.
      auto seen_by = [&](size_t j) {
        std::vector<token_id> h(history.begin(), history.begin() + static_cast<std::ptrdiff_t>(context));
        std::vector<token_id> branch;
        for (int32_t at = static_cast<int32_t>(j); at >= 0;
             at = tree ? s.tree_parents[static_cast<size_t>(at)] : at - 1)
          branch.push_back(s.tokens[static_cast<size_t>(at)]);
        h.insert(h.end(), branch.rbegin(), branch.rend());
        return h;
      };
      num_computed_tokens_ += static_cast<int64_t>(s.tokens.size());
      const int32_t num_rows = s.logits == sequence_slice::logits_mode::none   ? 0
                               : s.logits == sequence_slice::logits_mode::last ? 1
                                                                               : static_cast<int32_t>(s.tokens.size());
      out.first_row[i] = row;
      out.num_rows[i] = num_rows;
      for (int32_t k = 0; k < num_rows; ++k) {
        const std::vector<float> l = row_logits(seen_by(s.tokens.size() - static_cast<size_t>(num_rows - k)));
        out.logits.insert(out.logits.end(), l.begin(), l.end());
      }
      row += num_rows;
      if (s.hidden != sequence_slice::hidden_mode::none && !s.tokens.empty()) {
        const auto hs = static_cast<size_t>(config_.hidden_size);
        out.hidden_row[i] = static_cast<int32_t>(out.hidden.size() / hs);
        out.hidden.resize(out.hidden.size() + hs, 0.0f);
        float* dst = out.hidden.data() + out.hidden.size() - hs;
        const size_t first_row = s.hidden == sequence_slice::hidden_mode::last ? s.tokens.size() - 1 : 0;
        for (size_t j = first_row; j < s.tokens.size(); ++j) {
          const size_t upto = history.size() - (s.tokens.size() - 1 - j);
          const std::vector<float> h =
              fake_hidden(visible_history(std::span(history).first(upto), window_), config_.hidden_size);
          for (size_t d = 0; d < hs; ++d) dst[d] += h[d];
        }
      }
      if (!s.prompt_targets.empty() && scores_prompts_ && (drop_scores_from_ < 0 || num_steps_ < drop_scores_from_)) {
        out.prompt_first[i] = static_cast<int32_t>(out.prompt_logprobs.size());
        out.prompt_count[i] = static_cast<int32_t>(s.prompt_targets.size());
        for (size_t j = 0; j < s.prompt_targets.size(); ++j) {
          const int32_t p = s.num_computed + s.prompt_first_row + static_cast<int32_t>(j);  // the row's position
          ++scored_[{s.seq, p}];
          const std::vector<float> l = fake_logits(
              visible_history(std::span(history).first(static_cast<size_t>(p) + 1), window_), config_.vocab_size);
          out.prompt_logprobs.push_back(score_prompt_row(l, s.prompt_targets[j], s.prompt_top_k));
        }
      }
      histories_[s.seq] = std::move(history);
    }
  }

 protected:
  // The logits row after `seen` (the context and the row's branch, its own token last).
  virtual std::vector<float> row_logits(std::span<const token_id> seen) const {
    return fake_logits(visible_history(seen, window_), config_.vocab_size);
  }

 private:
  struct slot {
    token_id token = -1;
    int32_t pos = -1;
  };
  static bool in_range(block_id b, int32_t n) { return b >= 0 && b < n; }
  // The first position any query of the slice sees (its first new token is at num_computed).
  int32_t first_read(const sequence_slice& s) const {
    return window_ > 0 ? std::max(0, s.num_computed - window_ + 1) : 0;
  }
  void error(std::string e) {
    if (errors_.size() < 20) errors_.push_back("step " + std::to_string(num_steps_) + ": " + std::move(e));
  }

  kv_cache_spec spec_;
  model_config config_;
  int64_t block_bytes_;
  int32_t window_ = 0;
  std::vector<slot> device_;
  std::vector<slot> host_;
  std::unordered_map<seq_id, std::vector<token_id>> histories_;
  std::vector<std::string> errors_;
  int64_t num_steps_ = 0;
  int64_t num_computed_tokens_ = 0;
  int64_t fail_at_ = -1;
  bool scores_prompts_ = true;
  bool trees_ = false;
  int64_t num_tree_slices_ = 0;
  int64_t drop_scores_from_ = -1;
  std::map<std::pair<seq_id, int32_t>, int32_t> scored_;
};

// The simulator with a first-order Markov model: a row's logits depend only on its own token (not the
// whole history), so greedy continuations fall into cycles, which the n-gram proposer predicts and a
// history-hash draft mostly fails to guess (the speculative decoding tests use both).
class markov_executor : public sim_executor {
 public:
  using sim_executor::sim_executor;

 protected:
  std::vector<float> row_logits(std::span<const token_id> seen) const override {
    return fake_logits(seen.last(1), config().vocab_size);
  }
};

// A second-order Markov target: the logits depend on the last two tokens a row sees (its own and the
// one before it in its branch, or the context's last). An n-gram proposer matching one token then
// guesses wrong as often as right, and a tree's other branches are accepted now and then; a row that
// saw a sibling's token instead of its parent's would get other logits.
class markov2_executor : public sim_executor {
 public:
  using sim_executor::sim_executor;

 protected:
  std::vector<float> row_logits(std::span<const token_id> seen) const override {
    return fake_logits(seen.last(std::min<size_t>(2, seen.size())), config().vocab_size);
  }
};

}  // namespace tessera::testing
