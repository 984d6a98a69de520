#include "engine/llm_engine.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <stdexcept>
#include <unordered_map>

#include "engine/base/error.hpp"
#include "engine/speculative/verifier.hpp"

namespace tessera {

namespace {

double seconds_since(engine_clock::time_point t0) {
  return std::chrono::duration<double>(engine_clock::now() - t0).count();
}

scheduler_options make_scheduler_options(const executor& exec, const engine_options& o) {
  const kv_cache_spec& spec = exec.kv_spec();
  if (o.block_size != spec.block_size)
    throw invalid_request("engine block_size " + std::to_string(o.block_size) +
                          " differs from the executor's KV block size " + std::to_string(spec.block_size));
  if (o.num_kv_blocks < 0 || o.num_kv_blocks > spec.num_device_blocks)
    throw invalid_request("num_kv_blocks " + std::to_string(o.num_kv_blocks) + " exceeds the executor's " +
                          std::to_string(spec.num_device_blocks) + " device blocks");
  if (o.num_host_blocks > spec.num_host_blocks)
    throw invalid_request("num_host_blocks " + std::to_string(o.num_host_blocks) + " exceeds the executor's " +
                          std::to_string(spec.num_host_blocks) + " host blocks");
  scheduler_options s;
  s.blocks.block_size = o.block_size;
  s.blocks.num_device_blocks = o.num_kv_blocks == 0 ? spec.num_device_blocks : o.num_kv_blocks;
  s.blocks.num_host_blocks = o.num_host_blocks < 0 ? spec.num_host_blocks : o.num_host_blocks;
  s.blocks.enable_prefix_caching = o.enable_prefix_caching;
  // Freed blocks' table entries become no_block: only an executor that skips keys outside the window
  // without touching their entries may get such tables.
  // One table per KV layer group of the executor's blocks, each freed by its own window (a single
  // group's window is config().kv_window()).
  s.blocks.group_windows = exec.kv_groups().windows;
  if (!o.free_window_blocks || !exec.reads_only_window())
    std::fill(s.blocks.group_windows.begin(), s.blocks.group_windows.end(), 0);
  s.max_num_seqs = o.max_num_seqs;
  s.max_num_batched_tokens = o.max_num_batched_tokens;
  s.target_step_seconds = o.target_step_seconds;
  s.min_prefill_tokens = o.min_prefill_tokens;
  s.long_prefill_token_threshold = o.long_prefill_token_threshold;
  s.preemption = o.preemption;
  s.watermark = o.watermark;
  const int32_t context = exec.config().context_length;
  s.max_model_len = o.max_model_len > 0 ? o.max_model_len : context;
  if (context > 0 && s.max_model_len > context)
    throw invalid_request("max_model_len " + std::to_string(o.max_model_len) + " exceeds the model's context length " +
                          std::to_string(context));
  s.kv_block_bytes = exec.kv_block_bytes();
  return s;
}

}  // namespace

llm_engine::llm_engine(executor& exec, std::shared_ptr<const tokenizer> tok, const engine_options& options)
    : exec_(exec), tok_(std::move(tok)), options_(options), sched_(make_scheduler_options(exec, options)) {
  if (tok_) {
    auto eog = tok_->eog_tokens();
    eos_ids_.assign(eog.begin(), eog.end());
  }
  mask_words_ = token_mask_words(exec_.config().vocab_size);
  options_.speculative.validate();  // throws invalid_request
  proposer_ = options_.speculative.make_proposer(exec_.config().vocab_size);
  overlap_ = options_.overlap_steps && exec_.overlaps_steps() && !proposer_;
}

llm_engine::~llm_engine() {
  if (in_flight_) {
    try {
      exec_.wait(logits_);             // the executor may go away after the engine: nothing of it stays queued
    } catch (const std::exception&) {  // its requests are gone with the engine
    }
  }
  wait_masks();
}

request_id llm_engine::add_request(std::vector<token_id> prompt, const sampling_params& params, int32_t priority,
                                   std::shared_ptr<const compiled_constraint> grammar) {
  const int32_t vocab = exec_.config().vocab_size;
  params.validate(vocab, options_.limits);
  if (params.structured && !grammar) {
    if (!options_.constraints) {
      throw invalid_request("'" + params.structured->field + "': structured output is not available in this build");
    }
    grammar = options_.constraints->compile(*params.structured);  // throws invalid_request
  }
  if (params.prompt_logprobs >= 0 && !exec_.scores_prompts()) {
    throw invalid_request(std::string("prompt logprobs (echo with logprobs, or prompt_logprobs) are not available "
                                      "with the ") +
                              exec_.name() + " executor; serve the model with --device cpu",
                          "prompt_logprobs");
  }
  check_prompt_ids(prompt);
  const int64_t limit = sched_.options().max_model_len, num_prompt = static_cast<int64_t>(prompt.size());
  if (!params.truncate_to_context && limit > 0 && num_prompt <= limit && num_prompt + params.max_tokens > limit) {
    // vLLM's wording, so that clients which parse it (to retry with a smaller max_tokens) keep working.
    throw invalid_request("This model's maximum context length is " + std::to_string(limit) +
                              " tokens. However, you requested " + std::to_string(num_prompt + params.max_tokens) +
                              " tokens (" + std::to_string(num_prompt) + " in the prompt, " +
                              std::to_string(params.max_tokens) +
                              " in the completion). Please reduce the length of the prompt or max_tokens.",
                          "max_tokens");
  }
  return enqueue(std::move(prompt), params, priority, std::move(grammar), pooling_type::none);
}

request_id llm_engine::add_embedding_request(std::vector<token_id> prompt, pooling_type pooling, int32_t priority) {
  if (pooling == pooling_type::none) throw invalid_request("an embedding request needs a pooling type (mean or last)");
  if (!exec_.pools_hidden_states()) {
    throw invalid_request(std::string("embeddings are not available with the ") + exec_.name() +
                          " executor (it does not return hidden states); serve the model with --device cpu");
  }
  check_prompt_ids(prompt);
  sampling_params params;  // unused: nothing is sampled
  params.max_tokens = 1;
  return enqueue(std::move(prompt), params, priority, nullptr, pooling);
}

void llm_engine::check_prompt_ids(const std::vector<token_id>& prompt) const {
  const int32_t vocab = exec_.config().vocab_size;
  for (token_id t : prompt)
    if (t < 0 || t >= vocab)
      throw invalid_request("prompt token id " + std::to_string(t) + " is outside the vocabulary (" +
                            std::to_string(vocab) + " tokens)");
}

request_id llm_engine::enqueue(std::vector<token_id> prompt, const sampling_params& params, int32_t priority,
                               std::shared_ptr<const compiled_constraint> grammar, pooling_type pooling) {
  const request_id id = next_request_;
  next_request_ = next_request_.next();
  const seq_id first = next_seq_;
  auto seq = std::make_unique<sequence>();
  seq->pooling = pooling;
  seq->prefill_only = pooling != pooling_type::none || params.max_tokens == 0;
  if (pooling == pooling_type::none) seq->prompt_logprobs = params.prompt_logprobs;
  seq->id = first;
  seq->request = id;
  seq->choice_index = 0;
  seq->priority = priority;
  seq->arrival = arrival_;
  seq->tokens = prompt;
  seq->num_prompt_tokens = static_cast<int32_t>(prompt.size());
  sched_.add(std::move(seq));  // throws invalid_request for empty / too long prompts
  next_seq_ = next_seq_.next();
  ++arrival_;

  request_state r;
  r.id = id;
  r.params = params;
  r.prompt = std::move(prompt);
  r.forked = params.n == 1;  // "all choices exist"
  r.grammar = params.structured ? std::move(grammar) : nullptr;
  if (pooling != pooling_type::none) r.pool.emplace(pooling, exec_.config().hidden_size);
  if (pooling == pooling_type::none && params.prompt_logprobs >= 0)
    r.prompt_scores.emplace(r.prompt, params.prompt_logprobs);
  r.choices.push_back(std::make_unique<choice_state>(0, first, r.params, r.prompt, eos_ids_, tok_));
  if (r.grammar) r.choices.back()->constraint = r.grammar->start();
  seq_owner_[first] = {id, 0};
  requests_.emplace(id, std::move(r));
  engine_event queued{event_kind::queued, id, first};
  queued.at = engine_clock::now();
  pending_events_.push_back(queued);
  ++stats_.num_requests;
  return id;
}

void llm_engine::abort(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  request_state& r = it->second;
  const int32_t n = r.forked ? static_cast<int32_t>(r.choices.size()) : r.params.n;
  for (int32_t i = 0; i < n; ++i) {
    request_output out;
    out.id = id;
    out.index = i;
    out.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
    out.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
    if (i < static_cast<int32_t>(r.choices.size())) {
      choice_state& c = *r.choices[static_cast<size_t>(i)];
      if (c.finished) continue;
      finish_choice(r, c, finish_reason::abort, out, lifecycle_stage::aborted, event_kind::aborted);
    } else {
      out.finished = true;
      out.reason = finish_reason::abort;
    }
    pending_.push_back(std::move(out));
  }
  requests_.erase(id);
}

request_output& llm_engine::output_for(std::vector<request_output>& outs, output_index& index, const request_state& r,
                                       const choice_state& c) {
  auto [it, inserted] = index.try_emplace({r.id, c.index}, outs.size());
  if (inserted) {
    request_output o;
    o.id = r.id;
    o.index = c.index;
    o.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
    outs.push_back(std::move(o));
  }
  outs[it->second].num_cached_prompt_tokens = r.num_cached_prompt_tokens;
  return outs[it->second];
}

void llm_engine::finish_choice(request_state& r, choice_state& c, finish_reason reason, request_output& out,
                               lifecycle_stage stage, event_kind kind) {
  c.finished = true;
  out.finished = true;
  out.reason = reason;
  out.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
  out.num_generated_tokens = c.num_generated;
  out.num_draft_tokens = c.num_draft_tokens;
  out.num_accepted_draft_tokens = c.num_accepted_draft_tokens;
  if (proposer_) proposer_->release(c.seq);  // a draft model's K/V of it
  std::unique_ptr<sequence> seq = sched_.finish(c.seq, stage);
  if (seq) out.timeline = std::move(seq->timeline);
  seq_owner_.erase(c.seq);
  engine_event e{kind, r.id, c.seq};
  e.at = engine_clock::now();
  pending_events_.push_back(e);
}

void llm_engine::accept_token(request_state& r, choice_state& c, const sample_result& s, request_output& out) {
  if (c.constraint && !c.constraint->accept(s.token)) {
    // Only a sampler that fell back past an all-masked row can get here: the grammar stays sound.
    out.error =
        "the grammar of '" + r.params.structured->field + "' rejected the sampled token " + std::to_string(s.token);
    finish_choice(r, c, finish_reason::error, out, lifecycle_stage::aborted, event_kind::failed);
    return;
  }
  if (c.pending_token) {
    sched_.set_last_token(c.seq, s.token);
    c.pending_token = false;
  } else {
    sched_.append_token(c.seq, s.token);
  }
  sequence* seq = sched_.find(c.seq);
  ++c.num_generated;
  ++stats_.num_generated_tokens;
  if (c.num_generated == 1) {
    const auto now = engine_clock::now();
    if (seq) seq->record(lifecycle_stage::first_token, sampling_step_, now);
    engine_event e{event_kind::first_token, r.id, c.seq};
    e.at = now;
    pending_events_.push_back(e);
  }
  out.token_ids.push_back(s.token);
  if (r.params.logprobs >= 0) out.logprobs.push_back({s.token, s.logprob, s.top_logprobs});
  out.num_generated_tokens = c.num_generated;
  out.num_draft_tokens = c.num_draft_tokens;
  out.num_accepted_draft_tokens = c.num_accepted_draft_tokens;
  const std::string delta = c.detok ? c.detok->push(s.token) : std::string();
  stop_update u = c.stops.append(s.token, delta);
  out.text += u.text;
  finish_reason reason = u.reason;
  if (reason == finish_reason::none && c.constraint && c.constraint->is_complete()) {
    // The grammar is complete (only an end token could follow): the output is done. Text held back
    // as a possible stop-string prefix is output.
    out.text += c.stops.flush();
    if (c.detok) out.text += c.detok->flush();
    reason = finish_reason::stop;
  }
  if (reason == finish_reason::none && seq && seq->num_tokens() >= sched_.max_seq_len()) {
    out.text += c.stops.flush();
    reason = finish_reason::length;
  }
  if (reason == finish_reason::none) return;
  if (reason == finish_reason::length && c.detok) out.text += c.detok->flush();
  finish_choice(r, c, reason, out, lifecycle_stage::finished, event_kind::finished);
}

void llm_engine::fail_request(request_state& r, const std::string& message, std::vector<request_output>& outs,
                              output_index& index) {
  const int32_t n = r.forked ? static_cast<int32_t>(r.choices.size()) : 1;
  for (int32_t i = 0; i < n; ++i) {
    choice_state& c = *r.choices[static_cast<size_t>(i)];
    if (c.finished) continue;
    request_output& out = output_for(outs, index, r, c);
    out.error = message;
    finish_choice(r, c, finish_reason::error, out, lifecycle_stage::aborted, event_kind::failed);
  }
  // Choices an n > 1 request would have forked never exist; they fail too.
  for (int32_t i = n; !r.forked && i < r.params.n; ++i) {
    request_output out;
    out.id = r.id;
    out.index = i;
    out.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
    out.finished = true;
    out.reason = finish_reason::error;
    out.error = message;
    index[{r.id, i}] = outs.size();
    outs.push_back(std::move(out));
  }
}

void llm_engine::drop_if_done(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const request_state& r = it->second;
  if (!r.forked && r.params.n > 1 && !r.choices[0]->finished) return;
  for (const auto& c : r.choices)
    if (!c->finished) return;
  requests_.erase(it);
}

// ---- the step loop ---------------------------------------------------------------------------------

std::vector<request_output> llm_engine::step() {
  // Whatever leaves this function, the grammar workers are done with this step's constraints first.
  struct masks_done {
    llm_engine& e;
    ~masks_done() { e.wait_masks(); }
  } guard{*this};
  if (overlap_) return overlapped_step();
  step_context ctx = begin_step();
  scheduler_output p = plan(ctx);
  execute(p, ctx);
  take_results(p, ctx, /*committed=*/false);
  roll_back_drafts();
  return emit(p, ctx);
}

// What the executor's results feed, unless it failed: pooled rows and prompt scores (before commit,
// while num_computed says where the chunk began), the commit (done already for a plan committed
// ahead: only its accounting then), the sampled tokens.
void llm_engine::take_results(scheduler_output& p, step_context& ctx, bool committed) {
  if (ctx.failed) return;
  pool_hidden(p);
  collect_prompt_logprobs(p);
  if (committed) {
    account(p, ctx);
  } else {
    apply(p, ctx);
  }
  sample(p, ctx);
}

// ---- overlapped steps (docs/engine.md#overlapped-steps) --------------------------------------------
//
// Step n+1 is planned and queued while the device runs step n (vLLM's async scheduling, TensorRT-LLM's
// overlap scheduler), so the host's planning and bookkeeping hide behind the device's work. One call:
//   commit step n's plan ahead of its results; each sequence the device samples in it gets a
//     placeholder token, the one the device is drawing;
//   plan step n+1 and submit it: a placeholder's slice takes its token from step n's samples, which
//     stay on the device (sequence_slice::last_token_from);
//   take step n's results (wait), sample (the placeholders become the tokens) and emit.
// A sequence that step n finishes had step n+1 compute one token more for nothing: its blocks are
// freed when it finishes, and the device runs the steps in order, so no later step's use of them can
// overtake that computation. A step runs ahead only when nothing of planning the next one needs its
// results on the host (runs_ahead); otherwise its results are taken before the next step is planned.

std::vector<request_output> llm_engine::overlapped_step() {
  std::vector<request_output> outs;
  std::optional<in_flight_step> previous = std::exchange(in_flight_, std::nullopt);
  if (previous && !runs_ahead(*previous)) {
    outs = finish(*previous);
    previous.reset();
  }
  if (previous) {
    commit_ahead(*previous);
    ++stats_.num_overlapped_steps;
  }
  step_context ctx = begin_step();
  // Aborts since the last call are reported now, not with this step's results one call later.
  std::move(ctx.outs.begin(), ctx.outs.end(), std::back_inserter(outs));
  ctx.outs.clear();
  ctx.index.clear();
  scheduler_output p = plan(ctx);
  const bool queued = submit(p, ctx, previous ? &*previous : nullptr);
  const auto t_submitted = engine_clock::now();
  const auto take = [&outs](std::vector<request_output> more) {
    std::move(more.begin(), more.end(), std::back_inserter(outs));
  };
  if (previous) take(finish(*previous));
  // Step n+1's grammar masks, now that step n's tokens have reached the grammars; the executor reads
  // them at its next submit() or wait().
  if (queued && ctx.late_masks) fill_late_masks(p, ctx);
  if (queued) {
    in_flight_ = in_flight_step{std::move(p), std::move(ctx), t_submitted, false};
  } else {
    take(emit(p, ctx));  // nothing to run, or refused: its record and statistics now
  }
  return outs;
}

// Queues the plan (false: nothing to run, or the executor refused it, which failed its requests).
bool llm_engine::submit(scheduler_output& p, step_context& ctx, const in_flight_step* previous) {
  if (p.empty()) return false;
  step_batch batch = sched_.make_batch(p);
  if (previous) {
    // A sequence with a placeholder was sampled by the previous step: its slice names its row there.
    std::unordered_map<seq_id, int32_t> row_of;
    for (size_t i = 0; i < previous->plan.scheduled.size(); ++i)
      row_of.emplace(previous->plan.scheduled[i].id, static_cast<int32_t>(i));
    for (size_t i = 0; i < p.scheduled.size(); ++i) {
      const choice_ref* owner = owner_of(p.scheduled[i].id);
      if (!owner || !requests_.at(owner->request).choices[static_cast<size_t>(owner->index)]->pending_token) continue;
      const sequence& seq = *p.scheduled[i].seq;
      if (seq.num_computed + p.scheduled[i].num_new_tokens < seq.num_tokens()) continue;  // not up to it
      const auto row = row_of.find(p.scheduled[i].id);
      if (row == row_of.end()) throw std::logic_error("llm_engine: a placeholder token from no previous step");
      batch.seqs[i].last_token_from = row->second;
    }
  }
  // Planned before the previous step's tokens reached the grammars: this step's masks come later.
  start_execute(p, batch, ctx, previous != nullptr && exec_.takes_late_masks());
  try {
    exec_.submit(batch);
  } catch (const std::exception& e) {
    execute_failed(p, e, ctx);
    return false;
  }
  return true;
}

// Step n's results: what step() does after the executor returned, for a step submitted one call ago.
std::vector<request_output> llm_engine::finish(in_flight_step& f) {
  scheduler_output& p = f.plan;
  step_context& ctx = f.ctx;
  try {
    exec_.wait(logits_);
  } catch (const std::exception& e) {
    // A plan committed ahead put the blocks it filled into the prefix cache: out with them, before
    // its requests are failed and their blocks freed.
    if (f.committed)
      for (seq_id s : p.touched) sched_.forget_cached(s);
    execute_failed(p, e, ctx);
  }
  ctx.record.execute_seconds = seconds_since(f.submitted);
  take_results(p, ctx, f.committed);
  return emit(p, ctx);
}

// Whether the next step may be planned before this one's results are on the host: every sequence that
// samples in it samples on the device, with a grammar only when the executor takes the next step's
// masks late (that mask needs this step's token: step_batch::late_masks), and no
// embedding or prompt scoring reads the plan's positions before commit (pool_hidden,
// collect_prompt_logprobs). Sequences finished meanwhile do not count.
bool llm_engine::runs_ahead(const in_flight_step& f) const {
  if (f.ctx.failed) return false;
  for (size_t i = 0; i < f.plan.scheduled.size(); ++i) {
    const scheduled_sequence& s = f.plan.scheduled[i];
    const sequence* seq = sched_.find(s.id);
    if (!seq || !owner_of(s.id)) continue;
    // (No drafts: speculative decoding never overlaps.)
    if (seq->pooling != pooling_type::none || seq->prefill_only || seq->scores_prompt()) return false;
    if (s.samples && (!f.ctx.asked_device[i] || (f.ctx.mask_row[i] >= 0 && !exec_.takes_late_masks()))) return false;
  }
  return true;
}

void llm_engine::commit_ahead(in_flight_step& f) {
  sched_.commit(f.plan);
  f.committed = true;
  for (size_t i = 0; i < f.plan.scheduled.size(); ++i) {
    if (!f.plan.scheduled[i].samples || !f.ctx.asked_device[i]) continue;
    const choice_ref* owner = owner_of(f.plan.scheduled[i].id);
    if (!owner) continue;
    request_state& r = requests_.at(owner->request);
    choice_state& c = *r.choices[static_cast<size_t>(owner->index)];
    if (c.finished || c.pending_token || !may_continue(r, c)) continue;
    sched_.append_token(c.seq, token_id{0});  // the device's token replaces it in accept_token
    c.pending_token = true;
  }
}

// Whether the token the device is drawing for `c` can be followed by another: not when it is the last
// that max_tokens or the sequence length allow (a stop or EOS is known only when it comes).
bool llm_engine::may_continue(const request_state& r, const choice_state& c) const {
  const sequence* seq = sched_.find(c.seq);
  return seq && c.num_generated + 1 < r.params.max_tokens && seq->num_tokens() + 1 < sched_.max_seq_len();
}

// Outputs of aborts and the events of add_request / abort since the last step come first.
llm_engine::step_context llm_engine::begin_step() {
  step_context ctx;
  ctx.start = engine_clock::now();
  ctx.outs = std::move(pending_);
  pending_.clear();
  ctx.events = std::move(pending_events_);
  pending_events_.clear();
  for (size_t i = 0; i < ctx.outs.size(); ++i) ctx.index[{ctx.outs[i].id, ctx.outs[i].index}] = i;
  return ctx;
}

scheduler_output llm_engine::plan(step_context& ctx) {
  propose_drafts();
  scheduler_output p = sched_.schedule();
  release_preempted_drafts(p);
  ctx.record = step_record{};
  ctx.record.step = p.step;
  ctx.record.schedule_seconds = seconds_since(ctx.start);
  ctx.asked_device.assign(p.scheduled.size(), false);
  ctx.mask_row.assign(p.scheduled.size(), -1);
  ctx.accepted.assign(p.scheduled.size(), 0);
  return p;
}

void llm_engine::execute(scheduler_output& p, step_context& ctx) {
  if (p.empty()) return;
  step_batch batch = sched_.make_batch(p);
  start_execute(p, batch, ctx, false);
  const auto t_exec = engine_clock::now();
  try {
    exec_.execute(batch, logits_);
  } catch (const std::exception& e) { execute_failed(p, e, ctx); }
  ctx.record.execute_seconds = seconds_since(t_exec);
}

void llm_engine::start_execute(const scheduler_output& p, step_batch& batch, step_context& ctx, bool late_masks) {
  // The masks of this step depend only on the tokens accepted up to the last one: the grammar workers
  // compute them while the executor runs the forward pass (late: once the previous step's tokens are in).
  start_masks(p, ctx, late_masks);
  if (exec_.samples_on_device()) {
    ask_device_sampling(p, batch, ctx);
    if (ctx.late_masks) {
      late_masks_ = std::promise<void>();
      batch.masks_ready = late_masks_.get_future().share();
      batch.late_masks = true;
    } else {
      batch.masks_ready = masks_pending_;
    }
  }
}

// The plan is not committed (unless an overlapped step committed it ahead): nothing it allocated
// enters the prefix cache. Every request whose KV the step touched is failed and its blocks freed; the
// others continue.
void llm_engine::execute_failed(const scheduler_output& p, const std::exception& e, step_context& ctx) {
  wait_masks();  // the workers are done with the constraints about to be dropped
  ctx.failed = true;
  ++stats_.num_failed_steps;
  fail_touched_requests(p, std::string("executor failed: ") + e.what(), ctx);
}

// Embedding sequences: each chunk's hidden rows join the request's pool (before commit, while
// num_computed still says where the chunk began: a chunk at 0 is a fresh start, after a recompute
// preemption too).
void llm_engine::pool_hidden(const scheduler_output& p) {
  for (size_t i = 0; i < p.scheduled.size(); ++i) {
    const scheduled_sequence& s = p.scheduled[i];
    if (s.seq->pooling == pooling_type::none) continue;
    const choice_ref* owner = owner_of(s.id);
    if (!owner) continue;
    request_state& r = requests_.at(owner->request);
    if (!r.pool) continue;
    if (s.seq->num_computed == 0) r.pool->reset();
    r.pool->add(logits_.hidden_of(i), s.num_new_tokens);
  }
}

// Prompt logprobs: each chunk's scored rows join the request's collector, which skips positions it
// already holds (a chunk recomputed after a preemption) and refuses rows that leave a gap; the scheduler
// then asks only for the positions still missing. A request whose rows did not come back is failed when
// its prompt's last token has been computed (sample()), not here: the plan's sequences stay valid until
// the step ends.
void llm_engine::collect_prompt_logprobs(const scheduler_output& p) {
  for (size_t i = 0; i < p.scheduled.size(); ++i) {
    const scheduled_sequence& s = p.scheduled[i];
    if (!s.seq->scores_prompt()) continue;
    const choice_ref* owner = owner_of(s.id);
    if (!owner) continue;
    request_state& r = requests_.at(owner->request);
    if (!r.prompt_scores) continue;
    const sequence::scored_rows rows = s.seq->prompt_rows(s.num_new_tokens - s.num_draft_tokens);
    const std::span<const prompt_logprob> got = logits_.prompt_logprobs_of(i);
    if (rows.count == 0 || got.size() != static_cast<size_t>(rows.count)) continue;
    r.prompt_scores->add(s.seq->num_computed + rows.first + 1, got);
    s.seq->prompt_logprobs_next = r.prompt_scores->next_position();
  }
}

void llm_engine::apply(scheduler_output& p, const step_context& ctx) {
  sched_.commit(p);
  account(p, ctx);
}

void llm_engine::account(const scheduler_output& p, const step_context& ctx) {
  if (p.num_prefill_tokens > p.num_decode_tokens)
    sched_.observe_prefill(p.num_prefill_tokens, ctx.record.execute_seconds);
  stats_.num_prefill_tokens += static_cast<uint64_t>(p.num_prefill_tokens);
  stats_.num_blocks_swapped_in += p.swap_in.size();
  stats_.num_blocks_swapped_out += p.swap_out.size();
  // A request's cached prompt tokens are its prompt's cache hits at its (last) admission before
  // generation started.
  for (const engine_event& e : p.events) {
    if (e.kind != event_kind::admitted) continue;
    const choice_ref* owner = owner_of(e.seq);
    if (!owner || owner->index != 0) continue;
    auto it = requests_.find(owner->request);
    const sequence* s = sched_.find(e.seq);
    // (The choice's count: an overlapped step's placeholder is not a generated token yet.)
    if (it != requests_.end() && s && !it->second.choices.empty() && it->second.choices[0]->num_generated == 0)
      it->second.num_cached_prompt_tokens = s->num_cached_prompt_tokens;
  }
}

void llm_engine::sample(scheduler_output& p, step_context& ctx) {
  sampling_step_ = p.step;
  // (Only this step's masks: with overlapped steps, those pending may be the next step's.)
  const bool constrained = std::any_of(ctx.mask_row.begin(), ctx.mask_row.end(), [](int32_t r) { return r >= 0; });
  if (constrained && masks_pending_.valid()) {
    const auto t0 = engine_clock::now();
    wait_masks();
    stats_.mask_wait_seconds += seconds_since(t0);
  }
  for (size_t i = 0; i < p.scheduled.size(); ++i) {
    if (!p.scheduled[i].samples) continue;
    // (Through the owner, not scheduled[i].seq: a failure earlier in this loop may have freed it.)
    const choice_ref* owner = owner_of(p.scheduled[i].id);
    if (owner && requests_.at(owner->request).pool)
      finish_embedding(i, p, ctx);
    else if (owner && p.scheduled[i].seq->prefill_only)
      finish_scoring(i, p, ctx);
    else if (p.scheduled[i].num_draft_tokens > 0)
      verify_sequence(i, p, ctx);
    else
      sample_sequence(i, p, ctx);
  }
  // Verified drafts: the accepted tokens become computed, the rejected positions' blocks go back.
  for (size_t i = 0; i < p.scheduled.size(); ++i)
    if (p.scheduled[i].num_draft_tokens > 0) sched_.accept_draft(p.scheduled[i].id, ctx.accepted[i]);
}

std::vector<request_output> llm_engine::emit(scheduler_output& p, step_context& ctx) {
  record_ = std::move(ctx.record);
  sched_.fill_record(p, record_);
  annotate_running(record_);
  // Order: between-step events, the plan's scheduling decisions (stamped with the step's start), then
  // what sampling produced (first tokens, finishes, failures).
  for (engine_event& e : p.events) {
    if (e.at == engine_clock::time_point{}) e.at = ctx.start;
    ctx.events.push_back(e);
  }
  ctx.events.insert(ctx.events.end(), pending_events_.begin(), pending_events_.end());
  pending_events_.clear();
  record_.events = std::move(ctx.events);
  for (const engine_event& e : record_.events) {
    stats_.num_preemptions_swap += e.kind == event_kind::preempted_swap;
    stats_.num_preemptions_recompute += e.kind == event_kind::preempted_recompute;
    if (e.kind == event_kind::prefix_cache_hit)
      stats_.num_cached_prompt_tokens +=
          static_cast<uint64_t>(e.num_blocks) * static_cast<uint64_t>(options_.block_size);
  }
  ++stats_.num_steps;
  record_.step_seconds = seconds_since(ctx.start);
  if (overlap_ && last_emit_ != engine_clock::time_point{}) {
    // Overlapped steps: planned one call before their results came, so the time since the previous
    // step's outputs is the cadence a decoding stream sees.
    record_.step_seconds = std::min(record_.step_seconds, seconds_since(last_emit_));
  }
  last_emit_ = engine_clock::now();
  record_.predicted_seconds = p.predicted_seconds;
  record_.prefill_budget = p.prefill_budget;
  if (!ctx.failed && !p.scheduled.empty()) {
    // The whole step (plan to outputs) is what a decoding stream waits between two tokens.
    sched_.observe_step(p, record_.step_seconds);
    stats_.prefill_budget_tokens = p.prefill_budget;
    stats_.predicted_step_seconds = p.predicted_seconds;
    stats_.measured_step_seconds = record_.step_seconds;
    stats_.num_steps_prefill_limited += p.prefill_limited;
  }
  return std::move(ctx.outs);
}

// ---- helpers of the phases ----------------------------------------------------------------------------

// What the scheduler's rows cannot say: whether a sequence is grammar-constrained and how its drafts
// fared (the dashboard's request table marks both).
void llm_engine::annotate_running(step_record& record) const {
  for (sequence_blocks& b : record.running) {
    const choice_ref* owner = owner_of(b.seq);
    if (!owner) continue;
    const auto it = requests_.find(owner->request);
    if (it == requests_.end() || static_cast<size_t>(owner->index) >= it->second.choices.size()) continue;
    const choice_state& c = *it->second.choices[static_cast<size_t>(owner->index)];
    b.constrained = c.constraint != nullptr;
    b.num_draft_tokens = c.num_draft_tokens;
    b.num_accepted_draft_tokens = c.num_accepted_draft_tokens;
  }
}

const llm_engine::choice_ref* llm_engine::owner_of(seq_id s) const {
  auto it = seq_owner_.find(s);
  return it == seq_owner_.end() ? nullptr : &it->second;
}

// The executor samples these sequences itself from the sampler's state and returns tokens instead of
// logits rows (docs/sampling.md). The fork step of an n > 1 request draws n tokens from one row and
// stays on the host, as does a sampler device_request() declines.
void llm_engine::ask_device_sampling(const scheduler_output& p, step_batch& batch, step_context& ctx) {
  for (size_t i = 0; i < p.scheduled.size() && i < batch.seqs.size(); ++i) {
    // A draft is verified on the host from every row (engine/speculative/verifier.hpp); an embedding
    // or a max_tokens 0 request samples nothing.
    if (!p.scheduled[i].samples || p.scheduled[i].num_draft_tokens > 0 || p.scheduled[i].seq->prefill_only) continue;
    const choice_ref* owner = owner_of(p.scheduled[i].id);
    if (!owner) continue;
    const request_state& r = requests_.at(owner->request);
    if (!r.forked && r.params.n > 1) continue;
    const choice_state& c = *r.choices[static_cast<size_t>(owner->index)];
    batch.seqs[i].sampling = c.samp.device_request(c.pending_token ? 1 : 0);
    ctx.asked_device[i] = batch.seqs[i].sampling.has_value();
    if (ctx.asked_device[i]) batch.seqs[i].sampling->allowed_tokens = mask_of(ctx, i);
  }
}

// One mask row per constrained sequence that samples this step (at an n > 1 request's fork, choice 0's:
// the forks start in the same state), handed to the backend's workers.
void llm_engine::start_masks(const scheduler_output& p, step_context& ctx, bool late) {
  if (!options_.constraints) return;
  std::vector<std::pair<size_t, token_constraint*>> wanted;
  for (size_t i = 0; i < p.scheduled.size(); ++i) {
    if (!p.scheduled[i].samples) continue;
    if (token_constraint* t = live_constraint(p.scheduled[i].id)) wanted.emplace_back(i, t);
  }
  if (wanted.empty()) return;
  // The other buffer than the previous step's, which an executor may not have read yet.
  mask_buffer_ ^= 1;
  ctx.mask_buffer = mask_buffer_;
  const auto words = static_cast<size_t>(mask_words_);
  std::vector<uint32_t>& masks = masks_[mask_buffer_];
  masks.resize(wanted.size() * words);
  for (size_t row = 0; row < wanted.size(); ++row) ctx.mask_row[wanted[row].first] = static_cast<int32_t>(row);
  if (late) {
    ctx.late_masks = true;
    return;
  }
  std::vector<mask_job> jobs;
  jobs.reserve(wanted.size());
  for (size_t row = 0; row < wanted.size(); ++row)
    jobs.push_back({wanted[row].second, std::span<uint32_t>(masks.data() + row * words, words)});
  stats_.num_token_masks += jobs.size();
  masks_pending_ = options_.constraints->fill_masks(std::move(jobs));
}

// A step submitted with late masks (start_masks), once the step before it has been taken: its rows'
// grammars have their last token now. A choice that step finished gets a row of any token (its token
// is not used); the promise is kept only once the masks are written, so the executor never reads one
// before.
void llm_engine::fill_late_masks(const scheduler_output& p, const step_context& ctx) {
  const auto words = static_cast<size_t>(mask_words_);
  std::vector<uint32_t>& masks = masks_[ctx.mask_buffer];
  std::vector<mask_job> jobs;
  for (size_t i = 0; i < p.scheduled.size(); ++i) {
    if (ctx.mask_row[i] < 0) continue;
    const std::span<uint32_t> row(masks.data() + static_cast<size_t>(ctx.mask_row[i]) * words, words);
    if (token_constraint* t = live_constraint(p.scheduled[i].id)) {
      jobs.push_back({t, row});
    } else {
      std::fill(row.begin(), row.end(), ~0u);
    }
  }
  stats_.num_token_masks += jobs.size();
  if (!jobs.empty()) {
    masks_pending_ = options_.constraints->fill_masks(std::move(jobs));
    wait_masks();
  }
  late_masks_.set_value();
}

// The grammar of the choice sequence s samples for; null when it has none, or is finished or gone.
token_constraint* llm_engine::live_constraint(seq_id s) {
  const choice_ref* owner = owner_of(s);
  if (!owner) return nullptr;
  choice_state& c = *requests_.at(owner->request).choices[static_cast<size_t>(owner->index)];
  return c.finished ? nullptr : c.constraint.get();
}

void llm_engine::wait_masks() {
  if (!masks_pending_.valid()) return;
  masks_pending_.wait();
  masks_pending_ = {};
}

std::span<const uint32_t> llm_engine::mask_of(const step_context& ctx, size_t i) const {
  if (i >= ctx.mask_row.size() || ctx.mask_row[i] < 0) return {};
  const auto words = static_cast<size_t>(mask_words_);
  return {masks_[ctx.mask_buffer].data() + static_cast<size_t>(ctx.mask_row[i]) * words, words};
}

void llm_engine::fail_touched_requests(const scheduler_output& p, const std::string& message, step_context& ctx) {
  std::vector<request_id> victims;
  for (seq_id s : p.touched)
    if (const choice_ref* owner = owner_of(s)) victims.push_back(owner->request);
  std::sort(victims.begin(), victims.end());
  victims.erase(std::unique(victims.begin(), victims.end()), victims.end());
  for (request_id id : victims) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    fail_request(it->second, message, ctx.outs, ctx.index);
    drop_if_done(id);
  }
}

