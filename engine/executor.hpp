// The executor interface: the one boundary between the engine core (scheduler, block manager,
// sampler) and the code that runs the model (cpu/, gpu/). The engine speaks only in token ids,
// positions and physical KV block ids; executors own the KV memory those ids point into.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/device_sampling.hpp"
#include "engine/ids.hpp"
#include "engine/model/kv_layer_groups.hpp"
#include "engine/model/model_config.hpp"
#include "engine/prompt_logprobs.hpp"

namespace tessera {

// Geometry of one KV block: K and V for `block_size` consecutive positions of every layer, or of one
// layer group's layers (executor::kv_groups()).
struct kv_cache_spec {
  int32_t block_size = 16;        // tokens per block
  int32_t num_device_blocks = 0;  // blocks in the compute pool
  int32_t num_host_blocks = 0;    // blocks in the host swap pool (0: no swap)
};

// One sequence's part of a step: `tokens` are new tokens at positions
// [num_computed, num_computed + tokens.size()); K/V of earlier positions are already in the blocks of
// `block_table` (one table per KV layer group: table(g)), which covers every position up to the end
// of `tokens`. With an attention window (the group's window w > 0: model_config::kv_window() for a
// single group, and an executor that reads_only_window()), the entries of blocks wholly before
// position num_computed - w + 1 may be no_block: those blocks were freed.
struct sequence_slice {
  seq_id seq;
  std::vector<token_id> tokens;
  int32_t num_computed = 0;
  std::vector<block_id> block_table;
  // With several KV layer groups (executor::kv_groups(), engine/model/kv_layer_groups.hpp): the tables
  // of groups 1, 2, ... in order, block_table being group 0's. Each covers the same positions, and a
  // group with a window may have no_block entries before its own window. Empty with one group.
  std::vector<std::vector<block_id>> group_tables;
  const std::vector<block_id>& table(int32_t group) const {
    return group == 0 ? block_table : group_tables[static_cast<size_t>(group - 1)];
  }
  // Which logits to return: none, the last token's (sampling), or every token's (prompt logprobs, tests).
  enum class logits_mode : uint8_t { none, last, all } logits = logits_mode::last;
  // With logits == last and an executor that samples_on_device(): sample there and return the token
  // in step_output::sampled instead of the logits row. Ignored by other executors.
  std::optional<device_sampling> sampling;
  // Embedding sequences (engine/pooling.hpp; only for an executor that pools_hidden_states()): which
  // rows of the final-normed hidden state to return in step_output::hidden: none, the sum over this
  // slice's rows (mean pooling: the engine adds the chunks up), or its last row (last pooling).
  enum class hidden_mode : uint8_t { none, sum, last } hidden = hidden_mode::none;
  // Prompt logprobs (engine/prompt_logprobs.hpp; only for an executor that scores_prompts()): rows
  // [prompt_first_row, prompt_first_row + prompt_targets.size()) of this slice are scored, row j against
  // prompt_targets[j - prompt_first_row] (the prompt token that follows it), with the prompt_top_k most
  // likely tokens, into step_output::prompt_logprobs. Independent of `logits`.
  int32_t prompt_first_row = 0;
  std::vector<token_id> prompt_targets;
  int32_t prompt_top_k = 0;
  // Token-tree verification (SpecInfer, Miao et al. 2024; only for an executor that
  // verifies_token_trees()): empty for the usual chain. Else one entry per token, the index in `tokens`
  // of its parent: -1 for the first token (its parent is the computed context), and j < i for token i.
  // Token i is at position num_computed + depth(i) (its RoPE angle, its window) but writes its K/V to
  // the slot of position num_computed + i, and attends to the context before num_computed and to its
  // ancestors in the tree (itself included), never to its siblings' branches.
  std::vector<int32_t> tree_parents;
  // Overlapped steps (executor::overlaps_steps()): -1, or the index in the previous submitted step's
  // `seqs` of this sequence, whose token the executor sampled there and kept on the device: the last of
  // `tokens` is then a placeholder for that token, which the engine learns only after this step was
  // submitted (docs/engine.md#overlapped-steps).
  int32_t last_token_from = -1;
};

struct block_copy {
  block_id src = 0;
  block_id dst = 0;
};

// Everything one executor step does, in order: swap-ins, swap-outs and copies (copy-on-write) are
// applied before the forward pass of `seqs`.
struct step_batch {
  std::vector<block_copy> swap_in;   // host block src -> device block dst
  std::vector<block_copy> swap_out;  // device block src -> host block dst
  std::vector<block_copy> copies;    // device block src -> device block dst
  std::vector<sequence_slice> seqs;
  // Constrained decoding: valid() when some seqs[i].sampling has allowed_tokens, whose words the
  // engine's grammar workers are still writing while the forward pass runs. An executor waits on it
  // after launching the forward pass and before it reads any mask (so the masks cost no step time).
  std::shared_future<void> masks_ready;
  // Overlapped steps with grammars (executor::takes_late_masks): the masks are filled only after
  // submit() returns, once the engine has the previous step's tokens (this step was planned before
  // them). The executor queues the forward pass and leaves the mask upload and the sampling to its
  // next submit() or wait(), which the engine calls only after masks_ready is ready.
  bool late_masks = false;
};

// Logits rows for the sequences that asked for them, in batch order: for seqs[i], rows
// [first_row[i], first_row[i] + num_rows[i]) of `logits` ([total_rows, vocab], row-major).
struct step_output {
  int32_t vocab_size = 0;
  std::vector<float> logits;
  std::vector<int32_t> first_row;
  std::vector<int32_t> num_rows;
  // Executors whose samples_on_device() is true: one entry per seqs[i], token >= 0 where the executor
  // sampled (then num_rows[i] == 0). Other executors leave it untouched.
  std::vector<sampled_token> sampled;
  // Pooled hidden states: for seqs[i] with a hidden_mode, row hidden_row[i] of `hidden`
  // ([rows, hidden_size], the final norm's output, before the LM head); -1 for the others.
  int32_t hidden_size = 0;
  std::vector<float> hidden;
  std::vector<int32_t> hidden_row;
  // Scored prompt rows: for seqs[i] with prompt_targets, entries [prompt_first[i], prompt_first[i] +
  // prompt_count[i]) of `prompt_logprobs`, one per target in order (prompt_count[i] 0 for the others).
  std::vector<prompt_logprob> prompt_logprobs;
  std::vector<int32_t> prompt_first;
  std::vector<int32_t> prompt_count;

