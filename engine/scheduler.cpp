// The scheduler: what runs in the next step. Read this file top to bottom.
//
// State. Every sequence is in exactly one queue:
//   waiting  — not yet admitted, or preempted by recompute (no KV blocks)
//   running  — holds device KV blocks; gets tokens scheduled every step it fits the budgets
//   swapped  — preempted by swap: its KV lives in the host pool
// Each queue is sorted by importance: request priority (lower = more important), then arrival
// (FCFS), then choice index. The back of `running` is the first preemption victim.
//
// A step is PLANNED here and APPLIED by the engine: the plan (scheduler_output) lists the chunks
// to compute and the swap/copy lists; the engine runs the executor on it and then calls commit().
// Block allocation happens while planning, but nothing enters the prefix cache until commit(), so a
// failed executor call never leaves unwritten blocks indexed as if they held K/V.
//
// The plan of one step (schedule()):
//   0. Priority preemption. If the most important waiting sequence has a strictly better priority
//      value than the least important running one and does not fit, preempt running sequences of
//      worse priority (least important first) until it fits — reason `priority`.
//   1. Running sequences, decodes first (one token each, plus their drafts), then the rest (partial
//      prefills and recomputations) in chunks of the prefill share (below). When a sequence needs a
//      block and none is free, the least important running sequence that has nothing scheduled
//      yet is preempted (reason `kv_full`); if that is the sequence itself, it preempts itself.
//   2. Swapped sequences come back (swap-in) before any new admission — but never in a step that
//      preempted: memory is tight then, and the executor applies swap-ins before swap-outs, so a
//      device block freed by a swap-out must not receive a swap-in in the same step.
//   3. Waiting sequences are admitted in order while max_num_seqs, the token budget and the KV
//      watermark allow, reusing their longest cached prefix. Admission stops at the first one that
//      does not fit (strict FCFS/priority order, no overtaking), and only when no sequence is
//      swapped out and nothing was preempted for lack of blocks this step.
//
// The prefill share (stall-free batching, Sarathi-Serve, Agrawal et al. OSDI'24; vLLM's chunked
// prefill). max_num_batched_tokens is the hard cap of a step. Decodes are planned first and always get
// their token (and drafts) within it. Then prompt chunks (step 1's partial prefills, step 2's
// swapped-in prefills, step 3's admissions, in that order) share what is left, and with
// target_step_seconds > 0, in a step that has decodes, only as many prefill tokens as the step cost
// model (step_cost_model.hpp, fitted from the engine's measured steps) predicts to keep the step
// within the target: every decoding stream then gets its next token about every target seconds,
// instead of waiting behind thousands of prompt tokens. Each chunk is sized with its own attention
// work (a chunk deep into a long prompt costs more than one at its start). Minimum progress: the
// step's prefill chunks total at least min_prefill_tokens (or all that waits, within the hard cap)
// even when the prediction says the decodes alone exceed the target, so a prompt's TTFT stays
// bounded: ceil(prompt / min_prefill_tokens) steps at worst once it is first in line. A step without
// decodes stalls nobody: it prefills up to the hard cap. long_prefill_token_threshold > 0 caps one
// sequence's chunk, so that several prompts progress in the same step.
//
// Sliding-window attention (options.blocks.attention_window > 0, see block_manager.hpp): after each
// commit a sequence's leading blocks that no later query reads are freed, so what it HOLDS is bounded
// by the window, not by its length. Everything that counts blocks counts held blocks: allocation needs
// (a prefix hit takes only the blocks of its window), the watermark check of an admission, the
// priority preemption's reclaimable blocks, a swap's size and cost (only held blocks move), and the
// step record. A recompute-preempted sequence frees everything and re-prefills from position 0 (its
// K/V at any position depends on the whole prefix through the layers). When the worst step of a lone
// sequence fits the cache, sequences may be longer than the cache (max_seq_len).
//
// Preemption cost model (mode automatic), per event:
//   swap      = 2 * blocks * kv_block_bytes / swap_bytes_per_second   (out now, in later)
//   recompute = num_computed / prefill_tokens_per_second              (prefill them again)
// The cheaper one is chosen; a swap that does not fit in the host pool falls back to recompute.
#include "engine/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "engine/base/error.hpp"

