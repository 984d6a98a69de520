// The token layout of one executor step: a step_batch's sequences validated against the KV cache and
// the model, then flattened into the rows every executor computes with (one row per new token,
// sequence by sequence in batch order). Both executors start a step from it; what they build on top
// (the CPU's attention tasks, the CUDA executor's slot mapping, prefill reordering and device uploads)
// stays theirs. Like check_block_moves (engine/executor.hpp), it lives here so the rules a batch must
// follow are written once.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/executor.hpp"
#include "engine/model/model_config.hpp"

namespace tessera {

struct step_layout {
  // batch.seqs[i]'s new tokens are the rows [token_begin, token_begin + num_tokens).
  struct sequence_rows {
    int32_t token_begin = 0;
    int32_t num_tokens = 0;
  };

  // One entry per token row.
  std::vector<token_id> token_ids;
  std::vector<int32_t> positions;  // num_computed + i (in a token tree: + depth): its RoPE and window position
  std::vector<int32_t> slots;      // num_computed + i: the position whose KV slot it writes, the last it may read
  // In a token tree (sequence_slice::tree_parents), the row's index in its slice; -1 elsewhere.
  std::vector<int32_t> tree_row;
  std::vector<int32_t> token_seq;  // index into batch.seqs of the sequence that owns the row
  // One entry per batch.seqs[i].
  std::vector<sequence_rows> seqs;
  // The token row of each logits row returned to the host, in step_output row order.
  std::vector<int32_t> logit_tokens;
  // Only with samples_on_device: the sequences the executor samples itself (logits == last and a
  // sampling state) and their last token row, in batch order. They get no host logits row.
  std::vector<int32_t> device_sampled_seqs;
  std::vector<int32_t> device_sampled_tokens;
  // Sequences with a hidden_mode (embeddings), in batch order; their row of step_output::hidden is
  // their index here.
  std::vector<int32_t> pooled_seqs;
  // Scored prompt rows (sequence_slice::prompt_targets), in step_output::prompt_logprobs order: each
  // one's token row, the token it is scored against, and how many top tokens it wants.
  std::vector<int32_t> scored_tokens;
  std::vector<token_id> scored_targets;
  std::vector<int32_t> scored_top_k;
  // The longest context of the step: max over sequences (empty ones too) of num_computed + tokens.
  int32_t max_context = 0;
  // Per batch.seqs[i] with a token tree: ancestors[i][a * n + b] != 0 when row b of the slice is row
  // a's ancestor or a itself (n rows); empty for chains.
  std::vector<std::vector<uint8_t>> ancestors;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // Whether row `key` of slice `seq`'s tree is row `query`'s ancestor (or itself). pre: a tree slice.
  bool sees(int32_t seq, int32_t query, int32_t key) const {
    const std::vector<uint8_t>& a = ancestors[static_cast<size_t>(seq)];
    const auto n = static_cast<size_t>(seqs[static_cast<size_t>(seq)].num_tokens);
    return a[static_cast<size_t>(query) * n + static_cast<size_t>(key)] != 0;
  }
};

// Validates every slice of `batch` and lays it out in `layout` (its vectors are reused: a steady
// stream of steps allocates nothing). Throws invalid_request "<executor_name> executor: ..." when a
// slice has a negative or too large num_computed, a block table that does not cover its tokens, a
// used block id outside the device pool of `spec`, or a token id outside `config`'s vocabulary.
// It shapes `out` for the executor to fill: vocab_size, first_row and num_rows per sequence, logits
// sized for the host rows, (samples_on_device) one empty `sampled` entry per sequence, hidden_size,
// hidden_row and a zeroed `hidden` for the pooled sequences, and prompt_first / prompt_count with
// `prompt_logprobs` sized for the scored rows. Scored rows outside their slice, targets outside the
// vocabulary and a negative top-k are refused too.
// After a throw `layout` and `out` are unspecified; nothing else has been touched. Swaps and copies
// are check_block_moves' (each executor calls it where it applies them).
// A slice with tree_parents is refused unless `allow_trees` (its executor verifies_token_trees), or when
// its parents do not form a tree in order, or it also asks for hidden rows or prompt scores.
// `groups`: the executor's KV layer groups (nullptr: one group of every layer, window
// config.kv_window()); a slice must carry one table per group, each checked with its group's window.
void build_step_layout(const step_batch& batch, const kv_cache_spec& spec, const model_config& config,
                       bool samples_on_device, const char* executor_name, step_layout& layout, step_output& out,
                       bool allow_trees = false, const kv_layer_groups* groups = nullptr);

}  // namespace tessera