// Samples the token of scheduled sequence i (from the executor's token or its logits row) for its
// choice, or for all n choices at an n > 1 request's fork, and accepts it.
void llm_engine::sample_sequence(size_t i, scheduler_output& p, step_context& ctx) {
  const scheduled_sequence& s = p.scheduled[i];
  const choice_ref* owner = owner_of(s.id);
  if (!owner) return;
  request_state& r = requests_.at(owner->request);
  const int32_t choice = owner->index;
  const sampled_token* device_token = nullptr;
  if (ctx.asked_device[i] && i < logits_.sampled.size() && logits_.sampled[i].token >= 0 &&
      logits_.sampled[i].token < exec_.config().vocab_size) {
    device_token = &logits_.sampled[i];
  }
  if (!device_token && (logits_.num_rows.size() <= i || logits_.num_rows[i] < 1)) {
    fail_request(r, "executor returned no logits", ctx.outs, ctx.index);
    drop_if_done(r.id);
    return;
  }
  const auto row =
      device_token ? std::span<const float>() : logits_.row(logits_.first_row[i] + logits_.num_rows[i] - 1);
  std::vector<choice_state*> samplers{r.choices[static_cast<size_t>(choice)].get()};
  if (!r.forked && r.params.n > 1) {
    std::vector<choice_state*> forked = fork_choices(r, s.id, p);
    samplers.insert(samplers.end(), forked.begin(), forked.end());
  }
  if (!attach_prompt_logprobs(r, samplers, ctx)) return;
  const std::span<const uint32_t> allowed = mask_of(ctx, i);
  for (choice_state* c : samplers) {
    sample_result res;
    if (device_token) {  // one sampler: requests that fork were not sent
      res.token = device_token->token;
      res.logprob = device_token->logprob;
      res.top_logprobs = device_token->top_logprobs;
      c->samp.append_external_token(res.token);
    } else {
      res = c->samp.sample(row, allowed);
    }
    accept_token(r, *c, res, output_for(ctx.outs, ctx.index, r, *c));
  }
  drop_if_done(r.id);
}

