// Spawn functions of the runtime's actors and the state the engine actor shares with the facade.
// Protocol (all messages in actors/messages.hpp; details and a message-flow diagram in
// docs/architecture.md):
//
//   tokenizer  (pool, detached):     (encode_atom, prompt_ptr)  -> std::vector<token_id> | error
//   executor   (detached):           (exec_atom, exec_job)      -> done_atom | error (and it quits)
//   kv_manager (event-based):        (occupy_atom, occupancy_ptr)             one per engine step
//                                    (query_atom)               -> occupancy_ptr (null before step 1)
//                                    (query_atom, usage_atom)   -> usage_report
//   event_bus  (event-based):        (subscribe_atom, actor sink, double max_rate_hz)
//                                    (publish_atom, record_ptr)               one per engine step
//                                    -> sink: (events_atom, event_batch_ptr); sink answers (ack_atom)
//   engine     (detached):           (submit_atom, submit_ptr, actor subscriber)
//                                    (abort_atom, ticket_id), (abort_all_atom), (stop_atom)
//                                    (status_atom) -> runtime_status
//                                    -> subscriber: (delta_atom, delta_ptr)*, then (final_atom, final_ptr)
//   stream sink (event-based, one per request): the facade's subscriber; into the stream_buffer
#pragma once
#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/fault_injection.hpp"
#include "actors/messages.hpp"
#include "actors/prompt_encoder.hpp"
#include "engine/llm_engine.hpp"

namespace tessera::actors {

// Counters and snapshots the engine actor publishes for the facade's threads. The atomics are the
// admission-control state (checked by submit without a message round-trip); the rest is a snapshot
// refreshed after every step under `mutex`.
struct runtime_shared {
  std::atomic<int32_t> num_queued{0};  // submitted, not yet admitted to running (or finished)
  std::atomic<int32_t> num_open{0};    // submitted, final message not yet sent
  std::atomic<bool> healthy{true};

  mutable std::mutex mutex;
  std::condition_variable changed;  // num_open dropped or health changed
  std::string health_message;
  engine_stats stats;
  pool_usage device;
  pool_usage host;
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  int32_t num_swapped = 0;
  uint64_t num_completed = 0;  // finals with reason stop / length
  uint64_t num_aborted = 0;
  uint64_t num_failed = 0;
  uint64_t num_tokenizer_restarts = 0;  // tokenizer actors that died and were replaced

