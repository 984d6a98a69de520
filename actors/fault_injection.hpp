// Fault injection for tests and soak/chaos runs: an executor wrapper that throws, stalls, throws
// after a stall, or fails an allocation (std::bad_alloc, as an out-of-memory executor would) at
// chosen or random (seeded) steps, and the fault plan that also makes tokenizer actors exit in the
// middle of a request. Nothing here runs unless a test builds it explicitly or the process finds
// TESSERA_FAULT_INJECTION in its environment (engine_facade; docs/security.md "Fault injection").
// It is compiled into every binary so that the binary under test is the one that ships; whoever
// sets a server's environment controls the server anyway, and an enabled plan is announced on
// stderr at start-up.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "actors/prompt_input.hpp"
#include "engine/executor.hpp"

namespace tessera::actors {

enum class executor_fault : uint8_t { none, throw_now, stall, stall_then_throw, bad_alloc };
std::string_view to_string(executor_fault f);

// What to inject, drawn independently for every execute() call and every prompt encoding.
struct fault_plan {
  uint64_t seed = 0;
  double executor_fault_rate = 0;  // per execute() call
  // The kinds a fault is drawn from (uniformly among those enabled).
  bool throws = true;
  bool stalls = true;
  bool stall_throws = true;
  bool bad_allocs = true;                // std::bad_alloc: an allocation that fails
  std::chrono::milliseconds stall{500};  // longer than a step normally takes
  int64_t after_calls = 0;               // the first N execute() calls never fault (start-up, warm-up)
  int64_t at_call = 0;                   // > 0: this execute() call faults (a kind drawn as above)
  // The fraction of distinct prompts (text or conversation) that make every tokenizer actor encoding
  // them exit without answering.
  double tokenizer_exit_rate = 0;

  bool any() const { return executor_fault_rate > 0 || at_call > 0 || tokenizer_exit_rate > 0; }
  bool faults_executor() const { return executor_fault_rate > 0 || at_call > 0; }
  std::string describe() const;
};

// The value of TESSERA_FAULT_INJECTION: "SEED:RATE" (every executor fault kind at RATE per call) or
// comma-separated keys: seed=N, rate=P, kinds=throw+stall+stall_throw+bad_alloc, stall_ms=N,
// after=N, at=N, tokenizer_exit=P. Throws invalid_request naming the bad part (a typo must not
// silently disable it).
fault_plan parse_fault_plan(std::string_view text);

// Deterministic uniform draw in [0, 1) for (seed, stream, index): the same plan injects the same
// faults at the same calls in every run, whatever the thread timing.
double fault_draw(uint64_t seed, uint64_t stream, uint64_t index);

// Decides, for one encode request, whether the tokenizer actor serving it exits instead of answering.
// Called on the tokenizer actors' (CAF worker) threads, concurrently: must be thread-safe.
using tokenizer_fault = std::function<bool(const prompt_input&)>;
// plan.tokenizer_exit_rate as a tokenizer_fault (null when the rate is 0): true for a prompt whose
// seeded draw, keyed on a hash of its content, is below the rate; the same answer every time.
tokenizer_fault make_tokenizer_fault(const fault_plan& plan);
uint64_t prompt_hash(const prompt_input& p);

// An executor whose execute() first asks `schedule` (or, without one, the plan's seeded draw) what to
// do: run normally, throw (std::runtime_error, or std::bad_alloc), sleep plan.stall then run, or
// sleep then throw. A throw happens before
// the inner executor touches anything, like sim_executor::fail_at_step. Counters are readable from
// any thread.
class fault_injecting_executor : public executor {
 public:
  // call: 1-based number of the execute() call; batch: what it is asked to run (a test can aim at a
  // state, e.g. the first step after a swap-out).
  using schedule_fn = std::function<executor_fault(int64_t call, const step_batch& batch)>;

  fault_injecting_executor(std::unique_ptr<executor> inner, fault_plan plan, schedule_fn schedule = {});

  const model_config& config() const override { return inner_->config(); }
  const kv_cache_spec& kv_spec() const override { return inner_->kv_spec(); }
  int64_t kv_block_bytes() const override { return inner_->kv_block_bytes(); }
  const char* name() const override { return inner_->name(); }
  const char* kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  bool overlaps_steps() const override { return inner_->overlaps_steps(); }
  bool takes_late_masks() const override { return inner_->takes_late_masks(); }
  bool reads_only_window() const override { return inner_->reads_only_window(); }
  bool verifies_token_trees() const override { return inner_->verifies_token_trees(); }
  bool pools_hidden_states() const override { return inner_->pools_hidden_states(); }
  bool scores_prompts() const override { return inner_->scores_prompts(); }
  kv_layer_groups kv_groups() const override { return inner_->kv_groups(); }
  void execute(const step_batch& batch, step_output& out) override;
  // Overlapped steps: a submit() counts as a call (and faults as execute() does); wait() passes on.
  void submit(const step_batch& batch) override;
  void wait(step_output& out) override { inner_->wait(out); }

  // The fault execute() call number `call` gets under the plan's seeded draw.
  executor_fault drawn_fault(int64_t call) const;

  executor& inner() { return *inner_; }
  int64_t num_calls() const { return num_calls_.load(); }
  int64_t num_throws() const { return num_throws_.load(); }
  int64_t num_stalls() const { return num_stalls_.load(); }

 private:
  void inject(const step_batch& batch);  // the fault of this call, if any (it may throw)
  std::unique_ptr<executor> inner_;
  fault_plan plan_;
  schedule_fn schedule_;
  std::atomic<int64_t> num_calls_{0};
  std::atomic<int64_t> num_throws_{0};
  std::atomic<int64_t> num_stalls_{0};
};

}  // namespace tessera::actors