  std::span<const float> row(int32_t r) const {
    return {logits.data() + static_cast<size_t>(r) * vocab_size, static_cast<size_t>(vocab_size)};
  }
  std::span<const float> hidden_of(size_t seq) const {
    if (seq >= hidden_row.size() || hidden_row[seq] < 0) return {};
    return {hidden.data() + static_cast<size_t>(hidden_row[seq]) * hidden_size, static_cast<size_t>(hidden_size)};
  }
  std::span<const prompt_logprob> prompt_logprobs_of(size_t seq) const {
    if (seq >= prompt_count.size() || prompt_count[seq] <= 0) return {};
    return {prompt_logprobs.data() + prompt_first[seq], static_cast<size_t>(prompt_count[seq])};
  }
};

// Throws invalid_request naming `executor_name` when a swap or copy of `batch` refers to a block outside
// the pools of `spec`. Executors call it before moving anything, so a rejected step leaves the cache as it was.
void check_block_moves(const step_batch& batch, const kv_cache_spec& spec, const char* executor_name);

class executor {
 public:
  virtual ~executor() = default;
  virtual const model_config& config() const = 0;
  virtual const kv_cache_spec& kv_spec() const = 0;
  // Bytes one KV block occupies (its layers' K and V: every layer, or one layer group's), for sizing
  // pools and reporting swap cost.
  virtual int64_t kv_block_bytes() const = 0;
  // The layer groups its KV blocks are cut by: every slice then carries one block table per group
  // (sequence_slice::table). One group of every layer unless the executor was built with groups.
  virtual kv_layer_groups kv_groups() const { return single_kv_group(config()); }
  // Runs one step. pre: block ids in range; every block written this step is owned by one sequence.
  virtual void execute(const step_batch& batch, step_output& out) = 0;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  // The KV cache's element type as the executor stores it ("fp32", "fp16", "bf16", "int8"; empty when
  // the executor does not say), reported by /v1/models, /metrics and the dashboard.
  virtual const char* kv_cache_dtype() const { return ""; }
  // Seconds a device executor's steps have occupied its device so far, each from its first queued
  // work to its last (so the time between steps, the host's planning and bookkeeping, is left out):
  // against the wall clock, the share an overlapped (submit, then wait) step loop could win back.
  // 0 for an executor that computes on the calling thread.
  virtual double device_step_seconds() const { return 0.0; }
  // Overlapped steps (vLLM's async scheduling; TensorRT-LLM's overlap scheduler): true when submit()
  // returns once the step is queued on the device and honours sequence_slice::last_token_from, so the
  // engine plans step n+1 while the device runs step n (docs/engine.md#overlapped-steps). Then
  // execute(b, out) is submit(b) followed by wait(out).
  virtual bool overlaps_steps() const { return false; }
  // With overlaps_steps(): true when submit() honours step_batch::late_masks, so steps with
  // grammar-constrained sequences overlap too (docs/engine.md#overlapped-steps).
  virtual bool takes_late_masks() const { return false; }
  // Queues one step (what execute() checks it checks here, before anything is queued). At most two
  // steps are submitted and not yet waited for.
  virtual void submit(const step_batch& batch);
  // The oldest submitted step's results, once the device has finished it.
  virtual void wait(step_output& out);
  // True when execute() honours sequence_slice::sampling (gpu/cuda_executor.cpp); the engine then
  // sends its sampler's state and records the tokens the executor returns.
  virtual bool samples_on_device() const { return false; }
  // True when execute() never reads nor writes a block-table entry that lies wholly before the window
  // of config().kv_window() (the CPU executor: its attention starts at the window's first key). The
  // engine then frees those blocks and hands such entries as no_block.
  virtual bool reads_only_window() const { return false; }
  // True when execute() honours sequence_slice::tree_parents (the CPU executor); the engine verifies
  // linear drafts only otherwise.
  virtual bool verifies_token_trees() const { return false; }
  // True when execute() honours sequence_slice::hidden (the CPU executor); the engine refuses
  // embedding requests otherwise.
  virtual bool pools_hidden_states() const { return false; }
  // True when execute() honours sequence_slice::prompt_targets (the CPU executor); the engine refuses
  // requests for prompt logprobs otherwise.
  virtual bool scores_prompts() const { return false; }
};

}  // namespace tessera
