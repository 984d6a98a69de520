// Observability: one cheap structured record per engine step (pool usage, queues, batch shape,
// timings and the scheduling events of the step), plus a per-block snapshot for the dashboard.
// Everything here is plain data: building a record costs O(running sequences + events).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/sequence.hpp"

namespace tessera {

// A request's events come in this order: queued, admitted, [prefix_cache_hit], first_token, then any
// preemption / swap-in / re-admission cycles, then exactly one of finished / aborted / failed (a
// request aborted or failed early skips the stages it never reached). forked and the later
// first_token / end events of an n > 1 request are per sequence.
enum class event_kind : uint8_t {
  admitted,             // waiting -> running (first chunk scheduled)
  prefix_cache_hit,     // admission reused `num_blocks` cached blocks (their prefill skipped)
  preempted_swap,       // running -> swapped (KV copied to the host pool)
  preempted_recompute,  // running -> waiting (KV freed, recomputed later)
  swapped_in,           // swapped -> running
  forked,               // a sequence of an n > 1 request was forked from its parent
  finished,             // stop / length
  aborted,              // aborted by the caller
  failed,               // the executor threw while the sequence was in the step
  queued,               // add_request: the request entered the waiting queue (its arrival)
  first_token,          // the sequence's first output token was sampled (once, even across recompute)
};

enum class preemption_reason : uint8_t {
  none,
  kv_full,   // a running sequence needed a block and none was free
  priority,  // a more important waiting request needed the blocks
};

std::string_view to_string(event_kind kind);
std::string_view to_string(preemption_reason reason);

struct engine_event {
  event_kind kind = event_kind::admitted;
  request_id request;
  seq_id seq;
  int32_t num_blocks = 0;  // blocks reused (cache hit), swapped (swap) or freed (recompute)
  preemption_reason reason = preemption_reason::none;
  int64_t swap_bytes = 0;        // preempted_swap / swapped_in: bytes moved one way
  int32_t recompute_tokens = 0;  // preempted_recompute: tokens that must be prefilled again
  double estimated_seconds = 0;  // cost-model estimate of the chosen preemption
  // When it happened (the step's start for scheduling decisions): lets a viewer that receives events
  // in coalesced batches still place them in time. Default (epoch) when unknown.
  engine_clock::time_point at{};
};

// One KV pool's occupancy. used + free == total; cached <= free (free blocks whose content is
// still indexed by the prefix cache and can be revived until evicted).
struct pool_usage {
  int32_t num_total = 0;
  int32_t num_used = 0;
  int32_t num_free = 0;
  int32_t num_cached = 0;
};

struct sequence_blocks {
  seq_id seq;
  request_id request;
  int32_t num_blocks = 0;  // device blocks it holds
  int32_t num_tokens = 0;
  int32_t num_window_freed = 0;  // leading blocks freed because no layer's window reaches them
  // Filled by the engine (the scheduler does not know requests): what the dashboard marks a row with.
  bool constrained = false;               // structured output: its tokens are grammar-masked
  int32_t num_draft_tokens = 0;           // speculative decoding so far: drafts verified for it
  int32_t num_accepted_draft_tokens = 0;  // and of those, accepted
};

struct step_record {
  uint64_t step = 0;
  pool_usage device;
  pool_usage host;
  std::vector<sequence_blocks> running;  // per running sequence: its device block count
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  int32_t num_swapped = 0;
  // Waiting sequences by reason (index = waiting_reason).
  int32_t num_waiting_by_reason[5] = {0, 0, 0, 0, 0};
  int32_t num_batch_seqs = 0;
  int32_t num_prefill_tokens = 0;  // prompt / recompute tokens in the batch
  int32_t num_decode_tokens = 0;   // one per decoding sequence
  int32_t num_swap_in_blocks = 0;
  int32_t num_swap_out_blocks = 0;
  int32_t num_copy_blocks = 0;  // copy-on-write copies
  double schedule_seconds = 0;
  double execute_seconds = 0;
  double step_seconds = 0;       // whole step: plan + execute + sample + detokenize
  double predicted_seconds = 0;  // the step cost model's prediction of step_seconds when it was planned
  int32_t prefill_budget = 0;    // prefill tokens the step was allowed (scheduler_output::prefill_budget)
  double kv_waste = 0;           // allocated-but-unused slots / allocated slots, after the step
  std::vector<engine_event> events;
};

// One device block, for the block-level dashboard view.
struct block_info {
  block_id id = 0;
  int32_t ref_count = 0;
  int32_t num_filled = 0;  // tokens with computed K/V (max over the sequences sharing it)
  bool cached = false;     // indexed by the prefix cache (full, hashed)
  seq_id owner;            // first sequence holding it (valid when ref_count > 0)
  request_id owner_request;
};

}  // namespace tessera
