#include "engine/sequence.hpp"

#include <algorithm>

#include "engine/step_record.hpp"

namespace tessera {

std::string_view to_string(lifecycle_stage stage) {
  switch (stage) {
    case lifecycle_stage::queued: return "queued";
    case lifecycle_stage::scheduled: return "scheduled";
    case lifecycle_stage::preempted_recompute: return "preempted_recompute";
    case lifecycle_stage::swapped_out: return "swapped_out";
    case lifecycle_stage::swapped_in: return "swapped_in";
    case lifecycle_stage::first_token: return "first_token";
    case lifecycle_stage::finished: return "finished";
    case lifecycle_stage::aborted: return "aborted";
  }
  return "?";
}

std::string_view to_string(waiting_reason reason) {
  switch (reason) {
    case waiting_reason::none: return "none";
    case waiting_reason::token_budget: return "token_budget";
    case waiting_reason::max_seqs: return "max_seqs";
    case waiting_reason::kv_full: return "kv_full";
    case waiting_reason::swapped: return "swapped";
  }
  return "?";
}

std::string_view to_string(sequence_status status) {
  switch (status) {
    case sequence_status::waiting: return "waiting";
    case sequence_status::running: return "running";
    case sequence_status::swapped: return "swapped";
    case sequence_status::finished: return "finished";
  }
  return "?";
}

std::string_view to_string(event_kind kind) {
  switch (kind) {
    case event_kind::admitted: return "admitted";
    case event_kind::prefix_cache_hit: return "prefix_cache_hit";
    case event_kind::preempted_swap: return "preempted_swap";
    case event_kind::preempted_recompute: return "preempted_recompute";
    case event_kind::swapped_in: return "swapped_in";
    case event_kind::forked: return "forked";
    case event_kind::finished: return "finished";
    case event_kind::aborted: return "aborted";
    case event_kind::failed: return "failed";
    case event_kind::queued: return "queued";
    case event_kind::first_token: return "first_token";
  }
  return "?";
}

std::string_view to_string(preemption_reason reason) {
  switch (reason) {
    case preemption_reason::none: return "none";
    case preemption_reason::kv_full: return "kv_full";
    case preemption_reason::priority: return "priority";
  }
  return "?";
}

sequence::scored_rows sequence::prompt_rows(int32_t num_new) const {
  if (!scores_prompt()) return {};
  // Row p predicts token p + 1: the unscored positions [next, num_prompt) are rows [next - 1, num_prompt - 1).
  const int32_t begin = std::max(num_computed, prompt_logprobs_next - 1);
  const int32_t end = std::min(num_computed + num_new, num_prompt_tokens - 1);
  if (end <= begin) return {};
  return {begin - num_computed, end - begin};
}

}  // namespace tessera