namespace tessera {

std::string_view to_string(preemption_mode mode) {
  switch (mode) {
    case preemption_mode::recompute: return "recompute";
    case preemption_mode::swap: return "swap";
    case preemption_mode::automatic: return "auto";
  }
  return "?";
}

scheduler::scheduler(const scheduler_options& options)
    : options_(options), blocks_(options.blocks), cost_(options.cost) {
  if (options.max_num_seqs <= 0) throw invalid_request("max_num_seqs must be positive");
  if (!(options.target_step_seconds >= 0) || !std::isfinite(options.target_step_seconds))
    throw invalid_request("the target step time must not be negative");
  if (options.min_prefill_tokens <= 0) throw invalid_request("min_prefill_tokens must be positive");
  if (options.long_prefill_token_threshold < 0)
    throw invalid_request("long_prefill_token_threshold must not be negative");
  if (options.max_num_batched_tokens <= 0) throw invalid_request("max_num_batched_tokens must be positive");
  if (!(options.watermark >= 0.0 && options.watermark < 1.0)) throw invalid_request("watermark must be in [0, 1)");
  if (options.max_model_len < 0) throw invalid_request("max_model_len must not be negative");
  // Every group's table covers every position: a sequence of n tokens holds up to blocks_for(n) blocks per group.
  const int64_t capacity = int64_t{blocks_.num_device_blocks()} / blocks_.num_groups() * blocks_.block_size();
  max_seq_len_ = static_cast<int32_t>(std::min<int64_t>(capacity, std::numeric_limits<int32_t>::max()));
  if (options.max_model_len > 0) max_seq_len_ = std::min(max_seq_len_, options.max_model_len);
  // With a window, a lone sequence computing a chunk of k <= max_num_batched_tokens tokens after n
  // holds the blocks of positions [n - w + 1, n + k): at most ceil((w + k - 2) / block_size) + 1
  // whatever n is. When that fits the whole cache, preempting everything else always lets it go on,
  // so its length is bounded by max_model_len only (a prompt may be longer than the cache).
  const int32_t window = blocks_.attention_window();
  if (window > 0 && options.max_model_len > 0) {
    const int64_t span = int64_t{window} + options.max_num_batched_tokens - 2;
    const int64_t worst = ((span + blocks_.block_size() - 1) / blocks_.block_size() + 1) * blocks_.num_groups();
    if (worst <= blocks_.num_device_blocks()) {
      max_seq_len_ = options.max_model_len;
      window_bounded_ = true;
    }
  }
}

int32_t scheduler::watermark_blocks() const {
  return static_cast<int32_t>(options_.watermark * blocks_.num_device_blocks());
}

sequence* scheduler::find(seq_id seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}

const sequence* scheduler::find(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void scheduler::insert_sorted(std::vector<sequence*>& queue, sequence* seq) {
  auto pos = std::upper_bound(queue.begin(), queue.end(), seq,
                              [](const sequence* a, const sequence* b) { return more_important(*a, *b); });
  queue.insert(pos, seq);
}

void scheduler::remove_from(std::vector<sequence*>& queue, sequence* seq) {
  auto it = std::find(queue.begin(), queue.end(), seq);
  if (it != queue.end()) queue.erase(it);
}

// ---- entering and leaving ------------------------------------------------------------------------

sequence& scheduler::add(std::unique_ptr<sequence> seq) {
  if (!seq) throw std::logic_error("scheduler::add: null sequence");
  const int32_t len = seq->num_tokens();
  if (len == 0) throw invalid_request("the prompt is empty");
  if (options_.max_model_len > 0 && len > options_.max_model_len)
    throw invalid_request("the prompt has " + std::to_string(len) + " tokens, more than max_model_len (" +
                          std::to_string(options_.max_model_len) + ")");
  if (!window_bounded_ && int64_t{blocks_.blocks_for(len)} * blocks_.num_groups() > blocks_.num_device_blocks())
    throw invalid_request("the prompt has " + std::to_string(len) + " tokens, more than the whole KV cache holds (" +
                          std::to_string(blocks_.num_device_blocks()) + " blocks of " +
                          std::to_string(blocks_.block_size()) + ")");
  if (seqs_.count(seq->id) != 0) throw std::logic_error("scheduler::add: duplicate sequence id");
  sequence* s = seq.get();
  s->status = sequence_status::waiting;
  s->num_computed = 0;
  s->record(lifecycle_stage::queued, step_);
  seqs_.emplace(s->id, std::move(seq));
  insert_sorted(waiting_, s);
  return *s;
}

std::unique_ptr<sequence> scheduler::finish(seq_id id, lifecycle_stage stage) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return nullptr;
  std::unique_ptr<sequence> seq = std::move(it->second);
  seqs_.erase(it);
  uncommitted_.erase(id);
  remove_from(waiting_, seq.get());
  remove_from(running_, seq.get());
  remove_from(swapped_, seq.get());
  blocks_.free(id);
  seq->status = sequence_status::finished;
  seq->waiting = waiting_reason::none;
  seq->record(stage, step_);
  return seq;
}

sequence& scheduler::fork(seq_id parent_id, seq_id child_id, int32_t choice_index) {
  sequence* parent = find(parent_id);
  if (!parent || parent->status != sequence_status::running)
    throw std::logic_error("scheduler::fork: parent is not running");
  if (seqs_.count(child_id) != 0) throw std::logic_error("scheduler::fork: duplicate sequence id");
  auto child = std::make_unique<sequence>(*parent);
  child->id = child_id;
  child->choice_index = choice_index;
  blocks_.fork(parent_id, child_id);
  sequence* c = child.get();
  seqs_.emplace(child_id, std::move(child));
  insert_sorted(running_, c);
  return *c;
}

void scheduler::append_token(seq_id id, token_id token) {
  sequence* seq = find(id);
  if (!seq) throw std::logic_error("scheduler::append_token: unknown sequence");
  seq->tokens.push_back(token);
}

void scheduler::set_last_token(seq_id id, token_id token) {
  sequence* seq = find(id);
  if (!seq || seq->tokens.empty()) throw std::logic_error("scheduler::set_last_token: unknown or empty sequence");
  seq->tokens.back() = token;
}

void scheduler::observe_prefill(int32_t num_tokens, double seconds) {
  if (num_tokens < 64 || seconds <= 0) return;  // too small a sample to say anything
  const double rate = num_tokens / seconds;
  options_.prefill_tokens_per_second = 0.8 * options_.prefill_tokens_per_second + 0.2 * rate;
}

void scheduler::observe_step(const scheduler_output& plan, double seconds) {
  if (!plan.swap_in.empty() || !plan.swap_out.empty()) return;
  cost_.observe(plan.shape, seconds);
}

// ---- preemption ----------------------------------------------------------------------------------

// The least important running sequence with nothing scheduled yet this step (possibly `for_seq`).
sequence* scheduler::pick_victim(const sequence* for_seq) const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (*it == for_seq || scheduled_now_.count((*it)->id) == 0) return *it;
  return nullptr;
}

