// Helpers shared by the actor tests: a character-level test tokenizer, a simulated executor that
// can be held at a gate (to fill queues deterministically) or inside a chosen step (to meet a
// request in a known state), and the offline oracle: the same requests run through llm_engine
// directly, on a fresh simulated executor.
#pragma once
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/llm_engine.hpp"
#include "engine/sim_executor.hpp"
#include "engine/text/tokenizer.hpp"
#include "tests/support/char_tokenizer.hpp"

namespace tessera::testing {

using test_support::char_tokenizer;
constexpr int32_t test_vocab = test_support::char_vocab;

// sim_executor behind a gate: execute() waits while the gate is closed.
class gated_executor : public executor {
 public:
  gated_executor(int32_t num_blocks, int32_t num_host_blocks, bool open = true)
      : sim_(16, num_blocks, num_host_blocks, test_vocab), open_(open) {}
  const model_config& config() const override { return sim_.config(); }
  const kv_cache_spec& kv_spec() const override { return sim_.kv_spec(); }
  int64_t kv_block_bytes() const override { return sim_.kv_block_bytes(); }
  const char* name() const override { return "gated_sim"; }
  void execute(const step_batch& batch, step_output& out) override {
    {
      std::unique_lock lock(mutex_);
      gate_.wait(lock, [&] { return open_; });
    }
    sim_.execute(batch, out);
  }
  void set_open(bool open) {
    {
      std::lock_guard lock(mutex_);
      open_ = open;
    }
    gate_.notify_all();
  }
  sim_executor& sim() { return sim_; }

 private:
  sim_executor sim_;
  std::mutex mutex_;
  std::condition_variable gate_;
  bool open_;
};

// sim_executor that can hold one chosen step: the first execute() whose batch matches `when` records
// the batch's sequence ids, reports itself held and waits for release(). While it is held the
// engine actor is blocked inside that step, so the test knows exactly which engine state the
// messages it sends meanwhile (aborts, submits) meet once the step ends.
class held_executor : public executor {
 public:
  held_executor(int32_t num_blocks, int32_t num_host_blocks) : sim_(16, num_blocks, num_host_blocks, test_vocab) {}
  const model_config& config() const override { return sim_.config(); }
  const kv_cache_spec& kv_spec() const override { return sim_.kv_spec(); }
  int64_t kv_block_bytes() const override { return sim_.kv_block_bytes(); }
  const char* name() const override { return "held_sim"; }

  void hold_when(std::function<bool(const step_batch&)> when) {
    std::lock_guard lock(mutex_);
    when_ = std::move(when);
  }
  void execute(const step_batch& batch, step_output& out) override {
    {
      std::unique_lock lock(mutex_);
      char thread_name[16] = {};
      pthread_getname_np(pthread_self(), thread_name, sizeof thread_name);
      thread_names_.insert(thread_name);
      for (const sequence_slice& s : batch.seqs)
        if (s.num_computed == 0) first_tokens_.try_emplace(s.seq, s.tokens);
      if (when_ && when_(batch)) {
        when_ = nullptr;
        held_ = true;
        held_seqs_.clear();
        for (const sequence_slice& s : batch.seqs) held_seqs_.push_back(s.seq);
        changed_.notify_all();
        changed_.wait(lock, [&] { return !held_; });
      }
    }
    sim_.execute(batch, out);
  }
  // Waits until a step is held; false after `timeout`.
  bool wait_held(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return held_; });
  }
  std::vector<seq_id> held_seqs() {
    std::lock_guard lock(mutex_);
    return held_seqs_;
  }
  // The tokens each sequence was first scheduled with (its prompt, or the prompt's first chunk).
  std::map<seq_id, std::vector<token_id>> first_tokens() {
    std::lock_guard lock(mutex_);
    return first_tokens_;
  }
  // The names of the threads execute() ran on (CAF names a detached actor's thread "caf.actor" and
  // its cooperative scheduler's workers "caf.multiplexer").
  std::set<std::string> thread_names() {
    std::lock_guard lock(mutex_);
    return thread_names_;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      held_ = false;
    }
    changed_.notify_all();
  }
  sim_executor& sim() { return sim_; }

 private:
  sim_executor sim_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<bool(const step_batch&)> when_;
  bool held_ = false;
  std::vector<seq_id> held_seqs_;
  std::map<seq_id, std::vector<token_id>> first_tokens_;
  std::set<std::string> thread_names_;
};

struct offline_request {
  std::vector<token_id> prompt;
  sampling_params params;
};

// Tokens of every request (by submission order) when run through llm_engine directly.
inline std::vector<std::vector<token_id>> run_offline(executor& exec, std::shared_ptr<const tokenizer> tok,
                                                      const engine_options& options,
                                                      const std::vector<offline_request>& requests) {
  llm_engine engine(exec, std::move(tok), options);
  std::map<request_id, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[engine.add_request(requests[i].prompt, requests[i].params)] = i;
  std::vector<std::vector<token_id>> out(requests.size());
  while (engine.has_unfinished()) {
    for (const request_output& o : engine.step()) {
      auto& t = out[index.at(o.id)];
      t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
    }
  }
  return out;
}

}  // namespace tessera::testing
