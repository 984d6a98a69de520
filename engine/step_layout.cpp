#include "engine/step_layout.hpp"

#include <algorithm>
#include <limits>
#include <span>
#include <string>

#include "engine/base/error.hpp"

namespace tessera {

void build_step_layout(const step_batch& batch, const kv_cache_spec& spec, const model_config& config,
                       bool samples_on_device, const char* executor_name, step_layout& layout, step_output& out,
                       bool allow_trees, const kv_layer_groups* groups) {
  auto refuse = [&](const char* what) { throw invalid_request(std::string(executor_name) + " executor: " + what); };
  layout.token_ids.clear();
  layout.positions.clear();
  layout.slots.clear();
  layout.tree_row.clear();
  layout.token_seq.clear();
  layout.seqs.clear();
  layout.logit_tokens.clear();
  layout.device_sampled_seqs.clear();
  layout.device_sampled_tokens.clear();
  layout.pooled_seqs.clear();
  layout.scored_tokens.clear();
  layout.scored_targets.clear();
  layout.scored_top_k.clear();
  layout.max_context = 0;
  layout.ancestors.resize(batch.seqs.size());
  out.vocab_size = config.vocab_size;
  out.first_row.assign(batch.seqs.size(), 0);
  out.num_rows.assign(batch.seqs.size(), 0);
  out.hidden_size = config.hidden_size;
  out.hidden_row.assign(batch.seqs.size(), -1);
  out.prompt_first.assign(batch.seqs.size(), 0);
  out.prompt_count.assign(batch.seqs.size(), 0);

  const int32_t bs = spec.block_size;
  // Per KV layer group, the window of its layers (0: they may read every past position).
  const int32_t single_window = config.kv_window();
  const std::span<const int32_t> windows =
      groups ? std::span<const int32_t>(groups->windows) : std::span<const int32_t>(&single_window, 1);
  const auto num_groups = static_cast<int32_t>(windows.size());
  int32_t rows = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const sequence_slice& sl = batch.seqs[s];
    const int64_t n = static_cast<int64_t>(sl.tokens.size());
    const int64_t end = static_cast<int64_t>(sl.num_computed) + n;
    // Half of int32: positions, slot numbers (block * block_size + offset) and context lengths are
    // int32 in both executors' kernels, and end + block_size must not overflow either.
    if (sl.num_computed < 0 || end > std::numeric_limits<int32_t>::max() / 2) refuse("bad num_computed");
    if (static_cast<int32_t>(sl.group_tables.size()) != num_groups - 1)
      refuse("a slice needs one block table per KV layer group");
    // A token kept on the device from the previous step (overlapped steps) needs an executor that samples there.
    if (sl.last_token_from >= 0 && (!samples_on_device || n == 0)) refuse("last_token_from names no token it kept");
    for (int32_t g = 0; g < num_groups; ++g) {
      const std::vector<block_id>& table = sl.table(g);
      if (static_cast<int64_t>(table.size()) * bs < end) refuse("block table does not cover the sequence");
      // Only the blocks this step reads or writes: a table may carry blocks allocated ahead, and with a
      // window its leading entries that no query of this slice reaches may be no_block (freed).
      const int32_t window = windows[static_cast<size_t>(g)];
      const int64_t used_blocks = (end + bs - 1) / bs;
      const int64_t first_read = window > 0 ? std::max<int64_t>(0, int64_t{sl.num_computed} - window + 1) / bs : 0;
      for (int64_t b = 0; b < used_blocks; ++b) {
        const block_id id = table[static_cast<size_t>(b)];
        if (id == no_block && b < first_read) continue;  // freed, and no layer of the group reads it
        if (id < 0 || id >= spec.num_device_blocks) refuse("block id out of range");
      }
    }
    step_layout::sequence_rows sr;
    sr.token_begin = layout.num_tokens();
    sr.num_tokens = static_cast<int32_t>(n);
    const bool tree = !sl.tree_parents.empty();
    std::vector<uint8_t>& anc = layout.ancestors[s];
    anc.clear();
    if (tree) {
      if (!allow_trees) refuse("token trees are not supported");
      if (static_cast<int64_t>(sl.tree_parents.size()) != n || sl.tree_parents[0] != -1)
        refuse("tree_parents must have one entry per token, -1 first");
      if (sl.hidden != sequence_slice::hidden_mode::none || !sl.prompt_targets.empty())
        refuse("a token tree has no hidden rows or prompt scores");
      anc.assign(static_cast<size_t>(n * n), 0);
    }
    for (int64_t i = 0; i < n; ++i) {
      const token_id t = sl.tokens[static_cast<size_t>(i)];
      if (t < 0 || t >= config.vocab_size) refuse("token id out of range");
      layout.token_ids.push_back(t);
      if (tree) {
        const int32_t parent = sl.tree_parents[static_cast<size_t>(i)];
        if (i > 0 && (parent < 0 || parent >= i)) refuse("a tree parent must be an earlier token of the slice");
        // Row i sees what its parent sees, and itself; its depth is its number of ancestors.
        uint8_t* row = anc.data() + i * n;
        if (i > 0) std::copy_n(anc.data() + int64_t{parent} * n, n, row);
        row[i] = 1;
        const auto depth = static_cast<int32_t>(std::count(row, row + n, uint8_t{1})) - 1;
        layout.positions.push_back(static_cast<int32_t>(sl.num_computed + depth));
        layout.tree_row.push_back(static_cast<int32_t>(i));
      } else {
        layout.positions.push_back(static_cast<int32_t>(sl.num_computed + i));
        layout.tree_row.push_back(-1);
      }
      layout.slots.push_back(static_cast<int32_t>(sl.num_computed + i));
      layout.token_seq.push_back(static_cast<int32_t>(s));
    }
    layout.seqs.push_back(sr);
    layout.max_context = std::max(layout.max_context, static_cast<int32_t>(end));

    out.first_row[s] = rows;
    const int32_t last_token = sr.token_begin + sr.num_tokens - 1;
    if (n > 0 && sl.logits == sequence_slice::logits_mode::last && samples_on_device && sl.sampling) {
      layout.device_sampled_seqs.push_back(static_cast<int32_t>(s));  // no host row: its token comes back
      layout.device_sampled_tokens.push_back(last_token);
    } else if (n > 0 && sl.logits == sequence_slice::logits_mode::last) {
      layout.logit_tokens.push_back(last_token);
      out.num_rows[s] = 1;
    } else if (n > 0 && sl.logits == sequence_slice::logits_mode::all) {
      for (int32_t i = 0; i < sr.num_tokens; ++i) layout.logit_tokens.push_back(sr.token_begin + i);
      out.num_rows[s] = sr.num_tokens;
    }
    rows += out.num_rows[s];
    if (n > 0 && sl.hidden != sequence_slice::hidden_mode::none) {
      out.hidden_row[s] = static_cast<int32_t>(layout.pooled_seqs.size());
      layout.pooled_seqs.push_back(static_cast<int32_t>(s));
    }
    if (!sl.prompt_targets.empty()) {
      const int64_t num_scored = static_cast<int64_t>(sl.prompt_targets.size());
      if (sl.prompt_first_row < 0 || sl.prompt_first_row + num_scored > n)
        refuse("scored prompt rows outside the slice");
      if (sl.prompt_top_k < 0) refuse("negative prompt top-k");
      out.prompt_first[s] = static_cast<int32_t>(layout.scored_tokens.size());
      out.prompt_count[s] = static_cast<int32_t>(num_scored);
      for (int64_t j = 0; j < num_scored; ++j) {
        const token_id t = sl.prompt_targets[static_cast<size_t>(j)];
        if (t < 0 || t >= config.vocab_size) refuse("prompt target token id out of range");
        layout.scored_tokens.push_back(sr.token_begin + sl.prompt_first_row + static_cast<int32_t>(j));
        layout.scored_targets.push_back(t);
        layout.scored_top_k.push_back(sl.prompt_top_k);
      }
    }
  }
  out.logits.resize(layout.logit_tokens.size() * static_cast<size_t>(config.vocab_size));
  out.hidden.assign(layout.pooled_seqs.size() * static_cast<size_t>(config.hidden_size), 0.0f);
  out.prompt_logprobs.assign(layout.scored_tokens.size(), prompt_logprob{});
  if (samples_on_device) out.sampled.assign(batch.seqs.size(), sampled_token{});
}

}  // namespace tessera