void scheduler::preempt(sequence* victim, preemption_reason reason, scheduler_output& plan) {
  remove_from(running_, victim);
  uncommitted_.erase(victim->id);
  victim->clear_draft();
  ++victim->num_preemptions;
  const int32_t num_blocks = blocks_.num_blocks(victim->id);
  const int64_t bytes = int64_t{num_blocks} * options_.kv_block_bytes;
  const double swap_seconds = 2.0 * static_cast<double>(bytes) / options_.swap_bytes_per_second;
  const double recompute_seconds = victim->num_computed / options_.prefill_tokens_per_second;

  bool swap = options_.preemption == preemption_mode::swap ||
              (options_.preemption == preemption_mode::automatic && swap_seconds < recompute_seconds);
  if (swap) {
    const size_t first = plan.swap_out.size();
    swap = blocks_.swap_out(victim->id, plan.swap_out);  // false: host pool full -> recompute
    if (swap) {
      victim->status = sequence_status::swapped;
      victim->waiting = waiting_reason::swapped;
      victim->record(lifecycle_stage::swapped_out, step_);
      insert_sorted(swapped_, victim);
      plan.touched.push_back(victim->id);
      engine_event e{event_kind::preempted_swap, victim->request, victim->id};
      e.num_blocks = static_cast<int32_t>(plan.swap_out.size() - first);
      e.reason = reason;
      e.swap_bytes = bytes;
      e.estimated_seconds = swap_seconds;
      plan.events.push_back(e);
      return;
    }
  }
  engine_event e{event_kind::preempted_recompute, victim->request, victim->id};
  e.num_blocks = num_blocks;
  e.reason = reason;
  e.recompute_tokens = victim->num_computed;
  e.estimated_seconds = recompute_seconds;
  plan.events.push_back(e);
  blocks_.free(victim->id);
  victim->num_computed = 0;
  victim->status = sequence_status::waiting;
  victim->waiting = waiting_reason::kv_full;
  victim->record(lifecycle_stage::preempted_recompute, step_);
  // Its arrival is older than any later request's, so among equal priorities it goes to the front.
  insert_sorted(waiting_, victim);
}

