// Iteration-level continuous batching (Orca, Yu et al., OSDI'22) with the vLLM v1 token-budget
// formulation: every sequence has `tokens` and `num_computed`, and each step gives every scheduled
// sequence some of its uncomputed tokens. A prompt, a chunk of a prompt (chunked prefill, Sarathi,
// Agrawal et al. 2023), a decode step and the recomputation of a preempted sequence are all the
// same thing: "compute tokens [num_computed, num_computed + n)". See scheduler.cpp for the plan.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/block_manager.hpp"
#include "engine/executor.hpp"
#include "engine/sequence.hpp"
#include "engine/step_cost_model.hpp"
#include "engine/step_record.hpp"

namespace tessera {

enum class preemption_mode : uint8_t {
  recompute,  // free the victim's blocks; prefill prompt + generated tokens again later
  swap,       // copy the victim's blocks to the host pool; copy them back later
  automatic,  // per event, the cheaper of the two by the cost model (scheduler.cpp)
};

std::string_view to_string(preemption_mode mode);

struct scheduler_options {
  block_manager_options blocks;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  preemption_mode preemption = preemption_mode::automatic;
  // Fraction of device blocks an admission must leave free, so that the sequences it joins can
  // still grow for a while without being preempted at once (vLLM's watermark).
  double watermark = 0.01;
  int32_t max_model_len = 0;  // 0: limited only by the cache size
  // Cost model inputs (automatic mode): a swap moves kv_block_bytes per block out and later in at
  // swap_bytes_per_second; a recompute prefills its tokens at prefill_tokens_per_second (updated
  // from measured steps by observe_prefill()).
  int64_t kv_block_bytes = 0;
  double swap_bytes_per_second = 8e9;
  double prefill_tokens_per_second = 2000;
  // Stall-free batching (scheduler.cpp, "The prefill share"). In a step where sequences decode, prompt
  // chunks get only the tokens the step cost model predicts to fit in target_step_seconds after the
  // decodes; 0: off, prefill fills what max_num_batched_tokens leaves (as in a step without decodes).
  double target_step_seconds = 0;
  // Minimum progress: a step with anything to prefill prefills at least this many tokens (or all
  // there is, within max_num_batched_tokens) whatever the model predicts, so TTFT stays bounded.
  int32_t min_prefill_tokens = 32;
  // vLLM's long_prefill_token_threshold: one sequence's prefill chunk takes at most this many tokens
  // a step, so several prompts share the prefill budget; 0: no cap.
  int32_t long_prefill_token_threshold = 0;
  step_cost_options cost;
};

struct scheduled_sequence {
  sequence* seq = nullptr;  // valid until the sequence is finished
  seq_id id;
  request_id request;
  int32_t num_new_tokens = 0;  // tokens [num_computed, num_computed + num_new_tokens) this step
  bool samples = false;        // the chunk ends at the last token: its logits produce a new token
  // Speculative decode: the last num_draft_tokens of the new tokens are seq->draft[0, num_draft_tokens)
  // (positions num_tokens() ...), and every new token's logits row comes back (logits_mode::all).
  int32_t num_draft_tokens = 0;
};

// The plan of one step. Applying it = running the executor on make_batch(plan), then commit(plan).
struct scheduler_output {
  uint64_t step = 0;
  std::vector<scheduled_sequence> scheduled;  // batch order: decodes first, then prefill chunks
  std::vector<block_copy> swap_in;
  std::vector<block_copy> swap_out;
  std::vector<block_copy> copies;
  std::vector<engine_event> events;
  int32_t num_prefill_tokens = 0;
  int32_t num_decode_tokens = 0;
  step_shape shape;              // what the plan computes: the step cost model's input
  double predicted_seconds = 0;  // the step cost model's prediction for it
  // Prefill tokens the step may take: with the target in force, those the cost model fits in it after
  // the decodes (at least min_prefill_tokens); otherwise what max_num_batched_tokens leaves.
  int32_t prefill_budget = 0;
  bool prefill_limited = false;  // the target held prefill tokens back that max_num_batched_tokens allowed
  // Sequences whose KV this step touches (scheduled, swapped in or out): the ones to fail if the
  // executor throws.
  std::vector<seq_id> touched;
  bool empty() const { return scheduled.empty() && swap_in.empty() && swap_out.empty() && copies.empty(); }
};

class scheduler {
 public:
  // Throws invalid_request on inconsistent options.
  explicit scheduler(const scheduler_options& options);

  // Longest sequence (prompt + generated) the engine may produce: max_model_len capped by the
  // whole device cache, so a sequence alone in the engine always fits; with an attention window
  // whose worst step fits the cache (scheduler.cpp), max_model_len alone.
  int32_t max_seq_len() const { return max_seq_len_; }

  // Queues a new sequence (status waiting). Throws invalid_request if its prompt is empty, longer
  // than max_model_len or larger than the whole KV cache (unless the window bounds what it holds):
  // it could never be scheduled.
  sequence& add(std::unique_ptr<sequence> seq);

