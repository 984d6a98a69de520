// The engine step loop: requests in, incremental outputs out, one executor call per step.
//
//   llm_engine engine(executor, tokenizer, options);
//   request_id id = engine.add_request(prompt_ids, params);     // throws invalid_request
//   while (engine.has_unfinished())
//     for (const request_output& out : engine.step()) stream(out);
//
// step() = plan (scheduler::schedule) -> execute (executor::execute) -> apply (scheduler::commit)
// -> sample every sequence whose chunk reached its last token (detokenize, stop checks) -> emit
// (outputs and the step record): the phases of vLLM's schedule() / update_from_output().
// Single-threaded: call from one thread (the actor/server layers serialize access).
#pragma once
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/executor.hpp"
#include "engine/pooling.hpp"
#include "engine/prompt_logprobs.hpp"
#include "engine/sampler.hpp"
#include "engine/sampling_params.hpp"
#include "engine/scheduler.hpp"
#include "engine/sequence.hpp"
#include "engine/speculative/speculative_options.hpp"
#include "engine/step_cost_model.hpp"
#include "engine/step_record.hpp"
#include "engine/stop_checker.hpp"
#include "engine/structured_output.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera {

struct engine_options {
  int32_t block_size = 16;       // must equal the executor's kv_spec().block_size
  int32_t num_kv_blocks = 0;     // 0: all of the executor's device blocks (at most that many)
  int32_t num_host_blocks = -1;  // -1: all of the executor's host blocks (at most that many)
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;  // per step; long prompts are prefilled in chunks
  // Stall-free batching (scheduler_options): the step time that prompt chunks must keep a step with
  // decodes within, by the step cost model fitted from this engine's measured steps; 0: off.
  double target_step_seconds = 0;
  int32_t min_prefill_tokens = 32;           // prefill progress of every step, whatever the target
  int32_t long_prefill_token_threshold = 0;  // one sequence's prefill chunk at most; 0: no cap
  preemption_mode preemption = preemption_mode::automatic;
  double watermark = 0.01;
  bool enable_prefix_caching = true;
  // Sliding-window models whose every layer has a window (model_config::kv_window), on an executor
  // that never reads outside it (executor::reads_only_window): free each sequence's KV blocks once no
  // layer's window reaches them. Off: keep them (the same outputs, more memory); for comparisons.
  bool free_window_blocks = true;
  int32_t max_model_len = 0;  // 0: the model's context_length
  sampling_limits limits;
  // Constrained decoding (engine/structured/): compiles specs and fills the masks off the engine
  // thread. Null: requests with sampling_params::structured are refused.
  std::shared_ptr<constraint_backend> constraints;
  // Speculative decoding (docs/speculative.md): off by default.
  speculative_options speculative;
  // Overlapped steps (docs/engine.md#overlapped-steps; vLLM's async scheduling): with an executor that
  // overlaps_steps(), plan and queue step n+1 while the device runs step n. No effect otherwise, nor
  // with speculative decoding.
  bool overlap_steps = true;
};

struct token_logprob {
  token_id token = 0;
  float logprob = 0;
  std::vector<std::pair<token_id, float>> top;  // params.logprobs most likely tokens
};

// What one choice of one request produced in one step (only choices with news are reported).
struct request_output {
  request_id id;
  int32_t index = 0;                    // choice index, 0..n-1
  std::vector<token_id> token_ids;      // new tokens this step
  std::string text;                     // new text (valid UTF-8; possible stop-string prefixes held back)
  std::vector<token_logprob> logprobs;  // one per new token when params.logprobs >= 0
  bool finished = false;
  finish_reason reason = finish_reason::none;
  std::string error;  // reason == error: what failed
  // Usage so far.
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache
  int32_t num_generated_tokens = 0;
  // Speculative decoding so far: draft tokens verified for this choice and how many the target accepted
  // (of num_generated_tokens, num_accepted_draft_tokens came from drafts).
  int32_t num_draft_tokens = 0;
  int32_t num_accepted_draft_tokens = 0;
  std::vector<lifecycle_entry> timeline;  // on the final output: the choice's lifecycle
  // An embedding request's final output: the pooled, L2-normalised vector (engine/pooling.hpp).
  std::vector<float> embedding;
  // params.prompt_logprobs >= 0: on each choice's first output (the one with its first token, or the
  // final one with max_tokens 0), every prompt position's logprob, the first one without (rank 0).
  std::vector<prompt_logprob> prompt_logprobs;
};