// ---- planning ------------------------------------------------------------------------------------

void scheduler::schedule_chunk(sequence* seq, int32_t num_new, scheduler_output& plan, int32_t& budget,
                               int32_t num_draft) {
  const int32_t num_real = num_new - num_draft;  // tokens of seq->tokens; the drafts follow them
  const bool samples = seq->num_computed + num_real == seq->num_tokens();
  plan.scheduled.push_back({seq, seq->id, seq->request, num_new, samples, num_draft});
  uncommitted_[seq->id] = num_new;
  plan.touched.push_back(seq->id);
  scheduled_now_.insert(seq->id);
  budget -= num_new;
  seq->waiting = waiting_reason::none;
  if (num_real == 1 && samples && seq->num_generated() > 0) {
    plan.num_decode_tokens += num_new;
    plan.shape.decode_tokens += num_new;
  } else {
    plan.num_prefill_tokens += num_new;
    plan.shape.prefill_tokens += num_new;
  }
  plan.shape.attention_positions += chunk_attention_positions(seq->num_computed, num_new, blocks_.attention_window());
}

void scheduler::size_prefill_budget(int32_t budget, scheduler_output& plan) {
  target_applies_ = options_.target_step_seconds > 0 && plan.num_decode_tokens > 0;
  plan.prefill_budget = std::max(0, budget);
  if (!target_applies_) return;
  // What the decodes leave of the target, at the model's cost per prefill token (their attention
  // aside: prefill_chunk() counts each chunk's own).
  const double left = options_.target_step_seconds - cost_.predict(plan.shape);
  const double per_token = cost_.coefficients().prefill_token;
  const double fit = left > 0 ? std::floor(left / per_token * (1 + 1e-9)) : 0.0;  // 1e-9: rounding
  const int32_t share = static_cast<int32_t>(std::min<double>(fit, std::numeric_limits<int32_t>::max()));
  plan.prefill_budget = std::min(plan.prefill_budget, std::max(share, options_.min_prefill_tokens));
}