// Scheduled sequence i, an embedding, computed its prompt's last token: its pooled vector is the
// request's one output, and its blocks are freed.
void llm_engine::finish_embedding(size_t i, scheduler_output& p, step_context& ctx) {
  const choice_ref* owner = owner_of(p.scheduled[i].id);
  if (!owner) return;
  request_state& r = requests_.at(owner->request);
  if (!r.pool || logits_.hidden_of(i).empty() || !r.pool->complete() ||
      r.pool->num_tokens() != static_cast<int32_t>(r.prompt.size())) {
    fail_request(r, "executor returned no hidden states", ctx.outs, ctx.index);
    drop_if_done(r.id);
    return;
  }
  choice_state& c = *r.choices.front();
  request_output& out = output_for(ctx.outs, ctx.index, r, c);
  out.embedding = r.pool->finish();
  finish_choice(r, c, finish_reason::stop, out, lifecycle_stage::finished, event_kind::finished);
  drop_if_done(r.id);
}

// The first output of each of `choices` carries the request's prompt logprobs (once: a choice that is
// recomputed after its first token does not repeat them). False when they are incomplete (the executor
// did not return every scored row): the request has failed then.
bool llm_engine::attach_prompt_logprobs(request_state& r, std::span<choice_state* const> choices, step_context& ctx) {
  if (!r.prompt_scores || r.prompt_scores_sent) return true;
  if (!r.prompt_scores->complete()) {
    fail_request(r, "executor returned no prompt logprobs", ctx.outs, ctx.index);
    drop_if_done(r.id);
    return false;
  }
  for (choice_state* c : choices) output_for(ctx.outs, ctx.index, r, *c).prompt_logprobs = r.prompt_scores->all();
  r.prompt_scores_sent = true;
  return true;
}