struct engine_stats {
  uint64_t num_steps = 0;
  uint64_t num_requests = 0;
  uint64_t num_generated_tokens = 0;
  uint64_t num_prefill_tokens = 0;  // computed prompt / recompute tokens
  uint64_t num_cached_prompt_tokens = 0;
  uint64_t num_preemptions_swap = 0;
  uint64_t num_preemptions_recompute = 0;
  uint64_t num_blocks_swapped_in = 0;   // host -> device block copies
  uint64_t num_blocks_swapped_out = 0;  // device -> host block copies
  uint64_t num_failed_steps = 0;
  uint64_t num_overlapped_steps = 0;     // planned and queued while the previous step ran (overlapped steps)
  uint64_t num_window_freed_blocks = 0;  // KV blocks freed because no layer's window reached them
  double kv_waste = 0;                   // now: allocated-but-unused slots / allocated slots
  uint64_t num_token_masks = 0;          // grammar masks computed (one per constrained sequence and step)
  // Time the step waited for grammar masks after the executor returned: ~0 while the masks are
  // computed within the forward pass, as designed.
  double mask_wait_seconds = 0;
  // Speculative decoding: draft tokens verified, of which accepted, and verifications (one per
  // sequence and step that verified a draft). Acceptance rate = accepted / draft tokens; tokens per
  // verification = (accepted + verifications) / verifications.
  uint64_t num_draft_tokens = 0;
  uint64_t num_accepted_draft_tokens = 0;
  // Token trees: accepted draft tokens from a branch other than the first (their K/V is computed again
  // by the next step, since it was written at their nodes' slots).
  uint64_t num_tree_branch_tokens = 0;
  uint64_t num_spec_verifications = 0;
  // Stall-free batching (docs/engine.md#the-prefill-share): the last executed step's prefill budget
  // (prefill tokens it was allowed) and the step cost model's prediction for it against its measured
  // time; the model's recent mean relative error (out of sample) and its coefficients.
  int32_t prefill_budget_tokens = 0;
  double predicted_step_seconds = 0;
  double measured_step_seconds = 0;
  double step_time_prediction_error = 0;
  uint64_t num_steps_prefill_limited = 0;  // steps in which the target held prefill tokens back
  double target_step_seconds = 0;          // the configured target (0: off)
  step_cost_coefficients step_cost;
  // A draft model's own KV pool (speculative mode draft; 0 otherwise): its blocks, and those in use now.
  int32_t num_draft_kv_blocks = 0;
  int32_t num_draft_kv_blocks_used = 0;
};

class llm_engine {
 public:
  // `tok` may be null: outputs then carry token ids only (no text, no EOS detection).
  // Throws invalid_request when the options do not fit the executor.
  llm_engine(executor& exec, std::shared_ptr<const tokenizer> tok, const engine_options& options = {});

  // Validates (params.validate, token ids, prompt length vs max_model_len and the cache) and
  // queues the request. Throws invalid_request with a message naming the problem.
  // params.structured: `grammar` is its compiled form (the actor runtime compiles off this thread);
  // null: compiled here, blocking, with options.constraints.
  request_id add_request(std::vector<token_id> prompt, const sampling_params& params, int32_t priority = 0,
                         std::shared_ptr<const compiled_constraint> grammar = nullptr);
  // An embedding request (/v1/embeddings): the prompt is prefilled, chunk by chunk and batched with
  // everything else, its hidden states pooled by `pooling` (mean or last), and nothing is sampled; its
  // one output is final (reason stop) with `embedding` set, and its KV blocks are freed then. Throws
  // invalid_request for pooling none, an executor that does not pool_hidden_states(), and the
  // prompts add_request refuses.
  request_id add_embedding_request(std::vector<token_id> prompt, pooling_type pooling, int32_t priority = 0);
  ~llm_engine();
  // Aborts a request in any state; its final outputs (reason abort) come with the next step().
  // Unknown or finished ids are ignored.
  void abort(request_id id);

  // Runs one step and returns the incremental outputs. If the executor throws, every request in
  // the step is failed (reason error) and the engine stays usable.
  std::vector<request_output> step();
  // True while a request is unfinished or a step is still on the device (overlapped steps: the step
  // that follows takes its results).
  bool has_unfinished() const { return !requests_.empty() || in_flight_.has_value(); }
  // Whether steps overlap (engine_options::overlap_steps with an executor that can).
  bool overlaps_steps() const { return overlap_; }