int32_t scheduler::prefill_chunk(int32_t num_computed, int32_t remaining, int32_t budget,
                                 scheduler_output& plan) const {
  const int32_t allowed = std::max(0, std::min(remaining, budget));  // what the hard cap allows
  int32_t n = allowed;
  if (options_.long_prefill_token_threshold > 0) n = std::min(n, options_.long_prefill_token_threshold);
  if (!target_applies_ || n <= 0) return n;
  // Minimum progress: the step's prefill chunks together reach min_prefill_tokens.
  const int32_t floor = std::clamp(options_.min_prefill_tokens - plan.num_prefill_tokens, 0, n);
  const int32_t capped = n;
  n = std::min(n, std::max(floor, plan.prefill_budget - plan.num_prefill_tokens));
  const int32_t window = blocks_.attention_window();
  const auto fits = [&](int32_t k) {
    step_shape s = plan.shape;
    s += {0, k, chunk_attention_positions(num_computed, k, window)};
    return cost_.predict(s) <= options_.target_step_seconds * (1 + 1e-9);
  };
  if (n > floor && !fits(n)) {
    // The prediction grows with the chunk (every coefficient >= 0): the largest chunk that fits.
    int32_t lo = floor, hi = n;  // fits(hi) is false; lo is granted anyway
    while (hi - lo > 1) {
      const int32_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    n = lo;
  }
  if (n < capped) plan.prefill_limited = true;
  return n;
}

int32_t scheduler::allocate_draft(sequence* seq, int32_t budget, scheduler_output& plan) {
  // The last real token and the drafts fit the budget; the bonus token after them fits max_seq_len.
  const int32_t d =
      std::min({static_cast<int32_t>(seq->draft.size()), budget - 1, max_seq_len_ - seq->num_tokens() - 1});
  if (d <= 0) {
    seq->clear_draft();
    return 0;
  }
  // Every running sequence not planned yet may need one new block for its own decode: those stay free.
  const int32_t reserve = num_running() - static_cast<int32_t>(scheduled_now_.size());
  // The block manager sizes the allocation from the token span: the drafts ride on the tokens for it.
  seq->tokens.insert(seq->tokens.end(), seq->draft.begin(), seq->draft.begin() + d);
  const bool ok = blocks_.allocate_slots(seq->id, seq->tokens, seq->num_computed, 1 + d, reserve, plan.copies);
  seq->tokens.resize(seq->tokens.size() - static_cast<size_t>(d));
  if (!ok) {
    seq->clear_draft();
    return 0;
  }
  seq->cut_draft(static_cast<size_t>(d));
  return d;
}

// The prefix an admission may take from the cache. None for an embedding: its pooled vector needs the
// hidden state of every prompt token, which a cached block does not keep (only its K/V). Its own
// full blocks still enter the cache at commit, for generations that share the prompt.
int32_t scheduler::reusable_prefix_tokens(const sequence& seq) const {
  // Likewise a sequence whose prompt logprobs are still being scored: they come from the logits of every
  // prompt position, which the cache does not keep either.
  return seq.pooling != pooling_type::none || seq.scores_prompt() ? 0 : blocks_.cached_prefix_tokens(seq.tokens);
}

scheduler_output scheduler::schedule() {
  scheduler_output plan;
  plan.step = ++step_;
  scheduled_now_.clear();
  int32_t budget = options_.max_num_batched_tokens;
  const int32_t watermark = watermark_blocks();
  bool kv_preempted = false;  // a running sequence had to make room this step
  bool swapped_out = false;   // anything went to the host pool this step (blocks swap-ins)
  bool priority_preempted = false;

  // 0. Priority preemption for the most important waiting sequence.
  if (!waiting_.empty() && !running_.empty() && swapped_.empty() &&
      waiting_.front()->priority < running_.back()->priority) {
    sequence* head = waiting_.front();
    const int32_t cached = reusable_prefix_tokens(*head);
    const int32_t chunk = std::min(head->num_tokens() - cached, budget);
    const int32_t need = blocks_.blocks_needed(head->id, head->tokens, cached, chunk) + watermark;
    int32_t reclaimable = blocks_.num_free_blocks();
    for (const sequence* r : running_)
      if (r->priority > head->priority) reclaimable += blocks_.num_blocks(r->id);
    if (need > blocks_.num_free_blocks() && need <= reclaimable) {
      while (blocks_.num_free_blocks() < need && !running_.empty() && running_.back()->priority > head->priority) {
        const size_t swaps_before = plan.swap_out.size();
        preempt(running_.back(), preemption_reason::priority, plan);
        swapped_out = swapped_out || plan.swap_out.size() != swaps_before;
        priority_preempted = true;
      }
    }
  }

  // 1. Running sequences: decodes first, then partial prefills / recomputations.
  target_applies_ = false;
  for (const bool decode_pass : {true, false}) {
    if (!decode_pass) size_prefill_budget(budget, plan);
    const std::vector<sequence*> order = running_;  // preemption edits running_ as we go
    for (sequence* seq : order) {
      if (seq->status != sequence_status::running || scheduled_now_.count(seq->id) != 0) continue;
      if ((seq->num_uncomputed() == 1) != decode_pass) continue;
      if (decode_pass && !seq->draft.empty()) {
        if (const int32_t d = allocate_draft(seq, budget, plan); d > 0) {
          schedule_chunk(seq, 1 + d, plan, budget, d);
          continue;
        }
      }
      const int32_t num_new = decode_pass ? std::min(seq->num_uncomputed(), budget)
                                          : prefill_chunk(seq->num_computed, seq->num_uncomputed(), budget, plan);
      if (num_new <= 0) {
        seq->waiting = waiting_reason::token_budget;
        continue;
      }
      while (true) {
        if (blocks_.allocate_slots(seq->id, seq->tokens, seq->num_computed, num_new, 0, plan.copies)) {
          schedule_chunk(seq, num_new, plan, budget);
          break;
        }
        sequence* victim = pick_victim(seq);
        const size_t swaps_before = plan.swap_out.size();
        preempt(victim, preemption_reason::kv_full, plan);
        swapped_out = swapped_out || plan.swap_out.size() != swaps_before;
        kv_preempted = true;
        if (victim == seq) break;
      }
    }
  }

  // 2. Swapped sequences come back first (oldest/most important first, no overtaking).
  waiting_reason blocked = waiting_reason::none;
  if (!swapped_out && !kv_preempted) {
    while (!swapped_.empty()) {
      sequence* seq = swapped_.front();
      if (num_running() >= options_.max_num_seqs) {
        blocked = waiting_reason::max_seqs;
        break;
      }
      if (budget <= 0) {
        blocked = waiting_reason::token_budget;
        break;
      }
      const int32_t num_new =
          seq->num_uncomputed() == 1 ? 1 : prefill_chunk(seq->num_computed, seq->num_uncomputed(), budget, plan);
      if (num_new <= 0) {
        blocked = waiting_reason::token_budget;
        break;
      }
      // Blocks beyond the restored table (its freed window entries stay freed, nothing to restore).
      const int32_t extra =
          std::max(0, blocks_.blocks_for(seq->num_computed + num_new) - blocks_.num_logical_blocks(seq->id)) *
          blocks_.num_groups();
      const int32_t reserve = (running_.empty() ? 0 : watermark) + extra;
      const size_t first = plan.swap_in.size();
      if (!blocks_.swap_in(seq->id, reserve, plan.swap_in)) {
        blocked = waiting_reason::kv_full;
        break;
      }
      if (!blocks_.allocate_slots(seq->id, seq->tokens, seq->num_computed, num_new, 0, plan.copies))
        throw std::logic_error("scheduler: reserved blocks vanished after swap-in");
      swapped_.erase(swapped_.begin());
      seq->status = sequence_status::running;
      seq->record(lifecycle_stage::swapped_in, step_);
      insert_sorted(running_, seq);
      engine_event e{event_kind::swapped_in, seq->request, seq->id};
      e.num_blocks = static_cast<int32_t>(plan.swap_in.size() - first);
      e.swap_bytes = int64_t{e.num_blocks} * options_.kv_block_bytes;
      plan.events.push_back(e);
      schedule_chunk(seq, num_new, plan, budget);
    }
  } else {
    blocked = waiting_reason::swapped;
  }
  for (sequence* seq : swapped_) seq->waiting = blocked == waiting_reason::none ? waiting_reason::swapped : blocked;

  // 3. Admissions.
  if (!swapped_.empty() && !priority_preempted) blocked = waiting_reason::swapped;
  if (kv_preempted) blocked = waiting_reason::kv_full;
  if (blocked == waiting_reason::none || priority_preempted) {
    blocked = waiting_reason::none;
    while (!waiting_.empty()) {
      sequence* seq = waiting_.front();
      if (num_running() >= options_.max_num_seqs) {
        blocked = waiting_reason::max_seqs;
        break;
      }
      if (budget <= 0) {
        blocked = waiting_reason::token_budget;
        break;
      }
      const int32_t cached = reusable_prefix_tokens(*seq);
      const int32_t num_new = prefill_chunk(cached, seq->num_tokens() - cached, budget, plan);
      if (num_new <= 0) {
        blocked = waiting_reason::token_budget;
        break;
      }
      // With nothing running there is nobody to protect, and the watermark must not keep a
      // sequence that fits the cache waiting forever.
      const int32_t reserve = running_.empty() ? 0 : watermark;
      if (!blocks_.allocate_slots(seq->id, seq->tokens, cached, num_new, reserve, plan.copies)) {
        blocked = waiting_reason::kv_full;
        break;
      }
      waiting_.erase(waiting_.begin());
      seq->num_computed = cached;
      seq->num_cached_prompt_tokens = cached;
      seq->status = sequence_status::running;
      seq->record(lifecycle_stage::scheduled, step_);
      insert_sorted(running_, seq);
      plan.events.push_back({event_kind::admitted, seq->request, seq->id});
      if (cached > 0) {
        engine_event e{event_kind::prefix_cache_hit, seq->request, seq->id};
        e.num_blocks = cached / blocks_.block_size();
        plan.events.push_back(e);
      }
      schedule_chunk(seq, num_new, plan, budget);
    }
  }
  for (sequence* seq : waiting_) seq->waiting = blocked;
  plan.predicted_seconds = cost_.predict(plan.shape);
  return plan;
}

step_batch scheduler::make_batch(const scheduler_output& plan) const {
  step_batch batch;
  batch.swap_in = plan.swap_in;
  batch.swap_out = plan.swap_out;
  batch.copies = plan.copies;
  batch.seqs.reserve(plan.scheduled.size());
  for (const scheduled_sequence& s : plan.scheduled) {
    sequence_slice slice;
    slice.seq = s.seq->id;
    auto first = s.seq->tokens.begin() + s.seq->num_computed;
    slice.tokens.assign(first, first + (s.num_new_tokens - s.num_draft_tokens));
    slice.tokens.insert(slice.tokens.end(), s.seq->draft.begin(), s.seq->draft.begin() + s.num_draft_tokens);
    if (s.num_draft_tokens > 0 && !s.seq->draft_parents.empty()) {
      // A token tree: the real tokens are a chain, the draft's roots follow the last of them.
      const int32_t real = s.num_new_tokens - s.num_draft_tokens;
      slice.tree_parents.resize(slice.tokens.size());
      for (int32_t i = 0; i < real; ++i) slice.tree_parents[static_cast<size_t>(i)] = i - 1;
      for (int32_t j = 0; j < s.num_draft_tokens; ++j) {
        const int32_t parent = s.seq->draft_parents[static_cast<size_t>(j)];
        slice.tree_parents[static_cast<size_t>(real + j)] = parent < 0 ? real - 1 : real + parent;
      }
    }
    slice.num_computed = s.seq->num_computed;
    blocks_.tables_into(s.seq->id, slice);
    // A draft is verified from the rows of every one of its positions (engine/speculative/verifier.hpp).
    slice.logits = s.num_draft_tokens > 0 ? sequence_slice::logits_mode::all
                   : s.samples            ? sequence_slice::logits_mode::last
                                          : sequence_slice::logits_mode::none;
    if (s.seq->prefill_only) slice.logits = sequence_slice::logits_mode::none;  // nothing is sampled
    if (s.seq->pooling != pooling_type::none) {
      // An embedding: no logits, its hidden rows instead (every chunk's sum, or the prompt's last row).
      slice.hidden = s.seq->pooling == pooling_type::mean ? sequence_slice::hidden_mode::sum
                     : s.samples                          ? sequence_slice::hidden_mode::last
                                                          : sequence_slice::hidden_mode::none;
    }
    if (const sequence::scored_rows rows = s.seq->prompt_rows(s.num_new_tokens - s.num_draft_tokens); rows.count > 0) {
      // Prompt logprobs: each row is scored against the prompt token after it.
      slice.prompt_first_row = rows.first;
      slice.prompt_top_k = s.seq->prompt_logprobs;
      const auto target = s.seq->tokens.begin() + s.seq->num_computed + rows.first + 1;
      slice.prompt_targets.assign(target, target + rows.count);
    }
    batch.seqs.push_back(std::move(slice));
  }
  return batch;
}

void scheduler::commit(const scheduler_output& plan) {
  for (const scheduled_sequence& s : plan.scheduled) {
    uncommitted_.erase(s.id);
    if (seqs_.count(s.id) == 0) continue;                          // finished meanwhile
    s.seq->num_computed += s.num_new_tokens - s.num_draft_tokens;  // drafts: accept_draft()
    blocks_.commit_computed(s.seq->id, s.seq->tokens, s.seq->num_computed);
  }
}

void scheduler::accept_draft(seq_id id, int32_t num_accepted) {
  sequence* seq = find(id);
  if (!seq || seq->status != sequence_status::running) return;
  seq->clear_draft();
  if (num_accepted < 0 || seq->num_computed + num_accepted >= seq->num_tokens())
    throw std::logic_error("scheduler::accept_draft: accepted tokens were not appended");
  seq->num_computed += num_accepted;
  blocks_.commit_computed(seq->id, seq->tokens, seq->num_computed);
  blocks_.truncate(seq->id, seq->num_computed);
}

// ---- observability -------------------------------------------------------------------------------

void scheduler::fill_record(const scheduler_output& plan, step_record& r) const {
  r.step = plan.step;
  r.device = blocks_.device_usage();
  r.host = blocks_.host_usage();
  r.num_waiting = num_waiting();
  r.num_running = num_running();
  r.num_swapped = num_swapped();
  std::fill(std::begin(r.num_waiting_by_reason), std::end(r.num_waiting_by_reason), 0);
  for (const sequence* s : waiting_) ++r.num_waiting_by_reason[static_cast<size_t>(s->waiting)];
  for (const sequence* s : swapped_) ++r.num_waiting_by_reason[static_cast<size_t>(s->waiting)];
  r.running.clear();
  r.running.reserve(running_.size());
  for (const sequence* s : running_)
    r.running.push_back(
        {s->id, s->request, blocks_.num_blocks(s->id), s->num_tokens(), blocks_.num_freed_blocks(s->id)});
  r.num_batch_seqs = static_cast<int32_t>(plan.scheduled.size());
  r.num_prefill_tokens = plan.num_prefill_tokens;
  r.num_decode_tokens = plan.num_decode_tokens;
  r.num_swap_in_blocks = static_cast<int32_t>(plan.swap_in.size());
  r.num_swap_out_blocks = static_cast<int32_t>(plan.swap_out.size());
  r.num_copy_blocks = static_cast<int32_t>(plan.copies.size());
  r.kv_waste = blocks_.slots().waste();
}

std::vector<block_info> scheduler::block_snapshot() const {
  std::vector<block_info> out = blocks_.snapshot();
  const std::vector<block_info> host = blocks_.host_snapshot();
  out.insert(out.end(), host.begin(), host.end());
  for (block_info& b : out)
    if (b.ref_count > 0)
      if (const sequence* s = find(b.owner)) b.owner_request = s->request;
  return out;
}

std::string scheduler::check_invariants() const {
  std::string bm = blocks_.check_invariants();
  if (!bm.empty()) return bm;
  size_t queued = 0;
  auto check_queue = [&](const std::vector<sequence*>& q, sequence_status status, const char* name) -> std::string {
    for (size_t i = 0; i < q.size(); ++i) {
      const sequence* s = q[i];
      if (s->status != status)
        return std::string("sequence in ") + name + " queue has status " + std::string(to_string(s->status));
      if (i > 0 && more_important(*s, *q[i - 1])) return std::string(name) + " queue out of order";
      // Table length (freed window entries included); which of them are freed is the block manager's check.
      // (A plan not committed yet, an overlapped step's, holds the slots of its tokens too.)
      const int32_t nb = blocks_.num_logical_blocks(s->id);
      const auto planned = uncommitted_.find(s->id);
      const int32_t held = s->num_computed + (planned == uncommitted_.end() ? 0 : planned->second);
      if (status == sequence_status::running && nb != blocks_.blocks_for(held))
        return "running sequence " + std::to_string(s->id.value()) + " has " + std::to_string(nb) + " blocks for " +
               std::to_string(s->num_computed) + " computed tokens";
      if (status == sequence_status::running &&
          blocks_.num_freed_blocks(s->id) != blocks_.window_freed_blocks(s->num_computed))
        return "running sequence " + std::to_string(s->id.value()) + " freed " +
               std::to_string(blocks_.num_freed_blocks(s->id)) + " window blocks at " +
               std::to_string(s->num_computed) + " computed tokens";
      if (status == sequence_status::waiting && (blocks_.has(s->id) || s->num_computed != 0))
        return "waiting sequence " + std::to_string(s->id.value()) + " holds KV";
      if (status == sequence_status::swapped && !blocks_.is_swapped(s->id))
        return "swapped sequence " + std::to_string(s->id.value()) + " is not in the host pool";
    }
    queued += q.size();
    return {};
  };
  for (auto [q, st, name] : {std::tuple{&waiting_, sequence_status::waiting, "waiting"},
                             std::tuple{&running_, sequence_status::running, "running"},
                             std::tuple{&swapped_, sequence_status::swapped, "swapped"}}) {
    std::string e = check_queue(*q, st, name);
    if (!e.empty()) return e;
  }
  if (queued != seqs_.size()) return "a sequence is in no queue or in two";
  return {};
}

}  // namespace tessera