// Scheduled sequence i, a generation with max_tokens 0, computed its prompt's last token: every choice
// ends (reason length, as OpenAI answers echo with max_tokens 0) with the prompt logprobs and no token.
// Choices past the first never became sequences (nothing was sampled to fork on).
void llm_engine::finish_scoring(size_t i, scheduler_output& p, step_context& ctx) {
  const choice_ref* owner = owner_of(p.scheduled[i].id);
  if (!owner) return;
  request_state& r = requests_.at(owner->request);
  choice_state& c = *r.choices.front();
  choice_state* const first[1] = {&c};
  if (!attach_prompt_logprobs(r, first, ctx)) return;
  request_output& out = output_for(ctx.outs, ctx.index, r, c);
  finish_choice(r, c, finish_reason::length, out, lifecycle_stage::finished, event_kind::finished);
  for (int32_t k = 1; k < r.params.n; ++k) {
    request_output more;
    more.id = r.id;
    more.index = k;
    more.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
    more.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
    more.finished = true;
    more.reason = finish_reason::length;
    if (r.prompt_scores) more.prompt_logprobs = r.prompt_scores->all();
    ctx.index[{r.id, k}] = ctx.outs.size();
    ctx.outs.push_back(std::move(more));
  }
  drop_if_done(r.id);
}