  const step_record& last_record() const { return record_; }
  engine_stats stats() const;
  std::vector<block_info> block_snapshot() const { return sched_.block_snapshot(); }
  const scheduler& get_scheduler() const { return sched_; }
  // The speculative proposer (null when off): its own pool (a draft model's KV blocks) for leak checks.
  const draft_proposer* proposer() const { return proposer_.get(); }
  int32_t max_seq_len() const { return sched_.max_seq_len(); }

 private:
  struct choice_state {
    int32_t index = 0;
    seq_id seq;
    sampler samp;
    stop_checker stops;
    std::optional<incremental_detokenizer> detok;
    std::unique_ptr<token_constraint> constraint;  // structured output; null: unconstrained
    bool finished = false;
    int32_t num_generated = 0;
    int32_t num_draft_tokens = 0;
    int32_t num_accepted_draft_tokens = 0;
    // Overlapped steps: the sequence's last token is a placeholder for the one the device is sampling.
    bool pending_token = false;
    choice_state(int32_t i, seq_id s, const sampling_params& p, std::span<const token_id> prompt,
                 std::span<const token_id> eos, const std::shared_ptr<const tokenizer>& tok)
        : index(i), seq(s), samp(p, static_cast<uint64_t>(i), prompt, eos), stops(p, eos) {
      if (tok) detok.emplace(tok, p.skip_special_tokens);
    }
  };
  struct request_state {
    request_id id;
    sampling_params params;
    std::vector<token_id> prompt;
    int32_t num_cached_prompt_tokens = 0;
    std::shared_ptr<const compiled_constraint> grammar;
    bool forked = false;
    std::vector<std::unique_ptr<choice_state>> choices;
    std::optional<embedding_pool> pool;                     // embedding requests only
    std::optional<prompt_logprob_collector> prompt_scores;  // params.prompt_logprobs >= 0 only
    bool prompt_scores_sent = false;
  };

  // Which choice of which request a sequence is (the n > 1 fork makes one sequence per choice).
  struct choice_ref {
    request_id request;
    int32_t index = 0;
    auto operator<=>(const choice_ref&) const = default;
  };
  using output_index = std::map<choice_ref, size_t>;  // where a choice's output of this step is

  // One step's outputs and events as they accumulate, phase by phase.
  struct step_context {
    engine_clock::time_point start;
    std::vector<request_output> outs;
    output_index index;
    std::vector<engine_event> events;  // between-step events first
    std::vector<bool> asked_device;    // per scheduled sequence: sampling sent to the executor
    std::vector<int32_t> mask_row;     // per scheduled sequence: its row of masks_, -1: unconstrained
    int32_t mask_buffer = 0;           // which of masks_ holds the rows
    // The masks are filled after the previous step's results (late_masks_ is their promise).
    bool late_masks = false;
    std::vector<int32_t> accepted;  // per scheduled sequence: draft tokens the target accepted
    bool failed = false;            // the executor threw: nothing of the plan is committed
    step_record record;             // the step's timings so far (emit() publishes it)
  };

  // Overlapped steps (docs/engine.md#overlapped-steps): a step submitted to the executor whose results
  // have not been taken. `committed`: its plan was committed before its results came (so that the next
  // step could be planned), and its device-sampled sequences hold placeholder tokens.
  struct in_flight_step {
    scheduler_output plan;
    step_context ctx;
    engine_clock::time_point submitted;
    bool committed = false;
  };

  // The phases of step(), in order.
  step_context begin_step();
  scheduler_output plan(step_context& ctx);
  void execute(scheduler_output& plan, step_context& ctx);
  // Overlapped steps: step() as the two halves that interleave with the neighbouring steps' halves.
  std::vector<request_output> overlapped_step();
  bool submit(scheduler_output& plan, step_context& ctx, const in_flight_step* previous);
  std::vector<request_output> finish(in_flight_step& step);
  bool runs_ahead(const in_flight_step& step) const;
  void commit_ahead(in_flight_step& step);
  bool may_continue(const request_state& r, const choice_state& c) const;
  void start_execute(const scheduler_output& plan, step_batch& batch, step_context& ctx, bool late_masks);
  void execute_failed(const scheduler_output& plan, const std::exception& e, step_context& ctx);
  void pool_hidden(const scheduler_output& plan);
  void collect_prompt_logprobs(const scheduler_output& plan);
  void apply(scheduler_output& plan, const step_context& ctx);
  void account(const scheduler_output& plan, const step_context& ctx);
  void take_results(scheduler_output& plan, step_context& ctx, bool committed);
  void sample(scheduler_output& plan, step_context& ctx);
  std::vector<request_output> emit(scheduler_output& plan, step_context& ctx);