  // Plans one step: allocates the blocks of every scheduled chunk, preempts when blocks run out,
  // and lists the swaps/copies the executor must apply first. Mutates queues and block tables.
  scheduler_output schedule();
  // The executor's input for a plan.
  step_batch make_batch(const scheduler_output& plan) const;
  // The executor ran the plan: the scheduled tokens now have K/V (full blocks become cacheable). Of a
  // speculative decode only its last real token counts as computed until accept_draft().
  void commit(const scheduler_output& plan);
  // Ends the verification of `seq`'s draft after its accepted tokens were appended: the first
  // `num_accepted` draft tokens join the computed ones (their K/V, computed this step, is theirs), the
  // blocks allocated only for rejected positions are returned at once, and the draft is dropped. The
  // K/V of rejected positions in a kept block is never read and is overwritten by later steps; such a
  // block is not full of computed tokens, so it never enters the prefix cache. No-op for a finished
  // sequence. With a token tree `num_accepted` counts only the accepted nodes whose K/V was written
  // at their own position (nodes 0, 1, ... of the first branch); tokens accepted from another branch
  // stay appended but uncomputed, and the next step computes them (their K/V lies at their nodes' slots).
  void accept_draft(seq_id seq, int32_t num_accepted);

  // A running sequence gets a sampled token (to be computed in a later step).
  void append_token(seq_id seq, token_id token);
  // Overlapped steps: the sampled token that replaces the placeholder appended (append_token) while
  // the device was still sampling it.
  void set_last_token(seq_id seq, token_id token);
  // New running sequence sharing every block of `parent` (which must be running), same tokens.
  sequence& fork(seq_id parent, seq_id child, int32_t choice_index);
  // Removes a sequence from every queue and frees its blocks; `stage` (finished or aborted) ends its
  // timeline. Returns it (nullptr if unknown).
  std::unique_ptr<sequence> finish(seq_id seq, lifecycle_stage stage);
  // The sequence's blocks leave the prefix cache (block_manager::forget_cached).
  void forget_cached(seq_id seq) { blocks_.forget_cached(seq); }

  // Feeds the cost model with a measured prefill rate (exponential moving average).
  void observe_prefill(int32_t num_tokens, double seconds);
  // Feeds the step cost model with the measured time of an executed plan (steps that swapped blocks
  // are left out: the copies are not in the model).
  void observe_step(const scheduler_output& plan, double seconds);
  const step_cost_model& cost_model() const { return cost_; }

  sequence* find(seq_id seq);
  const sequence* find(seq_id seq) const;
  const block_manager& blocks() const { return blocks_; }
  const scheduler_options& options() const { return options_; }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_swapped() const { return static_cast<int32_t>(swapped_.size()); }
  bool has_unfinished() const { return !seqs_.empty(); }
  const std::vector<sequence*>& running() const { return running_; }
  const std::vector<sequence*>& waiting() const { return waiting_; }
  const std::vector<sequence*>& swapped() const { return swapped_; }

  // Fills the pool, queue and batch parts of a step record (timings are the engine's).
  void fill_record(const scheduler_output& plan, step_record& record) const;
  // Per-block view with owner requests filled in: every device block (index = block id), then every
  // host (swap) block (index - num_device_blocks = host block id).
  std::vector<block_info> block_snapshot() const;
  // Block-manager invariants plus queue/block-table consistency; empty when all hold.
  std::string check_invariants() const;

 private:
  void insert_sorted(std::vector<sequence*>& queue, sequence* seq);
  void remove_from(std::vector<sequence*>& queue, sequence* seq);
  sequence* pick_victim(const sequence* for_seq) const;
  void preempt(sequence* victim, preemption_reason reason, scheduler_output& plan);
  void schedule_chunk(sequence* seq, int32_t num_new, scheduler_output& plan, int32_t& budget, int32_t num_draft = 0);
  // How many of seq->draft this decode can verify: the token budget and max_seq_len allow, and the
  // blocks for them are free beyond one per running sequence (a draft never preempts anybody); those
  // slots are allocated. 0: plain decode (the draft is dropped).
  int32_t allocate_draft(sequence* seq, int32_t budget, scheduler_output& plan);
  int32_t watermark_blocks() const;
  int32_t reusable_prefix_tokens(const sequence& seq) const;
  // The prefill chunk of a sequence with `remaining` tokens to prefill after `num_computed`, within the
  // token budget, the long-prefill cap and (when in force) the step-time target; 0: none this step.
  int32_t prefill_chunk(int32_t num_computed, int32_t remaining, int32_t budget, scheduler_output& plan) const;
  // After the decodes are planned: whether the target applies this step, and the prefill budget.
  void size_prefill_budget(int32_t budget, scheduler_output& plan);

  scheduler_options options_;
  block_manager blocks_;
  int32_t max_seq_len_ = 0;
  bool window_bounded_ = false;  // the attention window bounds a sequence's blocks below the cache size
  uint64_t step_ = 0;
  step_cost_model cost_;
  bool target_applies_ = false;  // this step: the target limits prefill (it has decodes)
  std::unordered_map<seq_id, std::unique_ptr<sequence>> seqs_;
  // Each queue is kept in importance order (more_important): running_ back = first victim.
  std::vector<sequence*> waiting_;
  std::vector<sequence*> running_;
  std::vector<sequence*> swapped_;
  std::unordered_set<seq_id> scheduled_now_;  // sequences with a chunk in the plan being built
  // Tokens of each sequence's chunk in a plan not committed yet (check_invariants: their slots are
  // allocated; an overlapped step's plan is in flight between two steps).
  std::unordered_map<seq_id, int32_t> uncommitted_;
};

}  // namespace tessera