// Speculative decode of scheduled sequence i: rows first_row .. first_row + num_draft_tokens verify its
// draft, and the target's tokens are accepted one by one until the first one the draft did not
// guess (or a stop). The scheduler learns how many drafts were accepted in sample().
void llm_engine::verify_sequence(size_t i, scheduler_output& p, step_context& ctx) {
  const scheduled_sequence& s = p.scheduled[i];
  const choice_ref* owner = owner_of(s.id);
  if (!owner) return;
  request_state& r = requests_.at(owner->request);
  choice_state& c = *r.choices[static_cast<size_t>(owner->index)];
  if (logits_.num_rows.size() <= i || logits_.num_rows[i] != s.num_draft_tokens + 1) {
    fail_request(r, "executor returned no logits", ctx.outs, ctx.index);
    drop_if_done(r.id);
    return;
  }
  // The sequence may finish (and be freed) while its tokens are accepted: the draft is copied first.
  std::vector<token_id> draft(s.seq->draft.begin(), s.seq->draft.begin() + s.num_draft_tokens);
  std::vector<int32_t> parents;  // a token tree's (never a constrained request's: propose_drafts)
  if (!s.seq->draft_parents.empty())
    parents.assign(s.seq->draft_parents.begin(), s.seq->draft_parents.begin() + s.num_draft_tokens);
  const std::vector<float> q = std::move(s.seq->draft_probs);  // sampled drafts' q rows
  // Structured output: row 0's mask came from the grammar workers; row j's needs the grammar advanced
  // over draft[0, j), so the matcher walks the draft here, filling each next mask, and is rolled back.
  // A draft token the grammar refuses can never be drawn (its row masks it): the draft is cut there.
  const auto words = static_cast<size_t>(mask_words_);
  std::vector<uint32_t> draft_masks;
  if (c.constraint) {
    draft_masks.resize(draft.size() * words);
    size_t walked = 0;
    for (; walked < draft.size() && c.constraint->accept(draft[walked]); ++walked)
      c.constraint->fill_next_mask(std::span(draft_masks.data() + walked * words, words));
    c.constraint->rollback(static_cast<int32_t>(walked));
    draft.resize(walked);
  }
  const auto allowed = [&](int32_t j) {
    return j == 0 || !c.constraint
               ? mask_of(ctx, i)
               : std::span<const uint32_t>(draft_masks.data() + static_cast<size_t>(j - 1) * words, words);
  };
  c.num_draft_tokens += s.num_draft_tokens;
  stats_.num_draft_tokens += static_cast<uint64_t>(s.num_draft_tokens);
  ++stats_.num_spec_verifications;
  request_output& out = output_for(ctx.outs, ctx.index, r, c);
  const int32_t first = logits_.first_row[i];
  const auto row = [&](int32_t j) { return verify_row{logits_.row(first + j), allowed(j)}; };
  const auto commit = [&](const sample_result& res, bool from_draft) {
    if (from_draft) {
      ++c.num_accepted_draft_tokens;
      ++stats_.num_accepted_draft_tokens;
    }
    accept_token(r, c, res, out);
    return !c.finished;
  };
  if (q.empty() && parents.empty()) {
    ctx.accepted[i] = verify_draft(c.samp, draft, row, commit);
  } else {
    // Only the accepted nodes 0, 1, ... have their K/V at their own positions; a branch taken after
    // them is computed again by the next step (scheduler::accept_draft). A chain's path is 0, 1, ...
    const std::vector<int32_t> path = q.empty() ? verify_tree(c.samp, draft, parents, row, commit)
                                                : verify_sampled_tree(c.samp, draft, parents, q, row, commit);
    int32_t in_place = 0;
    while (in_place < static_cast<int32_t>(path.size()) && path[static_cast<size_t>(in_place)] == in_place) ++in_place;
    ctx.accepted[i] = in_place;
    stats_.num_tree_branch_tokens += path.size() - static_cast<size_t>(in_place);
  }
  drop_if_done(r.id);
}

