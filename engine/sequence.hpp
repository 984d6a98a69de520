// One sequence's scheduling state: the tokens it holds, how many of them have K/V in the cache, which
// queue it is in, why it is waiting, and a timestamped lifecycle timeline for observability.
//
// A request with sampling n > 1 becomes n sequences: the prompt is prefilled once by the first
// sequence, which is then forked (its KV blocks shared, copy-on-write) into the others.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/ids.hpp"
#include "engine/pooling.hpp"

namespace tessera {

using engine_clock = std::chrono::steady_clock;

enum class sequence_status : uint8_t { waiting, running, swapped, finished };

// Why a sequence that wants to run did not run this step (none: it ran, or it is not waiting).
enum class waiting_reason : uint8_t {
  none,
  token_budget,  // max_num_batched_tokens used up by more important sequences
  max_seqs,      // max_num_seqs sequences already running
  kv_full,       // not enough free KV blocks (beyond the watermark)
  swapped,       // its KV lives in the host pool, waiting to be swapped back in
};

enum class lifecycle_stage : uint8_t {
  queued,               // entered the waiting queue
  scheduled,            // got its first tokens scheduled (and again after each preemption)
  preempted_recompute,  // blocks freed; back to waiting, prompt + generated recomputed later
  swapped_out,          // blocks moved to the host swap pool
  swapped_in,           // blocks moved back to the device pool
  first_token,          // first generated token sampled
  finished,             // finished normally (stop / length)
  aborted,              // aborted by the caller or failed
};

std::string_view to_string(lifecycle_stage stage);
std::string_view to_string(waiting_reason reason);
std::string_view to_string(sequence_status status);

struct lifecycle_entry {
  lifecycle_stage stage = lifecycle_stage::queued;
  engine_clock::time_point at{};
  uint64_t step = 0;  // engine step counter when it happened
};

struct sequence {
  seq_id id;
  request_id request;
  int32_t choice_index = 0;  // which of the request's n samples
  int32_t priority = 0;      // lower value = more important (vLLM convention)
  uint64_t arrival = 0;      // FCFS order among equal priorities (forks inherit the parent's)

  std::vector<token_id> tokens;  // prompt followed by generated tokens
  int32_t num_prompt_tokens = 0;
  int32_t num_computed = 0;  // leading tokens whose K/V are in the cache
  // Speculative decoding: the proposer's guess of the tokens after `tokens`, set by the engine before
  // a step is planned. Not part of the sequence: the scheduler verifies (a prefix of) it with the next
  // decode, or drops it; only the tokens the target model accepts are appended to `tokens`.
  std::vector<token_id> draft;
  // A token tree's shape (engine/speculative/proposer.hpp, draft_proposal::parents): draft[i] follows
  // draft[draft_parents[i]] (-1: the last token). Empty: the draft is a chain.
  std::vector<int32_t> draft_parents;
  // Drafts drawn from distributions (draft_proposal::probs): the nodes at depth j were drawn from row j
  // (vocabulary-sized). Empty: point masses.
  std::vector<float> draft_probs;
  void clear_draft() {
    draft.clear();
    draft_parents.clear();
    draft_probs.clear();
  }
  // Keeps the first n draft tokens (parents come before children, so a tree's first n nodes are a tree;
  // a cut chain keeps its first n q rows: the rows past it are never read; a cut sampled tree keeps
  // the first draws of each position, as its leaves come in draw order).
  void cut_draft(size_t n) {
    draft.resize(std::min(draft.size(), n));
    if (!draft_parents.empty()) draft_parents.resize(draft.size());
  }
  // Embedding sequences (engine/pooling.hpp): prefill only, never sampled; the scheduler gives them
  // no cached prefix, since mean pooling needs every prompt token's hidden state computed.
  pooling_type pooling = pooling_type::none;
  // No token is ever sampled: embeddings, and generations with max_tokens 0 (prompt logprobs only). The
  // sequence ends in the step that computes its prompt's last token; it asks for no logits.
  bool prefill_only = false;
  // Prompt logprobs (engine/prompt_logprobs.hpp): -1 none; else the top tokens wanted per position.
  // prompt_logprobs_next is the first prompt position not scored yet: the rows before it are not asked
  // for again (a recompute), and while it is short of the prompt the scheduler gives the sequence no
  // cached prefix (a cached block holds K/V, not the logits of its positions).
  int32_t prompt_logprobs = -1;
  int32_t prompt_logprobs_next = 1;
  bool scores_prompt() const { return prompt_logprobs >= 0 && prompt_logprobs_next < num_prompt_tokens; }
  // The rows of a chunk of `num_new` tokens from num_computed that score prompt positions still
  // unscored: rows [first, first + count) of the chunk, row j scoring position num_computed + j + 1.
  struct scored_rows {
    int32_t first = 0;
    int32_t count = 0;
  };
  scored_rows prompt_rows(int32_t num_new) const;

  sequence_status status = sequence_status::waiting;
  waiting_reason waiting = waiting_reason::none;
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt_tokens = 0;  // prefix-cache hits at the last admission
  std::vector<lifecycle_entry> timeline;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_generated() const { return num_tokens() - num_prompt_tokens; }
  // Tokens that still need a forward pass before the next sample (1 while decoding).
  int32_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool is_finished() const { return status == sequence_status::finished; }

  void record(lifecycle_stage stage, uint64_t step, engine_clock::time_point at = engine_clock::now()) {
    timeline.push_back({stage, at, step});
  }
};

// Importance order used everywhere: priority first, then arrival, then choice index.
// Returns true when `a` should be served before `b` (and be preempted after it).
inline bool more_important(const sequence& a, const sequence& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.arrival != b.arrival) return a.arrival < b.arrival;
  return a.choice_index < b.choice_index;
}

}  // namespace tessera