  // Helpers of the phases.
  void ask_device_sampling(const scheduler_output& plan, step_batch& batch, step_context& ctx);
  void start_masks(const scheduler_output& plan, step_context& ctx, bool late);
  void fill_late_masks(const scheduler_output& plan, const step_context& ctx);
  token_constraint* live_constraint(seq_id s);
  void wait_masks();
  std::span<const uint32_t> mask_of(const step_context& ctx, size_t i) const;
  void fail_touched_requests(const scheduler_output& plan, const std::string& message, step_context& ctx);
  void sample_sequence(size_t i, scheduler_output& plan, step_context& ctx);
  void finish_embedding(size_t i, scheduler_output& plan, step_context& ctx);
  void finish_scoring(size_t i, scheduler_output& plan, step_context& ctx);
  bool attach_prompt_logprobs(request_state& r, std::span<choice_state* const> choices, step_context& ctx);
  void check_prompt_ids(const std::vector<token_id>& prompt) const;
  request_id enqueue(std::vector<token_id> prompt, const sampling_params& params, int32_t priority,
                     std::shared_ptr<const compiled_constraint> grammar, pooling_type pooling);
  void verify_sequence(size_t i, scheduler_output& plan, step_context& ctx);
  void propose_drafts();
  void release_preempted_drafts(const scheduler_output& plan);
  void roll_back_drafts();
  bool speculates(const request_state& r) const;
  std::vector<choice_state*> fork_choices(request_state& r, seq_id parent, scheduler_output& plan);
  const choice_ref* owner_of(seq_id s) const;
  void annotate_running(step_record& record) const;

  request_output& output_for(std::vector<request_output>& outs, output_index& index, const request_state& r,
                             const choice_state& c);
  void accept_token(request_state& r, choice_state& c, const sample_result& s, request_output& out);
  void finish_choice(request_state& r, choice_state& c, finish_reason reason, request_output& out,
                     lifecycle_stage stage, event_kind kind);
  void fail_request(request_state& r, const std::string& message, std::vector<request_output>& outs,
                    output_index& index);
  void drop_if_done(request_id id);

  executor& exec_;
  std::shared_ptr<const tokenizer> tok_;
  std::vector<token_id> eos_ids_;
  engine_options options_;
  scheduler sched_;
  std::unique_ptr<draft_proposer> proposer_;  // null: speculative decoding off
  std::vector<seq_id> proposed_;              // sequences proposed for this step: rolled back after it
  std::unordered_map<request_id, request_state> requests_;
  std::unordered_map<seq_id, choice_ref> seq_owner_;
  std::vector<request_output> pending_;       // abort outputs waiting for the next step()
  std::vector<engine_event> pending_events_;  // queued / aborted between steps, then the step's own
  request_id next_request_{1};
  seq_id next_seq_{1};
  uint64_t arrival_ = 0;
  step_record record_;
  bool overlap_ = false;                     // overlapped steps (engine_options::overlap_steps)
  std::optional<in_flight_step> in_flight_;  // overlapped steps: the step on the device
  engine_clock::time_point last_emit_{};     // overlapped steps: when the previous step's outputs went out
  uint64_t sampling_step_ = 0;               // the step whose tokens sample() is accepting
  engine_stats stats_;
  step_output logits_;  // reused across steps
  // The grammar masks, one row per constrained sampling sequence, and the workers' progress: nothing
  // that a worker reads (constraints, masks_) may change until masks_pending_ is ready. Two buffers,
  // used by alternate steps: with overlapped steps the executor packs step n's masks while the engine
  // lays out step n+1's.
  std::vector<uint32_t> masks_[2];
  int32_t mask_buffer_ = 0;
  int32_t mask_words_ = 0;
  std::shared_future<void> masks_pending_;
  std::promise<void> late_masks_;  // the in-flight step's late masks (step_batch::late_masks)
};

}  // namespace tessera