// The proposer's drafts for this step's decodes, before the scheduler plans it: none when more
// sequences decode than speculative.max_batch, nor for requests that do not speculate. k leaves room
// for the target's own token after the drafts within max_tokens and max_seq_len.
void llm_engine::propose_drafts() {
  proposed_.clear();
  if (!proposer_) return;
  const auto decoding = [](const sequence* s) { return s->num_uncomputed() == 1 && s->num_generated() > 0; };
  int32_t num_decoding = 0;
  for (sequence* s : sched_.running()) {
    s->clear_draft();
    num_decoding += decoding(s);
  }
  if (num_decoding > options_.speculative.max_batch) return;
  std::vector<draft_request> requests;
  std::vector<sequence*> seqs;
  for (sequence* s : sched_.running()) {
    if (!decoding(s)) continue;
    const choice_ref* owner = owner_of(s->id);
    if (!owner) continue;
    const request_state& r = requests_.at(owner->request);
    if (!speculates(r)) continue;
    const choice_state& c = *r.choices[static_cast<size_t>(owner->index)];
    const int32_t room = std::min(r.params.max_tokens - c.num_generated, sched_.max_seq_len() - s->num_tokens()) - 1;
    const int32_t k = std::min(options_.speculative.num_tokens, room);
    if (k <= 0) continue;
    draft_request q{s->id, s->tokens, k};
    if (!r.params.greedy()) {
      q.sampling = &r.params;
      q.stream_key = c.samp.stream_key();
      q.position = static_cast<uint64_t>(c.samp.num_generated());
    }
    requests.push_back(q);
    seqs.push_back(s);
  }
  if (requests.empty()) return;
  // One call for the whole step: a draft model batches its forward passes across these sequences.
  std::vector<draft_proposal> proposals = proposer_->propose(requests);
  for (size_t i = 0; i < seqs.size() && i < proposals.size(); ++i) {
    sequence& s = *seqs[i];
    draft_proposal& d = proposals[i];
    // A tree's first branch, nodes 0 .. : what an executor that does not verify trees gets, and what a
    // request with structured output verifies (verify_sequence walks the grammar along one chain).
    const choice_ref* owner = owner_of(s.id);
    if (!d.parents.empty() && (!exec_.verifies_token_trees() ||
                               requests_.at(owner->request).choices[static_cast<size_t>(owner->index)]->constraint)) {
      size_t chain = 0;
      while (chain < d.parents.size() && d.parents[chain] == static_cast<int32_t>(chain) - 1) ++chain;
      d.tokens.resize(chain);
      d.parents.clear();
    }
    s.draft = std::move(d.tokens);
    s.draft_parents = std::move(d.parents);
    s.draft_probs = std::move(d.probs);
    proposed_.push_back(s.id);
  }
}