  void ticket_closed() {
    {
      std::lock_guard lock(mutex);
      num_open.fetch_sub(1);
    }
    changed.notify_all();
  }
};

// `fault` (tests, fault injection only; empty otherwise): a prompt for which it returns true makes the
// actor exit without answering, as if it crashed in the middle of the request.
caf::actor spawn_tokenizer_actor(caf::actor_system& sys, std::shared_ptr<const prompt_encoder> encoder,
                                 tokenizer_fault fault = {});

// Owns `exec` and runs it on the actor's own thread (detached), so compute never occupies one of
// CAF's cooperative scheduler threads. An exception from execute() is answered as an error and the
// actor quits: an executor that threw is treated as dead (see docs/architecture.md).
caf::actor spawn_executor_actor(caf::actor_system& sys, std::shared_ptr<executor> exec);

caf::actor spawn_kv_manager_actor(caf::actor_system& sys);

struct event_bus_options {
  uint64_t max_events_per_batch = 4096;  // per subscriber; older events beyond it are counted as dropped
};
caf::actor spawn_event_bus(caf::actor_system& sys, event_bus_options options = {});

// A subscriber for the bus that calls `callback` on its own thread (so a slow callback delays only
// its own batches, which the bus coalesces meanwhile) and acknowledges each batch.
caf::actor spawn_event_callback_sink(caf::actor_system& sys, std::function<void(const event_batch&)> callback);

class stream_buffer;

// The subscriber of one request's stream (event-based): delta_atom / final_atom into `buffer`, then it
// quits; an engine actor that goes down ends the stream with an error final.
caf::actor spawn_stream_sink(caf::actor_system& sys, std::shared_ptr<stream_buffer> buffer, caf::actor_addr engine,
                             ticket_id ticket);

// An executor that forwards execute() to the executor actor with a blocking request from the calling
// thread (the engine actor's own thread). The engine core keeps calling executor::execute()
// synchronously inside llm_engine::step(), unchanged. After a failure (an exception in the executor,
// the executor actor down) every later execute() throws, and failed() says why.
class actor_executor : public executor {
 public:
  actor_executor(caf::actor_system& sys, caf::actor exec_actor, const executor& metadata);
  ~actor_executor() override;
  const model_config& config() const override { return config_; }
  const kv_cache_spec& kv_spec() const override { return spec_; }
  int64_t kv_block_bytes() const override { return block_bytes_; }
  void execute(const step_batch& batch, step_output& out) override;
  void submit(const step_batch& batch) override;
  void wait(step_output& out) override;
  const char* name() const override { return name_.c_str(); }
  const char* kv_cache_dtype() const override { return kv_dtype_.c_str(); }
  // What the executor actor's executor can do, which the engine asks this one: it samples on the
  // device (the CUDA executor), reads only the attention window (so the engine frees the blocks before
  // it), verifies token trees (speculative decoding's trees), returns hidden states (embeddings). Each must be passed
  // on: a capability this adapter forgets is silently off in every served engine (tests/actors/actor_protocol_test.cpp
  // checks each).
  bool samples_on_device() const override { return samples_on_device_; }
  bool overlaps_steps() const override { return overlaps_steps_; }
  bool takes_late_masks() const override { return takes_late_masks_; }
  bool reads_only_window() const override { return reads_only_window_; }
  bool verifies_token_trees() const override { return verifies_token_trees_; }
  bool pools_hidden_states() const override { return pools_hidden_states_; }
  bool scores_prompts() const override { return scores_prompts_; }
  kv_layer_groups kv_groups() const override { return groups_; }

  const std::string& failure() const { return failure_; }
  bool failed() const { return !failure_.empty(); }

 private:
  struct blocking_self;
  void run(const exec_job& job);
  caf::actor_system& sys_;
  caf::actor actor_;
  model_config config_;
  kv_cache_spec spec_;
  int64_t block_bytes_ = 0;
  std::string name_;
  std::string kv_dtype_;
  bool samples_on_device_ = false;
  bool overlaps_steps_ = false;
  bool takes_late_masks_ = false;
  bool reads_only_window_ = false;
  bool verifies_token_trees_ = false;
  bool pools_hidden_states_ = false;
  bool scores_prompts_ = false;
  kv_layer_groups groups_;  // one block table per group in every slice (engine/model/kv_layer_groups.hpp)
  std::string failure_;
  std::unique_ptr<blocking_self> self_;  // created on first use, on the engine actor's thread
};

struct engine_actor_config {
  caf::actor executor_actor;
  std::shared_ptr<const executor> executor_metadata;  // config / kv spec of the executor (read-only)
  std::shared_ptr<const tokenizer> tok;               // for incremental detokenization in the engine
  engine_options engine;
  std::vector<caf::actor> tokenizers;  // empty: token-id prompts only
  // Set: a tokenizer actor that dies is replaced by one spawned with these (else it is only removed
  // from the pool). tokenizer_exit_when: fault injection, tests only (spawn_tokenizer_actor).
  std::shared_ptr<const prompt_encoder> tokenizer_encoder;
  tokenizer_fault tokenizer_exit_when;
  caf::actor kv_manager;  // may be invalid
  caf::actor event_bus;   // may be invalid
  std::shared_ptr<runtime_shared> shared;
  double kv_snapshot_interval_seconds = 0.1;  // block-level snapshots at most this often
};

// The engine actor, spawned detached: owns the llm_engine (scheduler queues, block manager, sampling,
// detokenization) and drives its step loop. Throws invalid_request (from the engine) when the options
// do not fit the executor.
caf::actor spawn_engine_actor(caf::actor_system& sys, engine_actor_config config);

// Registers the runtime's message types with an actor system configuration.
void add_message_types(caf::actor_system_config& cfg);

}  // namespace tessera::actors