// A preempted sequence's proposer state goes with its KV (recompute: rebuilt when it speculates again;
// swap: dropped as well, the draft pool has no host copy).
void llm_engine::release_preempted_drafts(const scheduler_output& p) {
  if (!proposer_) return;
  for (const engine_event& e : p.events)
    if (e.kind == event_kind::preempted_recompute || e.kind == event_kind::preempted_swap) proposer_->release(e.seq);
}

// After the step (verified, decoded plainly because the scheduler dropped the draft, or failed): the
// proposer forgets what it drafted past the tokens each sequence now holds.
void llm_engine::roll_back_drafts() {
  for (seq_id id : proposed_) {
    const sequence* s = sched_.find(id);
    if (s && s->status == sequence_status::running)
      proposer_->rollback(id, s->tokens);
    else
      proposer_->release(id);  // finished (already released), preempted, or failed
  }
  proposed_.clear();
}

bool llm_engine::speculates(const request_state& r) const { return proposer_ && r.params.speculative; }

// Parallel sampling: the prompt was prefilled once; fork it into n sequences that share its blocks,
// each of which then samples its own first token from the same logits.
std::vector<llm_engine::choice_state*> llm_engine::fork_choices(request_state& r, seq_id parent, scheduler_output& p) {
  r.forked = true;
  std::vector<choice_state*> children;
  for (int32_t c = 1; c < r.params.n; ++c) {
    const seq_id child = next_seq_;
    next_seq_ = next_seq_.next();
    sched_.fork(parent, child, c);
    seq_owner_[child] = {r.id, c};
    r.choices.push_back(std::make_unique<choice_state>(c, child, r.params, r.prompt, eos_ids_, tok_));
    if (r.choices.front()->constraint) r.choices.back()->constraint = r.choices.front()->constraint->fork();
    children.push_back(r.choices.back().get());
    engine_event forked{event_kind::forked, r.id, child};
    forked.at = engine_clock::now();
    p.events.push_back(forked);
  }
  return children;
}

engine_stats llm_engine::stats() const {
  engine_stats s = stats_;
  s.kv_waste = sched_.blocks().slots().waste();
  s.num_window_freed_blocks = static_cast<uint64_t>(sched_.blocks().num_window_freed_blocks());
  s.step_time_prediction_error = sched_.cost_model().mean_relative_error();
  s.step_cost = sched_.cost_model().coefficients();
  s.target_step_seconds = sched_.options().target_step_seconds;
  if (proposer_) {
    const draft_pool_usage pool = proposer_->pool_usage();
    s.num_draft_kv_blocks = pool.num_blocks;
    s.num_draft_kv_blocks_used = pool.num_blocks - pool.num_free_blocks;
  }
  return s;
}

}  // namespace tessera
